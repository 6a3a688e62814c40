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
// A mixture-of-experts layer (moe_layer(shape, l)) replaces the dense MLP:
//   router GEMM -> logits to the host -> routed there with the CPU engine's
//   rule (moe_layout.h) -> the layout to the device -> gather the rows by
//   expert -> per expert with rows: gate/up GEMM, SwiGLU, down GEMM -> the
//   shared experts over every row -> combine in ascending expert id
//   (kernels/moe.cuh), += residual. The host round trip makes a MoE step
//   synchronous per layer and keeps it out of the decode graphs. Under
//   expert parallelism (join_ep; built with NCCL) a member keeps only its
//   experts (e % members) and each MoE layer exchanges the expert ids on the
//   host (the EP group's Exchange, with its tag and round checks) and the
//   rows and answers over NCCL (grouped ncclSend/ncclRecv on the engine's
//   stream; moe_layout.h MoeEpPlan says the layout), every wait bounded.
// Multi-head latent attention (MLA: kv_lora_rank > 0, DeepSeek-V2/V3, Kimi
// K2) replaces the attention block, as the CPU engine computes it
// (model_cpu.h): q (through the q LoRA and its norm when the shape has one)
// and the latent [c | k_pe] by GEMMs; RoPE (YaRN's magnitude on cos and sin)
// on q's and the latent's rope tails; the latent RMS-normed and written into
// latent pages (page[layer][slot][kv_lora + rope], step_layout.h); the
// absorbed query q_lat = q_nope · W_kb per head (one strided-batched GEMM);
// attention over the latents (FlashInfer's MLA kernel for kv_lora 512 /
// rope 64, attention/fi_mla.h; the hand-written kernels/mla.cu otherwise);
// then · W_vb per head and W_o. MLA steps run eagerly. Under Helix each
// member's latent kernel gives one partial per (row, head) over its own
// latent pages, merged as GQA's are (below).
// Under Helix context parallelism (join_cp) a member holds the K/V of its own
// pages only (global page g on member g % size, backend.h): each row's K/V is
// written by the member owning its position, every member computes per layer
// one partial (output, natural LSE) per (row, head) over its keys of that row
// (the hand-written decode kernel, one query per row: step_layout.h's
// per-row list), the members exchange them, and attn_merge merges them in member
// order into the layer's attention output. The exchange is one in-place NCCL
// allgather on the engine's stream when every member has NCCL and a device of
// its own (the step's end then waits for the stream within
// kHelixNcclTimeoutMs); otherwise (members sharing a device, which NCCL
// refuses, or a build without NCCL) the partials go through the CP group's
// own exchange via pinned host buffers, one synchronise per layer. Helix
// steps run eagerly (no decode graph, no FlashInfer plan). The merged output
// is not bit-identical to one engine's (a different summation order over the
// keys); the tolerance is that of split-KV decode (docs/cuda.md).
// All step descriptors go to the device in one pinned host-to-device copy;
// results come back in one device-to-host copy.
//
// Row order. Inside a step the rows are ordered decode sequences first (one
// row each, in batch order), then the chunks' rows (in batch order): the
// layout FlashInfer's decode and prefill take. Every other stage is per row,
// so only the sampled rows map back to batch order (desc_.sample_seq). The
// host side of all this (row order, page/slot per row, FlashInfer's plan
// inputs, graph padding) is plain C++ in step_layout.h, checked on the CPU by
// native/tests/test_fi_descriptors.cpp.
//
// Attention paths. FlashInfer serves head dims 64 and 128 (every real model:
// SmolLM2 64, Llama 3 128, and the llama-8b/70b presets). The hand-written
// kernels (kernels/attn_*.cu) remain as the cross-check of the kernel tests
// and serve only shapes FlashInfer is not instantiated for (head dim 16/32:
// the `tiny` test preset).
//
// CUDA graphs (decode_graph.cu). A decode-only step (every sequence one
// token, FlashInfer attention, no Helix, at most kMaxGraphBatch sequences) is
// padded to a batch-size bucket and replayed from a graph captured once per
// bucket: the whole forward is one cudaGraphLaunch instead of ~13 launches
// per layer. What stays fixed for a bucket B: the descriptor layout (rows =
// num_sampled = n_decode = B, offsets from B alone), the scratch buffers
// (reserved for kMaxGraphBatch rows before the first capture) and
// FlashInfer's graph-safe plan (re-planned before every replay into fixed
// buffers). Padding rows write no KV (page -1) and attend one key of a page
// the batch already uses. Any change of a captured address (a scratch buffer
// grown by a larger eager step, FlashInfer's generation(), the page slab)
// drops every graph; they are re-captured on use. A failed capture falls back
// to the eager path for that bucket, with one logged line.
// LOCKSTEP_CUDA_GRAPHS=0 turns graphs off.
#ifndef LOCKSTEP_CUDA_MODEL_CUDA_H
#define LOCKSTEP_CUDA_MODEL_CUDA_H

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "attention/fi_mla.h"
#include "attention/flashinfer_attn.h"
#include "device_buffer.h"
#include "gemm.h"
#include "kernels/attn_common.cuh"
#include "page_pool.h"
#include "sampling.h"
#include "moe_layout.h"
#include "step_layout.h"
#ifdef ENGINE_HAVE_NCCL
#include "nccl_comm.h"
#endif

