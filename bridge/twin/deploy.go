package twin

import (
	"fmt"
	"strings"
)

// DType is an element type of a deployment: of the layers' linear weights
// (--weight-dtype) or of the KV cache (--kv-dtype).
type DType string

// The element types the twin models. FP8 is e4m3 with per-tensor or
// per-block scales (ModelOpt's FP8 checkpoints, DeepSeek's 128×128 blocks);
// the scales are not counted (< 0.1% of the bytes). NVFP4 is e2m1 with one
// e4m3 scale per 16 elements (ModelOpt's NVFP4 checkpoints, e.g.
// DeepSeek-R1-FP4): 4.5 bits an element, the scales counted; weights only,
// on GPUs with FP4 tensor cores (Blackwell).
const (
	BF16  DType = "bf16"
	FP8   DType = "fp8"
	NVFP4 DType = "nvfp4"
)

// nvfp4Bytes is NVFP4's size per element: 4 bits and an 8-bit scale per 16.
const nvfp4Bytes = (4 + 8.0/16) / 8

// DTypeNames are the allowed names, for messages and flag help.
const DTypeNames = "bf16, fp8, nvfp4 (weights only)"

// ParseDType reads a dtype name; "" is allowed and means "the model's own"
// (the zero DType, which WithDTypes leaves unchanged).
func ParseDType(s string) (DType, error) {
	switch d := DType(strings.ToLower(strings.TrimSpace(s))); d {
	case "", BF16, FP8, NVFP4:
		return d, nil
	}
	return "", fmt.Errorf("unknown dtype %q (allowed: %s)", s, DTypeNames)
}

// Bytes is the element size: 2 for BF16, 1 for FP8, 0.5625 for NVFP4.
func (d DType) Bytes() float64 {
	switch d {
	case FP8:
		return 1
	case NVFP4:
		return nvfp4Bytes
	}
	return 2
}

// dtypeOf names an element size.
func dtypeOf(bytes float64) DType {
	switch bytes {
	case 1:
		return FP8
	case nvfp4Bytes:
		return NVFP4
	}
	return BF16
}

// WithDTypes returns a validated copy of the roofline profile p whose
// layers' linear weights are stored as weight and whose KV cache as kv (an
// empty DType keeps the model's own). FP8 weights halve the weight bytes and
// make the layers' GEMMs run at the GPU's FP8 rate (fp8_gemm_efficiency);
// NVFP4 weights take 0.5625 bytes an element and run at the GPU's FP4 rate
// (fp4_gemm_efficiency, fitted to published B200 NVFP4 GEMM tables), their
// activations quantised to NVFP4 too;
// the embedding, LM head and norms stay BF16, as in FP8 checkpoints. An FP8
// KV cache halves the KV bytes per token (what fits doubles, attention reads
// half); attention arithmetic stays at the BF16 rate. Linear profiles have
// no dtypes and are refused.
func (p *Profile) WithDTypes(weight, kv DType) (*Profile, error) {
	if p.Kind != KindRoofline && (weight != "" || kv != "") {
		return nil, fmt.Errorf("a %s cost profile has no dtypes (its times were fitted to an engine as it ran)", p.Kind)
	}
	if kv == NVFP4 {
		return nil, fmt.Errorf("the twin's KV cache is bf16 or fp8, not %s", kv)
	}
	if weight == NVFP4 && p.GPU.FP4FLOPS.Value <= 0 {
		return nil, fmt.Errorf("%s weights need FP4 tensor cores, which the %s has not (Blackwell has: b200, gb300)", weight, p.GPU.Name)
	}
	q := p.clone()
	m := &q.Model
	var changed []string
	if weight != "" && weight.Bytes() != m.WeightBytes {
		m.WeightBytes = weight.Bytes()
		changed = append(changed, "weights "+string(weight))
	}
	if kv != "" && int(kv.Bytes()) != m.KVBytes {
		m.KVBytes = int(kv.Bytes())
		changed = append(changed, "KV cache "+string(kv))
	}
	if len(changed) > 0 {
		m.Source += "; deployed with " + strings.Join(changed, " and ") + " (--weight-dtype, --kv-dtype)"
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return q, nil
}

// WithTopology returns a validated copy of the roofline profile p whose
// NVLink domains hold gpusPerNode GPUs (0 keeps p's): the fleet's GPUs fill
// domains in rank order, and a TP or expert-parallel group larger than a
// domain sends the rest of its traffic over the RDMA network.
func (p *Profile) WithTopology(gpusPerNode int) (*Profile, error) {
	if gpusPerNode == 0 {
		return p.validatedCopy()
	}
	if p.Kind != KindRoofline {
		return nil, fmt.Errorf("a %s cost profile has no network to place GPUs on", p.Kind)
	}
	if gpusPerNode < 0 {
		return nil, fmt.Errorf("gpus per node must be at least 1, got %d", gpusPerNode)
	}
	q := p.clone()
	q.Parallelism.GPUsPerNode = gpusPerNode
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return q, nil
}

// WithExpertZipf returns a validated copy of the roofline profile p whose
// routed-expert popularity follows a Zipf law of exponent s (0: uniform);
// a negative s keeps p's. The source records that the value was chosen.
func (p *Profile) WithExpertZipf(s float64) (*Profile, error) {
	if s < 0 {
		return p.validatedCopy()
	}
	if p.Kind != KindRoofline {
		return nil, fmt.Errorf("a %s cost profile has no expert routing", p.Kind)
	}
	q := p.clone()
	q.Roofline.ExpertZipf = Coef{s, fmt.Sprintf("chosen (--expert-zipf %g): expert popularity ∝ 1/rank^%g", s, s)}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return q, nil
}

// validatedCopy is a validated copy of p.
func (p *Profile) validatedCopy() (*Profile, error) {
	q := p.clone()
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return q, nil
}
