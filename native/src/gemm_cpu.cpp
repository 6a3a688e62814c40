// gemm_cpu.cpp: blocked GEMM kernels in the reference reduction order (see
// gemm_cpu.h for the contract).
//
// Structure (every ISA; AVX-512 has a second driver for at most 8 rows,
// drive_stream): the output columns are cut into blocks whose slice of
// W fits in L2; inside a block, rows go in register blocks of MR rows and the
// block's columns in panels of NV vectors. The micro-kernel keeps the
// MR x (NV vectors) accumulators in registers over the whole reduction
// (i = 0 .. in-1): per i it loads the panel's NV vectors of W row i, and per
// row broadcasts X[r][i], multiplies, then adds. The multiply and the add are
// separate instructions, so each element sees exactly the reference sequence
// acc = acc + round(x * w) from acc = +0.0f.
#include "gemm_cpu.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOCKSTEP_GEMM_X86 1
#endif

namespace lockstep {
namespace {

// Floats of W one column block may hold (about 384 KiB: well inside L2).
constexpr int64_t kBlockFloats = 96 * 1024;

// A threaded product (gemm_rows_pool) cuts the columns into ranges of whole
// groups of kParallelCols, and gives each range at least kMinParallelMacs
// multiply-adds: below that, waking a thread costs more than it saves.
constexpr int64_t kParallelCols = 64;
constexpr int64_t kMinParallelMacs = 1 << 16;

// The vector kernels prefetch the W row this many rows ahead of the one they
// multiply: a panel walks W with a stride of a whole row, which the hardware
// prefetchers follow poorly when W streams from memory (the LM head; every
// weight when decoding a few rows). Prefetches never fault, so running past
// the end of W is harmless. About 2x on the LM head at 8 rows.
constexpr int64_t kPrefetchRows = 32;

// Columns per block: a multiple of the panel width, at least one panel.
int64_t column_block(int64_t in, int64_t panel) {
  int64_t nc = in > 0 ? kBlockFloats / in : kBlockFloats;
  nc -= nc % panel;
  return nc < panel ? panel : nc;
}

// ---------------------------------------------------------------------------
// Scalar: the reference matvec per row (Y[r] zeroed, then for each i the
// element-wise y[o] += x[i] * w[i][o]).
// Every driver computes the columns [o0, o1) of Y = X · W, where W and Y are
// ld floats wide (ld = out for the whole product): one call per column range
// of a threaded product (gemm_rows_pool), the whole range otherwise. Which
// columns a call covers never changes how an element is summed.
void gemm_scalar(const float* X, int64_t rows, int64_t in, const float* W, int64_t ld, int64_t o0,
                 int64_t o1, float* Y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict x = X + r * in;
    float* __restrict y = Y + r * ld;
    for (int64_t o = o0; o < o1; ++o) y[o] = 0.0f;
    for (int64_t i = 0; i < in; ++i) {
      const float xi = x[i];
      const float* __restrict w = W + i * ld;
      for (int64_t o = o0; o < o1; ++o) y[o] += xi * w[o];
    }
  }
}

// Columns [o0, o1) of every row, one element at a time (the column tail of
// the vector kernels).
void tail_columns(const float* X, int64_t rows, int64_t in, const float* W, int64_t ld, int64_t o0, int64_t o1,
                  float* Y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = o0; o < o1; ++o) {
      float acc = 0.0f;
      for (int64_t i = 0; i < in; ++i) acc += X[r * in + i] * W[i * ld + o];
      Y[r * ld + o] = acc;
    }
  }
}

// The shared blocking. K provides:
//   kRows, kVecs, kWidth   register block: kRows rows x kVecs vectors of kWidth
//   run(mr, nv, X, in, W, ldw, Y, ldy)   mr <= kRows rows, nv <= kVecs full vectors
//   tail(X, rows, in, W, ld, o0, o1, Y)  columns [o0, o1), fewer than kWidth
template <class K>
void drive(const float* X, int64_t rows, int64_t in, const float* W, int64_t ld, int64_t o0, int64_t o1,
           float* Y) {
  constexpr int64_t panel = int64_t{K::kVecs} * K::kWidth;
  const int64_t full = o1 - (o1 - o0) % K::kWidth;  // columns in whole vectors
  const int64_t ncb = column_block(in, panel);
  for (int64_t c0 = o0; c0 < full; c0 += ncb) {
    const int64_t c1 = c0 + ncb < full ? c0 + ncb : full;
    for (int64_t r0 = 0; r0 < rows; r0 += K::kRows) {
      const int mr = static_cast<int>(rows - r0 < K::kRows ? rows - r0 : K::kRows);
      for (int64_t o = c0; o < c1; o += panel) {
        const int nv = static_cast<int>((c1 - o < panel ? c1 - o : panel) / K::kWidth);
        K::run(mr, nv, X + r0 * in, in, W + o, ld, Y + r0 * ld + o, ld);
      }
    }
  }
  if (full < o1) K::tail(X, rows, in, W, ld, full, o1, Y);
}

