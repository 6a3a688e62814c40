// test_mla: multi-head latent attention (DeepSeek's MLA) on the CPU backend.
//
// (a) One MLA decoder layer (q LoRA, latent KV in the pages, YaRN RoPE, a
//     dense MLP) against a float64 implementation of the un-absorbed form:
//     per head k_nope = c·W_kb[h]ᵀ and v = c·W_vb[h] decompressed for every
//     cached position, then ordinary softmax attention. The engine computes
//     the absorbed form (q_nope folded into the latent space), so this checks
//     the algebra as well as the arithmetic.
// (b) The page slab holds one latent plane of kv_lora_rank + rope floats per
//     token and layer, and the latent the engine stored equals the float64
//     one.
// (c) deepseek-tiny (MLA + leading dense layer + grouped sigmoid routing)
//     gives the same bits whether a prompt is fed whole, in chunks or token
//     by token, alone or beside another sequence.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"
#include "checkpoint.h"
#include "model_cpu.h"
#include "test_engine.h"

using namespace lockstep;

namespace {

using Vec = std::vector<double>;

// y = x · W with W input-major [in][out] (W may be a slice: `at` floats in).
Vec matvec(const Vec& x, const float* W, size_t out) {
  Vec y(out, 0.0);
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t o = 0; o < out; ++o) y[o] += x[i] * double(W[i * out + o]);
  return y;
}

Vec rms_norm(const Vec& x, const float* w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * double(w[i]);
  return y;
}

double mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

// Hugging Face DeepSeek-V3's YaRN inverse frequencies, written out again.
Vec yarn_inv_freq(const eng_model_shape& s) {
  const int dim = s.qk_rope_head_dim;
  const double base = s.rope_theta, pi = std::acos(-1.0);
  auto corr = [&](double rot) {
    return dim * std::log(s.yarn_original_max_positions / (rot * 2 * pi)) / (2 * std::log(base));
  };
  const double lo = std::max(std::floor(corr(s.yarn_beta_fast)), 0.0);
  double hi = std::min(std::ceil(corr(s.yarn_beta_slow)), double(dim - 1));
  if (lo == hi) hi += 0.001;
  Vec f(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const double extra = 1.0 / std::pow(base, 2.0 * i / dim), inter = extra / s.yarn_factor;
    const double mask = 1.0 - std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    f[i] = inter * (1 - mask) + extra * mask;
  }
  return f;
}

// Rotate-half RoPE of dim values at x[0..dim) with cos/sin scaled by mag.
void rope(double* x, int dim, int pos, const Vec& inv_freq, double mag) {
  for (int i = 0; i < dim / 2; ++i) {
    const double a = pos * inv_freq[i], c = std::cos(a) * mag, sn = std::sin(a) * mag;
    const double x0 = x[i], x1 = x[dim / 2 + i];
    x[i] = x0 * c - x1 * sn;
    x[dim / 2 + i] = x1 * c + x0 * sn;
  }
}

eng_model_shape test_shape() {
  eng_model_shape s{};
  s.num_layers = 2;
  s.hidden_size = 32;
  s.num_heads = s.num_kv_heads = 4;
  s.qk_nope_head_dim = 8;
  s.qk_rope_head_dim = 4;
  s.head_dim = 12;
  s.intermediate_size = 48;
  s.vocab_size = 64;
  s.rope_theta = 10000.0f;
  s.rms_eps = 1e-6f;
  s.num_experts = 4;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = 8;
  s.num_shared_experts = 1;
  s.router_norm = ENG_ROUTER_SIGMOID_TOPK;
  s.first_dense_layers = 1;
  s.routed_scaling_factor = 2.0f;
  s.expert_groups = 2;
  s.expert_groups_used = 1;
  s.q_lora_rank = 16;
  s.kv_lora_rank = 8;
  s.v_head_dim = 6;
  s.yarn_factor = 4.0f;
  s.yarn_original_max_positions = 8;
  s.yarn_beta_fast = 32.0f;
  s.yarn_beta_slow = 1.0f;
  s.yarn_mscale = 0.707f;  // != mscale_all_dim: the cos/sin magnitude is not 1
  s.yarn_mscale_all_dim = 1.0f;
  return s;
}

