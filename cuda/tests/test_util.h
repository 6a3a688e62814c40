// test_util.h: helpers shared by the CUDA tests: the no-device skip, random
// data (never zeros), poisoning, and relative-error checks.
#ifndef LOCKSTEP_CUDA_TEST_UTIL_H
#define LOCKSTEP_CUDA_TEST_UTIL_H

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace lockstep_test {

// Exits 0 with "SKIP: no CUDA device" when no device is usable (ctest on
// CPU-only machines); device-check.sh greps for this line and fails on it.
inline void skip_without_device(const char* test) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("SKIP: no CUDA device (%s: %s)\n", test,
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    std::exit(0);
  }
}

#define TCHECK(call)                                                                  \
  do {                                                                                \
    const cudaError_t e_ = (call);                                                    \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

// Counts failures; every check prints one line.
struct Report {
  int passed = 0, failed = 0;
  void check(bool ok, const std::string& what) {
    if (ok) ++passed;
    else ++failed;
    if (!ok || std::getenv("LOCKSTEP_TEST_VERBOSE")) std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  }
  int finish() {
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
  }
};

// Uniform in [lo, hi) with a non-zero guard: exact zeros are nudged away.
inline float rnd(std::mt19937_64& g, float lo = -1.0f, float hi = 1.0f) {
  float v = std::uniform_real_distribution<float>(lo, hi)(g);
  return v == 0.0f ? 1e-3f : v;
}

// ||out - ref|| / ||ref|| over n elements; any non-finite out (an unwritten,
// poisoned element) returns +inf.
inline double rel_err(const float* out, const double* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// NaN bytes, so that an unwritten float32 or bf16 output is caught.
inline void poison(void* dev, size_t bytes) { TCHECK(cudaMemset(dev, 0xFF, bytes)); }

}  // namespace lockstep_test

#endif  // LOCKSTEP_CUDA_TEST_UTIL_H
