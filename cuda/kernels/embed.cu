// embed.cu: see embed.cuh.
#include "../cuda_check.h"
#include "embed.cuh"

namespace lockstep {
namespace {

__global__ void embed_kernel(const __nv_bfloat16* emb, const int32_t* tokens, int32_t hidden,
                             float* out) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* e = emb + int64_t(tokens[r]) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[r * hidden + i] = __bfloat162float(e[i]);
}

}  // namespace

void embed(const __nv_bfloat16* embedding, const int32_t* tokens, int64_t rows, int32_t hidden,
           float* out, cudaStream_t stream) {
  if (rows == 0) return;
  embed_kernel<<<unsigned(rows), 256, 0, stream>>>(embedding, tokens, hidden, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
