// sampling.h: per-request stochastic sampling (temperature, top-k, top-p)
// with a counter-based generator, shared by every native backend. The Go
// twin of this file is bridge/sampling.go; both implement the procedure of
// docs/sampling.md bit for bit (bridge/native's tests check that they pick
// the same tokens).
//
// Determinism rule: the token drawn for a sequence depends only on its
// logits row, its eng_sampling parameters and the absolute position of the
// token being sampled (the position of the last input token + 1), never on
// the batch, the rank, the chunking or on how often the request was
// recomputed. The random number is Philox4x32-10 (Salmon et al., SC'11)
// keyed by the request seed with the position as counter, so nothing is
// stateful.
#ifndef LOCKSTEP_NATIVE_SAMPLING_H
#define LOCKSTEP_NATIVE_SAMPLING_H

#include <cstdint>
#include <string>
#include <vector>

#include "engine.h"

namespace lockstep {

// Philox4x32 with 10 rounds: counter ctr[4], key key[2] -> out[4].
inline void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  const uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  const uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = uint64_t{kM0} * c0, p1 = uint64_t{kM1} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The uniform of a draw: u in [0, 1) from the top 24 bits of the first
// output word of Philox4x32-10 with key {seed low, seed high} and counter
// {pos low, pos high, 0, 0}.
inline double sampling_uniform(uint64_t seed, int64_t pos) {
  const uint64_t p = static_cast<uint64_t>(pos);
  const uint32_t ctr[4] = {static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), 0u, 0u};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t out[4];
  philox4x32_10(ctr, key, out);
  return static_cast<double>(out[0] >> 8) * (1.0 / 16777216.0);
}

// exp(x) for x <= 0 with only +, -, * and exact scaling (no libm), so that
// the C++ and Go implementations round identically; relative error < 1e-15.
// Returns 0 for x < -700.
double sampling_exp(double x);

// log(x) for x >= 1 with only +, -, *, / and exact scaling (frexp), so that
// the C++ and Go implementations round identically; relative error < 1e-15.
double sampling_log(double x);

// The log-probabilities of a row (eng_sampling.logprobs, vLLM's
// raw_logprobs): token's into *token_lp, the top k (k <= ENG_MAX_LOGPROBS;
// min(k, vocab) are written) into ids/lps, highest first, ties to the lower
// id. NaN logits count as -inf, +inf as FLT_MAX.
void row_logprobs(const float* logits, int32_t vocab, int32_t token, int32_t k, float* token_lp,
                  int32_t* ids, float* lps);

// The rank of token in a logits row (vLLM's): how many ids have a logit at
// least its own (NaN as -inf, +inf as FLT_MAX), so the most probable is 1.
int32_t row_rank(const float* logits, int32_t vocab, int32_t token);

// Lowest index of the maximum (NaN never wins): the greedy pick.
int32_t sampling_argmax(const float* logits, int32_t vocab);

// Reusable buffers of sample_token (one per backend; not thread-safe).
struct SamplingScratch {
  std::vector<float> scaled;
  std::vector<int32_t> order;
  std::vector<double> prob;
  std::vector<float> processed;  // the row after the logits processors
  std::vector<int32_t> ids;      // sorted token ids (penalty counts)
};

// Whether p uses a logits processor (bias, penalties; eng_sampling in
// engine.h): the row must then be processed before the pick.
inline bool sampling_has_processors(const eng_sampling& p) {
  return p.num_bias > 0 || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
         (p.repetition_penalty != 0.0f && p.repetition_penalty != 1.0f) || p.allowed != nullptr;
}

// Whether a row sampled under p needs its logits on the host: a stochastic
// draw or a logits processor (a device backend keeps its argmax only for
// plain greedy rows).
inline bool sampling_on_host(const eng_sampling& p) {
  return p.temperature > 0.0f || sampling_has_processors(p);
}

// Applies p's logits processors to row[vocab] in place (engine.h's order).
// p must be valid.
void apply_logits_processors(float* row, int32_t vocab, const eng_sampling& p, SamplingScratch* scratch);

// The message naming the first invalid field of p for a vocabulary of
// vocab ids ("" when p is valid); field is the prefix of the names
// ("sampling[3]" or "params").
std::string sampling_invalid(const eng_sampling& p, int32_t vocab, const std::string& field);

// Picks the token of one logits row under p at absolute position pos (the
// position of the token being sampled), following docs/sampling.md.
// p must be valid (engine.cpp validates it); temperature 0 is greedy.
int32_t sample_token(const float* logits, int32_t vocab, const eng_sampling& p, int64_t pos,
                     SamplingScratch* scratch);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_SAMPLING_H
