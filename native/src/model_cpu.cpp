// model_cpu.cpp: forward step of the CPU reference backend (see model_cpu.h
// for the model and its arithmetic conventions).
#include "model_cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "attention_partial.h"
#include "checkpoint.h"
#include "cp_group.h"
#include "gemm_cpu.h"
#include "presets.h"
#include "sampling.h"
#include "status.h"

namespace lockstep {

namespace {

// gate[j] = silu(gate[j]) · up[j] for j in [j0, j1).
void silu_mul_range(float* gate, const float* up, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const float g = gate[j];
    gate[j] = g / (1.0f + std::exp(-g)) * up[j];
  }
}

// gate[j] = gelu(gate[j]) · up[j] for j in [j0, j1), GELU's tanh form
// (Hugging Face's gelu_pytorch_tanh, Gemma's hidden_activation).
void gelu_mul_range(float* gate, const float* up, int64_t j0, int64_t j1) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t j = j0; j < j1; ++j) {
    const float g = gate[j];
    const float inner = c * (g + 0.044715f * (g * g * g));
    gate[j] = 0.5f * g * (1.0f + std::tanh(inner)) * up[j];
  }
}

// x = cap · tanh(x / cap) over n elements (Gemma 2's soft-capping).
void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

// Sampled rows per LM-head pass (rows per GEMM pass of a layer: kRowChunk,
// model_cpu.h).
constexpr int64_t kLogitChunk = 64;

// With several threads, a sequence's attention rows are shared out in blocks
// of kAttnRowBlock rows per kv head (each block reads the pages its rows
// need); with one thread a run of rows is one call, as before.
constexpr int32_t kAttnRowBlock = 32;

// Elements of an element-wise loop (SiLU) per thread's share at least.
constexpr int64_t kMinParallelElems = 1 << 14;

// y = RMSNorm(x) * w over n elements (sum of squares in double); y may be x.
void rms_norm(const float* x, const float* w, int32_t n, float eps, float* y) {
  double ss = 0.0;
  for (int32_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + static_cast<double>(eps)));
  for (int32_t i = 0; i < n; ++i) y[i] = (x[i] * inv) * w[i];
}

// y[i] += b[i] over n elements.
void add_bias(float* y, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += b[i];
}

}  // namespace

CpuBackend::CpuBackend(const EngineParams& p)
    : shape_(p.shape),
      tokens_per_page_(p.tokens_per_page),
      own_weights_(p.num_tensors > 0 ? nullptr : std::make_shared<Weights>(generate_weights(p.shape, p.seed))),
      device_(p.num_pages, p.tokens_per_page, p.shape.num_layers, kv_width(p.shape), kv_planes(p.shape)),
      host_(p.num_host_pages, p.tokens_per_page, p.shape.num_layers, kv_width(p.shape), kv_planes(p.shape)) {
  weights_ = own_weights_ ? std::shared_ptr<const Weights>(own_weights_)
                          : shared_weights(p.shape, p.tensors, p.num_tensors, p.cpu_kernels == ENG_CPU_KERNELS_QUANT);
  if (p.num_threads > 1) pool_ = std::make_unique<ThreadPool>(p.num_threads);
  attn_scratch_.resize(static_cast<size_t>(p.num_threads > 1 ? p.num_threads : 1));
  inv_freq_ = rope_inv_freq(shape_, weights_->rope_freqs);
  if (shape_.sliding_window > 0 && (shape_.rope_local_theta != 0 || shape_.rope_linear_factor != 0))
    inv_freq_local_ = rope_inv_freq_local(shape_);
  rope_dim_ = rope_dim(shape_);
  rope_mag_ = rope_magnitude(shape_);
  attn_scale_ = attention_scale(shape_);
  mla_ = is_mla(shape_);
  if (shape_.num_experts > 0) moe_stats_.layers.resize(static_cast<size_t>(shape_.num_layers));
  const size_t hidden = static_cast<size_t>(shape_.hidden_size);
  const size_t inter = static_cast<size_t>(shape_.intermediate_size);
  x_.resize(hidden);
  attn_.resize(hidden);  // heads * head_dim == hidden
  tmp_.resize(hidden);
  gate_.resize(inter);
  up_.resize(inter);
  logits_.resize(static_cast<size_t>(shape_.vocab_size));
}

std::unique_ptr<Backend> make_cpu_backend(const EngineParams& params) {
  return std::make_unique<CpuBackend>(params);
}

