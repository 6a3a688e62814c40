// presets.cpp: the named shapes (mirror of bridge/presets.go) and validation.
#include "presets.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "status.h"
#include <cmath>

namespace lockstep {
namespace {

struct NamedShape {
  const char* name;
  eng_model_shape shape;
};

// Sorted by name so that preset_names() lists them in the order Go's
// bridge.PresetNames() does.
// Fields: layers, hidden, heads, kv_heads, head_dim, intermediate, vocab,
// rope_theta, rms_eps, rope scaling (4), tied, experts, top-k,
// moe_intermediate, shared experts, router_norm, qk_norm, then the MLA,
// dense-layer, routing and YaRN fields (0 here; kBuiltPresets sets them),
// qkv_bias, the Granite scales.
const NamedShape kPresets[] = {
    // llama-70b: Llama 3 70B shape (GQA 8:1).
    {"llama-70b", {80, 8192, 64, 8, 128, 28672, 128256, 500000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f}},
    // llama-8b: Llama 3 8B shape (GQA 4:1).
    {"llama-8b", {32, 4096, 32, 8, 128, 14336, 128256, 500000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f}},
    // mixtral-8x7b: Mixtral-8x7B-v0.1 config.json: 8 experts, top-2 (top-k
    // then softmax), experts of width 14336, no shared expert.
    {"mixtral-8x7b", {32, 4096, 32, 8, 128, 14336, 32000, 1000000.0f, 1e-5f, 0, 0, 0, 0, 0, 8, 2, 14336, 0,
                      ENG_ROUTER_TOPK_SOFTMAX, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f}},
    // moe-tiny: fast on the CPU engine: 16 experts, top-2, one shared expert.
    {"moe-tiny", {3, 64, 4, 2, 16, 128, 512, 10000.0f, 1e-5f, 0, 0, 0, 0, 0, 16, 2, 32, 1, ENG_ROUTER_SOFTMAX_TOPK, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f}},
    // qwen3-30b-a3b: Qwen3-30B-A3B config.json: 128 experts, top-8 (softmax,
    // top-k, renormalised), experts of width 768, no shared expert; head_dim
    // 128 with hidden 2048 (heads * head_dim = 4096); per-head q/k RMSNorm.
    {"qwen3-30b-a3b", {48, 2048, 32, 4, 128, 6144, 151936, 1000000.0f, 1e-6f, 0, 0, 0, 0, 0, 128, 8, 768, 0,
                       ENG_ROUTER_SOFTMAX_TOPK, 1, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f}},
    // tiny: fast on the CPU engine; GQA 2:1.
    {"tiny", {2, 64, 4, 2, 16, 128, 512, 10000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f}},
};

// The MLA presets: DeepSeek-shaped (latent attention, a leading dense
// layer, shared and routed experts, a sigmoid router with a bias).
eng_model_shape deepseek_shape(int32_t layers, int32_t hidden, int32_t heads, int32_t q_lora, int32_t kv_lora,
                               int32_t nope, int32_t rope, int32_t v, int32_t inter, int32_t vocab, float theta,
                               int32_t experts, int32_t top_k, int32_t moe_inter, int32_t shared, int32_t dense,
                               float scaling, int32_t groups, int32_t groups_used) {
  eng_model_shape s{};
  s.num_layers = layers;
  s.hidden_size = hidden;
  s.num_heads = s.num_kv_heads = heads;
  s.head_dim = nope + rope;
  s.intermediate_size = inter;
  s.vocab_size = vocab;
  s.rope_theta = theta;
  s.rms_eps = 1e-6f;
  s.num_experts = experts;
  s.num_experts_per_tok = top_k;
  s.moe_intermediate_size = moe_inter;
  s.num_shared_experts = shared;
  s.router_norm = ENG_ROUTER_SIGMOID_TOPK;
  s.q_lora_rank = q_lora;
  s.kv_lora_rank = kv_lora;
  s.qk_nope_head_dim = nope;
  s.qk_rope_head_dim = rope;
  s.v_head_dim = v;
  s.first_dense_layers = dense;
  s.routed_scaling_factor = scaling;
  s.expert_groups = groups;
  s.expert_groups_used = groups_used;
  return s;
}

eng_model_shape with_yarn(eng_model_shape s, float factor, int32_t original, float beta_fast, float beta_slow) {
  s.yarn_factor = factor;
  s.yarn_original_max_positions = original;
  s.yarn_beta_fast = beta_fast;
  s.yarn_beta_slow = beta_slow;
  s.yarn_mscale = 1.0f;
  s.yarn_mscale_all_dim = 1.0f;
  return s;
}

// gemma-tiny: every field of Gemma's decoders at once (engine.h): GELU
// MLP, post norms, q/k norms, heads wider than hidden / heads, the
// embedding times sqrt(hidden), soft caps that bite on its synthetic
// weights, a window of 8 on layers 0 and 1 with their own RoPE base beside
// a linearly scaled global layer 2.
eng_model_shape gemma_tiny() {
  eng_model_shape s{};
  s.num_layers = 3;
  s.hidden_size = 64;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 32;
  s.intermediate_size = 128;
  s.vocab_size = 512;
  s.rope_theta = 1000000.0f;
  s.rms_eps = 1e-6f;
  s.qk_norm = 1;
  s.embedding_scale = 8.0f;
  s.mlp_gelu = 1;
  s.post_norms = 1;
  s.attn_softcap = 2.0f;
  s.final_softcap = 3.0f;
  s.sliding_window = 8;
  s.sliding_window_pattern = 3;
  s.rope_local_theta = 10000.0f;
  s.rope_linear_factor = 4.0f;
  return s;
}

// Presets built by a function (the MLA and Gemma shapes); sorted by name,
// merged with kPresets in preset_names().
const NamedShape kBuiltPresets[] = {
    // deepseek-tiny: fast on the CPU engine: MLA (q and kv LoRA), one
    // leading dense layer, 16 experts in 4 groups (2 used), top-4, one
    // shared expert, sigmoid router with routed scaling.
    {"deepseek-tiny", deepseek_shape(3, 64, 4, 32, 32, 16, 8, 16, 128, 512, 10000.0f, 16, 4, 32, 1, 1, 2.5f, 4, 2)},
    // deepseek-v3: DeepSeek-V3 config.json (huggingface.co/deepseek-ai/DeepSeek-V3).
    {"deepseek-v3", with_yarn(deepseek_shape(61, 7168, 128, 1536, 512, 128, 64, 128, 18432, 129280, 10000.0f, 256, 8,
                                             2048, 1, 3, 2.5f, 8, 4),
                              40.0f, 4096, 32.0f, 1.0f)},
    // kimi-k2: Kimi-K2-Instruct config.json (huggingface.co/moonshotai/Kimi-K2-Instruct).
    {"kimi-k2", with_yarn(deepseek_shape(61, 7168, 64, 1536, 512, 128, 64, 128, 18432, 163840, 50000.0f, 384, 8, 2048,
                                         1, 1, 2.827f, 0, 0),
                          32.0f, 4096, 1.0f, 1.0f)},
    {"gemma-tiny", gemma_tiny()},
};

std::string format(const char* fmt, double a, double b = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b);
  return buf;
}

}  // namespace

