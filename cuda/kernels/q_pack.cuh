// q_pack.cuh: the queries as FlashInfer reads them. The QKV GEMM leaves q in
// float32 rows of stride q_stride (q | k | v per row); FlashInfer takes bf16
// [rows][num_heads][head_dim], contiguous. q_pack converts and packs.
#ifndef LOCKSTEP_CUDA_Q_PACK_CUH
#define LOCKSTEP_CUDA_Q_PACK_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// out[r * width + i] = bf16(q[r * q_stride + i]) for r < rows, i < width.
void q_pack(const float* q, int64_t q_stride, int64_t rows, int32_t width, __nv_bfloat16* out,
            cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_Q_PACK_CUH
