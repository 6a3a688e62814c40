// presets.cpp: the named shapes (mirror of bridge/presets.go) and validation.
#include "presets.h"

#include <cstdio>

#include "status.h"

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
// moe_intermediate, shared experts, router_norm, qk_norm.
const NamedShape kPresets[] = {
    // llama-70b: Llama 3 70B shape (GQA 8:1).
    {"llama-70b", {80, 8192, 64, 8, 128, 28672, 128256, 500000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    // llama-8b: Llama 3 8B shape (GQA 4:1).
    {"llama-8b", {32, 4096, 32, 8, 128, 14336, 128256, 500000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    // mixtral-8x7b: Mixtral-8x7B-v0.1 config.json: 8 experts, top-2 (top-k
    // then softmax), experts of width 14336, no shared expert.
    {"mixtral-8x7b", {32, 4096, 32, 8, 128, 14336, 32000, 1000000.0f, 1e-5f, 0, 0, 0, 0, 0, 8, 2, 14336, 0,
                      ENG_ROUTER_TOPK_SOFTMAX, 0}},
    // moe-tiny: fast on the CPU engine: 16 experts, top-2, one shared expert.
    {"moe-tiny", {3, 64, 4, 2, 16, 128, 512, 10000.0f, 1e-5f, 0, 0, 0, 0, 0, 16, 2, 32, 1, ENG_ROUTER_SOFTMAX_TOPK, 0}},
    // qwen3-30b-a3b: Qwen3-30B-A3B config.json: 128 experts, top-8 (softmax,
    // top-k, renormalised), experts of width 768, no shared expert; head_dim
    // 128 with hidden 2048 (heads * head_dim = 4096); per-head q/k RMSNorm.
    {"qwen3-30b-a3b", {48, 2048, 32, 4, 128, 6144, 151936, 1000000.0f, 1e-6f, 0, 0, 0, 0, 0, 128, 8, 768, 0,
                       ENG_ROUTER_SOFTMAX_TOPK, 1}},
    // tiny: fast on the CPU engine; GQA 2:1.
    {"tiny", {2, 64, 4, 2, 16, 128, 512, 10000.0f, 1e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
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
  return false;
}

std::string preset_names() {
  std::string s;
  for (const auto& p : kPresets) {
    if (!s.empty()) s += ", ";
    s += p.name;
  }
  return s;
}

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
    if (s.router_norm != ENG_ROUTER_SOFTMAX_TOPK && s.router_norm != ENG_ROUTER_TOPK_SOFTMAX)
      invalid_argument(p + format("router_norm must be 0 (softmax, top-k, renormalise) or 1 (top-k, softmax), got %.0f",
                                  s.router_norm));
  }
  if (s.qk_norm != 0 && s.qk_norm != 1)
    invalid_argument(p + format("qk_norm must be 0 or 1, got %.0f", s.qk_norm));
}

}  // namespace lockstep
