package twin

import "math"

// actBytes is the element size of activations (BF16) in every model.
const actBytes = 2

// Work is one sequence of a step as the cost model sees it: NewTokens new
// tokens (a context chunk, or a decode when NewTokens is 1) appended at KV
// depth KVBefore (the tokens already cached). NewTokens ≥ 1, KVBefore ≥ 0.
type Work struct {
	NewTokens int
	KVBefore  int
}

// StepCost is the modelled device time of one step on one rank, in ms.
// It is plain data (no pointers), so ranks in other processes can exchange
// it and any rank can combine a fleet's costs with FleetStepMS.
//
// For every model MS() is the sum of the component fields. For MoE models
// the same total is also Lead + (MoE layers − 1)·MoELayer + Tail + MoE +
// AllToAll: the rank-local work between the lockstep points of the MoE
// layers, which FleetStepMS combines across ranks.
type StepCost struct {
	Tokens int // new tokens on this rank
	Seqs   int // sequences (context chunks and decodes) on this rank

	// Rank-local times summed over layers.
	GEMMMS      float64 // rank-local GEMMs (attention projections, dense MLP, shared experts, router)
	AttentionMS float64 // attention over the KV cache (and MLA's up-projection of cached latents)
	NormMS      float64 // norms, RoPE, activations, residuals, KV append, embedding gather
	LMHeadMS    float64 // LM head of the last token of each sequence, logits and sampling reads
	OverheadMS  float64 // fixed step overhead and per-layer launch gaps
	CommMS      float64 // tensor-parallel all-reduces (0 when tp is 1)

	// MoE layers as if this rank were the whole fleet (0 for dense models):
	// routed experts' GEMMs and the dispatch/combine all-to-all.
	MoEMS      float64
	AllToAllMS float64

	// Lockstep segments (MoE models only, else 0).
	LeadMS     float64 // step overhead, embedding, dense layers, the first MoE layer's rank-local part
	MoELayerMS float64 // rank-local part of one MoE layer (attention, projections, shared experts)
	TailMS     float64 // final norm and LM head
}

// MS is this rank's device time as if no other rank existed: the DeviceMS
// the twin engine reports. For an MoE model the experts then see only this
// rank's tokens.
func (c StepCost) MS() float64 {
	return c.GEMMMS + c.AttentionMS + c.NormMS + c.LMHeadMS + c.OverheadMS + c.CommMS + c.MoEMS + c.AllToAllMS
}

// derived holds the per-token and per-pair constants of a validated
// profile, so that StepCost is a handful of multiplications. Times are in
// ms: msPerFLOP = 1e3 / (peak·efficiency), msPerByte = 1e3 / (bandwidth·
// efficiency).
type derived struct {
	linear bool
	lin    LinearCoefficients

	denseLayers, moeLayers, layers float64

	// Rank-local GEMMs: time = params·max(2·tokens·msPerFLOP, wb·msPerByte).
	gemmMSPerFLOP, bf16GemmMSPerFLOP, gemmMSPerByte, wb float64
	paramsDenseLayer, paramsMoELayer                    float64 // per GPU
	// LM head.
	lmMSPerFLOP, lmParams, eb, logitsBytesPerSeq float64
	// Attention.
	attnMSPerFLOP, kvMSPerByte float64
	ctxPairFLOPs, decPairFLOPs float64 // per (query, key) pair per layer per GPU
	kvLayerBytes               float64 // cached bytes per token per layer per GPU
	upProjFLOPsPerKV           float64 // MLA: per cached token per layer (MHA-mode prefill)
	// Element-wise traffic, bytes per token.
	elemMSPerByte                            float64
	elemDense, elemMoE, elemEmbed, elemFinal float64
	// Overheads.
	stepMS, layerMS, graphLayerMS float64
	// Tensor parallelism: all-reduces per layer, ms per token and latency.
	tp, arDense, arMoE, arMSPerToken, arLatMS float64
	// MoE.
	ep, topK, expertParams, expertsPerGPU, missProb float64
	a2aMSPerRow, a2aLatMS, moeElemPerRow            float64
}

