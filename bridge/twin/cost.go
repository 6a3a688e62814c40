package twin

import "math"

// Work is one sequence of a step as the cost model sees it: NewTokens new
// tokens (a context chunk, or a decode when NewTokens is 1) appended at KV
// depth KVBefore (the tokens already cached). NewTokens ≥ 1, KVBefore ≥ 0.
type Work struct {
	NewTokens int
	KVBefore  int
	// Scored is how many of its rows are scored (prompt log-probabilities:
	// bridge.SeqStep.ScoreTargets), each an LM head row beside the
	// sequence's last token's.
	Scored int
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
	// DecodeKV is the decodes' KV reads, each decode's KV depth plus
	// itself (AttentionDP's CUDA-graph padding recosts a generation-only
	// rank from it).
	DecodeKV float64
	// DecodeKVWindow is DecodeKV on a sliding-window layer: each decode
	// reads at most the window (DecodeKV when the model has none).
	DecodeKVWindow float64

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

// StepCost models one step of this rank over seqs. Preconditions (the twin
// engine validates them): every NewTokens ≥ 1 and KVBefore ≥ 0. It does not
// allocate. An empty step costs nothing.
func (p *Profile) StepCost(seqs []Work) StepCost {
	if !p.ready {
		panic("twin: profile not validated: call Validate before StepCost")
	}
	st := sumsOf(seqs, p.d.window)
	if len(seqs) == 0 {
		return StepCost{}
	}
	return p.costOf(&st, len(seqs), st.ctxKV == 0)
}

// costOf is the cost of a step of ns sequences whose sums are st; graph:
// the step replays a CUDA graph (per-layer launch gaps of
// graph_layer_overhead_ms, else layer_overhead_ms).
func (p *Profile) costOf(st *stepSums, ns int, graph bool) StepCost {
	d := &p.d
	c := StepCost{Tokens: st.tokens, Seqs: ns, DecodeKV: st.decKV, DecodeKVWindow: st.win.decKV}
	T := float64(st.tokens)
	if d.linear {
		c.GEMMMS = d.lin.TokenMS * T
		g, s := d.layerShares()
		c.AttentionMS = g*(d.lin.CtxAttentionMS*st.ctxPairs+d.lin.DecodeKVMS*st.decKV) +
			s*(d.lin.CtxAttentionMS*st.win.ctxPairs+d.lin.DecodeKVMS*st.win.decKV)
		c.OverheadMS = d.lin.OverheadMS + d.lin.SeqMS*float64(ns)
		return c
	}

	// GEMMs: per matrix a smooth roofline of the tile-rounded tokens'
	// arithmetic against the weight and activation bytes, plus the
	// kernel's fixed cost.
	gemmDense := d.gemmMS(T, &d.dense, d.gemmMSPerFLOP, d.wb)
	gemmMoE := 0.0
	if d.moeLayers > 0 {
		gemmMoE = d.gemmMS(T, &d.moe, d.gemmMSPerFLOP, d.wb)
	}

	attn := d.layerAttention(st)
	layerOvh := d.layerMS
	if graph {
		layerOvh = d.graphLayerMS // pure decode: a CUDA graph
	}
	ar := T*d.arMSPerToken + d.arLatMS
	if d.tp == 1 {
		ar = 0
	}
	e, k := d.elemMSPerByte, d.elemKernelMS
	normDense, normMoE := d.kernelsDense*k+T*d.elemDense*e, d.kernelsMoE*k+T*d.elemMoE*e
	localDense := gemmDense + attn + normDense + layerOvh + d.arDense*ar
	localMoE := gemmMoE + attn + normMoE + layerOvh + d.arMoE*ar

	// The LM head of each sequence's last token and of every scored row,
	// its logits written and read by the sampler; the embedding gather and
	// the final norm.
	nsf := float64(ns + st.scored)
	lm := d.gemmMS(nsf, &d.lm, d.lmMSPerFLOP, d.eb) + k + nsf*d.logitsBytesPerSeq*e
	embed, final := k+T*d.elemEmbed*e, k+T*d.elemFinal*e

	c.GEMMMS = d.denseLayers*gemmDense + d.moeLayers*gemmMoE
	c.AttentionMS = d.layers * attn
	c.NormMS = d.denseLayers*normDense + d.moeLayers*normMoE + embed + final
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

// stepSums are the sums over a step's sequences that the cost model reads.
type stepSums struct {
	tokens, decodes, scored int
	attnSums
	// win: the same sums on a sliding-window layer (equal to attnSums
	// when the model has no window).
	win attnSums
}

// attnSums are a step's attention work.
type attnSums struct {
	decKV, ctxPairs, ctxKV, ctxPrefix float64
}

// sumsOf classifies a step's sequences: a decode (one new token) reads its
// KV and itself; a context chunk of n tokens at depth kv has n·(kv + n/2)
// causal pairs and reads kv + n cached tokens. On a layer with a sliding
// window W (window > 0) a query at position p sees min(p + 1, W) keys.
func sumsOf(seqs []Work, window float64) stepSums {
	var st stepSums
	for _, w := range seqs {
		if w.NewTokens < 1 || w.KVBefore < 0 {
			panic("twin: StepCost precondition: NewTokens >= 1 and KVBefore >= 0")
		}
		st.tokens += w.NewTokens
		st.scored += w.Scored
		kv := float64(w.KVBefore)
		if w.NewTokens == 1 {
			st.decodes++
			st.decKV += kv + 1 // the new token attends to itself too
			st.win.decKV += capped(kv+1, window)
			continue
		}
		n := float64(w.NewTokens)
		st.ctxPairs += n * (kv + n/2)
		st.ctxKV += kv + n
		st.ctxPrefix += kv
		st.win.ctxPairs += windowPairs(kv, n, window)
		st.win.ctxKV += capped(kv+n, n-1+window)
		st.win.ctxPrefix += capped(kv, window)
	}
	if window == 0 {
		st.win = st.attnSums
	}
	return st
}

// capped is min(x, limit), or x without a limit (0).
func capped(x, limit float64) float64 {
	if limit == 0 || x < limit {
		return x
	}
	return limit
}

// windowPairs is the (query, key) pairs of n queries at positions kv …
// kv + n − 1 that each see min(p + 1, window) keys: the chunk's
// n·(kv + n/2) with the window's cut (the same half-pair convention).
func windowPairs(kv, n, window float64) float64 {
	if window == 0 {
		return n * (kv + n/2)
	}
	// Queries below the window see p + 1 keys, the rest the window.
	below := math.Max(0, math.Min(n, window-kv-1))
	return below*(kv+below/2) + (n-below)*window
}

// layerShares are the fractions of the layers without and with a sliding
// window.
func (d *derived) layerShares() (global, sliding float64) {
	if d.layers == 0 {
		return 1, 0
	}
	return (d.layers - d.slidingLayers) / d.layers, d.slidingLayers / d.layers
}

// layerAttention is one layer's attention averaged over the layers: the
// global ones' over st, the sliding ones' over st.win.
func (d *derived) layerAttention(st *stepSums) float64 {
	g, s := d.layerShares()
	if s == 0 {
		return d.attention(st)
	}
	win := *st
	win.attnSums = st.win
	return g*d.attention(st) + s*d.attention(&win)
}

// attention is one layer's attention: context chunks and decodes are
// separate kernels, each its fixed cost plus a roofline of its FLOPs
// against reading its sequences' KV (and, for MLA chunks, the BF16
// up-projection of the cached latents).
func (d *derived) attention(st *stepSums) float64 {
	var attn float64
	if st.ctxKV > 0 {
		attn += d.attnKernelMS + math.Max(st.ctxPairs*d.ctxPairFLOPs*d.attnMSPerFLOP, st.ctxKV*d.kvLayerBytes*d.kvMSPerByte) +
			st.ctxPrefix*d.upProjFLOPsPerKV*d.bf16GemmMSPerFLOP
	}
	if st.decodes > 0 {
		decPairs := st.decKV - 0.5*float64(st.decodes)
		attn += d.attnKernelMS + math.Max(decPairs*d.decPairFLOPs*d.attnMSPerFLOP, st.decKV*d.kvLayerBytes*d.kvMSPerByte)
	}
	return attn
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
// The profile's AttentionDP changes the ranks' steps first: with
// GraphFleet a generation-only rank pads to the fleet's graph batch, or
// runs eager when any rank cannot replay a graph; with MoEPadding the
// experts see ranks × max tokens. It is never below the largest MS() of
// the ranks as given when AttentionDP is off. It does not allocate.
func (p *Profile) FleetStepMS(ranks []StepCost) float64 {
	if !p.ready {
		panic("twin: profile not validated: call Validate before FleetStepMS")
	}
	d := &p.d
	if d.linear {
		return worstMS(ranks)
	}
	fleetGraph, graph := d.graphFleet, 0
	if fleetGraph {
		graph = p.fleetGraphBatch(ranks)
	}
	if d.moeLayers == 0 {
		if !fleetGraph {
			return worstMS(ranks)
		}
		worst := 0.0
		for i := range ranks {
			r := p.fleetRank(&ranks[i], graph)
			if ms := r.MS(); ms > worst {
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
		var fr StepCost
		if fleetGraph {
			fr = p.fleetRank(r, graph)
			r = &fr
		}
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
	if d.moePadding {
		fleet = len(ranks) * maxTok
	}
	moe, a2a := d.moeLayer(float64(fleet), float64(maxTok))
	return lead + (d.moeLayers-1)*layer + tail + d.moeLayers*(moe+a2a)
}

// worstMS is the largest MS() of ranks.
func worstMS(ranks []StepCost) float64 {
	worst := 0.0
	for i := range ranks {
		if ms := ranks[i].MS(); ms > worst {
			worst = ms
		}
	}
	return worst
}

// fleetGraphBatch is the batch every rank pads to under GraphFleet, or 0
// when the fleet runs eager: a rank has a context chunk, or the largest
// batch is above the largest captured size (TensorRT-LLM then pads none
// and the batch sizes differ).
func (p *Profile) fleetGraphBatch(ranks []StepCost) int {
	n := 0
	for i := range ranks {
		r := &ranks[i]
		if r.Tokens != r.Seqs {
			return 0
		}
		if r.Seqs > n {
			n = r.Seqs
		}
	}
	if n == 0 {
		return 0
	}
	return p.d.graphBatch(n)
}
