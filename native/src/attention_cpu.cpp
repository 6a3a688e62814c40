// attention_cpu.cpp: paged GQA attention of one token (see attention_cpu.h).
#include "attention_cpu.h"

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
      attn_page_partial(qh, scale, slab.kv(page, layer, 0) + head_off,
                        slab.kv(page, layer, 1) + head_off, stride, n, head_dim, scores, &m,
                        &l, o_page);
      attn_merge(&M, &L, O, m, l, o_page, head_dim);
    }
    attn_finish(O, L, O, head_dim);
  }
}

}  // namespace lockstep
