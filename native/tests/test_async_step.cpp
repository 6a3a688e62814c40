// test_async_step: eng_engine_submit / eng_engine_wait (the overlap loop's
// asynchronous steps) give bit-identical results to eng_engine_step, keep
// stream order (a step sees the K/V written by the step submitted before it),
// and refuse misuse without side effects.
#include <vector>

#include "test_engine.h"

namespace {

struct Flat {
  std::vector<int32_t> nt, sp, nb, toks, blocks;
  std::vector<uint8_t> sample;
  eng_step_desc d{};
};

Flat flatten(const std::vector<TestSeq>& seqs) {
  Flat f;
  for (const TestSeq& s : seqs) {
    f.nt.push_back(static_cast<int32_t>(s.tokens.size()));
    f.sp.push_back(s.start_pos);
    f.nb.push_back(static_cast<int32_t>(s.blocks.size()));
    f.sample.push_back(s.sample ? 1 : 0);
    f.toks.insert(f.toks.end(), s.tokens.begin(), s.tokens.end());
    f.blocks.insert(f.blocks.end(), s.blocks.begin(), s.blocks.end());
  }
  f.d.num_seqs = static_cast<int32_t>(seqs.size());
  f.d.num_tokens = f.nt.data();
  f.d.start_pos = f.sp.data();
  f.d.tokens = f.toks.data();
  f.d.num_blocks = f.nb.data();
  f.d.block_table = f.blocks.data();
  f.d.sample = f.sample.data();
  return f;
}

}  // namespace

int main() {
  const int32_t P = 8, V = 512;
  const eng_engine_config cfg = test_config("tiny", 64, P);
  const std::vector<int32_t> prompt = test_prompt(3, 37, V);
  const std::vector<int32_t> blocks = {5, 9, 2, 40, 11, 12};

  // Reference: prefill then two decode steps, synchronously.
  eng_engine_t ref = test_engine(cfg);
  TestStepOut a = test_step(ref, {{prompt, 0, blocks, true}}, V);
  REQUIRE(a.status == ENG_OK);
  TestStepOut b = test_step(ref, {{{a.sampled[0]}, 37, blocks, true}}, V);
  REQUIRE(b.status == ENG_OK);
  eng_engine_free(ref);

  eng_engine_t e = test_engine(cfg);
  eng_step_result r{};
  int32_t sampled[4] = {-2, -2, -2, -2};
  r.sampled = sampled;
  CHECK(eng_engine_wait(e, &r) == ENG_INVALID_ARGUMENT);  // nothing submitted

  // Submit the prefill, then reuse (scribble over) the caller's arrays: the
  // engine must have copied them.
  {
    Flat f = flatten({{prompt, 0, blocks, true}});
    REQUIRE(eng_engine_submit(e, &f.d, 0) == ENG_OK);
    for (auto& t : f.toks) t = 0;
    for (auto& p : f.blocks) p = 0;
  }
  CHECK(eng_engine_inflight(e) == 1);
  // A bad descriptor is refused at submit and queues nothing.
  {
    Flat bad = flatten({{{V + 1}, 0, {1}, true}});
    CHECK(eng_engine_submit(e, &bad.d, 0) == ENG_INVALID_ARGUMENT);
    CHECK(eng_engine_inflight(e) == 1);
  }
  // The synchronous step refuses to overtake a submitted one.
  CHECK(test_step(e, {{{1}, 0, {1}, true}}, V).status == ENG_INVALID_ARGUMENT);

  REQUIRE(eng_engine_wait(e, &r) == ENG_OK);
  CHECK(sampled[0] == a.sampled[0]);
  CHECK(eng_engine_inflight(e) == 0);

  // Two steps in flight: the decode sees the K/V of the prefill of another
  // sequence submitted just before it (stream order), and both match.
  const std::vector<int32_t> blocks2 = {20, 21, 22, 23, 24, 25};
  Flat s1 = flatten({{prompt, 0, blocks2, true}});
  Flat s2 = flatten({{{a.sampled[0]}, 37, blocks, true}});
  REQUIRE(eng_engine_submit(e, &s1.d, 0) == ENG_OK);
  REQUIRE(eng_engine_submit(e, &s2.d, 1) == ENG_OK);
  CHECK(eng_engine_submit(e, &s2.d, 0) == ENG_INVALID_ARGUMENT);  // ENG_MAX_INFLIGHT
  REQUIRE(eng_engine_wait(e, &r) == ENG_OK);
  CHECK(sampled[0] == a.sampled[0]);
  std::vector<float> logits(V, 0.0f);
  r.logits = logits.data();
  REQUIRE(eng_engine_wait(e, &r) == ENG_OK);
  CHECK(sampled[0] == b.sampled[0]);
  CHECK(logits == b.logits);

  // Free with a step still in flight: the stream drains first (no crash).
  REQUIRE(eng_engine_submit(e, &s1.d, 0) == ENG_OK);
  CHECK(eng_engine_free(e) == ENG_OK);
  return check_exit_code("test_async_step");
}
