package twin

import (
	"fmt"
	"math"
)

// WeightBytesPerGPU is what one GPU of a rank holds of the model's weights:
// the attention, dense-MLP, shared-expert, embedding and LM-head weights
// split by TP (attention DP replicates them on every rank; MLA's
// down-projections and the router are replicated under TP too), the routed
// experts split by EP, and the norm weights whole. Linear weights count
// weight_bytes each, the embedding, LM head and norms embedding_bytes.
// Block-quantisation scales of FP8 checkpoints are not counted (< 0.1%).
func (p *Profile) WeightBytesPerGPU() float64 {
	m := &p.Model
	tp := float64(p.Parallelism.TP)
	h, V := float64(m.Hidden), float64(m.Vocab)
	attn, attnNorm := attentionParams(m, tp), 0.0
	if m.MLA() {
		attnNorm = float64(m.QLoraRank + m.KVLoraRank) // q_a and kv_a layernorms
	}
	dense, moe := float64(m.Layers-m.MoELayers()), float64(m.MoELayers())
	linear := float64(m.Layers)*attn + dense*3*h*float64(m.Intermediate)/tp
	if m.MoE() {
		mf, E := float64(m.MoEIntermediate), float64(m.RoutedExperts)
		perGPU := math.Ceil(E / float64(p.Parallelism.EP))
		linear += moe * (float64(m.SharedExperts)*3*h*mf/tp + h*E + perGPU*3*h*mf)
	}
	norms := float64(m.Layers)*(2*h+attnNorm) + h
	return linear*m.WeightBytes + (2*V*h/tp+norms)*float64(m.EmbeddingBytes)
}

// KVBytesPerToken is the KV cache of one token over all layers on one GPU
// of a rank: GQA 2·layers·kv_heads·head_dim·kv_bytes (kv heads split by TP),
// MLA layers·(kv_lora_rank + qk_rope_head_dim)·kv_bytes (the latent is
// replicated on every TP GPU).
func (p *Profile) KVBytesPerToken() float64 {
	m := &p.Model
	if m.MLA() {
		return float64(m.Layers * (m.KVLoraRank + m.QKRopeHeadDim) * m.KVBytes)
	}
	kvg := math.Max(1, float64(m.KVHeads)/float64(p.Parallelism.TP))
	return 2 * float64(m.Layers) * kvg * float64(m.HeadDim*m.KVBytes)
}

// PoolPages sizes one rank's KV page pool from its GPUs' memory, as the
// CUDA engine does with --pages 0: per GPU,
//
//	pool = (hbm_bytes − weights − reserve_bytes) · (1 − reserve_fraction)
//	pages = floor(pool / (tokensPerPage · KVBytesPerToken))
//
// A model that leaves no room is refused with the numbers and a way out.
// Linear profiles have no GPU and are refused (give --pages).
func (p *Profile) PoolPages(tokensPerPage int) (int, error) {
	if tokensPerPage < 1 {
		return 0, fmt.Errorf("tokens per page must be at least 1, got %d", tokensPerPage)
	}
	if p.Kind != KindRoofline {
		return 0, fmt.Errorf("a %s cost profile has no GPU memory to size the KV pool from: give --pages", p.Kind)
	}
	hbm, w := p.GPU.HBMBytes.Value, p.WeightBytesPerGPU()
	reserve, frac := p.Roofline.ReserveBytes.Value, p.Roofline.ReserveFraction.Value
	pageBytes := float64(tokensPerPage) * p.KVBytesPerToken()
	free := (hbm - w - reserve) * (1 - frac)
	pages := math.Floor(free / pageBytes)
	if free <= 0 || pages < 1 {
		return 0, fmt.Errorf("%s (%s weights) needs %.1f GB of weights per GPU with tp %d%s; %s has %.1f GB, minus a %.1f GB reserve: "+
			"no room for even one KV page of %.2f MB; %s",
			p.Model.Name, dtypeOf(p.Model.WeightBytes), w/1e9, p.Parallelism.TP, p.epNote(), p.GPU.Name, hbm/1e9,
			reserve/1e9, pageBytes/1e6, p.fitHint())
	}
	if pages > math.MaxInt32 {
		pages = math.MaxInt32 // page indices are int32
	}
	return int(pages), nil
}

func (p *Profile) epNote() string {
	if p.Model.MoE() {
		return fmt.Sprintf(" and ep %d", p.Parallelism.EP)
	}
	return ""
}

// fitHint suggests the smallest change that fits: a larger TP for dense
// models, more expert-parallel GPUs for MoE models.
func (p *Profile) fitHint() string {
	q := p.clone()
	if p.Model.MoE() {
		for ep := p.Parallelism.EP * 2; ep <= p.Model.RoutedExperts; ep *= 2 {
			q.Parallelism.EP = ep
			if q.fits() {
				return fmt.Sprintf("spread the experts over more GPUs (ep %d: %.1f GB per GPU; ep = ranks x tp) or use a GPU with more memory",
					ep, q.WeightBytesPerGPU()/1e9)
			}
		}
		return "use a GPU with more memory"
	}
	for tp := p.Parallelism.TP * 2; tp <= p.Model.Heads; tp *= 2 {
		q.Parallelism.TP = tp
		if q.validateParallelism() == nil && q.fits() {
			return fmt.Sprintf("use --tp %d (%.1f GB of weights per GPU) or a GPU with more memory", tp, q.WeightBytesPerGPU()/1e9)
		}
	}
	return "use a GPU with more memory"
}

// fits reports whether at least one page of 64 tokens fits.
func (p *Profile) fits() bool {
	free := (p.GPU.HBMBytes.Value - p.WeightBytesPerGPU() - p.Roofline.ReserveBytes.Value) * (1 - p.Roofline.ReserveFraction.Value)
	return free >= 64*p.KVBytesPerToken()
}
