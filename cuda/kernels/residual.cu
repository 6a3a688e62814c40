// residual.cu: see residual.cuh.
#include "../cuda_check.h"
#include "residual.cuh"

namespace lockstep {
namespace {

__global__ void residual_kernel(float* h, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    h[i] += x[i];
}

}  // namespace

void residual_add(float* h, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  residual_kernel<<<unsigned(blocks < 65535 * 8 ? blocks : 65535 * 8), 256, 0, stream>>>(h, x, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