void check_layer_reference() {
  EngineParams p;
  p.shape = test_shape();
  p.seed = 31;
  p.num_pages = 10;
  p.tokens_per_page = 4;
  const eng_model_shape& s = p.shape;
  const int H = s.hidden_size, heads = s.num_heads, N = s.qk_nope_head_dim, R = s.qk_rope_head_dim;
  const int KL = s.kv_lora_rank, QL = s.q_lora_rank, Vh = s.v_head_dim, F = s.intermediate_size;
  const int P = p.tokens_per_page, Lw = KL + R, qh = N + R;
  CpuBackend be(p);
  CHECK(be.device_pages().kv_width() == Lw);
  CHECK(be.device_pages().page_floats() == size_t(s.num_layers) * P * Lw);  // one plane, not K and V

  // A prefix of 11 tokens (past the YaRN original context of 8) in the pages.
  const int prefix = 11, chunk = 6, layer = 0;
  const std::vector<int32_t> blocks = {7, 2, 9, 0, 5};
  std::vector<int32_t> prompt;
  for (int i = 0; i < prefix; ++i) prompt.push_back((i * 13 + 5) % s.vocab_size);
  StepBatch pre;
  pre.seqs.push_back({prompt.data(), prefix, 0, blocks.data(), 5, false, {0.0f, 0, 1.0f, 0}});
  pre.num_rows = prefix;
  int32_t sampled = 0;
  be.step(pre, &sampled, nullptr);

  std::vector<Vec> lat;  // the prefix's latents as stored
  for (int t = 0; t < prefix; ++t) {
    const float* l = be.device_pages().kv(blocks[t / P], layer, 0) + (t % P) * Lw;
    lat.emplace_back(l, l + Lw);
  }
  std::vector<float> hidden(chunk * H);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::sin(0.37 * double(i) + 0.1) * 1.5f;
  std::vector<int32_t> chunk_tokens(chunk, 1);
  StepBatch b;
  b.seqs.push_back({chunk_tokens.data(), chunk, prefix, blocks.data(), 5, true, {0.0f, 0, 1.0f, 0}});
  b.num_rows = chunk;

  // Float64 reference, un-absorbed.
  const LayerWeights& w = be.weights().layers[layer];
  const Vec inv_freq = yarn_inv_freq(s);
  const double mag = mscale(s.yarn_factor, s.yarn_mscale) / mscale(s.yarn_factor, s.yarn_mscale_all_dim);
  const double ms = mscale(s.yarn_factor, s.yarn_mscale_all_dim);
  const double scale = ms * ms / std::sqrt(double(qh));
  std::vector<Vec> qs(chunk), out(chunk);
  for (int r = 0; r < chunk; ++r) {
    const Vec h(hidden.begin() + r * H, hidden.begin() + (r + 1) * H);
    const Vec x = rms_norm(h, w.attn_norm.data(), s.rms_eps);
    const Vec cq = rms_norm(matvec(x, w.wq_a.data(), QL), w.q_a_norm.data(), s.rms_eps);
    qs[r] = matvec(cq, w.wq.data(), size_t(heads) * qh);
    for (int hd = 0; hd < heads; ++hd) rope(qs[r].data() + hd * qh + N, R, prefix + r, inv_freq, mag);
    Vec kv = matvec(x, w.wkv_a.data(), Lw);
    const Vec c = rms_norm(Vec(kv.begin(), kv.begin() + KL), w.kv_a_norm.data(), s.rms_eps);
    std::copy(c.begin(), c.end(), kv.begin());
    rope(kv.data() + KL, R, prefix + r, inv_freq, mag);
    lat.push_back(kv);
  }
  for (int r = 0; r < chunk; ++r) {
    const int pos = prefix + r;
    Vec o(size_t(heads) * Vh, 0.0);
    for (int hd = 0; hd < heads; ++hd) {
      const float* kb = w.w_kb.data() + size_t(hd) * N * KL;  // [N][KL]
      const float* vb = w.w_vb.data() + size_t(hd) * KL * Vh;  // [KL][Vh]
      Vec sc(pos + 1);
      double mx = -INFINITY, l = 0;
      for (int t = 0; t <= pos; ++t) {
        double dot = 0;
        for (int n = 0; n < N; ++n) {
          double k = 0;  // k_nope[t][n] = Σ_c c_t[c] W_kb[n][c]
          for (int cc = 0; cc < KL; ++cc) k += lat[t][cc] * double(kb[n * KL + cc]);
          dot += qs[r][hd * qh + n] * k;
        }
        for (int d = 0; d < R; ++d) dot += qs[r][hd * qh + N + d] * lat[t][KL + d];
        sc[t] = dot * scale;
        mx = std::max(mx, sc[t]);
      }
      for (auto& v : sc) l += (v = std::exp(v - mx));
      for (int t = 0; t <= pos; ++t) {
        const Vec v = matvec(Vec(lat[t].begin(), lat[t].begin() + KL), vb, Vh);
        for (int d = 0; d < Vh; ++d) o[hd * Vh + d] += sc[t] / l * v[d];
      }
    }
    Vec h(hidden.begin() + r * H, hidden.begin() + (r + 1) * H);
    const Vec a = matvec(o, w.wo.data(), H);
    for (int i = 0; i < H; ++i) h[i] += a[i];
    const Vec x = rms_norm(h, w.mlp_norm.data(), s.rms_eps);
    Vec gate = matvec(x, w.w_gate.data(), F);
    const Vec up = matvec(x, w.w_up.data(), F);
    for (int j = 0; j < F; ++j) gate[j] = gate[j] / (1.0 + std::exp(-gate[j])) * up[j];
    const Vec down = matvec(gate, w.w_down.data(), H);
    for (int i = 0; i < H; ++i) h[i] += down[i];
    out[r] = h;
  }

  be.decoder_layer(layer, b, hidden.data());

  double worst_h = 0, worst_lat = 0;
  for (int r = 0; r < chunk; ++r) {
    double rms = 0;
    for (double v : out[r]) rms += v * v;
    rms = std::sqrt(rms / H);
    for (int i = 0; i < H; ++i) {
      const double err = std::fabs(hidden[r * H + i] - out[r][i]) / rms;
      worst_h = std::max(worst_h, err);
      CHECKF(err < 1e-5, "row %d hidden[%d]: got %.9g want %.9g", r, i, hidden[r * H + i], out[r][i]);
    }
    const int pos = prefix + r;
    const float* l = be.device_pages().kv(blocks[pos / P], layer, 0) + (pos % P) * Lw;
    for (int i = 0; i < Lw; ++i) {
      const double e = std::fabs(l[i] - lat[pos][i]) / (1 + std::fabs(lat[pos][i]));
      worst_lat = std::max(worst_lat, e);
      CHECKF(e < 1e-5, "row %d latent[%d]: got %g want %g", r, i, l[i], lat[pos][i]);
    }
  }
  std::printf("MLA layer vs float64 (un-absorbed): worst hidden error %.3g (of row RMS), worst latent error %.3g\n",
              worst_h, worst_lat);
}

