// page_slab.cpp: page slab allocation.
#include "page_slab.h"

#include <cstring>

namespace lockstep {

PageSlab::PageSlab(int32_t num_pages, int32_t tokens_per_page, int32_t num_layers,
                   int32_t kv_width, int32_t planes)
    : num_pages_(num_pages),
      tokens_per_page_(tokens_per_page),
      kv_width_(kv_width),
      planes_(planes),
      page_floats_(static_cast<size_t>(num_layers) * planes * tokens_per_page * kv_width),
      data_(static_cast<size_t>(num_pages) * page_floats_, 0.0f) {}

void PageSlab::write_kv(int32_t p, int32_t layer, int32_t s, const float* k, const float* v) {
  float* K = kv(p, layer, 0);
  for (int32_t c = 0; c < kv_width_; ++c) K[k_index(s, c)] = k[c];
  std::memcpy(kv(p, layer, 1) + static_cast<size_t>(s) * kv_width_, v, sizeof(float) * kv_width_);
}

double page_elements(int32_t tokens_per_page, int32_t num_layers, int32_t kv_width, int32_t planes) {
  return double(planes) * num_layers * tokens_per_page * kv_width;
}

}  // namespace lockstep
