// bench_gemm: single-thread GFLOP/s of the CPU backend's GEMM (gemm_cpu.h) at
// SmolLM2-135M's projection shapes, for every implementation this CPU runs.
// "matvec" is the reference per-row matvec (the backend's projection before
// the blocked kernels); the others are gemm_rows_isa. Each cell is the
// fastest call of a series. Not a ctest.
//
//   bench_gemm [min_seconds_per_cell]   (default 0.25)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gemm_cpu.h"

using lockstep::GemmIsa;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GFLOP/s of isa on X[rows][in] · W[in][out]: the fastest of the calls made
// in at least min_s (the best case is the stable statistic on a shared
// machine).
double measure(GemmIsa isa, const std::vector<float>& X, int64_t rows, int64_t in,
               const std::vector<float>& W, int64_t out, std::vector<float>& Y, double min_s) {
  lockstep::gemm_rows_isa(isa, X.data(), rows, in, W.data(), out, Y.data());  // warm up
  double best = 1e30;
  const double t0 = now_s();
  int calls = 0;
  for (;;) {
    const double a = now_s();
    lockstep::gemm_rows_isa(isa, X.data(), rows, in, W.data(), out, Y.data());
    const double b = now_s();
    if (b - a < best) best = b - a;
    if (b - t0 >= min_s && ++calls >= 3) break;
  }
  return 2.0 * static_cast<double>(rows) * in * out / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const double min_s = argc > 1 ? std::atof(argv[1]) : 0.25;
  struct Shape {
    int64_t in, out;
    const char* what;
  };
  const Shape shapes[] = {
      {576, 576, "q, o"}, {576, 192, "k, v"}, {576, 1536, "gate, up"},
      {1536, 576, "down"}, {576, 49152, "lm_head"},
  };
  const int64_t row_counts[] = {8, 64, 512};
  const GemmIsa isas[] = {GemmIsa::kScalar, GemmIsa::kPortable, GemmIsa::kAvx2, GemmIsa::kAvx512};

  std::printf("bench_gemm: single thread, GFLOP/s (2*rows*in*out / time); active kernel: %s\n",
              lockstep::gemm_isa_name(lockstep::gemm_active_isa()));
  std::printf("%-10s %5s %6s %6s |", "shape", "rows", "in", "out");
  for (GemmIsa isa : isas)
    std::printf(" %9s", isa == GemmIsa::kScalar ? "matvec" : lockstep::gemm_isa_name(isa));
  std::printf("\n");

  uint64_t s = 88172645463325252ull;
  auto rnd = [&s]() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(s >> 40) / 16777216.0f - 0.5f;
  };
  for (const Shape& sh : shapes) {
    std::vector<float> W(static_cast<size_t>(sh.in * sh.out));
    for (float& v : W) v = rnd();
    for (int64_t rows : row_counts) {
      std::vector<float> X(static_cast<size_t>(rows * sh.in)), Y(static_cast<size_t>(rows * sh.out));
      for (float& v : X) v = rnd();
      std::printf("%-10s %5lld %6lld %6lld |", sh.what, static_cast<long long>(rows),
                  static_cast<long long>(sh.in), static_cast<long long>(sh.out));
      for (GemmIsa isa : isas) {
        if (!lockstep::gemm_isa_supported(isa)) {
          std::printf(" %9s", "-");
          continue;
        }
        std::printf(" %9.2f", measure(isa, X, rows, sh.in, W, sh.out, Y, min_s));
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  }
  return 0;
}