// Fills the row → (sequence, position) maps and each row's RoPE table.
void CpuBackend::prepare_rows(const StepBatch& batch) {
  const size_t rows = static_cast<size_t>(batch.num_rows);
  const int32_t D = rope_dim_, half = D / 2;
  int32_t* row_seq = grow(row_seq_, rows);
  int32_t* row_pos = grow(row_pos_, rows);
  float* cs = grow(rope_cs_, rows * D);
  float* cs_local = inv_freq_local_.empty() ? nullptr : grow(rope_cs_local_, rows * D);
  size_t r = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const StepSeq& s = batch.seqs[i];
    for (int32_t t = 0; t < s.num_tokens; ++t, ++r) {
      row_seq[r] = static_cast<int32_t>(i);
      row_pos[r] = s.start_pos + t;
      float* c = cs + r * D;
      for (int32_t k = 0; k < half; ++k) {
        const double angle = static_cast<double>(row_pos[r]) * inv_freq_[k];
        if (rope_mag_ == 1.0) {
          c[k] = static_cast<float>(std::cos(angle));
          c[half + k] = static_cast<float>(std::sin(angle));
        } else {
          c[k] = static_cast<float>(std::cos(angle) * rope_mag_);
          c[half + k] = static_cast<float>(std::sin(angle) * rope_mag_);
        }
      }
      if (cs_local == nullptr) continue;
      float* cl = cs_local + r * D;
      for (int32_t k = 0; k < half; ++k) {
        const double angle = static_cast<double>(row_pos[r]) * inv_freq_local_[k];
        cl[k] = static_cast<float>(std::cos(angle) * rope_mag_);
        cl[half + k] = static_cast<float>(std::sin(angle) * rope_mag_);
      }
    }
  }
}

int32_t CpuBackend::window(int32_t layer) const {
  const int32_t w = shape_.sliding_window, p = shape_.sliding_window_pattern;
  if (w == 0 || (p != 0 && layer % p == p - 1)) return 0;
  return w;
}

const float* CpuBackend::rope_table(int32_t layer) const {
  return window(layer) != 0 && !inv_freq_local_.empty() ? rope_cs_local_.data() : rope_cs_.data();
}

void CpuBackend::post_norm(float* y, int64_t m, const std::vector<float>& gain) const {
  if (!shape_.post_norms) return;
  const int64_t H = shape_.hidden_size;
  for (int64_t j = 0; j < m; ++j) rms_norm(y + j * H, gain.data(), shape_.hidden_size, shape_.rms_eps, y + j * H);
}

// Rotate-half RoPE of `heads` heads of x in place (cos_sin: cos[D/2], sin[D/2]).
void CpuBackend::rope(float* x, int32_t heads, int64_t stride, const float* cos_sin) const {
  const int32_t half = rope_dim_ / 2;
  const float* c = cos_sin;
  const float* s = cos_sin + half;
  for (int32_t h = 0; h < heads; ++h) {
    float* xh = x + h * stride;
    for (int32_t i = 0; i < half; ++i) {
      const float x0 = xh[i], x1 = xh[half + i];
      xh[i] = x0 * c[i] - x1 * s[i];
      xh[half + i] = x1 * c[i] + x0 * s[i];
    }
  }
}

// Phase 1 of a layer for every row: norm, QKV, RoPE, K/V into the pages. Runs
// for the whole batch before any attention, so that a row of a chunk can read
// the K/V of the earlier rows of its chunk from the pages. The projections are
// GEMMs over passes of up to kRowChunk rows.
void CpuBackend::write_kv(int32_t layer, const StepBatch& batch, const float* hidden) {
  if (mla_) return write_latent(layer, batch, hidden);
  const LayerWeights& w = weights_->layers[static_cast<size_t>(layer)];
  const int64_t H = shape_.hidden_size, D = shape_.head_dim;
  const int64_t qd = int64_t{shape_.num_heads} * D, kvd = int64_t{shape_.num_kv_heads} * D;
  const int32_t P = tokens_per_page_;
  const int32_t cp = batch.cp ? batch.cp->size() : 1, cp_rank = batch.cp ? batch.cp->rank() : 0;
  float* q = grow(q_, static_cast<size_t>(batch.num_rows * qd));
  for (int64_t r0 = 0; r0 < batch.num_rows; r0 += kRowChunk) {
    const int64_t n = batch.num_rows - r0 < kRowChunk ? batch.num_rows - r0 : kRowChunk;
    float* x = grow(x_, static_cast<size_t>(n * H));
    float* k = grow(kv_scratch_, static_cast<size_t>(2 * n * kvd));
    float* v = k + n * kvd;
    for (int64_t j = 0; j < n; ++j)
      rms_norm(hidden + (r0 + j) * H, w.attn_norm.data(), shape_.hidden_size, shape_.rms_eps, x + j * H);
    if (packed_rows(n, w.qwq, w.pwq) && packed_rows(n, w.qwk, w.pwk) && packed_rows(n, w.qwv, w.pwv)) {
      // Decoding: the three products in one pass of the threads (K and V
      // alone are too small to share out).
      const PackedJob jobs[3] = {{&w.pwq, q + r0 * qd}, {&w.pwk, k}, {&w.pwv, v}};
      packed_gemm_jobs(pool_.get(), x, n, jobs, 3);
    } else {
      linear(x, n, H, w.wq, w.qwq, w.pwq, qd, q + r0 * qd);
      linear(x, n, H, w.wk, w.qwk, w.pwk, kvd, k);
      linear(x, n, H, w.wv, w.qwv, w.pwv, kvd, v);
    }
    if (shape_.qkv_bias) {
      // Qwen2: each projection's bias, added once to the rounded product.
      for (int64_t j = 0; j < n; ++j) {
        add_bias(q + (r0 + j) * qd, w.bq.data(), qd);
        add_bias(k + j * kvd, w.bk.data(), kvd);
        add_bias(v + j * kvd, w.bv.data(), kvd);
      }
    }
    if (shape_.qk_norm) {
      // Qwen3: every head of q and k RMS-normed over head_dim (in place).
      for (int64_t j = 0; j < n; ++j) {
        float* qr = q + (r0 + j) * qd;
        for (int32_t h = 0; h < shape_.num_heads; ++h)
          rms_norm(qr + h * D, w.q_norm.data(), shape_.head_dim, shape_.rms_eps, qr + h * D);
        float* kr = k + j * kvd;
        for (int32_t h = 0; h < shape_.num_kv_heads; ++h)
          rms_norm(kr + h * D, w.k_norm.data(), shape_.head_dim, shape_.rms_eps, kr + h * D);
      }
    }
    const float* table = rope_table(layer);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t r = r0 + j;
      const StepSeq& s = batch.seqs[static_cast<size_t>(row_seq_[r])];
      const int32_t pos = row_pos_[r];
      const float* cs = table + r * rope_dim_;
      rope(q + r * qd, shape_.num_heads, D, cs);
      rope(k + j * kvd, shape_.num_kv_heads, D, cs);
      // Under Helix a rank computes K/V of every row (the arithmetic is
      // replicated) but stores only the positions it owns.
      if ((pos / P) % cp != cp_rank) continue;
      const int32_t page = s.blocks[pos / (P * cp)];
      device_.write_kv(page, layer, pos % P, k + j * kvd, v + j * kvd);
    }
  }
}

