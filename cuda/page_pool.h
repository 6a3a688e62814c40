// page_pool.h: the CUDA backend's KV page slab (device) and host tier
// (pinned), both addressed only by page index (DESIGN.md §4).
//
// A page holds tokens_per_page slots of K and V for every layer in bf16,
// laid out page[layer][K|V][kv_head][slot][head_dim] (kernels/attn_common.cuh).
// Page copies between tiers are asynchronous on the engine's stream: every
// later step is queued behind them, so no synchronisation is needed for
// correctness, and the host tier is touched only by those copies.
#ifndef LOCKSTEP_CUDA_PAGE_POOL_H
#define LOCKSTEP_CUDA_PAGE_POOL_H

#include <cuda_bf16.h>

#include <cstdint>

#include "device_buffer.h"
#include "engine.h"
#include "kernels/attn_common.cuh"

namespace lockstep {

class PagePool {
 public:
  // Allocates and zeroes num_pages device pages and num_host_pages pinned
  // host pages (either may be 0). planes: 2 (K and V per kv head), or 1 for
  // MLA's latent pages (num_kv_heads 1, head_dim = kv_lora + rope:
  // step_layout.h latent_offset).
  PagePool(int32_t num_pages, int32_t num_host_pages, int32_t tokens_per_page,
           int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, cudaStream_t stream, int32_t planes = 2);

  int64_t page_elems() const { return page_elems_; }
  size_t page_bytes() const { return size_t(page_elems_) * sizeof(__nv_bfloat16); }
  // The device slab as the kernels see it, for `layer`.
  PagedKV view(int32_t layer) const;
  __nv_bfloat16* device_page(int32_t p) const { return device_.as<__nv_bfloat16>() + p * page_elems_; }
  __nv_bfloat16* host_page(int32_t p) const { return host_.as<__nv_bfloat16>() + p * page_elems_; }

  // Queues copies of page src[k] (src_tier) to page dst[k] (dst_tier), in
  // order, merging runs of consecutive indices into one copy.
  void copy(eng_tier src_tier, const int32_t* src, eng_tier dst_tier, const int32_t* dst, int32_t n);

 private:
  int32_t tokens_per_page_, num_kv_heads_, head_dim_;
  int64_t page_elems_;
  cudaStream_t stream_;
  DeviceBuffer device_;
  PinnedBuffer host_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_PAGE_POOL_H
