// mla.cuh: the kernels of multi-head latent attention (MLA, kv_lora_rank >
// 0) that cuBLAS and FlashInfer do not cover: the latent's norm, RoPE and
// page write, the per-head column copies of the absorbed query, and a
// hand-written attention over the latent pages for shapes FlashInfer's MLA
// kernel is not built for (it is built for kv_lora 512 / rope 64 only).
//
// The arithmetic follows the CPU engine's MLA (model_cpu.cpp write_latent,
// attention over latents): RMSNorm of the latent in the CPU's convention
// (rmsnorm.cuh), rotate-half RoPE with YaRN's magnitude on cos and sin, then
// per (row, head) a softmax over the scores [q_lat | q_pe] · [c | k_pe] of
// the keys up to the row's position, and the output Σ p c (the latent; W_vb
// follows as a GEMM). Pages: step_layout.h's latent_offset.
#ifndef LOCKSTEP_CUDA_MLA_CUH
#define LOCKSTEP_CUDA_MLA_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "step_layout.h"

namespace lockstep {

// The latent slab of one layer as the MLA kernels see it.
struct LatentPages {
  __nv_bfloat16* slab = nullptr;
  int64_t page_elems = 0;
  int32_t tokens_per_page = 0;
  int32_t kv_lora = 0, rope = 0;  // a slot holds kv_lora + rope values
  int32_t layer = 0;
};

// Per row r: RMS-normalises kv[r * stride + 0 .. kv_lora) with gains norm_w,
// rotates the tail kv[.. kv_lora .. kv_lora + rope) by position pos[r]
// (inv_freq [rope / 2], double; cos and sin times mag), in place, and writes
// the row as bf16 into slot row_slot[r] of page row_page[r] (nothing where
// the page is negative).
void mla_latent_append(const LatentPages& lp, float* kv, int64_t stride, const float* norm_w, float eps,
                       const int32_t* pos, const double* inv_freq, double mag, const int32_t* row_page,
                       const int32_t* row_slot, int64_t rows, cudaStream_t stream);

// dst[r * dst_stride + h * dst_head + i] = src[r * src_stride + h * src_head + i]
// for r < rows, h < heads, i < width (float32).
void copy_heads(const float* src, int64_t src_stride, int64_t src_head, float* dst, int64_t dst_stride,
                int64_t dst_head, int32_t heads, int32_t width, int64_t rows, cudaStream_t stream);

// Attention over the latent pages for every (row, head): row r's keys are
// those of seqs[r] (one-token entries: step_layout.h's per-row list), its
// query q[r][head][kv_lora + rope] (float32, absorbed), its output
// out[r][head][kv_lora] (bf16). kv_lora <= 1024. With o_part set instead of
// out (Helix), the normalised partial goes to o_part[r][head][kv_lora] and
// its natural log-sum-exp to lse_part[r][head] (no key: 0 and -inf), as
// attn_merge takes them.
void mla_attention(const LatentPages& lp, const float* q, int32_t heads, const int32_t* block_tables,
                   const AttnSeq* seqs, int64_t rows, float scale, __nv_bfloat16* out, cudaStream_t stream,
                   float* o_part = nullptr, float* lse_part = nullptr);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_MLA_CUH