// derive computes the constants of a validated profile.
func derive(p *Profile) derived {
	var d derived
	m := &p.Model
	if p.Kind == KindLinear {
		d.linear = true
		d.lin = p.Linear.coefficients()
		return d
	}
	g, r := p.GPU, p.Roofline
	tp := float64(p.Parallelism.TP)
	h, V := float64(m.Hidden), float64(m.Vocab)
	hg := float64(m.Heads) / tp // heads per GPU
	d.tp = tp
	d.layers = float64(m.Layers)
	d.moeLayers = float64(m.MoELayers())
	d.denseLayers = d.layers - d.moeLayers

	gemmPeak := g.BF16FLOPS.Value
	if m.WeightBytes == 1 {
		gemmPeak = g.FP8FLOPS.Value
	}
	d.gemmMSPerFLOP = 1e3 / (gemmPeak * r.GEMMEfficiency.Value)
	d.bf16GemmMSPerFLOP = 1e3 / (g.BF16FLOPS.Value * r.GEMMEfficiency.Value)
	d.gemmMSPerByte = 1e3 / (g.HBMBytesPerS.Value * r.GEMMBandwidthEfficiency.Value)
	d.wb, d.eb = float64(m.WeightBytes), float64(m.EmbeddingBytes)

	// Attention weights and per-pair work.
	attnParams := attentionParams(m, tp)
	var elemAttn float64
	if m.MLA() {
		qlora, kvlora := float64(m.QLoraRank), float64(m.KVLoraRank)
		nope, rope, v := float64(m.QKNopeHeadDim), float64(m.QKRopeHeadDim), float64(m.VHeadDim)
		d.ctxPairFLOPs = 2 * hg * (nope + rope + v)           // MHA mode: QK over nope+rope, PV over v
		d.decPairFLOPs = 2 * hg * (kvlora + rope + kvlora)    // absorbed: QK over the latent+rope, PV over the latent
		d.upProjFLOPsPerKV = 2 * kvlora * hg * (nope + v)     // kv_b_proj of each cached latent
		d.kvLayerBytes = (kvlora + rope) * float64(m.KVBytes) // one latent, not split by TP
		elemAttn = 2*(qlora+kvlora)*actBytes + 2*(hg+1)*rope*actBytes + d.kvLayerBytes
	} else {
		hd := float64(m.HeadDim)
		kvg := math.Max(1, float64(m.KVHeads)/tp) // replicated when tp > kv heads
		d.ctxPairFLOPs = 4 * hg * hd
		d.decPairFLOPs = d.ctxPairFLOPs
		d.kvLayerBytes = 2 * kvg * hd * float64(m.KVBytes)
		elemAttn = 2*(hg+kvg)*hd*actBytes + d.kvLayerBytes // RoPE on q and k, KV append
	}
	d.attnMSPerFLOP = 1e3 / (g.BF16FLOPS.Value * r.PrefillAttentionEfficiency.Value)
	d.kvMSPerByte = 1e3 / (g.HBMBytesPerS.Value * r.DecodeAttentionEfficiency.Value)

	norms := 8 * h * actBytes // two fused add+RMSNorm: read x and residual, write both
	f := float64(m.Intermediate)
	d.paramsDenseLayer = attnParams + 3*h*f/tp
	d.elemDense = norms + elemAttn + 3*f/tp*actBytes // SiLU·mul reads 2f, writes f
	if m.MoE() {
		mf, shared, E := float64(m.MoEIntermediate), float64(m.SharedExperts), float64(m.RoutedExperts)
		d.paramsMoELayer = attnParams + shared*3*h*mf/tp + h*E // shared experts split, router replicated
		d.elemMoE = norms + elemAttn + shared*3*mf/tp*actBytes
		d.ep = float64(p.Parallelism.EP)
		d.topK = float64(m.TopK)
		d.expertParams = 3 * h * mf
		d.expertsPerGPU = E / d.ep
		d.missProb = 1 - d.topK/E
		d.moeElemPerRow = 3 * mf * actBytes
		if p.Parallelism.EP > 1 {
			d.a2aMSPerRow = h * actBytes * (d.ep - 1) / d.ep * 1e3 / (g.NVLinkBytesPerS.Value * r.CommEfficiency.Value)
			d.a2aLatMS = r.CommLatencyMS.Value
		}
	}
	d.elemEmbed = h*d.eb + h*actBytes // gather one row, write it
	d.elemFinal = 2 * h * actBytes    // final norm
	d.elemMSPerByte = 1e3 / (g.HBMBytesPerS.Value * r.ElementwiseEfficiency.Value)

	d.lmParams = V * h / tp
	lmPeak := g.BF16FLOPS.Value
	if m.EmbeddingBytes == 1 {
		lmPeak = g.FP8FLOPS.Value
	}
	d.lmMSPerFLOP = 1e3 / (lmPeak * r.GEMMEfficiency.Value)
	d.logitsBytesPerSeq = 2 * V / tp * 4 // FP32 logits written, then read by the sampler

	d.stepMS, d.layerMS, d.graphLayerMS = r.StepOverheadMS.Value, r.LayerOverheadMS.Value, r.GraphLayerOverheadMS.Value
	if p.Parallelism.TP > 1 {
		// Ring all-reduce of one hidden row per token: 2(tp−1)/tp of it
		// crosses each GPU's link in each direction.
		d.arMSPerToken = 2 * (tp - 1) / tp * h * actBytes * 1e3 / (g.NVLinkBytesPerS.Value * r.CommEfficiency.Value)
		d.arLatMS = r.CommLatencyMS.Value
		d.arDense, d.arMoE = 2, 1 // after attention and after the MLP; an MoE layer's output returns by the combine
	}
	return d
}

