package twin

import (
	"fmt"
	"math"
)

// LinearCoefficients are the terms of a linear step-time model:
//
//	StepMS = OverheadMS + TokenMS·tokens + CtxAttentionMS·Σ_ctx n·(kv + n/2)
//	         + DecodeKVMS·Σ_decode (kv + 1) + SeqMS·sequences
//
// where a context chunk is a sequence with n ≥ 2 new tokens at depth kv and
// a decode one with a single new token (a 1-token chunk costs what a decode
// costs, so it counts as one). All terms are ms per unit and ≥ 0.
type LinearCoefficients struct {
	OverheadMS     float64 `json:"overhead_ms"`      // ms per step
	TokenMS        float64 `json:"token_ms"`         // ms per new token
	CtxAttentionMS float64 `json:"ctx_attention_ms"` // ms per causal query–key pair of a context chunk
	DecodeKVMS     float64 `json:"decode_kv_ms"`     // ms per KV token a decode reads
	SeqMS          float64 `json:"seq_ms"`           // ms per sequence
}

// LinearTerms are LinearCoefficients with their sources, as a linear
// profile file holds them.
type LinearTerms struct {
	// The terms of LinearCoefficients, each with its source.
	OverheadMS     Coef `json:"overhead_ms"`
	TokenMS        Coef `json:"token_ms"`
	CtxAttentionMS Coef `json:"ctx_attention_ms"`
	DecodeKVMS     Coef `json:"decode_kv_ms"`
	SeqMS          Coef `json:"seq_ms"`
}

func (t *LinearTerms) coefficients() LinearCoefficients {
	return LinearCoefficients{t.OverheadMS.Value, t.TokenMS.Value, t.CtxAttentionMS.Value, t.DecodeKVMS.Value, t.SeqMS.Value}
}

// LinearSample is one measured step: its features (as FeaturesOf computes
// them from the step's sequences) and its measured time MS.
type LinearSample struct {
	Tokens   float64 // new tokens
	CtxWork  float64 // Σ over context chunks (n ≥ 2) of n·(kv + n/2)
	DecodeKV float64 // Σ over decodes (n = 1) of kv + 1
	Seqs     float64 // sequences
	MS       float64 // measured step time
}

// FeaturesOf computes a step's linear features (MS left 0), with the same
// classification StepCost uses. Preconditions as for StepCost.
func FeaturesOf(seqs []Work) LinearSample {
	var s LinearSample
	for _, w := range seqs {
		n, kv := float64(w.NewTokens), float64(w.KVBefore)
		s.Tokens += n
		s.Seqs++
		if w.NewTokens == 1 {
			s.DecodeKV += kv + 1
		} else {
			s.CtxWork += n * (kv + n/2)
		}
	}
	return s
}

// Predict is the modelled time of a sample's features.
func (c LinearCoefficients) Predict(s LinearSample) float64 {
	return c.OverheadMS + c.TokenMS*s.Tokens + c.CtxAttentionMS*s.CtxWork + c.DecodeKVMS*s.DecodeKV + c.SeqMS*s.Seqs
}

