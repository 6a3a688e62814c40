// swiglu.cuh: the MLP's gated activation, out = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)) (the CPU backend's formula).
#ifndef LOCKSTEP_CUDA_SWIGLU_CUH
#define LOCKSTEP_CUDA_SWIGLU_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// gu is [rows][2F] float32 (gate in [0, F), up in [F, 2F): the fused
// gate/up GEMM's output); out is [rows][F] bf16 (the down GEMM's input).
void swiglu(const float* gu, int64_t rows, int32_t F, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_SWIGLU_CUH
