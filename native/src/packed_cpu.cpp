// packed_cpu.cpp: exact products from quantised panels (see packed_cpu.h).
#include "packed_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "checkpoint.h"
#include "status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOCKSTEP_PACKED_X86 1
// GCC 12's AVX-512 conversion intrinsics pass an _mm512_undefined_*() value
// through a masked builtin, which -Wmaybe-uninitialized reports at every
// inlined call; the value is never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace lockstep {
namespace {

// Threads share a product out only when each gets this many multiply-adds.
constexpr int64_t kMinParallelMacs = 1 << 16;
// Record header: d[16] and m[16] as float.
constexpr int64_t kHeaderBytes = 2 * kPackedCols * 4;

bool is_q4(int32_t dtype) { return dtype == ENG_DTYPE_Q4_0 || dtype == ENG_DTYPE_Q4_1; }

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The loader's weight (checkpoint.cpp dequantize_row), from a record.
float weight(int32_t dtype, const uint8_t* rec, int64_t j, int64_t c) {
  float d, m;
  std::memcpy(&d, rec + 4 * c, 4);
  std::memcpy(&m, rec + 64 + 4 * c, 4);
  const uint8_t* q = rec + kHeaderBytes;
  if (dtype == ENG_DTYPE_Q8_0) return d * static_cast<float>(static_cast<int8_t>(q[j * kPackedCols + c]));
  const uint8_t b = q[(j / 2) * kPackedCols + c];
  const int v = j % 2 == 0 ? b & 0xF : b >> 4;
  if (dtype == ENG_DTYPE_Q4_0) return d * static_cast<float>(v - 8);
  return d * static_cast<float>(v) + m;
}

// ---------------------------------------------------------------------------
// Scalar: the reference order, one element at a time.
void scalar_cols(const float* X, int64_t rows, const PackedMatrix& W, int64_t o0, int64_t o1, float* Y,
                 int64_t ldy) {
  const int64_t nb = W.blocks(), rec = W.record_bytes(), in = W.in;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = o0; o < o1; ++o) {
      const uint8_t* panel = W.data.data() + (o / kPackedCols) * nb * rec;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t j = 0; j < kPackedBlock; ++j)
          acc += X[r * in + b * kPackedBlock + j] * weight(W.dtype, panel + b * rec, j, o % kPackedCols);
      Y[r * ldy + o] = acc;
    }
}

#ifdef LOCKSTEP_PACKED_X86
// ---------------------------------------------------------------------------
// AVX-512F: R rows x G panels of 16 columns, R·G accumulators kept over the
// whole reduction. Per block the panels' scales (and Q4_1 offsets) are
// loaded once; per input element the G weight vectors are rebuilt from their
// quants (zero-extended or sign-extended to int32, converted, scaled) and
// every row adds x · w to its accumulators.
template <int R, int G, int DT>
__attribute__((target("avx512f"))) void k512(const float* X, int64_t in, const uint8_t* P, int64_t pstride,
                                             int64_t nb, int64_t rec, float* Y, int64_t ldy) {
  __m512 acc[R][G];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* B = P + b * rec;
    const float* x = X + b * kPackedBlock;
    __m512 d[G], m[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const uint8_t* h = B + g * pstride;
      _mm_prefetch(reinterpret_cast<const char*>(h + 4 * rec), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(h + 4 * rec + 64 * 2), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(h + 4 * rec + 64 * 4), _MM_HINT_T0);
      d[g] = _mm512_loadu_ps(reinterpret_cast<const float*>(h));
      m[g] = DT == ENG_DTYPE_Q4_1 ? _mm512_loadu_ps(reinterpret_cast<const float*>(h + 64)) : _mm512_setzero_ps();
    }
    if constexpr (DT == ENG_DTYPE_Q8_0) {
      for (int j = 0; j < kPackedBlock; ++j) {
        __m512 w[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(B + g * pstride + kHeaderBytes + 16 * j));
          w[g] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d[g]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(x[r * in + j]);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc[r][g] = _mm512_add_ps(acc[r][g], _mm512_mul_ps(xv, w[g]));
        }
      }
    } else {
      const __m512i low = _mm512_set1_epi32(0xF), eight = _mm512_set1_epi32(8);
      for (int p = 0; p < kPackedBlock / 2; ++p) {
        __m512 wl[G], wh[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512i q = _mm512_cvtepu8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(B + g * pstride + kHeaderBytes + 16 * p)));
          __m512i lo = _mm512_and_si512(q, low), hi = _mm512_srli_epi32(q, 4);
          if constexpr (DT == ENG_DTYPE_Q4_0) {
            lo = _mm512_sub_epi32(lo, eight);
            hi = _mm512_sub_epi32(hi, eight);
          }
          wl[g] = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d[g]);
          wh[g] = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d[g]);
          if constexpr (DT == ENG_DTYPE_Q4_1) {
            wl[g] = _mm512_add_ps(wl[g], m[g]);
            wh[g] = _mm512_add_ps(wh[g], m[g]);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(x[r * in + 2 * p]);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc[r][g] = _mm512_add_ps(acc[r][g], _mm512_mul_ps(xv, wl[g]));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512 xv = _mm512_set1_ps(x[r * in + 2 * p + 1]);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc[r][g] = _mm512_add_ps(acc[r][g], _mm512_mul_ps(xv, wh[g]));
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(Y + r * ldy + kPackedCols * g, acc[r][g]);
}

