// (d) Validation at the C ABI: every bad argument returns ENG_INVALID_ARGUMENT
// (or the documented status) with a message naming the field, nothing
// crashes, and a rejected call leaves the engine usable.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "check.h"
#include "test_engine.h"

namespace {

bool contains(const char* s, const std::string& sub) { return s != nullptr && std::strstr(s, sub.c_str()); }

void check_init(const char* name, std::function<void(eng_engine_config&)> mutate, eng_status want,
                std::vector<std::string> words) {
  eng_engine_config c = test_config("tiny", 16, 4, 2);
  mutate(c);
  eng_engine_t e = reinterpret_cast<eng_engine_t>(0x1);  // must be reset to NULL
  const eng_status st = eng_engine_init(&c, &e);
  CHECKF(st == want, "init case \"%s\": status %d, want %d (%s)", name, st, want, eng_last_error());
  if (st != ENG_OK) CHECKF(e == nullptr, "init case \"%s\": handle not NULL on failure", name);
  for (const auto& w : words)
    CHECKF(contains(eng_last_error(), w), "init case \"%s\": message \"%s\" lacks \"%s\"", name,
           eng_last_error(), w.c_str());
  if (st == ENG_OK) eng_engine_free(e);
}

// A valid one-sequence step, mutated per case.
struct Desc {
  std::vector<int32_t> nt{3, 2}, sp{0, 5}, tok{1, 2, 3, 4, 5}, nb{1, 2}, bt{0, 1, 2};
  std::vector<uint8_t> sample{1, 1};
  std::vector<int32_t> sampled{0, 0};
  std::vector<eng_sampling> sampling{{0.8f, 40, 0.9f, 1}, {0.0f, 0, 1.0f, 2}};
  eng_step_desc d{};
  eng_step_result r{};
  void bind() {
    d = {static_cast<int32_t>(nt.size()), nt.data(), sp.data(), tok.data(), nb.data(), bt.data(), sample.data(),
         sampling.data()};
    r = {sampled.data(), nullptr, 0};
  }
};

void check_step(eng_engine_t e, const char* name, std::function<void(Desc&)> mutate,
                std::vector<std::string> words) {
  Desc x;
  x.bind();
  mutate(x);
  const eng_status st = eng_engine_step(e, &x.d, &x.r);
  CHECKF(st == ENG_INVALID_ARGUMENT, "step case \"%s\": status %d (%s)", name, st, eng_engine_last_error(e));
  for (const auto& w : words)
    CHECKF(contains(eng_engine_last_error(e), w), "step case \"%s\": message \"%s\" lacks \"%s\"", name,
           eng_engine_last_error(e), w.c_str());
}

}  // namespace

