// sampling.cpp: the sampling procedure of sampling.h (docs/sampling.md).
// Compiled with -ffp-contract=off like the rest of the engine: every product
// is rounded before it is added, as in the Go twin (bridge/sampling.go).
#include "sampling.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>

static_assert(ENG_MAX_LOGPROBS == 20, "the messages of sampling_invalid name 20");

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

double sampling_log(double x) {
  // x = f 2^e with f in [sqrt(1/2), sqrt(2)); log f = 2 atanh(z), z = (f-1)/(f+1),
  // |z| < 0.172: the odd series to z^21 (z^22 < 1.5e-17).
  int e = 0;
  double f = std::frexp(x, &e);  // f in [0.5, 1)
  if (f < 0.70710678118654752440) {
    f = f * 2.0;
    e = e - 1;
  }
  const double kLn2Hi = 6.93147180369123816490e-01;
  const double kLn2Lo = 1.90821492927058770002e-10;
  const double z = (f - 1.0) / (f + 1.0);
  const double z2 = z * z;
  double p = 1.0 / 21.0;
  for (int n = 19; n >= 1; n -= 2) p = p * z2 + 1.0 / static_cast<double>(n);
  const double de = static_cast<double>(e);
  return de * kLn2Hi + ((2.0 * z) * p + de * kLn2Lo);
}

namespace {

// A logit as the log-probabilities see it: NaN -> -inf, +inf -> FLT_MAX.
inline float lp_logit(float v) {
  if (std::isnan(v)) return -INFINITY;
  if (v > FLT_MAX) return FLT_MAX;
  return v;
}

}  // namespace

int32_t row_rank(const float* logits, int32_t vocab, int32_t token) {
  const float t = lp_logit(logits[token]);
  int32_t n = 0;
  for (int32_t i = 0; i < vocab; ++i) n += lp_logit(logits[i]) >= t;
  return n;
}

void row_logprobs(const float* logits, int32_t vocab, int32_t token, int32_t k, float* token_lp, int32_t* ids,
                  float* lps) {
  // 1. The largest logit and the top k (an insertion into a sorted list:
  // ids come in ascending order, so a later id never displaces an equal one).
  if (k > vocab) k = vocab;
  int32_t n = 0;
  float m = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i) {
    const float v = lp_logit(logits[i]);
    if (v > m) m = v;
    if (k == 0 || (n == k && !(v > lp_logit(logits[ids[n - 1]])))) continue;
    int32_t j = n < k ? n++ : k - 1;
    while (j > 0 && v > lp_logit(logits[ids[j - 1]])) {
      ids[j] = ids[j - 1];
      --j;
    }
    ids[j] = i;
  }
  // 2. log(sum exp(l - m)) in double, in id order (sampling's exp).
  if (m == -INFINITY) {
    // No finite logit: every id is equally (im)probable.
    const float u = static_cast<float>(-sampling_log(static_cast<double>(vocab)));
    *token_lp = u;
    for (int32_t j = 0; j < n; ++j) lps[j] = u;
    return;
  }
  const double dm = m;
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) sum += sampling_exp(static_cast<double>(lp_logit(logits[i])) - dm);
  const double lse = sampling_log(sum);
  auto lp = [&](int32_t id) {
    return static_cast<float>((static_cast<double>(lp_logit(logits[id])) - dm) - lse);
  };
  *token_lp = lp(token);
  for (int32_t j = 0; j < n; ++j) lps[j] = lp(ids[j]);
}

int32_t sampling_argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

namespace {

// Sorts ids[0, n) into s->ids (reused).
const std::vector<int32_t>& sorted_ids(const int32_t* a, int32_t na, const int32_t* b, int32_t nb,
                                       SamplingScratch* s) {
  s->ids.assign(a, a + na);
  s->ids.insert(s->ids.end(), b, b + nb);
  std::sort(s->ids.begin(), s->ids.end());
  return s->ids;
}

}  // namespace

void apply_logits_processors(float* row, int32_t vocab, const eng_sampling& p, SamplingScratch* s) {
  // 1. Logit bias, in the order given.
  for (int32_t j = 0; j < p.num_bias; ++j) row[p.bias_ids[j]] = row[p.bias_ids[j]] + p.bias_values[j];
  // 2. Repetition penalty over the distinct ids of the prompt and the output.
  const float rp = p.repetition_penalty;
  if (rp != 0.0f && rp != 1.0f) {
    const std::vector<int32_t>& ids = sorted_ids(p.prompt_tokens, p.num_prompt, p.output_tokens, p.num_output, s);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0 && ids[i] == ids[i - 1]) continue;
      const float l = row[ids[i]];
      row[ids[i]] = l > 0.0f ? l / rp : l * rp;
    }
  }
  // 3. Frequency and presence penalties over the output's ids and counts.
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    const std::vector<int32_t>& ids = sorted_ids(p.output_tokens, p.num_output, nullptr, 0, s);
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      const float count = static_cast<float>(j - i);
      float l = row[ids[i]];
      l = l - p.frequency_penalty * count;
      l = l - p.presence_penalty;
      row[ids[i]] = l;
      i = j;
    }
  }
  // 4. The allowed-token mask (structured outputs).
  if (p.allowed != nullptr)
    for (int32_t id = 0; id < vocab; ++id)
      if (((p.allowed[id / 32] >> (id % 32)) & 1u) == 0) row[id] = -INFINITY;
}

