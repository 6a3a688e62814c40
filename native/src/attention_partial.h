// attention_partial.h: per-page attention partials and their merge.
//
// Attention of one query head over a sequence's context is accumulated page by
// page in page order:
//   1. for each page, a partial (m, l, o) over the page's valid slots in slot
//      order: m = max_j s_j, l = Σ_j exp(s_j - m), o = Σ_j exp(s_j - m) v_j,
//      with s_j = (q · k_j) * scale;
//   2. partials are merged into a running state in page order with the
//      log-sum-exp merge (attn_merge); the result is O / L.
// This order is part of the engine's contract: it makes a token's attention
// independent of batch composition and chunking, and Helix context
// parallelism computes the partials of its own pages on each rank and merges
// them in the same global page order, bit-identically. Keep every backend's
// arithmetic here: same operations, same order, float32, no FMA contraction.
#ifndef LOCKSTEP_NATIVE_ATTENTION_PARTIAL_H
#define LOCKSTEP_NATIVE_ATTENTION_PARTIAL_H

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace lockstep {

// scores[j] = scores[j] * scale, then softcap · tanh(s / softcap) when
// softcap > 0 (Gemma 2's soft-capping), for j < n; returns their maximum.
__attribute__((always_inline)) inline float attn_scale_scores(float* scores, int32_t n, float scale, float softcap) {
  float mx = -INFINITY;
  if (softcap == 0.0f) {
    for (int32_t j = 0; j < n; ++j) {
      const float s = scores[j] * scale;
      scores[j] = s;
      if (s > mx) mx = s;
    }
    return mx;
  }
  for (int32_t j = 0; j < n; ++j) {
    const float s = softcap * std::tanh(scores[j] * scale / softcap);
    scores[j] = s;
    if (s > mx) mx = s;
  }
  return mx;
}

// Partial of one query head over n >= 1 slots of one page.
//   q       [head_dim]
//   k       K of slot 0 for this head's kv head: slot j's element d is
//           k[j * k_slot + d * k_dim] (row-major K: k_slot = the slot stride,
//           k_dim = 1; a page's K stored transposed: k_slot = 1, k_dim = slots)
//   v       V of slot 0; slot j is j * v_stride further
//   scores  scratch of n floats
// Writes *m, *l and o[0..head_dim). q·k is summed in increasing d (from 0.0f),
// the softmax terms in increasing slot.
// dk: the width of q and of each K; dv: of each V and of o (an MLA latent's
// V is the first dv elements of its K: v may equal k with dv < dk).
// softcap > 0 caps each scaled score (attn_scale_scores).
inline void attn_page_partial(const float* q, float scale, const float* k, size_t k_slot, size_t k_dim,
                              const float* v, size_t v_stride, int32_t n, int32_t dk, int32_t dv, float* scores,
                              float* m, float* l, float* o, float softcap = 0.0f) {
  // scores[j] = Σ_d q[d] * k_j[d], each summed in increasing d. The d-outer,
  // slot-inner order keeps that per-slot order while giving the CPU n
  // independent accumulation chains instead of one long dependent one.
  for (int32_t j = 0; j < n; ++j) scores[j] = 0.0f;
  for (int32_t d = 0; d < dk; ++d) {
    const float qd = q[d];
    const float* kd = k + static_cast<size_t>(d) * k_dim;
    for (int32_t j = 0; j < n; ++j) scores[j] += qd * kd[static_cast<size_t>(j) * k_slot];
  }
  const float mx = attn_scale_scores(scores, n, scale, softcap);
  for (int32_t d = 0; d < dv; ++d) o[d] = 0.0f;
  float sum = 0.0f;
  for (int32_t j = 0; j < n; ++j) {
    const float p = std::exp(scores[j] - mx);
    sum += p;
    const float* vj = v + static_cast<size_t>(j) * v_stride;
    // Element-wise over d: each o[d] still sums in slot order, so the compiler
    // may vectorise this loop without changing a bit.
    for (int32_t d = 0; d < dv; ++d) o[d] += p * vj[d];
  }
  *m = mx;
  *l = sum;
}

// attn_page_partial with row-major K and V of one slot stride.
inline void attn_page_partial(const float* q, float scale, const float* k, const float* v, size_t stride, int32_t n,
                              int32_t dk, int32_t dv, float* scores, float* m, float* l, float* o) {
  attn_page_partial(q, scale, k, stride, 1, v, stride, n, dk, dv, scores, m, l, o);
}

// attn_page_partial with K and V of one width.
inline void attn_page_partial(const float* q, float scale, const float* k, const float* v,
                              size_t stride, int32_t n, int32_t head_dim, float* scores,
                              float* m, float* l, float* o) {
  attn_page_partial(q, scale, k, v, stride, n, head_dim, head_dim, scores, m, l, o);
}

// attn_page_partial with the page's K transposed: kt[d * ldk + j] is slot
// j's K element d. The same operations in the same order per element (so the
// same bits), blocked so that the accumulators live in registers: 16 slots'
// scores at a time over d, then 16 output elements at a time over the slots.
// dk, dv as for attn_page_partial.
__attribute__((always_inline)) inline void attn_page_partial_kt(const float* __restrict q, float scale, const float* __restrict kt, size_t ldk,
                                 const float* __restrict v, size_t stride, int32_t n, int32_t dk, int32_t dv,
                                 float* __restrict scores, float* m, float* l, float* __restrict o,
                                 float softcap = 0.0f) {
  constexpr int32_t kB = 16;
  int32_t j0 = 0;
  for (; j0 + kB <= n; j0 += kB) {
    float acc[kB] = {};
    for (int32_t d = 0; d < dk; ++d) {
      const float qd = q[d];
      const float* kd = kt + static_cast<size_t>(d) * ldk + j0;
      for (int32_t jj = 0; jj < kB; ++jj) acc[jj] += qd * kd[jj];
    }
    for (int32_t jj = 0; jj < kB; ++jj) scores[j0 + jj] = acc[jj];
  }
  for (int32_t j = j0; j < n; ++j) {
    float acc = 0.0f;
    for (int32_t d = 0; d < dk; ++d) acc += q[d] * kt[static_cast<size_t>(d) * ldk + j];
    scores[j] = acc;
  }
  const float mx = attn_scale_scores(scores, n, scale, softcap);
  float sum = 0.0f;
  for (int32_t j = 0; j < n; ++j) {
    const float p = std::exp(scores[j] - mx);
    scores[j] = p;
    sum += p;
  }
  int32_t d0 = 0;
  for (; d0 + kB <= dv; d0 += kB) {
    float acc[kB] = {};
    for (int32_t j = 0; j < n; ++j) {
      const float p = scores[j];
      const float* vj = v + static_cast<size_t>(j) * stride + d0;
      for (int32_t dd = 0; dd < kB; ++dd) acc[dd] += p * vj[dd];
    }
    for (int32_t dd = 0; dd < kB; ++dd) o[d0 + dd] = acc[dd];
  }
  for (int32_t d = d0; d < dv; ++d) {
    float acc = 0.0f;
    for (int32_t j = 0; j < n; ++j) acc += scores[j] * v[static_cast<size_t>(j) * stride + d];
    o[d] = acc;
  }
  *m = mx;
  *l = sum;
}

// Merges the partial (m, l, o) into the running state (M, L, O). A state with
// L == 0 is empty (no page merged yet); merging into it copies the partial
// exactly, so a single-page context costs no rounding. A partial with l == 0
// (no slots) is ignored.
inline void attn_merge(float* M, float* L, float* O, float m, float l, const float* o,
                       int32_t head_dim) {
  if (l == 0.0f) return;
  if (*L == 0.0f) {
    *M = m;
    *L = l;
    for (int32_t d = 0; d < head_dim; ++d) O[d] = o[d];
    return;
  }
  const float mn = *M > m ? *M : m;
  const float a = std::exp(*M - mn);
  const float b = std::exp(m - mn);
  *L = *L * a + l * b;
  for (int32_t d = 0; d < head_dim; ++d) O[d] = O[d] * a + o[d] * b;
  *M = mn;
}

// Normalises a merged state: out = O / L (out may alias O).
inline void attn_finish(const float* O, float L, float* out, int32_t head_dim) {
  for (int32_t d = 0; d < head_dim; ++d) out[d] = O[d] / L;
}

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_ATTENTION_PARTIAL_H
