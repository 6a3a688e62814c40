// quant_cpu.cpp: quantised products (see quant_cpu.h for the arithmetic).
#include "quant_cpu.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "checkpoint.h"
#include "status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOCKSTEP_QUANT_X86 1
#endif

namespace lockstep {
namespace {

// A product shares its column groups out so that each thread gets at least
// this many multiply-adds: below that a wake-up costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;

bool is_q4(int32_t dtype) { return dtype == ENG_DTYPE_Q4_0 || dtype == ENG_DTYPE_Q4_1; }

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Record layout: the scales dw[8] as halves, Q4_1's offsets mw[8] as halves
// (Q4_0's are −8·dw), then the quants.
int64_t quants_offset(int32_t dtype) { return dtype == ENG_DTYPE_Q4_1 ? 32 : 16; }

// Column c's scale and offset in a record, as the kernels read them: the
// stored halves widened (exact), Q4_0's offset −8·dw (exact).
void record_scales(const uint8_t* R, int32_t dtype, int64_t c, float* dw, float* mw) {
  *dw = half_to_float(load_u16(R + 2 * c));
  *mw = dtype == ENG_DTYPE_Q4_1 ? half_to_float(load_u16(R + 16 + 2 * c)) : dtype == ENG_DTYPE_Q4_0 ? -8.0f * *dw : 0.0f;
}
// Quant bytes of one column in a record (Q4 16, Q8 32).
int64_t column_quant_bytes(int32_t dtype) { return is_q4(dtype) ? 16 : 32; }

// The quants of column c's element j (0..31) in a record (layout in
// quant_cpu.h): Q4 0..15, Q8 the signed value.
int32_t weight_quant(const uint8_t* qs, bool q4, int64_t c, int j) {
  if (q4) {
    const uint8_t byte = qs[((j & 15) >> 2) * 32 + c * 4 + (j & 3)];
    return j < 16 ? byte & 0xF : byte >> 4;
  }
  return static_cast<int32_t>(qs[(j >> 2) * 32 + c * 4 + (j & 3)]) - 128;
}

// ---------------------------------------------------------------------------
// Scalar: the reference order, one element at a time.
void scalar_cols(const QuantRows& X, const QuantMatrix& W, int64_t o0, int64_t o1, float* Y, int64_t ldy) {
  const int64_t nb = W.blocks(), rec = W.record_bytes(), qoff = quants_offset(W.dtype);
  const bool q4 = is_q4(W.dtype);
  for (int64_t r = 0; r < X.rows; ++r) {
    const int8_t* xq = X.q.data() + r * X.in;
    const float* xd = X.d.data() + r * nb;
    const float* xs = X.sd.data() + r * nb;
    for (int64_t o = o0; o < o1; ++o) {
      const int64_t g = o / kQuantCols, c = o % kQuantCols;
      const uint8_t* base = W.data.data() + g * nb * rec;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* R = base + b * rec;
        float dw, mw;
        record_scales(R, W.dtype, c, &dw, &mw);
        const int8_t* x = xq + b * kQuantBlock;
        int32_t isum = 0;
        for (int j = 0; j < kQuantBlock; ++j) isum += weight_quant(R + qoff, q4, c, j) * x[j];
        const float t1 = (dw * xd[b]) * static_cast<float>(isum);
        acc = acc + t1;
        if (q4) {
          const float t2 = mw * xs[b];
          acc = acc + t2;
        }
      }
      Y[r * ldy + o] = acc;
    }
  }
}

#ifdef LOCKSTEP_QUANT_X86
// ---------------------------------------------------------------------------
// AVX2 and AVX-512 VNNI: one group of 8 columns per pass over the blocks,
// the columns in the lanes of every vector. A record's quants are stored as
// 8 vectors (Q4: 4, each holding two as nibbles) whose lane c holds column
// c's elements 4t..4t+3; the same 4 activations broadcast to every lane,
// so the integer dots accumulate per column in its lane, exact, with no
// reduction across lanes. The float part is then the scalar code's, lane
// by lane.

// acc + the 4-element dots of w (u8 in 0..15, Q4) or of the stored
// w + 128 (Q8) with the broadcast activations x (s8), per 32-bit lane.
// VNNI: dpbusd, with Q8's offset taken out by the caller (128 · Σ x);
// AVX2: maddubs + madd (pair sums below 2^15: Q4 15·127·2; Q8 by |w|
// against x with w's sign, 128·127·2).
template <bool Q4, bool Vnni>
__attribute__((target("avx2,avx512vl,avx512vnni"))) inline __m256i dot4(__m256i acc, __m256i w, __m256i x) {
  if constexpr (Vnni) {
    return _mm256_dpbusd_epi32(acc, w, x);
  } else if constexpr (Q4) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  } else {
    const __m256i ws = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(x, ws)), _mm256_set1_epi16(1)));
  }
}

