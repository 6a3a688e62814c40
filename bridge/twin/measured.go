package twin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
)

// Measurements are per-op rates measured on a lent GPU with our CUDA engine
// (scripts/device-check.sh writes them as JSON). ProfileFromMeasurements
// turns them into efficiencies of the GPU's datasheet peaks, so the twin is
// re-based on measurement. The JSON keys:
//
//	{
//	  "version": 1,                      // required, must be 1
//	  "gpu": "h200",                     // required: the built-in GPU name measured
//	  "source": "device-check 2025-06-01, lockstep 1a2b3c, CUDA 12.8", // required
//	  "gemm_tflops": 690.0,              // required: achieved BF16 GEMM rate, large shapes (M,N,K ≥ 4096)
//	  "prefill_attention_tflops": 560.0, // required: achieved causal prefill attention rate
//	  "decode_attention_gbps": 3900.0,   // required: achieved paged decode attention bandwidth, GB/s (1e9)
//	  "step_overhead_ms": 0.12,          // required: fixed per-step time of an empty-ish step
//	  "gemm_weight_gbps": 4100.0,        // optional: weight-streaming rate of decode-sized GEMMs
//	  "elementwise_gbps": 4000.0,        // optional: achieved bandwidth of norm/element-wise kernels
//	  "layer_overhead_ms": 0.02,         // optional: per-layer launch gaps, eager steps
//	  "graph_layer_overhead_ms": 0.008,  // optional: per-layer gaps, CUDA-graph decode steps
//	  "fp8_gemm_tflops": 1350.0,         // optional: achieved FP8 GEMM rate, large shapes
//	  "gemm_kernel_ms": 0.005,           // optional: fixed cost of one GEMM kernel (the intercept of a token sweep)
//	  "attention_kernel_ms": 0.012,      // optional: fixed cost of one attention kernel (batch 1, short KV)
//	  "elementwise_kernel_ms": 0.003     // optional: fixed cost of one element-wise kernel (one token)
//	}
//
// Rates are achieved throughputs (useful FLOPs or bytes over kernel time);
// an optional key left out (or 0) keeps the base profile's coefficient.
//
// Field units: TFLOPS are 1e12 FLOP/s, GBPS 1e9 bytes/s, MS milliseconds.
type Measurements struct {
	Version                int     `json:"version"`
	GPU                    string  `json:"gpu"`
	Source                 string  `json:"source"`
	GEMMTFLOPS             float64 `json:"gemm_tflops"`
	PrefillAttentionTFLOPS float64 `json:"prefill_attention_tflops"`
	DecodeAttentionGBPS    float64 `json:"decode_attention_gbps"`
	StepOverheadMS         float64 `json:"step_overhead_ms"`
	GEMMWeightGBPS         float64 `json:"gemm_weight_gbps,omitempty"`
	ElementwiseGBPS        float64 `json:"elementwise_gbps,omitempty"`
	LayerOverheadMS        float64 `json:"layer_overhead_ms,omitempty"`
	GraphLayerOverheadMS   float64 `json:"graph_layer_overhead_ms,omitempty"`
	FP8GEMMTFLOPS          float64 `json:"fp8_gemm_tflops,omitempty"`
	GEMMKernelMS           float64 `json:"gemm_kernel_ms,omitempty"`
	AttentionKernelMS      float64 `json:"attention_kernel_ms,omitempty"`
	ElementwiseKernelMS    float64 `json:"elementwise_kernel_ms,omitempty"`
}

// LoadMeasurements reads a measurements file strictly (unknown fields and
// trailing data are errors).
func LoadMeasurements(path string) (Measurements, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Measurements{}, fmt.Errorf("measurements: %w", err)
	}
	m, err := ReadMeasurements(data)
	if err != nil {
		return Measurements{}, fmt.Errorf("measurements %s: %w", path, err)
	}
	return m, nil
}

