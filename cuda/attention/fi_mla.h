// fi_mla.h: multi-head latent attention (MLA) through FlashInfer's MLA
// paged-attention kernel (FlashAttention-2 form, flashinfer/attention/
// mla.cuh; Apache-2.0), bf16, built for FlashInfer's one MLA shape: latent
// (kv_lora) 512 and rope 64, DeepSeek-V2/V3's and Kimi K2's.
//
// Pages: the latent slab (step_layout.h latent_offset, fi_mla_view): the
// kernel reads ckv[page * stride_page + slot * stride_n + d] and kpe likewise
// from the slab's layer offsets, so it reads our pages in place.
//
// Use: once per step, plan() takes the step's attention sequences (the
// decode sequences, then the chunks: the step's row order) as one request
// list (fill_fi_mla_list) and plans FlashInfer's work split on the host;
// then run() once per layer with the absorbed queries (q_lat and q_pe, bf16,
// strided per row and head) and writes the latent output o[row][head][512]
// (bf16). Causal, bottom-right aligned per request (a decode row sees all of
// its keys).
#ifndef LOCKSTEP_CUDA_FI_MLA_H
#define LOCKSTEP_CUDA_FI_MLA_H

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "step_layout.h"

namespace lockstep {

class FlashInferMla {
 public:
  static constexpr int32_t kLatent = 512, kRope = 64;
  static bool supported(int32_t kv_lora, int32_t rope) { return kv_lora == kLatent && rope == kRope; }

  FlashInferMla(int32_t num_heads, int32_t page_size, int64_t page_elems, cudaStream_t stream);
  ~FlashInferMla();
  FlashInferMla(const FlashInferMla&) = delete;
  FlashInferMla& operator=(const FlashInferMla&) = delete;

  void plan(const FiSeq* decode, int32_t n_decode, const FiSeq* chunks, int32_t n_chunk);
  // q_nope / q_pe: row r, head h at q + r * q_stride_n + h * q_stride_h
  // (both the same strides); out: [rows][heads][512].
  void run(const __nv_bfloat16* slab, int32_t layer, const __nv_bfloat16* q_nope, const __nv_bfloat16* q_pe,
           int64_t q_stride_n, int64_t q_stride_h, float sm_scale, __nv_bfloat16* out);

  struct Impl;  // fi_mla.cu (FlashInfer types)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_FI_MLA_H
