// test_e2e.cpp: small models on the CUDA engine against the CPU engine,
// through the C ABI (engine.h): the `tiny` preset (head dim 16: the
// hand-written attention kernels) and a tiny shape with SmolLM2's head dim 64
// and GQA group 3 (FlashInfer, the production attention path). Both engines are fed the same tokens (the CPU
// engine's greedy choice, teacher forcing) so one disagreement does not
// cascade; per step the sampled logits must agree within a bf16 tolerance and
// the greedy tokens must agree on >= 99% of steps. Also checks a batch of
// several sequences with mixed chunk/decode rows and a suspend/resume round
// trip through the host tier (copy_pages).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

eng_engine_t make(eng_backend b, const char* preset) {
  eng_engine_config cfg{};
  cfg.abi_version = ENG_ABI_VERSION;
  cfg.backend = b;
  cfg.preset = preset;
  if (preset == nullptr) cfg.shape = fi_shape();
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
void step(eng_engine_t e, std::vector<Seq*> seqs, const std::vector<std::vector<int32_t>>& toks,
          std::vector<int32_t>* sampled, std::vector<float>* logits, int vocab) {
  std::vector<int32_t> nt, sp, all, nb, bt;
  std::vector<uint8_t> sample;
  for (size_t i = 0; i < seqs.size(); ++i) {
    nt.push_back(int32_t(toks[i].size()));
    sp.push_back(seqs[i]->pos);
    all.insert(all.end(), toks[i].begin(), toks[i].end());
    const int need = (seqs[i]->pos + int(toks[i].size()) + kP - 1) / kP;
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
void run_model(const char* label, const char* preset, Report& report) {
  eng_engine_t cpu = make(ENG_BACKEND_CPU, preset), gpu = make(ENG_BACKEND_CUDA, preset);
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

}  // namespace

int main() {
  skip_without_device("cuda_e2e_test");
  Report report;
  run_model("tiny model (hand-written attention)", "tiny", report);
  run_model("SmolLM2-shaped model (head dim 64, GQA 3:1: FlashInfer attention)", nullptr, report);
  // Mixture of experts: routed on the host by the CPU engine's rule, the
  // experts' GEMMs per expert, the shared expert, the fixed combine order.
  run_model("moe-tiny (16 experts, top-2, a shared expert)", "moe-tiny", report);
  return report.finish();
}