// deepseek-tiny: one prompt fed whole, in chunks of 5 and token by token,
// alone and beside another sequence: the same sampled tokens and logits.
void check_chunking() {
  const int32_t V = 512, P = 8, len = 29, decode = 5;
  const std::vector<int32_t> prompt = test_prompt(5, len, V);
  const std::vector<int32_t> other = test_prompt(6, 13, V);
  auto run = [&](int32_t chunk, bool neighbour, int32_t threads) {
    eng_engine_config c = test_config("deepseek-tiny", 32, P);
    c.num_threads = threads;
    return test_chunked_run(c, V, prompt, other, chunk, neighbour, decode);
  };
  const TestRun ref = run(len, false, 1);
  CHECK(ref.tokens.size() == size_t(decode + 1));
  for (auto [chunk, neighbour, threads] : {std::tuple{5, false, 1}, std::tuple{1, false, 1}, std::tuple{7, true, 1},
                                           std::tuple{len, true, 3}, std::tuple{4, false, 2}}) {
    CHECKF(run(chunk, neighbour, threads) == ref, "chunk %d neighbour %d threads %d: tokens or logits differ", chunk,
           neighbour, threads);
  }
}

}  // namespace

int main() {
  check_layer_reference();
  check_chunking();
  return check_exit_code("test_mla");
}