// Few rows (one register block, e.g. decoding): every W element is used by
// those rows only, so the product is bound by streaming W from memory. Walk W
// in slabs of kStreamK rows x kStreamCols columns (each W row read in long
// runs), resuming each panel's accumulators from Y between slabs. Y holds the
// exact float32 partial sums, so every element still adds its products in
// increasing i from +0. About 25% faster decode steps than drive().
constexpr int64_t kStreamK = 16;
constexpr int64_t kStreamCols = 2048;
template <class K>
void drive_stream(const float* X, int64_t rows, int64_t in, const float* W, int64_t ld, int64_t o0, int64_t o1,
                  float* Y) {
  constexpr int64_t panel = int64_t{K::kVecs} * K::kWidth;
  const int64_t full = o1 - (o1 - o0) % K::kWidth;
  const int mr = static_cast<int>(rows);
  for (int64_t c0 = o0; c0 < full; c0 += kStreamCols) {
    const int64_t c1 = c0 + kStreamCols < full ? c0 + kStreamCols : full;
    for (int64_t i0 = 0; i0 < in; i0 += kStreamK) {
      const int64_t i1 = i0 + kStreamK < in ? i0 + kStreamK : in;
      for (int64_t o = c0; o < c1; o += panel) {
        const int nv = static_cast<int>((c1 - o < panel ? c1 - o : panel) / K::kWidth);
        K::run_part(mr, nv, X, in, i0, i1, W + o, ld, Y + o, ld);
      }
    }
  }
  if (full < o1) K::tail(X, rows, in, W, ld, full, o1, Y);
}

// Calls F::template k<R, V>(args...) for runtime mr in [1, MR], nv in [1, NV].
template <class F, int MR, int NV, int R = MR>
struct Dispatch {
  template <class... A>
  static void call(int mr, int nv, A... a) {
    if (mr == R)
      by_vecs<NV>(nv, a...);
    else
      Dispatch<F, MR, NV, R - 1>::call(mr, nv, a...);
  }
  template <int V, class... A>
  static void by_vecs(int nv, A... a) {
    if constexpr (V > 1) {
      if (nv != V) return by_vecs<V - 1>(nv, a...);
    }
    F::template k<R, V>(a...);
  }
};
template <class F, int MR, int NV>
struct Dispatch<F, MR, NV, 0> {
  template <class... A>
  static void call(int, int, A...) {}
};

// ---------------------------------------------------------------------------
// Portable: register blocking in plain C++; the compiler may vectorise the
// element-wise column loop (it never reorders an element's sum).
struct Portable {
  static constexpr int kRows = 4, kVecs = 4, kWidth = 4;
  template <int R, int V>
  static void k(const float* X, int64_t in, const float* W, int64_t ldw, float* Y, int64_t ldy) {
    constexpr int C = V * kWidth;
    float acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
    for (int64_t i = 0; i < in; ++i) {
      const float* w = W + i * ldw;
      for (int r = 0; r < R; ++r) {
        const float x = X[r * in + i];
        for (int c = 0; c < C; ++c) acc[r][c] += x * w[c];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) Y[r * ldy + c] = acc[r][c];
  }
  static void run(int mr, int nv, const float* X, int64_t in, const float* W, int64_t ldw, float* Y,
                  int64_t ldy) {
    Dispatch<Portable, kRows, kVecs>::call(mr, nv, X, in, W, ldw, Y, ldy);
  }
  static void tail(const float* X, int64_t rows, int64_t in, const float* W, int64_t ld, int64_t o0, int64_t o1,
                   float* Y) {
    tail_columns(X, rows, in, W, ld, o0, o1, Y);
  }
};

#ifdef LOCKSTEP_GEMM_X86
// ---------------------------------------------------------------------------
// AVX2: 4 rows x 3 vectors of 8 = 12 accumulators (+3 W vectors and a
// broadcast: 16 ymm registers).
// The address `elems` floats past w, for a prefetch hint. Computed in
// integers: near the end of W it lies past the array, where forming the
// pointer by pointer arithmetic would be undefined (a prefetch never faults).
inline const char* ahead(const float* w, int64_t elems) {
  return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w) + static_cast<uintptr_t>(elems) * sizeof(float));
}

