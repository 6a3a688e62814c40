// weights.h: the synthetic model's weights, a deterministic function of
// (shape, seed).
//
// Nothing is downloaded: every element is derived from (seed, tensor id,
// element index) by a counter-based generator (splitmix64), so any backend can
// regenerate the same weights (on the host or in a kernel) without a stream
// state, and the CPU reference and the CUDA backend agree bit for bit on their
// inputs.
//
// Layout. Every projection is stored input-major, W[i * out + o], and applied
// as y = x · W (y[o] = Σ_i x[i] * W[i][o], summed in increasing i). The
// element index fed to the generator is the index in this layout.
//   embedding  [vocab][hidden]           scale 1
//   attn_norm, mlp_norm, final_norm  [hidden]   1 + u/8
//   q_norm, k_norm [head_dim] (qk_norm)  1 + u/8, keyed by qk_norm_tensor_id
//   bq [heads*head_dim], bk, bv [kv_heads*head_dim] (qkv_bias)
//                                        u/2, keyed by mla_tensor_id
//   attn_post_norm, mlp_post_norm [hidden] (post_norms)
//                                        1 + u/8, keyed by mla_tensor_id
//   wq [hidden][heads*head_dim], wk/wv [hidden][kv_heads*head_dim],
//   wo [heads*head_dim][hidden], w_gate/w_up [hidden][intermediate],
//   w_down [intermediate][hidden], lm_head [hidden][vocab]
//                                        scale 1/sqrt(fan_in), fan_in = rows
// with u uniform in [-1, 1) on a 2^-23 grid (exact in float32).
#ifndef LOCKSTEP_NATIVE_WEIGHTS_H
#define LOCKSTEP_NATIVE_WEIGHTS_H

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine.h"
#include "packed_cpu.h"
#include "quant_cpu.h"

