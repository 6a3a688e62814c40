// The quantised products (quant_cpu.h): for Q8_0, Q4_0 and Q4_1 weights of
// random shapes, every kernel this CPU runs gives the scalar reference's bits
// (memcmp), for the whole product, a column range, a row alone and 1-4
// threads; the packed columns hold the loader's columns (RoPE row order
// included); and the result is the float product within the quantisation's
// error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "check.h"
#include "checkpoint.h"
#include "quant_cpu.h"
#include "quant_tensors.h"

using lockstep::QuantIsa;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

void check_shape(int32_t dtype, int64_t rows, int64_t in, int64_t out) {
  const std::vector<uint8_t> raw = random_tensor(dtype, out, in);
  const eng_tensor t = tensor_of(dtype, out, in, raw);
  const lockstep::QuantMatrix W = lockstep::pack_quant_matrix(t, 64);
  std::vector<float> X(static_cast<size_t>(rows * in));
  for (float& x : X) x = uniform() * (next() % 4 == 0 ? 8.0f : 1.0f);
  // Ties of the rounding: x · 127 / amax = k + 1/2 exactly when amax = 127.
  if (in >= 64)
    for (int j = 0; j < 32; ++j) X[static_cast<size_t>((rows - 1) * in + 32 + j)] = j == 0 ? 127.0f : (j % 9) - 3.5f;
  for (int64_t j = 0; j < in; ++j) X[static_cast<size_t>(j)] = 0.0f;  // row 0's first blocks all zero
  lockstep::QuantRows Xq, Xs;
  lockstep::quantize_rows(X.data(), rows, in, &Xq);
  // The vectorised quantisation equals the scalar reference.
  lockstep::quantize_rows_scalar(X.data(), rows, in, &Xs);
  CHECK(std::memcmp(Xq.q.data(), Xs.q.data(), static_cast<size_t>(rows * in)) == 0);
  CHECK(std::memcmp(Xq.d.data(), Xs.d.data(), sizeof(float) * static_cast<size_t>(rows * in / 32)) == 0);
  CHECK(std::memcmp(Xq.sd.data(), Xs.sd.data(), sizeof(float) * static_cast<size_t>(rows * in / 32)) == 0);
  CHECK(std::memcmp(Xq.s.data(), Xs.s.data(), sizeof(int32_t) * static_cast<size_t>(rows * in / 32)) == 0);

  std::vector<float> ref(static_cast<size_t>(rows * out));
  lockstep::quant_gemm_cols_isa(QuantIsa::kScalar, Xq, W, 0, out, ref.data(), out);
  for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (!lockstep::quant_isa_supported(isa)) continue;
    std::vector<float> Y(static_cast<size_t>(rows * out), 9.0f);
    lockstep::quant_gemm_cols_isa(isa, Xq, W, 0, out, Y.data(), out);
    CHECKF(same_bits(Y, ref), "kernel %d differs: dtype %d rows %lld in %lld out %lld", static_cast<int>(isa), dtype,
           static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out));
    // A column range alone: the same bits in it, nothing written outside.
    const int64_t o0 = static_cast<int64_t>(next() % static_cast<uint64_t>(out));
    const int64_t o1 = o0 + 1 + static_cast<int64_t>(next() % static_cast<uint64_t>(out - o0));
    std::vector<float> Yc(static_cast<size_t>(rows * out), 7.0f);
    lockstep::quant_gemm_cols_isa(isa, Xq, W, o0, o1, Yc.data(), out);
    CHECKF(range_only(Yc, ref, rows, out, o0, o1, 7.0f), "columns [%lld, %lld) alone differ",
           static_cast<long long>(o0), static_cast<long long>(o1));
    // The last row alone gives the bits it had among the others.
    lockstep::QuantRows one;
    lockstep::quantize_rows(X.data() + (rows - 1) * in, 1, in, &one);
    std::vector<float> y1(static_cast<size_t>(out));
    lockstep::quant_gemm_cols_isa(isa, one, W, 0, out, y1.data(), out);
    CHECK(std::memcmp(y1.data(), ref.data() + (rows - 1) * out, sizeof(float) * static_cast<size_t>(out)) == 0);
  }
  for (int threads : {1, 2, 3, 4}) {
    lockstep::ThreadPool pool(threads);
    std::vector<float> Y(static_cast<size_t>(rows * out));
    lockstep::quant_gemm(&pool, Xq, W, Y.data());
    CHECKF(same_bits(Y, ref), "quant_gemm on %d threads differs", threads);
  }
  // Against the float product of the dequantised weights: the error of
  // 8-bit activations (relative to the row's scale of |x|·|w|).
  std::vector<float> Wf(static_cast<size_t>(in * out));
  lockstep::tensor_to_input_major(t, 64, Wf.data());
  double worst = 0;
  // (The last row's tie block, one large value among small ones, is coarse
  // by design: left out of the accuracy check.)
  const int64_t checked = in >= 64 ? rows - 1 : rows;
  for (int64_t r = 0; r < checked; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double exact = 0, scale = 0;
      for (int64_t i = 0; i < in; ++i) {
        const double p = static_cast<double>(X[static_cast<size_t>(r * in + i)]) * Wf[static_cast<size_t>(i * out + o)];
        exact += p;
        scale += std::fabs(p);
      }
      if (scale > 0) worst = std::fmax(worst, std::fabs(ref[static_cast<size_t>(r * out + o)] - exact) / scale);
    }
  CHECKF(worst < 0.02, "quantised product off the float one by %.4f of its scale (dtype %d)", worst, dtype);
}

