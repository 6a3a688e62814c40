// page_pool.cu: see page_pool.h.
#include "page_pool.h"

#include <cstring>

namespace lockstep {

PagePool::PagePool(int32_t num_pages, int32_t num_host_pages, int32_t tokens_per_page,
                   int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, cudaStream_t stream,
                   int32_t planes)
    : tokens_per_page_(tokens_per_page),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      page_elems_(int64_t(num_layers) * planes * num_kv_heads * tokens_per_page * head_dim),
      stream_(stream) {
  if (num_pages > 0) {
    device_.reserve(size_t(num_pages) * page_bytes());
    // Zeroed like the CPU slab, so a page never written reads as zeros.
    CUDA_CHECK(cudaMemsetAsync(device_.as<void>(), 0, device_.bytes(), stream_));
  }
  if (num_host_pages > 0) {
    host_.reserve(size_t(num_host_pages) * page_bytes());
    std::memset(host_.as<void>(), 0, host_.bytes());
  }
}

PagedKV PagePool::view(int32_t layer) const {
  PagedKV kv;
  kv.slab = device_.as<__nv_bfloat16>();
  kv.page_elems = page_elems_;
  kv.tokens_per_page = tokens_per_page_;
  kv.num_kv_heads = num_kv_heads_;
  kv.head_dim = head_dim_;
  kv.layer = layer;
  return kv;
}

void PagePool::copy(eng_tier src_tier, const int32_t* src, eng_tier dst_tier, const int32_t* dst,
                    int32_t n) {
  auto base = [&](eng_tier t, int32_t p) {
    return t == ENG_TIER_HOST ? host_page(p) : device_page(p);
  };
  for (int32_t k = 0; k < n;) {
    int32_t run = 1;  // pages src[k..k+run) -> dst[k..k+run) are both consecutive
    while (k + run < n && src[k + run] == src[k] + run && dst[k + run] == dst[k] + run) ++run;
    // Overlapping same-tier ranges would make one copy differ from n page
    // copies in order; fall back to single pages then.
    if (src_tier == dst_tier && run > 1 && src[k] < dst[k] + run && dst[k] < src[k] + run) run = 1;
    if (!(src_tier == dst_tier && src[k] == dst[k]))
      CUDA_CHECK(cudaMemcpyAsync(base(dst_tier, dst[k]), base(src_tier, src[k]),
                                 size_t(run) * page_bytes(), cudaMemcpyDefault, stream_));
    k += run;
  }
}

}  // namespace lockstep
