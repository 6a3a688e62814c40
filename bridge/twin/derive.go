package twin

import "math"

// actBytes is the element size of activations (BF16) in every model.
const actBytes = 2

// gemm is one weight matrix of a layer on one GPU: K inputs by N outputs.
type gemm struct{ k, n float64 }

// gemmSet is the GEMMs of one layer kind, a fixed array so that StepCost
// does not allocate.
type gemmSet struct {
	mats [8]gemm
	n    int
}

func (s *gemmSet) add(k, n float64) {
	if k > 0 && n > 0 {
		s.mats[s.n] = gemm{k, n}
		s.n++
	}
}

// params is the number of weights of the set.
func (s *gemmSet) params() float64 {
	var p float64
	for i := 0; i < s.n; i++ {
		p += s.mats[i].k * s.mats[i].n
	}
	return p
}

// derived holds the per-token and per-pair constants of a validated
// profile, so that StepCost is a handful of multiplications. Times are in
// ms: msPerFLOP = 1e3 / (peak·efficiency), msPerByte = 1e3 / (bandwidth·
// efficiency).
type derived struct {
	linear bool
	lin    LinearCoefficients

	denseLayers, moeLayers, layers float64
	// Sliding-window attention: the window, and how many layers have it.
	window, slidingLayers float64

	// GEMMs (docs/twin.md "GEMMs"): per matrix kernel + hypot(compute of
	// the tokens rounded up to tiles, weight and activation bytes).
	gemmMSPerFLOP, bf16GemmMSPerFLOP, gemmMSPerByte, wb, tile, gemmKernelMS float64
	dense, moe                                                              gemmSet // rank-local GEMMs of a dense and an MoE layer, per GPU
	// LM head.
	lm                                 gemmSet
	lmMSPerFLOP, eb, logitsBytesPerSeq float64
	// Attention.
	attnMSPerFLOP, kvMSPerByte, attnKernelMS float64
	ctxPairFLOPs, decPairFLOPs               float64 // per (query, key) pair per layer per GPU
	kvLayerBytes                             float64 // cached bytes per token per layer per GPU
	upProjFLOPsPerKV                         float64 // MLA: per cached token per layer (MHA-mode prefill)
	// Element-wise traffic, bytes per token, and kernels per layer.
	elemMSPerByte, elemKernelMS              float64
	elemDense, elemMoE, elemEmbed, elemFinal float64
	kernelsDense, kernelsMoE                 float64
	// Overheads.
	stepMS, layerMS, graphLayerMS float64
	// Attention DP (adp.go): GraphFleet's captured batch sizes, MoE padding.
	graphFleet, moePadding bool
	graphSizes             []int
	// Tensor parallelism: all-reduces per layer, ms per token and latency.
	tp, arDense, arMoE, arMSPerToken, arLatMS float64
	// MoE (moe.go).
	moeD moeDerived
}

