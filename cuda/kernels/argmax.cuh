// argmax.cuh: greedy sampling, argmax of each row with the lowest index on
// ties; NaN never wins (as in the CPU backend).
#ifndef LOCKSTEP_CUDA_ARGMAX_CUH
#define LOCKSTEP_CUDA_ARGMAX_CUH

#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// out[r] = argmax of x[r * n .. r * n + n). A row with no comparable value
// (all NaN) yields 0.
void argmax_rows(const float* x, int64_t rows, int32_t n, int32_t* out, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_ARGMAX_CUH
