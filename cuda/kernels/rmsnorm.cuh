// rmsnorm.cuh: y = RMSNorm(x) * w, the CPU backend's convention
// (model_cpu.h): ss = Σ x^2 in double, inv = float(1 / sqrt(ss / n + eps)),
// y = (x * inv) * w rounded in float32 (no fused multiply-add).
#ifndef LOCKSTEP_CUDA_RMSNORM_CUH
#define LOCKSTEP_CUDA_RMSNORM_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// Output row r reads input row in_rows[r] (or r when in_rows is null), so the
// final norm can gather the sampled rows. x and w are float32; y is bf16 (the
// input of a GEMM) or float32 when y_f32 is set instead.
void rmsnorm(const float* x, const int32_t* in_rows, const float* w, int32_t n, float eps,
             int64_t rows, __nv_bfloat16* y_bf16, float* y_f32, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_RMSNORM_CUH