namespace lockstep {

// Which tensor of the model; part of the generator's key.
enum class TensorKind : uint32_t {
  kEmbedding = 0,
  kFinalNorm = 1,
  kLMHead = 2,
  kAttnNorm = 3,
  kWq = 4,
  kWk = 5,
  kWv = 6,
  kWo = 7,
  kMLPNorm = 8,
  kWGate = 9,
  kWUp = 10,
  kWDown = 11,
  // MoE layers (tensor_id's 16 slots per layer hold them too).
  kRouter = 12,      // [hidden][num_experts]
  kSharedGate = 13,  // [hidden][shared * moe_intermediate]
  kSharedUp = 14,
  kSharedDown = 15,  // [shared * moe_intermediate][hidden]
  // Routed experts: keyed by expert_tensor_id, not tensor_id.
  kExpertGate = 16,  // [hidden][moe_intermediate]
  kExpertUp = 17,
  kExpertDown = 18,  // [moe_intermediate][hidden]
  // MLA layers (kv_lora_rank > 0): keyed by mla_tensor_id.
  kQA = 19,          // [hidden][q_lora]
  kQANorm = 20,      // [q_lora]
  kKVA = 21,         // [hidden][kv_lora + rope]
  kKVANorm = 22,     // [kv_lora]
  kKB = 23,          // [heads][nope][kv_lora]
  kVB = 24,          // [heads][kv_lora][v]
  kRouterBias = 25,  // [num_experts]
  // qkv_bias shapes: keyed by mla_tensor_id too (a separate bit range).
  kBq = 26,          // [heads*head_dim]
  kBk = 27,          // [kv_heads*head_dim]
  kBv = 28,          // [kv_heads*head_dim]
  // post_norms shapes: keyed by mla_tensor_id too.
  kAttnPostNorm = 29,  // [hidden]
  kMLPPostNorm = 30,   // [hidden]
};

// splitmix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Stable id of a tensor: global tensors (layer < 0) are their kind, layer
// tensors are (layer + 1) * 16 + kind.
inline uint64_t tensor_id(TensorKind kind, int layer) {
  const uint64_t k = static_cast<uint64_t>(kind);
  return layer < 0 ? k : (static_cast<uint64_t>(layer) + 1) * 16 + k;
}

// Stable id of routed expert `expert`'s tensor (kExpertGate/Up/Down) of a
// layer: outside tensor_id's range (bit 40 set).
inline uint64_t expert_tensor_id(TensorKind kind, int layer, int expert) {
  return (uint64_t{1} << 40) | (static_cast<uint64_t>(layer) << 24) | (static_cast<uint64_t>(expert) << 4) |
         (static_cast<uint64_t>(kind) - 16);
}

// Stable id of a layer's q (which 0) or k (which 1) norm gain of a qk_norm
// shape: outside both ranges above (bit 41 set).
inline uint64_t qk_norm_tensor_id(int layer, int which) {
  return (uint64_t{1} << 41) | (static_cast<uint64_t>(layer) << 4) | static_cast<uint64_t>(which);
}

// Stable id of an MLA tensor (kQA .. kRouterBias) or a qkv bias (kBq ..
// kBv) of a layer: bit 42 set.
inline uint64_t mla_tensor_id(TensorKind kind, int layer) {
  return (uint64_t{1} << 42) | (static_cast<uint64_t>(layer) << 8) | static_cast<uint64_t>(kind);
}

// Uniform in [-1, 1) with 24 bits of resolution, a pure function of the key.
inline float uniform_pm1(uint64_t seed, uint64_t tensor, uint64_t index) {
  const uint64_t h = splitmix64(splitmix64(seed ^ splitmix64(tensor)) + index);
  return static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 2^-23
}

// Fills out[0..n) with tensor (kind, layer) whose fan-in is fan_in.
void generate_tensor(float* out, size_t n, uint64_t seed, TensorKind kind, int layer,
                     int64_t fan_in);

// One SwiGLU expert: gate/up [hidden][width], down [width][hidden].
struct ExpertWeights {
  std::vector<float> gate, up, down;
  // A checkpoint's Q8_0, Q4_0 or Q4_1 expert also in packed panels, which
  // steps of few rows read instead (packed_cpu.h; the same bits).
  PackedMatrix pgate, pup, pdown;
};

// One decoder layer's weights (layout above). A MoE layer (shape.num_experts
// > 0) has no w_gate/w_up/w_down but a router [hidden][num_experts], an
// optional shared expert and the routed experts this engine owns
// (experts[e] is empty for an expert another EP member owns).
struct LayerWeights {
  std::vector<float> attn_norm, wq, wk, wv, wo;
  std::vector<float> q_norm, k_norm;  // [head_dim] each, qk_norm shapes only
  std::vector<float> bq, bk, bv;      // the projections' biases, qkv_bias shapes only
  std::vector<float> attn_post_norm, mlp_post_norm;  // [hidden] each, post_norms shapes only
  std::vector<float> mlp_norm, w_gate, w_up, w_down;
  std::vector<float> router;
  std::vector<float> router_bias;  // [num_experts]; empty = no bias
  // MLA (kv_lora_rank > 0; wk, wv empty): wq is q_b [q_lora or hidden]
  // [heads*(nope+rope)] with each head's rope tail in rotate-half order,
  // wq_a [hidden][q_lora] and q_a_norm [q_lora] with a q LoRA, wkv_a
  // [hidden][kv_lora+rope] (its rope tail likewise), kv_a_norm [kv_lora],
  // w_kb [heads][nope][kv_lora] and w_vb [heads][kv_lora][v] (the
  // absorbed forms of kv_b), wo [heads*v][hidden].
  std::vector<float> wq_a, q_a_norm, wkv_a, kv_a_norm, w_kb, w_vb;
  ExpertWeights shared;
  std::vector<ExpertWeights> experts;
  // cpu_kernels = quant: the dense projections a checkpoint gives as Q8_0,
  // Q4_0 or Q4_1, kept quantised (quant_cpu.h); their float copy above is
  // then left empty. Empty matrices: the float path.
  QuantMatrix qwq, qwk, qwv, qwo, qw_gate, qw_up, qw_down;
  // cpu_kernels = exact: the same projections also in packed panels
  // (packed_cpu.h), which decode steps read instead of the float copy, with
  // the same bits. Empty matrices: the float copy only.
  PackedMatrix pwq, pwk, pwv, pwo, pw_gate, pw_up, pw_down;
};

// Generates routed expert `expert` of `layer` (synthetic weights).
ExpertWeights generate_expert(const eng_model_shape& shape, uint64_t seed, int layer, int expert);

// All weights of the model, float32 on the host. With tied embeddings
// (checkpoint.h) the embedding lives only in lm_head and `embedding` is empty.
struct Weights {
  std::vector<float> embedding, final_norm, lm_head;
  QuantMatrix q_lm_head;   // cpu_kernels = quant (see LayerWeights)
  PackedMatrix p_lm_head;  // cpu_kernels = exact (see LayerWeights)
  std::vector<LayerWeights> layers;
  bool tied = false;
  // Checkpoint only, optional: per-dimension RoPE divisors [head_dim / 2].
  std::vector<float> rope_freqs;

  // out[0..hidden) = the embedding of token (a row of `embedding`, or column
  // `token` of the [hidden][vocab] lm_head when tied).
  void embed(int32_t token, int64_t hidden, int64_t vocab, float* out) const {
    if (!tied) {
      const float* row = embedding.data() + static_cast<int64_t>(token) * hidden;
      for (int64_t i = 0; i < hidden; ++i) out[i] = row[i];
      return;
    }
    const float* col = lm_head.data() + token;
    for (int64_t i = 0; i < hidden; ++i) out[i] = col[i * vocab];
  }
};

// Generates every weight of shape (validated) from seed.
Weights generate_weights(const eng_model_shape& shape, uint64_t seed);

// Number of float elements generate_weights would allocate (for sizing checks
// without allocating). Computed in double: shapes may be huge.
double weight_elements(const eng_model_shape& shape);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_WEIGHTS_H
