// (a) Paged GQA attention (float32, page-by-page partials merged in page
// order) against a straightforward float64 softmax attention, for several page
// sizes and head groupings, at every position of a chunk that follows a prefix.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>

#include "attention_cpu.h"
#include "check.h"
#include "page_slab.h"

using namespace lockstep;

namespace {

// Uniform in [-1, 1) from a xorshift state.
float rnd(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return static_cast<float>(x >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

struct Case {
  int32_t tokens_per_page, heads, kv_heads, head_dim, prefix, chunk;
  float q_scale;  // large values make the softmax peaked (tests the max tracking)
};

void run_case(const Case& c, uint64_t seed) {
  const int32_t layers = 2, layer = 1;  // test the second layer's offsets
  const int32_t ctx = c.prefix + c.chunk;
  const int32_t P = c.tokens_per_page;
  const int32_t num_blocks = (ctx + P - 1) / P;
  const int32_t num_pages = num_blocks + 3;
  const int32_t kvw = c.kv_heads * c.head_dim;
  PageSlab slab(num_pages, P, layers, kvw);
  uint64_t x = seed;
  for (int32_t p = 0; p < num_pages; ++p)
    for (size_t i = 0; i < slab.page_floats(); ++i) slab.page(p)[i] = rnd(x);
  // Physical pages in a scrambled order: the block table decides.
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b < num_blocks; ++b) blocks.push_back((b * 7 + 2) % num_pages);
  // (7 is coprime with every num_pages used below, so blocks are distinct.)

  const int32_t qd = c.heads * c.head_dim, group = c.heads / c.kv_heads;
  std::vector<float> q(qd), out(qd);
  AttnScratch scratch;
  double worst = 0;
  for (int32_t pos = c.prefix; pos < ctx; ++pos) {
    for (auto& v : q) v = rnd(x) * c.q_scale;
    paged_attention_row(slab, layer, blocks.data(), pos, q.data(), c.heads, c.kv_heads, c.head_dim,
                        out.data(), scratch);
    for (int32_t h = 0; h < c.heads; ++h) {
      const int32_t g = h / group;
      std::vector<double> s(pos + 1);
      double mx = -INFINITY;
      for (int32_t t = 0; t <= pos; ++t) {
        const float* k = slab.kv(blocks[t / P], layer, 0);
        double dot = 0;
        for (int32_t d = 0; d < c.head_dim; ++d)
          dot += double(q[h * c.head_dim + d]) * k[slab.k_index(t % P, g * c.head_dim + d)];
        s[t] = dot / std::sqrt(double(c.head_dim));
        mx = std::max(mx, s[t]);
      }
      double l = 0;
      for (auto& v : s) l += (v = std::exp(v - mx));
      for (int32_t d = 0; d < c.head_dim; ++d) {
        // Error relative to the magnitude of the summed terms (Σ p|v|), not
        // of the sum, which may cancel to near zero.
        double o = 0, mag = 0;
        for (int32_t t = 0; t <= pos; ++t) {
          const double v = slab.kv(blocks[t / P], layer, 1)[(t % P) * kvw + g * c.head_dim + d];
          o += s[t] * v;
          mag += s[t] * std::fabs(v);
        }
        o /= l;
        mag /= l;
        const double got = out[h * c.head_dim + d];
        const double err = std::fabs(got - o) / mag;
        worst = std::max(worst, err);
        CHECKF(err < 1e-5, "P=%d heads=%d/%d pos=%d head=%d d=%d got %.9g want %.9g", P, c.heads,
               c.kv_heads, pos, h, d, got, o);
      }
    }
  }
  std::printf("P=%-3d heads=%d/%d D=%d ctx=%d q_scale=%g: worst relative error %.3g\n", P, c.heads,
              c.kv_heads, c.head_dim, ctx, c.q_scale, worst);
}

// paged_attention_rows over a chunk's rows (any run of them) gives every row
// exactly the bits paged_attention_row gives it alone.
void rows_equal_row(const Case& c, uint64_t seed) {
  const int32_t layers = 2, layer = 0;
  const int32_t ctx = c.prefix + c.chunk, P = c.tokens_per_page;
  const int32_t num_blocks = (ctx + P - 1) / P, num_pages = num_blocks + 1;
  const int32_t kvw = c.kv_heads * c.head_dim, qd = c.heads * c.head_dim;
  PageSlab slab(num_pages, P, layers, kvw);
  uint64_t x = seed;
  for (int32_t p = 0; p < num_pages; ++p)
    for (size_t i = 0; i < slab.page_floats(); ++i) slab.page(p)[i] = rnd(x);
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b < num_blocks; ++b) blocks.push_back(num_pages - 1 - b);
  std::vector<float> q(static_cast<size_t>(c.chunk) * qd), want(q.size()), got(q.size());
  for (auto& v : q) v = rnd(x) * c.q_scale;
  std::vector<int32_t> pos(c.chunk);
  AttnScratch a, b;
  for (int32_t r = 0; r < c.chunk; ++r) {
    pos[r] = c.prefix + r;
    paged_attention_row(slab, layer, blocks.data(), pos[r], q.data() + r * qd, c.heads, c.kv_heads, c.head_dim,
                        want.data() + r * qd, a);
  }
  // The whole chunk at once, then in runs of 3 rows.
  paged_attention_rows(slab, layer, blocks.data(), pos.data(), c.chunk, q.data(), qd, c.heads, c.kv_heads,
                       c.head_dim, got.data(), qd, b);
  CHECKF(std::memcmp(want.data(), got.data(), sizeof(float) * want.size()) == 0,
         "rows != row (P %d, heads %d/%d, D %d, prefix %d, chunk %d)", P, c.heads, c.kv_heads, c.head_dim, c.prefix,
         c.chunk);
  std::fill(got.begin(), got.end(), 0.0f);
  for (int32_t r0 = 0; r0 < c.chunk; r0 += 3) {
    const int32_t n = std::min(3, c.chunk - r0);
    paged_attention_rows(slab, layer, blocks.data(), pos.data() + r0, n, q.data() + r0 * qd, qd, c.heads,
                         c.kv_heads, c.head_dim, got.data() + r0 * qd, qd, b);
  }
  CHECKF(std::memcmp(want.data(), got.data(), sizeof(float) * want.size()) == 0, "runs of 3 rows != row");
  // Each (kv head, query head of its group) alone, as threads share out a
  // decode of few sequences (CpuBackend::attend).
  std::fill(got.begin(), got.end(), 0.0f);
  const int32_t group = c.heads / c.kv_heads;
  for (int32_t g = 0; g < c.kv_heads; ++g)
    for (int32_t h = 0; h < group; ++h)
      paged_attention_rows(slab, layer, blocks.data(), pos.data(), c.chunk, q.data(), qd, c.heads, c.kv_heads,
                           c.head_dim, got.data(), qd, b, g, g + 1, h, h + 1);
  CHECKF(std::memcmp(want.data(), got.data(), sizeof(float) * want.size()) == 0, "one query head at a time != row");
}

}  // namespace

int main() {
  const Case cases[] = {
      {1, 4, 2, 8, 5, 4, 1.0f},     {3, 4, 2, 8, 10, 9, 1.0f},   {4, 8, 2, 16, 0, 13, 2.0f},
      {16, 4, 1, 16, 37, 20, 1.0f}, {16, 2, 2, 32, 60, 8, 4.0f}, {64, 8, 4, 8, 100, 40, 1.0f},
      {5, 6, 3, 4, 23, 1, 8.0f},
  };
  uint64_t seed = 12345;
  for (const Case& c : cases) run_case(c, seed++);
  for (const Case& c : cases) rows_equal_row(c, seed++);
  // Real shapes: head_dim 64 and 128 (register blocks of 16 with and without tails).
  const Case real[] = {{16, 9, 3, 64, 40, 37, 1.0f}, {16, 8, 2, 128, 0, 33, 2.0f}, {32, 4, 4, 64, 17, 50, 1.0f},
                       {8, 4, 2, 72, 3, 19, 1.0f}};
  for (const Case& c : real) rows_equal_row(c, seed++);
  return check_exit_code("test_attention_reference");
}