bool find_preset(const std::string& name, eng_model_shape* out) {
  for (const auto& p : kPresets) {
    if (name == p.name) {
      *out = p.shape;
      return true;
    }
  }
  for (const auto& p : kBuiltPresets) {
    if (name == p.name) {
      *out = p.shape;
      return true;
    }
  }
  return false;
}

std::string preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.push_back(p.name);
  for (const auto& p : kBuiltPresets) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  std::string s;
  for (const auto& n : names) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

namespace {

// Gemma's fields (engine.h), after Granite's.
void validate_gemma_fields(const eng_model_shape& s, const char* p) {
  if (s.mlp_gelu != 0 && s.mlp_gelu != 1) invalid_argument(p + format("mlp_gelu must be 0 or 1, got %.0f", s.mlp_gelu));
  if (s.post_norms != 0 && s.post_norms != 1)
    invalid_argument(p + format("post_norms must be 0 or 1, got %.0f", s.post_norms));
  for (const auto& [name, v] : {std::pair<const char*, float>{"attn_softcap", s.attn_softcap},
                                {"final_softcap", s.final_softcap}, {"rope_local_theta", s.rope_local_theta}})
    if (!(v >= 0) || std::isinf(v))
      invalid_argument(p + std::string(name) + format(" must be >= 0 and finite (0 = none), got %g", v));
  if (s.sliding_window < 0)
    invalid_argument(p + format("sliding_window must be >= 0 (0 = none), got %.0f", s.sliding_window));
  if (s.sliding_window_pattern < 0 || s.sliding_window_pattern == 1)
    invalid_argument(p + format("sliding_window_pattern must be 0 (every layer slides) or >= 2 (every p-th layer is "
                                "global), got %.0f",
                                s.sliding_window_pattern));
  if (s.sliding_window == 0 && (s.sliding_window_pattern != 0 || s.rope_local_theta != 0))
    invalid_argument(std::string(p) + "sliding_window_pattern and rope_local_theta need a sliding_window");
  if (s.rope_linear_factor != 0) {
    if (!(s.rope_linear_factor > 1) || std::isinf(s.rope_linear_factor))
      invalid_argument(p + format("rope_linear_factor must be 0 (none) or > 1 and finite, got %g", s.rope_linear_factor));
    if (s.rope_scaling_factor != 0 || s.yarn_factor != 0)
      invalid_argument(std::string(p) + "rope_linear_factor with rope_scaling_factor or yarn_factor; a shape has one "
                                        "RoPE scaling");
    if (s.sliding_window > 0 && s.sliding_window_pattern == 0)
      invalid_argument(std::string(p) + "rope_linear_factor scales the layers that do not slide; with "
                                        "sliding_window_pattern 0 every layer slides");
  }
  const bool any = s.mlp_gelu || s.post_norms || s.attn_softcap != 0 || s.final_softcap != 0 || s.sliding_window ||
                   s.rope_local_theta != 0 || s.rope_linear_factor != 0;
  if (any && s.kv_lora_rank > 0)
    invalid_argument(std::string(p) + "MLA with Gemma's fields (mlp_gelu, post_norms, soft-capping, sliding window, "
                                      "local or linear RoPE) is not supported");
  if ((s.mlp_gelu || s.post_norms) && s.num_experts > 0)
    invalid_argument(std::string(p) + "mlp_gelu and post_norms are supported on dense shapes only (num_experts 0)");
  // Partial RoPE and LongRoPE's attention factor.
  if (s.partial_rotary_dim < 0 || s.partial_rotary_dim % 2 != 0 || s.partial_rotary_dim > s.head_dim)
    invalid_argument(p + format("partial_rotary_dim must be 0 (the whole head) or even and at most head_dim (%.0f), "
                                "got %.0f",
                                s.head_dim, s.partial_rotary_dim));
  if (s.partial_rotary_dim != 0 && s.kv_lora_rank > 0)
    invalid_argument(std::string(p) + "partial_rotary_dim with MLA (qk_rope_head_dim says it) is not supported");
  if (!(s.rope_attn_factor >= 0) || std::isinf(s.rope_attn_factor))
    invalid_argument(p + format("rope_attn_factor must be >= 0 and finite (0 = 1), got %g", s.rope_attn_factor));
  if (s.rope_attn_factor != 0 && s.yarn_factor != 0)
    invalid_argument(std::string(p) + "rope_attn_factor with yarn_factor; YaRN sets its own magnitude");
}

}  // namespace

