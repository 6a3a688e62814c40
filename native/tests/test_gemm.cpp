// gemm_rows (gemm_cpu.h) is bit-identical to the reference matvec: for random
// shapes (odd sizes, every row and column tail), on every implementation this
// CPU can run, each row equals the scalar matvec of that row alone (memcmp),
// whatever the number of rows and the row's position in the block. Also checks
// signed zeros, infinities and NaN propagate as mul-then-add does, and that
// products are rounded before the add (no FMA contraction).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "gemm_cpu.h"

using lockstep::GemmIsa;

namespace {

// The reference: y[o] = 0, then y[o] += x[i] * w[i][o] for i ascending, one
// element at a time (volatile keeps the compiler from fusing or vectorising).
void ref_matvec(const float* x, const float* W, int64_t in, int64_t out, float* y) {
  for (int64_t o = 0; o < out; ++o) {
    volatile float acc = 0.0f;
    for (int64_t i = 0; i < in; ++i) {
      volatile float p = x[i] * W[i * out + o];
      acc = acc + p;
    }
    y[o] = acc;
  }
}

uint64_t rng_state = 0x1234567887654321ull;
uint64_t next_u64() {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
int64_t rand_int(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next_u64() % (hi - lo + 1)); }
// Values with varied exponents, so that the rounding of products and sums is
// exercised (and any reassociation or fusion would show).
float rand_float() {
  const float m = static_cast<float>(next_u64() >> 40) / 16777216.0f * 2.0f - 1.0f;
  const int e = static_cast<int>(next_u64() % 16) - 8;
  return std::ldexp(m, e);
}

const GemmIsa kAll[] = {GemmIsa::kScalar, GemmIsa::kPortable, GemmIsa::kAvx2, GemmIsa::kAvx512};

// Checks every supported ISA on X[rows][in] · W[in][out] against ref_matvec
// per row.
void check_shape(const std::vector<float>& X, int64_t rows, int64_t in, const std::vector<float>& W,
                 int64_t out) {
  std::vector<float> want(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r) ref_matvec(X.data() + r * in, W.data() + 0, in, out, want.data() + r * out);
  for (GemmIsa isa : kAll) {
    if (!lockstep::gemm_isa_supported(isa)) continue;
    // Guard words around Y catch out-of-range stores.
    std::vector<float> Y(static_cast<size_t>(rows * out + 32), 12345.0f);
    lockstep::gemm_rows_isa(isa, X.data(), rows, in, W.data(), out, Y.data() + 16);
    const bool same = std::memcmp(Y.data() + 16, want.data(), sizeof(float) * want.size()) == 0;
    if (!same)
      std::fprintf(stderr, "gemm %s differs: rows=%lld in=%lld out=%lld\n", lockstep::gemm_isa_name(isa),
                   static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out));
    CHECK(same);
    for (int k = 0; k < 16; ++k) {
      CHECK(Y[k] == 12345.0f);
      CHECK(Y[16 + rows * out + k] == 12345.0f);
    }
    // Each row alone, and the rows in every sub-range starting at an offset,
    // give the same bits (a row's result does not depend on its block).
    const int64_t off = rows > 1 ? rand_int(1, rows - 1) : 0;
    std::vector<float> Y2(static_cast<size_t>((rows - off) * out));
    lockstep::gemm_rows_isa(isa, X.data() + off * in, rows - off, in, W.data(), out, Y2.data());
    CHECK(std::memcmp(Y2.data(), want.data() + off * out, sizeof(float) * Y2.size()) == 0);
    std::vector<float> y1(static_cast<size_t>(out));
    const int64_t r = rand_int(0, rows - 1);
    lockstep::gemm_rows_isa(isa, X.data() + r * in, 1, in, W.data(), out, y1.data());
    CHECK(std::memcmp(y1.data(), want.data() + r * out, sizeof(float) * y1.size()) == 0);
    // A column range alone (a thread's share): the same bits in it, nothing
    // written outside it.
    const int64_t o0 = rand_int(0, out - 1), o1 = rand_int(o0 + 1, out);
    std::vector<float> Y3(static_cast<size_t>(rows * out), 777.0f);
    lockstep::gemm_cols_isa(isa, X.data(), rows, in, W.data(), out, o0, o1, Y3.data());
    for (int64_t rr = 0; rr < rows; ++rr)
      for (int64_t o = 0; o < out; ++o) {
        const float got = Y3[static_cast<size_t>(rr * out + o)];
        if (o >= o0 && o < o1)
          CHECK(std::memcmp(&got, &want[static_cast<size_t>(rr * out + o)], sizeof got) == 0);
        else
          CHECK(got == 777.0f);
      }
  }
  // The threaded product, whatever the number of threads: the same bits.
  for (int threads : {1, 2, 3, 4}) {
    lockstep::ThreadPool pool(threads);
    std::vector<float> Y(static_cast<size_t>(rows * out));
    lockstep::gemm_rows_pool(&pool, X.data(), rows, in, W.data(), out, Y.data());
    const bool same = std::memcmp(Y.data(), want.data(), sizeof(float) * want.size()) == 0;
    if (!same)
      std::fprintf(stderr, "gemm_rows_pool with %d threads differs: rows=%lld in=%lld out=%lld\n", threads,
                   static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out));
    CHECK(same);
  }
}

