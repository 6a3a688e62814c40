// quant_cpu.h: the CPU backend's quantised products (cpu_kernels = quant,
// issue 31): a checkpoint's Q4_0, Q4_1 and Q8_0 weights stay in their
// 32-element blocks and multiply activations quantised to 8 bits per row
// block, with integer dot products inside each block.
//
// The arithmetic, the same bits on every ISA, thread count and batch:
//   activations, per row r and block b of 32 elements:
//     amax = max |x_i|; dx = amax / 127; q_i = nearbyint(x_i · (127 / amax))
//     (all 0 when amax = 0); sx = Σ q_i; sd = dx · float(sx)
//   weights: Q8_0 x = dw·q (int8); Q4_0 and Q4_1 x = dw·q + mw with q in
//     0..15 (Q4_0: mw = −8·dw, exact)
//   y[r][o] = 0, then per block b in increasing order (float32, no FMA):
//     isum = Σ_i qw_i · qx_i                       (exact, int32)
//     y += (dw · dx) · float(isum)
//     y += mw · sd                                 (Q4_0, Q4_1)
// Each output element depends only on its own row and column, so results
// do not depend on the rows around it, on how columns are shared out, or on
// the kernel (scalar, AVX2 or AVX-512 VNNI); test_quant checks all of it
// with memcmp.
#ifndef LOCKSTEP_NATIVE_QUANT_CPU_H
#define LOCKSTEP_NATIVE_QUANT_CPU_H

#include <cstdint>
#include <vector>

#include "engine.h"
#include "thread_pool.h"

namespace lockstep {

// Output columns per packed group: the AVX2 kernel computes 8 at once.
constexpr int64_t kQuantCols = 8;
constexpr int64_t kQuantBlock = 32;

// A weight matrix y = W·x (out × in) kept as quantised blocks, repacked by
// groups of kQuantCols output columns: per group and block, the columns'
// scales dw[8] and (Q4_1) offsets mw[8] as the file's halves (Q4_0's
// offset is −8·dw, exact) and their quants as 32-byte
// vectors whose 4-byte lane c holds column c's quants 4t..4t+3 (Q8: 8
// vectors of the values plus 128, as u8; Q4: 4 vectors of ggml's nibble
// bytes, element j low and j+16 high, so vector t's low nibbles are
// elements 4t.. and its high nibbles elements 16+4t..). The last group is
// padded with zero columns.
struct QuantMatrix {
  int32_t dtype = -1;  // ENG_DTYPE_Q8_0, _Q4_0 or _Q4_1; -1: none
  int64_t in = 0, out = 0;
  std::vector<uint8_t> data;
  bool empty() const { return dtype < 0; }
  int64_t blocks() const { return in / kQuantBlock; }
  int64_t groups() const { return (out + kQuantCols - 1) / kQuantCols; }
  // Bytes of one (group, block) record.
  int64_t record_bytes() const;
};

// Whether dtype can be kept quantised (Q8_0, Q4_0, Q4_1).
bool quant_dtype(int32_t dtype);

// Packs a checkpoint tensor [rows = out][cols = in] of a quantised dtype;
// interleaved_rope_heads > 0 reorders its rows as the float loader does
// (llama.cpp's interleaved RoPE rows to Hugging Face's rotate-half order).
QuantMatrix pack_quant_matrix(const eng_tensor& t, int32_t head_dim);

// Activations of some rows quantised per block (see above).
struct QuantRows {
  int64_t rows = 0, in = 0;
  std::vector<int8_t> q;    // [rows][in]
  std::vector<float> d;     // [rows][in / 32]: dx
  std::vector<float> sd;    // [rows][in / 32]: dx · float(Σ q)
  std::vector<int32_t> s;   // [rows][in / 32]: Σ q
};

// Quantises X[rows][in] (in a multiple of 32) into out, vectorised where the
// CPU can; quantize_rows_scalar is the reference it equals (test_quant).
void quantize_rows(const float* X, int64_t rows, int64_t in, QuantRows* out);
void quantize_rows_scalar(const float* X, int64_t rows, int64_t in, QuantRows* out);

// Kernels, for tests and benchmarks.
enum class QuantIsa : int {
  kScalar = 0,     // one element at a time (the reference)
  kAvx2 = 1,       // maddubs/madd integer dots, 8 columns in the lanes
  kAvx512Vnni = 2  // the same with dpbusd (AVX-512 VNNI on 256-bit vectors)
};
bool quant_isa_supported(QuantIsa isa);
const char* quant_isa_name(QuantIsa isa);
// The kernel quant_gemm uses: the best supported, unless LOCKSTEP_QUANT names one.
QuantIsa quant_active_isa();

// Y[r][o] for o in [o0, o1) (Y is ldy floats wide) with one kernel.
void quant_gemm_cols_isa(QuantIsa isa, const QuantRows& X, const QuantMatrix& W, int64_t o0, int64_t o1, float* Y,
                         int64_t ldy);

// Y[rows][out] = X · Wᵀ with the active kernel, the columns shared out over
// pool's threads (nullptr: the caller's only).
void quant_gemm(ThreadPool* pool, const QuantRows& X, const QuantMatrix& W, float* Y);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_QUANT_CPU_H
