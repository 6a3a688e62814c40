// checkpoint.cpp: conversion of checkpoint tensors (see checkpoint.h).
#include "checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "status.h"

namespace lockstep {
namespace {

constexpr int64_t kBlock = 32;   // elements per quantised block
constexpr int64_t kSuper = 256;  // elements per "K" super-block

const char* kind_name(int32_t kind) {
  static const char* const names[] = {
      "embedding", "final_norm", "lm_head",     "attn_norm",   "wq",          "wk",          "wv",         "wo",
      "mlp_norm",  "w_gate",     "w_up",        "w_down",      "rope_freqs",  "q_norm",      "k_norm",     "router",
      "expert_gate", "expert_up", "expert_down", "shared_gate", "shared_up", "shared_down", "q_a", "q_a_norm",
      "kv_a", "kv_a_norm", "kv_b", "k_b", "v_b", "router_bias", "q_bias", "k_bias", "v_bias", "attn_post_norm",
      "mlp_post_norm"};
  return kind >= 0 && kind <= ENG_WEIGHT_MLP_POST_NORM ? names[kind] : "unknown";
}

bool is_expert(int32_t kind) { return kind >= ENG_WEIGHT_EXPERT_GATE && kind <= ENG_WEIGHT_EXPERT_DOWN; }

std::string label(const eng_tensor& t, int32_t index) {
  char buf[128];
  if (t.layer < 0)
    std::snprintf(buf, sizeof buf, "tensors[%d] (%s)", index, kind_name(t.kind));
  else if (is_expert(t.kind))
    std::snprintf(buf, sizeof buf, "tensors[%d] (layer %d expert %d %s)", index, t.layer, t.expert, kind_name(t.kind));
  else
    std::snprintf(buf, sizeof buf, "tensors[%d] (layer %d %s)", index, t.layer, kind_name(t.kind));
  return buf;
}

std::string fmt(const char* f, long long a = 0, long long b = 0, long long c = 0, long long d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

// The [rows][cols] a kind must have.
void expected_dims(const eng_model_shape& s, int32_t kind, int64_t* rows, int64_t* cols) {
  const int64_t H = s.hidden_size, qd = int64_t{s.num_heads} * s.head_dim,
                kvd = int64_t{s.num_kv_heads} * s.head_dim, F = s.intermediate_size, V = s.vocab_size;
  const int64_t Fm = s.moe_intermediate_size, Fs = int64_t{s.num_shared_experts} * s.moe_intermediate_size;
  if (s.kv_lora_rank > 0) {
    const int64_t heads = s.num_heads, QL = s.q_lora_rank, KL = s.kv_lora_rank, R = s.qk_rope_head_dim;
    const int64_t N = s.qk_nope_head_dim, Vh = s.v_head_dim;
    switch (kind) {
      case ENG_WEIGHT_WQ: *rows = heads * (N + R); *cols = QL > 0 ? QL : H; return;
      case ENG_WEIGHT_WO: *rows = H; *cols = heads * Vh; return;
      case ENG_WEIGHT_Q_A: *rows = QL; *cols = H; return;
      case ENG_WEIGHT_Q_A_NORM: *rows = 1; *cols = QL; return;
      case ENG_WEIGHT_KV_A: *rows = KL + R; *cols = H; return;
      case ENG_WEIGHT_KV_A_NORM: *rows = 1; *cols = KL; return;
      case ENG_WEIGHT_KV_B: *rows = heads * (N + Vh); *cols = KL; return;
      case ENG_WEIGHT_K_B: *rows = heads * KL; *cols = N; return;
      case ENG_WEIGHT_V_B: *rows = heads * Vh; *cols = KL; return;
      case ENG_WEIGHT_ROPE_FREQS: *rows = 1; *cols = R / 2; return;
    }
  }
  switch (kind) {
    case ENG_WEIGHT_ROUTER_BIAS: *rows = 1; *cols = s.num_experts; return;
    case ENG_WEIGHT_Q_BIAS: *rows = 1; *cols = qd; return;
    case ENG_WEIGHT_K_BIAS: case ENG_WEIGHT_V_BIAS: *rows = 1; *cols = kvd; return;
    case ENG_WEIGHT_EMBEDDING: case ENG_WEIGHT_LM_HEAD: *rows = V; *cols = H; return;
    case ENG_WEIGHT_FINAL_NORM: case ENG_WEIGHT_ATTN_NORM: case ENG_WEIGHT_MLP_NORM:
    case ENG_WEIGHT_ATTN_POST_NORM: case ENG_WEIGHT_MLP_POST_NORM: *rows = 1; *cols = H; return;
    case ENG_WEIGHT_WQ: *rows = qd; *cols = H; return;
    case ENG_WEIGHT_WK: case ENG_WEIGHT_WV: *rows = kvd; *cols = H; return;
    case ENG_WEIGHT_WO: *rows = H; *cols = qd; return;
    case ENG_WEIGHT_W_GATE: case ENG_WEIGHT_W_UP: *rows = F; *cols = H; return;
    case ENG_WEIGHT_W_DOWN: *rows = H; *cols = F; return;
    case ENG_WEIGHT_ROPE_FREQS: *rows = 1; *cols = rope_dim(s) / 2; return;
    case ENG_WEIGHT_Q_NORM: case ENG_WEIGHT_K_NORM: *rows = 1; *cols = s.head_dim; return;
    case ENG_WEIGHT_ROUTER: *rows = s.num_experts; *cols = H; return;
    case ENG_WEIGHT_EXPERT_GATE: case ENG_WEIGHT_EXPERT_UP: *rows = Fm; *cols = H; return;
    case ENG_WEIGHT_EXPERT_DOWN: *rows = H; *cols = Fm; return;
    case ENG_WEIGHT_SHARED_GATE: case ENG_WEIGHT_SHARED_UP: *rows = Fs; *cols = H; return;
    case ENG_WEIGHT_SHARED_DOWN: *rows = H; *cols = Fs; return;
  }
  *rows = *cols = -1;
}

bool is_global(int32_t kind) {
  return kind == ENG_WEIGHT_EMBEDDING || kind == ENG_WEIGHT_FINAL_NORM || kind == ENG_WEIGHT_LM_HEAD ||
         kind == ENG_WEIGHT_ROPE_FREQS;
}

bool sigmoid_router(const eng_model_shape& s) {
  return s.router_norm == ENG_ROUTER_SIGMOID_TOPK || s.router_norm == ENG_ROUTER_SIGMOID_TOPK_RAW;
}

// Why a layer kind does not belong to the shape's layer ("" when it does).
const char* foreign_reason(const eng_model_shape& s, int32_t kind, int32_t layer) {
  const bool moe = s.num_experts > 0 && layer >= s.first_dense_layers;
  const bool mla = s.kv_lora_rank > 0;
  switch (kind) {
    case ENG_WEIGHT_W_GATE: case ENG_WEIGHT_W_UP: case ENG_WEIGHT_W_DOWN:
      return moe ? "a dense MLP weight, but the layer is a mixture of experts (num_experts > 0, at or past "
                   "first_dense_layers)"
                 : "";
    case ENG_WEIGHT_ROUTER: case ENG_WEIGHT_EXPERT_GATE: case ENG_WEIGHT_EXPERT_UP: case ENG_WEIGHT_EXPERT_DOWN:
      return moe ? "" : "a mixture-of-experts weight, but the layer is dense (num_experts 0, or below first_dense_layers)";
    case ENG_WEIGHT_SHARED_GATE: case ENG_WEIGHT_SHARED_UP: case ENG_WEIGHT_SHARED_DOWN:
      if (!moe) return "a shared-expert weight, but the layer is dense";
      return s.num_shared_experts > 0 ? "" : "a shared-expert weight, but the shape has num_shared_experts 0";
    case ENG_WEIGHT_ROUTER_BIAS:
      if (!moe) return "a router bias, but the layer is dense";
      return sigmoid_router(s) ? "" : "a router bias, but the shape's router is not a sigmoid one (router_norm 3 or 4)";
    case ENG_WEIGHT_Q_NORM: case ENG_WEIGHT_K_NORM:
      return s.qk_norm ? "" : "a q/k norm gain, but the shape has qk_norm 0";
    case ENG_WEIGHT_Q_BIAS: case ENG_WEIGHT_K_BIAS: case ENG_WEIGHT_V_BIAS:
      return s.qkv_bias ? "" : "a q/k/v projection bias, but the shape has qkv_bias 0";
    case ENG_WEIGHT_ATTN_POST_NORM: case ENG_WEIGHT_MLP_POST_NORM:
      return s.post_norms ? "" : "a post-norm gain, but the shape has post_norms 0";
    case ENG_WEIGHT_WK: case ENG_WEIGHT_WV:
      return mla ? "a K/V projection, but the shape uses latent attention (kv_lora_rank > 0: KV_A and KV_B)" : "";
    case ENG_WEIGHT_Q_A: case ENG_WEIGHT_Q_A_NORM:
      if (!mla) return "an MLA weight, but the shape has kv_lora_rank 0";
      return s.q_lora_rank > 0 ? "" : "a q LoRA weight, but the shape has q_lora_rank 0 (WQ is the whole projection)";
    case ENG_WEIGHT_KV_A: case ENG_WEIGHT_KV_A_NORM: case ENG_WEIGHT_KV_B: case ENG_WEIGHT_K_B: case ENG_WEIGHT_V_B:
      return mla ? "" : "an MLA weight, but the shape has kv_lora_rank 0";
  }
  return "";
}

// Slot table: globals 0..2, rope_freqs 3, then per layer the 28 non-expert
// layer kinds (attn_norm .. w_down, q_norm, k_norm, router, shared_*, the
// MLA kinds, router_bias, the q/k/v biases and the post norms), then 3 per
// routed expert.
constexpr int64_t kLayerKinds = 28;
int64_t layer_slots(const eng_model_shape& s) { return kLayerKinds + 3 * int64_t{s.num_experts}; }

int64_t slot_of(const eng_model_shape& s, int32_t kind, int32_t layer, int32_t expert) {
  if (kind == ENG_WEIGHT_ROPE_FREQS) return 3;
  if (is_global(kind)) return kind;
  const int64_t base = 4 + int64_t{layer} * layer_slots(s);
  if (kind <= ENG_WEIGHT_W_DOWN) return base + (kind - ENG_WEIGHT_ATTN_NORM);
  if (is_expert(kind)) return base + kLayerKinds + int64_t{expert} * 3 + (kind - ENG_WEIGHT_EXPERT_GATE);
  if (kind >= ENG_WEIGHT_Q_A) return base + 15 + (kind - ENG_WEIGHT_Q_A);
  if (kind >= ENG_WEIGHT_SHARED_GATE) return base + 12 + (kind - ENG_WEIGHT_SHARED_GATE);
  return base + 9 + (kind - ENG_WEIGHT_Q_NORM);  // q_norm, k_norm, router
}

}  // namespace

void validate_tensors(const eng_model_shape& s, const eng_tensor* tensors, int32_t n) {
  if (n < 0) invalid_argument(fmt("num_tensors must be >= 0, got %lld", n));
  if (n > 0 && tensors == nullptr) invalid_argument(fmt("tensors is NULL (num_tensors = %lld)", n));
  if (n == 0) return;
  const int64_t slots = 4 + int64_t{s.num_layers} * layer_slots(s);
  std::vector<int32_t> seen(static_cast<size_t>(slots), -1);
  for (int32_t i = 0; i < n; ++i) {
    const eng_tensor& t = tensors[i];
    if (t.kind < 0 || t.kind > ENG_WEIGHT_MLP_POST_NORM)
      invalid_argument(
          fmt("tensors[%lld]: kind %lld is not an eng_weight (0..%lld)", i, t.kind, ENG_WEIGHT_MLP_POST_NORM));
    const std::string name = label(t, i);
    if (is_global(t.kind) ? t.layer != -1 : (t.layer < 0 || t.layer >= s.num_layers))
      invalid_argument(name + fmt(": layer %lld out of range (global tensors use -1, layer tensors 0..%lld)",
                                  t.layer, s.num_layers - 1));
    if (is_expert(t.kind) ? (t.expert < 0 || t.expert >= s.num_experts) : t.expert != 0)
      invalid_argument(name + fmt(": expert %lld out of range (expert tensors use 0..%lld, others 0)", t.expert,
                                  s.num_experts - 1));
    if (const char* why = foreign_reason(s, t.kind, t.layer); *why != '\0') invalid_argument(name + ": " + why);
    if (t.kind == ENG_WEIGHT_LM_HEAD && s.tied_embeddings)
      invalid_argument(name + ": an lm_head was given but the shape has tied_embeddings set");
    if (t.kind == ENG_WEIGHT_ROPE_FREQS && (s.rope_scaling_factor != 0 || s.rope_linear_factor != 0))
      invalid_argument(name + ": rope_freqs and rope_scaling_factor (or rope_linear_factor) both scale RoPE; give one");
    const int64_t slot = slot_of(s, t.kind, t.layer, t.expert);
    if (seen[static_cast<size_t>(slot)] >= 0)
      invalid_argument(name + fmt(": duplicate of tensors[%lld]", seen[static_cast<size_t>(slot)]));
    seen[static_cast<size_t>(slot)] = i;
    int64_t rows, cols;
    expected_dims(s, t.kind, &rows, &cols);
    if (t.rows != rows || t.cols != cols)
      invalid_argument(name + fmt(": is [%lld][%lld], the shape needs [%lld][%lld]", t.rows, t.cols, rows, cols));
    const int64_t rb = dtype_row_bytes(t.dtype, t.cols);
    if (rb == -2) invalid_argument(name + fmt(": dtype %lld is not an eng_dtype (0..%lld)", t.dtype, ENG_DTYPE_Q6_K));
    if (rb == -1)
      invalid_argument(name + ": " + dtype_name(t.dtype) +
                       fmt(" needs cols to be a multiple of %lld, got %lld", t.dtype >= ENG_DTYPE_Q2_K ? kSuper : kBlock,
                           t.cols));
    if (t.nbytes != rb * t.rows)
      invalid_argument(name + fmt(": nbytes = %lld, but [%lld][%lld] of ", t.nbytes, t.rows, t.cols) +
                       dtype_name(t.dtype) + fmt(" is %lld bytes", rb * t.rows));
    if (t.data == nullptr) invalid_argument(name + ": data is NULL");
    if (t.interleaved_rope_heads != 0) {
      const int32_t want = t.kind == ENG_WEIGHT_WQ                               ? s.num_heads
                           : t.kind == ENG_WEIGHT_WK                             ? s.num_kv_heads
                           : t.kind == ENG_WEIGHT_KV_A && s.kv_lora_rank > 0     ? 1
                                                                                 : 0;
      if (t.interleaved_rope_heads != want)
        invalid_argument(name + fmt(": interleaved_rope_heads = %lld, want 0 or %lld (wq: num_heads, wk: "
                                    "num_kv_heads, MLA kv_a: 1, others: 0)",
                                    t.interleaved_rope_heads, want));
      if (s.qk_norm)
        invalid_argument(name + ": interleaved_rope_heads with qk_norm (the norm gains would need the same "
                                "reordering); not supported");
      if (s.qkv_bias)
        invalid_argument(name + ": interleaved_rope_heads with qkv_bias (the biases would need the same "
                                "reordering); not supported");
      if (s.partial_rotary_dim != 0 && s.kv_lora_rank == 0)
        invalid_argument(name + ": interleaved_rope_heads with partial_rotary_dim; not supported");
    }
  }
  // Every tensor the shape needs, in slot order (rope_freqs is optional).
  auto missing = [&](int32_t kind, int32_t layer, int32_t expert) {
    if (seen[static_cast<size_t>(slot_of(s, kind, layer, expert))] >= 0) return;
    if (layer < 0)
      invalid_argument(std::string("missing tensor: ") + kind_name(kind) +
                       (kind == ENG_WEIGHT_LM_HEAD ? " (or set tied_embeddings)" : ""));
    if (is_expert(kind))
      invalid_argument(fmt("missing tensor: layer %lld expert %lld ", layer, expert) + kind_name(kind));
    invalid_argument(fmt("missing tensor: layer %lld ", layer) + kind_name(kind));
  };
  missing(ENG_WEIGHT_EMBEDDING, -1, 0);
  missing(ENG_WEIGHT_FINAL_NORM, -1, 0);
  if (!s.tied_embeddings) missing(ENG_WEIGHT_LM_HEAD, -1, 0);
  for (int32_t l = 0; l < s.num_layers; ++l) {
    for (int32_t k = ENG_WEIGHT_ATTN_NORM; k <= ENG_WEIGHT_MLP_NORM; ++k)
      if (s.kv_lora_rank == 0 || (k != ENG_WEIGHT_WK && k != ENG_WEIGHT_WV)) missing(k, l, 0);
    if (s.qk_norm) {
      missing(ENG_WEIGHT_Q_NORM, l, 0);
      missing(ENG_WEIGHT_K_NORM, l, 0);
    }
    if (s.qkv_bias)
      for (int32_t k = ENG_WEIGHT_Q_BIAS; k <= ENG_WEIGHT_V_BIAS; ++k) missing(k, l, 0);
    if (s.post_norms) {
      missing(ENG_WEIGHT_ATTN_POST_NORM, l, 0);
      missing(ENG_WEIGHT_MLP_POST_NORM, l, 0);
    }
    if (s.kv_lora_rank > 0) {
      if (s.q_lora_rank > 0) {
        missing(ENG_WEIGHT_Q_A, l, 0);
        missing(ENG_WEIGHT_Q_A_NORM, l, 0);
      }
      missing(ENG_WEIGHT_KV_A, l, 0);
      missing(ENG_WEIGHT_KV_A_NORM, l, 0);
      const bool kv_b = seen[static_cast<size_t>(slot_of(s, ENG_WEIGHT_KV_B, l, 0))] >= 0;
      const bool k_b = seen[static_cast<size_t>(slot_of(s, ENG_WEIGHT_K_B, l, 0))] >= 0;
      const bool v_b = seen[static_cast<size_t>(slot_of(s, ENG_WEIGHT_V_B, l, 0))] >= 0;
      if (kv_b && (k_b || v_b))
        invalid_argument(fmt("layer %lld: kv_b and k_b/v_b both given; give kv_b, or k_b and v_b", l));
      if (!kv_b) {
        if (!k_b && !v_b) invalid_argument(fmt("missing tensor: layer %lld kv_b (or k_b and v_b)", l));
        missing(ENG_WEIGHT_K_B, l, 0);
        missing(ENG_WEIGHT_V_B, l, 0);
      }
    }
    if (s.num_experts == 0 || l < s.first_dense_layers) {
      for (int32_t k = ENG_WEIGHT_W_GATE; k <= ENG_WEIGHT_W_DOWN; ++k) missing(k, l, 0);
      continue;
    }
    missing(ENG_WEIGHT_ROUTER, l, 0);
    if (s.num_shared_experts > 0)
      for (int32_t k = ENG_WEIGHT_SHARED_GATE; k <= ENG_WEIGHT_SHARED_DOWN; ++k) missing(k, l, 0);
    for (int32_t e = 0; e < s.num_experts; ++e)
      for (int32_t k = ENG_WEIGHT_EXPERT_GATE; k <= ENG_WEIGHT_EXPERT_DOWN; ++k) missing(k, l, e);
  }
}

void tensor_to_input_major(const eng_tensor& t, int32_t head_dim, float* out) {
  const int64_t rows = t.rows, cols = t.cols;
  const int64_t rb = dtype_row_bytes(t.dtype, cols);
  // Rows are converted kBlockRows at a time so that the transposed writes
  // fill whole cache lines (out[c * rows + o .. o + kBlockRows)).
  constexpr int64_t kBlockRows = 16;
  std::vector<float> block(static_cast<size_t>(kBlockRows * cols));
  int64_t dest[kBlockRows];
  const uint8_t* base = static_cast<const uint8_t*>(t.data);
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    const int64_t n = std::min(kBlockRows, rows - r0);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t r = r0 + k;
      dequantize_row(t.dtype, base + r * rb, cols, block.data() + k * cols);
      dest[k] = engine_row(t, r, head_dim);
    }
    for (int64_t c = 0; c < cols; ++c) {
      float* col = out + c * rows;
      for (int64_t k = 0; k < n; ++k) col[dest[k]] = block[static_cast<size_t>(k * cols + c)];
    }
  }
}

