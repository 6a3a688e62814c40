// kv_append.cu: K/V rows into page slots (see kv_append.cuh).
#include "../cuda_check.h"
#include "kv_append.cuh"

namespace lockstep {
namespace {

// One block per row; threads over kv_heads * D (the row's K and V).
__global__ void kv_append_kernel(PagedKV kv, const float* k, const float* v, int64_t stride,
                                 const int32_t* row_page, const int32_t* row_slot) {
  const int64_t r = blockIdx.x;
  const int width = kv.num_kv_heads * kv.head_dim;
  const int32_t page = row_page[r];
  if (page < 0) return;  // a padding row of a decode graph: writes nothing
  const int64_t slot = int64_t(row_slot[r]) * kv.head_dim;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const int h = i / kv.head_dim, d = i % kv.head_dim;
    kv.slab[kv.offset(page, 0, h) + slot + d] = __float2bfloat16(k[r * stride + i]);
    kv.slab[kv.offset(page, 1, h) + slot + d] = __float2bfloat16(v[r * stride + i]);
  }
}

}  // namespace

void kv_append(const PagedKV& kv, const float* k, const float* v, int64_t stride,
               const int32_t* row_page, const int32_t* row_slot, int64_t rows,
               cudaStream_t stream) {
  if (rows == 0) return;
  const int width = kv.num_kv_heads * kv.head_dim;
  const int threads = width >= 256 ? 256 : ((width + 31) / 32) * 32;
  kv_append_kernel<<<unsigned(rows), threads, 0, stream>>>(kv, k, v, stride, row_page, row_slot);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