int64_t CpuBackend::attn_width() const {
  return int64_t{shape_.num_heads} * (mla_ ? shape_.kv_lora_rank : shape_.head_dim);
}

int64_t CpuBackend::query_width() const {
  return int64_t{shape_.num_heads} * (mla_ ? shape_.kv_lora_rank + shape_.qk_rope_head_dim : shape_.head_dim);
}

// MLA phase 1 for every row (model_cpu.h), in passes of up to kRowChunk
// rows: the projections are GEMMs over the pass, the absorption one GEMM per
// head over the pass's rows.
void CpuBackend::write_latent(int32_t layer, const StepBatch& batch, const float* hidden) {
  static const QuantMatrix kFloat;  // the MLA-only projections stay float
  static const PackedMatrix kNoPacked;
  const LayerWeights& w = weights_->layers[static_cast<size_t>(layer)];
  const int64_t H = shape_.hidden_size, heads = shape_.num_heads, QL = shape_.q_lora_rank;
  const int64_t KL = shape_.kv_lora_rank, R = shape_.qk_rope_head_dim, N = shape_.qk_nope_head_dim;
  const int64_t Lw = KL + R, qh = N + R, qf = heads * qh, qd = heads * Lw;
  const int32_t P = tokens_per_page_;
  const int32_t cp = batch.cp ? batch.cp->size() : 1, cp_rank = batch.cp ? batch.cp->rank() : 0;
  float* q = grow(q_, static_cast<size_t>(batch.num_rows * qd));
  for (int64_t r0 = 0; r0 < batch.num_rows; r0 += kRowChunk) {
    const int64_t n = batch.num_rows - r0 < kRowChunk ? batch.num_rows - r0 : kRowChunk;
    float* x = grow(x_, static_cast<size_t>(n * H));
    for (int64_t j = 0; j < n; ++j)
      rms_norm(hidden + (r0 + j) * H, w.attn_norm.data(), shape_.hidden_size, shape_.rms_eps, x + j * H);
    float* full = grow(mla_q_, static_cast<size_t>(n * qf));
    if (QL > 0) {
      float* cq = grow(mla_a_, static_cast<size_t>(n * QL));
      linear(x, n, H, w.wq_a, kFloat, kNoPacked, QL, cq);
      for (int64_t j = 0; j < n; ++j)
        rms_norm(cq + j * QL, w.q_a_norm.data(), shape_.q_lora_rank, shape_.rms_eps, cq + j * QL);
      linear(cq, n, QL, w.wq, kFloat, kNoPacked, qf, full);
    } else {
      linear(x, n, H, w.wq, kFloat, kNoPacked, qf, full);
    }
    float* kv = grow(kv_scratch_, static_cast<size_t>(n * Lw));
    linear(x, n, H, w.wkv_a, kFloat, kNoPacked, Lw, kv);
    for (int64_t j = 0; j < n; ++j) {
      const float* cs = rope_cs_.data() + (r0 + j) * R;
      float* lat = kv + j * Lw;
      rms_norm(lat, w.kv_a_norm.data(), shape_.kv_lora_rank, shape_.rms_eps, lat);
      rope(lat + KL, 1, R, cs);
      rope(full + j * qf + N, shape_.num_heads, qh, cs);
    }
    // Absorption: q_lat[j][h] = q_nope[j][h] · W_kb[h]; the rope tail is
    // copied beside it.
    float* qn = grow(mla_h_, static_cast<size_t>(n * (N > KL ? N : KL) * 2));
    float* ql = qn + n * N;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < n; ++j) std::memcpy(qn + j * N, full + j * qf + h * qh, sizeof(float) * N);
      gemm_rows_pool(pool_.get(), qn, n, N, w.w_kb.data() + h * N * KL, KL, ql);
      for (int64_t j = 0; j < n; ++j) {
        float* dst = q + (r0 + j) * qd + h * Lw;
        std::memcpy(dst, ql + j * KL, sizeof(float) * KL);
        std::memcpy(dst + KL, full + j * qf + h * qh + N, sizeof(float) * R);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t r = r0 + j;
      const int32_t pos = row_pos_[r];
      // Helix: every rank computes every row's latent, stores its own pages.
      if ((pos / P) % cp != cp_rank) continue;
      const StepSeq& s = batch.seqs[static_cast<size_t>(row_seq_[r])];
      const int32_t page = s.blocks[pos / (P * cp)];
      std::memcpy(device_.kv(page, layer, 0) + static_cast<size_t>(pos % P) * Lw, kv + j * Lw, sizeof(float) * Lw);
    }
  }
}

