// residual.cuh: residual add h += x (float32). The model fuses its two
// residual adds into the output GEMMs (beta = 1); this kernel serves paths
// that cannot (e.g. a Helix-merged attention output added after the merge).
#ifndef LOCKSTEP_CUDA_RESIDUAL_CUH
#define LOCKSTEP_CUDA_RESIDUAL_CUH

#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

void residual_add(float* h, const float* x, int64_t n, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_RESIDUAL_CUH
