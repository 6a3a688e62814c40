// test_gemma: Gemma's decoder fields on the CPU engine (engine.h), on the
// gemma-tiny preset (all of them at once). A prompt fed whole, in chunks
// and token by token, alone or beside another sequence, on 1 to 3 threads,
// gives the same bits (the sliding window and the soft caps depend on a
// row's position only); a window no shorter than the sequence changes
// nothing bit for bit, a short one, the global layers' pattern, the caps,
// the GELU, the post norms, the local RoPE base and the linear scaling each
// change the logits; the final cap bounds them; bad values are refused by
// name. (The checkpoint path: test_checkpoint; Helix: test_helix_cp; the
// arithmetic against llama.cpp and a float64 forward: tests/
// gemma_reference_test.go.)
#include <cmath>
#include <string>
#include <tuple>

#include "test_engine.h"

namespace {

constexpr int32_t V = 512, P = 4, kLen = 29, kDecode = 6;

eng_model_shape gemma() {
  eng_model_shape s;
  REQUIRE(eng_preset_shape("gemma-tiny", &s) == ENG_OK);
  return s;
}

TestRun run_shape(const eng_model_shape& s, int32_t chunk = kLen, bool neighbour = false, int32_t threads = 1) {
  eng_engine_config c = test_config(nullptr, 32, P);
  c.shape = s;
  c.num_threads = threads;
  return test_chunked_run(c, V, test_prompt(5, kLen, V), test_prompt(6, 13, V), chunk, neighbour, kDecode);
}

void check_invariance() {
  const TestRun ref = run_shape(gemma());
  CHECK(ref.tokens.size() == size_t(kDecode + 1));
  for (auto [chunk, neighbour, threads] : {std::tuple{5, false, 1}, std::tuple{1, false, 1}, std::tuple{7, true, 1},
                                           std::tuple{kLen, true, 3}, std::tuple{3, false, 2}})
    CHECKF(run_shape(gemma(), chunk, neighbour, threads) == ref, "chunk %d neighbour %d threads %d differ", chunk,
           neighbour, threads);
}

void check_fields() {
  const eng_model_shape g = gemma();
  const TestRun ref = run_shape(g);
  // The final cap bounds every logit.
  float worst = 0;
  for (float x : ref.logits) worst = std::max(worst, std::fabs(x));
  CHECKF(worst < g.final_softcap, "a logit of %g past the final cap %g", worst, g.final_softcap);
  CHECKF(worst > 0.5f * g.final_softcap, "the final cap does not bite (largest logit %g)", worst);

  // A window no shorter than the sequence is no window (with the local
  // RoPE table out of the way: no local base, no linear scaling).
  eng_model_shape plain = g;
  plain.rope_local_theta = plain.rope_linear_factor = 0;
  plain.sliding_window = plain.sliding_window_pattern = 0;
  eng_model_shape wide = plain;
  wide.sliding_window = kLen + kDecode;
  wide.sliding_window_pattern = 3;
  CHECK(run_shape(wide) == run_shape(plain));
  wide.sliding_window = kLen + kDecode - 1;
  CHECKF(!(run_shape(wide) == run_shape(plain)), "a window one short of the sequence changes nothing");

  // Every field moves the logits.
  struct Change {
    const char* what;
    void (*apply)(eng_model_shape*);
  };
  const Change changes[] = {
      {"no window", [](eng_model_shape* s) { s->sliding_window = s->sliding_window_pattern = 0, s->rope_local_theta = 0; }},
      {"window 6", [](eng_model_shape* s) { s->sliding_window = 6; }},
      {"no attention cap", [](eng_model_shape* s) { s->attn_softcap = 0; }},
      {"no final cap", [](eng_model_shape* s) { s->final_softcap = 0; }},
      {"SiLU", [](eng_model_shape* s) { s->mlp_gelu = 0; }},
      {"no post norms", [](eng_model_shape* s) { s->post_norms = 0; }},
      {"local base = global", [](eng_model_shape* s) { s->rope_local_theta = 0; }},
      {"no linear scaling", [](eng_model_shape* s) { s->rope_linear_factor = 0; }},
  };
  for (const Change& c : changes) {
    eng_model_shape s = g;
    c.apply(&s);
    CHECKF(!(run_shape(s) == ref), "%s changes nothing", c.what);
  }
  // The global layer: sliding it too changes the logits.
  eng_model_shape global = g;
  global.rope_linear_factor = 0;
  eng_model_shape all = global;
  all.sliding_window_pattern = 0;
  CHECKF(!(run_shape(all) == run_shape(global)), "sliding the global layer too changes nothing");
}

void check_refusals() {
  struct Bad {
    const char* needle;
    void (*apply)(eng_model_shape*);
  };
  const Bad bad[] = {
      {"mlp_gelu must be 0 or 1", [](eng_model_shape* s) { s->mlp_gelu = 2; }},
      {"post_norms must be 0 or 1", [](eng_model_shape* s) { s->post_norms = -1; }},
      {"attn_softcap must be >= 0", [](eng_model_shape* s) { s->attn_softcap = -1; }},
      {"final_softcap must be >= 0", [](eng_model_shape* s) { s->final_softcap = INFINITY; }},
      {"sliding_window must be >= 0", [](eng_model_shape* s) { s->sliding_window = -4; }},
      {"sliding_window_pattern must be 0", [](eng_model_shape* s) { s->sliding_window_pattern = 1; }},
      {"need a sliding_window", [](eng_model_shape* s) { s->sliding_window = 0; }},
      {"rope_linear_factor must be 0", [](eng_model_shape* s) { s->rope_linear_factor = 0.5f; }},
      {"every layer slides", [](eng_model_shape* s) { s->sliding_window_pattern = 0; }},
      {"a shape has one RoPE scaling", [](eng_model_shape* s) {
         s->rope_scaling_factor = 8, s->rope_low_freq_factor = 1, s->rope_high_freq_factor = 4;
         s->rope_original_max_positions = 8192;
       }},
  };
  for (const Bad& b : bad) {
    eng_model_shape s = gemma();
    b.apply(&s);
    expect_shape_refused(s, b.needle);
  }
  for (const char* preset : {"moe-tiny", "deepseek-tiny"}) {
    eng_model_shape s;
    REQUIRE(eng_preset_shape(preset, &s) == ENG_OK);
    s.mlp_gelu = 1;
    expect_shape_refused(s, std::string(preset) == "moe-tiny" ? "dense shapes only" : "MLA with Gemma");
  }
}

}  // namespace

int main() {
  check_invariance();
  check_fields();
  check_refusals();
  return check_exit_code("test_gemma");
}