// Panels per tile for R rows: enough independent accumulators to hide the
// add's latency, within the 32 vector registers.
constexpr int tile_panels(int rows) { return rows <= 2 ? 4 : 2; }

template <int R, int DT>
void tile512(int g, const float* X, int64_t in, const uint8_t* P, int64_t pstride, int64_t nb, int64_t rec,
             float* Y, int64_t ldy) {
  constexpr int G = tile_panels(R);
  if (g == G) return k512<R, G, DT>(X, in, P, pstride, nb, rec, Y, ldy);
  if constexpr (G == 4) {
    if (g == 3) return k512<R, 3, DT>(X, in, P, pstride, nb, rec, Y, ldy);
    if (g == 2) return k512<R, 2, DT>(X, in, P, pstride, nb, rec, Y, ldy);
  }
  return k512<R, 1, DT>(X, in, P, pstride, nb, rec, Y, ldy);
}

template <int DT>
void tile512_rows(int rows, int g, const float* X, int64_t in, const uint8_t* P, int64_t pstride, int64_t nb,
                  int64_t rec, float* Y, int64_t ldy) {
  switch (rows) {
    case 1: return tile512<1, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
    case 2: return tile512<2, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
    case 3: return tile512<3, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
    case 4: return tile512<4, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
    case 5: return tile512<5, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
    case 6: return tile512<6, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
    case 7: return tile512<7, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
    default: return tile512<8, DT>(g, X, in, P, pstride, nb, rec, Y, ldy);
  }
}

// g panels starting at panel p, written to Y (ldy wide) from its column 0.
void tile_avx512(const float* X, int64_t rows, const PackedMatrix& W, int64_t p, int g, float* Y, int64_t ldy) {
  const int64_t nb = W.blocks(), rec = W.record_bytes(), pstride = nb * rec;
  const uint8_t* P = W.data.data() + p * pstride;
  const int r = static_cast<int>(rows);
  switch (W.dtype) {
    case ENG_DTYPE_Q8_0: return tile512_rows<ENG_DTYPE_Q8_0>(r, g, X, W.in, P, pstride, nb, rec, Y, ldy);
    case ENG_DTYPE_Q4_0: return tile512_rows<ENG_DTYPE_Q4_0>(r, g, X, W.in, P, pstride, nb, rec, Y, ldy);
    default: return tile512_rows<ENG_DTYPE_Q4_1>(r, g, X, W.in, P, pstride, nb, rec, Y, ldy);
  }
}