int main() {
  // Presets equal bridge/presets.go.
  eng_model_shape s;
  CHECK(eng_preset_shape("tiny", &s) == ENG_OK);
  CHECK(s.num_layers == 2 && s.hidden_size == 64 && s.num_heads == 4 && s.num_kv_heads == 2 &&
        s.head_dim == 16 && s.intermediate_size == 128 && s.vocab_size == 512 && s.rope_theta == 10000.0f &&
        s.rms_eps == 1e-5f);
  CHECK(eng_preset_shape("llama-8b", &s) == ENG_OK);
  CHECK(s.num_layers == 32 && s.hidden_size == 4096 && s.num_kv_heads == 8 && s.vocab_size == 128256);
  CHECK(eng_preset_shape("llama-70b", &s) == ENG_OK);
  CHECK(s.num_layers == 80 && s.hidden_size == 8192 && s.intermediate_size == 28672);
  CHECK(eng_preset_shape("gpt-5", &s) == ENG_INVALID_ARGUMENT);
  CHECK(contains(eng_last_error(), "gpt-5") && contains(eng_last_error(), "deepseek-tiny, deepseek-v3, gemma-tiny, kimi-k2, llama-70b, llama-8b, mixtral-8x7b, moe-tiny, qwen3-30b-a3b, tiny"));
  CHECK(eng_preset_shape(nullptr, &s) == ENG_INVALID_ARGUMENT);
  CHECK(eng_preset_shape("tiny", nullptr) == ENG_INVALID_ARGUMENT);
  CHECK((eng_supported_backends() & 1u) == 1u);

  // Init.
  CHECK(eng_engine_init(nullptr, nullptr) == ENG_INVALID_ARGUMENT);
  {
    eng_engine_t e = nullptr;
    CHECK(eng_engine_init(nullptr, &e) == ENG_INVALID_ARGUMENT && contains(eng_last_error(), "cfg"));
  }
  check_init("ok", [](eng_engine_config&) {}, ENG_OK, {});
  check_init("abi", [](eng_engine_config& c) { c.abi_version = 99; }, ENG_INVALID_ARGUMENT,
             {"abi_version", "99"});
  check_init("preset", [](eng_engine_config& c) { c.preset = "llama-9b"; }, ENG_INVALID_ARGUMENT,
             {"llama-9b", "tiny", "llama-8b"});
  check_init("backend", [](eng_engine_config& c) { c.backend = static_cast<eng_backend>(5); },
             ENG_INVALID_ARGUMENT, {"backend"});
  check_init("num_pages", [](eng_engine_config& c) { c.num_pages = 0; }, ENG_INVALID_ARGUMENT, {"num_pages"});
  check_init("tokens_per_page", [](eng_engine_config& c) { c.tokens_per_page = -4; }, ENG_INVALID_ARGUMENT,
             {"tokens_per_page", "-4"});
  check_init("num_host_pages", [](eng_engine_config& c) { c.num_host_pages = -1; }, ENG_INVALID_ARGUMENT,
             {"num_host_pages"});
  auto custom = [](std::function<void(eng_model_shape&)> f) {
    return [f](eng_engine_config& c) {
      c.preset = "";
      eng_preset_shape("tiny", &c.shape);
      f(c.shape);
    };
  };
  check_init("custom ok", custom([](eng_model_shape&) {}), ENG_OK, {});
  check_init("num_layers", custom([](eng_model_shape& s) { s.num_layers = 0; }), ENG_INVALID_ARGUMENT,
             {"num_layers"});
  check_init("num_heads", custom([](eng_model_shape& s) { s.num_heads = -1; }), ENG_INVALID_ARGUMENT,
             {"num_heads"});
  check_init("num_kv_heads", custom([](eng_model_shape& s) { s.num_kv_heads = 3; }), ENG_INVALID_ARGUMENT,
             {"num_kv_heads", "3"});
  check_init("head_dim", custom([](eng_model_shape& s) { s.head_dim = 15; }), ENG_INVALID_ARGUMENT,
             {"head_dim"});
  check_init("hidden_size", custom([](eng_model_shape& s) { s.hidden_size = -65; }), ENG_INVALID_ARGUMENT,
             {"hidden_size", "-65"});
  check_init("num_experts", custom([](eng_model_shape& s) { s.num_experts = -1; }), ENG_INVALID_ARGUMENT,
             {"num_experts"});
  check_init("dense with top-k", custom([](eng_model_shape& s) { s.num_experts_per_tok = 2; }),
             ENG_INVALID_ARGUMENT, {"dense"});
  check_init("top-k above experts", custom([](eng_model_shape& s) {
               s.num_experts = 4, s.num_experts_per_tok = 5, s.moe_intermediate_size = 8;
             }),
             ENG_INVALID_ARGUMENT, {"num_experts_per_tok", "5"});
  check_init("moe_intermediate_size", custom([](eng_model_shape& s) {
               s.num_experts = 4, s.num_experts_per_tok = 2;
             }),
             ENG_INVALID_ARGUMENT, {"moe_intermediate_size"});
  check_init("router_norm", custom([](eng_model_shape& s) {
               s.num_experts = 4, s.num_experts_per_tok = 2, s.moe_intermediate_size = 8, s.router_norm = 5;
             }),
             ENG_INVALID_ARGUMENT, {"router_norm", "5"});
  check_init("first_dense_layers", custom([](eng_model_shape& s) {
               s.num_experts = 4, s.num_experts_per_tok = 2, s.moe_intermediate_size = 8, s.first_dense_layers = 2;
             }),
             ENG_INVALID_ARGUMENT, {"first_dense_layers", "num_layers"});
  check_init("dense first_dense_layers", custom([](eng_model_shape& s) { s.first_dense_layers = 1; }),
             ENG_INVALID_ARGUMENT, {"first_dense_layers", "dense"});
  check_init("expert_groups", custom([](eng_model_shape& s) {
               s.num_experts = 4, s.num_experts_per_tok = 2, s.moe_intermediate_size = 8, s.expert_groups = 3,
               s.expert_groups_used = 1;
             }),
             ENG_INVALID_ARGUMENT, {"expert_groups must divide"});
  check_init("expert_groups_used", custom([](eng_model_shape& s) {
               s.num_experts = 4, s.num_experts_per_tok = 3, s.moe_intermediate_size = 8, s.expert_groups = 2,
               s.expert_groups_used = 1;
             }),
             ENG_INVALID_ARGUMENT, {"expert_groups_used", "num_experts_per_tok"});
  check_init("mla fields without kv_lora_rank", custom([](eng_model_shape& s) { s.v_head_dim = 8; }),
             ENG_INVALID_ARGUMENT, {"v_head_dim", "kv_lora_rank 0"});
  check_init("mla head_dim", custom([](eng_model_shape& s) {
               s.num_kv_heads = s.num_heads, s.kv_lora_rank = 8, s.qk_nope_head_dim = 8, s.qk_rope_head_dim = 4,
               s.v_head_dim = 8;
             }),
             ENG_INVALID_ARGUMENT, {"head_dim must equal", "12"});
  check_init("mla odd rope", custom([](eng_model_shape& s) {
               s.num_kv_heads = s.num_heads, s.kv_lora_rank = 8, s.qk_nope_head_dim = 13, s.qk_rope_head_dim = 3,
               s.v_head_dim = 8;
             }),
             ENG_INVALID_ARGUMENT, {"qk_rope_head_dim", "even"});
  check_init("mla kv heads", custom([](eng_model_shape& s) {
               s.kv_lora_rank = 8, s.qk_nope_head_dim = 8, s.qk_rope_head_dim = 8, s.v_head_dim = 8;
             }),
             ENG_INVALID_ARGUMENT, {"num_kv_heads must equal num_heads"});
  check_init("yarn without mla", custom([](eng_model_shape& s) {
               s.yarn_factor = 4, s.yarn_original_max_positions = 64, s.yarn_beta_fast = 32, s.yarn_beta_slow = 1;
             }),
             ENG_INVALID_ARGUMENT, {"YaRN", "MLA"});
  check_init("yarn betas", custom([](eng_model_shape& s) {
               s.num_kv_heads = s.num_heads, s.kv_lora_rank = 8, s.qk_nope_head_dim = 8, s.qk_rope_head_dim = 8,
               s.v_head_dim = 8, s.yarn_factor = 4, s.yarn_original_max_positions = 64, s.yarn_beta_fast = 1,
               s.yarn_beta_slow = 32;
             }),
             ENG_INVALID_ARGUMENT, {"beta_fast >= beta_slow"});
  check_init("intermediate_size", custom([](eng_model_shape& s) { s.intermediate_size = 0; }),
             ENG_INVALID_ARGUMENT, {"intermediate_size"});
  check_init("vocab_size", custom([](eng_model_shape& s) { s.vocab_size = 1; }), ENG_INVALID_ARGUMENT,
             {"vocab_size"});
  check_init("rope_theta", custom([](eng_model_shape& s) { s.rope_theta = 0; }), ENG_INVALID_ARGUMENT,
             {"rope_theta"});
  check_init("rms_eps", custom([](eng_model_shape& s) { s.rms_eps = -1; }), ENG_INVALID_ARGUMENT, {"rms_eps"});
  if (!(eng_supported_backends() & 2u))
    check_init("cuda", [](eng_engine_config& c) { c.backend = ENG_BACKEND_CUDA; }, ENG_UNSUPPORTED,
               {"CUDA", "ENGINE_CUDA"});
  check_init("llama-70b too big", [](eng_engine_config& c) { c.preset = "llama-70b"; }, ENG_OUT_OF_MEMORY,
             {"validate_only", "CUDA"});

  // validate_only: a huge shape initialises without allocating; steps and
  // copies are refused.
  {
    eng_engine_config c = test_config("llama-70b", 100000, 64, 50000);
    c.validate_only = 1;
    eng_engine_t e = test_engine(c);
    eng_model_shape got;
    CHECK(eng_engine_shape(e, &got) == ENG_OK && got.num_layers == 80);
    Desc x;
    x.bind();
    CHECK(eng_engine_step(e, &x.d, &x.r) == ENG_UNSUPPORTED);
    CHECK(contains(eng_engine_last_error(e), "validate_only"));
    const int32_t p = 0;
    CHECK(eng_engine_copy_pages(e, ENG_TIER_DEVICE, &p, ENG_TIER_HOST, &p, 1) == ENG_UNSUPPORTED);
    eng_engine_free(e);
  }

  // Null handles.
  {
    eng_model_shape got;
    CHECK(eng_engine_shape(nullptr, &got) == ENG_INVALID_ARGUMENT);
    CHECK(eng_engine_step(nullptr, nullptr, nullptr) == ENG_INVALID_ARGUMENT);
    CHECK(contains(eng_last_error(), "handle"));
    CHECK(eng_engine_copy_pages(nullptr, ENG_TIER_DEVICE, nullptr, ENG_TIER_DEVICE, nullptr, 0) ==
          ENG_INVALID_ARGUMENT);
    CHECK(eng_engine_free(nullptr) == ENG_OK);
    CHECK(contains(eng_engine_last_error(nullptr), "NULL"));
  }

  // Step descriptors (tiny, 16 pages of 4 tokens).
  eng_engine_t e = test_engine(test_config("tiny", 16, 4, 2));
  {
    Desc ok;
    ok.bind();
    CHECK(eng_engine_step(e, &ok.d, &ok.r) == ENG_OK);
    CHECK(ok.sampled[0] >= 0 && ok.sampled[1] >= 0);
    CHECK(ok.r.device_ms >= 0);
  }
  {
    Desc x;
    x.bind();
    CHECK(eng_engine_step(e, nullptr, &x.r) == ENG_INVALID_ARGUMENT && contains(eng_engine_last_error(e), "desc"));
    CHECK(eng_engine_step(e, &x.d, nullptr) == ENG_INVALID_ARGUMENT && contains(eng_engine_last_error(e), "res"));
  }
  check_step(e, "num_seqs", [](Desc& x) { x.d.num_seqs = -1; }, {"num_seqs", "-1"});
  check_step(e, "num_tokens NULL", [](Desc& x) { x.d.num_tokens = nullptr; }, {"num_tokens"});
  check_step(e, "start_pos NULL", [](Desc& x) { x.d.start_pos = nullptr; }, {"start_pos"});
  check_step(e, "tokens NULL", [](Desc& x) { x.d.tokens = nullptr; }, {"tokens"});
  check_step(e, "num_blocks NULL", [](Desc& x) { x.d.num_blocks = nullptr; }, {"num_blocks"});
  check_step(e, "block_table NULL", [](Desc& x) { x.d.block_table = nullptr; }, {"block_table"});
  check_step(e, "sample NULL", [](Desc& x) { x.d.sample = nullptr; }, {"sample"});
  check_step(e, "sampled NULL", [](Desc& x) { x.r.sampled = nullptr; }, {"sampled"});
  check_step(e, "num_tokens 0", [](Desc& x) { x.nt[1] = 0; }, {"num_tokens[1]", "0"});
  check_step(e, "start_pos <0", [](Desc& x) { x.sp[1] = -3; }, {"start_pos[1]", "-3"});
  check_step(e, "token >= vocab", [](Desc& x) { x.tok[3] = 512; }, {"tokens[3]", "sequence 1", "512"});
  check_step(e, "token < 0", [](Desc& x) { x.tok[0] = -1; }, {"tokens[0]", "sequence 0", "-1"});
  check_step(e, "page >= num_pages", [](Desc& x) { x.bt[2] = 16; }, {"block_table[2]", "sequence 1", "16"});
  check_step(e, "page < 0", [](Desc& x) { x.bt[0] = -2; }, {"block_table[0]", "sequence 0", "-2"});
  check_step(e, "block table short", [](Desc& x) { x.sp[1] = 7; }, {"num_blocks[1]", "too short"});
  check_step(e, "num_blocks < 0", [](Desc& x) { x.nb[0] = -1; }, {"num_blocks[0]"});
  check_step(e, "position overflow", [](Desc& x) { x.sp[0] = INT32_MAX - 1; }, {"start_pos[0]", "int32"});
  check_step(e, "temperature < 0", [](Desc& x) { x.sampling[1].temperature = -1; },
             {"sampling[1].temperature", "sequence 1", "-1"});
  check_step(e, "temperature NaN", [](Desc& x) { x.sampling[0].temperature = NAN; },
             {"sampling[0].temperature", "finite"});
  check_step(e, "temperature inf", [](Desc& x) { x.sampling[0].temperature = INFINITY; },
             {"sampling[0].temperature", "finite"});
  check_step(e, "top_k < 0", [](Desc& x) { x.sampling[1].top_k = -3; }, {"sampling[1].top_k", "sequence 1", "-3"});
  check_step(e, "top_p 0", [](Desc& x) { x.sampling[0].top_p = 0; }, {"sampling[0].top_p", "(0, 1]"});
  check_step(e, "top_p > 1", [](Desc& x) { x.sampling[1].top_p = 1.5f; }, {"sampling[1].top_p", "1.5"});
  check_step(e, "top_p NaN", [](Desc& x) { x.sampling[1].top_p = NAN; }, {"sampling[1].top_p"});
  check_step(e, "greedy top_p invalid", [](Desc& x) { x.sampling[1].temperature = 0; x.sampling[1].top_p = -1; },
             {"sampling[1].top_p"});
  check_step(e, "write conflict", [](Desc& x) { x.bt = {1, 1, 2}; x.sp[1] = 2; }, {"page 1", "sequence 0", "block_table[1]"});
  // Two sequences may share a page that only one of them writes: sequence 0
  // writes page 0, sequence 1 reads page 0 (a shared prefix) and writes page 2.
  {
    Desc x;
    x.nt = {3, 1};
    x.sp = {0, 4};
    x.tok = {1, 2, 3, 4};
    x.nb = {1, 2};
    x.bt = {0, 0, 2};
    x.bind();
    CHECKF(eng_engine_step(e, &x.d, &x.r) == ENG_OK, "shared read-only page rejected: %s",
           eng_engine_last_error(e));
  }
  // An empty batch is fine.
  {
    eng_step_desc d{};
    int32_t sampled = 0;
    eng_step_result r{&sampled, nullptr, 5};
    CHECK(eng_engine_step(e, &d, &r) == ENG_OK && r.device_ms == 0);
  }
  // Still usable after every rejection.
  {
    Desc ok;
    ok.bind();
    CHECK(eng_engine_step(e, &ok.d, &ok.r) == ENG_OK);
  }
  eng_engine_free(e);
  return check_exit_code("test_abi_validation");
}
