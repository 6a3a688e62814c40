// The CPU backend's threads change no bit: the same steps (prefill chunks of
// several sequences, decoding, a MoE model) on 1, 2, 3 and 4 threads sample
// the same tokens with the same logits, memcmp-equal; and a bad thread count
// or kernel set is refused naming the field.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "test_engine.h"

namespace {

constexpr int32_t kVocab = 512;  // tiny, moe-tiny and deepseek-tiny
constexpr int32_t kPageTokens = 8;

struct Run {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

// Three sequences: prompts of 70, 33 and 9 tokens in chunks of 24 (the
// second joins one step later), then greedy decoding to 8 tokens each.
Run run(const char* preset, int32_t threads) {
  eng_engine_config c = test_config(preset, 64, kPageTokens);
  c.num_threads = threads;
  eng_engine_t e = test_engine(c);
  const std::vector<std::vector<int32_t>> prompts = {test_prompt(1, 70, kVocab), test_prompt(2, 33, kVocab),
                                                     test_prompt(3, 9, kVocab)};
  const std::vector<std::vector<int32_t>> pages = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
                                                   {20, 21, 22, 23, 24, 25},
                                                   {40, 41, 42, 43}};
  std::vector<int32_t> fed(3, 0);
  std::vector<std::vector<int32_t>> out(3);
  Run r;
  for (int step = 0; step < 40; ++step) {
    std::vector<TestSeq> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < 3; ++i) {
      if ((i == 1 && step == 0) || out[i].size() >= 8) continue;
      const int32_t plen = static_cast<int32_t>(prompts[i].size());
      TestSeq s;
      s.blocks = pages[i];
      if (fed[i] < plen) {
        const int32_t n = std::min(24, plen - fed[i]);
        s.tokens.assign(prompts[i].begin() + fed[i], prompts[i].begin() + fed[i] + n);
        s.start_pos = fed[i];
        fed[i] += n;
        s.sample = fed[i] == plen;
      } else {
        s.tokens = {out[i].back()};
        s.start_pos = plen + static_cast<int32_t>(out[i].size()) - 1;
        s.sample = true;
      }
      batch.push_back(s);
      who.push_back(i);
    }
    if (batch.empty()) break;
    const TestStepOut o = test_step(e, batch, kVocab);
    REQUIRE(o.status == ENG_OK);
    for (size_t b = 0; b < batch.size(); ++b)
      if (batch[b].sample) {
        out[who[b]].push_back(o.sampled[b]);
        r.tokens.push_back(o.sampled[b]);
      }
    r.logits.insert(r.logits.end(), o.logits.begin(), o.logits.end());
  }
  eng_engine_free(e);
  return r;
}

bool same(const Run& a, const Run& b) {
  return a.tokens == b.tokens && a.logits.size() == b.logits.size() &&
         std::memcmp(a.logits.data(), b.logits.data(), sizeof(float) * a.logits.size()) == 0;
}

}  // namespace

int main() {
  for (const char* preset : {"tiny", "moe-tiny", "deepseek-tiny"}) {
    const Run ref = run(preset, 1);
    CHECK(ref.tokens.size() == 24);
    for (int32_t threads : {0, 2, 3, 4})
      CHECKF(same(run(preset, threads), ref), "%s on %d threads differs from one thread", preset, threads);
  }
  for (int32_t bad : {-1, 1025}) {
    eng_engine_config c = test_config("tiny", 8, kPageTokens);
    c.num_threads = bad;
    eng_engine_t e = nullptr;
    CHECK(eng_engine_init(&c, &e) == ENG_INVALID_ARGUMENT && e == nullptr);
    CHECK(std::string(eng_last_error()).find("num_threads") != std::string::npos);
  }
  for (int32_t bad : {-1, 2}) {
    eng_engine_config c = test_config("tiny", 8, kPageTokens);
    c.cpu_kernels = bad;
    eng_engine_t e = nullptr;
    CHECK(eng_engine_init(&c, &e) == ENG_INVALID_ARGUMENT && e == nullptr);
    CHECK(std::string(eng_last_error()).find("cpu_kernels") != std::string::npos);
  }
  // Synthetic weights have no quantised blocks: quant runs them exactly.
  {
    eng_engine_config c = test_config("tiny", 8, kPageTokens);
    c.cpu_kernels = ENG_CPU_KERNELS_QUANT;
    eng_engine_t e = test_engine(c);
    eng_engine_free(e);
  }
  return check_exit_code("test_threads");
}