namespace lockstep {

// Device weights of one decoder layer. Fused: wqkv = [Wq | Wk | Wv] and
// wgu = [W_gate | W_up] along the output dimension.
// Counters of the decode-graph path (tests, benchmarks, the device check).
struct DecodeGraphStats {
  int64_t captures = 0;   // graphs captured and instantiated
  int64_t replays = 0;    // steps run by cudaGraphLaunch
  int64_t warmups = 0;    // padded steps run eagerly before a bucket's first capture
  int64_t drops = 0;      // times every graph was dropped (a captured address moved)
  int64_t failures = 0;   // captures that failed (that bucket then runs eagerly)
  int64_t eager = 0;      // steps not eligible for a graph (chunks, Helix, too large, graphs off)
};

// An instantiated graph, destroyed with its owner.
class GraphExec {
 public:
  GraphExec() = default;
  ~GraphExec() { reset(); }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  GraphExec(GraphExec&& o) noexcept : g_(o.g_) { o.g_ = nullptr; }
  GraphExec& operator=(GraphExec&& o) noexcept {
    std::swap(g_, o.g_);
    return *this;
  }
  void reset(cudaGraphExec_t g = nullptr) {
    if (g_) cudaGraphExecDestroy(g_);
    g_ = g;
  }
  cudaGraphExec_t get() const { return g_; }