// Rows r0 .. r0+R of group g: the 8 columns' quants of a block are loaded
// once and used for the R rows (each with its own accumulator, the same
// operations as alone).
template <int32_t Dtype, int R, bool Vnni>
__attribute__((target("avx2,avx512vl,avx512vnni,f16c"))) void avx2_rows(const QuantRows& X, const QuantMatrix& W,
                                                                        int64_t g, int64_t r0, float* out /* [R][8] */) {
  constexpr bool Q4 = Dtype != ENG_DTYPE_Q8_0;
  constexpr int64_t qoff = Dtype == ENG_DTYPE_Q4_1 ? 32 : 16;
  const int64_t nb = W.blocks(), rec = W.record_bytes(), in = X.in;
  const uint8_t* base = W.data.data() + g * nb * rec;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int8_t* xq = X.q.data() + r0 * in;
  const float* xd = X.d.data() + r0 * nb;
  const float* xs = X.sd.data() + r0 * nb;
  const int32_t* xsum = X.s.data() + r0 * nb;
  __m256 acc[R];
  for (int k = 0; k < R; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* Rp = base + b * rec;
    _mm_prefetch(reinterpret_cast<const char*>(Rp + 4 * rec), _MM_HINT_T0);
    __m256i w[8];
    if constexpr (Q4) {
      for (int s = 0; s < 4; ++s) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Rp + qoff + 32 * s));
        w[s] = _mm256_and_si256(raw, low4);
        w[s + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
    } else {
      for (int t = 0; t < 8; ++t) w[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Rp + qoff + 32 * t));
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(Rp)));
    __m256 mw = _mm256_setzero_ps();
    if constexpr (Dtype == ENG_DTYPE_Q4_1) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(Rp + 16)));
    if constexpr (Dtype == ENG_DTYPE_Q4_0) mw = _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
    for (int k = 0; k < R; ++k) {
      const int8_t* x = xq + k * in + b * kQuantBlock;
      __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();
      for (int t = 0; t < 8; t += 2) {
        int32_t x0, x1;
        std::memcpy(&x0, x + 4 * t, 4);
        std::memcpy(&x1, x + 4 * t + 4, 4);
        i0 = dot4<Q4, Vnni>(i0, w[t], _mm256_set1_epi32(x0));
        i1 = dot4<Q4, Vnni>(i1, w[t + 1], _mm256_set1_epi32(x1));
      }
      __m256i isum = _mm256_add_epi32(i0, i1);
      if constexpr (!Q4 && Vnni) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(128 * xsum[k * nb + b]));
      const __m256 fsum = _mm256_cvtepi32_ps(isum);
      acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd[k * nb + b])), fsum));
      if constexpr (Q4) acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(mw, _mm256_set1_ps(xs[k * nb + b])));
    }
  }
  for (int k = 0; k < R; ++k) _mm256_storeu_ps(out + 8 * k, acc[k]);
}

template <int32_t Dtype, bool Vnni>
void avx2_group(const QuantRows& X, const QuantMatrix& W, int64_t g, float* Y, int64_t ldy, int64_t o0, int64_t o1) {
  constexpr int kRows = 4;
  float out[kRows * 8];
  const int64_t first = g * kQuantCols;
  for (int64_t r0 = 0; r0 < X.rows; r0 += kRows) {
    const int64_t n = X.rows - r0 < kRows ? X.rows - r0 : kRows;
    switch (n) {
      case 4: avx2_rows<Dtype, 4, Vnni>(X, W, g, r0, out); break;
      case 3: avx2_rows<Dtype, 3, Vnni>(X, W, g, r0, out); break;
      case 2: avx2_rows<Dtype, 2, Vnni>(X, W, g, r0, out); break;
      default: avx2_rows<Dtype, 1, Vnni>(X, W, g, r0, out); break;
    }
    for (int64_t k = 0; k < n; ++k)
      for (int64_t c = 0; c < kQuantCols; ++c) {
        const int64_t o = first + c;
        if (o >= o0 && o < o1) Y[(r0 + k) * ldy + o] = out[k * 8 + c];
      }
  }
}

