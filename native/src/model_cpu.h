// model_cpu.h: the float32 CPU reference backend (the test oracle).
//
// Forward step of the synthetic Llama decoder, bit-exact and batch-invariant:
// every token row is computed by the same code in a fixed operation order
// that depends only on the row's own inputs (its token, position and the
// contents of its sequence's pages), never on the batch around it. No BLAS, no
// FMA contraction (-ffp-contract=off). Threads (EngineParams.num_threads)
// only share out whole output elements (a GEMM's columns, an attention
// (row, head), an element-wise range), each still computed in that order, so
// the bits do not depend on the number of threads. Loops that the compiler may
// vectorise are element-wise across outputs, so vectorisation cannot change
// any sum's order. The projections run as GEMMs over the step's rows
// (gemm_cpu.h: register-blocked, vectorised, runtime-dispatched kernels) that
// compute every element in the matvec order below, so a row's result is the
// same bits whatever rows share its GEMM.
//
// Per step:
//   h = embedding[token]
//   per layer:
//     phase 1 (every row of the batch, before any attention):
//       x = RMSNorm(h) · attn_norm; q = x·Wq; k = x·Wk; v = x·Wv
//       (qkv_bias: q += bq, k += bk, v += bv, one float add per element)
//     (Gemma: the same embedding_scale and attention_scale; GELU for SiLU
//     below (mlp_gelu); a·Wo and the MLP's output RMS-normed before their
//     residual adds (post_norms); scores soft-capped before the softmax
//     and logits after the LM head; sliding layers attend to the last
//     sliding_window positions only, with their own RoPE base)
//     (Granite: h = embedding[token] · embedding_scale first; every
//     residual add below is h += y · residual_scale; the softmax scale is
//     attention_scale; the logits are times 1/logit_scale)
//       (qk_norm: every head of q and k RMS-normed over head_dim · q/k_norm)
//       RoPE(q), RoPE(k) at the row's position; k, v written to the page slot
//     phase 2 (the rows; each projection a GEMM over them):
//       a = paged attention of q over positions [0, pos] (attention_partial.h)
//       h += a·Wo
//       x = RMSNorm(h) · mlp_norm; h += (silu(x·W_gate) * (x·W_up)) · W_down
//     MoE layer (shape.num_experts > 0), instead of the dense MLP, on every
//     row's x (one pass over all rows of the layer: one dispatch and one
//     combine per layer, whatever the rows):
//       logits = x·W_router; top-k experts (largest logits, ties to the lower
//       id), weighted per router_norm (softmax/top-k/renormalise, or
//       top-k/softmax; in double, rounded once to float); each (row, expert)
//       goes to expert_owner(expert) (dispatch), which computes
//       y_e = SwiGLU_e(x) as a GEMM over every row it received for e, and
//       sends y_e back (combine); the row's rank then forms
//       m = shared(x) (or +0.0f), m += w_e · y_e for its experts in ascending
//       id (float multiply, then add), and h += m. Nothing depends on which
//       member computed y_e or on the rows around it.
//   for sampled rows (the last new token of a sampled sequence):
//     logits = (RMSNorm(h) · final_norm) · lm_head; token = argmax (lowest
//     index on ties)
// The last layer's phase 2 runs only for sampled rows: no other row's output
// is observable.
//
// MLA shapes (kv_lora_rank > 0; engine.h gives the maths) differ in phase
// 1 and in attention only: phase 1 projects q (through the q LoRA) and the
// latent [c | k_pe] (c RMS-normed), ropes k_pe and every head's rope tail
// of q, writes the latent to the page slot and absorbs q_nope into the
// latent space (q_lat = q_nope · W_kb[h], a GEMM per head over the rows);
// attention is then MQA over the latents ([q_lat | q_pe] · latent, value
// c), every row in this one form (decode, prefill chunks, Helix partials
// alike), and phase 2 maps each head's latent output through W_vb[h]
// before W_o. Layers below first_dense_layers of a MoE shape keep the
// dense MLP.
//
// Arithmetic conventions (a second backend must match them to agree):
//   matvec    y[o] = Σ_i x[i] * W[i][o], summed from i = 0 in float32: from
//             +0.0f, per i the rounded product, then the add (never fused)
//   RMSNorm   ss = Σ x[i]^2 in double; inv = float(1 / sqrt(ss / n + eps));
//             y[i] = (x[i] * inv) * w[i]
//   RoPE      rotate-half (GPT-NeoX / Hugging Face Llama): pairs (i, i + D/2)
//             of each head, angle = pos * theta^(-2i/D) computed in double,
//             cos and sin rounded to float; (x0, x1) -> (x0 c - x1 s, x1 c + x0 s)
//   SiLU      g / (1 + expf(-g))
#ifndef LOCKSTEP_NATIVE_MODEL_CPU_H
#define LOCKSTEP_NATIVE_MODEL_CPU_H