void CpuBackend::latent_to_values(const LayerWeights& w, const float* x, int64_t m, float* y) {
  const int64_t heads = shape_.num_heads, KL = shape_.kv_lora_rank, V = shape_.v_head_dim;
  float* a = grow(mla_h_, static_cast<size_t>(m * (KL + V)));
  float* b = a + m * KL;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < m; ++j) std::memcpy(a + j * KL, x + j * heads * KL + h * KL, sizeof(float) * KL);
    gemm_rows_pool(pool_.get(), a, m, KL, w.w_vb.data() + h * KL * V, V, b);
    for (int64_t j = 0; j < m; ++j) std::memcpy(y + j * heads * V + h * V, b + j * V, sizeof(float) * V);
  }
}

// Phase 2 of a layer for rows[0..n) (ascending batch rows): attention (or
// attn[n][heads * head_dim] when given, the Helix path), output projection,
// MLP, both residual adds, in place on hidden[row]. Every projection is a GEMM
// over passes of up to kRowChunk of the rows.
void CpuBackend::attend_mlp(int32_t layer, const StepBatch& batch, const int64_t* rows, int64_t n,
                            float* hidden, const float* attn) {
  const LayerWeights& w = weights_->layers[static_cast<size_t>(layer)];
  const int64_t H = shape_.hidden_size, F = shape_.intermediate_size;
  const int64_t qd = attn_width();
  const int64_t od = mla_ ? int64_t{shape_.num_heads} * shape_.v_head_dim : qd;  // W_o's input
  // A MoE layer collects every row's normed x first: its exchanges happen
  // once per layer, however many passes the rows take.
  const bool moe = moe_layer(shape_, layer);
  float* moe_x = moe ? grow(moe_x_, static_cast<size_t>(n * H)) : nullptr;
  for (int64_t c0 = 0; c0 < n; c0 += kRowChunk) {
    const int64_t m = n - c0 < kRowChunk ? n - c0 : kRowChunk;
    const int64_t* rr = rows + c0;
    const float* a = attn != nullptr ? attn + c0 * qd : nullptr;
    if (a == nullptr) {
      float* out = grow(attn_, static_cast<size_t>(m * qd));
      attend(layer, batch, rr, m, out);
      a = out;
    }
    if (mla_) {
      float* o = grow(mla_o_, static_cast<size_t>(m * od));
      latent_to_values(w, a, m, o);
      a = o;
    }
    float* t = grow(tmp_, static_cast<size_t>(m * H));
    linear(a, m, od, w.wo, w.qwo, w.pwo, H, t);
    post_norm(t, m, w.attn_post_norm);
    float* x = grow(x_, static_cast<size_t>(m * H));
    for (int64_t j = 0; j < m; ++j) {
      float* h = hidden + rr[j] * H;
      add_residual(h, t + j * H, H);
      rms_norm(h, w.mlp_norm.data(), shape_.hidden_size, shape_.rms_eps, x + j * H);
    }
    if (moe) {
      std::memcpy(moe_x + c0 * H, x, sizeof(float) * static_cast<size_t>(m * H));
      continue;
    }
    float* gate = grow(gate_, static_cast<size_t>(m * F));
    float* up = grow(up_, static_cast<size_t>(m * F));
    if (packed_rows(m, w.qw_gate, w.pw_gate) && packed_rows(m, w.qw_up, w.pw_up)) {
      // Decoding: both products and the activation in one pass of the
      // threads, each range of columns finished by the thread that made it.
      packed_gemm_gated(pool_.get(), x, m, w.pw_gate, w.pw_up, gate, up, [&](int64_t o0, int64_t o1) {
        for (int64_t j = 0; j < m; ++j) act_mul_range(gate + j * F, up + j * F, o0, o1);
      });
    } else {
      linear(x, m, H, w.w_gate, w.qw_gate, w.pw_gate, F, gate);
      linear(x, m, H, w.w_up, w.qw_up, w.pw_up, F, up);
      act_mul(gate, up, m * F);
    }
    linear(gate, m, F, w.w_down, w.qw_down, w.pw_down, H, t);
    post_norm(t, m, w.mlp_post_norm);
    for (int64_t j = 0; j < m; ++j) add_residual(hidden + rr[j] * H, t + j * H, H);
  }
  if (moe) {
    float* mo = grow(moe_out_, static_cast<size_t>(n * H));
    moe_block(layer, batch, n, moe_x, mo);
    for (int64_t j = 0; j < n; ++j) add_residual(hidden + rows[j] * H, mo + j * H, H);
  }
}