// The packed columns hold exactly the loader's columns, RoPE order included.
void check_rope_rows() {
  const int64_t heads = 2, head_dim = 8, rows = heads * head_dim, in = 64;
  for (int32_t dtype : {ENG_DTYPE_Q8_0, ENG_DTYPE_Q4_0, ENG_DTYPE_Q4_1}) {
    const std::vector<uint8_t> raw = random_tensor(dtype, rows, in);
    const eng_tensor t = tensor_of(dtype, rows, in, raw, heads);
    const lockstep::QuantMatrix W = lockstep::pack_quant_matrix(t, head_dim);
    std::vector<float> Wf(static_cast<size_t>(in * rows));
    lockstep::tensor_to_input_major(t, head_dim, Wf.data());
    // One-hot activations read single weights back: x = e_i times a
    // power of two keeps the quantisation exact (q = 127, d = 2^k / 127).
    for (int64_t i = 0; i < in; i += 7) {
      std::vector<float> X(static_cast<size_t>(in), 0.0f);
      X[static_cast<size_t>(i)] = 1.0f;
      lockstep::QuantRows Xq;
      lockstep::quantize_rows(X.data(), 1, in, &Xq);
      std::vector<float> y(static_cast<size_t>(rows));
      lockstep::quant_gemm_cols_isa(QuantIsa::kScalar, Xq, W, 0, rows, y.data(), rows);
      for (int64_t o = 0; o < rows; ++o) {
        // y = dw·(1/127)·(q·127) + mw·(1/127)·127 ≈ dw·q + mw.
        const float want = Wf[static_cast<size_t>(i * rows + o)];
        CHECKF(std::fabs(y[static_cast<size_t>(o)] - want) <= 1e-5f + 1e-4f * std::fabs(want),
               "dtype %d column %lld weight %lld: %g, the loader's %g", dtype, static_cast<long long>(o),
               static_cast<long long>(i), y[static_cast<size_t>(o)], want);
      }
    }
  }
}

}  // namespace

int main() {
  for (QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512Vnni})
    std::printf("quant kernel %s: %s\n", lockstep::quant_isa_name(isa),
                lockstep::quant_isa_supported(isa) ? "tested" : "not supported here");
  std::printf("quant kernel active: %s\n", lockstep::quant_isa_name(lockstep::quant_active_isa()));
  for (int32_t dtype : {ENG_DTYPE_Q8_0, ENG_DTYPE_Q4_0, ENG_DTYPE_Q4_1}) {
    for (int t = 0; t < 8; ++t) {
      const int64_t rows = 1 + static_cast<int64_t>(next() % 9), in = 32 * (1 + static_cast<int64_t>(next() % 12));
      const int64_t out = 1 + static_cast<int64_t>(next() % 70);
      check_shape(dtype, rows, in, out);
    }
    check_shape(dtype, 3, 576, 1536);  // SmolLM2's MLP width
  }
  check_rope_rows();
  return check_exit_code("test_quant");
}
