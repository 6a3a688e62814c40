// model_cuda.h: the CUDA backend (lockstep::make_cuda_backend).
//
// The same synthetic Llama decoder as the CPU reference (model_cpu.h), with
// the same weights (generated on the device from (shape, seed) by the CPU's
// generator, kernels/weights_gen.cuh) stored in bf16, activations in float32,
// GEMMs through cuBLAS (bf16 x bf16 -> float32), K/V in bf16 pages. It is not
// bit-exact with the CPU engine: the agreement contract is logits within a
// bf16 tolerance and the same greedy tokens on >= 99% of steps
// (cuda/tests/test_e2e.cpp). Per step, on the engine's one stream:
//   embed -> per layer: RMSNorm -> QKV GEMM -> RoPE(q, k) -> K/V into pages ->
//   attention (FlashInfer: paged decode with split-KV for 1-token sequences,
//   paged causal prefill for chunks; attention/flashinfer_attn.h) -> Wo GEMM
//   (+= residual) ->
//   RMSNorm -> gate/up GEMM -> SwiGLU -> down GEMM (+= residual)
//   -> final RMSNorm of the sampled rows -> LM head GEMM -> argmax.
// All step descriptors go to the device in one pinned host-to-device copy;
// results come back in one device-to-host copy.
//
// Row order. Inside a step the rows are ordered decode sequences first (one
// row each, in batch order), then the chunks' rows (in batch order): the
// layout FlashInfer's decode and prefill take. Every other stage is per row,
// so only the sampled rows map back to batch order (sample_seq_).
//
// Attention paths. FlashInfer serves head dims 64 and 128 (every real model:
// SmolLM2 64, Llama 3 128, and the llama-8b/70b presets). The hand-written
// kernels (kernels/attn_*.cu) remain as the cross-check of the kernel tests
// and serve only shapes FlashInfer is not instantiated for (head dim 16/32:
// the `tiny` test preset).
//
// TODO(cuda-graph): decode-only steps have a fixed launch sequence for a given
// (batch size, max context bucket); capturing it once per bucket and
// replaying saves the ~10 us/launch host overhead that dominates small
// batches. Not done yet: the scratch buffers must first become fixed-size per
// bucket so that captured pointers stay valid.
#ifndef LOCKSTEP_CUDA_MODEL_CUDA_H
#define LOCKSTEP_CUDA_MODEL_CUDA_H

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "attention/flashinfer_attn.h"
#include "device_buffer.h"
#include "gemm.h"
#include "kernels/attn_common.cuh"
#include "page_pool.h"
#include "sampling.h"

namespace lockstep {

// Device weights of one decoder layer. Fused: wqkv = [Wq | Wk | Wv] and
// wgu = [W_gate | W_up] along the output dimension.
struct CudaLayer {
  DeviceBuffer attn_norm, mlp_norm;  // float32 [hidden]
  DeviceBuffer wqkv, wo, wgu, wdown; // bf16, input-major
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const EngineParams& params);
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  double step(const StepBatch& batch, int32_t* sampled, float* logits) override;
  void copy_pages(eng_tier src_tier, const int32_t* src, eng_tier dst_tier, const int32_t* dst,
                  int32_t n) override;

  // --- Internals for the CUDA tests and benchmarks (not part of the C ABI). ---
  cudaStream_t stream() const { return stream_; }
  PagePool& pages() { return *pages_; }

 private:
  // Runs body with the device set; a failure marks the backend broken (a
  // sticky device error: every later call is refused with the first message).
  template <class Body>
  void guarded(const char* what, Body&& body);
  void generate_weights(uint64_t seed);
  void load_weights(const eng_tensor* tensors, int32_t n);
  void upload_inv_freq();
  std::vector<float> rope_freqs_;  // a checkpoint's per-dimension RoPE divisors (may be empty)
  void upload_descriptors(const StepBatch& batch);
  void forward(const StepBatch& batch, bool want_logits);
  void attention(int32_t layer);

  eng_model_shape shape_;
  int32_t device_, tokens_per_page_, num_sms_ = 0;
  std::string broken_;  // first sticky error; empty while healthy
  // RAII handles, declared before everything that uses them: a constructor
  // that throws part-way frees what it made (buffers, cuBLAS handle, pages
  // first, then events and stream).
  CudaStream stream_holder_;
  CudaEvent ev_start_, ev_stop_;
  cudaStream_t stream_ = nullptr;  // stream_holder_.get()
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<PagePool> pages_;
  std::unique_ptr<FlashInferAttention> fi_;  // null for head dims FlashInfer is not built for
  std::vector<FiSeq> fi_decode_, fi_chunks_;

  DeviceBuffer embedding_, final_norm_, lm_head_, inv_freq_;
  std::vector<CudaLayer> layers_;

  // Per-step descriptors: built on the host in pinned memory, copied at once.
  // Layout (int32): tokens, pos, page, slot [rows each], sample_rows
  // [num_sampled], decode_rows [n_decode], block tables, then the AttnSeq
  // arrays (decode, chunk).
  PinnedBuffer host_desc_, host_out_;
  DeviceBuffer dev_desc_;
  int64_t rows_ = 0;
  int32_t num_sampled_ = 0, n_decode_ = 0, n_chunk_ = 0, max_chunk_tokens_ = 0;
  int32_t max_decode_ctx_ = 0;
  size_t off_tokens_ = 0, off_pos_ = 0, off_page_ = 0, off_slot_ = 0, off_sample_ = 0,
         off_decode_rows_ = 0, off_blocks_ = 0, off_dseqs_ = 0, off_cseqs_ = 0;
  std::vector<int32_t> sample_seq_;  // batch index of each sampled row
  SamplingScratch sampling_;         // host sampling of rows with temperature > 0

  // Per-step scratch (grown on demand).
  DeviceBuffer hidden_, xb_, qkv_, attn_, gu_, act_, logits_, sampled_, o_part_, lse_part_, q_bf16_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_MODEL_CUDA_H