// derive computes the constants of a validated profile.
func derive(p *Profile) derived {
	var d derived
	m := &p.Model
	d.layers, d.window, d.slidingLayers = float64(m.Layers), float64(m.SlidingWindow), float64(m.SlidingLayers())
	if p.Kind == KindLinear {
		d.linear = true
		d.lin = p.Linear.coefficients()
		return d
	}
	g, r := p.GPU, p.Roofline
	tp := float64(p.Parallelism.TP)
	h, V := float64(m.Hidden), float64(m.Vocab)
	d.tp = tp
	d.layers = float64(m.Layers)
	d.moeLayers = float64(m.MoELayers())
	d.denseLayers = d.layers - d.moeLayers

	d.bf16GemmMSPerFLOP = 1e3 / (g.BF16FLOPS.Value * r.GEMMEfficiency.Value)
	d.gemmMSPerFLOP = d.bf16GemmMSPerFLOP
	switch dtypeOf(m.WeightBytes) {
	case FP8:
		d.gemmMSPerFLOP = 1e3 / (g.FP8FLOPS.Value * r.FP8GEMMEfficiency.Value)
	case NVFP4:
		d.gemmMSPerFLOP = 1e3 / (g.FP4FLOPS.Value * r.fp4Efficiency())
	}
	d.gemmMSPerByte = 1e3 / (g.HBMBytesPerS.Value * r.GEMMBandwidthEfficiency.Value)
	d.wb, d.eb = m.WeightBytes, float64(m.EmbeddingBytes)
	d.tile, d.gemmKernelMS = r.GEMMTileTokens.Value, r.GEMMKernelMS.Value

	attn, elemAttn := d.deriveAttention(m, tp)
	d.attnMSPerFLOP = 1e3 / (g.BF16FLOPS.Value * r.PrefillAttentionEfficiency.Value)
	d.kvMSPerByte = 1e3 / (g.HBMBytesPerS.Value * r.DecodeAttentionEfficiency.Value)
	d.attnKernelMS = r.AttentionKernelMS.Value

	// Element-wise kernels of a layer: two fused add+RMSNorm (read x and
	// residual, write both), RoPE with the KV append, and the SiLU·mul
	// (MoE layers: of the shared experts, plus the router's top-k).
	norms := 8 * h * actBytes
	f := float64(m.Intermediate)
	d.dense = attn
	d.dense.add(h, 2*f/tp)                           // gate and up, fused
	d.dense.add(f/tp, h)                             // down
	d.elemDense = norms + elemAttn + 3*f/tp*actBytes // SiLU·mul reads 2f, writes f
	d.kernelsDense = 4
	if m.MoE() {
		mf, shared, E := float64(m.MoEIntermediate), float64(m.SharedExperts), float64(m.RoutedExperts)
		d.moe = attn
		d.moe.add(h, 2*shared*mf/tp) // shared experts, split by TP
		d.moe.add(shared*mf/tp, h)
		d.moe.add(h, E) // router, replicated
		d.elemMoE = norms + elemAttn + shared*3*mf/tp*actBytes + E*4*2
		d.kernelsMoE = 4 // norms, RoPE, router top-k
		if shared > 0 {
			d.kernelsMoE++
		}
		d.moeD = deriveMoE(p, &d)
	}
	d.elemEmbed = h*d.eb + h*actBytes // gather one row, write it
	d.elemFinal = 2 * h * actBytes    // final norm
	d.elemMSPerByte = 1e3 / (g.HBMBytesPerS.Value * r.ElementwiseEfficiency.Value)
	d.elemKernelMS = r.ElementwiseKernelMS.Value

	d.lm.add(h, V/tp)
	lmPeak, lmEff := g.BF16FLOPS.Value, r.GEMMEfficiency.Value
	if m.EmbeddingBytes == 1 {
		lmPeak, lmEff = g.FP8FLOPS.Value, r.FP8GEMMEfficiency.Value
	}
	d.lmMSPerFLOP = 1e3 / (lmPeak * lmEff)
	d.logitsBytesPerSeq = 2 * V / tp * 4 // FP32 logits written, then read by the sampler

	d.stepMS, d.layerMS, d.graphLayerMS = r.StepOverheadMS.Value, r.LayerOverheadMS.Value, r.GraphLayerOverheadMS.Value
	if a := p.AttentionDP; a.CUDAGraph == GraphFleet {
		d.graphFleet = true
		max := a.CUDAGraphMaxBatchSize
		if max == 0 {
			max = defaultGraphMaxBatch
		}
		d.graphSizes = graphSizes(max)
	}
	d.moePadding = p.AttentionDP.MoEPadding
	if p.Parallelism.TP > 1 {
		perByte, lat := allReduceCost(p, p.Parallelism.TP)
		d.arMSPerToken, d.arLatMS = perByte*h*actBytes, lat
		d.arDense, d.arMoE = 2, 1 // after attention and after the MLP; an MoE layer's output returns by the combine
	}
	return d
}

// deriveAttention sets the attention's per-pair work and KV bytes and
// returns the layer's attention projections and the element-wise bytes per
// token attention adds (RoPE, the KV append; MLA's latent norms).
func (d *derived) deriveAttention(m *Model, tp float64) (attn gemmSet, elemAttn float64) {
	attentionGEMMs(m, tp, &attn)
	hg := float64(m.Heads) / tp // heads per GPU
	if m.MLA() {
		qlora, kvlora := float64(m.QLoraRank), float64(m.KVLoraRank)
		nope, rope, v := float64(m.QKNopeHeadDim), float64(m.QKRopeHeadDim), float64(m.VHeadDim)
		d.ctxPairFLOPs = 2 * hg * (nope + rope + v)           // MHA mode: QK over nope+rope, PV over v
		d.decPairFLOPs = 2 * hg * (kvlora + rope + kvlora)    // absorbed: QK over the latent+rope, PV over the latent
		d.upProjFLOPsPerKV = 2 * kvlora * hg * (nope + v)     // kv_b_proj of each cached latent
		d.kvLayerBytes = (kvlora + rope) * float64(m.KVBytes) // one latent, not split by TP
		return attn, 2*(qlora+kvlora)*actBytes + 2*(hg+1)*rope*actBytes + d.kvLayerBytes
	}
	hd := float64(m.HeadDim)
	kvg := math.Max(1, float64(m.KVHeads)/tp) // replicated when tp > kv heads
	d.ctxPairFLOPs = 4 * hg * hd
	d.decPairFLOPs = d.ctxPairFLOPs
	d.kvLayerBytes = 2 * kvg * hd * float64(m.KVBytes)
	return attn, 2*(hg+kvg)*hd*actBytes + d.kvLayerBytes // RoPE on q and k, KV append
}