// attentionParams is one layer's attention weights on one GPU of a TP
// group: heads are split; MLA's down-projections (q_a, kv_a) are
// replicated; GQA KV heads are replicated when TP exceeds their number.
func attentionParams(m *Model, tp float64) float64 {
	h, hg := float64(m.Hidden), float64(m.Heads)/tp
	if !m.MLA() {
		hd := float64(m.HeadDim)
		return h * hd * (2*hg + 2*math.Max(1, float64(m.KVHeads)/tp))
	}
	qlora, kvlora := float64(m.QLoraRank), float64(m.KVLoraRank)
	nope, rope, v := float64(m.QKNopeHeadDim), float64(m.QKRopeHeadDim), float64(m.VHeadDim)
	q := h * hg * (nope + rope)
	if m.QLoraRank > 0 {
		q = h*qlora + qlora*hg*(nope+rope)
	}
	return q + h*(kvlora+rope) + kvlora*hg*(nope+v) + hg*v*h
}

// StepCost models one step of this rank over seqs. Preconditions (the twin
// engine validates them): every NewTokens ≥ 1 and KVBefore ≥ 0. It does not
// allocate. An empty step costs nothing.
func (p *Profile) StepCost(seqs []Work) StepCost {
	if !p.ready {
		panic("twin: profile not validated: call Validate before StepCost")
	}
	d := &p.d
	var tokens, decodes int
	var decKV, ctxPairs, ctxKV, ctxPrefix float64
	for _, w := range seqs {
		if w.NewTokens < 1 || w.KVBefore < 0 {
			panic("twin: StepCost precondition: NewTokens >= 1 and KVBefore >= 0")
		}
		tokens += w.NewTokens
		kv := float64(w.KVBefore)
		if w.NewTokens == 1 {
			decodes++
			decKV += kv + 1 // the new token attends to itself too
			continue
		}
		n := float64(w.NewTokens)
		ctxPairs += n * (kv + n/2)
		ctxKV += kv + n
		ctxPrefix += kv
	}
	if len(seqs) == 0 {
		return StepCost{}
	}
	c := StepCost{Tokens: tokens, Seqs: len(seqs)}
	T := float64(tokens)
	if d.linear {
		c.GEMMMS = d.lin.TokenMS * T
		c.AttentionMS = d.lin.CtxAttentionMS*ctxPairs + d.lin.DecodeKVMS*decKV
		c.OverheadMS = d.lin.OverheadMS + d.lin.SeqMS*float64(len(seqs))
		return c
	}

	// GEMMs: a roofline of 2·tokens FLOPs per parameter against reading
	// each parameter once per step.
	perParam := math.Max(2*T*d.gemmMSPerFLOP, d.wb*d.gemmMSPerByte)
	gemmDense, gemmMoE := d.paramsDenseLayer*perParam, d.paramsMoELayer*perParam

	// Attention per layer: context chunks and decodes are separate kernels,
	// each a roofline of its FLOPs against reading its sequences' KV.
	decPairs := decKV - 0.5*float64(decodes)
	attn := math.Max(ctxPairs*d.ctxPairFLOPs*d.attnMSPerFLOP, ctxKV*d.kvLayerBytes*d.kvMSPerByte) +
		math.Max(decPairs*d.decPairFLOPs*d.attnMSPerFLOP, decKV*d.kvLayerBytes*d.kvMSPerByte) +
		ctxPrefix*d.upProjFLOPsPerKV*d.bf16GemmMSPerFLOP

	layerOvh := d.layerMS
	if ctxKV == 0 {
		layerOvh = d.graphLayerMS // pure decode: a CUDA graph
	}
	ar := T*d.arMSPerToken + d.arLatMS
	if d.tp == 1 {
		ar = 0
	}
	e := d.elemMSPerByte
	localDense := gemmDense + attn + T*d.elemDense*e + layerOvh + d.arDense*ar
	localMoE := gemmMoE + attn + T*d.elemMoE*e + layerOvh + d.arMoE*ar

	ns := float64(len(seqs))
	lm := math.Max(2*ns*d.lmParams*d.lmMSPerFLOP, d.lmParams*d.eb*d.gemmMSPerByte) + ns*d.logitsBytesPerSeq*e
	embed, final := T*d.elemEmbed*e, T*d.elemFinal*e

	c.GEMMMS = d.denseLayers*gemmDense + d.moeLayers*gemmMoE
	c.AttentionMS = d.layers * attn
	c.NormMS = T*(d.denseLayers*d.elemDense+d.moeLayers*d.elemMoE)*e + embed + final
	c.LMHeadMS = lm
	c.OverheadMS = d.stepMS + d.layers*layerOvh
	c.CommMS = (d.denseLayers*d.arDense + d.moeLayers*d.arMoE) * ar
	if d.moeLayers > 0 {
		moe, a2a := d.moeLayer(T, T)
		c.MoEMS, c.AllToAllMS = d.moeLayers*moe, d.moeLayers*a2a
		c.LeadMS = d.stepMS + embed + d.denseLayers*localDense + localMoE
		c.MoELayerMS = localMoE
		c.TailMS = final + lm
	}
	return c
}

