// test_engine.h: helpers to drive an engine through the C ABI in tests.
#ifndef LOCKSTEP_NATIVE_TESTS_TEST_ENGINE_H
#define LOCKSTEP_NATIVE_TESTS_TEST_ENGINE_H

#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"
#include "engine.h"

// A config for `preset` with the given pages; everything else default.
inline eng_engine_config test_config(const char* preset, int32_t num_pages, int32_t tokens_per_page,
                                     int32_t num_host_pages = 0, uint64_t seed = 7) {
  eng_engine_config c;
  std::memset(&c, 0, sizeof c);
  c.abi_version = ENG_ABI_VERSION;
  c.backend = ENG_BACKEND_CPU;
  c.preset = preset;
  c.seed = seed;
  c.num_pages = num_pages;
  c.tokens_per_page = tokens_per_page;
  c.num_host_pages = num_host_pages;
  return c;
}

// Creates an engine or stops the test.
inline eng_engine_t test_engine(const eng_engine_config& c) {
  eng_engine_t e = nullptr;
  const eng_status st = eng_engine_init(&c, &e);
  if (st != ENG_OK) std::fprintf(stderr, "eng_engine_init: %d: %s\n", st, eng_last_error());
  REQUIRE(st == ENG_OK && e != nullptr);
  return e;
}

// One sequence of a test step.
struct TestSeq {
  std::vector<int32_t> tokens;
  int32_t start_pos = 0;
  std::vector<int32_t> blocks;
  bool sample = false;
  eng_sampling sampling{0.0f, 0, 1.0f, 0};  // temperature 0: greedy
  // Prompt scoring: [tokens] targets (-1 = not scored), or empty.
  std::vector<int32_t> score_targets;
  int32_t score_top = 0;
};

// What a test step returned.
struct TestStepOut {
  eng_status status = ENG_OK;
  std::vector<int32_t> sampled;
  std::vector<float> logits;  // [num sampled][vocab]
  // Scored rows' results (when some sequence has score_targets), by row.
  std::vector<float> score_lp, score_tlp;
  std::vector<int32_t> score_tid, score_rank;
};

// Flattens seqs into an eng_step_desc and runs one step with logits.
inline TestStepOut test_step(eng_engine_t e, const std::vector<TestSeq>& seqs, int32_t vocab) {
  std::vector<int32_t> nt, sp, nb, toks, blocks, targets, top;
  bool any_scored = false;
  std::vector<uint8_t> sample;
  std::vector<eng_sampling> sampling;
  bool any_sampling = false;
  int32_t n_sampled = 0;
  for (const TestSeq& s : seqs) {
    sampling.push_back(s.sampling);
    any_sampling = any_sampling || s.sampling.temperature != 0.0f;
    nt.push_back(static_cast<int32_t>(s.tokens.size()));
    sp.push_back(s.start_pos);
    nb.push_back(static_cast<int32_t>(s.blocks.size()));
    sample.push_back(s.sample ? 1 : 0);
    toks.insert(toks.end(), s.tokens.begin(), s.tokens.end());
    blocks.insert(blocks.end(), s.blocks.begin(), s.blocks.end());
    n_sampled += s.sample ? 1 : 0;
    any_scored = any_scored || !s.score_targets.empty();
    if (s.score_targets.empty())
      targets.insert(targets.end(), s.tokens.size(), -1);
    else
      targets.insert(targets.end(), s.score_targets.begin(), s.score_targets.end());
    top.push_back(s.score_top);
  }
  eng_step_desc d{};
  d.num_seqs = static_cast<int32_t>(seqs.size());
  d.num_tokens = nt.data();
  d.start_pos = sp.data();
  d.tokens = toks.data();
  d.num_blocks = nb.data();
  d.block_table = blocks.data();
  d.sample = sample.data();
  d.sampling = any_sampling ? sampling.data() : nullptr;
  if (any_scored) {
    d.score_targets = targets.data();
    d.score_top = top.data();
  }
  TestStepOut out;
  out.sampled.assign(seqs.size(), -2);
  out.logits.assign(static_cast<size_t>(n_sampled) * vocab, 0.0f);
  eng_step_result r{};
  r.sampled = out.sampled.data();
  r.logits = out.logits.data();
  r.device_ms = -1;
  if (any_scored) {
    out.score_lp.assign(toks.size(), 0.0f);
    out.score_tid.assign(toks.size() * ENG_MAX_LOGPROBS, 0);
    out.score_tlp.assign(toks.size() * ENG_MAX_LOGPROBS, 0.0f);
    out.score_rank.assign(toks.size(), -1);
    r.score_ranks = out.score_rank.data();
    r.score_logprobs = out.score_lp.data();
    r.score_top_ids = out.score_tid.data();
    r.score_top_logprobs = out.score_tlp.data();
  }
  out.status = eng_engine_step(e, &d, &r);
  if (out.status != ENG_OK) std::fprintf(stderr, "eng_engine_step: %d: %s\n", out.status, eng_engine_last_error(e));
  return out;
}

