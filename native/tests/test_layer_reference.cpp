// (b) One full decoder layer of the CPU backend (float32) against a separate
// float64 implementation of the same layer: RMSNorm, QKV, rotate-half RoPE,
// K/V written to the pages, causal paged GQA attention over a prefix already
// in the pages plus the chunk, output projection and residual, RMSNorm, SwiGLU
// MLP and residual.
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "model_cpu.h"

using namespace lockstep;

namespace {

using Vec = std::vector<double>;

// Slot s's K of `layer` in page p as the slab keeps it (page_slab.h: a K
// plane is stored [kv_head][head_dim][slot]).
Vec stored_k(const PageSlab& slab, int32_t p, int32_t layer, int32_t s, int32_t kvd) {
  const float* K = slab.kv(p, layer, 0);
  Vec k(static_cast<size_t>(kvd));
  for (int32_t c = 0; c < kvd; ++c) k[static_cast<size_t>(c)] = K[slab.k_index(s, c)];
  return k;
}

// y = x · W with W input-major [in][out].
Vec matvec(const Vec& x, const std::vector<float>& W, size_t out) {
  Vec y(out, 0.0);
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t o = 0; o < out; ++o) y[o] += x[i] * double(W[i * out + o]);
  return y;
}

Vec rms_norm(const Vec& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * double(w[i]);
  return y;
}

// Rotate-half RoPE over `heads` heads of x.
void rope(Vec& x, int heads, int D, int pos, double theta) {
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < D / 2; ++i) {
      const double a = pos * std::pow(theta, -2.0 * i / D);
      double& x0 = x[h * D + i];
      double& x1 = x[h * D + D / 2 + i];
      const double r0 = x0 * std::cos(a) - x1 * std::sin(a);
      const double r1 = x1 * std::cos(a) + x0 * std::sin(a);
      x0 = r0;
      x1 = r1;
    }
}

}  // namespace

int main() {
  EngineParams p;
  p.shape = {2, 32, 4, 2, 8, 48, 64, 10000.0f, 1e-5f, 0, 0, 0, 0, 0};
  p.seed = 99;
  p.num_pages = 10;
  p.tokens_per_page = 4;
  const eng_model_shape& s = p.shape;
  const int H = s.hidden_size, D = s.head_dim, qd = s.num_heads * D, kvd = s.num_kv_heads * D;
  const int F = s.intermediate_size, P = p.tokens_per_page, group = s.num_heads / s.num_kv_heads;
  CpuBackend be(p);

  // A prefix of 10 tokens fills positions [0, 10) of every layer's pages.
  const int prefix = 10, chunk = 6, layer = 1;
  const std::vector<int32_t> blocks = {7, 2, 9, 0, 5};  // covers 20 positions
  std::vector<int32_t> prompt;
  for (int i = 0; i < prefix; ++i) prompt.push_back((i * 13 + 5) % s.vocab_size);
  StepBatch pre;
  pre.seqs.push_back({prompt.data(), prefix, 0, blocks.data(), 5, false, {0.0f, 0, 1.0f, 0}});
  pre.num_rows = prefix;
  int32_t sampled = 0;
  be.step(pre, &sampled, nullptr);
  CHECK(sampled == -1);

  // Snapshot of layer 1's prefix K/V as the reference's input.
  std::vector<Vec> keys, vals;
  for (int t = 0; t < prefix; ++t) {
    const float* v = be.device_pages().kv(blocks[t / P], layer, 1) + (t % P) * kvd;
    keys.push_back(stored_k(be.device_pages(), blocks[t / P], layer, t % P, kvd));
    vals.emplace_back(v, v + kvd);
  }

  // The chunk's hidden inputs: arbitrary values of unit scale.
  std::vector<float> hidden(chunk * H);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::sin(0.37 * double(i) + 0.1) * 1.5f;
  std::vector<int32_t> chunk_tokens(chunk, 1);  // unused by a single layer
  StepBatch b;
  b.seqs.push_back({chunk_tokens.data(), chunk, prefix, blocks.data(), 5, true, {0.0f, 0, 1.0f, 0}});
  b.num_rows = chunk;

  // Reference, float64.
  const LayerWeights& w = be.weights().layers[layer];
  std::vector<Vec> out(chunk), qs(chunk);
  for (int r = 0; r < chunk; ++r) {
    const Vec h(hidden.begin() + r * H, hidden.begin() + (r + 1) * H);
    const Vec x = rms_norm(h, w.attn_norm, s.rms_eps);
    qs[r] = matvec(x, w.wq, qd);
    Vec k = matvec(x, w.wk, kvd), v = matvec(x, w.wv, kvd);
    rope(qs[r], s.num_heads, D, prefix + r, s.rope_theta);
    rope(k, s.num_kv_heads, D, prefix + r, s.rope_theta);
    keys.push_back(k);
    vals.push_back(v);
  }
  for (int r = 0; r < chunk; ++r) {
    const int pos = prefix + r;
    Vec attn(qd, 0.0);
    for (int hd = 0; hd < s.num_heads; ++hd) {
      const int g = hd / group;
      Vec sc(pos + 1);
      double mx = -INFINITY, l = 0;
      for (int t = 0; t <= pos; ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qs[r][hd * D + d] * keys[t][g * D + d];
        sc[t] = dot / std::sqrt(double(D));
        mx = std::max(mx, sc[t]);
      }
      for (auto& v : sc) l += (v = std::exp(v - mx));
      for (int t = 0; t <= pos; ++t)
        for (int d = 0; d < D; ++d) attn[hd * D + d] += sc[t] / l * vals[t][g * D + d];
    }
    Vec h(hidden.begin() + r * H, hidden.begin() + (r + 1) * H);
    const Vec o = matvec(attn, w.wo, H);
    for (int i = 0; i < H; ++i) h[i] += o[i];
    const Vec x = rms_norm(h, w.mlp_norm, s.rms_eps);
    Vec gate = matvec(x, w.w_gate, F);
    const Vec up = matvec(x, w.w_up, F);
    for (int j = 0; j < F; ++j) gate[j] = gate[j] / (1.0 + std::exp(-gate[j])) * up[j];
    const Vec down = matvec(gate, w.w_down, H);
    for (int i = 0; i < H; ++i) h[i] += down[i];
    out[r] = h;
  }

  // Engine, float32.
  be.decoder_layer(layer, b, hidden.data());

  // Errors relative to the row's RMS (values are O(1); sums may cancel).
  double worst_h = 0, worst_kv = 0;
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
    const Vec k = stored_k(be.device_pages(), blocks[pos / P], layer, pos % P, kvd);
    const float* v = be.device_pages().kv(blocks[pos / P], layer, 1) + (pos % P) * kvd;
    for (int i = 0; i < kvd; ++i) {
      const double ek = std::fabs(k[i] - keys[pos][i]) / (1 + std::fabs(keys[pos][i]));
      const double ev = std::fabs(v[i] - vals[pos][i]) / (1 + std::fabs(vals[pos][i]));
      worst_kv = std::max(worst_kv, std::max(ek, ev));
      CHECKF(ek < 1e-5 && ev < 1e-5, "row %d K/V[%d]: got %g/%g want %g/%g", r, i, k[i], v[i],
             keys[pos][i], vals[pos][i]);
    }
  }
  std::printf("layer vs float64: worst hidden error %.3g (of row RMS), worst K/V error %.3g\n", worst_h,
              worst_kv);
  return check_exit_code("test_layer_reference");
}