// ---------------------------------------------------------------------------
// AVX2: a panel is two vectors of 8 columns. R rows (at most 4 at a time) x
// G panels, R·2G <= 8 accumulators of the 16 ymm registers.
template <int R, int G, int DT>
__attribute__((target("avx2"))) void k256(const float* X, int64_t in, const uint8_t* P, int64_t pstride,
                                          int64_t nb, int64_t rec, float* Y, int64_t ldy) {
  constexpr int V = 2 * G;
  __m256 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* B = P + b * rec;
    const float* x = X + b * kPackedBlock;
    __m256 d[V], m[V];
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const uint8_t* h = B + (v / 2) * pstride + 32 * (v % 2);
      if (v % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(h + 4 * rec), _MM_HINT_T0);
      d[v] = _mm256_loadu_ps(reinterpret_cast<const float*>(h));
      m[v] = DT == ENG_DTYPE_Q4_1 ? _mm256_loadu_ps(reinterpret_cast<const float*>(h + 64)) : _mm256_setzero_ps();
    }
    // The quants of vector v (8 columns) of input row k of the record.
    auto quants = [&](int v, int k) {
      return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(B + (v / 2) * pstride + kHeaderBytes + 16 * k + 8 * (v % 2)));
    };
    if constexpr (DT == ENG_DTYPE_Q8_0) {
      for (int j = 0; j < kPackedBlock; ++j) {
        __m256 w[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v)
          w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(quants(v, j))), d[v]);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_set1_ps(x[r * in + j]);
