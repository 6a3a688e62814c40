// sampling.cpp: the sampling procedure of sampling.h (docs/sampling.md).
// Compiled with -ffp-contract=off like the rest of the engine: every product
// is rounded before it is added, as in the Go twin (bridge/sampling.go).
#include "sampling.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace lockstep {

double sampling_exp(double x) {
  if (!(x >= -700.0)) return 0.0;  // also NaN and -inf
  if (x > 0.0) x = 0.0;
  // x = k ln2 + r, |r| <= ln2 / 2; ln2 split so that k * kLn2Hi is exact.
  const double kLog2e = 1.44269504088896338700e+00;
  const double kLn2Hi = 6.93147180369123816490e-01;
  const double kLn2Lo = 1.90821492927058770002e-10;
  const double k = std::floor(x * kLog2e + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  // Taylor polynomial of degree 13, Horner form.
  double p = 1.0 / 6227020800.0;          // 1/13!
  p = p * r + 1.0 / 479001600.0;          // 1/12!
  p = p * r + 1.0 / 39916800.0;           // 1/11!
  p = p * r + 1.0 / 3628800.0;            // 1/10!
  p = p * r + 1.0 / 362880.0;             // 1/9!
  p = p * r + 1.0 / 40320.0;              // 1/8!
  p = p * r + 1.0 / 5040.0;               // 1/7!
  p = p * r + 1.0 / 720.0;                // 1/6!
  p = p * r + 1.0 / 120.0;                // 1/5!
  p = p * r + 1.0 / 24.0;                 // 1/4!
  p = p * r + 1.0 / 6.0;                  // 1/3!
  p = p * r + 0.5;                        // 1/2!
  p = p * r + 1.0;                        // 1/1!
  p = p * r + 1.0;                        // 1/0!
  // 2^k, k in [-1010, 0]: a normal double built from its bits (exact).
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(k) + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

int32_t sampling_argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

int32_t sample_token(const float* logits, int32_t vocab, const eng_sampling& p, int64_t pos,
                     SamplingScratch* s) {
  if (p.temperature == 0.0f) return sampling_argmax(logits, vocab);
  const size_t V = static_cast<size_t>(vocab);
  // 1. Temperature (float32 division); NaN -> -inf, +inf -> FLT_MAX.
  s->scaled.resize(V);
  float* scaled = s->scaled.data();
  for (size_t i = 0; i < V; ++i) {
    float v = logits[i] / p.temperature;
    if (std::isnan(v)) v = -INFINITY;
    if (v > FLT_MAX) v = FLT_MAX;
    scaled[i] = v;
  }
  // 2. Order by descending scaled logit, ties by lower id; keep the top k.
  s->order.resize(V);
  int32_t* order = s->order.data();
  for (size_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
  const auto before = [scaled](int32_t a, int32_t b) {
    return scaled[a] > scaled[b] || (scaled[a] == scaled[b] && a < b);
  };
  const size_t k = p.top_k <= 0 || static_cast<size_t>(p.top_k) >= V ? V : static_cast<size_t>(p.top_k);
  if (k < V)
    std::partial_sort(order, order + k, order + V, before);
  else
    std::sort(order, order + V, before);
  const double m = scaled[order[0]];
  if (m == -INFINITY) return order[0];
  // 3. Softmax in double over the kept set, summed in that order.
  s->prob.resize(k);
  double* prob = s->prob.data();
  double sum = 0.0;
  for (size_t j = 0; j < k; ++j) {
    prob[j] = sampling_exp(static_cast<double>(scaled[order[j]]) - m);
    sum += prob[j];
  }
  for (size_t j = 0; j < k; ++j) prob[j] = prob[j] / sum;
  // 4. Top-p: the smallest prefix whose cumulative probability >= top_p.
  size_t n = k;
  if (p.top_p < 1.0f) {
    const double top_p = p.top_p;
    double cum = 0.0;
    for (size_t j = 0; j < k; ++j) {
      cum += prob[j];
      if (cum >= top_p) {
        n = j + 1;
        break;
      }
    }
  }
  // 5. Renormalise over the prefix; the first index whose cumulative
  // probability exceeds u (the last kept one if rounding leaves none).
  double total = 0.0;
  for (size_t j = 0; j < n; ++j) total += prob[j];
  const double u = sampling_uniform(p.seed, pos);
  double cum = 0.0;
  for (size_t j = 0; j < n; ++j) {
    cum += prob[j] / total;
    if (cum > u) return order[j];
  }
  return order[n - 1];
}

}  // namespace lockstep
