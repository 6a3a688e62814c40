// bench_gemm: single-thread GFLOP/s of the CPU backend's GEMM (gemm_cpu.h) at
// SmolLM2-135M's projection shapes, for every implementation this CPU runs.
// "matvec" is the reference per-row matvec (the backend's projection before
// the blocked kernels); the others are gemm_rows_isa. A second table sets
// the packed products (packed_cpu.h: the same bits from Q4_1 / Q8_0 blocks)
// beside the float GEMM at decoding's row counts. Each cell is the fastest
// call of a series. A third table times the quantised products
// (quant_cpu.h). Not a ctest.
//
//   bench_gemm [min_seconds_per_cell]   (default 0.25)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "gemm_cpu.h"
#include "packed_cpu.h"
#include "quant_cpu.h"
#include "quant_tensors.h"

using lockstep::GemmIsa;
using lockstep::PackedIsa;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GFLOP/s of the product f computes (rows x in x out): the fastest of the
// calls made in at least min_s (the best case is the stable statistic on a
// shared machine).
template <class F>
double gflops(F f, int64_t rows, int64_t in, int64_t out, double min_s) {
  f();  // warm up
  double best = 1e30;
  const double t0 = now_s();
  int calls = 0;
  for (;;) {
    const double a = now_s();
    f();
    const double b = now_s();
    if (b - a < best) best = b - a;
    if (b - t0 >= min_s && ++calls >= 3) break;
  }
  return 2.0 * static_cast<double>(rows) * in * out / best / 1e9;
}

double measure(GemmIsa isa, const std::vector<float>& X, int64_t rows, int64_t in,
               const std::vector<float>& W, int64_t out, std::vector<float>& Y, double min_s) {
  return gflops([&] { lockstep::gemm_rows_isa(isa, X.data(), rows, in, W.data(), out, Y.data()); }, rows, in, out,
                min_s);
}

// SmolLM2's quantised products: its Q4_1 projections and Q8_0 LM head.
struct BlockShape {
  int64_t in, out;
  int32_t dtype;
  const char* what;
};
const BlockShape kBlockShapes[] = {{576, 576, ENG_DTYPE_Q4_1, "q, o"},
                                   {576, 1536, ENG_DTYPE_Q4_1, "gate, up"},
                                   {1536, 576, ENG_DTYPE_Q4_1, "down"},
                                   {576, 49152, ENG_DTYPE_Q8_0, "lm_head"}};

// Decoding's products from packed blocks against the float GEMM on the
// loader's float32 copy of the same tensor (single thread).
void packed_table(double min_s) {
  const PackedIsa isas[] = {PackedIsa::kAvx2, PackedIsa::kAvx512};
  std::printf("\npacked products (SmolLM2's Q4_1 projections, Q8_0 LM head), single thread, GFLOP/s;\n"
              "the small shapes stay in cache across calls here, where a model's decode step streams\n"
              "every weight from memory as the LM head does\n");
  std::printf("%-10s %5s %6s %6s | %9s", "shape", "rows", "in", "out", "float");
  for (PackedIsa isa : isas) std::printf(" %9s", (std::string("packed ") + lockstep::packed_isa_name(isa)).c_str());
  std::printf("\n");
  for (const BlockShape& sh : kBlockShapes) {
    const std::vector<uint8_t> raw = random_tensor(sh.dtype, sh.out, sh.in);
    const eng_tensor t = tensor_of(sh.dtype, sh.out, sh.in, raw);
    const lockstep::PackedMatrix P = lockstep::pack_exact_matrix(t, 64);
    std::vector<float> W(static_cast<size_t>(sh.in * sh.out));
    lockstep::tensor_to_input_major(t, 64, W.data());
    for (int64_t rows : {int64_t{1}, int64_t{8}}) {
      std::vector<float> X(static_cast<size_t>(rows * sh.in), 0.25f), Y(static_cast<size_t>(rows * sh.out));
      std::printf("%-10s %5lld %6lld %6lld | %9.2f", sh.what, static_cast<long long>(rows),
                  static_cast<long long>(sh.in), static_cast<long long>(sh.out),
                  measure(lockstep::gemm_active_isa(), X, rows, sh.in, W, sh.out, Y, min_s));
      for (PackedIsa isa : isas) {
        if (!lockstep::packed_isa_supported(isa)) {
          std::printf(" %9s", "-");
          continue;
        }
        std::printf(" %9.2f", gflops([&] { lockstep::packed_gemm_cols_isa(isa, X.data(), rows, P, 0, sh.out, Y.data(), sh.out); },
                                     rows, sh.in, sh.out, min_s));
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  }
}

// The quantised products (quant_cpu.h, --cpu-kernels quant) at every row
// count the engine runs them with (single thread; GFLOP/s counts the
// multiply-adds of the block dot products as flops).
void quant_table(double min_s) {
  const lockstep::QuantIsa isas[] = {lockstep::QuantIsa::kAvx2, lockstep::QuantIsa::kAvx512Vnni};
  std::printf("\nquantised products (--cpu-kernels quant: SmolLM2's Q4_1 projections, Q8_0 LM head),\n"
              "single thread, GFLOP/s\n");
  std::printf("%-10s %5s %6s %6s |", "shape", "rows", "in", "out");
  for (lockstep::QuantIsa isa : isas) std::printf(" %10s", lockstep::quant_isa_name(isa));
  std::printf("\n");
  for (const BlockShape& sh : kBlockShapes) {
    const std::vector<uint8_t> raw = random_tensor(sh.dtype, sh.out, sh.in);
    const lockstep::QuantMatrix W = lockstep::pack_quant_matrix(tensor_of(sh.dtype, sh.out, sh.in, raw), 64);
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{512}}) {
      if (rows == 512 && sh.out > 4096) continue;  // the LM head runs on the sampled rows only
      std::vector<float> X(static_cast<size_t>(rows * sh.in)), Y(static_cast<size_t>(rows * sh.out));
      for (float& x : X) x = uniform();
      lockstep::QuantRows Xq;
      lockstep::quantize_rows(X.data(), rows, sh.in, &Xq);
      std::printf("%-10s %5lld %6lld %6lld |", sh.what, static_cast<long long>(rows), static_cast<long long>(sh.in),
                  static_cast<long long>(sh.out));
      for (lockstep::QuantIsa isa : isas) {
        if (!lockstep::quant_isa_supported(isa)) {
          std::printf(" %10s", "-");
          continue;
        }
        std::printf(" %10.2f", gflops([&] { lockstep::quant_gemm_cols_isa(isa, Xq, W, 0, sh.out, Y.data(), sh.out); },
                                      rows, sh.in, sh.out, min_s));
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  }
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
  packed_table(min_s);
  quant_table(min_s);
  return 0;
}