 private:
  cudaGraphExec_t g_ = nullptr;
};

// One SwiGLU expert: bf16, input-major, gate and up fused ([hidden][2F],
// [F][hidden]).
struct CudaExpert {
  DeviceBuffer wgu, wdown;
};

struct CudaLayer {
  DeviceBuffer attn_norm, mlp_norm;  // float32 [hidden]
  DeviceBuffer wqkv, wo, wgu, wdown; // bf16, input-major (wgu/wdown: dense layers)
  // Multi-head latent attention (kv_lora_rank > 0; no wqkv), bf16
  // input-major as the CPU's LayerWeights: wqa [hidden][q_lora] with its
  // norm qa_norm (float32; q LoRA only), wqb [q_lora or hidden][heads *
  // (nope + rope)], wkva [hidden][kv_lora + rope], kva_norm [kv_lora]
  // (float32), wkb [heads][nope][kv_lora], wvb [heads][kv_lora][v]; wo is
  // [heads * v][hidden].
  DeviceBuffer wqa, qa_norm, wqb, wkva, kva_norm, wkb, wvb;
  // A mixture-of-experts layer: the router [hidden][experts] (bf16), a
  // sigmoid router's bias (host: routing runs there), the routed experts and
  // the shared ones as one SwiGLU (num_shared_experts > 0).
  bool moe = false;
  DeviceBuffer router;
  std::vector<float> router_bias;
  std::vector<CudaExpert> experts;
  CudaExpert shared;
};

// Bound on every wait of an expert-parallel NCCL exchange (the Go side's
// collective watchdog fires first and names the stuck collective).
constexpr int kEpNcclTimeoutMs = 300000;
// The same bound for a Helix step's partial exchanges.
constexpr int kHelixNcclTimeoutMs = 300000;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const EngineParams& params);
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  // Expert parallelism over NCCL: keeps this member's experts. Refused in a
  // build without NCCL. The NCCL communicator is made at the first step,
  // its unique id sent through the EP group.
  void join_ep(int32_t size, int32_t rank) override;
  // Helix: the transport is chosen at the first Helix step (open_helix).
  void join_cp(int32_t size, int32_t rank) override;
  const MoeStats& moe_stats() const override { return moe_stats_; }
  double step(const StepBatch& batch, int32_t* sampled, float* logits) override;
  void copy_pages(eng_tier src_tier, const int32_t* src, eng_tier dst_tier, const int32_t* dst,
                  int32_t n) override;

  // --- Internals for the CUDA tests and benchmarks (not part of the C ABI). ---
  cudaStream_t stream() const { return stream_; }
  PagePool& pages() { return *pages_; }
  // Decode graphs: whether they are on (and why not), turning them on or off
  // (off drops every graph; on is refused, staying off, where they cannot run:
  // no FlashInfer attention for this shape, or a sync-check build).
  bool decode_graphs_on() const { return graphs_on_; }
  const std::string& decode_graphs_note() const { return graphs_note_; }
  void set_decode_graphs(bool on);
  const DecodeGraphStats& decode_graph_stats() const { return graph_stats_; }
  // Host time of the last step from its entry until its last launch (or
  // graph launch) was queued, in microseconds: what the CPU spends per step
  // besides waiting for the device.
  double last_host_us() const { return last_host_us_; }
  // The batch-size buckets (ascending; the last is the largest graph batch).
  static constexpr std::array<int32_t, 15> kGraphBuckets = {1,  2,   4,   8,   16,  24,  32, 48,
                                                            64, 96, 128, 160, 192, 224, 256};
  static constexpr int32_t kMaxGraphBatch = 256;

 private:
  // Runs body with the device set; a failure marks the backend broken (a
  // sticky device error: every later call is refused with the first message).
  template <class Body>
  void guarded(const char* what, Body&& body);
  void generate_weights(uint64_t seed);
  template <class Gen>
  void generate_moe(uint64_t seed, int layer, Gen&& gen);
  void load_weights(const eng_tensor* tensors, int32_t n);
  void upload_inv_freq();
  std::vector<float> rope_freqs_;  // a checkpoint's per-dimension RoPE divisors (may be empty)
  void upload_descriptors(const StepBatch& batch);
  void reserve_scratch(int64_t rows, int32_t num_sampled);
  void forward(const StepBatch& batch, bool want_logits);
  void attention(int32_t layer);
  // Helix attention of every row of the step (cp_ set): this member's
  // partials, the allgather, the merge into attn_.
  void helix_attention(int32_t layer);
  // The members' partials of a layer (this member's block of helix_parts_
  // written; outputs of `width` per (row, head)) exchanged and merged into
  // out. GQA and MLA (width kv_lora) alike.
  void exchange_and_merge(int32_t layer, int32_t width, __nv_bfloat16* out);
  // The MoE block of layer `layer` over the step's rows (xb_ holds their
  // normed inputs); adds its output to hidden_.
  void moe_mlp(int32_t layer);
  // The same under expert parallelism (ep_ set): the router and combine over
  // this member's rows (none in an empty step), the experts over the rows
  // the members sent it.
  void moe_mlp_ep(int32_t layer);
  void run_experts(const CudaLayer& L, const __nv_bfloat16* xe, const std::vector<int32_t>& offsets);

  // --- Decode graphs (decode_graph.cu). ---
  // One bucket's graph, and whether it has run once eagerly (warm-up: lazy
  // module loading and cuBLAS heuristics happen outside a capture) or failed
  // to capture (then it stays eager until the graphs are dropped).
  struct GraphSlot {
    GraphExec exec;
    bool warmed = false, failed = false;
  };
  // Every device address a captured graph holds, besides the weights (which
  // never move after construction).
  using GraphKey = std::array<const void*, 11>;
  void init_decode_graphs();
  bool graph_eligible(const StepBatch& batch) const;
  void graph_step(const StepBatch& batch, int32_t* sampled, float* logits, float* ms);
  void upload_graph_descriptors(const StepBatch& batch, int32_t bucket_rows);
  GraphKey graph_key() const;
  void drop_decode_graphs();
  bool capture_decode_graph(GraphSlot& slot, const StepBatch& batch, std::string* why);
  bool graphs_on_ = false;
  std::string graphs_note_;
  std::vector<GraphSlot> graph_slots_;  // one per kGraphBuckets entry
  GraphKey graph_key_{};
  uint64_t graph_fi_generation_ = 0;
  DecodeGraphStats graph_stats_;
  double last_host_us_ = 0.0;

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
  std::unique_ptr<FlashInferAttention> fi_;  // null for head dims FlashInfer is not built for, and for MLA
  // MLA (mla_): FlashInfer's MLA kernel when it is built for the shape (else
  // null: kernels/mla.cu), YaRN's magnitude of cos and sin, the softmax
  // scale (checkpoint.h attention_scale), and the layer's scratch.
  bool mla_ = false;
  std::unique_ptr<FlashInferMla> fi_mla_;
  double rope_mag_ = 1.0;
  float attn_scale_ = 0.0f;
  DeviceBuffer mla_cq_, mla_cqb_, mla_q_, mla_qb_, mla_kv_, mla_qa_, mla_qab_, mla_o_, mla_v_;
  void mla_attention_block(int32_t layer);
  void generate_mla(uint64_t seed, int layer);

  DeviceBuffer embedding_, final_norm_, lm_head_, inv_freq_;
  std::vector<CudaLayer> layers_;

  // Per-step descriptors: built on the host in pinned memory (step_layout.h
  // says the layout), copied at once.
  PinnedBuffer host_desc_, host_out_;
  DeviceBuffer dev_desc_;
  StepDesc desc_;
  SamplingScratch sampling_;         // host sampling of rows with temperature > 0

  // Per-step scratch (grown on demand).
  DeviceBuffer hidden_, xb_, qkv_, attn_, gu_, act_, logits_, sampled_, o_part_, lse_part_, q_bf16_;
  // MoE scratch (reserved for rows * top_k slots): router logits, the layout
  // block, the gathered rows, the experts' answers, their gate/up and
  // activations, the shared experts' output.
  DeviceBuffer moe_logits_, moe_desc_, moe_x_, moe_y_, moe_gu_, moe_act_, moe_m_;
  PinnedBuffer moe_host_logits_, moe_host_desc_;
  MoeLayout moe_layout_;
  // Expert parallelism: the group (this step's member handle), the plan and
  // scratch of a layer (rows sent and received, bf16; answers in record
  // order and as received back, float32), the counters.
  int32_t ep_size_ = 1, ep_rank_ = 0;
  Exchange* ep_ = nullptr;
  MoeEpPlan moe_plan_;
  DeviceBuffer moe_send_, moe_recv_, moe_yrec_, moe_ycomb_;
  CudaEvent ev_ep_[4];
  MoeStats moe_stats_;
  // Helix: the group (this step's member handle) and its share, the
  // members' partials of a layer ([size][rows * heads * (width + 1)] floats,
  // width head_dim or MLA's kv_lora: per member its outputs, then its LSEs),
  // and the transport,
  // chosen at the first Helix step (open_helix): NCCL, or the CP group's own
  // exchange through pinned host buffers.
  HelixShare cp_share_;
  Exchange* cp_ = nullptr;
  DeviceBuffer helix_parts_;
  bool helix_open_ = false, helix_nccl_ = false;
  PinnedBuffer helix_host_, helix_host_all_;
  std::vector<std::vector<char>> helix_all_;
  void open_helix();
#ifdef ENGINE_HAVE_NCCL
  std::unique_ptr<NcclComm> ep_comm_, cp_comm_;
  void open_ep_comm();
#endif
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_MODEL_CUDA_H
