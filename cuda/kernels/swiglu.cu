// swiglu.cu: see swiglu.cuh.
#include "../cuda_check.h"
#include "swiglu.cuh"

namespace lockstep {
namespace {

__global__ void swiglu_kernel(const float* gu, int64_t n, int32_t F, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i % F;
    const float g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j];
    out[i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
  }
}

}  // namespace

void swiglu(const float* gu, int64_t rows, int32_t F, __nv_bfloat16* out, cudaStream_t stream) {
  const int64_t n = rows * F;
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  swiglu_kernel<<<unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8), 256, 0, stream>>>(gu, n, F, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
