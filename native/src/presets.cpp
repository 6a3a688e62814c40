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
// rope_theta, rms_eps.
const NamedShape kPresets[] = {
    // llama-70b: Llama 3 70B shape (GQA 8:1).
    {"llama-70b", {80, 8192, 64, 8, 128, 28672, 128256, 500000.0f, 1e-5f, 0, 0, 0, 0, 0}},
    // llama-8b: Llama 3 8B shape (GQA 4:1).
    {"llama-8b", {32, 4096, 32, 8, 128, 14336, 128256, 500000.0f, 1e-5f, 0, 0, 0, 0, 0}},
    // tiny: fast on the CPU engine; GQA 2:1.
    {"tiny", {2, 64, 4, 2, 16, 128, 512, 10000.0f, 1e-5f, 0, 0, 0, 0, 0}},
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
  // 64-bit product: num_heads*head_dim may overflow int32 for hostile input.
  const long long want_hidden = static_cast<long long>(s.num_heads) * s.head_dim;
  if (static_cast<long long>(s.hidden_size) != want_hidden)
    invalid_argument(p + format("hidden_size must equal num_heads*head_dim (%.0f), got %.0f",
                                static_cast<double>(want_hidden), s.hidden_size));
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
}

}  // namespace lockstep