#pragma GCC unroll 8
          for (int v = 0; v < V; ++v) acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_mul_ps(xv, w[v]));
        }
      }
    } else {
      const __m256i low = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
      for (int p = 0; p < kPackedBlock / 2; ++p) {
        __m256 wl[V], wh[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          const __m256i q = _mm256_cvtepu8_epi32(quants(v, p));
          __m256i lo = _mm256_and_si256(q, low), hi = _mm256_srli_epi32(q, 4);
          if constexpr (DT == ENG_DTYPE_Q4_0) {
            lo = _mm256_sub_epi32(lo, eight);
            hi = _mm256_sub_epi32(hi, eight);
          }
          wl[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d[v]);
          wh[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d[v]);
          if constexpr (DT == ENG_DTYPE_Q4_1) {
            wl[v] = _mm256_add_ps(wl[v], m[v]);
            wh[v] = _mm256_add_ps(wh[v], m[v]);
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_set1_ps(x[r * in + 2 * p]);
#pragma GCC unroll 8
          for (int v = 0; v < V; ++v) acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_mul_ps(xv, wl[v]));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256 xv = _mm256_set1_ps(x[r * in + 2 * p + 1]);
#pragma GCC unroll 8
          for (int v = 0; v < V; ++v) acc[r][v] = _mm256_add_ps(acc[r][v], _mm256_mul_ps(xv, wh[v]));
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(Y + r * ldy + 8 * v, acc[r][v]);
}

template <int DT>
void tile256_rows(int rows, int g, const float* X, int64_t in, const uint8_t* P, int64_t pstride, int64_t nb,
                  int64_t rec, float* Y, int64_t ldy) {
  for (int r0 = 0; r0 < rows; r0 += 4) {
    const float* x = X + r0 * in;
    float* y = Y + r0 * ldy;
    switch (rows - r0 < 4 ? rows - r0 : 4) {
      case 1:
        if (g == 2) k256<1, 2, DT>(x, in, P, pstride, nb, rec, y, ldy);
        else k256<1, 1, DT>(x, in, P, pstride, nb, rec, y, ldy);
        break;
      case 2:
        if (g == 2) k256<2, 2, DT>(x, in, P, pstride, nb, rec, y, ldy);
        else k256<2, 1, DT>(x, in, P, pstride, nb, rec, y, ldy);
        break;
      case 3: k256<3, 1, DT>(x, in, P, pstride, nb, rec, y, ldy); break;
      default: k256<4, 1, DT>(x, in, P, pstride, nb, rec, y, ldy); break;
    }
  }
}

// The ISAs' tiles: g panels starting at panel p, written to Y (ldy wide)
// from its column 0; panels(rows) is the widest tile.
struct Avx512Tiles {
  static int panels(int64_t rows) { return tile_panels(static_cast<int>(rows)); }
  static void tile(const float* X, int64_t rows, const PackedMatrix& W, int64_t p, int g, float* Y, int64_t ldy) {
    tile_avx512(X, rows, W, p, g, Y, ldy);
  }
};
struct Avx2Tiles {
  // Two panels while one or two rows leave the registers for them.
  static int panels(int64_t rows) { return rows <= 2 ? 2 : 1; }
  static void tile(const float* X, int64_t rows, const PackedMatrix& W, int64_t p, int g, float* Y, int64_t ldy) {
    const int64_t nb = W.blocks(), rec = W.record_bytes(), pstride = nb * rec;
    const uint8_t* P = W.data.data() + p * pstride;
    const int r = static_cast<int>(rows);
    switch (W.dtype) {
      case ENG_DTYPE_Q8_0: return tile256_rows<ENG_DTYPE_Q8_0>(r, g, X, W.in, P, pstride, nb, rec, Y, ldy);
      case ENG_DTYPE_Q4_0: return tile256_rows<ENG_DTYPE_Q4_0>(r, g, X, W.in, P, pstride, nb, rec, Y, ldy);
      default: return tile256_rows<ENG_DTYPE_Q4_1>(r, g, X, W.in, P, pstride, nb, rec, Y, ldy);
    }
  }
};

// Columns [o0, o1): whole panels in tiles straight into Y; a panel cut by
// the range (or by the matrix's last columns) through a scratch row block.
template <class T>
void drive_cols(const float* X, int64_t rows, const PackedMatrix& W, int64_t o0, int64_t o1, float* Y,
                int64_t ldy) {
  const int G = T::panels(rows);
  int64_t o = o0;
  while (o < o1) {
    const int64_t p = o / kPackedCols, start = p * kPackedCols;
    if (o != start || start + kPackedCols > o1) {
      float tmp[kPackedMaxRows * kPackedCols];
      T::tile(X, rows, W, p, 1, tmp, kPackedCols);
      const int64_t end = start + kPackedCols < o1 ? start + kPackedCols : o1;
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(Y + r * ldy + o, tmp + r * kPackedCols + (o - start), sizeof(float) * static_cast<size_t>(end - o));
      o = end;
      continue;
    }
    const int64_t whole = (o1 - o) / kPackedCols;
    const int g = static_cast<int>(whole < G ? whole : G);
    T::tile(X, rows, W, p, g, Y + o, ldy);
    o += g * kPackedCols;
  }
}
#endif  // LOCKSTEP_PACKED_X86

PackedIsa best_isa() {
  if (packed_isa_supported(PackedIsa::kAvx512)) return PackedIsa::kAvx512;
  if (packed_isa_supported(PackedIsa::kAvx2)) return PackedIsa::kAvx2;
  return PackedIsa::kNone;
}

PackedIsa choose_isa() {
  const char* env = std::getenv("LOCKSTEP_PACKED");
  if (env != nullptr && *env != '\0') {
    if (std::strcmp(env, "none") == 0) return PackedIsa::kNone;
    for (PackedIsa isa : {PackedIsa::kScalar, PackedIsa::kAvx2, PackedIsa::kAvx512})
      if (std::strcmp(env, packed_isa_name(isa)) == 0 && packed_isa_supported(isa)) return isa;
  }
  return best_isa();
}

}  // namespace

int64_t PackedMatrix::record_bytes() const {
  return kHeaderBytes + (is_q4(dtype) ? kPackedBlock / 2 : kPackedBlock) * kPackedCols;
}

PackedMatrix pack_exact_matrix(const eng_tensor& t, int32_t head_dim) {
  if (t.dtype != ENG_DTYPE_Q8_0 && t.dtype != ENG_DTYPE_Q4_0 && t.dtype != ENG_DTYPE_Q4_1)
    invalid_argument("pack_exact_matrix: not a Q8_0, Q4_0 or Q4_1 tensor");
  if (t.cols % kPackedBlock != 0) invalid_argument("pack_exact_matrix: columns not a multiple of 32");
  PackedMatrix w;
  w.dtype = t.dtype;
  w.in = t.cols;
  w.out = t.rows;
  const int64_t nb = w.blocks(), rec = w.record_bytes();
  const int64_t src_block = dtype_row_bytes(t.dtype, kPackedBlock);
  w.data.assign(static_cast<size_t>(w.panels() * nb * rec), 0);
  const uint8_t* src = static_cast<const uint8_t*>(t.data);
  for (int64_t row = 0; row < t.rows; ++row) {
    const int64_t o = engine_row(t, row, head_dim);
    const int64_t p = o / kPackedCols, c = o % kPackedCols;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* s = src + (row * nb + b) * src_block;
      uint8_t* R = w.data.data() + (p * nb + b) * rec;
      const float d = half_to_float(load_u16(s));
      const float m = t.dtype == ENG_DTYPE_Q4_1 ? half_to_float(load_u16(s + 2)) : 0.0f;
      const uint8_t* qs = s + (t.dtype == ENG_DTYPE_Q4_1 ? 4 : 2);
      std::memcpy(R + 4 * c, &d, 4);
      std::memcpy(R + 64 + 4 * c, &m, 4);
      uint8_t* q = R + kHeaderBytes;
      for (int64_t j = 0; j < kPackedBlock; ++j) {
        if (t.dtype == ENG_DTYPE_Q8_0) {
          q[j * kPackedCols + c] = qs[j];
          continue;
        }
        // ggml: element j < 16 is byte j's low nibble, j + 16 its high one.
        const uint8_t v = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
        q[(j / 2) * kPackedCols + c] |= static_cast<uint8_t>(j % 2 == 0 ? v : v << 4);
      }
    }
  }
  return w;
}