// Granite: logits times the float 1/logit_scale; Gemma 2: soft-capped
// (nothing without either).
void CpuBackend::scale_logits(float* lg, int64_t n) const {
  if (shape_.logit_scale != 0) {
    const float inv = 1.0f / shape_.logit_scale;
    for (int64_t i = 0; i < n; ++i) lg[i] *= inv;
  }
  if (shape_.final_softcap != 0) soft_cap(lg, n, shape_.final_softcap);
}

// h += y, or h += y · residual_scale (Granite: the product rounded, then
// the add).
void CpuBackend::add_residual(float* h, const float* y, int64_t n) const {
  if (shape_.residual_scale == 0) {
    for (int64_t i = 0; i < n; ++i) h[i] += y[i];
    return;
  }
  const float s = shape_.residual_scale;
  for (int64_t i = 0; i < n; ++i) h[i] += y[i] * s;
}

// Attention of the m batch rows rr[0..m) (ascending) into out[m][heads *
// head_dim]. Runs of consecutive rows of one sequence share its pages; with
// several threads each run is cut into (kv head, block of rows) items, which
// give every (row, head) the bits of the one-call run (attention_cpu.h).
void CpuBackend::attend(int32_t layer, const StepBatch& batch, const int64_t* rr, int64_t m, float* out) {
  const int64_t qd = query_width(), od = attn_width();
  int32_t* pos = grow(run_pos_, static_cast<size_t>(m));
  attn_items_.clear();
  const bool split = pool_ != nullptr;
  // The items' head groups: kv heads (GQA), or blocks of query heads over
  // the one latent plane (MLA: a block per thread).
  const int32_t groups = mla_ ? std::min<int32_t>(shape_.num_heads, pool_ ? pool_->size() : 1) : shape_.num_kv_heads;
  for (int64_t j = 0; j < m;) {
    const int32_t seq = row_seq_[rr[j]];
    int64_t e = j;
    while (e < m && row_seq_[rr[e]] == seq && (e == j || rr[e] == rr[e - 1] + 1)) {
      pos[e] = row_pos_[rr[e]];
      ++e;
    }
    if (!split) {
      attn_items_.push_back(AttnItem{j, e, seq, 0, groups});
    } else {
      for (int32_t g = 0; g < groups; ++g)
        for (int64_t b = j; b < e; b += kAttnRowBlock)
          attn_items_.push_back(AttnItem{b, std::min<int64_t>(b + kAttnRowBlock, e), seq, g, g + 1});
    }
    j = e;
  }
  // Too few items to keep the threads equally busy (a decode of one or two
  // sequences: one item per kv head, 3 on SmolLM2 for 2 threads): each
  // item's group is cut into its query heads. Every head's arithmetic is
  // the same in either cut, so the bits are too.
  const int32_t group = mla_ ? 1 : shape_.num_heads / shape_.num_kv_heads;
  if (split && group > 1 && attn_items_.size() < static_cast<size_t>(4 * pool_->size())) {
    const size_t items = attn_items_.size();
    attn_items_.reserve(items * static_cast<size_t>(group));
    for (size_t i = 0; i < items; ++i) {
      attn_items_[i].s1 = 1;
      for (int32_t h = 1; h < group; ++h) {
        AttnItem more = attn_items_[i];
        more.s0 = h;
        more.s1 = h + 1;
        attn_items_.push_back(more);
      }
    }
  }
  auto run = [&](int64_t i, int thread) {
    const AttnItem& it = attn_items_[static_cast<size_t>(i)];
    const StepSeq& s = batch.seqs[static_cast<size_t>(it.seq)];
    if (mla_) {
      // Head block g of `groups`: heads [g * heads / groups, (g + 1) * heads / groups).
      const int32_t heads = shape_.num_heads;
      paged_latent_attention_rows(device_, layer, s.blocks, pos + it.r0, static_cast<int32_t>(it.r1 - it.r0),
                                  q_.data() + rr[it.r0] * qd, static_cast<size_t>(qd), heads,
                                  shape_.kv_lora_rank + shape_.qk_rope_head_dim, shape_.kv_lora_rank, attn_scale_,
                                  out + it.r0 * od, static_cast<size_t>(od), attn_scratch_[static_cast<size_t>(thread)],
                                  it.g0 * heads / groups, it.g1 * heads / groups);
      return;
    }
    paged_attention_rows(device_, layer, s.blocks, pos + it.r0, static_cast<int32_t>(it.r1 - it.r0),
                         q_.data() + rr[it.r0] * qd, static_cast<size_t>(qd), shape_.num_heads, shape_.num_kv_heads,
                         shape_.head_dim, out + it.r0 * qd, static_cast<size_t>(qd),
                         attn_scratch_[static_cast<size_t>(thread)], it.g0, it.g1, it.s0, it.s1, attn_scale_,
                         window(layer), shape_.attn_softcap);
  };
  const int64_t n = static_cast<int64_t>(attn_items_.size());
  if (pool_ == nullptr) {
    for (int64_t i = 0; i < n; ++i) run(i, 0);
  } else {
    pool_->for_each(n, run);
  }
}

