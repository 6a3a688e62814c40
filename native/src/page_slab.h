// page_slab.h: a fixed slab of KV pages addressed only by page index.
//
// Go decides which page holds what (DESIGN.md §4); the slab only stores. A
// page holds tokens_per_page token slots of K and V for every layer, laid out
//   page[layer][K=0][kv_head][head_dim][slot]        (float32)
//   page[layer][V=1][slot][kv_head][head_dim]
// so that one page is one contiguous block (a page copy is one memcpy), a
// token's V for one layer is kv_width = num_kv_heads*head_dim contiguous
// floats, and one kv head's K of a page is a [head_dim][slot] matrix: the
// attention's scores read it as it is stored (k_index). An MLA model's slab
// has one plane per layer instead of two: page[layer][slot][latent],
// kv_width = kv_lora_rank + qk_rope_head_dim (kv(p, layer, 0) is the latent,
// K and V at once, row-major; there is no V plane).
#ifndef LOCKSTEP_NATIVE_PAGE_SLAB_H
#define LOCKSTEP_NATIVE_PAGE_SLAB_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep {

class PageSlab {
 public:
  PageSlab() = default;
  // Allocates num_pages zeroed pages (num_pages may be 0) of `planes` (2: K
  // and V; 1: an MLA latent) planes per layer.
  PageSlab(int32_t num_pages, int32_t tokens_per_page, int32_t num_layers, int32_t kv_width, int32_t planes = 2);

  int32_t num_pages() const { return num_pages_; }
  int32_t tokens_per_page() const { return tokens_per_page_; }
  int32_t kv_width() const { return kv_width_; }
  size_t page_floats() const { return page_floats_; }

  // Whole page p (page_floats() floats). Precondition: 0 <= p < num_pages().
  float* page(int32_t p) { return data_.data() + static_cast<size_t>(p) * page_floats_; }
  const float* page(int32_t p) const {
    return data_.data() + static_cast<size_t>(p) * page_floats_;
  }
  // The K (kv = 0) or V (kv = 1) plane of `layer` in page p: V's slot s is
  // s * kv_width() floats further, K's element c of slot s at k_index(s, c)
  // (an MLA latent: row-major, as V). kv < planes.
  float* kv(int32_t p, int32_t layer, int kv) {
    return page(p) + (static_cast<size_t>(layer) * planes_ + kv) * tokens_per_page_ * kv_width_;
  }
  const float* kv(int32_t p, int32_t layer, int kv) const {
    return page(p) + (static_cast<size_t>(layer) * planes_ + kv) * tokens_per_page_ * kv_width_;
  }
  // Where a K plane (two planes) keeps element c (kv_head * head_dim + d) of
  // slot s's K.
  size_t k_index(int32_t s, int32_t c) const {
    return static_cast<size_t>(c) * static_cast<size_t>(tokens_per_page_) + static_cast<size_t>(s);
  }
  // Stores slot s's K and V (kv_width() floats each) of `layer` in page p of
  // a two-plane slab, each in its plane's layout.
  void write_kv(int32_t p, int32_t layer, int32_t s, const float* k, const float* v);

 private:
  int32_t num_pages_ = 0, tokens_per_page_ = 0, kv_width_ = 0, planes_ = 2;
  size_t page_floats_ = 0;
  std::vector<float> data_;
};

// Floats in one page of a slab with this geometry (double: for sizing checks).
double page_elements(int32_t tokens_per_page, int32_t num_layers, int32_t kv_width, int32_t planes = 2);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_PAGE_SLAB_H
