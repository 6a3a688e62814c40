package fleet

import (
	"fmt"

	"github.com/lockstep-ai/lockstep/bridge"
	"github.com/lockstep-ai/lockstep/nccl"
)

// weightBytes is the bf16 size of the synthetic model's weights.
func weightBytes(s bridge.ModelShape) uint64 {
	h, f, v := uint64(s.HiddenSize), uint64(s.IntermediateSize), uint64(s.VocabSize)
	q, kv := uint64(s.NumHeads*s.HeadDim), uint64(s.NumKVHeads*s.HeadDim)
	perLayer := h*(q+2*kv) + q*h + 3*h*f + 2*h
	return 2 * (2*v*h + uint64(s.NumLayers)*perLayer + h)
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
	var local int64
	read := o.GPUFreeMemory
	if read == nil {
		read = func(device int) (uint64, error) {
			return 0, fmt.Errorf("reading free memory of GPU %d: this build has no GPU discovery", device)
		}
	}
	free, ferr := read(device)
	if ferr == nil {
		if w := weightBytes(shape); free > w {
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
			local, pageBytes, weightBytes(shape))
	}
	return int(min), nil
}
