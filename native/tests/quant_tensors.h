// quant_tensors.h: random ggml tensors (Q8_0, Q4_0, Q4_1) for the native
// tests of the products that read quantised blocks (test_quant, test_packed).
#ifndef LOCKSTEP_NATIVE_TESTS_QUANT_TENSORS_H
#define LOCKSTEP_NATIVE_TESTS_QUANT_TENSORS_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine.h"

namespace {

uint64_t rng = 0x243F6A8885A308D3ull;
uint64_t next() {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
float uniform() { return static_cast<float>(next() >> 40) / 16777216.0f * 2.0f - 1.0f; }

// IEEE half of a float (round to nearest even, normal range only).
uint16_t to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = x & 0x7FFFFF;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(h);
}

// A random ggml tensor [rows][cols] of dtype, blocks of 32.
std::vector<uint8_t> random_tensor(int32_t dtype, int64_t rows, int64_t cols) {
  const int64_t nb = cols / 32, bb = dtype == ENG_DTYPE_Q8_0 ? 34 : dtype == ENG_DTYPE_Q4_0 ? 18 : 20;
  std::vector<uint8_t> t(static_cast<size_t>(rows * nb * bb));
  for (int64_t k = 0; k < rows * nb; ++k) {
    uint8_t* b = t.data() + k * bb;
    const uint16_t d = to_half(0.001f + 0.05f * std::fabs(uniform())), m = to_half(0.02f * uniform());
    std::memcpy(b, &d, 2);
    int64_t q = 2;
    if (dtype == ENG_DTYPE_Q4_1) {
      std::memcpy(b + 2, &m, 2);
      q = 4;
    }
    for (int64_t j = q; j < bb; ++j) b[j] = static_cast<uint8_t>(next());
    if (dtype == ENG_DTYPE_Q8_0)
      for (int64_t j = q; j < bb; ++j)
        if (b[j] == 0x80) b[j] = 0x81;  // ggml's Q8_0 quants lie in [-127, 127]
  }
  return t;
}

eng_tensor tensor_of(int32_t dtype, int64_t rows, int64_t cols, const std::vector<uint8_t>& data, int32_t heads = 0) {
  eng_tensor t;
  std::memset(&t, 0, sizeof t);
  t.kind = ENG_WEIGHT_WQ;
  t.dtype = dtype;
  t.rows = rows;
  t.cols = cols;
  t.nbytes = static_cast<int64_t>(data.size());
  t.data = data.data();
  t.interleaved_rope_heads = heads;
  return t;
}

// A product's columns [o0, o1) computed alone into Y (rows x out, filled with
// `fill` before): whether they have ref's bits and every other element is
// still `fill`.
inline bool range_only(const std::vector<float>& Y, const std::vector<float>& ref, int64_t rows, int64_t out,
                       int64_t o0, int64_t o1, float fill) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const size_t k = static_cast<size_t>(r * out + o);
      if (o >= o0 && o < o1 ? std::memcmp(&Y[k], &ref[k], 4) != 0 : Y[k] != fill) return false;
    }
  return true;
}

}  // namespace

#endif  // LOCKSTEP_NATIVE_TESTS_QUANT_TENSORS_H