// Y[rows][out] = X[rows][in] · W: the quantised product when the checkpoint
// gave W in blocks and the engine runs the quantised kernels (quant_cpu.h;
// X is quantised per row block first); with the exact kernels, the float
// GEMM, or for a few rows (decoding) the same product read from W's packed
// blocks (packed_cpu.h: the same bits, a fifth of the bytes).
bool CpuBackend::packed_rows(int64_t rows, const QuantMatrix& Wq, const PackedMatrix& Wp) {
  return Wq.empty() && !Wp.empty() && rows <= kPackedMaxRows && packed_active_isa() != PackedIsa::kNone;
}

void CpuBackend::linear(const float* X, int64_t rows, int64_t in, const std::vector<float>& W, const QuantMatrix& Wq,
                        const PackedMatrix& Wp, int64_t out, float* Y) {
  if (Wq.empty()) {
    if (packed_rows(rows, Wq, Wp)) return packed_gemm(pool_.get(), X, rows, Wp, Y);
    return gemm_rows_pool(pool_.get(), X, rows, in, W.data(), out, Y);
  }
  quantize_rows(X, rows, in, &qx_);
  quant_gemm(pool_.get(), qx_, Wq, Y);
}

void CpuBackend::act_mul_range(float* gate, const float* up, int64_t j0, int64_t j1) const {
  if (shape_.mlp_gelu) return gelu_mul_range(gate, up, j0, j1);
  silu_mul_range(gate, up, j0, j1);
}

// gate[j] = act(gate[j]) * up[j] for j < n (element-wise: shared out in
// ranges when several threads may run it).
void CpuBackend::act_mul(float* gate, const float* up, int64_t n) {
  auto range = [this, gate, up](int64_t j0, int64_t j1) { act_mul_range(gate, up, j0, j1); };
  const int64_t parts = pool_ == nullptr ? 1 : std::min<int64_t>(pool_->size(), n / kMinParallelElems);
  if (parts <= 1) return range(0, n);
  pool_->for_each(parts, [&](int64_t p, int) { range(n * p / parts, n * (p + 1) / parts); });
}

void CpuBackend::decoder_layer(int32_t layer, const StepBatch& batch, float* hidden) {
  prepare_rows(batch);
  write_kv(layer, batch, hidden);
  helix_rows_.resize(static_cast<size_t>(batch.num_rows));
  for (int64_t r = 0; r < batch.num_rows; ++r) helix_rows_[static_cast<size_t>(r)] = r;
  attend_mlp(layer, batch, helix_rows_.data(), batch.num_rows, hidden);
}