// Deterministic pseudo-random token ids for prompts.
inline std::vector<int32_t> test_prompt(uint64_t seed, int32_t len, int32_t vocab) {
  std::vector<int32_t> t;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int32_t i = 0; i < len; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(vocab)));
  }
  return t;
}

// Requires that an engine of shape s is refused with ENG_INVALID_ARGUMENT
// and a message containing needle.
inline void expect_shape_refused(const eng_model_shape& s, const char* needle) {
  eng_engine_config c = test_config(nullptr, 32, 4);
  c.shape = s;
  eng_engine_t e = nullptr;
  CHECK(eng_engine_init(&c, &e) == ENG_INVALID_ARGUMENT);
  CHECKF(std::strstr(eng_last_error(), needle) != nullptr, "want \"%s\", got: %s", needle, eng_last_error());
}

// What test_chunked_run returned: the sampled tokens and their logits.
struct TestRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  bool operator==(const TestRun& o) const {
    return tokens == o.tokens && logits.size() == o.logits.size() &&
           std::memcmp(logits.data(), o.logits.data(), sizeof(float) * logits.size()) == 0;
  }
};

// Feeds prompt to a fresh engine of config c in chunks of `chunk` tokens
// (blocks 3, 9, 1, 12, 6 ...: scattered pages), beside `other` (a prompt
// on its own pages, sampled every step) when neighbour is set, then
// decodes `decode` greedy tokens; returns the sampled tokens and logits.
inline TestRun test_chunked_run(const eng_engine_config& c, int32_t V, const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& other, int32_t chunk, bool neighbour, int32_t decode) {
  eng_engine_t e = test_engine(c);
  TestRun out;
  const int32_t len = static_cast<int32_t>(prompt.size());
  const std::vector<int32_t> blocks = {3, 9, 1, 12, 6, 14, 2, 11, 0, 13}, oblocks = {20, 21, 22, 23};
  int32_t pos = 0, last = 0;
  while (pos < len + decode) {
    std::vector<TestSeq> batch;
    if (neighbour) batch.push_back({other, 0, oblocks, true});
    TestSeq s;
    s.blocks = blocks;
    s.start_pos = pos;
    if (pos < len) {
      const int32_t n = chunk < len - pos ? chunk : len - pos;
      s.tokens.assign(prompt.begin() + pos, prompt.begin() + pos + n);
      s.sample = pos + n == len;
      pos += n;
    } else {
      s.tokens = {last};
      s.sample = true;
      ++pos;
    }
    batch.push_back(s);
    const TestStepOut o = test_step(e, batch, V);
    REQUIRE(o.status == ENG_OK);
    if (s.sample) {
      last = o.sampled.back();
      out.tokens.push_back(last);
      out.logits.insert(out.logits.end(), o.logits.end() - V, o.logits.end());
    }
  }
  eng_engine_free(e);
  return out;
}

#endif  // LOCKSTEP_NATIVE_TESTS_TEST_ENGINE_H