namespace {

// Rows of an MLA tensor in the engine's order: with interleaved_rope_heads,
// the rope tail of each head (of width `head`, the last R rows) is turned
// from adjacent pairs into rotate-half order.
int64_t mla_row(const eng_tensor& t, int64_t r, int64_t head, int64_t R) {
  if (t.interleaved_rope_heads == 0) return r;
  const int64_t h = r / head, j = r % head, nope = head - R;
  if (j < nope) return r;
  const int64_t k = j - nope;
  return h * head + nope + (k % 2) * (R / 2) + k / 2;
}

}  // namespace

// The MLA kinds that need more than tensor_to_input_major (the rope-tail
// reordering of WQ and KV_A, the per-head absorbed forms of KV_B, K_B and
// V_B): converted into L; false for every other kind (checkpoint.h).
bool load_mla_tensor(const eng_model_shape& s, const eng_tensor& t, LayerWeights* L) {
  const int64_t heads = s.num_heads, KL = s.kv_lora_rank, R = s.qk_rope_head_dim, N = s.qk_nope_head_dim;
  const int64_t Vh = s.v_head_dim;
  const int64_t rb = dtype_row_bytes(t.dtype, t.cols);
  const uint8_t* base = static_cast<const uint8_t*>(t.data);
  std::vector<float> row(static_cast<size_t>(t.cols));
  auto each_row = [&](auto&& put) {
    for (int64_t r = 0; r < t.rows; ++r) {
      dequantize_row(t.dtype, base + r * rb, t.cols, row.data());
      put(r);
    }
  };
  switch (t.kind) {
    case ENG_WEIGHT_WQ: case ENG_WEIGHT_KV_A: {
      // Input-major [cols][rows] with the rows reordered.
      std::vector<float>& dst = t.kind == ENG_WEIGHT_WQ ? L->wq : L->wkv_a;
      const int64_t head = t.kind == ENG_WEIGHT_WQ ? N + R : KL + R;
      dst.assign(static_cast<size_t>(t.rows * t.cols), 0.0f);
      each_row([&](int64_t r) {
        const int64_t o = mla_row(t, r, head, R);
        for (int64_t c = 0; c < t.cols; ++c) dst[static_cast<size_t>(c * t.rows + o)] = row[static_cast<size_t>(c)];
      });
      return true;
    }
    case ENG_WEIGHT_KV_B:
      // Row h*(N+Vh) + n (n < N) is W_kb[h][n][:]; row h*(N+Vh) + N + v is
      // W_vb[h][:][v].
      L->w_kb.assign(static_cast<size_t>(heads * N * KL), 0.0f);
      L->w_vb.assign(static_cast<size_t>(heads * KL * Vh), 0.0f);
      each_row([&](int64_t r) {
        const int64_t h = r / (N + Vh), j = r % (N + Vh);
        for (int64_t c = 0; c < KL; ++c) {
          if (j < N)
            L->w_kb[static_cast<size_t>((h * N + j) * KL + c)] = row[static_cast<size_t>(c)];
          else
            L->w_vb[static_cast<size_t>((h * KL + c) * Vh + (j - N))] = row[static_cast<size_t>(c)];
        }
      });
      return true;
    case ENG_WEIGHT_K_B:
      // Row h*KL + c holds W_kb[h][:][c] (llama.cpp's attn_k_b).
      L->w_kb.assign(static_cast<size_t>(heads * N * KL), 0.0f);
      each_row([&](int64_t r) {
        const int64_t h = r / KL, c = r % KL;
        for (int64_t n = 0; n < N; ++n) L->w_kb[static_cast<size_t>((h * N + n) * KL + c)] = row[static_cast<size_t>(n)];
      });
      return true;
    case ENG_WEIGHT_V_B:
      // Row h*Vh + v holds W_vb[h][:][v] (llama.cpp's attn_v_b).
      L->w_vb.assign(static_cast<size_t>(heads * KL * Vh), 0.0f);
      each_row([&](int64_t r) {
        const int64_t h = r / Vh, v = r % Vh;
        for (int64_t c = 0; c < KL; ++c) L->w_vb[static_cast<size_t>((h * KL + c) * Vh + v)] = row[static_cast<size_t>(c)];
      });
      return true;
  }
  return false;
}