// moeLayer is the fleet-coupled part of one MoE layer on one GPU when the
// fleet has fleetTokens new tokens and its busiest rank maxTokens: the
// routed experts' GEMMs (tokens spread evenly over the experts; weights
// read of the experts that receive at least one token, in expectation) and
// the dispatch plus combine all-to-all.
func (d *derived) moeLayer(fleetTokens, maxTokens float64) (moeMS, a2aMS float64) {
	rows := fleetTokens * d.topK / d.ep // expert rows on each GPU
	// P(an expert gets none of the fleet's tokens) = (1 − top_k/E)^tokens.
	active := d.expertsPerGPU * (1 - math.Pow(d.missProb, fleetTokens))
	moeMS = math.Max(2*rows*d.expertParams*d.gemmMSPerFLOP, active*d.expertParams*d.wb*d.gemmMSPerByte) +
		rows*d.moeElemPerRow*d.elemMSPerByte
	if d.a2aMSPerRow > 0 {
		// Each GPU sends top_k copies of its tokens and receives its
		// experts' rows; the busier direction bounds each of the two passes.
		send := maxTokens / d.tp * d.topK
		a2aMS = 2 * (math.Max(send, rows)*d.a2aMSPerRow + d.a2aLatMS)
	}
	return moeMS, a2aMS
}

// FleetStepMS is the device time of one lockstep iteration of the fleet
// whose ranks' step costs are given (one per attention-DP rank, in any
// order). Dense and linear profiles: the slowest rank, max MS(). MoE
// profiles: the ranks meet at every MoE layer's dispatch, so each segment
// between lockstep points lasts as long as its slowest rank:
//
//	max Lead + (MoE layers − 1)·max MoELayer + max Tail
//	  + MoE layers · (experts(Σ tokens) + all-to-all(Σ tokens, max tokens))
//
// It is never below the largest MS(). It does not allocate.
func (p *Profile) FleetStepMS(ranks []StepCost) float64 {
	if !p.ready {
		panic("twin: profile not validated: call Validate before FleetStepMS")
	}
	d := &p.d
	if d.moeLayers == 0 || d.linear {
		worst := 0.0
		for i := range ranks {
			if ms := ranks[i].MS(); ms > worst {
				worst = ms
			}
		}
		return worst
	}
	// Plain comparisons rather than math.Max: costs are finite and ≥ 0, and
	// this loop runs over every rank of every simulated iteration.
	var fleet, maxTok int
	var lead, layer, tail float64
	for i := range ranks {
		r := &ranks[i]
		fleet += r.Tokens
		if r.Tokens > maxTok {
			maxTok = r.Tokens
		}
		if r.LeadMS > lead {
			lead = r.LeadMS
		}
		if r.MoELayerMS > layer {
			layer = r.MoELayerMS
		}
		if r.TailMS > tail {
			tail = r.TailMS
		}
	}
	if fleet == 0 {
		return 0
	}
	moe, a2a := d.moeLayer(float64(fleet), float64(maxTok))
	return lead + (d.moeLayers-1)*layer + tail + d.moeLayers*(moe+a2a)
}
