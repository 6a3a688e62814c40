// rope.cu: see rope.cuh.
#include "../cuda_check.h"
#include "rope.cuh"

namespace lockstep {
namespace {

// One block per row; threads over heads * D/2 rotation pairs.
__global__ void rope_kernel(float* x, int64_t stride, int32_t heads, int32_t D,
                            const int32_t* pos, const double* inv_freq, int64_t head_stride, double mag) {
  const int64_t r = blockIdx.x;
  const int half = D / 2;
  const double p = double(pos[r]);
  for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int h = i / half, k = i % half;
    double sd, cd;
    sincos(p * inv_freq[k], &sd, &cd);
    const float c = float(cd * mag), s = float(sd * mag);
    float* xh = x + r * stride + int64_t(h) * head_stride;
    const float x0 = xh[k], x1 = xh[half + k];
    xh[k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    xh[half + k] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
}

}  // namespace

void rope(float* x, int64_t stride, int32_t heads, int32_t head_dim, const int32_t* pos,
          const double* inv_freq, int64_t rows, cudaStream_t stream, int64_t head_stride, double mag) {
  if (rows == 0) return;
  const int pairs = heads * head_dim / 2;
  const int threads = pairs >= 256 ? 256 : ((pairs + 31) / 32) * 32;
  rope_kernel<<<unsigned(rows), threads, 0, stream>>>(x, stride, heads, head_dim, pos, inv_freq,
                                                      head_stride > 0 ? head_stride : head_dim, mag);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
