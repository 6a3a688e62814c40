// attn_chunk.cuh: paged attention for context chunks (prefill): many query
// tokens per sequence over a prefix held in pages, causal inside the chunk.
#ifndef LOCKSTEP_CUDA_ATTN_CHUNK_CUH
#define LOCKSTEP_CUDA_ATTN_CHUNK_CUH

#include "attn_common.cuh"

namespace lockstep {

// True if the chunk kernel is built for this head_dim.
bool attn_chunk_supported(int32_t head_dim);

// Launches chunk attention on stream. Query rows of one kv head are packed
// (token-major, then GQA head) into tiles of 64 rows. Grid: (max row tiles,
// kv heads * num_splits, seqs); max_tokens is the largest num_tokens of the
// launch (sizes the grid). With num_splits > 1, a.o_part / a.lse_part must be set.
void attn_chunk(const AttnArgs& a, int32_t max_tokens, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_ATTN_CHUNK_CUH