#include <cstdint>
#include <memory>
#include <vector>

#include "attention_cpu.h"
#include "backend.h"
#include "page_slab.h"
#include "quant_cpu.h"
#include "sampling.h"
#include "thread_pool.h"
#include "weights.h"

namespace lockstep {

// The router's choice for one row of logits[E]: the top-k experts (largest
// logit, ties to the lower id) into experts[K] in ascending id order, and
// their weights into weights[K] per norm (eng_router_norm), computed in
// double and rounded once. taken is scratch. K <= 512.
void moe_route_row(const float* logits, int32_t E, int32_t K, int32_t norm, int32_t* experts, float* weights,
                   std::vector<char>& taken);

// The router's full configuration (eng_model_shape's MoE fields).
struct RouteParams {
  int32_t E = 0, K = 0, norm = 0;
  const float* bias = nullptr;  // [E]: sigmoid routers' choice bias, or none
  double scaling = 1.0;         // routed_scaling_factor (0 in the shape = 1)
  int32_t groups = 0, groups_used = 0;
};

// moe_route_row with every option: sigmoid scores (choice by score + bias,
// weights from the unbiased scores), group-limited choice (the experts of
// the groups_used best groups compete, ties to the lower group id), and the
// routed scaling, multiplied in double before the one rounding. Without
// them it gives moe_route_row's bits.
void moe_route_row(const float* logits, const RouteParams& p, int32_t* experts, float* weights,
                   std::vector<char>& taken);

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const EngineParams& params);

  const char* name() const override { return "cpu"; }
  void join_ep(int32_t size, int32_t rank) override;
  const MoeStats& moe_stats() const override { return moe_stats_; }
  double step(const StepBatch& batch, int32_t* sampled, float* logits) override;
  bool can_score() const override { return true; }
  void copy_pages(eng_tier src_tier, const int32_t* src, eng_tier dst_tier, const int32_t* dst,
                  int32_t n) override;

  // --- Internals exposed to the native tests (not part of the C ABI). ---

  const eng_model_shape& shape() const { return shape_; }
  const Weights& weights() const { return *weights_; }
  PageSlab& device_pages() { return device_; }
  PageSlab& host_pages() { return host_; }

  // Runs decoder layer `layer` on every row of batch (rows in batch order,
  // hidden is [num_rows][hidden_size], updated in place): phase 1 for all
  // rows, then phase 2 for all rows (projections as GEMMs over the rows).
  // The batch must satisfy the StepBatch contract.
  void decoder_layer(int32_t layer, const StepBatch& batch, float* hidden);

 private:
  void prepare_rows(const StepBatch& batch);
  void score_rows(const StepBatch& batch, const float* hidden);
  // Granite's multipliers (eng_model_shape): the residual add, the logits.
  void add_residual(float* h, const float* y, int64_t n) const;
  void scale_logits(float* lg, int64_t n) const;
  void write_kv(int32_t layer, const StepBatch& batch, const float* hidden);
  // MLA phase 1 (see above): latents into the pages, absorbed queries
  // [rows][heads][kv_lora + rope] into q_.
  void write_latent(int32_t layer, const StepBatch& batch, const float* hidden);
  // MLA: y[m][heads * v] = per head x[m][h] (kv_lora) · W_vb[h].
  void latent_to_values(const LayerWeights& w, const float* x, int64_t m, float* y);
  // Width of a row's attention output: heads * head_dim, or an MLA
  // shape's heads * kv_lora_rank (the latent outputs).
  int64_t attn_width() const;
  // Width of a row's queries in q_: heads * head_dim, or heads *
  // (kv_lora_rank + rope) for MLA.
  int64_t query_width() const;
  void attend_mlp(int32_t layer, const StepBatch& batch, const int64_t* rows, int64_t n,
                  float* hidden, const float* attn = nullptr);
  void helix_attention(int32_t layer, const StepBatch& batch, const std::vector<int64_t>& rows);
  // Rotate-half RoPE of rope_dim_ dims of `heads` heads, head h at x + h * stride.
  void rope(float* x, int32_t heads, int64_t stride, const float* cos_sin) const;
  void attend(int32_t layer, const StepBatch& batch, const int64_t* rr, int64_t m, float* out);
  // gate[j] = act(gate[j]) * up[j] for j < n: SiLU, or GELU with
  // shape.mlp_gelu (Gemma).
  void act_mul(float* gate, const float* up, int64_t n);
  void act_mul_range(float* gate, const float* up, int64_t j0, int64_t j1) const;
  // Whether layer slides (shape.sliding_window, engine.h) and its window
  // (0: the whole context).
  int32_t window(int32_t layer) const;
  // The RoPE table of layer's rows: the sliding layers' own when the shape
  // gives them another base or the others a linear scaling.
  const float* rope_table(int32_t layer) const;
  // Gemma 2/3: y = RMSNorm(y) · gain on each of m rows of hidden_size
  // (post_norms), in place; nothing without.
  void post_norm(float* y, int64_t m, const std::vector<float>& gain) const;
  // Whether a product of this many rows reads W from its packed panels
  // (the exact kernels' decode path, packed_cpu.h).
  static bool packed_rows(int64_t rows, const QuantMatrix& Wq, const PackedMatrix& Wp);
  void linear(const float* X, int64_t rows, int64_t in, const std::vector<float>& W, const QuantMatrix& Wq,
              const PackedMatrix& Wp, int64_t out, float* Y);
  // MoE block of a layer over n rows: x [n][hidden] (normed) → out
  // [n][hidden] (to be added to the residual). Makes exactly one dispatch
  // and one combine exchange when batch.ep is set, also for n == 0.
  void moe_block(int32_t layer, const StepBatch& batch, int64_t n, const float* x, float* out);
  // SwiGLU of rows x[n][hidden] through gate/up [hidden][width], down
  // [width][hidden] into y[n][hidden] (GEMMs in passes of kRowChunk rows).
  void swiglu(const ExpertWeights& w, int64_t width, int64_t n, const float* x, float* y);

  eng_model_shape shape_;
  int32_t tokens_per_page_;
  // Checkpoint weights are shared by the engines of one process built from
  // the same tensors (in-process ranks: one float copy, not one per rank).
  // Synthetic weights are owned here (join_ep frees other members' experts).
  std::shared_ptr<Weights> own_weights_;
  std::shared_ptr<const Weights> weights_;
  PageSlab device_, host_;
  std::vector<double> inv_freq_;  // [rope_dim / 2]: theta^(-2i/D)
  std::vector<double> inv_freq_local_;  // the sliding layers' own (empty: inv_freq_)
  int32_t rope_dim_;              // head_dim, or an MLA shape's qk_rope_head_dim
  double rope_mag_;               // YaRN's or LongRoPE's cos/sin factor (1 without)
  float attn_scale_;              // the softmax scale (checkpoint.h attention_scale)
  bool mla_;

  // Rows per GEMM pass of a layer's phases: bounds the per-step scratch.
  // Rows never interact (gemm_cpu.h), so how the rows are cut into passes
  // changes no result.
  static constexpr int64_t kRowChunk = 256;
  // v's storage for at least n elements, grown on demand and kept.
  template <class T>
  static T* grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
  // Per-step scratch, grown on demand and reused (no allocation per token).
  std::vector<int32_t> row_seq_, row_pos_;  // [rows]
  std::vector<float> rope_cs_;              // [rows][rope_dim]: cos[D/2], sin[D/2]
  std::vector<float> rope_cs_local_;        // the same of inv_freq_local_
  std::vector<float> mla_q_, mla_a_, mla_h_, mla_o_;  // MLA scratch
  std::vector<float> hidden_;               // [rows][hidden]
  std::vector<float> q_;                    // [rows][heads * head_dim]
  std::vector<float> x_, attn_, tmp_, gate_, up_, logits_;
  SamplingScratch sampling_;  // sample_token's buffers
  std::vector<float> kv_scratch_;  // K and V of a position this Helix rank does not own
  // The step's threads (nullptr: one thread, the caller's) and their
  // attention scratch, one per thread.
  std::unique_ptr<ThreadPool> pool_;
  std::vector<AttnScratch> attn_scratch_;
  // An attention work item: batch rows rr[r0 .. r1) of sequence seq, kv heads [g0, g1).
  struct AttnItem {
    int64_t r0, r1;
    int32_t seq, g0, g1;
    int32_t s0 = 0, s1 = -1;  // query heads [s0, s1) of each group (s1 < 0: all)
  };
  std::vector<AttnItem> attn_items_;
  QuantRows qx_;  // a quantised product's activations (linear)
  std::vector<int32_t> run_pos_;  // positions of the pass's rows (attention)
  // Helix scratch: this step's rows needing attention in the current layer,
  // their attention outputs, the local partials and the gathered ones.
  std::vector<int64_t> helix_rows_;
  std::vector<int32_t> score_target_, score_top_;  // score_rows' rows' targets and top counts
  std::vector<float> helix_attn_;   // [rows][heads * head_dim]
  std::vector<float> helix_local_;  // partials of this rank's pages
  std::vector<std::vector<char>> helix_all_;
  int32_t ep_size_ = 1, ep_rank_ = 0;
  // MoE scratch: normed rows of the layer, their block outputs, the router's
  // choices (expert ids ascending per row, and weights), exchange buffers.
  std::vector<float> moe_x_, moe_out_, moe_logits_, moe_rows_, moe_y_;
  std::vector<int32_t> moe_experts_;  // [rows][top_k]
  std::vector<float> moe_weights_;    // [rows][top_k]
  std::vector<std::vector<char>> moe_send_, moe_recv_;
  MoeStats moe_stats_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_MODEL_CPU_H
