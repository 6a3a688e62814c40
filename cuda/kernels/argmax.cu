// argmax.cu: see argmax.cuh.
#include <climits>

#include "../cuda_check.h"
#include "argmax.cuh"

namespace lockstep {
namespace {

constexpr int kThreads = 512;

// (v, i) beats (bv, bi) if larger, or equal with a lower index. NaN compares
// false both ways, so it never beats anything.
//
// Parity with the CPU's sampling_argmax (native/src/sampling.cpp), which
// scans `if (x[i] > x[best]) best = i` from best = 0: NaN never wins, ties go
// to the lowest index, an all -inf (or all NaN) row gives 0 -- and a NaN at
// index 0 gives 0, because nothing compares greater than NaN. The kernel
// reproduces that last case explicitly.
__device__ inline void take_best(float v, int32_t i, float& bv, int32_t& bi) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* x, int32_t n, int32_t* out) {
  const float* xr = x + int64_t(blockIdx.x) * n;
  float bv = -INFINITY;
  int32_t bi = INT_MAX;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) take_best(xr[i], i, bv, bi);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    take_best(ov, oi, bv, bi);
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int32_t si[kThreads / 32];
  if (threadIdx.x % 32 == 0) {
    sv[threadIdx.x / 32] = bv;
    si[threadIdx.x / 32] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) take_best(sv[w], si[w], bv, bi);
    out[blockIdx.x] = bi == INT_MAX || isnan(xr[0]) ? 0 : bi;
  }
}

}  // namespace

void argmax_rows(const float* x, int64_t rows, int32_t n, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, n, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