Weights load_weights(const eng_model_shape& s, const eng_tensor* tensors, int32_t n, bool quant) {
  Weights w;
  w.tied = s.tied_embeddings != 0;
  w.layers.resize(static_cast<size_t>(s.num_layers));
  for (LayerWeights& L : w.layers) L.experts.resize(static_cast<size_t>(s.num_experts));
  for (int32_t i = 0; i < n; ++i) {
    const eng_tensor& t = tensors[i];
    std::vector<float>* dst = nullptr;
    if (t.kind == ENG_WEIGHT_EMBEDDING && !w.tied) {
      // Kept row-major [vocab][hidden]: a lookup reads one row.
      w.embedding.resize(static_cast<size_t>(t.rows * t.cols));
      const int64_t rb = dtype_row_bytes(t.dtype, t.cols);
      for (int64_t r = 0; r < t.rows; ++r)
        dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + r * rb, t.cols,
                       w.embedding.data() + r * t.cols);
      continue;
    }
    if (s.kv_lora_rank > 0 && load_mla_tensor(s, t, &w.layers[static_cast<size_t>(t.layer < 0 ? 0 : t.layer)]))
      continue;
    switch (t.kind) {
      case ENG_WEIGHT_ROPE_FREQS: dst = &w.rope_freqs; break;
      case ENG_WEIGHT_EMBEDDING: case ENG_WEIGHT_LM_HEAD: dst = &w.lm_head; break;
      case ENG_WEIGHT_FINAL_NORM: dst = &w.final_norm; break;
      default: {
        LayerWeights& L = w.layers[static_cast<size_t>(t.layer)];
        ExpertWeights& X = is_expert(t.kind) ? L.experts[static_cast<size_t>(t.expert)] : L.shared;
        std::vector<float>* per[] = {nullptr,     nullptr,   nullptr,  &L.attn_norm, &L.wq,      &L.wk,
                                     &L.wv,       &L.wo,     &L.mlp_norm, &L.w_gate, &L.w_up,    &L.w_down,
                                     nullptr,     &L.q_norm, &L.k_norm, &L.router,   &X.gate,    &X.up,
                                     &X.down,     &X.gate,   &X.up,     &X.down,     &L.wq_a,    &L.q_a_norm,
                                     &L.wkv_a,    &L.kv_a_norm, nullptr, nullptr,    nullptr,    &L.router_bias,
                                     &L.bq,       &L.bk,     &L.bv,       &L.attn_post_norm, &L.mlp_post_norm};
        dst = per[t.kind];
        // The dense projections: kept quantised under the quantised kernels;
        // under the exact ones (and for experts, exact under either setting)
        // also in packed panels, which steps of few rows read (packed_cpu.h).
        QuantMatrix* q = nullptr;
        PackedMatrix* pk = nullptr;
        switch (t.kind) {
          case ENG_WEIGHT_WQ: q = &L.qwq, pk = &L.pwq; break;
          case ENG_WEIGHT_WK: q = &L.qwk, pk = &L.pwk; break;
          case ENG_WEIGHT_WV: q = &L.qwv, pk = &L.pwv; break;
          case ENG_WEIGHT_WO: q = &L.qwo, pk = &L.pwo; break;
          case ENG_WEIGHT_W_GATE: q = &L.qw_gate, pk = &L.pw_gate; break;
          case ENG_WEIGHT_W_UP: q = &L.qw_up, pk = &L.pw_up; break;
          case ENG_WEIGHT_W_DOWN: q = &L.qw_down, pk = &L.pw_down; break;
          case ENG_WEIGHT_EXPERT_GATE: case ENG_WEIGHT_SHARED_GATE: pk = &X.pgate; break;
          case ENG_WEIGHT_EXPERT_UP: case ENG_WEIGHT_SHARED_UP: pk = &X.pup; break;
          case ENG_WEIGHT_EXPERT_DOWN: case ENG_WEIGHT_SHARED_DOWN: pk = &X.pdown; break;
          default: break;
        }
        // (An MLA shape's WQ stays float: its rope tails are reordered on load.)
        const bool mla_wq = s.kv_lora_rank > 0 && t.kind == ENG_WEIGHT_WQ;
        if (quant && q != nullptr && requantised_dtype(t.dtype) && !mla_wq) {
          std::vector<uint8_t> q8;
          *q = pack_quant_matrix(requantise_q8_0(t, &q8), s.head_dim);
          continue;
        }
        if (pk != nullptr && quant_dtype(t.dtype) && !mla_wq) {
          if (quant && q != nullptr) {
            *q = pack_quant_matrix(t, s.head_dim);
            continue;
          }
          *pk = pack_exact_matrix(t, s.head_dim);
        }
      }
    }
    if ((t.kind == ENG_WEIGHT_LM_HEAD || (t.kind == ENG_WEIGHT_EMBEDDING && w.tied)) && quant && requantised_dtype(t.dtype)) {
      std::vector<uint8_t> q8;
      w.q_lm_head = pack_quant_matrix(requantise_q8_0(t, &q8), s.head_dim);
      if (!w.tied) continue;  // a tied embedding keeps its float copy for the lookups
    } else if ((t.kind == ENG_WEIGHT_LM_HEAD || (t.kind == ENG_WEIGHT_EMBEDDING && w.tied)) && quant_dtype(t.dtype)) {
      if (!quant) {
        w.p_lm_head = pack_exact_matrix(t, s.head_dim);
      } else {
        w.q_lm_head = pack_quant_matrix(t, s.head_dim);
        if (!w.tied) continue;  // a tied embedding keeps its float copy for the lookups
      }
    }
    dst->resize(static_cast<size_t>(t.rows * t.cols));
    tensor_to_input_major(t, s.head_dim, dst->data());
  }
  for (size_t i = 0; i < w.rope_freqs.size(); ++i)
    if (!(w.rope_freqs[i] > 0) || !std::isfinite(w.rope_freqs[i]))
      invalid_argument(fmt("rope_freqs[%lld] must be a positive finite divisor, got ", static_cast<long long>(i)) +
                       std::to_string(w.rope_freqs[i]));
  return w;
}

