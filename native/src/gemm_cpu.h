// gemm_cpu.h: the CPU backend's matrix products, blocked and vectorised in a
// fixed reduction order.
//
//   Y[r][o] = Σ_i X[r][i] * W[i][o]     (W input-major, W[i * out + o])
//
// Every element is accumulated exactly as the reference matvec does it: start
// from +0.0f, then for i = 0, 1, ..., in-1 round the product X[r][i]*W[i][o]
// to float32 and add it to the float32 accumulator (a separate multiply and
// add, never a fused multiply-add; the library is compiled with
// -ffp-contract=off, which also keeps GCC from contracting the vector
// intrinsics, whose mul/add are plain vector-extension arithmetic). Blocking
// only decides which elements are computed side by side, never the order of
// any element's sum, so:
//   - every path (scalar, portable, AVX2, AVX-512) gives the same bits;
//   - a row's result does not depend on the other rows of X, on how many rows
//     there are or on the row's position in a register block.
// test_gemm checks both against a scalar matvec with memcmp.
#ifndef LOCKSTEP_NATIVE_GEMM_CPU_H
#define LOCKSTEP_NATIVE_GEMM_CPU_H

#include <cstdint>

#include "thread_pool.h"

namespace lockstep {

// Y[rows][out] = X[rows][in] · W[in][out], all row-major and dense. Y must not
// alias X or W. Uses the best kernel this CPU supports (gemm_active_isa).
void gemm_rows(const float* X, int64_t rows, int64_t in, const float* W, int64_t out, float* Y);

// gemm_rows with the output columns cut into ranges run by the threads of
// pool (nullptr or one thread: gemm_rows). Every element is still summed by
// one kernel in the reference order, so Y has the same bits for any number
// of threads. Small products stay on the calling thread.
void gemm_rows_pool(ThreadPool* pool, const float* X, int64_t rows, int64_t in, const float* W, int64_t out,
                    float* Y);

// The implementations, for tests and benchmarks.
enum class GemmIsa : int {
  kScalar = 0,    // one element at a time (the reference order, unblocked)
  kPortable = 1,  // register-blocked plain C++ (vectorised by the compiler
                  // for the baseline ISA, SSE2 on x86-64)
  kAvx2 = 2,      // AVX2 intrinsics, mul + add (no FMA)
  kAvx512 = 3,    // AVX-512F intrinsics, mul + add (no FMA)
};

// Whether this CPU (and this build) can run isa.
bool gemm_isa_supported(GemmIsa isa);
// Name of isa ("scalar", "portable", "avx2", "avx512").
const char* gemm_isa_name(GemmIsa isa);
// The kernel gemm_rows uses: the best supported one, unless the environment
// variable LOCKSTEP_GEMM names a supported one (read once).
GemmIsa gemm_active_isa();
// gemm_rows with a given implementation; isa must be supported.
void gemm_rows_isa(GemmIsa isa, const float* X, int64_t rows, int64_t in, const float* W,
                   int64_t out, float* Y);
// The columns [o0, o1) of gemm_rows_isa's Y (W and Y are out floats wide).
void gemm_cols_isa(GemmIsa isa, const float* X, int64_t rows, int64_t in, const float* W, int64_t out,
                   int64_t o0, int64_t o1, float* Y);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_GEMM_CPU_H
