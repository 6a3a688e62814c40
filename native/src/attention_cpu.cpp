// attention_cpu.cpp: paged GQA attention of one token (see attention_cpu.h).
#include "attention_cpu.h"

#include <algorithm>
#include <cmath>

#include "attention_partial.h"

namespace lockstep {

void paged_attention_row(const PageSlab& slab, int32_t layer, const int32_t* blocks,
                         int32_t pos, const float* q, int32_t num_heads, int32_t num_kv_heads,
                         int32_t head_dim, float* out, AttnScratch& scratch) {
  const int32_t P = slab.tokens_per_page();
  const size_t stride = static_cast<size_t>(slab.kv_width());
  const int32_t group = num_heads / num_kv_heads;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  const int32_t last_page = pos / P;
  if (scratch.scores.size() < static_cast<size_t>(P)) scratch.scores.resize(P);
  if (scratch.o_page.size() < static_cast<size_t>(head_dim)) scratch.o_page.resize(head_dim);
  float* scores = scratch.scores.data();
  float* o_page = scratch.o_page.data();

  for (int32_t h = 0; h < num_heads; ++h) {
    const float* qh = q + static_cast<size_t>(h) * head_dim;
    const size_t head_off = static_cast<size_t>(h / group) * head_dim;
    float* O = out + static_cast<size_t>(h) * head_dim;
    float M = -INFINITY, L = 0.0f;
    for (int32_t b = 0; b <= last_page; ++b) {
      // Valid slots: the whole page before the last one, up to pos in the last.
      const int32_t n = b < last_page ? P : pos % P + 1;
      const int32_t page = blocks[b];
      float m, l;
      attn_page_partial(qh, scale, slab.kv(page, layer, 0) + slab.k_index(0, static_cast<int32_t>(head_off)), 1,
                        static_cast<size_t>(P), slab.kv(page, layer, 1) + head_off, stride, n, head_dim, head_dim,
                        scores, &m, &l, o_page);
      attn_merge(&M, &L, O, m, l, o_page, head_dim);
    }
    attn_finish(O, L, O, head_dim);
  }
}

namespace {

// The body of both row functions below: kv groups [g0, g1) of `group` query
// heads each, of which heads [sub0, sub1) are computed; group g's K is dk
// floats at offset g * dk of plane 0, its V dv floats at the same offset of
// plane v_plane (an MLA latent: plane 0, its first dv floats). Always
// inlined, so that each public function's ISA clones get their own copy.
__attribute__((always_inline)) inline void attention_rows(const PageSlab& slab, int32_t layer, const int32_t* blocks,
                                                          const int32_t* pos, int32_t n, const float* q, size_t q_stride,
                                                          int32_t num_heads, int32_t group, int32_t dk, int32_t dv,
                                                          int v_plane, float scale, float* out, size_t out_stride,
                                                          AttnScratch& scratch, int32_t g0, int32_t g1, int32_t sub0,
                                                          int32_t sub1, int32_t window, float softcap) {
  const int32_t P = slab.tokens_per_page();
  const size_t stride = static_cast<size_t>(slab.kv_width());
  int32_t max_last = 0;
  for (int32_t r = 0; r < n; ++r) max_last = std::max(max_last, pos[r] / P);
  if (scratch.scores.size() < static_cast<size_t>(P)) scratch.scores.resize(P);
  if (scratch.o_page.size() < static_cast<size_t>(dv)) scratch.o_page.resize(dv);
  if (scratch.kt.size() < static_cast<size_t>(dk) * P) scratch.kt.resize(static_cast<size_t>(dk) * P);
  const size_t states = static_cast<size_t>(n) * num_heads;
  if (scratch.ml.size() < 2 * states) scratch.ml.resize(2 * states);
  float* ml = scratch.ml.data();
  for (size_t i = 0; i < states; ++i) {
    ml[2 * i] = -INFINITY;
    ml[2 * i + 1] = 0.0f;
  }
  float* kt = scratch.kt.data();
  for (int32_t g = g0; g < g1; ++g) {
    const size_t head_off = static_cast<size_t>(g) * dk;
    for (int32_t b = 0; b <= max_last; ++b) {
      // Slots of this page that any row reads.
      int32_t slots = 0;
      for (int32_t r = 0; r < n; ++r) {
        const int32_t last = pos[r] / P;
        if (b < last) slots = P;
        else if (b == last) slots = std::max(slots, pos[r] % P + 1);
      }
      if (slots == 0) continue;
      const int32_t page = blocks[b];
      const float* V = slab.kv(page, layer, v_plane) + head_off;
      // A K plane beside a V plane is stored transposed ([dk][slot], read as
      // it is); a latent plane is row-major, transposed here.
      const float* kp = kt;
      if (v_plane == 1) {
        kp = slab.kv(page, layer, 0) + slab.k_index(0, static_cast<int32_t>(head_off));
      } else {
        const float* K = slab.kv(page, layer, 0) + head_off;
        for (int32_t j = 0; j < slots; ++j)
          for (int32_t d = 0; d < dk; ++d) kt[static_cast<size_t>(d) * P + j] = K[static_cast<size_t>(j) * stride + d];
      }
      for (int32_t h = g * group + sub0; h < g * group + sub1; ++h) {
        for (int32_t r = 0; r < n; ++r) {
          const int32_t last = pos[r] / P;
          if (b > last) continue;
          // A sliding window's first visible slot of this page (none:
          // the row's window starts past it).
          const int32_t first = window > 0 ? pos[r] - window + 1 - b * P : 0;
          if (first >= P) continue;
          const int32_t lo = first > 0 ? first : 0;
          const int32_t cnt = (b < last ? P : pos[r] % P + 1) - lo;
          float m, l;
          attn_page_partial_kt(q + r * q_stride + static_cast<size_t>(h) * dk, scale, kp + lo, P,
                               V + static_cast<size_t>(lo) * stride, stride, cnt, dk, dv, scratch.scores.data(), &m, &l,
                               scratch.o_page.data(), softcap);
          float* st = ml + 2 * (static_cast<size_t>(r) * num_heads + h);
          attn_merge(&st[0], &st[1], out + r * out_stride + static_cast<size_t>(h) * dv, m, l,
                     scratch.o_page.data(), dv);
        }
      }
    }
  }
  for (int32_t r = 0; r < n; ++r)
    for (int32_t g = g0; g < g1; ++g)
      for (int32_t h = g * group + sub0; h < g * group + sub1; ++h) {
        float* O = out + r * out_stride + static_cast<size_t>(h) * dv;
        attn_finish(O, ml[2 * (static_cast<size_t>(r) * num_heads + h) + 1], O, dv);
      }
}

}  // namespace

// Cloned per ISA (resolved at load time): the element-wise loops of the
// inlined partials vectorise 16 wide on AVX-512. The arithmetic is the same
// mul then add per element (-ffp-contract=off), so every clone gives the
// same bits.
__attribute__((target_clones("avx512f", "avx2", "default")))
void paged_attention_rows(const PageSlab& slab, int32_t layer, const int32_t* blocks, const int32_t* pos,
                          int32_t n, const float* q, size_t q_stride, int32_t num_heads, int32_t num_kv_heads,
                          int32_t head_dim, float* out, size_t out_stride, AttnScratch& scratch, int32_t g0,
                          int32_t g1, int32_t s0, int32_t s1, float scale, int32_t window, float softcap) {
  if (g1 < 0) g1 = num_kv_heads;
  const int32_t group = num_heads / num_kv_heads;
  if (s1 < 0) s1 = group;
  if (scale == 0.0f) scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  attention_rows(slab, layer, blocks, pos, n, q, q_stride, num_heads, group, head_dim, head_dim, 1, scale, out,
                 out_stride, scratch, g0, g1, s0, s1, window, softcap);
}

// The latent form (attention_cpu.h): one group of every head over plane 0.
__attribute__((target_clones("avx512f", "avx2", "default")))
void paged_latent_attention_rows(const PageSlab& slab, int32_t layer, const int32_t* blocks, const int32_t* pos,
                                 int32_t n, const float* q, size_t q_stride, int32_t num_heads, int32_t dk,
                                 int32_t dv, float scale, float* out, size_t out_stride, AttnScratch& scratch,
                                 int32_t h0, int32_t h1) {
  if (h1 < 0) h1 = num_heads;
  attention_rows(slab, layer, blocks, pos, n, q, q_stride, num_heads, num_heads, dk, dv, 0, scale, out, out_stride,
                 scratch, 0, 1, h0, h1, 0, 0.0f);
}

}  // namespace lockstep