namespace {

// A 64-bit hash of bytes (8-byte words mixed by multiply and xor-shift).
uint64_t hash_bytes(const uint8_t* p, int64_t n, uint64_t h) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

}  // namespace

std::shared_ptr<const Weights> shared_weights(const eng_model_shape& s, const eng_tensor* tensors, int32_t n,
                                              bool quant) {
  // The key: the shape and the kernels, then per tensor its description and
  // content hash.
  std::string key(reinterpret_cast<const char*>(&s), sizeof s);
  key.push_back(quant ? 'q' : 'x');
  for (int32_t i = 0; i < n; ++i) {
    const eng_tensor& t = tensors[i];
    const int64_t desc[] = {t.kind, t.layer, t.dtype, t.interleaved_rope_heads, t.expert, t.rows, t.cols, t.nbytes,
                            static_cast<int64_t>(hash_bytes(static_cast<const uint8_t*>(t.data), t.nbytes, 0x51u))};
    key.append(reinterpret_cast<const char*>(desc), sizeof desc);
  }
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const Weights>> cache;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = cache.begin(); it != cache.end();) {  // drop entries whose engines are gone
    if (it->second.expired())
      it = cache.erase(it);
    else
      ++it;
  }
  if (auto w = cache[key].lock()) return w;
  auto w = std::make_shared<const Weights>(load_weights(s, tensors, n, quant));
  cache[key] = w;
  return w;
}

