// The exact kernels' packed products (packed_cpu.h): for Q8_0, Q4_0 and
// Q4_1 weights of random shapes, every packed kernel this CPU runs gives,
// bit for bit (memcmp), what the float GEMM gives on the loader's float32
// copy of the same tensor — for 1 to 8 rows, the whole product, a column
// range, a row alone, 1-4 threads and RoPE-reordered rows. That is what
// keeps `cpu_kernels = exact` digests unchanged when decode steps read the
// blocks.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "check.h"
#include "checkpoint.h"
#include "gemm_cpu.h"
#include "packed_cpu.h"
#include "quant_tensors.h"

using lockstep::PackedIsa;

namespace {

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, sizeof(float) * static_cast<size_t>(n)) == 0;
}

void check_shape(int32_t dtype, int64_t rows, int64_t in, int64_t out, int32_t heads, int32_t head_dim) {
  const std::vector<uint8_t> raw = random_tensor(dtype, out, in);
  const eng_tensor t = tensor_of(dtype, out, in, raw, heads);
  const lockstep::PackedMatrix W = lockstep::pack_exact_matrix(t, head_dim);
  std::vector<float> Wf(static_cast<size_t>(in * out));
  lockstep::tensor_to_input_major(t, head_dim, Wf.data());
  std::vector<float> X(static_cast<size_t>(rows * in));
  for (float& x : X) x = uniform() * (next() % 4 == 0 ? 8.0f : 1.0f);
  for (int64_t j = 0; j < in && j < 40; ++j) X[static_cast<size_t>(j)] = j % 2 ? 0.0f : -0.0f;  // signed zeros
  std::vector<float> ref(static_cast<size_t>(rows * out));
  lockstep::gemm_rows_isa(lockstep::GemmIsa::kScalar, X.data(), rows, in, Wf.data(), out, ref.data());

  for (PackedIsa isa : {PackedIsa::kScalar, PackedIsa::kAvx2, PackedIsa::kAvx512}) {
    if (!lockstep::packed_isa_supported(isa)) continue;
    std::vector<float> Y(static_cast<size_t>(rows * out), 9.0f);
    lockstep::packed_gemm_cols_isa(isa, X.data(), rows, W, 0, out, Y.data(), out);
    CHECKF(same_bits(Y.data(), ref.data(), rows * out), "%s differs from the float GEMM: dtype %d rows %lld in %lld out %lld",
           lockstep::packed_isa_name(isa), dtype, static_cast<long long>(rows), static_cast<long long>(in),
           static_cast<long long>(out));
    // A column range alone: the same bits in it, nothing written outside.
    const int64_t o0 = static_cast<int64_t>(next() % static_cast<uint64_t>(out));
    const int64_t o1 = o0 + 1 + static_cast<int64_t>(next() % static_cast<uint64_t>(out - o0));
    std::vector<float> Yc(static_cast<size_t>(rows * out), 7.0f);
    lockstep::packed_gemm_cols_isa(isa, X.data(), rows, W, o0, o1, Yc.data(), out);
    CHECKF(range_only(Yc, ref, rows, out, o0, o1, 7.0f), "columns [%lld, %lld) alone differ",
           static_cast<long long>(o0), static_cast<long long>(o1));
    // The last row alone gives the bits it had among the others.
    std::vector<float> y1(static_cast<size_t>(out));
    lockstep::packed_gemm_cols_isa(isa, X.data() + (rows - 1) * in, 1, W, 0, out, y1.data(), out);
    CHECK(same_bits(y1.data(), ref.data() + (rows - 1) * out, out));
  }
  if (lockstep::packed_active_isa() == PackedIsa::kNone) return;
  for (int threads : {1, 2, 3, 4}) {
    lockstep::ThreadPool pool(threads);
    std::vector<float> Y(static_cast<size_t>(rows * out));
    lockstep::packed_gemm(&pool, X.data(), rows, W, Y.data());
    CHECKF(same_bits(Y.data(), ref.data(), rows * out), "packed_gemm on %d threads differs", threads);
  }
}