bool packed_isa_supported(PackedIsa isa) {
  switch (isa) {
    case PackedIsa::kScalar:
      return true;
#ifdef LOCKSTEP_PACKED_X86
    case PackedIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case PackedIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

const char* packed_isa_name(PackedIsa isa) {
  switch (isa) {
    case PackedIsa::kNone: return "none";
    case PackedIsa::kScalar: return "scalar";
    case PackedIsa::kAvx2: return "avx2";
    case PackedIsa::kAvx512: return "avx512";
  }
  return "?";
}

PackedIsa packed_active_isa() {
  static const PackedIsa isa = choose_isa();
  return isa;
}

void packed_gemm_cols_isa(PackedIsa isa, const float* X, int64_t rows, const PackedMatrix& W, int64_t o0,
                          int64_t o1, float* Y, int64_t ldy) {
  if (rows <= 0 || o1 <= o0) return;
  if (rows > kPackedMaxRows) invalid_argument("packed_gemm: more rows than kPackedMaxRows");
  switch (isa) {
#ifdef LOCKSTEP_PACKED_X86
    case PackedIsa::kAvx512: return drive_cols<Avx512Tiles>(X, rows, W, o0, o1, Y, ldy);
    case PackedIsa::kAvx2: return drive_cols<Avx2Tiles>(X, rows, W, o0, o1, Y, ldy);
#endif
    case PackedIsa::kScalar: return scalar_cols(X, rows, W, o0, o1, Y, ldy);
    default: invalid_argument("packed_gemm: kernel not supported here");
  }
}

void packed_gemm(ThreadPool* pool, const float* X, int64_t rows, const PackedMatrix& W, float* Y) {
  const PackedIsa isa = packed_active_isa();
  if (pool == nullptr) return packed_gemm_cols_isa(isa, X, rows, W, 0, W.out, Y, W.out);
  pool->for_ranges(W.out, kPackedCols, rows * W.in * W.out, kMinParallelMacs,
                   [&](int64_t o0, int64_t o1) { packed_gemm_cols_isa(isa, X, rows, W, o0, o1, Y, W.out); });
}

namespace {

// Ranges a thread of a multi-product pass (claimed dynamically), and the
// most ranges one job is cut into.
constexpr int64_t kRangesPerThread = 2;
constexpr int64_t kMaxJobRanges = 16;

// Cuts [0, out) into parts ranges of whole panels (the last ending at out).
int64_t range_bound(int64_t out, int64_t parts, int64_t p) {
  const int64_t panels = (out + kPackedCols - 1) / kPackedCols;
  return p >= parts ? out : std::min(out, panels * p / parts * kPackedCols);
}

// How many ranges a product of this much work is cut into.
int64_t job_parts(const ThreadPool& pool, int64_t rows, const PackedMatrix& W) {
  const int64_t panels = (W.out + kPackedCols - 1) / kPackedCols;
  int64_t parts = std::min<int64_t>(pool.size() * kRangesPerThread, kMaxJobRanges);
  parts = std::min(parts, rows * W.in * W.out / kMinParallelMacs);
  return std::max<int64_t>(1, std::min(parts, panels));
}

}  // namespace

void packed_gemm_jobs(ThreadPool* pool, const float* X, int64_t rows, const PackedJob* jobs, int njobs) {
  if (njobs > kPackedMaxJobs) invalid_argument("packed_gemm_jobs: more than kPackedMaxJobs jobs");
  const PackedIsa isa = packed_active_isa();
  if (pool == nullptr) {
    for (int j = 0; j < njobs; ++j)
      packed_gemm_cols_isa(isa, X, rows, *jobs[j].W, 0, jobs[j].W->out, jobs[j].Y, jobs[j].W->out);
    return;
  }
  // Item i belongs to the job whose cumulative range count passes it.
  int64_t first[kPackedMaxJobs + 1] = {0};
  for (int j = 0; j < njobs; ++j) first[j + 1] = first[j] + job_parts(*pool, rows, *jobs[j].W);
  pool->for_each(first[njobs], [&](int64_t i, int) {
    int j = 0;
    while (i >= first[j + 1]) ++j;
    const PackedMatrix& W = *jobs[j].W;
    const int64_t parts = first[j + 1] - first[j], p = i - first[j];
    packed_gemm_cols_isa(isa, X, rows, W, range_bound(W.out, parts, p), range_bound(W.out, parts, p + 1), jobs[j].Y,
                         W.out);
  });
}

void packed_gemm_gated(ThreadPool* pool, const float* X, int64_t rows, const PackedMatrix& Wg,
                       const PackedMatrix& Wu, float* gate, float* up,
                       const std::function<void(int64_t o0, int64_t o1)>& after) {
  if (Wg.out != Wu.out || Wg.in != Wu.in) invalid_argument("packed_gemm_gated: gate and up differ in shape");
  const PackedIsa isa = packed_active_isa();
  const int64_t out = Wg.out;
  auto range = [&](int64_t o0, int64_t o1) {
    packed_gemm_cols_isa(isa, X, rows, Wg, o0, o1, gate, out);
    packed_gemm_cols_isa(isa, X, rows, Wu, o0, o1, up, out);
    after(o0, o1);
  };
  if (pool == nullptr) return range(0, out);
  const int64_t parts = job_parts(*pool, 2 * rows, Wg);
  pool->for_each(parts, [&](int64_t p, int) { range(range_bound(out, parts, p), range_bound(out, parts, p + 1)); });
}

}  // namespace lockstep
