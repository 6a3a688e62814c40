// test_helix_cp: Helix context parallelism on the CPU backend. A sequence
// whose pages are dealt round-robin over cp in-process members (each member
// an engine on its own thread) yields bit-identical tokens and logits to a
// single engine, for several cp sizes, page sizes, chunkings and short
// prompts that leave some members without pages, for GQA and MLA (latent) attention
// and Gemma's sliding windows; a member that never
// arrives makes the others fail with ENG_TIMEOUT instead of hanging. The
// prompt's rows are scored (eng_step_desc.score_targets) on every member
// exactly as on the single engine.
#include <thread>
#include <vector>

#include "test_engine.h"

namespace {

// One step of the script: tokens at start_pos, sampled or not.
struct ScriptStep {
  std::vector<int32_t> tokens;
  int32_t start_pos;
  bool sample;
  std::vector<int32_t> targets;  // prompt scoring: the next prompt token, -1 for the last
};

// Runs the script on one engine with block table `blocks`; the next decode
// input is the previous sample when tokens is empty.
std::vector<TestStepOut> run_script(eng_engine_t e, const std::vector<ScriptStep>& script,
                                    const std::vector<int32_t>& blocks, int32_t V) {
  std::vector<TestStepOut> outs;
  int32_t last = 0;
  for (const ScriptStep& s : script) {
    std::vector<int32_t> toks = s.tokens.empty() ? std::vector<int32_t>{last} : s.tokens;
    TestSeq q{toks, s.start_pos, blocks, s.sample};
    q.score_targets = s.targets;
    q.score_top = s.targets.empty() ? 0 : 3;
    TestStepOut o = test_step(e, {q}, V);
    if (s.sample && o.status == ENG_OK) last = o.sampled[0];
    outs.push_back(o);
  }
  return outs;
}

void check_case(int32_t cp, int32_t P, int32_t prompt_len, const std::vector<int32_t>& chunks,
                const char* preset = "tiny") {
  const int32_t V = 512, decode = 6;
  const std::vector<int32_t> prompt = test_prompt(11 + cp, prompt_len, V);
  std::vector<ScriptStep> script;
  int32_t pos = 0;
  for (size_t c = 0; pos < prompt_len; ++c) {
    const int32_t n = std::min(chunks[c % chunks.size()], prompt_len - pos);
    std::vector<int32_t> targets;
    for (int32_t t = pos; t < pos + n; ++t) targets.push_back(t + 1 < prompt_len ? prompt[t + 1] : -1);
    script.push_back({std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + pos + n), pos,
                      pos + n == prompt_len, targets});
    pos += n;
  }
  for (int32_t g = 0; g < decode; ++g) script.push_back({{}, prompt_len + g, true});
  const int32_t total = prompt_len + decode;

  // Reference: one engine, pages 0..
  const int32_t ref_pages = (total + P - 1) / P;
  std::vector<int32_t> ref_blocks;
  for (int32_t i = 0; i < ref_pages; ++i) ref_blocks.push_back((i * 7) % 64);
  eng_engine_t ref = test_engine(test_config(preset, 64, P));
  const std::vector<TestStepOut> want = run_script(ref, script, ref_blocks, V);
  eng_engine_free(ref);

  // Helix: cp members, ledger blocks of P * cp tokens, one local page each.
  eng_cp_group_t group = nullptr;
  REQUIRE(eng_cp_group_create(cp, 20000, &group) == ENG_OK);
  const int32_t ledger = (total + P * cp - 1) / (P * cp);
  std::vector<std::vector<TestStepOut>> got(static_cast<size_t>(cp));
  std::vector<eng_engine_t> engines(static_cast<size_t>(cp));
  for (int32_t r = 0; r < cp; ++r) {
    engines[r] = test_engine(test_config(preset, 64, P));
    REQUIRE(eng_engine_join_cp(engines[r], group, r) == ENG_OK);
  }
  CHECK(eng_engine_join_cp(engines[0], group, 0) == ENG_INVALID_ARGUMENT);  // only once
  eng_cp_group_free(group);  // members keep it alive
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < cp; ++r) {
    threads.emplace_back([&, r] {
      std::vector<int32_t> blocks;
      for (int32_t b = 0; b < ledger; ++b) blocks.push_back((b * 5 + r * 3) % 64);
      got[r] = run_script(engines[r], script, blocks, V);
    });
  }
  for (auto& t : threads) t.join();
  for (int32_t r = 0; r < cp; ++r) {
    REQUIRE(got[r].size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      CHECKF(got[r][i].status == ENG_OK, "cp %d P %d len %d rank %d step %zu", cp, P, prompt_len, r, i);
      CHECKF(got[r][i].sampled == want[i].sampled, "cp %d P %d len %d rank %d step %zu: tokens differ", cp,
             P, prompt_len, r, i);
      CHECKF(got[r][i].logits == want[i].logits, "cp %d P %d len %d rank %d step %zu: logits differ", cp, P,
             prompt_len, r, i);
      CHECKF(got[r][i].score_lp == want[i].score_lp && got[r][i].score_tid == want[i].score_tid &&
                 got[r][i].score_tlp == want[i].score_tlp && got[r][i].score_rank == want[i].score_rank,
             "cp %d P %d len %d rank %d step %zu: scores differ", cp, P, prompt_len, r, i);
    }
    eng_engine_free(engines[r]);
  }
}

}  // namespace

int main() {
  check_case(2, 4, 37, {37});
  check_case(2, 4, 37, {8, 5, 1, 16});
  check_case(3, 8, 61, {16, 3});
  check_case(4, 4, 5, {5});  // short prompt: members 2 and 3 hold no prompt KV
  check_case(1, 8, 20, {7});
  // MLA: the latent partials of each member's pages, merged in page order.
  check_case(2, 4, 37, {8, 5, 1, 16}, "deepseek-tiny");
  check_case(3, 8, 30, {30}, "deepseek-tiny");
  // Sliding windows (8 positions: two to three pages of 4, on every
  // member), soft caps, post norms, the local RoPE base.
  check_case(2, 4, 37, {8, 5, 1, 16}, "gemma-tiny");
  check_case(3, 4, 30, {30}, "gemma-tiny");

  // A member that never arrives: the other fails with ENG_TIMEOUT.
  {
    eng_cp_group_t group = nullptr;
    REQUIRE(eng_cp_group_create(2, 200, &group) == ENG_OK);
    eng_engine_t a = test_engine(test_config("tiny", 8, 4));
    eng_engine_t b = test_engine(test_config("tiny", 8, 4));
    REQUIRE(eng_engine_join_cp(a, group, 0) == ENG_OK);
    REQUIRE(eng_engine_join_cp(b, group, 1) == ENG_OK);
    eng_cp_group_free(group);
    TestStepOut o = test_step(a, {{{1, 2, 3}, 0, {0}, true}}, 512);
    CHECK(o.status == ENG_TIMEOUT);
    eng_engine_free(a);
    eng_engine_free(b);
  }
  return check_exit_code("test_helix_cp");
}
