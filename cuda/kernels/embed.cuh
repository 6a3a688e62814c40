// embed.cuh: token embedding lookup, hidden[r] = float(embedding[token[r]]).
#ifndef LOCKSTEP_CUDA_EMBED_CUH
#define LOCKSTEP_CUDA_EMBED_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// tokens are validated by engine.cpp to lie in [0, vocab).
void embed(const __nv_bfloat16* embedding, const int32_t* tokens, int64_t rows, int32_t hidden,
           float* out, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_EMBED_CUH
