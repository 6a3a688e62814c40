package fleet

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/nccl"
)

// weightBytes is the bf16 size of the weights one CUDA engine holds: the
// attention (GQA, or MLA's projections and absorbed forms), the dense MLPs,
// and in MoE layers the router, the shared experts and this rank's share of
// the routed experts over ep expert-parallel members (expert e on member
// e mod ep); the embedding, LM head and norms. A dense GQA model is
// 2·(2·V·h + L·(h·(q + 2kv) + q·h + 3·h·f + 2h) + h).
func weightBytes(s bridge.ModelShape, ep int) uint64 {
	h, f, v := uint64(s.HiddenSize), uint64(s.IntermediateSize), uint64(s.VocabSize)
	var attn uint64
	if s.MLA() {
		heads, ql, kl := uint64(s.NumHeads), uint64(s.QLoraRank), uint64(s.KVLoraRank)
		nope, rope, vd := uint64(s.QKNopeHeadDim), uint64(s.QKRopeHeadDim), uint64(s.VHeadDim)
		qIn := h
		if ql > 0 {
			attn += h*ql + ql // q_a and its norm
			qIn = ql
		}
		attn += qIn*heads*(nope+rope) + h*(kl+rope) + kl + heads*nope*kl + heads*kl*vd + heads*vd*h
	} else {
		q, kv := uint64(s.NumHeads*s.HeadDim), uint64(s.NumKVHeads*s.HeadDim)
		attn = h*(q+2*kv) + q*h
	}
	if ep < 1 {
		ep = 1
	}
	var layers uint64
	for l := 0; l < s.NumLayers; l++ {
		layers += attn + 2*h
		if !s.MoELayer(l) {
			layers += 3 * h * f
			continue
		}
		e, mf := uint64(s.NumExperts), uint64(s.MoEIntermediateSize)
		owned := (e + uint64(ep) - 1) / uint64(ep)
		layers += h*e + uint64(s.NumSharedExperts)*3*h*mf + owned*3*h*mf
	}
	return 2 * (2*v*h + layers + h)
}

// poolPagesFromGPU sizes the device page pool from this rank's free GPU
// memory (read through Options.GPUFreeMemory: NVML, injected by the command): after the weights, frac of what is left, in
// bf16 pages. Every rank then takes the world's minimum (kvcache.md §3.3:
// every rank ends with the same token capacity); a rank that cannot read
// its GPU contributes 0 and the whole world fails with its reason. The
// allreduce runs on every rank whenever --pages is 0 — a configuration
// value, identical everywhere.
func poolPagesFromGPU(o *Options, device int, comm nccl.Comm) (int, error) {
	shape, err := o.ModelShape()
	if err != nil {
		return 0, err
	}
	pageBytes := uint64(o.TokensPerPage * shape.KVBytesPerToken(2))
	ep := 1 // the routed experts this rank holds are dealt over the attention-DP ranks
	if comm != nil && o.expertParallel(comm.Size()) {
		ep = comm.Size()
	}
	var local int64
	read := o.GPUFreeMemory
	if read == nil {
		read = func(device int) (uint64, error) {
			return 0, fmt.Errorf("reading free memory of GPU %d: this build has no GPU discovery", device)
		}
	}
	free, ferr := read(device)
	if ferr == nil {
		if w := weightBytes(shape, ep); free > w {
			local = int64(float64(free-w) * o.GPUMemFraction / float64(pageBytes))
		}
	}
	min := local
	if comm != nil && comm.Size() > 1 {
		got, err := comm.AllReduceInt64("kv_quota_min", nccl.ReduceMin, []int64{local})
		if err != nil {
			return 0, err
		}
		min = got[0]
	}
	switch {
	case ferr != nil:
		return 0, fmt.Errorf("--pages 0: %w", ferr)
	case min < 1:
		return 0, fmt.Errorf("--pages 0: no free GPU memory to size the KV cache on some rank (this rank: %d pages of %d bytes after %d bytes of weights)",
			local, pageBytes, weightBytes(shape, ep))
	}
	return int(min), nil
}
