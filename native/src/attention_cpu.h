// attention_cpu.h: paged GQA attention of one token on the CPU.
#ifndef LOCKSTEP_NATIVE_ATTENTION_CPU_H
#define LOCKSTEP_NATIVE_ATTENTION_CPU_H

#include <cstdint>
#include <vector>

#include "page_slab.h"

namespace lockstep {

// Scratch reused across calls so that attention allocates nothing per token.
struct AttnScratch {
  std::vector<float> scores;  // [tokens_per_page]
  std::vector<float> o_page;  // [head_dim]
  std::vector<float> kt;      // [dk][tokens_per_page]: one page's MLA latent, transposed (a K plane is stored so)
  std::vector<float> ml;      // [rows][heads][2]: running max and sum
};

// Attention of one query row at position pos over positions [0, pos] of a
// sequence whose pages are blocks[0 .. pos / P] (P = slab.tokens_per_page()),
// for `layer`. q is [num_heads][head_dim] with RoPE applied; query head h reads
// kv head h / (num_heads / num_kv_heads). Writes out[num_heads][head_dim].
// Accumulates page by page in page order (attention_partial.h); scale is
// 1/sqrt(head_dim) rounded once from double.
// Preconditions (validated by the caller): every block index is a page of
// slab and the K/V of positions [0, pos] have been written.
void paged_attention_row(const PageSlab& slab, int32_t layer, const int32_t* blocks,
                         int32_t pos, const float* q, int32_t num_heads, int32_t num_kv_heads,
                         int32_t head_dim, float* out, AttnScratch& scratch);

// paged_attention_row for n rows of ONE sequence (same block table) at
// positions pos[0..n): q row r at q + r * q_stride, output row r at
// out + r * out_stride. Every row gets exactly the bits paged_attention_row
// would give it (same partials, merged in the same page order); the rows
// and the query heads of a kv head share each page's K, read as the slab
// stores it (page_slab.h), which is what makes a prefill chunk's attention
// fast. Only the query heads of kv heads [g0, g1) are computed (g1 < 0:
// every kv head), and of each of those only its query heads [s0, s1) of
// the group (s1 < 0: all of them), so that threads can share a call's
// work: a (row, head) gets the same bits in any call that computes it.
// The softmax scale is 1/sqrt(head_dim), or scale when it is not 0
// (Granite's attention multiplier). window > 0: row r attends to positions
// [pos[r] - window + 1, pos[r]] only (sliding-window attention; a page's
// partial then starts at the first such slot). softcap > 0: each scaled
// score s becomes softcap · tanh(s / softcap) (Gemma 2).
void paged_attention_rows(const PageSlab& slab, int32_t layer, const int32_t* blocks, const int32_t* pos,
                          int32_t n, const float* q, size_t q_stride, int32_t num_heads, int32_t num_kv_heads,
                          int32_t head_dim, float* out, size_t out_stride, AttnScratch& scratch, int32_t g0 = 0,
                          int32_t g1 = -1, int32_t s0 = 0, int32_t s1 = -1, float scale = 0.0f, int32_t window = 0,
                          float softcap = 0.0f);

// Multi-head latent attention (MLA, absorbed form) of n rows of one
// sequence: every head's query q[r][h] is dk floats ([q_lat | q_pe]) and
// attends over the page slab's one latent plane (slot width dk = kv_width):
// score = q · latent * scale, value = the latent's first dv floats (c_kv).
// Writes out[r][h] (dv floats) for heads [h0, h1) (h1 < 0: every head).
// The same page order and partial arithmetic as paged_attention_rows, so a
// (row, head) gets the same bits in any call, chunking or Helix split.
void paged_latent_attention_rows(const PageSlab& slab, int32_t layer, const int32_t* blocks, const int32_t* pos,
                                 int32_t n, const float* q, size_t q_stride, int32_t num_heads, int32_t dk,
                                 int32_t dv, float scale, float* out, size_t out_stride, AttnScratch& scratch,
                                 int32_t h0 = 0, int32_t h1 = -1);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_ATTENTION_CPU_H