double CpuBackend::step(const StepBatch& batch, int32_t* sampled, float* logits) {
  const auto t0 = std::chrono::steady_clock::now();
  moe_stats_.last_step_wait_ms = 0;
  const int64_t H = shape_.hidden_size, V = shape_.vocab_size;
  prepare_rows(batch);

  float* hidden = grow(hidden_, static_cast<size_t>(batch.num_rows * H));
  int64_t r = 0;
  for (const StepSeq& s : batch.seqs)
    for (int32_t t = 0; t < s.num_tokens; ++t, ++r) {
      weights_->embed(s.tokens[t], H, V, hidden + r * H);
      if (shape_.embedding_scale != 0)  // Granite
        for (int64_t i = 0; i < H; ++i) hidden[r * H + i] *= shape_.embedding_scale;
    }

  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    write_kv(l, batch, hidden);
    const bool last = l == shape_.num_layers - 1;
    // In the last layer only the sampled and the scored rows' outputs are
    // observable.
    helix_rows_.clear();
    int64_t first_row = 0;
    for (const StepSeq& s : batch.seqs) {
      for (int32_t t = 0; t < s.num_tokens; ++t)
        if (!last || (s.sample && t == s.num_tokens - 1) || (s.score_targets != nullptr && s.score_targets[t] >= 0))
          helix_rows_.push_back(first_row + t);
      first_row += s.num_tokens;
    }
    if (batch.cp != nullptr) {
      // Every member has the same rows (identical batches), so every member
      // makes the same number of exchanges.
      helix_attention(l, batch, helix_rows_);
      attend_mlp(l, batch, helix_rows_.data(), static_cast<int64_t>(helix_rows_.size()), hidden,
                 helix_attn_.data());
    } else {
      attend_mlp(l, batch, helix_rows_.data(), static_cast<int64_t>(helix_rows_.size()), hidden);
    }
  }

  // LM head: the sampled rows (the last row of each sampled sequence), in
  // batch order, as GEMMs of up to kLogitChunk rows, straight into the
  // caller's logits when it wants them.
  std::vector<int64_t>& srows = helix_rows_;  // reused: the layers are done
  srows.clear();
  int64_t end_row = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const StepSeq& s = batch.seqs[i];
    end_row += s.num_tokens;
    sampled[i] = -1;
    if (s.sample) srows.push_back(end_row - 1);
  }
  const int64_t ns = static_cast<int64_t>(srows.size());
  for (int64_t c0 = 0; c0 < ns; c0 += kLogitChunk) {
    const int64_t m = ns - c0 < kLogitChunk ? ns - c0 : kLogitChunk;
    float* x = grow(x_, static_cast<size_t>(m * H));
    for (int64_t j = 0; j < m; ++j)
      rms_norm(hidden + srows[static_cast<size_t>(c0 + j)] * H, weights_->final_norm.data(),
               shape_.hidden_size, shape_.rms_eps, x + j * H);
    float* lg = logits != nullptr ? logits + c0 * V : grow(logits_, static_cast<size_t>(m * V));
    linear(x, m, H, weights_->lm_head, weights_->q_lm_head, weights_->p_lm_head, V, lg);
    scale_logits(lg, m * V);
    for (int64_t j = 0; j < m; ++j) {
      const int32_t seq = row_seq_[srows[static_cast<size_t>(c0 + j)]];
      const StepSeq& s = batch.seqs[static_cast<size_t>(seq)];
      sampled[seq] = sample_token(lg + j * V, shape_.vocab_size, s.sampling, s.sample_pos(), &sampling_);
    }
  }
  if (batch.num_scored > 0) score_rows(batch, hidden);

  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// The scored rows' log-probabilities (eng_step_desc.score_targets): their