struct Avx2 {
  static constexpr int kRows = 4, kVecs = 3, kWidth = 8;
  template <int R, int V>
  __attribute__((target("avx2"))) static void k(const float* X, int64_t in, const float* W,
                                                int64_t ldw, float* Y, int64_t ldy) {
    __m256 acc[R][V];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
    for (int64_t i = 0; i < in; ++i) {
      const float* w = W + i * ldw;
      __m256 wv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        _mm_prefetch(ahead(w, kPrefetchRows * ldw + 8 * v), _MM_HINT_T0);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) wv[v] = _mm256_loadu_ps(w + 8 * v);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(X + r * in + i);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_mul_ps(x, wv[v]));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) _mm256_storeu_ps(Y + r * ldy + 8 * v, acc[r][v]);
  }
  static void run(int mr, int nv, const float* X, int64_t in, const float* W, int64_t ldw, float* Y,
                  int64_t ldy) {
    Dispatch<Avx2, kRows, kVecs>::call(mr, nv, X, in, W, ldw, Y, ldy);
  }
  static void tail(const float* X, int64_t rows, int64_t in, const float* W, int64_t ld, int64_t o0, int64_t o1,
                   float* Y) {
    tail_columns(X, rows, in, W, ld, o0, o1, Y);
  }
};

// ---------------------------------------------------------------------------
// AVX-512F: 8 rows x 3 vectors of 16 = 24 accumulators (+3 W vectors and a
// broadcast, of 32 zmm registers). The column tail is one masked vector.
struct Avx512 {
  static constexpr int kRows = 8, kVecs = 3, kWidth = 16;
  // Rows [i0, i1) of the reduction; with `resume` the accumulators start
  // from Y (the float32 partial sums of rows [0, i0)), else from +0.
  template <int R, int V, bool Masked = false>
  __attribute__((target("avx512f"))) static void kp(const float* X, int64_t in, int64_t i0, int64_t i1,
                                                    const float* W, int64_t ldw, float* Y, int64_t ldy,
                                                    bool resume, __mmask16 mask = 0xFFFF) {
    __m512 acc[R][V];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[r][v] = !resume ? _mm512_setzero_ps()
                            : Masked ? _mm512_maskz_loadu_ps(mask, Y + r * ldy + 16 * v)
                                     : _mm512_loadu_ps(Y + r * ldy + 16 * v);
    for (int64_t i = i0; i < i1; ++i) {
      const float* w = W + i * ldw;
      __m512 wv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        _mm_prefetch(ahead(w, kPrefetchRows * ldw + 16 * v), _MM_HINT_T0);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        wv[v] = Masked ? _mm512_maskz_loadu_ps(mask, w + 16 * v) : _mm512_loadu_ps(w + 16 * v);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(X[r * in + i]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_mul_ps(x, wv[v]));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        if (Masked)
          _mm512_mask_storeu_ps(Y + r * ldy + 16 * v, mask, acc[r][v]);
        else
          _mm512_storeu_ps(Y + r * ldy + 16 * v, acc[r][v]);
      }
  }
  template <int R, int V>
  static void k(const float* X, int64_t in, const float* W, int64_t ldw, float* Y, int64_t ldy) {
    kp<R, V>(X, in, 0, in, W, ldw, Y, ldy, false);
  }
  template <int R, int V>
  static void k(const float* X, int64_t in, int64_t i0, int64_t i1, const float* W, int64_t ldw,
                float* Y, int64_t ldy) {
    kp<R, V>(X, in, i0, i1, W, ldw, Y, ldy, i0 > 0);
  }
  static void run(int mr, int nv, const float* X, int64_t in, const float* W, int64_t ldw, float* Y,
                  int64_t ldy) {
    Dispatch<Avx512, kRows, kVecs>::call(mr, nv, X, in, W, ldw, Y, ldy);
  }
  static void run_part(int mr, int nv, const float* X, int64_t in, int64_t i0, int64_t i1, const float* W,
                       int64_t ldw, float* Y, int64_t ldy) {
    Dispatch<Avx512, kRows, kVecs>::call(mr, nv, X, in, i0, i1, W, ldw, Y, ldy);
  }
  // The last out - o0 (< 16) columns: one masked vector, rows in blocks.
  template <int R>
  static void tail_rows(const float* X, int64_t in, const float* W, int64_t ldw, float* Y, int64_t ldy,
                        __mmask16 mask) {
    kp<R, 1, true>(X, in, 0, in, W, ldw, Y, ldy, false, mask);
  }
  static void tail(const float* X, int64_t rows, int64_t in, const float* W, int64_t ld, int64_t o0, int64_t o1,
                   float* Y) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (o1 - o0)) - 1u);
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      const int64_t mr = rows - r0 < kRows ? rows - r0 : kRows;
      const float* x = X + r0 * in;
      const float* w = W + o0;
      float* y = Y + r0 * ld + o0;
      switch (mr) {
        case 8: tail_rows<8>(x, in, w, ld, y, ld, mask); break;
        case 7: tail_rows<7>(x, in, w, ld, y, ld, mask); break;
        case 6: tail_rows<6>(x, in, w, ld, y, ld, mask); break;
        case 5: tail_rows<5>(x, in, w, ld, y, ld, mask); break;
        case 4: tail_rows<4>(x, in, w, ld, y, ld, mask); break;
        case 3: tail_rows<3>(x, in, w, ld, y, ld, mask); break;
        case 2: tail_rows<2>(x, in, w, ld, y, ld, mask); break;
        default: tail_rows<1>(x, in, w, ld, y, ld, mask); break;
      }
    }
  }
};
#endif  // LOCKSTEP_GEMM_X86

