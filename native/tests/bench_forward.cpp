// bench_forward: wall time of the CPU backend's forward step on a synthetic
// model of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads / 3 KV heads
// of 64, FFN 1536, vocab 49152), through the C ABI only, single thread:
//   prefill: one step of 8 sequences x 64 prompt tokens (512 rows), each
//            sampled;
//   decode:  32 steps of the same 8 sequences, one token each (batch 8).
// Prints ms and tokens/s, and a digest (FNV-1a) of every sampled token and
// logit, which must not change when kernels change (bit-exact backend).
//
//   bench_forward [decode_steps] [prompt_tokens_per_seq]   (defaults 32 64)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine.h"

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  const int decode_steps = argc > 1 ? std::atoi(argv[1]) : 32;
  const int prompt = argc > 2 ? std::atoi(argv[2]) : 64;
  const int nseq = 8, P = 16;
  const eng_model_shape shape = {30, 576, 9, 3, 64, 1536, 49152, 100000.0f, 1e-5f};
  const int pages_per_seq = (prompt + decode_steps + P) / P + 1;

  eng_engine_config c;
  std::memset(&c, 0, sizeof c);
  c.abi_version = ENG_ABI_VERSION;
  c.backend = ENG_BACKEND_CPU;
  c.preset = "";
  c.shape = shape;
  c.seed = 7;
  c.num_pages = nseq * pages_per_seq;
  c.tokens_per_page = P;
  eng_engine_t e = nullptr;
  const double ti = now_ms();
  if (eng_engine_init(&c, &e) != ENG_OK) {
    std::fprintf(stderr, "eng_engine_init: %s\n", eng_last_error());
    return 1;
  }
  std::printf("bench_forward: SmolLM2-135M shape, %d sequences, init %.0f ms\n", nseq, now_ms() - ti);

  std::vector<int32_t> blocks(static_cast<size_t>(nseq * pages_per_seq));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  std::vector<int32_t> nb(nseq, pages_per_seq), last(nseq), pos(nseq, 0);
  std::vector<uint8_t> sample(nseq, 1);
  std::vector<float> logits(static_cast<size_t>(nseq) * shape.vocab_size);
  uint64_t digest = 0xcbf29ce484222325ull;

  auto run = [&](const std::vector<int32_t>& nt, const std::vector<int32_t>& toks) -> double {
    eng_step_desc d{};
    d.num_seqs = nseq;
    d.num_tokens = nt.data();
    d.start_pos = pos.data();
    d.tokens = toks.data();
    d.num_blocks = nb.data();
    d.block_table = blocks.data();
    d.sample = sample.data();
    d.sampling = nullptr;
    eng_step_result r{};
    r.sampled = last.data();
    r.logits = logits.data();
    r.device_ms = -1;
    const double t0 = now_ms();
    if (eng_engine_step(e, &d, &r) != ENG_OK) {
      std::fprintf(stderr, "eng_engine_step: %s\n", eng_engine_last_error(e));
      std::exit(1);
    }
    const double ms = now_ms() - t0;
    digest = fnv(digest, last.data(), sizeof(int32_t) * last.size());
    digest = fnv(digest, logits.data(), sizeof(float) * logits.size());
    for (int i = 0; i < nseq; ++i) pos[i] += nt[i];
    return ms;
  };

  // Prefill: deterministic pseudo-random prompts.
  std::vector<int32_t> nt(nseq, prompt), toks;
  uint64_t s = 12345;
  for (int i = 0; i < nseq * prompt; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    toks.push_back(static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(shape.vocab_size)));
  }
  const double prefill_ms = run(nt, toks);
  std::printf("prefill  %4d tokens (%d x %d): %9.1f ms  %8.1f tokens/s\n", nseq * prompt, nseq, prompt,
              prefill_ms, nseq * prompt / prefill_ms * 1e3);

  // Decode: greedy, batch 8.
  std::vector<int32_t> one(nseq, 1);
  double decode_ms = 0;
  for (int k = 0; k < decode_steps; ++k) decode_ms += run(one, last);
  std::printf("decode   %4d steps x batch %d: %9.1f ms  %8.1f ms/step  %8.1f tokens/s\n", decode_steps,
              nseq, decode_ms, decode_ms / decode_steps, nseq * decode_steps / decode_ms * 1e3);
  std::printf("digest   %016llx (sampled tokens and logits of every step)\n",
              static_cast<unsigned long long>(digest));
  eng_engine_free(e);
  return 0;
}