std::vector<double> rope_inv_freq_local(const eng_model_shape& s) {
  const int32_t dim = rope_dim(s), half = dim / 2;
  const double base = s.rope_local_theta != 0 ? s.rope_local_theta : s.rope_theta;
  std::vector<double> f(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) f[i] = std::pow(base, -2.0 * i / static_cast<double>(dim));
  return f;
}

std::vector<double> rope_inv_freq(const eng_model_shape& s, const std::vector<float>& rope_freqs) {
  const int32_t dim = rope_dim(s), half = dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i)
    f[i] = std::pow(static_cast<double>(s.rope_theta), -2.0 * i / static_cast<double>(dim));
  if (s.rope_linear_factor != 0) {
    // Linear scaling (positions / factor); validate_tensors refuses
    // rope_freqs beside it.
    for (double& x : f) x /= s.rope_linear_factor;
    return f;
  }
  if (!rope_freqs.empty()) {
    for (int32_t i = 0; i < half; ++i) f[i] /= static_cast<double>(rope_freqs[static_cast<size_t>(i)]);
    return f;
  }
  if (s.yarn_factor != 0) {
    // YaRN (DeepSeek-V3's yarn rotary embedding): dimensions that turn
    // more than beta_fast times over the original context keep their
    // frequency, those under beta_slow are interpolated (/factor), and a
    // linear ramp blends the band between.
    const double pi = 3.14159265358979323846, base = s.rope_theta, orig = s.yarn_original_max_positions;
    auto corr_dim = [&](double rotations) {
      return dim * std::log(orig / (rotations * 2 * pi)) / (2 * std::log(base));
    };
    const double low = std::max(std::floor(corr_dim(s.yarn_beta_fast)), 0.0);
    double high = std::min(std::ceil(corr_dim(s.yarn_beta_slow)), static_cast<double>(dim - 1));
    if (high == low) high += 0.001;
    for (int32_t i = 0; i < half; ++i) {
      const double ramp = std::min(std::max((i - low) / (high - low), 0.0), 1.0);
      f[i] = f[i] / s.yarn_factor * ramp + f[i] * (1 - ramp);
    }
    return f;
  }
  if (s.rope_scaling_factor == 0) return f;
  // Llama 3.1: long wavelengths are divided by the factor, short ones kept,
  // and the band between interpolated smoothly.
  const double factor = s.rope_scaling_factor, lo = s.rope_low_freq_factor, hi = s.rope_high_freq_factor;
  const double old_ctx = s.rope_original_max_positions;
  const double low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
  const double pi = 3.14159265358979323846;
  for (double& x : f) {
    const double wavelen = 2 * pi / x;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      x /= factor;
    } else {
      const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
      x = (1 - smooth) * x / factor + smooth * x;
    }
  }
  return f;
}

}  // namespace lockstep

namespace lockstep {

double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

double rope_magnitude(const eng_model_shape& s) {
  if (s.rope_attn_factor != 0) return s.rope_attn_factor;  // LongRoPE's (validate_shape: not with YaRN)
  if (s.yarn_factor == 0) return 1.0;
  return yarn_mscale(s.yarn_factor, s.yarn_mscale) / yarn_mscale(s.yarn_factor, s.yarn_mscale_all_dim);
}

float attention_scale(const eng_model_shape& s) {
  if (s.attention_scale != 0) return s.attention_scale;  // Granite's attention_multiplier
  double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  if (s.yarn_factor != 0 && s.yarn_mscale_all_dim != 0) {
    const double m = yarn_mscale(s.yarn_factor, s.yarn_mscale_all_dim);
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

}  // namespace lockstep