// allReduceCost is one all-reduce over gpus GPUs of the profile's
// topology: its time per byte reduced and its fixed cost. Inside an NVLink
// domain the ring bus traffic 2(n−1)/n of the data crosses each GPU's link
// at the measured all-reduce rate; a group wider than a domain reduces
// hierarchically — within each of its N domains over NVLink, across them
// 2(N−1)/N of each GPU's 1/G share over its RDMA link.
func allReduceCost(p *Profile, gpus int) (msPerByte, latMS float64) {
	if gpus <= 1 {
		return 0, 0
	}
	g, r := p.GPU, p.Roofline
	n := float64(gpus)
	gd := math.Min(n, float64(p.Parallelism.GPUsPerNode))
	nvRate := g.NVLinkBytesPerS.Value * r.AllReduceNVLinkFraction.Value
	if gd > 1 {
		msPerByte = 2 * (gd - 1) / gd * 1e3 / nvRate
	}
	latMS = r.AllReduceLatencyMS.Value
	if nodes := math.Ceil(n / gd); nodes > 1 {
		msPerByte += 2 * (nodes - 1) / nodes / gd * 1e3 / (g.RDMABytesPerS.Value * r.RDMAEfficiency.Value)
		latMS += r.RDMALatencyMS.Value
	}
	return msPerByte, latMS
}

// attentionGEMMs adds one layer's attention projections on one GPU of a TP
// group: heads are split; MLA's down-projections (q_a, kv_a) are
// replicated; GQA KV heads are replicated when TP exceeds their number.
func attentionGEMMs(m *Model, tp float64, s *gemmSet) {
	h, hg := float64(m.Hidden), float64(m.Heads)/tp
	if !m.MLA() {
		hd := float64(m.HeadDim)
		s.add(h, hd*(hg+2*math.Max(1, float64(m.KVHeads)/tp))) // fused QKV
		s.add(hg*hd, h)                                        // output
		return
	}
	qlora, kvlora := float64(m.QLoraRank), float64(m.KVLoraRank)
	nope, rope, v := float64(m.QKNopeHeadDim), float64(m.QKRopeHeadDim), float64(m.VHeadDim)
	if m.QLoraRank > 0 {
		s.add(h, qlora)
		s.add(qlora, hg*(nope+rope))
	} else {
		s.add(h, hg*(nope+rope))
	}
	s.add(h, kvlora+rope)
	s.add(kvlora, hg*(nope+v))
	s.add(hg*v, h)
}

// attentionParams is one layer's attention weights on one GPU of a TP group.
func attentionParams(m *Model, tp float64) float64 {
	var s gemmSet
	attentionGEMMs(m, tp, &s)
	return s.params()
}

// gemmMS is the time of the GEMMs of set over rows tokens: per matrix the
// fixed kernel cost plus the hypotenuse of its compute time (tokens
// rounded up to whole tiles) and its memory time (weights at wb bytes, the
// input activations at wb bytes — FP8 GEMMs take FP8 inputs — and the BF16
// output). The hypotenuse is a smooth roofline: it is the larger of the two
// where one dominates and up to √2 times it where they are equal, the
// transition Vidur's profiles show between 64 and 512 tokens.
func (d *derived) gemmMS(rows float64, s *gemmSet, msPerFLOP, wb float64) float64 {
	if rows <= 0 {
		return 0
	}
	padded := math.Ceil(rows/d.tile) * d.tile
	var t float64
	for i := 0; i < s.n; i++ {
		k, n := s.mats[i].k, s.mats[i].n
		c := 2 * padded * k * n * msPerFLOP
		b := (k*n*wb + rows*(k*wb+n*actBytes)) * d.gemmMSPerByte
		t += d.gemmKernelMS + math.Sqrt(c*c+b*b)
	}
	return t
}
