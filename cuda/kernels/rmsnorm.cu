// rmsnorm.cu: see rmsnorm.cuh.
#include "../cuda_check.h"
#include "rmsnorm.cuh"

namespace lockstep {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const float* x, const int32_t* in_rows,
                                                            const float* w, int32_t n, float eps,
                                                            __nv_bfloat16* yb, float* yf) {
  const int64_t r = blockIdx.x;
  const float* xr = x + (in_rows != nullptr ? int64_t(in_rows[r]) : r) * n;
  double ss = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) ss += double(xr[i]) * double(xr[i]);
  __shared__ double part[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  double tot = 0.0;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) tot += part[i];
  const float inv = float(1.0 / sqrt(tot / n + double(eps)));
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float y = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
    if (yb != nullptr) yb[r * n + i] = __float2bfloat16(y);
    else yf[r * n + i] = y;
  }
}

}  // namespace

void rmsnorm(const float* x, const int32_t* in_rows, const float* w, int32_t n, float eps,
             int64_t rows, __nv_bfloat16* y_bf16, float* y_f32, cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, in_rows, w, n, eps, y_bf16, y_f32);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