// ReadMeasurements decodes measurements strictly (unknown fields and
// trailing data are errors).
func ReadMeasurements(data []byte) (Measurements, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Measurements
	if err := dec.Decode(&m); err != nil {
		return Measurements{}, err
	}
	if dec.More() {
		return Measurements{}, fmt.Errorf("trailing data after the object")
	}
	return m, nil
}

// ProfileFromMeasurements returns a copy of the roofline profile base whose
// efficiencies are the measured rates over base's GPU peaks and whose
// overheads are the measured ones; each replaced coefficient's source says
// "measured: <m.Source>". An efficiency above 1 means the datasheet figure
// or the measurement is wrong and is refused.
func ProfileFromMeasurements(base *Profile, m Measurements) (*Profile, error) {
	if base.Kind != KindRoofline {
		return nil, fmt.Errorf("measurements apply to a roofline profile, not %s", base.Kind)
	}
	switch {
	case m.Version != 1:
		return nil, fmt.Errorf("measurements: version must be 1, got %d", m.Version)
	case m.GPU != base.GPU.Name:
		return nil, fmt.Errorf("measurements: measured on gpu %q but the profile is for %q", m.GPU, base.GPU.Name)
	case m.Source == "":
		return nil, fmt.Errorf("measurements: source is empty: say what measured them and when")
	}
	q := base.clone()
	r, g := q.Roofline, q.GPU
	src := "measured: " + m.Source
	set := func(dst *Coef, field string, v, scale, peak float64, required bool) error {
		if v == 0 && !required {
			return nil
		}
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("measurements: %s must be positive and finite, got %g", field, v)
		}
		val := v      // an overhead, ms
		if peak > 0 { // a rate: its fraction of the datasheet peak
			val = v * scale / peak
			if val > 1 {
				return fmt.Errorf("measurements: %s = %g exceeds the datasheet peak %g of %s: check the measurement or the gpu figures",
					field, v, peak/scale, g.Name)
			}
		}
		*dst = Coef{val, fmt.Sprintf("%s (%s = %g)", src, field, v)}
		return nil
	}
	for _, s := range []struct {
		dst      *Coef
		field    string
		v, scale float64
		peak     float64
		required bool
	}{
		{&r.GEMMEfficiency, "gemm_tflops", m.GEMMTFLOPS, 1e12, g.BF16FLOPS.Value, true},
		{&r.PrefillAttentionEfficiency, "prefill_attention_tflops", m.PrefillAttentionTFLOPS, 1e12, g.BF16FLOPS.Value, true},
		{&r.DecodeAttentionEfficiency, "decode_attention_gbps", m.DecodeAttentionGBPS, 1e9, g.HBMBytesPerS.Value, true},
		{&r.StepOverheadMS, "step_overhead_ms", m.StepOverheadMS, 1, 0, true},
		{&r.GEMMBandwidthEfficiency, "gemm_weight_gbps", m.GEMMWeightGBPS, 1e9, g.HBMBytesPerS.Value, false},
		{&r.ElementwiseEfficiency, "elementwise_gbps", m.ElementwiseGBPS, 1e9, g.HBMBytesPerS.Value, false},
		{&r.LayerOverheadMS, "layer_overhead_ms", m.LayerOverheadMS, 1, 0, false},
		{&r.GraphLayerOverheadMS, "graph_layer_overhead_ms", m.GraphLayerOverheadMS, 1, 0, false},
		{&r.FP8GEMMEfficiency, "fp8_gemm_tflops", m.FP8GEMMTFLOPS, 1e12, g.FP8FLOPS.Value, false},
		{&r.GEMMKernelMS, "gemm_kernel_ms", m.GEMMKernelMS, 1, 0, false},
		{&r.AttentionKernelMS, "attention_kernel_ms", m.AttentionKernelMS, 1, 0, false},
		{&r.ElementwiseKernelMS, "elementwise_kernel_ms", m.ElementwiseKernelMS, 1, 0, false},
	} {
		if err := set(s.dst, s.field, s.v, s.scale, s.peak, s.required); err != nil {
			return nil, err
		}
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("measured profile: %w", err)
	}
	return q, nil
}
