// weights.cpp: deterministic weight generation (see weights.h for the recipe).
#include "weights.h"

#include <cmath>

namespace lockstep {

void generate_tensor(float* out, size_t n, uint64_t seed, TensorKind kind, int layer,
                     int64_t fan_in) {
  const uint64_t id = tensor_id(kind, layer);
  switch (kind) {
    case TensorKind::kAttnNorm:
    case TensorKind::kMLPNorm:
    case TensorKind::kFinalNorm:
      // Norm gains near 1 so that activations keep unit scale.
      for (size_t i = 0; i < n; ++i) out[i] = 1.0f + uniform_pm1(seed, id, i) * 0.125f;
      return;
    case TensorKind::kEmbedding:
      for (size_t i = 0; i < n; ++i) out[i] = uniform_pm1(seed, id, i);
      return;
    default: {
      // Computed in double then rounded once, so the scale is reproducible.
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
      for (size_t i = 0; i < n; ++i) out[i] = uniform_pm1(seed, id, i) * scale;
      return;
    }
  }
}

namespace {

std::vector<float> tensor(int64_t rows, int64_t cols, uint64_t seed, TensorKind kind,
                          int layer) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  generate_tensor(t.data(), t.size(), seed, kind, layer, rows);
  return t;
}

}  // namespace

Weights generate_weights(const eng_model_shape& s, uint64_t seed) {
  const int64_t h = s.hidden_size, qd = int64_t{s.num_heads} * s.head_dim,
                kvd = int64_t{s.num_kv_heads} * s.head_dim, f = s.intermediate_size,
                v = s.vocab_size;
  Weights w;
  w.embedding = tensor(v, h, seed, TensorKind::kEmbedding, -1);
  w.final_norm = tensor(1, h, seed, TensorKind::kFinalNorm, -1);
  w.lm_head = tensor(h, v, seed, TensorKind::kLMHead, -1);
  w.layers.resize(static_cast<size_t>(s.num_layers));
  for (int l = 0; l < s.num_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = tensor(1, h, seed, TensorKind::kAttnNorm, l);
    L.wq = tensor(h, qd, seed, TensorKind::kWq, l);
    L.wk = tensor(h, kvd, seed, TensorKind::kWk, l);
    L.wv = tensor(h, kvd, seed, TensorKind::kWv, l);
    L.wo = tensor(qd, h, seed, TensorKind::kWo, l);
    L.mlp_norm = tensor(1, h, seed, TensorKind::kMLPNorm, l);
    if (s.qk_norm) {
      for (int which = 0; which < 2; ++which) {
        std::vector<float>& g = which == 0 ? L.q_norm : L.k_norm;
        g.resize(static_cast<size_t>(s.head_dim));
        for (size_t i = 0; i < g.size(); ++i) g[i] = 1.0f + uniform_pm1(seed, qk_norm_tensor_id(l, which), i) * 0.125f;
      }
    }
    if (s.num_experts == 0) {
      L.w_gate = tensor(h, f, seed, TensorKind::kWGate, l);
      L.w_up = tensor(h, f, seed, TensorKind::kWUp, l);
      L.w_down = tensor(f, h, seed, TensorKind::kWDown, l);
      continue;
    }
    L.router = tensor(h, s.num_experts, seed, TensorKind::kRouter, l);
    if (s.num_shared_experts > 0) {
      const int64_t fs = int64_t{s.num_shared_experts} * s.moe_intermediate_size;
      L.shared.gate = tensor(h, fs, seed, TensorKind::kSharedGate, l);
      L.shared.up = tensor(h, fs, seed, TensorKind::kSharedUp, l);
      L.shared.down = tensor(fs, h, seed, TensorKind::kSharedDown, l);
    }
    L.experts.resize(static_cast<size_t>(s.num_experts));
    for (int e = 0; e < s.num_experts; ++e) L.experts[static_cast<size_t>(e)] = generate_expert(s, seed, l, e);
  }
  return w;
}

ExpertWeights generate_expert(const eng_model_shape& s, uint64_t seed, int layer, int expert) {
  const int64_t h = s.hidden_size, fm = s.moe_intermediate_size;
  auto t = [&](int64_t rows, int64_t cols, TensorKind kind) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    const uint64_t id = expert_tensor_id(kind, layer, expert);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(rows)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = uniform_pm1(seed, id, i) * scale;
    return v;
  };
  return ExpertWeights{t(h, fm, TensorKind::kExpertGate), t(h, fm, TensorKind::kExpertUp),
                       t(fm, h, TensorKind::kExpertDown)};
}

double weight_elements(const eng_model_shape& s) {
  const double h = s.hidden_size, qd = double(s.num_heads) * s.head_dim,
               kvd = double(s.num_kv_heads) * s.head_dim, f = s.intermediate_size,
               v = s.vocab_size;
  const double mlp = s.num_experts == 0
                         ? 3 * h * f
                         : h * s.num_experts + 3 * h * double(s.moe_intermediate_size) *
                                                   (double(s.num_experts) + s.num_shared_experts);
  const double per_layer = 2 * h + (s.qk_norm ? 2.0 * s.head_dim : 0.0) + h * qd + 2 * h * kvd + qd * h + mlp;
  return (s.tied_embeddings ? 1 : 2) * v * h + h + double(s.num_layers) * per_layer;
}

}  // namespace lockstep