template <bool Vnni>
void avx2_cols(const QuantRows& X, const QuantMatrix& W, int64_t o0, int64_t o1, float* Y, int64_t ldy) {
  for (int64_t g = o0 / kQuantCols; g * kQuantCols < o1; ++g) {
    if (W.dtype == ENG_DTYPE_Q4_1)
      avx2_group<ENG_DTYPE_Q4_1, Vnni>(X, W, g, Y, ldy, o0, o1);
    else if (W.dtype == ENG_DTYPE_Q4_0)
      avx2_group<ENG_DTYPE_Q4_0, Vnni>(X, W, g, Y, ldy, o0, o1);
    else
      avx2_group<ENG_DTYPE_Q8_0, Vnni>(X, W, g, Y, ldy, o0, o1);
  }
}
#endif  // LOCKSTEP_QUANT_X86

QuantIsa choose_isa() {
  const char* env = std::getenv("LOCKSTEP_QUANT");
  if (env != nullptr && *env != '\0') {
    for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni})
      if (std::strcmp(env, quant_isa_name(isa)) == 0 && quant_isa_supported(isa)) return isa;
  }
  if (quant_isa_supported(QuantIsa::kAvx512Vnni)) return QuantIsa::kAvx512Vnni;
  return quant_isa_supported(QuantIsa::kAvx2) ? QuantIsa::kAvx2 : QuantIsa::kScalar;
}

}  // namespace

bool quant_dtype(int32_t dtype) {
  return dtype == ENG_DTYPE_Q8_0 || dtype == ENG_DTYPE_Q4_0 || dtype == ENG_DTYPE_Q4_1;
}

int64_t QuantMatrix::record_bytes() const {
  return quants_offset(dtype) + kQuantCols * column_quant_bytes(dtype);
}

QuantMatrix pack_quant_matrix(const eng_tensor& t, int32_t head_dim) {
  if (!quant_dtype(t.dtype)) invalid_argument("pack_quant_matrix: not a quantised dtype");
  QuantMatrix m;
  m.dtype = t.dtype;
  m.in = t.cols;
  m.out = t.rows;
  const int64_t nb = m.blocks(), rec = m.record_bytes(), qoff = quants_offset(t.dtype);
  const int64_t qbytes = column_quant_bytes(t.dtype);
  const int64_t src_block = dtype_row_bytes(t.dtype, kQuantBlock);
  m.data.assign(static_cast<size_t>(m.groups() * nb * rec), 0);
  const uint8_t* src = static_cast<const uint8_t*>(t.data);
  for (int64_t row = 0; row < t.rows; ++row) {
    const int64_t o = engine_row(t, row, head_dim);
    const int64_t g = o / kQuantCols, c = o % kQuantCols;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* s = src + (row * nb + b) * src_block;
      uint8_t* R = m.data.data() + (g * nb + b) * rec;
      // Q4_0: d·(q − 8) = d·q + (−8·d), the offset made by the kernels.
      std::memcpy(R + 2 * c, s, 2);
      const uint8_t* qs = s + 2;
      if (t.dtype == ENG_DTYPE_Q4_1) {
        std::memcpy(R + 16 + 2 * c, s + 2, 2);
        qs = s + 4;
      }
      // Lane c of quant vector t: bytes 4t..4t+3 (Q4: ggml's bytes, each
      // element j low and j + 16 high; Q8: the values plus 128).
      for (int64_t v = 0; v < qbytes / 4; ++v)
        for (int64_t j = 0; j < 4; ++j) {
          const uint8_t q = qs[4 * v + j];
          R[qoff + v * 32 + c * 4 + j] = is_q4(t.dtype) ? q : static_cast<uint8_t>(q ^ 0x80);
        }
    }
  }
  return m;
}

namespace {

// One block of 32 activations: q, and the block's dx and sd. The scalar
// and the AVX2 versions compute the same values: max and rounding to the
// nearest even are exact operations, whatever their order.
void quantize_block_scalar(const float* x, int8_t* q, float* d_out, float* sd_out, int32_t* s_out) {
  float amax = 0.0f;
  for (int j = 0; j < kQuantBlock; ++j) {
    const float a = std::fabs(x[j]);
    amax = a > amax ? a : amax;
  }
  const float d = amax / 127.0f;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t sum = 0;
  for (int j = 0; j < kQuantBlock; ++j) {
    float v = std::nearbyint(x[j] * id);
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    const int32_t qi = static_cast<int32_t>(v);
    q[j] = static_cast<int8_t>(qi);
    sum += qi;
  }
  *d_out = d;
  *sd_out = d * static_cast<float>(sum);
  *s_out = sum;
}

#ifdef LOCKSTEP_QUANT_X86
__attribute__((target("avx2"))) void quantize_block_avx2(const float* x, int8_t* q, float* d_out, float* sd_out,
                                                         int32_t* s_out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 m = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float amax = _mm_cvtss_f32(h);
  const float d = amax / 127.0f;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const __m256 idv = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  __m256i qi[4];
  __m256i sum = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
    qi[k] = _mm256_cvtps_epi32(r);
    sum = _mm256_add_epi32(sum, qi[k]);
  }
  // int32 → int8 in order: packs interleave the 128-bit lanes, the permute
  // puts them back.
  const __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]), p23 = _mm256_packs_epi32(qi[2], qi[3]);
  const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p);
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  const int32_t sum_q = _mm_cvtsi128_si32(s4);
  *d_out = d;
  *sd_out = d * static_cast<float>(sum_q);
  *s_out = sum_q;
}
#endif

}  // namespace

