package twin

import "fmt"

// Operator-level views of the cost model, for checking it against published
// kernel tables (eval/twinval): the same functions StepCost applies, one
// operator at a time.

// LayerCosts is one layer's modelled operator times on one GPU, ms.
type LayerCosts struct {
	GEMMMS        float64 // the layer's rank-local GEMMs (projections, dense MLP or shared experts, router)
	AttentionMS   float64 // attention kernels (context and decode)
	ElementwiseMS float64 // norms, RoPE and KV append, activation, residuals
	AllReduceMS   float64 // tensor-parallel all-reduces (0 at tp 1)
}

// LayerCosts is the cost of one layer of the model's first kind (a dense
// layer; an MoE layer's rank-local part when every layer is MoE) over a
// step of seqs, without the step's fixed overheads, embedding and LM head.
// Roofline profiles only.
func (p *Profile) LayerCosts(seqs []Work) (LayerCosts, error) {
	if !p.ready || p.Kind != KindRoofline {
		return LayerCosts{}, fmt.Errorf("layer costs need a validated roofline profile")
	}
	d := &p.d
	st := sumsOf(seqs, d.window)
	T := float64(st.tokens)
	set, elem, kernels, ars := &d.dense, d.elemDense, d.kernelsDense, d.arDense
	if d.denseLayers == 0 {
		set, elem, kernels, ars = &d.moe, d.elemMoE, d.kernelsMoE, d.arMoE
	}
	c := LayerCosts{GEMMMS: d.gemmMS(T, set, d.gemmMSPerFLOP, d.wb), AttentionMS: d.layerAttention(&st),
		ElementwiseMS: kernels*d.elemKernelMS + T*elem*d.elemMSPerByte}
	if d.tp > 1 && len(seqs) > 0 {
		c.AllReduceMS = ars * (T*d.arMSPerToken + d.arLatMS)
	}
	return c, nil
}

// GEMMMS is the modelled time of one GEMM of rows tokens through a k×n
// weight matrix stored as weight, on the profile's GPU. Roofline profiles
// only; 0 for no rows.
func (p *Profile) GEMMMS(rows, k, n int, weight DType) float64 {
	if !p.ready || p.Kind != KindRoofline {
		panic("twin: GEMMMS needs a validated roofline profile")
	}
	d := &p.d
	perFLOP := d.bf16GemmMSPerFLOP
	switch weight {
	case FP8:
		perFLOP = 1e3 / (p.GPU.FP8FLOPS.Value * p.Roofline.FP8GEMMEfficiency.Value)
	case NVFP4:
		perFLOP = 1e3 / (p.GPU.FP4FLOPS.Value * p.Roofline.fp4Efficiency())
	}
	var s gemmSet
	s.add(float64(k), float64(n))
	return d.gemmMS(float64(rows), &s, perFLOP, weight.Bytes())
}

// AllReduceMS is the modelled time of one all-reduce of bytes over gpus
// GPUs placed on the profile's NVLink domains (gpus_per_node). Roofline
// profiles only.
func (p *Profile) AllReduceMS(bytes float64, gpus int) float64 {
	if !p.ready || p.Kind != KindRoofline {
		panic("twin: AllReduceMS needs a validated roofline profile")
	}
	perByte, lat := allReduceCost(p, gpus)
	return lat + bytes*perByte
}
