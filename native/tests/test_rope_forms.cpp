// test_rope_forms: partial RoPE (partial_rotary_dim) and the RoPE attention
// factor (rope_attn_factor) on the CPU engine (engine.h). A partial
// dimension equal to the head and a factor of one change nothing, bit for
// bit; a partial rotation and another factor each change the logits; a
// prompt fed whole, in chunks or token by token, on 1 or 3 threads, gives
// the same bits; bad values are refused by name. (Against llama.cpp:
// tests/moe_reference_test.go, phi3-longrope.gguf.)
#include <tuple>

#include "test_engine.h"

namespace {

constexpr int32_t V = 512, P = 4, kLen = 21, kDecode = 5;

TestRun run_shape(const eng_model_shape& s, int32_t chunk = kLen, int32_t threads = 1) {
  eng_engine_config c = test_config(nullptr, 32, P);
  c.shape = s;
  c.num_threads = threads;
  return test_chunked_run(c, V, test_prompt(9, kLen, V), test_prompt(10, 7, V), chunk, chunk == 1, kDecode);
}

eng_model_shape tiny() {
  eng_model_shape s;
  REQUIRE(eng_preset_shape("tiny", &s) == ENG_OK);
  return s;
}

void check_forms() {
  const eng_model_shape base = tiny();
  const TestRun ref = run_shape(base);
  eng_model_shape same = base;
  same.partial_rotary_dim = base.head_dim;
  same.rope_attn_factor = 1.0f;
  CHECKF(run_shape(same) == ref, "a partial dimension of the whole head and a factor of one changed the bits");
  eng_model_shape partial = base;
  partial.partial_rotary_dim = 12;
  const TestRun pr = run_shape(partial);
  CHECKF(!(pr == ref), "partial_rotary_dim 12 changes nothing");
  eng_model_shape factor = partial;
  factor.rope_attn_factor = 1.19f;
  CHECKF(!(run_shape(factor) == pr), "rope_attn_factor 1.19 changes nothing");
  for (auto [chunk, threads] : {std::tuple{5, 1}, std::tuple{1, 1}, std::tuple{kLen, 3}, std::tuple{3, 2}})
    CHECKF(run_shape(factor, chunk, threads) == run_shape(factor), "chunk %d threads %d differ", chunk, threads);
}

void check_refusals() {
  struct Bad {
    const char* preset;
    const char* needle;
    void (*apply)(eng_model_shape*);
  };
  const Bad bad[] = {
      {"tiny", "partial_rotary_dim must be 0", [](eng_model_shape* s) { s->partial_rotary_dim = 7; }},
      {"tiny", "partial_rotary_dim must be 0", [](eng_model_shape* s) { s->partial_rotary_dim = s->head_dim + 2; }},
      {"tiny", "rope_attn_factor must be >= 0", [](eng_model_shape* s) { s->rope_attn_factor = -1; }},
      {"deepseek-tiny", "partial_rotary_dim with MLA", [](eng_model_shape* s) { s->partial_rotary_dim = 4; }},
  };
  for (const Bad& b : bad) {
    eng_model_shape s;
    REQUIRE(eng_preset_shape(b.preset, &s) == ENG_OK);
    b.apply(&s);
    expect_shape_refused(s, b.needle);
  }
}

}  // namespace

int main() {
  check_forms();
  check_refusals();
  return check_exit_code("test_rope_forms");
}
