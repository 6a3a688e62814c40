// q_pack.cu: see q_pack.cuh.
#include "../cuda_check.h"
#include "q_pack.cuh"

namespace lockstep {
namespace {

__global__ void q_pack_kernel(const float* q, int64_t q_stride, int32_t width, __nv_bfloat16* out) {
  const int64_t r = blockIdx.x;
  for (int i = threadIdx.x; i < width; i += blockDim.x)
    out[r * width + i] = __float2bfloat16(q[r * q_stride + i]);
}

}  // namespace

void q_pack(const float* q, int64_t q_stride, int64_t rows, int32_t width, __nv_bfloat16* out,
            cudaStream_t stream) {
  if (rows == 0) return;
  q_pack_kernel<<<unsigned(rows), 256, 0, stream>>>(q, q_stride, width, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
