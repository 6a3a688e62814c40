// test_e2e.cpp: small models on the CUDA engine against the CPU engine,
// through the C ABI (engine.h): the `tiny` preset (head dim 16: the
// hand-written attention kernels) and a tiny shape with SmolLM2's head dim 64
// and GQA group 3 (FlashInfer, the production attention path). Both engines are fed the same tokens (the CPU
// engine's greedy choice, teacher forcing) so one disagreement does not
// cascade; per step the sampled logits must agree within a bf16 tolerance and
// the greedy tokens must agree on >= 99% of steps. Also checks a batch of
// several sequences with mixed chunk/decode rows and a suspend/resume round
// trip through the host tier (copy_pages). Helix: 2 and 3 CUDA engines in one
// context-parallel group on this one device (their partials then go through
// the group's host exchange: NCCL refuses members sharing a device) against
// the CPU engine, with the same tolerance; and deepseek-tiny on 2 (latent
// partials). MLA: deepseek-tiny (the
// hand-written latent kernel) and the same model at FlashInfer's MLA
// geometry with YaRN (FlashInfer's MLA kernel).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "engine.h"
#include "test_util.h"

using namespace lockstep_test;

namespace {

constexpr int kP = 16, kPages = 64, kHostPages = 16;
// Relative L2 error allowed between CUDA (bf16 weights and KV) and CPU
// (float32) logits of the tiny model.
constexpr double kLogitTol = 3e-2;

// A shape with SmolLM2-135M's attention geometry (head dim 64, 9:3 heads ->
// group 3) at the tiny model's size: the CUDA engine runs it through FlashInfer.
eng_model_shape fi_shape() {
  eng_model_shape s{};
  eng_preset_shape("tiny", &s);
  s.num_heads = 6;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.hidden_size = 6 * 64;
  s.intermediate_size = 256;
  return s;
}

// deepseek-tiny with FlashInfer's MLA geometry (latent 512, rope 64) and
// YaRN, so that the CUDA engine runs FlashInfer's MLA kernel and the rope
// magnitude path.
eng_model_shape fi_mla_shape() {
  eng_model_shape s{};
  eng_preset_shape("deepseek-tiny", &s);
  s.kv_lora_rank = 512;
  s.qk_rope_head_dim = 64;
  s.head_dim = s.qk_nope_head_dim + s.qk_rope_head_dim;  // an MLA shape's rule
  s.yarn_factor = 4.0f;
  s.yarn_original_max_positions = 64;
  s.yarn_beta_fast = 32.0f;
  s.yarn_beta_slow = 1.0f;
  s.yarn_mscale = 1.0f;
  s.yarn_mscale_all_dim = 1.0f;
  return s;
}

// preset, or `shape` when preset is null (fi_shape() when both are).
eng_engine_t make(eng_backend b, const char* preset, const eng_model_shape* shape = nullptr) {
  eng_engine_config cfg{};
  cfg.abi_version = ENG_ABI_VERSION;
  cfg.backend = b;
  cfg.preset = preset;
  if (preset == nullptr) cfg.shape = shape != nullptr ? *shape : fi_shape();
  cfg.seed = 1234;
  cfg.num_pages = kPages;
  cfg.tokens_per_page = kP;
  cfg.num_host_pages = kHostPages;
  cfg.device_id = 0;
  eng_engine_t e = nullptr;
  if (eng_engine_init(&cfg, &e) != ENG_OK) {
    std::printf("FAIL: init %s: %s\n", b == ENG_BACKEND_CUDA ? "cuda" : "cpu", eng_last_error());
    std::exit(1);
  }
  return e;
}

struct Seq {
  std::vector<int32_t> blocks;
  int32_t pos = 0;
};

// One step of `seqs` (each with its own new tokens) on engine e.
// span: the tokens of one block-table entry (P, or P * cp under Helix).
void step(eng_engine_t e, std::vector<Seq*> seqs, const std::vector<std::vector<int32_t>>& toks,
          std::vector<int32_t>* sampled, std::vector<float>* logits, int vocab, int span = kP) {
  std::vector<int32_t> nt, sp, all, nb, bt;
  std::vector<uint8_t> sample;
  for (size_t i = 0; i < seqs.size(); ++i) {
    nt.push_back(int32_t(toks[i].size()));
    sp.push_back(seqs[i]->pos);
    all.insert(all.end(), toks[i].begin(), toks[i].end());
    const int need = (seqs[i]->pos + int(toks[i].size()) + span - 1) / span;
    nb.push_back(need);
    bt.insert(bt.end(), seqs[i]->blocks.begin(), seqs[i]->blocks.begin() + need);
    sample.push_back(1);
  }
  sampled->assign(seqs.size(), -2);
  logits->assign(seqs.size() * size_t(vocab), NAN);
  eng_step_desc d{int32_t(seqs.size()), nt.data(), sp.data(), all.data(), nb.data(), bt.data(), sample.data(), nullptr};
  eng_step_result r{sampled->data(), logits->data(), 0};
  if (eng_engine_step(e, &d, &r) != ENG_OK) {
    std::printf("FAIL: step: %s\n", eng_engine_last_error(e));
    std::exit(1);
  }
}

double rel(const float* a, const float* b, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Runs the comparison for one model (preset, or fi_shape() when null).
void run_model(const char* label, const char* preset, Report& report, const eng_model_shape* custom = nullptr) {
  eng_engine_t cpu = make(ENG_BACKEND_CPU, preset, custom), gpu = make(ENG_BACKEND_CUDA, preset, custom);
  eng_model_shape shape;
  eng_engine_shape(cpu, &shape);
  const int V = shape.vocab_size;

  // Four sequences, 12 pages each (up to 192 tokens), disjoint page sets in a
  // scattered order so that the block tables are not the identity.
  std::vector<Seq> seqs(4);
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < 12; ++b) seqs[size_t(s)].blocks.push_back((b * 4 + s * 7) % 48);
  std::vector<std::vector<int32_t>> prompts(4);
  for (int s = 0; s < 4; ++s)
    for (int t = 0; t < 20 + 9 * s; ++t) prompts[size_t(s)].push_back((t * 37 + s * 101 + 5) % V);

  // Prefill: sequences 1-3 whole and the first 10 tokens of sequence 0; then
  // one mixed step (sequence 0's remaining chunk first in batch order, the
  // others decoding: the engine reorders rows decode-first internally); then
  // 120 decode steps with every sequence in the batch; sequence 3 is
  // suspended to the host tier and resumed half way.
  int steps = 0, agree = 0;
  double worst = 0;
  std::vector<int32_t> sc, sg;
  std::vector<float> lc, lg;
  std::vector<Seq*> all = {&seqs[0], &seqs[1], &seqs[2], &seqs[3]};
  std::vector<std::vector<int32_t>> first = prompts;
  first[0].resize(10);
  step(cpu, all, first, &sc, &lc, V);
  step(gpu, all, first, &sg, &lg, V);
  std::vector<std::vector<int32_t>> next(4);
  auto compare = [&](size_t from, size_t n) {
    for (size_t i = from; i < n; ++i) {
      worst = std::max(worst, rel(&lg[i * V], &lc[i * V], V));
      agree += sc[i] == sg[i];
      ++steps;
      next[i] = {sc[i]};  // teacher forcing with the CPU's token
    }
  };
  compare(1, 4);  // sequence 0's token is mid-prompt
  for (int s = 0; s < 4; ++s) seqs[size_t(s)].pos += int32_t(first[size_t(s)].size());
  next[0].assign(prompts[0].begin() + 10, prompts[0].end());
  step(cpu, all, next, &sc, &lc, V);
  step(gpu, all, next, &sg, &lg, V);
  for (int s = 0; s < 4; ++s) seqs[size_t(s)].pos += int32_t(next[size_t(s)].size());
  compare(0, 4);

  for (int it = 0; it < 120; ++it) {
    if (it == 60) {
      // Suspend sequence 3's pages to host pages 0.. and back into the same
      // device pages after scribbling over them with another sequence's copy.
      const int n = (seqs[3].pos + kP - 1) / kP;
      std::vector<int32_t> host(static_cast<size_t>(n)), dev(seqs[3].blocks.begin(), seqs[3].blocks.begin() + n);
      for (int k = 0; k < n; ++k) host[size_t(k)] = k;
      for (eng_engine_t e : {cpu, gpu}) {
        bool ok = eng_engine_copy_pages(e, ENG_TIER_DEVICE, dev.data(), ENG_TIER_HOST, host.data(), n) == ENG_OK;
        std::vector<int32_t> other(seqs[0].blocks.begin(), seqs[0].blocks.begin() + n);
        ok &= eng_engine_copy_pages(e, ENG_TIER_DEVICE, other.data(), ENG_TIER_DEVICE, dev.data(), n) == ENG_OK;
        ok &= eng_engine_copy_pages(e, ENG_TIER_HOST, host.data(), ENG_TIER_DEVICE, dev.data(), n) == ENG_OK;
        report.check(ok, "copy_pages device -> host -> device round trip");
      }
    }
    step(cpu, all, next, &sc, &lc, V);
    step(gpu, all, next, &sg, &lg, V);
    compare(0, 4);
    for (auto& s : seqs) s.pos += 1;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s CUDA vs CPU: worst logits rel %.2e (tol %.0e)", label, worst, kLogitTol);
  report.check(worst <= kLogitTol, buf);
  std::snprintf(buf, sizeof buf, "%s CUDA vs CPU: greedy tokens agree on %d of %d steps", label, agree, steps);
  report.check(agree * 100 >= steps * 99, buf);
  // The agreement figures, whatever the verdict (the device check's summary).
  std::printf("figure: %s CUDA vs CPU: worst logits rel %.2e (tol %.0e), greedy tokens agree on %d of %d steps "
              "(%.1f%%, >= 99%% required)\n",
              label, worst, kLogitTol, agree, steps, 100.0 * agree / std::max(steps, 1));
  eng_engine_free(cpu);
  eng_engine_free(gpu);
}

// Helix: one sequence, prefilled in uneven chunks then decoded, on `cp`
// CUDA members (each on its own thread, local block tables of P * cp tokens
// per entry) and on the CPU engine; every member's logits against the CPU's.
void run_helix(const char* preset, int cp, Report& report) {
  eng_engine_t cpu = make(ENG_BACKEND_CPU, preset);
  eng_model_shape shape;
  eng_engine_shape(cpu, &shape);
  const int V = shape.vocab_size, prompt_len = 77, decode = 40;
  std::vector<int32_t> prompt;
  for (int t = 0; t < prompt_len; ++t) prompt.push_back((t * 53 + 11) % V);
  const std::vector<int> chunks = {13, 1, 30, 33};
  eng_cp_group_t group = nullptr;
  if (eng_cp_group_create(cp, 60000, &group) != ENG_OK) {
    std::printf("FAIL: cp group: %s\n", eng_last_error());
    std::exit(1);
  }
  std::vector<eng_engine_t> members;
  for (int r = 0; r < cp; ++r) {
    members.push_back(make(ENG_BACKEND_CUDA, preset));
    if (eng_engine_join_cp(members.back(), group, r) != ENG_OK) {
      std::printf("FAIL: join_cp: %s\n", eng_engine_last_error(members.back()));
      std::exit(1);
    }
  }
  eng_cp_group_free(group);
  Seq ref;
  for (int b = 0; b < 12; ++b) ref.blocks.push_back((b * 5 + 3) % 48);
  std::vector<Seq> local(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r)
    for (int b = 0; b < 12; ++b) local[size_t(r)].blocks.push_back((b * 7 + r) % 48);
  int steps = 0, agree = 0;
  double worst = 0;
  std::vector<int32_t> sc;
  std::vector<float> lc;
  std::vector<std::vector<int32_t>> sg(static_cast<size_t>(cp));
  std::vector<std::vector<float>> lg(static_cast<size_t>(cp));
  auto one_step = [&](const std::vector<int32_t>& toks, bool compare) {
    step(cpu, {&ref}, {toks}, &sc, &lc, V);
    std::vector<std::thread> threads;
    for (int r = 0; r < cp; ++r)
      threads.emplace_back([&, r] {
        step(members[size_t(r)], {&local[size_t(r)]}, {toks}, &sg[size_t(r)], &lg[size_t(r)], V, kP * cp);
      });
    for (auto& t : threads) t.join();
    ref.pos += int32_t(toks.size());
    for (auto& l : local) l.pos += int32_t(toks.size());
    if (!compare) return;
    for (int r = 0; r < cp; ++r) {
      worst = std::max(worst, rel(lg[size_t(r)].data(), lc.data(), V));
      agree += sg[size_t(r)][0] == sc[0];
      ++steps;
    }
  };
  int pos = 0;
  for (size_t c = 0; pos < prompt_len; ++c) {
    const int n = std::min(chunks[c % chunks.size()], prompt_len - pos);
    one_step(std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + pos + n), pos + n == prompt_len);
    pos += n;
  }
  for (int g = 0; g < decode; ++g) one_step({sc[0]}, true);  // teacher forcing with the CPU's token
  char buf[256];
  std::snprintf(buf, sizeof buf, "Helix on %d CUDA members (%s) vs the CPU engine: worst logits rel %.2e (tol %.0e)",
                cp, preset, worst, kLogitTol);
  report.check(worst <= kLogitTol, buf);
  std::snprintf(buf, sizeof buf, "Helix on %d CUDA members (%s) vs the CPU engine: greedy tokens agree on %d of %d",
                cp, preset, agree, steps);
  report.check(agree * 100 >= steps * 99, buf);
  std::printf("figure: Helix --cp %d on one device (%s): worst logits rel %.2e (tol %.0e), greedy agree %d of %d\n",
              cp, preset, worst, kLogitTol, agree, steps);
  for (eng_engine_t e : members) eng_engine_free(e);
  eng_engine_free(cpu);
}

}  // namespace