void random_shapes() {
  for (int t = 0; t < 60; ++t) {
    const int64_t rows = t < 20 ? rand_int(1, 20) : rand_int(1, 70);
    const int64_t in = rand_int(1, 300);
    // Column counts around the vector widths and panel sizes, and big ones
    // spanning several L2 column blocks.
    const int64_t out = t % 5 == 4 ? rand_int(400, 1200) : rand_int(1, 130);
    std::vector<float> X(static_cast<size_t>(rows * in)), W(static_cast<size_t>(in * out));
    for (float& v : X) v = rand_float();
    for (float& v : W) v = rand_float();
    check_shape(X, rows, in, W, out);
  }
  // Few rows and many columns: the AVX-512 streaming driver's column slabs,
  // reduction slabs and the masked column tail together.
  const int64_t fixed[][3] = {{5, 37, 4133}, {8, 100, 2051}, {1, 17, 2048 + 48 + 7}, {9, 33, 2101}};
  for (const auto& f : fixed) {
    std::vector<float> X(static_cast<size_t>(f[0] * f[1])), W(static_cast<size_t>(f[1] * f[2]));
    for (float& v : X) v = rand_float();
    for (float& v : W) v = rand_float();
    check_shape(X, f[0], f[1], W, f[2]);
  }
  // in == 0: every output is +0.
  for (int64_t out : {5, 40, 2100}) {
    std::vector<float> X(4), W(1), Y(static_cast<size_t>(3 * out), 1.0f);
    for (GemmIsa isa : kAll) {
      if (!lockstep::gemm_isa_supported(isa)) continue;
      lockstep::gemm_rows_isa(isa, X.data(), 3, 0, W.data(), out, Y.data());
      for (float y : Y) CHECK(y == 0.0f && !std::signbit(y));
    }
  }
}

// Special values: -0 products summed from +0 give +0; inf and NaN propagate;
// a product that needs rounding is rounded before the add (FMA would not).
void special_values() {
  const int64_t rows = 9, in = 3, out = 35;
  std::vector<float> X(rows * in), W(in * out);
  for (float& v : X) v = rand_float();
  for (float& v : W) v = rand_float();
  X[0] = -0.0f; X[1] = 0.0f; X[2] = -1.0f;  // row 0, column 0: -0*1 + 0*-1 + -1*0 = +0
  X[in + 0] = std::numeric_limits<float>::infinity();
  X[2 * in + 1] = std::numeric_limits<float>::quiet_NaN();
  // Row 3, column 1: (-(1 + 2^-11)) * 1 + a * a with a = 1 + 2^-12. a * a is
  // 1 + 2^-11 + 2^-24, rounded (ties to even) to 1 + 2^-11, so mul then add
  // gives 0; a fused multiply-add would give 2^-24.
  const float a = 1.0f + std::ldexp(1.0f, -12);
  X[3 * in + 0] = -(1.0f + std::ldexp(1.0f, -11)); X[3 * in + 1] = a; X[3 * in + 2] = 0.0f;
  W[0 * out + 0] = 1.0f; W[1 * out + 0] = -1.0f; W[2 * out + 0] = 0.0f;
  W[0 * out + 1] = 1.0f; W[1 * out + 1] = a;
  check_shape(X, rows, in, W, out);
  for (GemmIsa isa : kAll) {
    if (!lockstep::gemm_isa_supported(isa)) continue;
    std::vector<float> Y(rows * out);
    lockstep::gemm_rows_isa(isa, X.data(), rows, in, W.data(), out, Y.data());
    CHECK(Y[0] == 0.0f && !std::signbit(Y[0]));
    CHECK(Y[3 * out + 1] == 0.0f);  // not 2^-24: no fused multiply-add
    CHECK(std::isnan(Y[2 * out + 5]));
  }
}

}  // namespace

int main() {
  for (GemmIsa isa : kAll)
    std::printf("gemm %s: %s\n", lockstep::gemm_isa_name(isa),
                lockstep::gemm_isa_supported(isa) ? "tested" : "not supported here");
  std::printf("gemm active: %s\n", lockstep::gemm_isa_name(lockstep::gemm_active_isa()));
  random_shapes();
  special_values();
  return check_exit_code("test_gemm");
}
