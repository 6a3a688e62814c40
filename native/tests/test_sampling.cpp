// test_sampling: Philox4x32-10 against Random123's known-answer vectors, the
// portable exp against libm, the sampling procedure's properties (greedy at
// temperature 0, top-k and top-p supports, frequencies follow the softmax,
// one draw per (seed, position)), and through the C ABI: sampled tokens
// independent of chunking and batching, asynchronous steps own their
// parameters, temperature 0 equals a step without a sampling array.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "sampling.h"
#include "test_engine.h"

using lockstep::philox4x32_10;
using lockstep::sample_token;
using lockstep::SamplingScratch;

namespace {

constexpr int32_t kVocab = 512;  // tiny preset
constexpr int32_t kP = 8;

// Random logits in [-scale, scale) from a xorshift stream.
std::vector<float> random_logits(uint64_t seed, int32_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (auto& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = (static_cast<float>(x >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
  }
  return v;
}

void test_philox_kat() {
  // Random123 tests/kat_vectors, "philox4x32 10": ctr[4] key[2] -> out[4].
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  } kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    uint32_t out[4];
    philox4x32_10(k.ctr, k.key, out);
    for (int i = 0; i < 4; ++i) CHECKF(out[i] == k.out[i], "word %d: %08x, want %08x", i, out[i], k.out[i]);
  }
  // The uniform: top 24 bits of word 0 of counter {pos, 0, 0, 0}, key {seed}.
  const double u = lockstep::sampling_uniform(0, 0);
  CHECK(u == (0x6627e8d5u >> 8) / 16777216.0);
}

void test_exp() {
  double worst = 0;
  for (double x = -700; x <= 0; x += 0.0137) {
    const double got = lockstep::sampling_exp(x), want = std::exp(x);
    worst = std::fmax(worst, std::fabs(got - want) / want);
  }
  CHECKF(worst < 1e-14, "relative error %g", worst);
  CHECK(lockstep::sampling_exp(0) == 1.0);
  CHECK(lockstep::sampling_exp(-701) == 0.0);
  CHECK(lockstep::sampling_exp(-INFINITY) == 0.0);
}

void test_procedure() {
  SamplingScratch s;
  for (uint64_t c = 0; c < 200; ++c) {
    const std::vector<float> lg = random_logits(c, kVocab, 4.0f);
    const int32_t greedy = lockstep::sampling_argmax(lg.data(), kVocab);
    eng_sampling g{0.0f, 7, 0.5f, c};
    CHECK(sample_token(lg.data(), kVocab, g, 10, &s) == greedy);
    eng_sampling k1{1.5f, 1, 1.0f, c};
    CHECK(sample_token(lg.data(), kVocab, k1, 10, &s) == greedy);
    eng_sampling p0{1.5f, 0, 1e-6f, c};
    CHECK(sample_token(lg.data(), kVocab, p0, 10, &s) == greedy);
    // top-k 3: only the three largest.
    std::vector<int32_t> idx(kVocab);
    for (int32_t i = 0; i < kVocab; ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
    eng_sampling k3{2.0f, 3, 1.0f, c};
    for (int64_t pos = 0; pos < 20; ++pos) {
      const int32_t t = sample_token(lg.data(), kVocab, k3, pos, &s);
      CHECK(t == idx[0] || t == idx[1] || t == idx[2]);
      // Same (seed, pos): same token.
      CHECK(sample_token(lg.data(), kVocab, k3, pos, &s) == t);
    }
  }
  // Frequencies follow the softmax: logits {0, ln 2, ln 4, -inf...} at
  // temperature 1 give 1/7, 2/7, 4/7.
  std::vector<float> lg(16, -INFINITY);
  lg[0] = 0.0f;
  lg[1] = std::log(2.0f);
  lg[2] = std::log(4.0f);
  int counts[3] = {0, 0, 0};
  const int N = 70000;
  eng_sampling t1{1.0f, 0, 1.0f, 99};
  for (int64_t pos = 0; pos < N; ++pos) {
    const int32_t t = sample_token(lg.data(), 16, t1, pos, &s);
    REQUIRE(t >= 0 && t < 3);
    ++counts[t];
  }
  for (int i = 0; i < 3; ++i) {
    const double want = N * (1 << i) / 7.0;
    CHECKF(std::fabs(counts[i] - want) < 5 * std::sqrt(want), "token %d: %d draws, want ~%.0f", i, counts[i], want);
  }
  // top_p 0.5 keeps only token 2 (4/7 >= 0.5); top_p 0.6 keeps 2 and 1.
  eng_sampling p5{1.0f, 0, 0.5f, 99}, p6{1.0f, 0, 0.6f, 99};
  bool saw1 = false;
  for (int64_t pos = 0; pos < 200; ++pos) {
    CHECK(sample_token(lg.data(), 16, p5, pos, &s) == 2);
    const int32_t t = sample_token(lg.data(), 16, p6, pos, &s);
    CHECK(t == 1 || t == 2);
    saw1 = saw1 || t == 1;
  }
  CHECK(saw1);
  // Different seeds draw differently.
  const std::vector<float> flat = random_logits(5, kVocab, 0.5f);
  int differ = 0;
  for (int64_t pos = 0; pos < 50; ++pos) {
    eng_sampling a{1.0f, 0, 1.0f, 1}, b{1.0f, 0, 1.0f, 2};
    differ += sample_token(flat.data(), kVocab, a, pos, &s) != sample_token(flat.data(), kVocab, b, pos, &s);
  }
  CHECKF(differ > 40, "only %d of 50 draws differ between seeds", differ);
  // All -inf/NaN: the lowest id.
  std::vector<float> bad(8, NAN);
  CHECK(sample_token(bad.data(), 8, t1, 3, &s) == 0);
}

// Generates `gen` tokens for prompt through the ABI with prompt chunks of
// `chunk` tokens, next to a companion sequence when `batched`.
std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int32_t chunk, bool batched, eng_sampling sp,
                              int gen) {
  eng_engine_t e = test_engine(test_config("tiny", 32, kP));
  std::vector<int32_t> pages{3, 4, 5, 6}, other_pages{10, 11, 12, 13};
  const std::vector<int32_t> other = test_prompt(77, 9, kVocab);
  std::vector<int32_t> out;
  int32_t fed = 0, ofed = 0;
  const int32_t plen = static_cast<int32_t>(prompt.size());
  while (static_cast<int>(out.size()) < gen) {
    std::vector<TestSeq> batch;
    TestSeq s;
    s.blocks = pages;
    s.sampling = sp;
    if (fed < plen) {
      const int32_t c = std::min(chunk, plen - fed);
      s.tokens.assign(prompt.begin() + fed, prompt.begin() + fed + c);
      s.start_pos = fed;
      fed += c;
      s.sample = fed == plen;
    } else {
      s.tokens = {out.back()};
      s.start_pos = plen + static_cast<int32_t>(out.size()) - 1;
      s.sample = true;
    }
    if (batched && ofed < 9) {
      TestSeq o;
      o.blocks = other_pages;
      o.tokens.assign(other.begin() + ofed, other.begin() + ofed + 3);
      o.start_pos = ofed;
      ofed += 3;
      o.sample = ofed == 9;
      o.sampling = {1.0f, 0, 1.0f, 4242};
      batch.push_back(o);
    }
    batch.push_back(s);
    const TestStepOut r = test_step(e, batch, kVocab);
    REQUIRE(r.status == ENG_OK);
    if (s.sample) out.push_back(r.sampled.back());
  }
  eng_engine_free(e);
  return out;
}

void test_engine_invariance() {
  const std::vector<int32_t> prompt = test_prompt(3, 13, kVocab);
  const eng_sampling sp{0.8f, 40, 0.9f, 123456789};
  const std::vector<int32_t> ref = generate(prompt, 13, false, sp, 8);
  CHECK(generate(prompt, 1, false, sp, 8) == ref);
  CHECK(generate(prompt, 5, true, sp, 8) == ref);
  const eng_sampling other{0.8f, 40, 0.9f, 987654321};
  CHECK(generate(prompt, 13, false, other, 8) != ref);
  // Temperature 0 (with other fields set) equals a greedy step.
  const std::vector<int32_t> greedy = generate(prompt, 13, false, {0.0f, 0, 1.0f, 0}, 8);
  CHECK(generate(prompt, 4, true, {0.0f, 5, 0.5f, 77}, 8) == greedy);
  CHECK(greedy != ref);
}

void test_async_owns_sampling() {
  eng_engine_t e = test_engine(test_config("tiny", 32, kP));
  const std::vector<int32_t> prompt = test_prompt(11, 10, kVocab);
  std::vector<int32_t> nt{10}, sp{0}, nb{2}, bt{0, 1};
  std::vector<uint8_t> sample{1};
  std::vector<eng_sampling> sampling{{1.3f, 0, 1.0f, 555}};
  eng_step_desc d{1, nt.data(), sp.data(), prompt.data(), nb.data(), bt.data(), sample.data(), sampling.data()};
  REQUIRE(eng_engine_submit(e, &d, 1) == ENG_OK);
  sampling[0] = {0.0f, 0, 1.0f, 0};  // the queued step must not see this
  int32_t got = -2;
  std::vector<float> logits(kVocab);
  eng_step_result r{&got, logits.data(), 0};
  REQUIRE(eng_engine_wait(e, &r) == ENG_OK);
  int32_t want = -3;
  const eng_sampling p{1.3f, 0, 1.0f, 555};
  REQUIRE(eng_sample_row(logits.data(), kVocab, &p, 10, &want) == ENG_OK);
  CHECK(got == want);
  // eng_sample_row validates.
  const eng_sampling badp{1.0f, 0, 0.0f, 1};
  CHECK(eng_sample_row(logits.data(), kVocab, &badp, 10, &want) == ENG_INVALID_ARGUMENT);
  CHECK(eng_sample_row(logits.data(), kVocab, &p, -1, &want) == ENG_INVALID_ARGUMENT);
  eng_engine_free(e);
}

// Log-probabilities: sampling_log against std::log, a row against a
// log_softmax of std::exp/std::log, ties to the lower id; a step's equal
// eng_logprobs_row of its logits bit for bit (the token unchanged, greedy
// and stochastic, step and submit/wait); missing result arrays and bad
// counts refused.
void test_logprobs() {
  for (double x : {1.0, 1.5, 2.0, 3.0, 1000.0, 123456.789, 49152.0})
    CHECKF(std::fabs(lockstep::sampling_log(x) - std::log(x)) <= 4e-16 * std::fmax(1.0, std::log(x)), "x = %g", x);
  std::vector<float> row{1.0f, 3.0f, -2.0f, 3.0f, 0.5f, NAN, 2.0f};
  const int V = static_cast<int>(row.size());
  double m = 3.0, sum = 0.0;
  for (float v : row)
    if (!std::isnan(v)) sum += std::exp(double(v) - m);
  int32_t ids[ENG_MAX_LOGPROBS];
  float lps[ENG_MAX_LOGPROBS], tok = 0;
  REQUIRE(eng_logprobs_row(row.data(), V, 2, 4, &tok, ids, lps) == ENG_OK);
  CHECK(ids[0] == 1 && ids[1] == 3 && ids[2] == 6 && ids[3] == 0);
  CHECK(std::fabs(tok - (-2.0 - m - std::log(sum))) < 1e-6);
  CHECK(std::fabs(lps[0] - (0.0 - std::log(sum))) < 1e-6 && lps[0] == lps[1]);
  REQUIRE(eng_logprobs_row(row.data(), V, 5, 0, &tok, nullptr, nullptr) == ENG_OK);
  CHECK(tok == -INFINITY);  // NaN counts as -inf
  CHECK(eng_logprobs_row(row.data(), V, 7, 1, &tok, ids, lps) == ENG_INVALID_ARGUMENT);
  CHECK(eng_logprobs_row(row.data(), V, 0, ENG_MAX_LOGPROBS + 1, &tok, ids, lps) == ENG_INVALID_ARGUMENT);

  eng_engine_t e = test_engine(test_config("tiny", 32, kP));
  const std::vector<int32_t> prompt = test_prompt(11, 6, kVocab);
  std::vector<int32_t> nt{6, 6}, sp{0, 0}, nb{1, 1}, bt{0, 1};
  std::vector<int32_t> toks(prompt.begin(), prompt.begin() + 6);
  toks.insert(toks.end(), prompt.begin(), prompt.begin() + 6);
  std::vector<uint8_t> sample{1, 1};
  std::vector<eng_sampling> sampling{{0.0f, 0, 1.0f, 0}, {1.3f, 0, 1.0f, 555}};
  sampling[0].logprobs = 1;
  sampling[0].top_logprobs = 5;
  sampling[1].logprobs = 1;
  sampling[1].top_logprobs = ENG_MAX_LOGPROBS;
  eng_step_desc d{2, nt.data(), sp.data(), toks.data(), nb.data(), bt.data(), sample.data(), sampling.data()};
  int32_t got[2] = {-2, -2};
  std::vector<float> logits(2 * kVocab), lp(2), tlp(2 * ENG_MAX_LOGPROBS);
  std::vector<int32_t> tid(2 * ENG_MAX_LOGPROBS);
  eng_step_result r{got, logits.data(), 0};
  CHECK(eng_engine_step(e, &d, &r) == ENG_INVALID_ARGUMENT);  // no result arrays
  CHECK(std::string(eng_engine_last_error(e)).find("res.logprobs") != std::string::npos);
  r.logprobs = lp.data();
  r.top_logprob_ids = tid.data();
  r.top_logprobs = tlp.data();
  REQUIRE(eng_engine_step(e, &d, &r) == ENG_OK);
  for (int i = 0; i < 2; ++i) {
    const float* lg = logits.data() + i * kVocab;
    int32_t want = -3;
    REQUIRE(eng_sample_row(lg, kVocab, &sampling[i], 6, &want) == ENG_OK);
    CHECK(got[i] == want);
    float wt = 0;
    int32_t wid[ENG_MAX_LOGPROBS];
    float wlp[ENG_MAX_LOGPROBS];
    REQUIRE(eng_logprobs_row(lg, kVocab, got[i], sampling[i].top_logprobs, &wt, wid, wlp) == ENG_OK);
    CHECK(lp[i] == wt);
    for (int j = 0; j < ENG_MAX_LOGPROBS; ++j) {
      const bool in = j < sampling[i].top_logprobs;
      CHECK(tid[i * ENG_MAX_LOGPROBS + j] == (in ? wid[j] : -1));
      CHECK(tlp[i * ENG_MAX_LOGPROBS + j] == (in ? wlp[j] : 0.0f));
    }
  }
  CHECK(tid[0] == lockstep::sampling_argmax(logits.data(), kVocab));  // greedy: the token is the top one
  CHECK(got[0] == tid[0]);
  // Submit/wait: the same, without logits.
  const std::vector<float> lp0 = lp;
  const std::vector<int32_t> tid0 = tid;
  REQUIRE(eng_engine_submit(e, &d, 0) == ENG_OK);
  eng_step_result w{got, nullptr, 0};
  CHECK(eng_engine_wait(e, &w) == ENG_INVALID_ARGUMENT);  // refused: the step stays queued
  w.logprobs = lp.data();
  w.top_logprob_ids = tid.data();
  w.top_logprobs = tlp.data();
  REQUIRE(eng_engine_wait(e, &w) == ENG_OK);
  CHECK(lp == lp0 && tid == tid0);
  sampling[0].top_logprobs = ENG_MAX_LOGPROBS + 1;
  CHECK(eng_engine_step(e, &d, &r) == ENG_INVALID_ARGUMENT);
  sampling[0].logprobs = 0;
  sampling[0].top_logprobs = 1;
  CHECK(eng_engine_step(e, &d, &r) == ENG_INVALID_ARGUMENT);
  eng_engine_free(e);
}


// One scored step: the sequences of seqs (scored where targets is not
// empty) with their results by row.
struct ScoredOut {
  eng_status status = ENG_OK;
  std::vector<float> lp, tlp;
  std::vector<int32_t> tid, rank;
};
struct ScoredSeq {
  std::vector<int32_t> tokens, blocks, targets;
  int32_t start_pos = 0, top = 0;
  bool sample = false;
};
ScoredOut scored_step(eng_engine_t e, const std::vector<ScoredSeq>& seqs, bool async, bool with_results = true) {
  std::vector<int32_t> nt, sp, nb, toks, bt, targets, top;
  std::vector<uint8_t> sample;
  for (const ScoredSeq& q : seqs) {
    nt.push_back(static_cast<int32_t>(q.tokens.size()));
    sp.push_back(q.start_pos);
    nb.push_back(static_cast<int32_t>(q.blocks.size()));
    toks.insert(toks.end(), q.tokens.begin(), q.tokens.end());
    bt.insert(bt.end(), q.blocks.begin(), q.blocks.end());
    if (q.targets.empty())
      targets.insert(targets.end(), q.tokens.size(), -1);
    else
      targets.insert(targets.end(), q.targets.begin(), q.targets.end());
    top.push_back(q.top);
    sample.push_back(q.sample ? 1 : 0);
  }
  eng_step_desc d{static_cast<int32_t>(seqs.size()), nt.data(), sp.data(), toks.data(), nb.data(), bt.data(),
                  sample.data(), nullptr, targets.data(), top.data()};
  ScoredOut out;
  out.lp.assign(toks.size(), 7.0f);  // the step overwrites every row
  out.tid.assign(toks.size() * ENG_MAX_LOGPROBS, 7);
  out.tlp.assign(toks.size() * ENG_MAX_LOGPROBS, 7.0f);
  out.rank.assign(toks.size(), 7);
  std::vector<int32_t> got(seqs.size(), -2);
  eng_step_result r{got.data(), nullptr, 0};
  if (with_results) {
    r.score_logprobs = out.lp.data();
    r.score_top_ids = out.tid.data();
    r.score_top_logprobs = out.tlp.data();
    r.score_ranks = out.rank.data();
  }
  if (!async) {
    out.status = eng_engine_step(e, &d, &r);
  } else {
    out.status = eng_engine_submit(e, &d, 0);
    if (out.status == ENG_OK) out.status = eng_engine_wait(e, &r);
  }
  return out;
}

// Prompt scoring (eng_step_desc.score_targets): every scored row equals
// eng_logprobs_row of the logits of a sequence ending at that token
// (sampled, on another engine), scored in one chunk or two, beside an
// unscored sequence, by step or submit/wait; unscored rows are reset; bad
// targets and top counts, and missing result arrays, are refused.
void test_prompt_scoring() {
  constexpr int32_t L = 13, K = 4;
  const std::vector<int32_t> prompt = test_prompt(21, L, kVocab);
  std::vector<float> want_lp(L, 0.0f), want_tlp(size_t(L) * ENG_MAX_LOGPROBS, 0.0f);
  std::vector<int32_t> want_tid(size_t(L) * ENG_MAX_LOGPROBS, -1), want_rank(L, 0);
  eng_engine_t ref = test_engine(test_config("tiny", 32, kP));
  for (int32_t r = 0; r + 1 < L; ++r) {
    TestSeq q;
    q.tokens.assign(prompt.begin(), prompt.begin() + r + 1);
    q.blocks = {0, 1};
    q.sample = true;
    const TestStepOut o = test_step(ref, {q}, kVocab);
    REQUIRE(o.status == ENG_OK);
    REQUIRE(eng_logprobs_row(o.logits.data(), kVocab, prompt[r + 1], K, &want_lp[r], &want_tid[r * ENG_MAX_LOGPROBS],
                             &want_tlp[r * ENG_MAX_LOGPROBS]) == ENG_OK);
    want_rank[r] = lockstep::row_rank(o.logits.data(), kVocab, prompt[r + 1]);
    int32_t above = 0;  // the rank by its definition: logits at least the target's
    for (int32_t v = 0; v < kVocab; ++v) above += o.logits[v] >= o.logits[prompt[r + 1]];
    CHECK(want_rank[r] == above && above >= 1);
  }
  eng_engine_free(ref);
  // The last row predicts the sampled token: not scored.
  std::vector<int32_t> targets(prompt.begin() + 1, prompt.end());
  targets.push_back(-1);
  auto check_rows = [&](const ScoredOut& o, size_t at, int32_t from, int32_t to, const char* what) {
    for (int32_t r = from; r < to; ++r) {
      const size_t row = at + size_t(r - from);
      CHECKF(o.lp[row] == want_lp[r], "%s: row %d logprob %g, want %g", what, r, o.lp[row], want_lp[r]);
      CHECKF(o.rank[row] == want_rank[r], "%s: row %d rank %d, want %d", what, r, o.rank[row], want_rank[r]);
      for (int j = 0; j < ENG_MAX_LOGPROBS; ++j) {
        CHECKF(o.tid[row * ENG_MAX_LOGPROBS + j] == want_tid[r * ENG_MAX_LOGPROBS + j], "%s: row %d top %d", what, r, j);
        CHECKF(o.tlp[row * ENG_MAX_LOGPROBS + j] == want_tlp[r * ENG_MAX_LOGPROBS + j], "%s: row %d top %d", what, r, j);
      }
    }
  };
  for (bool async : {false, true}) {
    const char* how = async ? "submit/wait" : "step";
    eng_engine_t e = test_engine(test_config("tiny", 32, kP));
    ScoredSeq other{test_prompt(5, 7, kVocab), {4}, {}, 0, 0, true};
    ScoredSeq whole{prompt, {0, 1}, targets, 0, K, true};
    const ScoredOut o = scored_step(e, {other, whole}, async);
    REQUIRE(o.status == ENG_OK);
    for (size_t row = 0; row < 7; ++row)
      CHECKF(o.lp[row] == 0.0f && o.tid[row * ENG_MAX_LOGPROBS] == -1 && o.rank[row] == 0, "%s: row %zu", how, row);
    check_rows(o, 7, 0, L, how);
    // Two chunks on fresh pages: 0..5 (not sampled), then 6..12.
    ScoredSeq first{{prompt.begin(), prompt.begin() + 6}, {2}, {targets.begin(), targets.begin() + 6}, 0, K, false};
    ScoredSeq second{{prompt.begin() + 6, prompt.end()}, {2, 3}, {targets.begin() + 6, targets.end()}, 6, K, true};
    const ScoredOut o1 = scored_step(e, {first}, async);
    const ScoredOut o2 = scored_step(e, {second}, async);
    REQUIRE(o1.status == ENG_OK && o2.status == ENG_OK);
    check_rows(o1, 0, 0, 6, how);
    check_rows(o2, 0, 6, L, how);
    // Refusals name the field; nothing runs.
    ScoredSeq bad = whole;
    bad.targets[3] = kVocab;
    CHECK(scored_step(e, {bad}, async).status == ENG_INVALID_ARGUMENT);
    CHECK(std::string(eng_engine_last_error(e)).find("score_targets[3]") != std::string::npos);
    bad.targets[3] = -2;
    CHECK(scored_step(e, {bad}, async).status == ENG_INVALID_ARGUMENT);
    bad = whole;
    bad.top = ENG_MAX_LOGPROBS + 1;
    CHECK(scored_step(e, {bad}, async).status == ENG_INVALID_ARGUMENT);
    CHECK(std::string(eng_engine_last_error(e)).find("score_top[0]") != std::string::npos);
    if (async) {
      // A wait without the arrays is refused and leaves the step queued.
      CHECK(scored_step(e, {whole}, true, false).status == ENG_INVALID_ARGUMENT);
      CHECK(eng_engine_inflight(e) == 1);
      std::vector<int32_t> got(1);
      std::vector<float> lp(L), tlp(size_t(L) * ENG_MAX_LOGPROBS);
      std::vector<int32_t> tid(size_t(L) * ENG_MAX_LOGPROBS), rank(L);
      eng_step_result r{got.data(), nullptr, 0};
      r.score_logprobs = lp.data();
      r.score_top_ids = tid.data();
      r.score_top_logprobs = tlp.data();
      r.score_ranks = rank.data();
      CHECK(eng_engine_wait(e, &r) == ENG_OK);
    } else {
      CHECK(scored_step(e, {whole}, false, false).status == ENG_INVALID_ARGUMENT);
      CHECK(std::string(eng_engine_last_error(e)).find("res.score_logprobs") != std::string::npos);
    }
    eng_engine_free(e);
  }
}

}  // namespace

int main() {
  test_philox_kat();
  test_exp();
  test_procedure();
  test_engine_invariance();
  test_async_owns_sampling();
  test_logprobs();
  test_prompt_scoring();
  return check_exit_code("test_sampling");
}
