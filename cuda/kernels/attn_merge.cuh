// attn_merge.cuh: merge of attention partials (output, log-sum-exp).
//
// Given num_parts partials of the same (row, head) -- split-KV slices of one
// launch, or the shares of the Helix context-parallel ranks -- the exact
// attention over their union is
//   out = Σ_k w_k o_k / Σ_k w_k,  w_k = exp(lse_k - max_k lse_k),
//   lse = max_k lse_k + log Σ_k w_k.
// An empty partial (lse = -inf) has weight 0; if all are empty the output is
// 0 and lse = -inf.
#ifndef LOCKSTEP_CUDA_ATTN_MERGE_CUH
#define LOCKSTEP_CUDA_ATTN_MERGE_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

struct MergeArgs {
  // Partial k of item i (item = partial row * num_heads + head):
  //   o_part[(k * part_items + i) * D + d], lse_part[k * part_items + i].
  const float* o_part = nullptr;
  const float* lse_part = nullptr;
  int32_t num_parts = 0;
  int64_t part_items = 0;   // items per part (partial rows * num_heads)
  // Elements from one part to the next, when the parts are not packed as
  // above (0 = part_items * head_dim for o_part, part_items for lse_part):
  // o_part[k * o_part_stride + i * D + d], lse_part[k * lse_part_stride + i].
  int64_t o_part_stride = 0, lse_part_stride = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  // Output row of partial row pr: out_rows[pr] (or pr itself when null).
  const int32_t* out_rows = nullptr;
  // Outputs (either may be null): out[row * out_stride + head * D + d] as bf16
  // or float32; lse_out[pr * num_heads + head].
  __nv_bfloat16* out_bf16 = nullptr;
  float* out_f32 = nullptr;
  int64_t out_stride = 0;
  float* lse_out = nullptr;
};

// Merges every item (one block per item, threads over head_dim <= 1024).
void attn_merge(const MergeArgs& m, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_ATTN_MERGE_CUH
