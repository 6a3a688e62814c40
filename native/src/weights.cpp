// weights.cpp: deterministic weight generation (see weights.h for the recipe).
#include "weights.h"

#include <cmath>
#include <utility>

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

// An MLA tensor of n elements: norm gains near 1, projections scaled by
// 1/sqrt(fan_in) (fan_in 0: a norm).
std::vector<float> mla_tensor(size_t n, uint64_t seed, TensorKind kind, int layer, int64_t fan_in) {
  std::vector<float> t(n);
  const uint64_t id = mla_tensor_id(kind, layer);
  if (fan_in == 0) {
    for (size_t i = 0; i < n; ++i) t[i] = 1.0f + uniform_pm1(seed, id, i) * 0.125f;
    return t;
  }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  for (size_t i = 0; i < n; ++i) t[i] = uniform_pm1(seed, id, i) * scale;
  return t;
}

// A layer's MLA attention weights (weights.h's LayerWeights layout).
void generate_mla(const eng_model_shape& s, uint64_t seed, int l, LayerWeights* L) {
  const int64_t h = s.hidden_size, heads = s.num_heads, ql = s.q_lora_rank, kl = s.kv_lora_rank;
  const int64_t nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim, v = s.v_head_dim;
  const int64_t q_in = ql > 0 ? ql : h;
  if (ql > 0) {
    L->wq_a = mla_tensor(static_cast<size_t>(h * ql), seed, TensorKind::kQA, l, h);
    L->q_a_norm = mla_tensor(static_cast<size_t>(ql), seed, TensorKind::kQANorm, l, 0);
  }
  L->wq = tensor(q_in, heads * (nope + rope), seed, TensorKind::kWq, l);
  L->wkv_a = mla_tensor(static_cast<size_t>(h * (kl + rope)), seed, TensorKind::kKVA, l, h);
  L->kv_a_norm = mla_tensor(static_cast<size_t>(kl), seed, TensorKind::kKVANorm, l, 0);
  L->w_kb = mla_tensor(static_cast<size_t>(heads * nope * kl), seed, TensorKind::kKB, l, kl);
  L->w_vb = mla_tensor(static_cast<size_t>(heads * kl * v), seed, TensorKind::kVB, l, kl);
  L->wo = tensor(heads * v, h, seed, TensorKind::kWo, l);
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
    if (s.kv_lora_rank > 0) {
      generate_mla(s, seed, l, &L);
    } else {
      L.wq = tensor(h, qd, seed, TensorKind::kWq, l);
      L.wk = tensor(h, kvd, seed, TensorKind::kWk, l);
      L.wv = tensor(h, kvd, seed, TensorKind::kWv, l);
      L.wo = tensor(qd, h, seed, TensorKind::kWo, l);
    }
    L.mlp_norm = tensor(1, h, seed, TensorKind::kMLPNorm, l);
    if (s.qkv_bias) {
      // Biases of a size that moves the projections (u/2).
      const std::pair<std::vector<float>*, std::pair<TensorKind, int64_t>> biases[] = {
          {&L.bq, {TensorKind::kBq, qd}}, {&L.bk, {TensorKind::kBk, kvd}}, {&L.bv, {TensorKind::kBv, kvd}}};
      for (const auto& [dst, kn] : biases) {
        dst->resize(static_cast<size_t>(kn.second));
        for (size_t i = 0; i < dst->size(); ++i) (*dst)[i] = uniform_pm1(seed, mla_tensor_id(kn.first, l), i) * 0.5f;
      }
    }
    if (s.post_norms) {
      for (auto [dst, kind] : {std::pair<std::vector<float>*, TensorKind>{&L.attn_post_norm, TensorKind::kAttnPostNorm},
                               {&L.mlp_post_norm, TensorKind::kMLPPostNorm}}) {
        dst->resize(static_cast<size_t>(h));
        for (size_t i = 0; i < dst->size(); ++i) (*dst)[i] = 1.0f + uniform_pm1(seed, mla_tensor_id(kind, l), i) * 0.125f;
      }
    }
    if (s.qk_norm) {
      for (int which = 0; which < 2; ++which) {
        std::vector<float>& g = which == 0 ? L.q_norm : L.k_norm;
        g.resize(static_cast<size_t>(s.head_dim));
        for (size_t i = 0; i < g.size(); ++i) g[i] = 1.0f + uniform_pm1(seed, qk_norm_tensor_id(l, which), i) * 0.125f;
      }
    }
    if (s.num_experts == 0 || l < s.first_dense_layers) {
      L.w_gate = tensor(h, f, seed, TensorKind::kWGate, l);
      L.w_up = tensor(h, f, seed, TensorKind::kWUp, l);
      L.w_down = tensor(f, h, seed, TensorKind::kWDown, l);
      continue;
    }
    L.router = tensor(h, s.num_experts, seed, TensorKind::kRouter, l);
    if (s.router_norm == ENG_ROUTER_SIGMOID_TOPK || s.router_norm == ENG_ROUTER_SIGMOID_TOPK_RAW) {
      // A bias of the sigmoid scores' size, so that it changes choices.
      L.router_bias.resize(static_cast<size_t>(s.num_experts));
      for (size_t i = 0; i < L.router_bias.size(); ++i)
        L.router_bias[i] = uniform_pm1(seed, mla_tensor_id(TensorKind::kRouterBias, l), i) * 0.125f;
    }
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
  ExpertWeights e;
  e.gate = t(h, fm, TensorKind::kExpertGate);
  e.up = t(h, fm, TensorKind::kExpertUp);
  e.down = t(fm, h, TensorKind::kExpertDown);
  return e;
}

double weight_elements(const eng_model_shape& s) {
  const double h = s.hidden_size, qd = double(s.num_heads) * s.head_dim,
               kvd = double(s.num_kv_heads) * s.head_dim, f = s.intermediate_size,
               v = s.vocab_size;
  const double dense = 3 * h * f;
  const double moe = s.num_experts == 0 ? 0
                                        : h * s.num_experts + 3 * h * double(s.moe_intermediate_size) *
                                                                  (double(s.num_experts) + s.num_shared_experts);
  double attn = h * qd + 2 * h * kvd + qd * h;
  if (s.kv_lora_rank > 0) {
    const double heads = s.num_heads, ql = s.q_lora_rank, kl = s.kv_lora_rank, rope = s.qk_rope_head_dim;
    attn = (ql > 0 ? h * ql + ql + ql * qd : h * qd) + h * (kl + rope) + kl +
           heads * kl * (double(s.qk_nope_head_dim) + s.v_head_dim) + heads * s.v_head_dim * h;
  }
  const double per_layer = (s.post_norms ? 4 : 2) * h + (s.qk_norm ? 2.0 * s.head_dim : 0.0) +
                           (s.qkv_bias ? qd + 2 * kvd : 0.0) + attn;
  const double dense_layers = s.num_experts == 0 ? s.num_layers : s.first_dense_layers;
  return (s.tied_embeddings ? 1 : 2) * v * h + h + double(s.num_layers) * per_layer + dense_layers * dense +
         (double(s.num_layers) - dense_layers) * moe;
}

}  // namespace lockstep
