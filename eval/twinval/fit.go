package twinval

import (
	"fmt"
	"io"
	"math"

	"github.com/lockstep-ai/lockstep/bridge/twin"
)

// The coefficients the twin fits to published tables (bridge/twin
// coefficients.go names each fit as its source). A fit is a grid search
// over the coefficients of one table that minimises the mean absolute
// relative error of the twin's own operator model over every row of the
// table: the model fitted is the model that runs, and no row is singled
// out. The grids are coarse on purpose (a coefficient is not tuned past
// what the table can tell apart); TestBuiltinCoefficientsAreTheFits keeps
// the built-in values equal to these fits.

// Param is one fitted coefficient.
type Param struct {
	Key        string  // the roofline key (docs/twin.md)
	Value      float64 // fitted
	Builtin    float64 // the built-in profile's value
	Lo, Hi, By float64 // the grid searched
	set        func(rc *twin.RooflineCoefficients, v float64)
	get        func(rc *twin.RooflineCoefficients) float64
}

// Fit is one table's fit: its parameters and the error at the optimum.
type Fit struct {
	Group  string
	Params []Param
	MAE    float64
	Rows   int
}

// fitSpec is what a fit searches.
type fitSpec struct {
	group  string
	params []Param
}

// specs are the fits, in the order they are applied (the FP8 and NVFP4
// fits use the BF16 fit's bandwidth, tile and kernel cost).
func specs() []fitSpec {
	p := func(key string, lo, hi, by float64, c func(rc *twin.RooflineCoefficients) *twin.Coef) Param {
		return Param{Key: key, Lo: lo, Hi: hi, By: by,
			set: func(rc *twin.RooflineCoefficients, v float64) { c(rc).Value = v },
			get: func(rc *twin.RooflineCoefficients) float64 { return c(rc).Value }}
	}
	return []fitSpec{
		{"vidur-gemm", []Param{
			p("gemm_tile_tokens", 64, 128, 64, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.GEMMTileTokens }),
			p("gemm_kernel_ms", 0, 0.008, 0.001, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.GEMMKernelMS }),
			p("gemm_efficiency", 0.64, 0.82, 0.02, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.GEMMEfficiency }),
			p("gemm_bandwidth_efficiency", 0.80, 0.96, 0.02, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.GEMMBandwidthEfficiency }),
		}},
		{"deepgemm-fp8", []Param{
			p("fp8_gemm_efficiency", 0.50, 0.90, 0.01, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.FP8GEMMEfficiency }),
		}},
		{"nvfp4-gemm", []Param{
			p("fp4_gemm_efficiency", 0.30, 0.90, 0.01, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.FP4GEMMEfficiency }),
		}},
		{"vidur-elementwise", []Param{
			p("elementwise_kernel_ms", 0, 0.008, 0.0005, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.ElementwiseKernelMS }),
			p("elementwise_efficiency", 0.30, 0.90, 0.02, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.ElementwiseEfficiency }),
		}},
		{"ort-decode", []Param{
			p("attention_kernel_ms", 0, 0.020, 0.0005, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.AttentionKernelMS }),
			p("decode_attention_efficiency", 0.60, 0.96, 0.01, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.DecodeAttentionEfficiency }),
		}},
		{"vidur-allreduce", []Param{
			p("allreduce_latency_ms", 0, 0.040, 0.001, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.AllReduceLatencyMS }),
			p("allreduce_nvlink_fraction", 0.80, 2.00, 0.02, func(rc *twin.RooflineCoefficients) *twin.Coef { return &rc.AllReduceNVLinkFraction }),
		}},
	}
}

// groupMAE is the mean absolute relative error of group's rows with rc.
func groupMAE(group string, rc *twin.RooflineCoefficients) (float64, int, error) {
	var rs []Result
	var err error
	switch group {
	case "vidur-gemm", "vidur-elementwise":
		rs, err = vidurRows(rc)
	case "deepgemm-fp8":
		rs, err = deepGEMMRows(rc)
	case "nvfp4-gemm":
		rs, err = nvfp4Rows(rc)
	case "ort-decode":
		rs, err = ortRows(rc)
	case "vidur-allreduce":
		rs, err = allReduceRows(rc)
	default:
		return 0, 0, fmt.Errorf("no fit of group %q", group)
	}
	if err != nil {
		return 0, 0, err
	}
	var sum float64
	n := 0
	for _, r := range rs {
		if r.Group == group {
			sum += math.Abs(r.Ratio() - 1)
			n++
		}
	}
	return sum / float64(n), n, nil
}

// FitAll runs every fit from the built-in coefficients, each on top of the
// ones before it, and returns them with the built-in values beside the
// fitted ones.
func FitAll() ([]Fit, error) {
	base, err := twin.BuiltinProfile("h100", "llama-8b", twin.Parallelism{})
	if err != nil {
		return nil, err
	}
	builtin := *base.Roofline
	rc := builtin
	var out []Fit
	for _, s := range specs() {
		f, err := fit(s, &rc)
		if err != nil {
			return nil, fmt.Errorf("fit %s: %w", s.group, err)
		}
		for i := range f.Params {
			f.Params[i].Builtin = f.Params[i].get(&builtin)
			f.Params[i].set(&rc, f.Params[i].Value)
		}
		out = append(out, f)
	}
	return out, nil
}

// fit searches the full grid of s's parameters (on a copy of rc) for the
// smallest error; ties keep the first point in grid order.
func fit(s fitSpec, rc *twin.RooflineCoefficients) (Fit, error) {
	work := *rc
	grid := make([][]float64, len(s.params))
	for i, p := range s.params {
		for k := 0; ; k++ {
			v := p.Lo + float64(k)*p.By
			if v > p.Hi+p.By/2 {
				break
			}
			grid[i] = append(grid[i], math.Round(v/p.By)*p.By)
		}
	}
	best := Fit{Group: s.group, MAE: math.Inf(1)}
	idx := make([]int, len(grid))
	for {
		for i, p := range s.params {
			p.set(&work, grid[i][idx[i]])
		}
		mae, n, err := groupMAE(s.group, &work)
		if err != nil {
			return Fit{}, err
		}
		if mae < best.MAE {
			best.MAE, best.Rows = mae, n
			best.Params = make([]Param, len(s.params))
			for i, p := range s.params {
				best.Params[i] = p
				best.Params[i].Value = grid[i][idx[i]]
			}
		}
		// Next grid point (the last parameter fastest).
		i := len(idx) - 1
		for ; i >= 0; i-- {
			if idx[i]++; idx[i] < len(grid[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return best, nil
		}
	}
}

// WriteFits prints each fit: the fitted value, the built-in one, the grid
// and the table's error at the fit.
func WriteFits(w io.Writer, fits []Fit) {
	for _, f := range fits {
		fmt.Fprintf(w, "%s (%d rows): mean abs. error %.1f%% at the fit\n", f.Group, f.Rows, 100*f.MAE)
		for _, p := range f.Params {
			mark := ""
			if math.Abs(p.Value-p.Builtin) > p.By/2 {
				mark = "   <- the built-in profile differs"
			}
			fmt.Fprintf(w, "  %-28s fitted %-8.4g built-in %-8.4g (grid %g..%g by %g)%s\n", p.Key, p.Value, p.Builtin, p.Lo, p.Hi, p.By, mark)
		}
	}
}