void validate_shape(const eng_model_shape& s) {
  // Same order and wording as ModelShape.Validate in bridge/presets.go.
  const char* p = "model shape: ";
  if (s.num_layers <= 0)
    invalid_argument(p + format("num_layers must be positive, got %.0f", s.num_layers));
  if (s.num_heads <= 0)
    invalid_argument(p + format("num_heads must be positive, got %.0f", s.num_heads));
  if (s.num_kv_heads <= 0 || s.num_heads % s.num_kv_heads != 0)
    invalid_argument(p + format("num_kv_heads must be positive and divide num_heads (%.0f), got %.0f",
                                s.num_heads, s.num_kv_heads));
  if (s.head_dim <= 0 || s.head_dim % 2 != 0)
    invalid_argument(p + format("head_dim must be positive and even, got %.0f", s.head_dim));
  // heads * head_dim may differ from hidden_size (Qwen3); it must fit in
  // int32 (64-bit product: hostile input may overflow).
  if (s.hidden_size <= 0)
    invalid_argument(p + format("hidden_size must be positive, got %.0f", s.hidden_size));
  if (static_cast<long long>(s.num_heads) * s.head_dim > 0x7fffffffLL)
    invalid_argument(p + format("num_heads*head_dim (%.0f) exceeds the int32 range",
                                static_cast<double>(static_cast<long long>(s.num_heads) * s.head_dim)));
  if (s.intermediate_size <= 0)
    invalid_argument(p + format("intermediate_size must be positive, got %.0f", s.intermediate_size));
  if (s.vocab_size <= 1)
    invalid_argument(p + format("vocab_size must be at least 2, got %.0f", s.vocab_size));
  if (!(s.rope_theta > 0))
    invalid_argument(p + format("rope_theta must be positive, got %g", s.rope_theta));
  if (!(s.rms_eps > 0))
    invalid_argument(p + format("rms_eps must be positive, got %g", s.rms_eps));
  if (s.rope_scaling_factor != 0) {
    if (!(s.rope_scaling_factor > 1))
      invalid_argument(p + format("rope_scaling_factor must be 0 (none) or > 1, got %g", s.rope_scaling_factor));
    if (!(s.rope_low_freq_factor >= 1))
      invalid_argument(p + format("rope_low_freq_factor must be >= 1, got %g", s.rope_low_freq_factor));
    if (!(s.rope_high_freq_factor > s.rope_low_freq_factor))
      invalid_argument(p + format("rope_high_freq_factor must exceed rope_low_freq_factor (%g), got %g",
                                  s.rope_low_freq_factor, s.rope_high_freq_factor));
    if (s.rope_original_max_positions <= 0)
      invalid_argument(p + format("rope_original_max_positions must be positive, got %.0f",
                                  s.rope_original_max_positions));
  }
  if (s.tied_embeddings != 0 && s.tied_embeddings != 1)
    invalid_argument(p + format("tied_embeddings must be 0 or 1, got %.0f", s.tied_embeddings));
  if (s.num_experts < 0)
    invalid_argument(p + format("num_experts must be >= 0 (0 = dense), got %.0f", s.num_experts));
  if (s.num_experts == 0) {
    if (s.num_experts_per_tok != 0 || s.moe_intermediate_size != 0 || s.num_shared_experts != 0 ||
        s.router_norm != 0)
      invalid_argument(std::string(p) + "num_experts_per_tok, moe_intermediate_size, num_shared_experts and router_norm "
                           "must be 0 for a dense model (num_experts 0)");
  } else {
    if (s.num_experts_per_tok < 1 || s.num_experts_per_tok > s.num_experts)
      invalid_argument(p + format("num_experts_per_tok must be in [1, num_experts (%.0f)], got %.0f", s.num_experts,
                                  s.num_experts_per_tok));
    if (s.moe_intermediate_size <= 0)
      invalid_argument(p + format("moe_intermediate_size must be positive, got %.0f", s.moe_intermediate_size));
    if (s.num_shared_experts < 0)
      invalid_argument(p + format("num_shared_experts must be >= 0, got %.0f", s.num_shared_experts));
    if (s.router_norm < ENG_ROUTER_SOFTMAX_TOPK || s.router_norm > ENG_ROUTER_SIGMOID_TOPK_RAW)
      invalid_argument(p + format("router_norm must be 0 (softmax, top-k, renormalise), 1 (top-k, softmax), 2 "
                                  "(softmax, top-k), 3 (sigmoid, top-k, renormalise) or 4 (sigmoid, top-k), got %.0f",
                                  s.router_norm));
    if (s.first_dense_layers < 0 || s.first_dense_layers >= s.num_layers)
      invalid_argument(p + format("first_dense_layers must be in [0, num_layers (%.0f)), got %.0f", s.num_layers,
                                  s.first_dense_layers));
    if (!(s.routed_scaling_factor >= 0) || std::isinf(s.routed_scaling_factor))
      invalid_argument(p + format("routed_scaling_factor must be >= 0 and finite (0 = 1), got %g",
                                  s.routed_scaling_factor));
    if (s.expert_groups != 0 || s.expert_groups_used != 0) {
      if (s.expert_groups < 1 || s.num_experts % s.expert_groups != 0)
        invalid_argument(p + format("expert_groups must divide num_experts (%.0f), got %.0f", s.num_experts,
                                    s.expert_groups));
      if (s.expert_groups_used < 1 || s.expert_groups_used > s.expert_groups)
        invalid_argument(p + format("expert_groups_used must be in [1, expert_groups (%.0f)], got %.0f",
                                    s.expert_groups, s.expert_groups_used));
      if (static_cast<long long>(s.expert_groups_used) * (s.num_experts / s.expert_groups) < s.num_experts_per_tok)
        invalid_argument(p + format("expert_groups_used (%.0f) groups hold fewer experts than num_experts_per_tok "
                                    "(%.0f)",
                                    s.expert_groups_used, s.num_experts_per_tok));
      if (s.router_norm >= ENG_ROUTER_SIGMOID_TOPK && s.num_experts / s.expert_groups < 2)
        invalid_argument(std::string(p) + "expert_groups with a sigmoid router need at least 2 experts per group "
                                          "(a group scores by its two best)");
    }
  }
  if (s.num_experts == 0 && (s.first_dense_layers != 0 || s.routed_scaling_factor != 0 || s.expert_groups != 0 ||
                             s.expert_groups_used != 0))
    invalid_argument(std::string(p) + "first_dense_layers, routed_scaling_factor, expert_groups and "
                                      "expert_groups_used must be 0 for a dense model (num_experts 0)");
  if (s.qk_norm != 0 && s.qk_norm != 1)
    invalid_argument(p + format("qk_norm must be 0 or 1, got %.0f", s.qk_norm));
  if (s.qkv_bias != 0 && s.qkv_bias != 1)
    invalid_argument(p + format("qkv_bias must be 0 or 1, got %.0f", s.qkv_bias));
  for (const auto& [name, v] : {std::pair<const char*, float>{"embedding_scale", s.embedding_scale},
                                {"residual_scale", s.residual_scale}, {"attention_scale", s.attention_scale},
                                {"logit_scale", s.logit_scale}})
    if (!(v >= 0) || std::isinf(v))
      invalid_argument(p + std::string(name) + format(" must be >= 0 and finite (0 = none), got %g", v));
  if (s.kv_lora_rank > 0 && (s.embedding_scale != 0 || s.residual_scale != 0 || s.attention_scale != 0 || s.logit_scale != 0))
    invalid_argument(std::string(p) + "MLA with Granite's multipliers (embedding, residual, attention, logit scales) is not supported");
  validate_gemma_fields(s, p);
  if (s.kv_lora_rank < 0)
    invalid_argument(p + format("kv_lora_rank must be >= 0 (0 = no MLA), got %.0f", s.kv_lora_rank));
  if (s.kv_lora_rank == 0) {
    if (s.q_lora_rank != 0 || s.qk_nope_head_dim != 0 || s.qk_rope_head_dim != 0 || s.v_head_dim != 0)
      invalid_argument(std::string(p) + "q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim must be 0 "
                                        "without MLA (kv_lora_rank 0)");
  } else {
    if (s.q_lora_rank < 0)
      invalid_argument(p + format("q_lora_rank must be >= 0 (0 = no q LoRA), got %.0f", s.q_lora_rank));
    if (s.qk_nope_head_dim <= 0)
      invalid_argument(p + format("qk_nope_head_dim must be positive, got %.0f", s.qk_nope_head_dim));
    if (s.qk_rope_head_dim <= 0 || s.qk_rope_head_dim % 2 != 0)
      invalid_argument(p + format("qk_rope_head_dim must be positive and even, got %.0f", s.qk_rope_head_dim));
    if (s.v_head_dim <= 0)
      invalid_argument(p + format("v_head_dim must be positive, got %.0f", s.v_head_dim));
    if (static_cast<long long>(s.qk_nope_head_dim) + s.qk_rope_head_dim != s.head_dim)
      invalid_argument(p + format("MLA: head_dim must equal qk_nope_head_dim + qk_rope_head_dim (%.0f), got %.0f",
                                  static_cast<double>(static_cast<long long>(s.qk_nope_head_dim) + s.qk_rope_head_dim),
                                  s.head_dim));
    if (s.num_kv_heads != s.num_heads)
      invalid_argument(p + format("MLA: num_kv_heads must equal num_heads (%.0f), got %.0f", s.num_heads,
                                  s.num_kv_heads));
    if (s.qk_norm != 0) invalid_argument(std::string(p) + "MLA with qk_norm is not supported");
    if (s.qkv_bias != 0) invalid_argument(std::string(p) + "MLA with qkv_bias is not supported");
    if (static_cast<long long>(s.num_heads) * (s.kv_lora_rank + s.qk_rope_head_dim) > 0x7fffffffLL ||
        static_cast<long long>(s.num_heads) * s.v_head_dim > 0x7fffffffLL)
      invalid_argument(std::string(p) + "MLA: num_heads * (kv_lora_rank + qk_rope_head_dim) or num_heads * v_head_dim "
                                        "exceeds the int32 range");
  }
  if (s.yarn_factor != 0) {
    if (!(s.yarn_factor > 1) || std::isinf(s.yarn_factor))
      invalid_argument(p + format("yarn_factor must be 0 (none) or > 1, got %g", s.yarn_factor));
    if (s.rope_scaling_factor != 0)
      invalid_argument(std::string(p) + "yarn_factor and rope_scaling_factor are both set; a shape has one RoPE scaling");
    if (s.kv_lora_rank == 0)
      invalid_argument(std::string(p) + "yarn_factor: YaRN is supported on MLA shapes only (DeepSeek's form; "
                                        "kv_lora_rank > 0)");
    if (s.yarn_original_max_positions <= 0)
      invalid_argument(p + format("yarn_original_max_positions must be positive, got %.0f",
                                  s.yarn_original_max_positions));
    if (!(s.yarn_beta_slow > 0) || !(s.yarn_beta_fast >= s.yarn_beta_slow) || std::isinf(s.yarn_beta_fast))
      invalid_argument(p + format("yarn betas need beta_fast >= beta_slow > 0, got %g and %g", s.yarn_beta_fast,
                                  s.yarn_beta_slow));
    if (!(s.yarn_mscale >= 0) || !(s.yarn_mscale_all_dim >= 0) || std::isinf(s.yarn_mscale) ||
        std::isinf(s.yarn_mscale_all_dim))
      invalid_argument(p + format("yarn mscale and mscale_all_dim must be >= 0 and finite, got %g and %g",
                                  s.yarn_mscale, s.yarn_mscale_all_dim));
  } else if (s.yarn_original_max_positions != 0 || s.yarn_beta_fast != 0 || s.yarn_beta_slow != 0 ||
             s.yarn_mscale != 0 || s.yarn_mscale_all_dim != 0) {
    invalid_argument(std::string(p) + "yarn fields are set but yarn_factor is 0");
  }
}

}  // namespace lockstep