GemmIsa best_isa() {
  if (gemm_isa_supported(GemmIsa::kAvx512)) return GemmIsa::kAvx512;
  if (gemm_isa_supported(GemmIsa::kAvx2)) return GemmIsa::kAvx2;
  return GemmIsa::kPortable;
}

GemmIsa choose_isa() {
  const char* env = std::getenv("LOCKSTEP_GEMM");
  if (env != nullptr && *env != '\0') {
    for (GemmIsa isa : {GemmIsa::kScalar, GemmIsa::kPortable, GemmIsa::kAvx2, GemmIsa::kAvx512})
      if (std::strcmp(env, gemm_isa_name(isa)) == 0 && gemm_isa_supported(isa)) return isa;
  }
  return best_isa();
}

}  // namespace

bool gemm_isa_supported(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kScalar:
    case GemmIsa::kPortable:
      return true;
#ifdef LOCKSTEP_GEMM_X86
    case GemmIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case GemmIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kScalar: return "scalar";
    case GemmIsa::kPortable: return "portable";
    case GemmIsa::kAvx2: return "avx2";
    case GemmIsa::kAvx512: return "avx512";
  }
  return "?";
}

GemmIsa gemm_active_isa() {
  static const GemmIsa isa = choose_isa();
  return isa;
}

void gemm_cols_isa(GemmIsa isa, const float* X, int64_t rows, int64_t in, const float* W, int64_t out,
                   int64_t o0, int64_t o1, float* Y) {
  if (rows <= 0 || o1 <= o0) return;
  switch (isa) {
    case GemmIsa::kScalar: return gemm_scalar(X, rows, in, W, out, o0, o1, Y);
#ifdef LOCKSTEP_GEMM_X86
    case GemmIsa::kAvx2: return drive<Avx2>(X, rows, in, W, out, o0, o1, Y);
    case GemmIsa::kAvx512:
      if (rows <= Avx512::kRows && in > 0) return drive_stream<Avx512>(X, rows, in, W, out, o0, o1, Y);
      return drive<Avx512>(X, rows, in, W, out, o0, o1, Y);
#endif
    default: return drive<Portable>(X, rows, in, W, out, o0, o1, Y);
  }
}

void gemm_rows_isa(GemmIsa isa, const float* X, int64_t rows, int64_t in, const float* W, int64_t out,
                   float* Y) {
  gemm_cols_isa(isa, X, rows, in, W, out, 0, out, Y);
}

void gemm_rows(const float* X, int64_t rows, int64_t in, const float* W, int64_t out, float* Y) {
  gemm_rows_isa(gemm_active_isa(), X, rows, in, W, out, Y);
}

void gemm_rows_pool(ThreadPool* pool, const float* X, int64_t rows, int64_t in, const float* W, int64_t out,
                    float* Y) {
  const GemmIsa isa = gemm_active_isa();
  if (pool == nullptr) return gemm_rows_isa(isa, X, rows, in, W, out, Y);
  // Ranges of whole 64-column groups (every kernel's vector width divides
  // 64), the last one with the tail; at least kMinParallelMacs of work each.
  pool->for_ranges(out, kParallelCols, rows * in * out, kMinParallelMacs,
                   [&](int64_t o0, int64_t o1) { gemm_cols_isa(isa, X, rows, in, W, out, o0, o1, Y); });
}

}  // namespace lockstep
