// attn_decode.cuh: paged decode attention (one query token per sequence),
// split-KV for long contexts, GQA heads of one kv head computed together so
// that each K/V byte is read once per kv head.
#ifndef LOCKSTEP_CUDA_ATTN_DECODE_CUH
#define LOCKSTEP_CUDA_ATTN_DECODE_CUH

#include "attn_common.cuh"

namespace lockstep {

// Largest GQA group (num_heads / num_kv_heads) the decode kernel supports.
constexpr int kDecodeMaxGroup = 16;

// True if the decode kernel is built for this head_dim and group.
bool attn_decode_supported(int32_t head_dim, int32_t group);

// Launches decode attention on stream for a.num_seqs sequences, each with
// num_tokens == 1 (the query row is q_row). Grid: (num_splits, kv heads, seqs).
// With num_splits > 1, a.o_part / a.lse_part must be set (merge afterwards).
void attn_decode(const AttnArgs& a, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_ATTN_DECODE_CUH