// logits through the LM head exactly as a sampled row's (GEMMs of up to
// kLogitChunk rows, whose rows do not depend on each other), then
// row_logprobs of each row's target into batch.score.
void CpuBackend::score_rows(const StepBatch& batch, const float* hidden) {
  const int64_t H = shape_.hidden_size, V = shape_.vocab_size;
  std::vector<int64_t>& rows = helix_rows_;
  rows.clear();
  score_target_.clear();
  score_top_.clear();
  int64_t first_row = 0;
  for (const StepSeq& s : batch.seqs) {
    if (s.score_targets != nullptr)
      for (int32_t t = 0; t < s.num_tokens; ++t)
        if (s.score_targets[t] >= 0) {
          rows.push_back(first_row + t);
          score_target_.push_back(s.score_targets[t]);
          score_top_.push_back(s.score_top);
        }
    first_row += s.num_tokens;
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  for (int64_t c0 = 0; c0 < n; c0 += kLogitChunk) {
    const int64_t m = n - c0 < kLogitChunk ? n - c0 : kLogitChunk;
    float* x = grow(x_, static_cast<size_t>(m * H));
    for (int64_t j = 0; j < m; ++j)
      rms_norm(hidden + rows[static_cast<size_t>(c0 + j)] * H, weights_->final_norm.data(), shape_.hidden_size,
               shape_.rms_eps, x + j * H);
    float* lg = grow(logits_, static_cast<size_t>(m * V));
    linear(x, m, H, weights_->lm_head, weights_->q_lm_head, weights_->p_lm_head, V, lg);
    scale_logits(lg, m * V);
    for (int64_t j = 0; j < m; ++j) {
      const size_t k = static_cast<size_t>(c0 + j);
      const int64_t r = rows[k];
      row_logprobs(lg + j * V, shape_.vocab_size, score_target_[k], score_top_[k], batch.score.logprobs + r,
                   batch.score.top_ids + r * ENG_MAX_LOGPROBS, batch.score.top_logprobs + r * ENG_MAX_LOGPROBS);
      batch.score.ranks[r] = row_rank(lg + j * V, shape_.vocab_size, score_target_[k]);
    }
  }
}

// Helix attention of `rows` in one layer: the partials of this rank's pages
// for every (row, head), one exchange, then every member merges all partials
// in global page order (attention_partial.h), exactly as a single rank would.
// Partial record: m, l, o[head_dim] as floats. Rank k's buffer holds, per row
// in order, per head, its pages g ≡ k (mod cp) with g ≤ pos / P in order.
void CpuBackend::helix_attention(int32_t layer, const StepBatch& batch, const std::vector<int64_t>& rows) {
  const int32_t P = tokens_per_page_, cp = batch.cp->size(), me = batch.cp->rank();
  // GQA: query head h reads kv head h / group, K and V of head_dim each. MLA:
  // every head reads the one latent plane, K of kv_lora + rope, V its first
  // kv_lora (engine.h).
  const int32_t heads = shape_.num_heads, group = heads / shape_.num_kv_heads;
  const int32_t dk = mla_ ? shape_.kv_lora_rank + shape_.qk_rope_head_dim : shape_.head_dim;
  const int32_t dv = mla_ ? shape_.kv_lora_rank : shape_.head_dim;
  const size_t rec = static_cast<size_t>(dv) + 2;
  const size_t stride = static_cast<size_t>(device_.kv_width());
  const float scale = attn_scale_;  // (1/sqrt(head_dim) for GQA unless Granite's multiplier)
  const int64_t qd = query_width(), od = attn_width();
  // Pages g <= last with g % cp == k.
  auto owned = [cp](int32_t last, int32_t k) -> int32_t { return last >= k ? (last - k) / cp + 1 : 0; };
  // A sliding layer's rows read the pages from their window's first
  // position on: a row's first page, and (its first slot of that page).
  const int32_t win = window(layer);
  auto first_pos = [win](int32_t pos) { return win > 0 && pos - win + 1 > 0 ? pos - win + 1 : 0; };
  size_t local_recs = 0;
  for (int64_t row : rows) {
    const int32_t pos = row_pos_[row], first = first_pos(pos) / P;
    local_recs += static_cast<size_t>(heads) * (owned(pos / P, me) - owned(first - 1, me));
  }
  float* local = grow(helix_local_, local_recs * rec);
  AttnScratch& scratch = attn_scratch_[0];
  if (scratch.scores.size() < static_cast<size_t>(P)) scratch.scores.resize(P);
  float* out = local;
  for (int64_t row : rows) {
    const StepSeq& s = batch.seqs[static_cast<size_t>(row_seq_[row])];
    const int32_t pos = row_pos_[row], last = pos / P, fp = first_pos(pos), first = fp / P;
    const float* q = q_.data() + row * qd;
    for (int32_t h = 0; h < heads; ++h) {
      const size_t head_off = mla_ ? 0 : static_cast<size_t>(h / group) * dk;
      for (int32_t g = first + ((me - first % cp) + cp) % cp; g <= last; g += cp) {
        const int32_t lo = g == first ? fp % P : 0;
        const int32_t n = (g < last ? P : pos % P + 1) - lo;
        const int32_t page = s.blocks[g / cp];
        const float* planes = device_.kv(page, layer, 0);
        // GQA: this kv head's K as stored, [dk][slot]; MLA: the latent, row-major.
        const size_t k_slot = mla_ ? stride : 1, k_dim = mla_ ? 1 : P;
        const float* k = (mla_ ? planes : planes + device_.k_index(0, static_cast<int32_t>(head_off))) + lo * k_slot;
        const float* v = (mla_ ? planes : device_.kv(page, layer, 1) + head_off) + lo * stride;
        attn_page_partial(q + static_cast<size_t>(h) * dk, scale, k, k_slot, k_dim, v, stride, n, dk, dv,
                          scratch.scores.data(), &out[0], &out[1], out + 2, shape_.attn_softcap);
        out += rec;
      }
    }
  }
  batch.cp->allgather(ExchangeTag{ExchangeKind::kHelixAttention, layer}, local, local_recs * rec * sizeof(float),
                      &helix_all_);
  // Merge in global page order, reading page g's partial from rank g % cp.
  std::vector<size_t> cursor(static_cast<size_t>(cp), 0);  // per rank, in records
  float* attn = grow(helix_attn_, rows.size() * static_cast<size_t>(od));
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t last = row_pos_[rows[i]] / P, first = first_pos(row_pos_[rows[i]]) / P;
    for (int32_t h = 0; h < heads; ++h) {
      float* O = attn + i * od + static_cast<size_t>(h) * dv;
      float M = -INFINITY, L = 0.0f;
      for (int32_t g = first; g <= last; ++g) {
        const int32_t k = g % cp;
        const std::vector<char>& buf = helix_all_[static_cast<size_t>(k)];
        const size_t at = cursor[static_cast<size_t>(k)]++ * rec;
        if ((at + rec) * sizeof(float) > buf.size())
          throw EngineError(ENG_COMM_ERROR, "Helix CP exchange: a member sent fewer attention partials than its pages");
        const float* p = reinterpret_cast<const float*>(buf.data()) + at;
        attn_merge(&M, &L, O, p[0], p[1], p + 2, dv);
      }
      attn_finish(O, L, O, dv);
    }
  }
}

void CpuBackend::copy_pages(eng_tier src_tier, const int32_t* src, eng_tier dst_tier,
                            const int32_t* dst, int32_t n) {
  PageSlab& from = src_tier == ENG_TIER_HOST ? host_ : device_;
  PageSlab& to = dst_tier == ENG_TIER_HOST ? host_ : device_;
  const size_t floats = device_.page_floats();
  for (int32_t k = 0; k < n; ++k) {
    const float* a = from.page(src[k]);
    float* b = to.page(dst[k]);
    if (a != b) std::memcpy(b, a, sizeof(float) * floats);
  }
}

}  // namespace lockstep
