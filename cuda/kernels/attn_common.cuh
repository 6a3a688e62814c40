// attn_common.cuh: what the paged attention kernels share: the page layout,
// the per-sequence descriptor, the launch arguments and the K/V tile loader.
//
// Page layout on the device (bf16), one contiguous block per page:
//   page[layer][K=0 | V=1][kv_head][slot][head_dim]
// A page of one kv head is then a contiguous [P][D] tile, so a key tile is
// read with 16-byte coalesced loads, and a page copy between tiers is one
// memcpy. (The CPU slab orders [slot][kv_head] instead; the layouts never
// meet: pages move only between tiers of the same backend.)
//
// Positions. Sequence s holds keys at positions [0, start_pos + num_tokens);
// position p is slot p % P of page block_tables[block_off + p / P]. Query row
// t of s (t < num_tokens) is at position start_pos + t and attends to keys
// [kv_begin, min(kv_end, start_pos + t + 1)) -- causal inside the chunk, full
// over the prefix. [kv_begin, kv_end) lets a caller compute a partial over a
// slice of the context (split-KV inside one launch, or a Helix rank's share);
// the whole context is kv_begin = 0, kv_end = start_pos + num_tokens.
//
// Partials. With split-KV each (row, head, split) produces the normalised
// partial output o = Σ exp(s_j - m) v_j / l and lse = m + log(l); an empty
// split has l = 0 and writes o = 0, lse = -inf. attn_merge combines any number
// of partials (splits, or Helix ranks) into the final output.
#ifndef LOCKSTEP_CUDA_ATTN_COMMON_CUH
#define LOCKSTEP_CUDA_ATTN_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step_layout.h"

namespace lockstep {

// The device page slab as the kernels see it.
struct PagedKV {
  __nv_bfloat16* slab = nullptr;  // page 0, layer 0, K, head 0, slot 0
  int64_t page_elems = 0;         // bf16 elements per page
  int32_t tokens_per_page = 0;    // P
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;           // D, a multiple of 8
  int32_t layer = 0;              // the layer a launch reads or writes

  // Element offset of (page, K|V, head, slot 0) for `layer`.
  __host__ __device__ int64_t offset(int32_t page, int kv, int32_t head) const {
    return kv_page_offset(page_elems, tokens_per_page, num_kv_heads, head_dim, page, layer, kv, head);
  }
};

// AttnSeq (one sequence of an attention launch) is defined in step_layout.h,
// where the host builds it.

struct AttnArgs {
  // Queries, float32 with RoPE applied: q[row * q_stride + head * D + d].
  const float* q = nullptr;
  int64_t q_stride = 0;
  PagedKV kv;
  const int32_t* block_tables = nullptr;
  const AttnSeq* seqs = nullptr;  // [num_seqs], device
  int32_t num_seqs = 0;
  int32_t num_heads = 0;          // query heads; num_heads % num_kv_heads == 0
  float scale = 0;                // softmax scale, 1/sqrt(D)
  // Split-KV: split k covers keys [kv_begin + k*split_tokens, kv_begin + (k+1)*split_tokens).
  int32_t num_splits = 1;
  int32_t split_tokens = 0;       // a multiple of 64 (the key tile); ignored when num_splits == 1
  // Final output (used when o_part == nullptr; requires num_splits == 1):
  // out[row * out_stride + head * D + d], bf16.
  __nv_bfloat16* out = nullptr;
  int64_t out_stride = 0;
  // Partial outputs (when not null), indexed by partial row pr = part_row + t:
  //   o_part[((split * part_rows + pr) * num_heads + head) * D + d]
  //   lse_part[(split * part_rows + pr) * num_heads + head]
  float* o_part = nullptr;
  float* lse_part = nullptr;
  int32_t part_rows = 0;
};

// Copies keys [t0, t0 + TILE) ∩ [t0, t_end) of kv head `head` into the shared
// tiles Ks / Vs ([TILE][D + 8] bf16, padded against bank conflicts); rows past
// t_end are zero-filled (callers mask them). Whole block participates; the
// caller synchronises afterwards.
template <int D, int TILE, int THREADS>
__device__ inline void load_kv_tile(const PagedKV& kv, const int32_t* blocks, int32_t head,
                                    int32_t t0, int32_t t_end, __nv_bfloat16* Ks,
                                    __nv_bfloat16* Vs) {
  constexpr int VECS = D / 8;  // 16-byte vectors per row
  constexpr int DP = D + 8;
  const int32_t P = kv.tokens_per_page;
#pragma unroll 4
  for (int i = threadIdx.x; i < TILE * VECS; i += THREADS) {
    const int r = i / VECS, c = i % VECS;
    const int32_t t = t0 + r;
    uint4 k4 = make_uint4(0, 0, 0, 0), v4 = make_uint4(0, 0, 0, 0);
    if (t < t_end) {
      const int32_t page = blocks[t / P];
      const int64_t slot = (t % P) * int64_t(D) + c * 8;
      k4 = *reinterpret_cast<const uint4*>(kv.slab + kv.offset(page, 0, head) + slot);
      v4 = *reinterpret_cast<const uint4*>(kv.slab + kv.offset(page, 1, head) + slot);
    }
    *reinterpret_cast<uint4*>(Ks + r * DP + c * 8) = k4;
    *reinterpret_cast<uint4*>(Vs + r * DP + c * 8) = v4;
  }
}

__device__ inline float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_ATTN_COMMON_CUH
