// moe.cuh: the device steps of a mixture-of-experts layer around its
// per-expert GEMMs (moe_cuda.cu; the host-side layout: moe_layout.h).
#ifndef LOCKSTEP_CUDA_MOE_CUH
#define LOCKSTEP_CUDA_MOE_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// out[s] = x[src_row[s]] for the n permuted slots (rows of H bf16).
void moe_gather(const __nv_bfloat16* x, int64_t H, const int32_t* src_row, int64_t n, __nv_bfloat16* out,
                cudaStream_t stream);

// out[s] = y[src_row[s]] for n rows of H float32 (expert parallelism: the
// experts' answers back into the order their records arrived in).
void moe_gather_f32(const float* y, int64_t H, const int32_t* src_row, int64_t n, float* out, cudaStream_t stream);

// The CPU engine's combine, per row r and element c: acc = m[r][c] (the
// shared experts' output; +0 when m is null), then for k = 0 .. K-1 (the
// row's experts in ascending id) acc += weight[r][k] * y[slot_of[r][k]][c]
// (float multiply, then add), then hidden[r][c] += acc.
void moe_combine(const float* y, int64_t H, const int32_t* slot_of, const float* weight, int32_t K, int64_t rows,
                 const float* m, float* hidden, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_MOE_CUH