std::string sampling_invalid(const eng_sampling& p, int32_t vocab, const std::string& f) {
  char buf[256];
  auto bad = [&](const char* fmt, double v) {
    std::snprintf(buf, sizeof buf, fmt, f.c_str(), v);
    return std::string(buf);
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f)
    return bad("%s.temperature must be finite and >= 0, got %g", p.temperature);
  if (p.top_k < 0) return bad("%s.top_k must be >= 0 (0 = all tokens), got %g", p.top_k);
  if (!std::isfinite(p.top_p) || !(p.top_p > 0.0f) || p.top_p > 1.0f)
    return bad("%s.top_p must be in (0, 1] (1 = all tokens), got %g", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("%s.min_p must be in [0, 1], got %g", p.min_p);
  if (!std::isfinite(p.presence_penalty)) return bad("%s.presence_penalty must be finite, got %g", p.presence_penalty);
  if (!std::isfinite(p.frequency_penalty))
    return bad("%s.frequency_penalty must be finite, got %g", p.frequency_penalty);
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty < 0.0f)
    return bad("%s.repetition_penalty must be finite and >= 0 (0 or 1 = off), got %g", p.repetition_penalty);
  const struct {
    const char* name;
    int32_t n;
    const int32_t* ids;
  } lists[] = {{"bias_ids", p.num_bias, p.bias_ids},
               {"prompt_tokens", p.num_prompt, p.prompt_tokens},
               {"output_tokens", p.num_output, p.output_tokens}};
  for (const auto& l : lists) {
    if (l.n < 0) {
      std::snprintf(buf, sizeof buf, "%s.num of %s must be >= 0, got %d", f.c_str(), l.name, l.n);
      return buf;
    }
    if (l.n > 0 && l.ids == nullptr) {
      std::snprintf(buf, sizeof buf, "%s.%s is NULL (%d ids)", f.c_str(), l.name, l.n);
      return buf;
    }
    for (int32_t j = 0; j < l.n; ++j)
      if (l.ids[j] < 0 || l.ids[j] >= vocab) {
        std::snprintf(buf, sizeof buf, "%s.%s[%d] = %d is out of range [0, %d)", f.c_str(), l.name, j, l.ids[j], vocab);
        return buf;
      }
  }
  if (p.logprobs != 0 && p.logprobs != 1) return bad("%s.logprobs must be 0 or 1, got %g", p.logprobs);
  if (p.top_logprobs < 0 || p.top_logprobs > ENG_MAX_LOGPROBS)
    return bad("%s.top_logprobs must be in [0, 20] (ENG_MAX_LOGPROBS), got %g", p.top_logprobs);
  if (p.top_logprobs > 0 && p.logprobs == 0)
    return bad("%s.top_logprobs = %g needs logprobs = 1", p.top_logprobs);
  if (p.num_bias > 0 && p.bias_values == nullptr) return bad("%s.bias_values is NULL (%g values)", p.num_bias);
  if (p.allowed != nullptr) {
    bool any = false;
    for (int32_t id = 0; id < vocab && !any; ++id) any = ((p.allowed[id / 32] >> (id % 32)) & 1u) != 0;
    if (!any) return bad("%s.allowed allows no token of the vocabulary (%g ids)", vocab);
  }
  for (int32_t j = 0; j < p.num_bias; ++j)
    if (!std::isfinite(p.bias_values[j])) {
      std::snprintf(buf, sizeof buf, "%s.bias_values[%d] must be finite, got %g", f.c_str(), j,
                    static_cast<double>(p.bias_values[j]));
      return buf;
    }
  return "";
}

int32_t sample_token(const float* logits, int32_t vocab, const eng_sampling& p, int64_t pos,
                     SamplingScratch* s) {
  if (sampling_has_processors(p)) {
    s->processed.assign(logits, logits + vocab);
    apply_logits_processors(s->processed.data(), vocab, p, s);
    logits = s->processed.data();
  }
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
  size_t k = p.top_k <= 0 || static_cast<size_t>(p.top_k) >= V ? V : static_cast<size_t>(p.top_k);
  if (k < V)
    std::partial_sort(order, order + k, order + V, before);
  else
    std::sort(order, order + V, before);
  const double m = scaled[order[0]];
  if (m == -INFINITY) return order[0];
  // 3. Softmax in double over the kept set, summed in that order; min_p
  // keeps the prefix whose e_j = exp(s_j - s_0) >= min_p (the probability
  // relative to the largest one).
  s->prob.resize(k);
  double* prob = s->prob.data();
  double sum = 0.0;
  size_t kept = k;
  for (size_t j = 0; j < k; ++j) {
    prob[j] = sampling_exp(static_cast<double>(scaled[order[j]]) - m);
    if (j > 0 && p.min_p > 0.0f && prob[j] < static_cast<double>(p.min_p)) {
      kept = j;
      break;
    }
    sum += prob[j];
  }
  k = kept;
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
