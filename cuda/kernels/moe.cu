// moe.cu: see moe.cuh.
#include "../cuda_check.h"
#include "moe.cuh"

namespace lockstep {
namespace {

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

__global__ void moe_gather_kernel(const __nv_bfloat16* x, int64_t H, const int32_t* src_row, int64_t n,
                                  __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / H, c = i % H;
    out[i] = x[int64_t(src_row[s]) * H + c];
  }
}

__global__ void moe_gather_f32_kernel(const float* y, int64_t H, const int32_t* src_row, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / H, c = i % H;
    out[i] = y[int64_t(src_row[s]) * H + c];
  }
}

__global__ void moe_combine_kernel(const float* y, int64_t H, const int32_t* slot_of, const float* weight, int32_t K,
                                   int64_t rows, const float* m, float* hidden) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / H, c = i % H;
    float acc = m != nullptr ? m[i] : 0.0f;
    for (int32_t k = 0; k < K; ++k)
      acc = __fadd_rn(acc, __fmul_rn(weight[r * K + k], y[int64_t(slot_of[r * K + k]) * H + c]));
    hidden[i] = __fadd_rn(hidden[i], acc);
  }
}

}  // namespace

void moe_gather(const __nv_bfloat16* x, int64_t H, const int32_t* src_row, int64_t n, __nv_bfloat16* out,
                cudaStream_t stream) {
  if (n * H == 0) return;
  moe_gather_kernel<<<grid_for(n * H), 256, 0, stream>>>(x, H, src_row, n, out);
  CUDA_CHECK_LAUNCH();
}

void moe_gather_f32(const float* y, int64_t H, const int32_t* src_row, int64_t n, float* out, cudaStream_t stream) {
  if (n * H == 0) return;
  moe_gather_f32_kernel<<<grid_for(n * H), 256, 0, stream>>>(y, H, src_row, n, out);
  CUDA_CHECK_LAUNCH();
}

void moe_combine(const float* y, int64_t H, const int32_t* slot_of, const float* weight, int32_t K, int64_t rows,
                 const float* m, float* hidden, cudaStream_t stream) {
  if (rows * H == 0) return;
  moe_combine_kernel<<<grid_for(rows * H), 256, 0, stream>>>(y, H, slot_of, weight, K, rows, m, hidden);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