void quantize_rows(const float* X, int64_t rows, int64_t in, QuantRows* out) {
  const int64_t nb = in / kQuantBlock;
  out->rows = rows;
  out->in = in;
  if (out->q.size() < static_cast<size_t>(rows * in)) out->q.resize(static_cast<size_t>(rows * in));
  if (out->d.size() < static_cast<size_t>(rows * nb)) out->d.resize(static_cast<size_t>(rows * nb));
  if (out->sd.size() < static_cast<size_t>(rows * nb)) out->sd.resize(static_cast<size_t>(rows * nb));
  if (out->s.size() < static_cast<size_t>(rows * nb)) out->s.resize(static_cast<size_t>(rows * nb));
#ifdef LOCKSTEP_QUANT_X86
  const bool avx2 = quant_active_isa() != QuantIsa::kScalar;
#else
  const bool avx2 = false;
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = X + r * in + b * kQuantBlock;
      int8_t* q = out->q.data() + r * in + b * kQuantBlock;
      float* d = out->d.data() + r * nb + b;
      float* sd = out->sd.data() + r * nb + b;
      int32_t* sq = out->s.data() + r * nb + b;
#ifdef LOCKSTEP_QUANT_X86
      if (avx2) {
        quantize_block_avx2(x, q, d, sd, sq);
        continue;
      }
#endif
      (void)avx2;
      quantize_block_scalar(x, q, d, sd, sq);
    }
}

void quantize_rows_scalar(const float* X, int64_t rows, int64_t in, QuantRows* out) {
  const int64_t nb = in / kQuantBlock;
  out->rows = rows;
  out->in = in;
  out->q.resize(static_cast<size_t>(rows * in));
  out->d.resize(static_cast<size_t>(rows * nb));
  out->sd.resize(static_cast<size_t>(rows * nb));
  out->s.resize(static_cast<size_t>(rows * nb));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b)
      quantize_block_scalar(X + r * in + b * kQuantBlock, out->q.data() + r * in + b * kQuantBlock,
                            out->d.data() + r * nb + b, out->sd.data() + r * nb + b, out->s.data() + r * nb + b);
}

bool quant_isa_supported(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar: return true;
#ifdef LOCKSTEP_QUANT_X86
    case QuantIsa::kAvx2: return __builtin_cpu_supports("avx2");
    case QuantIsa::kAvx512Vnni:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
#endif
    default: return false;
  }
}

const char* quant_isa_name(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar: return "scalar";
    case QuantIsa::kAvx2: return "avx2";
    case QuantIsa::kAvx512Vnni: return "avx512vnni";
  }
  return "?";
}

QuantIsa quant_active_isa() {
  static const QuantIsa isa = choose_isa();
  return isa;
}

void quant_gemm_cols_isa(QuantIsa isa, const QuantRows& X, const QuantMatrix& W, int64_t o0, int64_t o1, float* Y,
                         int64_t ldy) {
  if (X.rows <= 0 || o1 <= o0) return;
  if (X.in != W.in) invalid_argument("quant_gemm: activations and weights disagree on the input width");
#ifdef LOCKSTEP_QUANT_X86
  if (isa == QuantIsa::kAvx2) return avx2_cols<false>(X, W, o0, o1, Y, ldy);
  if (isa == QuantIsa::kAvx512Vnni) return avx2_cols<true>(X, W, o0, o1, Y, ldy);
#endif
  scalar_cols(X, W, o0, o1, Y, ldy);
}

void quant_gemm(ThreadPool* pool, const QuantRows& X, const QuantMatrix& W, float* Y) {
  const QuantIsa isa = quant_active_isa();
  if (pool == nullptr) return quant_gemm_cols_isa(isa, X, W, 0, W.out, Y, W.out);
  // Ranges of whole column groups, so that no group is split.
  pool->for_ranges(W.out, kQuantCols, X.rows * W.in * W.out, kMinParallelMacs,
                   [&](int64_t o0, int64_t o1) { quant_gemm_cols_isa(isa, X, W, o0, o1, Y, W.out); });
}

}  // namespace lockstep