int main() {
  skip_without_device("cuda_e2e_test");
  Report report;
  run_model("tiny model (hand-written attention)", "tiny", report);
  run_model("SmolLM2-shaped model (head dim 64, GQA 3:1: FlashInfer attention)", nullptr, report);
  // Mixture of experts: routed on the host by the CPU engine's rule, the
  // experts' GEMMs per expert, the shared expert, the fixed combine order.
  run_model("moe-tiny (16 experts, top-2, a shared expert)", "moe-tiny", report);
  // Multi-head latent attention: the hand-written latent kernel (deepseek-
  // tiny: latent 32, rope 8), then FlashInfer's MLA kernel (latent 512,
  // rope 64, YaRN), each with DeepSeek's MoE (sigmoid groups, shared expert).
  run_model("deepseek-tiny (MLA: hand-written latent attention; MoE)", "deepseek-tiny", report);
  const eng_model_shape mla = fi_mla_shape();
  run_model("deepseek-tiny at latent 512 / rope 64 with YaRN (FlashInfer MLA)", nullptr, report, &mla);
  // Helix context parallelism: partials per member, merged on the device.
  run_helix("tiny", 2, report);
  run_helix("tiny", 3, report);
  run_helix("deepseek-tiny", 2, report);  // latent partials (the hand-written MLA kernel)
  return report.finish();
}