// NewLinearProfile builds a validated linear profile of model m from fitted
// (or chosen) coefficients; source is recorded on every term, e.g. "fit of
// 5,312 iterations of run-1.jsonl, RMSE 0.8 ms".
func NewLinearProfile(m Model, c LinearCoefficients, source string) (*Profile, error) {
	co := func(v float64) Coef { return Coef{v, source} }
	p := &Profile{Version: ProfileVersion, Kind: KindLinear, Model: m, Parallelism: Parallelism{TP: 1, EP: 1},
		Linear:         &LinearTerms{co(c.OverheadMS), co(c.TokenMS), co(c.CtxAttentionMS), co(c.DecodeKVMS), co(c.SeqMS)},
		HostOverheadMS: defaultHostOverhead()}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Profile) validateLinear() error {
	switch {
	case p.Linear == nil:
		return fmt.Errorf("linear is missing (a linear profile needs its terms)")
	case p.GPU != nil:
		return fmt.Errorf("gpu must be absent in a linear profile")
	case p.Roofline != nil:
		return fmt.Errorf("roofline must be absent in a linear profile")
	case p.Parallelism != Parallelism{TP: 1, EP: 1}:
		return fmt.Errorf("parallelism must be {tp: 1, ep: 1} in a linear profile, got {tp: %d, ep: %d}",
			p.Parallelism.TP, p.Parallelism.EP)
	}
	t := p.Linear
	for _, c := range []struct {
		field string
		c     Coef
	}{
		{"linear.overhead_ms", t.OverheadMS}, {"linear.token_ms", t.TokenMS},
		{"linear.ctx_attention_ms", t.CtxAttentionMS}, {"linear.decode_kv_ms", t.DecodeKVMS},
		{"linear.seq_ms", t.SeqMS},
	} {
		if err := c.c.nonNegative(c.field); err != nil {
			return err
		}
	}
	return nil
}

// numLinear is the number of linear terms.
const numLinear = 5

// FitLinear fits LinearCoefficients to measured steps by non-negative least
// squares of the relative error, Σ ((predicted − measured) / measured)² (a
// time is never reduced by more work). Relative, because a real engine's
// steps span three or more orders of magnitude (a lone decode against a full
// prefill chunk): an absolute fit lets the long steps decide everything and
// misses the short ones, which are most of the iterations of a decode-heavy
// run, by several times. Samples whose measured time is 0 are skipped.
// Method: each row is divided by its measured time (the target becomes 1),
// each feature column (1, tokens, ctx work, decode KV, sequences) is scaled to unit RMS,
// the 5×5 normal equations are formed, and the Lawson–Hanson active-set
// algorithm solves them under x ≥ 0 (a tiny ridge keeps collinear features,
// e.g. tokens = sequences in a decode-only log, solvable). A feature that is
// zero in every sample gets coefficient 0. Needs at least 2 samples with
// finite, non-negative values.
func FitLinear(samples []LinearSample) (LinearCoefficients, error) {
	if len(samples) < 2 {
		return LinearCoefficients{}, fmt.Errorf("fit needs at least 2 samples, got %d", len(samples))
	}
	var scale [numLinear]float64
	used := 0
	for i, s := range samples {
		row := s.features()
		for _, v := range append(row[:], s.MS) {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return LinearCoefficients{}, fmt.Errorf("sample %d: every feature and ms must be finite and non-negative, got %+v", i, s)
			}
		}
		if s.MS == 0 {
			continue
		}
		used++
		for j, v := range row {
			scale[j] += (v / s.MS) * (v / s.MS)
		}
	}
	if used < 2 {
		return LinearCoefficients{}, fmt.Errorf("fit needs at least 2 samples with a measured time above 0, got %d", used)
	}
	n := float64(used)
	for j := range scale {
		scale[j] = math.Sqrt(scale[j] / n)
	}
	// Normal equations over the scaled, non-zero columns.
	var G [numLinear][numLinear]float64
	var g [numLinear]float64
	for _, s := range samples {
		if s.MS == 0 {
			continue
		}
		row := s.features()
		for j := range row {
			row[j] /= s.MS // relative error: the target is 1
			if scale[j] > 0 {
				row[j] /= scale[j]
			}
		}
		for i := range row {
			g[i] += row[i] / n
			for j := range row {
				G[i][j] += row[i] * row[j] / n
			}
		}
	}
	var usable [numLinear]bool
	for j := range scale {
		usable[j] = scale[j] > 0
	}
	x := nnls(G, g, usable)
	var c [numLinear]float64
	for j := range x {
		if scale[j] > 0 {
			c[j] = x[j] / scale[j]
		}
	}
	return LinearCoefficients{c[0], c[1], c[2], c[3], c[4]}, nil
}

