// flashinfer_attn.h: the CUDA engine's production attention, through
// FlashInfer (header-only; Apache-2.0): paged decode with split-KV and paged
// prefill (FlashAttention-2 form) for context chunks over a cached prefix,
// bf16 Q/K/V/O, head dims 64 and 128.
//
// Page pool. FlashInfer's paged_kv_t addresses a key as
//   k_data + page * stride_page + head * stride_h + slot * stride_n + d
// (its HND layout with custom strides), and V the same way from v_data with
// the same strides. Our slab (page_pool.h) is
//   page[layer][K|V][kv_head][slot][head_dim]
// so for layer l: k_data = slab + 2l * Hkv*P*D, v_data = k_data + Hkv*P*D,
// stride_page = the whole page (all layers), stride_h = P*D, stride_n = D.
// One layout serves every layer, and a page still moves between tiers as
// one contiguous copy.
//
// Use. Once per step, plan() takes the step's attention sequences (host
// side: FlashInfer's work split is planned on the CPU, and its indices are
// copied to the device on the stream); then run() once per layer. The query
// rows must be ordered decode sequences first (one row each), then every
// chunk's rows in order; the output has the same rows.
//
// LSE. run() can write the log-sum-exp of each (row, head) for the Helix
// merge of partials. FlashInfer's LSE is base 2 (log2 Σ 2^(s·scale·log2e));
// run() converts it to the natural-log form that attn_merge and the CPU
// engine's partials use (lse_e = lse_2 · ln 2).
//
// CUDA graphs. With graph_safe set, the decode plan is made with
// FlashInfer's enable_cuda_graph (padded batch size fixed for a given batch
// size), and every buffer run() touches has a fixed address, so a run()
// captured in a graph stays valid when plan() is called again before each
// replay with the same number of decode sequences and no chunks.
#ifndef LOCKSTEP_CUDA_FLASHINFER_ATTN_H
#define LOCKSTEP_CUDA_FLASHINFER_ATTN_H

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "step_layout.h"

namespace lockstep {

// FiSeq (one attention sequence, host side) is defined in step_layout.h with
// the rest of the step's host-side descriptors.

class FlashInferAttention {
 public:
  // Whether a (head_dim, GQA group) pair is instantiated: head_dim 64 or 128,
  // group 1, 2, 3, 4, 6, 8 or 16.
  static bool supported(int32_t head_dim, int32_t group);

  // page_elems: bf16 elements per page of the slab (all layers). Workspaces
  // are allocated here (float: 256 MiB for split-KV partials; int: 8 MiB for
  // each plan kind).
  FlashInferAttention(int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim, int32_t page_size,
                      int64_t page_elems, cudaStream_t stream);
  ~FlashInferAttention();
  FlashInferAttention(const FlashInferAttention&) = delete;
  FlashInferAttention& operator=(const FlashInferAttention&) = delete;

  // Plans the step's attention: n_decode single-row sequences (query rows
  // [0, n_decode)) then n_chunk chunks (the following rows, in order).
  // graph_safe: see the header comment (only for decode-only batches).
  // Host pointers are read during the call only.
  void plan(const FiSeq* decode, int32_t n_decode, const FiSeq* chunks, int32_t n_chunk, bool graph_safe);

  // Attention of the planned batch for `layer` of the slab: q and out are
  // bf16 [rows][num_qo_heads][head_dim] (contiguous); lse, if not null, is
  // float [rows][num_qo_heads] (natural log).
  void run(const __nv_bfloat16* slab, int32_t layer, const __nv_bfloat16* q, __nv_bfloat16* out,
           float* lse);

  // Changes whenever a buffer that run() reads moved (grew): a CUDA graph
  // captured before then must be dropped.
  uint64_t generation() const;

  struct Impl;  // defined in flashinfer_attn.cu (FlashInfer types)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_FLASHINFER_ATTN_H
