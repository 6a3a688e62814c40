// dtypes.cpp: checkpoint element encodings (see checkpoint.h): their row
// sizes, their conversion to float32 in ggml's order of operations, and
// the Q8_0 copy the quantised kernels take of the types they do not read.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "status.h"

namespace lockstep {
namespace {

constexpr int64_t kBlock = 32;   // elements per quantised block
constexpr int64_t kSuper = 256;  // elements per "K" super-block

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

namespace {

// Q4_K and Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes.
void scale_min_k4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Dequantises one 256-element super-block of a K type at p into y (ggml's
// dequantize_row_q*_K, in its operation order) and returns the next block.
const uint8_t* dequantize_k_block(int32_t dtype, const uint8_t* p, float* y) {
  switch (dtype) {
    case ENG_DTYPE_Q2_K: {  // scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin
      const uint8_t* sc = p;
      const uint8_t* q = p + 16;
      const float d = half_to_float(load_u16(p + 80)), dmin = half_to_float(load_u16(p + 82));
      int is = 0;
      for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
          for (int half = 0; half < 2; ++half) {
            const uint8_t s = sc[is++];
            const float dl = d * static_cast<float>(s & 0xF), ml = dmin * static_cast<float>(s >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
          }
      return p + 84;
    }
    case ENG_DTYPE_Q3_K: {  // hmask[32], qs[64], scales[12] (6-bit, packed), d
      const uint8_t* hm = p;
      const uint8_t* q = p + 32;
      const uint8_t* packed = p + 96;
      const float d = half_to_float(load_u16(p + 108));
      int8_t scales[16];
      for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        scales[j] = static_cast<int8_t>(low | high << 4);
      }
      int is = 0;
      uint8_t m = 1;
      for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2, m <<= 1)
          for (int half = 0; half < 2; ++half) {
            const float dl = d * static_cast<float>(scales[is++] - 32);
            for (int l = 0; l < 16; ++l) {
              const int k = l + 16 * half;
              *y++ = dl * static_cast<float>(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
            }
          }
      return p + 110;
    }
    case ENG_DTYPE_Q4_K: case ENG_DTYPE_Q5_K: {
      // d, dmin, scales[12], (Q5_K: qh[32]), qs[128]
      const bool q5 = dtype == ENG_DTYPE_Q5_K;
      const float d = half_to_float(load_u16(p)), dmin = half_to_float(load_u16(p + 2));
      const uint8_t* sc = p + 4;
      const uint8_t* qh = p + 16;
      const uint8_t* q = p + (q5 ? 48 : 16);
      uint8_t u1 = 1, u2 = 2;
      for (int j = 0, is = 0; j < 256; j += 64, q += 32, is += 2, u1 <<= 2, u2 <<= 2) {
        int s, mn;
        scale_min_k4(is, sc, &s, &mn);
        const float d1 = d * static_cast<float>(s), m1 = dmin * static_cast<float>(mn);
        scale_min_k4(is + 1, sc, &s, &mn);
        const float d2 = d * static_cast<float>(s), m2 = dmin * static_cast<float>(mn);
        for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((q[l] & 0xF) + (q5 && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((q[l] >> 4) + (q5 && (qh[l] & u2) ? 16 : 0)) - m2;
      }
      return p + (q5 ? 176 : 144);
    }
    default: {  // Q6_K: ql[128], qh[64], scales[16] (int8), d
      const uint8_t* ql = p;
      const uint8_t* qh = p + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
      const float d = half_to_float(load_u16(p + 208));
      for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
          const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
          const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
          y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
          y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
          y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
          y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
      return p + 210;
    }
  }
}

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = man;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      u = sign | ((127 - 15 - e) << 23) | ((m & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7F800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case ENG_DTYPE_F32: return "F32";
    case ENG_DTYPE_F16: return "F16";
    case ENG_DTYPE_BF16: return "BF16";
    case ENG_DTYPE_Q8_0: return "Q8_0";
    case ENG_DTYPE_Q4_0: return "Q4_0";
    case ENG_DTYPE_Q4_1: return "Q4_1";
    case ENG_DTYPE_Q5_0: return "Q5_0";
    case ENG_DTYPE_Q5_1: return "Q5_1";
    case ENG_DTYPE_Q2_K: return "Q2_K";
    case ENG_DTYPE_Q3_K: return "Q3_K";
    case ENG_DTYPE_Q4_K: return "Q4_K";
    case ENG_DTYPE_Q5_K: return "Q5_K";
    case ENG_DTYPE_Q6_K: return "Q6_K";
  }
  return "unknown dtype";
}

int64_t dtype_row_bytes(int32_t dtype, int64_t cols) {
  switch (dtype) {
    case ENG_DTYPE_F32: return 4 * cols;
    case ENG_DTYPE_F16: case ENG_DTYPE_BF16: return 2 * cols;
    case ENG_DTYPE_Q8_0: return cols % kBlock ? -1 : cols / kBlock * 34;
    case ENG_DTYPE_Q4_0: return cols % kBlock ? -1 : cols / kBlock * 18;
    case ENG_DTYPE_Q4_1: return cols % kBlock ? -1 : cols / kBlock * 20;
    case ENG_DTYPE_Q5_0: return cols % kBlock ? -1 : cols / kBlock * 22;
    case ENG_DTYPE_Q5_1: return cols % kBlock ? -1 : cols / kBlock * 24;
    case ENG_DTYPE_Q2_K: return cols % kSuper ? -1 : cols / kSuper * 84;
    case ENG_DTYPE_Q3_K: return cols % kSuper ? -1 : cols / kSuper * 110;
    case ENG_DTYPE_Q4_K: return cols % kSuper ? -1 : cols / kSuper * 144;
    case ENG_DTYPE_Q5_K: return cols % kSuper ? -1 : cols / kSuper * 176;
    case ENG_DTYPE_Q6_K: return cols % kSuper ? -1 : cols / kSuper * 210;
  }
  return -2;
}

void dequantize_row(int32_t dtype, const void* src, int64_t cols, float* out) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case ENG_DTYPE_F32:
      std::memcpy(out, p, sizeof(float) * static_cast<size_t>(cols));
      return;
    case ENG_DTYPE_F16:
      for (int64_t i = 0; i < cols; ++i) out[i] = half_to_float(load_u16(p + 2 * i));
      return;
    case ENG_DTYPE_BF16:
      for (int64_t i = 0; i < cols; ++i) out[i] = bf16_to_float(load_u16(p + 2 * i));
      return;
    case ENG_DTYPE_Q8_0:
      for (int64_t b = 0; b < cols / kBlock; ++b, p += 34) {
        const float d = half_to_float(load_u16(p));
        const int8_t* q = reinterpret_cast<const int8_t*>(p + 2);
        for (int j = 0; j < kBlock; ++j) out[b * kBlock + j] = d * static_cast<float>(q[j]);
      }
      return;
    case ENG_DTYPE_Q4_0:
      for (int64_t b = 0; b < cols / kBlock; ++b, p += 18) {
        const float d = half_to_float(load_u16(p));
        const uint8_t* q = p + 2;
        for (int j = 0; j < 16; ++j) {
          out[b * kBlock + j] = d * static_cast<float>((q[j] & 0xF) - 8);
          out[b * kBlock + 16 + j] = d * static_cast<float>((q[j] >> 4) - 8);
        }
      }
      return;
    case ENG_DTYPE_Q4_1:
      for (int64_t b = 0; b < cols / kBlock; ++b, p += 20) {
        const float d = half_to_float(load_u16(p)), m = half_to_float(load_u16(p + 2));
        const uint8_t* q = p + 4;
        for (int j = 0; j < 16; ++j) {
          out[b * kBlock + j] = d * static_cast<float>(q[j] & 0xF) + m;
          out[b * kBlock + 16 + j] = d * static_cast<float>(q[j] >> 4) + m;
        }
      }
      return;
    case ENG_DTYPE_Q5_0: case ENG_DTYPE_Q5_1: {
      // A fifth bit per element (qh, little-endian: bit j for element j of
      // the low nibbles, bit j + 16 for the high ones).
      const bool q51 = dtype == ENG_DTYPE_Q5_1;
      for (int64_t b = 0; b < cols / kBlock; ++b, p += q51 ? 24 : 22) {
        const float d = half_to_float(load_u16(p)), m = q51 ? half_to_float(load_u16(p + 2)) : 0.0f;
        const uint8_t* h = p + (q51 ? 4 : 2);
        const uint32_t qh = uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 | uint32_t(h[3]) << 24;
        const uint8_t* q = h + 4;
        for (int j = 0; j < 16; ++j) {
          const int lo = (q[j] & 0xF) | int((qh >> j) & 1) << 4, hi = (q[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
          if (q51) {
            out[b * kBlock + j] = d * static_cast<float>(lo) + m;
            out[b * kBlock + 16 + j] = d * static_cast<float>(hi) + m;
          } else {
            out[b * kBlock + j] = d * static_cast<float>(lo - 16);
            out[b * kBlock + 16 + j] = d * static_cast<float>(hi - 16);
          }
        }
      }
      return;
    }
    case ENG_DTYPE_Q2_K: case ENG_DTYPE_Q3_K: case ENG_DTYPE_Q4_K: case ENG_DTYPE_Q5_K: case ENG_DTYPE_Q6_K:
      for (int64_t b = 0; b < cols / kSuper; ++b)
        p = dequantize_k_block(dtype, p, out + b * kSuper);
      return;
  }
  invalid_argument("dequantize_row: unknown dtype " + std::to_string(dtype));
}


// float -> IEEE half, round to nearest even (finite inputs of a Q8_0 scale).
uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t man = x & 0x7FFFFFu;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow: infinity
  if (exp <= 0) {  // a subnormal half (or zero)
    if (exp < -10) return static_cast<uint16_t>(sign);
    man |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = man >> shift;
    const uint32_t rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = static_cast<uint32_t>(exp) << 10 | man >> 13;
  const uint32_t rest = man & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;  // may carry into the exponent: still right
  return static_cast<uint16_t>(sign | h);
}

// The quantised types the int8 kernels do not read (Q5_0, Q5_1, the K
// types): under the quant kernels their projections are converted to Q8_0.
bool requantised_dtype(int32_t dtype) { return dtype >= ENG_DTYPE_Q5_0 && dtype <= ENG_DTYPE_Q6_K; }

// A Q8_0 copy of t (ggml's quantize_row_q8_0: per 32 values d = max|x| /
// 127, q = round(x / d), d stored as a half) in bytes, which back the
// returned tensor until bytes changes.
eng_tensor requantise_q8_0(const eng_tensor& t, std::vector<uint8_t>* bytes) {
  const int64_t rb = dtype_row_bytes(ENG_DTYPE_Q8_0, t.cols), src_rb = dtype_row_bytes(t.dtype, t.cols);
  bytes->assign(static_cast<size_t>(rb * t.rows), 0);
  std::vector<float> row(static_cast<size_t>(t.cols));
  for (int64_t r = 0; r < t.rows; ++r) {
    dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + r * src_rb, t.cols, row.data());
    uint8_t* out = bytes->data() + r * rb;
    for (int64_t b = 0; b < t.cols / kBlock; ++b, out += 34) {
      const float* x = row.data() + b * kBlock;
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t h = float_to_half(d);
      out[0] = static_cast<uint8_t>(h & 0xFF);
      out[1] = static_cast<uint8_t>(h >> 8);
      for (int j = 0; j < kBlock; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
    }
  }
  eng_tensor q = t;
  q.dtype = ENG_DTYPE_Q8_0;
  q.data = bytes->data();
  q.nbytes = rb * t.rows;
  return q;
}

}  // namespace lockstep
