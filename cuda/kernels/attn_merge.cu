// attn_merge.cu: log-sum-exp merge of attention partials (see attn_merge.cuh).
#include "../cuda_check.h"
#include "attn_merge.cuh"

namespace lockstep {
namespace {

__global__ void attn_merge_kernel(MergeArgs m) {
  const int64_t item = blockIdx.x;
  const int d = threadIdx.x;
  const int64_t os = m.o_part_stride > 0 ? m.o_part_stride : m.part_items * m.head_dim;
  const int64_t ls = m.lse_part_stride > 0 ? m.lse_part_stride : m.part_items;
  float mx = -INFINITY;
  for (int k = 0; k < m.num_parts; ++k) mx = fmaxf(mx, m.lse_part[k * ls + item]);
  float wsum = 0.0f, acc = 0.0f;
  if (mx != -INFINITY) {
    for (int k = 0; k < m.num_parts; ++k) {
      const float w = __expf(m.lse_part[k * ls + item] - mx);
      wsum += w;
      acc += w * m.o_part[k * os + item * m.head_dim + d];
    }
  }
  const float o = wsum > 0.0f ? acc / wsum : 0.0f;
  const int64_t pr = item / m.num_heads;
  const int head = int(item % m.num_heads);
  const int64_t row = m.out_rows != nullptr ? m.out_rows[pr] : pr;
  const int64_t off = row * m.out_stride + int64_t(head) * m.head_dim + d;
  if (m.out_bf16 != nullptr) m.out_bf16[off] = __float2bfloat16(o);
  if (m.out_f32 != nullptr) m.out_f32[off] = o;
  if (m.lse_out != nullptr && d == 0) m.lse_out[item] = wsum > 0.0f ? mx + logf(wsum) : -INFINITY;
}

}  // namespace

void attn_merge(const MergeArgs& m, cudaStream_t stream) {
  if (m.part_items == 0) return;
  attn_merge_kernel<<<unsigned(m.part_items), unsigned(m.head_dim), 0, stream>>>(m);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
