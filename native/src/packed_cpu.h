// packed_cpu.h: the exact kernels' products for a few rows (decoding),
// reading a checkpoint's Q8_0, Q4_0 and Q4_1 weights from their blocks
// instead of from the float32 copy (issue 31).
//
// A decode step multiplies one to a few rows by every weight: the float32
// product streams 4 bytes per weight from memory and does one multiply-add
// with it. Here the weights stay in 16-column panels of their 32-element
// blocks (4.5 to 9 bits a weight), and each weight is turned back into the
// very float32 the loader gives (checkpoint.cpp dequantize_row):
//   Q8_0  w = d · float(q)            (q int8)
//   Q4_0  w = d · float(q − 8)        (q 0..15)
//   Q4_1  w = d · float(q) + m        (q 0..15; product exact, then rounded add)
// with d and m the block's half-precision scale and offset as float. The
// product then runs in gemm_cpu.h's reference order: each element starts
// from +0.0f and, for i = 0, 1, ..., in-1, adds round(x[i] · w[i]) (a
// multiply and an add, never fused). So every output element has exactly
// the bits of gemm_rows on the float32 copy, whatever the kernel, the rows
// around it or the columns a thread takes (test_packed checks it with
// memcmp), and `cpu_kernels = exact` keeps its digests.
#ifndef LOCKSTEP_NATIVE_PACKED_CPU_H
#define LOCKSTEP_NATIVE_PACKED_CPU_H

#include <cstdint>
#include <functional>
#include <vector>

#include "engine.h"
#include "thread_pool.h"

namespace lockstep {

// Output columns per panel, elements per block, and the most rows a
// packed product takes (more rows reuse each float32 weight enough for
// the float GEMM to be the faster).
constexpr int64_t kPackedCols = 16;
constexpr int64_t kPackedBlock = 32;
constexpr int64_t kPackedMaxRows = 8;

// W (out × in) in panels of kPackedCols output columns. Per panel and
// block, one record: float d[16], float m[16] (Q4_1's offsets; zero
// otherwise), then the quants in input order with the panel's 16 columns
// side by side:
//   Q4: 16 rows of 16 bytes, byte (p, c) = q(2p, c) | q(2p+1, c) << 4;
//   Q8: 32 rows of 16 int8, byte (j, c) = q(j, c).
// Records run panel-major (a panel's blocks are contiguous); the last
// panel is padded with zero columns.
struct PackedMatrix {
  int32_t dtype = -1;  // ENG_DTYPE_Q8_0, _Q4_0 or _Q4_1; -1: none
  int64_t in = 0, out = 0;
  std::vector<uint8_t> data;
  bool empty() const { return dtype < 0; }
  int64_t blocks() const { return in / kPackedBlock; }
  int64_t panels() const { return (out + kPackedCols - 1) / kPackedCols; }
  int64_t record_bytes() const;
};

// Packs a checkpoint tensor [rows = out][cols = in] of dtype Q8_0, Q4_0 or
// Q4_1; interleaved_rope_heads > 0 reorders its rows as the float loader
// does (tensor_to_input_major).
PackedMatrix pack_exact_matrix(const eng_tensor& t, int32_t head_dim);

enum class PackedIsa : int {
  kNone = -1,   // no packed kernel: callers use the float GEMM
  kScalar = 0,  // one element at a time (the reference)
  kAvx2 = 1,    // 8 columns a vector
  kAvx512 = 2,  // 16 columns a vector
};
bool packed_isa_supported(PackedIsa isa);
const char* packed_isa_name(PackedIsa isa);
// The kernel packed_gemm uses: AVX-512F, else AVX2, else kNone (the scalar
// one is a reference, slower than the float GEMM). LOCKSTEP_PACKED names
// another supported one, or "none" (read once).
PackedIsa packed_active_isa();

// Y[r][o] = Σ_i X[r][i] · W[i][o] for o in [o0, o1), rows ≤ kPackedMaxRows
// (Y is ldy floats wide, X in floats wide).
void packed_gemm_cols_isa(PackedIsa isa, const float* X, int64_t rows, const PackedMatrix& W, int64_t o0,
                          int64_t o1, float* Y, int64_t ldy);

// Y[rows][out] with the active kernel, the panels shared out over pool's
// threads (nullptr: the caller's only). packed_active_isa() must not be kNone.
void packed_gemm(ThreadPool* pool, const float* X, int64_t rows, const PackedMatrix& W, float* Y);

// Several products of the same rows in one pass of the pool (one barrier
// instead of one each): Y_j[rows][W_j.out] = X · W_j for every job, the
// jobs' panels cut into ranges that the threads claim as they come free.
// Every W_j.in must be the same. At most kPackedMaxJobs jobs.
struct PackedJob {
  const PackedMatrix* W;
  float* Y;
};
constexpr int kPackedMaxJobs = 4;
void packed_gemm_jobs(ThreadPool* pool, const float* X, int64_t rows, const PackedJob* jobs, int njobs);

// A gated MLP's two products in one pass: gate = X · Wg and up = X · Wu
// (same shapes), each range of columns [o0, o1) of both computed by one
// thread, which then runs after(o0, o1) on them (the activation), so
// that the products and the activation share one barrier.
void packed_gemm_gated(ThreadPool* pool, const float* X, int64_t rows, const PackedMatrix& Wg,
                       const PackedMatrix& Wu, float* gate, float* up,
                       const std::function<void(int64_t o0, int64_t o1)>& after);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_PACKED_CPU_H