// packed_gemm_jobs and packed_gemm_gated give every product the bits of
// its own packed_gemm (the float GEMM's), and the gated pass's activation
// sees exactly the finished columns, on 1-4 threads.
void check_passes(int32_t dtype, int64_t rows, int64_t in) {
  const int64_t outs[3] = {1 + static_cast<int64_t>(next() % 700), 1 + static_cast<int64_t>(next() % 200),
                           1 + static_cast<int64_t>(next() % 200)};
  std::vector<std::vector<uint8_t>> raws;
  std::vector<lockstep::PackedMatrix> Ws;
  std::vector<std::vector<float>> refs;
  std::vector<float> X(static_cast<size_t>(rows * in));
  for (float& x : X) x = uniform();
  for (int64_t out : outs) {
    raws.push_back(random_tensor(dtype, out, in));
    const eng_tensor t = tensor_of(dtype, out, in, raws.back(), 0);
    Ws.push_back(lockstep::pack_exact_matrix(t, 64));
    refs.emplace_back(static_cast<size_t>(rows * out));
    lockstep::packed_gemm(nullptr, X.data(), rows, Ws.back(), refs.back().data());
  }
  // A gate and an up of one shape, and their activation.
  const int64_t F = outs[0];
  const std::vector<uint8_t> raw_up = random_tensor(dtype, F, in);
  const lockstep::PackedMatrix Wu = lockstep::pack_exact_matrix(tensor_of(dtype, F, in, raw_up, 0), 64);
  std::vector<float> up_ref(static_cast<size_t>(rows * F));
  lockstep::packed_gemm(nullptr, X.data(), rows, Wu, up_ref.data());
  std::vector<float> act_ref = refs[0];
  for (size_t i = 0; i < act_ref.size(); ++i) act_ref[i] = act_ref[i] * 0.5f + up_ref[i];

  for (int threads : {0, 1, 2, 3, 4}) {
    lockstep::ThreadPool* pool = nullptr;
    std::unique_ptr<lockstep::ThreadPool> owned;
    if (threads > 0) {
      owned = std::make_unique<lockstep::ThreadPool>(threads);
      pool = owned.get();
    }
    std::vector<std::vector<float>> Ys;
    for (int j = 0; j < 3; ++j) Ys.emplace_back(static_cast<size_t>(rows * outs[j]), 5.0f);
    lockstep::PackedJob jobs[3];
    for (int j = 0; j < 3; ++j) jobs[j] = {&Ws[static_cast<size_t>(j)], Ys[static_cast<size_t>(j)].data()};
    lockstep::packed_gemm_jobs(pool, X.data(), rows, jobs, 3);
    for (int j = 0; j < 3; ++j)
      CHECKF(same_bits(Ys[static_cast<size_t>(j)].data(), refs[static_cast<size_t>(j)].data(), rows * outs[j]),
             "packed_gemm_jobs job %d on %d threads differs (dtype %d rows %lld)", j, threads, dtype,
             static_cast<long long>(rows));
    std::vector<float> gate(static_cast<size_t>(rows * F), 3.0f), up(static_cast<size_t>(rows * F), 3.0f);
    std::vector<int> seen(static_cast<size_t>(F), 0);
    std::mutex mu;
    lockstep::packed_gemm_gated(pool, X.data(), rows, Ws[0], Wu, gate.data(), up.data(), [&](int64_t o0, int64_t o1) {
      {
        std::lock_guard<std::mutex> lock(mu);
        for (int64_t o = o0; o < o1; ++o) ++seen[static_cast<size_t>(o)];
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = o0; o < o1; ++o) gate[r * F + o] = gate[r * F + o] * 0.5f + up[r * F + o];
    });
    CHECKF(same_bits(gate.data(), act_ref.data(), rows * F), "packed_gemm_gated on %d threads differs", threads);
    CHECK(same_bits(up.data(), up_ref.data(), rows * F));
    for (int v : seen) CHECK(v == 1);  // every column activated once
  }
}

}  // namespace

int main() {
  for (PackedIsa isa : {PackedIsa::kScalar, PackedIsa::kAvx2, PackedIsa::kAvx512})
    std::printf("packed kernel %s: %s\n", lockstep::packed_isa_name(isa),
                lockstep::packed_isa_supported(isa) ? "tested" : "not supported here");
  std::printf("packed kernel active: %s\n", lockstep::packed_isa_name(lockstep::packed_active_isa()));
  for (int32_t dtype : {ENG_DTYPE_Q8_0, ENG_DTYPE_Q4_0, ENG_DTYPE_Q4_1}) {
    for (int64_t rows = 1; rows <= lockstep::kPackedMaxRows; ++rows) {
      const int64_t in = 32 * (1 + static_cast<int64_t>(next() % 12));
      const int64_t out = 1 + static_cast<int64_t>(next() % 150);
      check_shape(dtype, rows, in, out, 0, 64);
    }
    check_shape(dtype, 1, 576, 1536, 0, 64);  // SmolLM2's MLP width, decoding
    check_shape(dtype, 8, 1536, 576, 0, 64);
    check_shape(dtype, 3, 64, 2 * 8, 2, 8);   // RoPE rows: 2 heads of 8
    check_shape(dtype, 1, 96, 3 * 16, 3, 16);
  }
  if (lockstep::packed_active_isa() != PackedIsa::kNone) {
    for (int32_t dtype : {ENG_DTYPE_Q8_0, ENG_DTYPE_Q4_0, ENG_DTYPE_Q4_1})
      for (int64_t rows : {int64_t{1}, int64_t{3}, lockstep::kPackedMaxRows})
        check_passes(dtype, rows, 32 * (1 + static_cast<int64_t>(next() % 20)));
  }
  // A shape that is not a multiple of 32 inputs is refused.
  const std::vector<uint8_t> raw = random_tensor(ENG_DTYPE_Q8_0, 4, 64);
  eng_tensor t = tensor_of(ENG_DTYPE_Q8_0, 4, 64, raw);
  t.cols = 48;
  bool refused = false;
  try {
    lockstep::pack_exact_matrix(t, 64);
  } catch (const std::exception&) {
    refused = true;
  }
  CHECK(refused);
  return check_exit_code("test_packed");
}