// features is a sample's design row, in LinearCoefficients order.
func (s LinearSample) features() [numLinear]float64 {
	return [numLinear]float64{1, s.Tokens, s.CtxWork, s.DecodeKV, s.Seqs}
}

// nnls minimises ½xᵀGx − gᵀx subject to x ≥ 0 (and x_j = 0 where !usable),
// which is least squares when G = AᵀA and g = Aᵀb: Lawson–Hanson's
// active-set method. The passive set P holds the free variables; each outer
// step frees the variable with the largest positive gradient, each inner
// step solves the unconstrained problem on P and, where that leaves P
// infeasible, moves back along the segment to the first bound it hits.
func nnls(G [numLinear][numLinear]float64, g [numLinear]float64, usable [numLinear]bool) [numLinear]float64 {
	var x [numLinear]float64
	var passive [numLinear]bool
	maxDiag := 0.0
	for j := range G {
		maxDiag = math.Max(maxDiag, G[j][j])
	}
	ridge := 1e-10 * math.Max(maxDiag, 1e-300)
	tol := 1e-12 * math.Max(maxAbs(g[:]), 1e-300)
	for iter := 0; iter < 10*numLinear; iter++ {
		w := gradient(G, g, x)
		best, bestW := -1, tol
		for j := range w {
			if usable[j] && !passive[j] && w[j] > bestW {
				best, bestW = j, w[j]
			}
		}
		if best < 0 {
			break // KKT: no free direction improves the fit
		}
		passive[best] = true
		for inner := 0; inner < 10*numLinear; inner++ {
			z := solvePassive(G, g, passive, ridge)
			alpha, clipped := 1.0, false
			for j := range z {
				if passive[j] && z[j] <= 0 {
					clipped = true
					if a := x[j] / (x[j] - z[j]); a < alpha {
						alpha = a
					}
				}
			}
			if !clipped {
				x = z
				break
			}
			for j := range x {
				if passive[j] {
					x[j] += alpha * (z[j] - x[j])
					if x[j] <= 1e-15 {
						x[j], passive[j] = 0, false
					}
				}
			}
		}
	}
	return x
}

// gradient is g − Gx, the negative gradient of the objective.
func gradient(G [numLinear][numLinear]float64, g, x [numLinear]float64) [numLinear]float64 {
	w := g
	for i := range G {
		for j := range G[i] {
			w[i] -= G[i][j] * x[j]
		}
	}
	return w
}

// solvePassive solves G_PP z_P = g_P (z = 0 off P) by Gaussian elimination
// with partial pivoting; ridge is added to the diagonal.
func solvePassive(G [numLinear][numLinear]float64, g [numLinear]float64, passive [numLinear]bool, ridge float64) [numLinear]float64 {
	idx := make([]int, 0, numLinear)
	for j, on := range passive {
		if on {
			idx = append(idx, j)
		}
	}
	k := len(idx)
	var a [numLinear][numLinear + 1]float64
	for r, i := range idx {
		for c, j := range idx {
			a[r][c] = G[i][j]
		}
		a[r][r] += ridge
		a[r][k] = g[i]
	}
	for col := 0; col < k; col++ {
		piv := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		a[col], a[piv] = a[piv], a[col]
		if a[col][col] == 0 {
			continue // singular despite the ridge: leave this variable at 0
		}
		for r := col + 1; r < k; r++ {
			f := a[r][col] / a[col][col]
			for c := col; c <= k; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	var z [numLinear]float64
	for r := k - 1; r >= 0; r-- {
		if a[r][r] == 0 {
			continue
		}
		s := a[r][k]
		for c := r + 1; c < k; c++ {
			s -= a[r][c] * z[idx[c]]
		}
		z[idx[r]] = s / a[r][r]
	}
	return z
}

func maxAbs(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(x))
	}
	return m
}
