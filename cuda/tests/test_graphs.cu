// test_graphs.cu: decode steps replayed from CUDA graphs against the same
// steps run eagerly, on one CUDA backend (internal API: CudaBackend) with
// SmolLM2's attention geometry (head dim 64, group 3: FlashInfer, the path
// graphs serve) at the tiny model's size.
//
// For batch sizes on and between the buckets (1, 3, 8, 13, 37, 64, 70: the
// odd ones are padded), each decode step runs eagerly (graphs off), then
// three times with graphs on (warm-up, capture + replay, replay). The same
// step rewrites the same K/V slots, so every run sees the same cache. Checked:
//   - the counters (one warm-up, one capture, two replays, no failure);
//   - logits of both replays against the eager step within relative L2 2e-2
//     (padding changes the GEMM shape and FlashInfer's graph plan always
//     splits KV, so bit equality is not expected), the two replays bit-equal;
//   - each returned id is the argmax of its own returned logits row (the map
//     from bucket rows back to sequences), and greedy ids equal eager ones
//     wherever eager's top-2 margin is clear;
//   - padding rows wrote no K/V: the whole page slab is byte-equal to the
//     slab after the eager step;
//   - a step with temperature > 0 returns ids in range (host sampling of a
//     graph row).
// Then re-capture: an eager chunk step larger than any before grows the
// scratch buffers a graph holds; the next graph step must drop the graphs and
// capture again (and still agree with eager).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "model_cuda.h"
#include "test_util.h"

using namespace lockstep;
using namespace lockstep_test;

namespace {

constexpr int kP = 16, kPages = 1024, kSeqs = 70;
constexpr double kTol = 2e-2;

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

struct Seq {
  std::vector<int32_t> blocks, prompt;
  int32_t len = 0;  // tokens in the cache
  int32_t next = 0; // the token the decode steps feed
};

StepSeq step_seq(const Seq& s, const int32_t* tokens, int32_t n, int32_t start, float temperature = 0.0f) {
  StepSeq q{};
  q.tokens = tokens;
  q.num_tokens = n;
  q.start_pos = start;
  q.blocks = s.blocks.data();
  q.num_blocks = int32_t(s.blocks.size());
  q.sample = true;
  q.sampling = eng_sampling{temperature, 0, 1.0f, 42};
  return q;
}

StepBatch batch_of(std::vector<StepSeq> seqs) {
  StepBatch b;
  b.seqs = std::move(seqs);
  for (const StepSeq& s : b.seqs) {
    b.num_rows += s.num_tokens;
    ++b.num_sampled;
    if (s.sampling.temperature > 0.0f) ++b.num_stochastic;
  }
  return b;
}

int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

double rel_l2(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<uint8_t> slab_bytes(CudaBackend& be) {
  std::vector<uint8_t> h(size_t(kPages) * be.pages().page_bytes());
  TCHECK(cudaStreamSynchronize(be.stream()));
  TCHECK(cudaMemcpy(h.data(), be.pages().device_page(0), h.size(), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main() {
  skip_without_device("cuda_graphs_test");
  Report rep;
  try {
    EngineParams p;
    p.shape = fi_shape();
    p.seed = 1234;
    p.num_pages = kPages;
    p.tokens_per_page = kP;
    p.num_host_pages = 0;
    p.device_id = 0;
    CudaBackend be(p);
    const int32_t V = p.shape.vocab_size;
    rep.check(be.decode_graphs_on(), "decode graphs on: " + be.decode_graphs_note());
    if (!be.decode_graphs_on()) return rep.finish();

    // Prefill every sequence (one eager step of chunks).
    std::vector<Seq> seqs(kSeqs);
    int32_t page = 0;
    std::vector<StepSeq> pre;
    for (int i = 0; i < kSeqs; ++i) {
      Seq& s = seqs[size_t(i)];
      s.len = 3 + (i * 13) % 60;
      for (int t = 0; t < s.len; ++t) s.prompt.push_back((i * 7 + t * 3) % V);
      for (int b = 0; b < (s.len + 1 + kP - 1) / kP; ++b) s.blocks.push_back(page++);
      pre.push_back(step_seq(s, s.prompt.data(), s.len, 0));
    }
    int64_t prefill_rows = 0;
    {
      StepBatch b = batch_of(pre);
      prefill_rows = b.num_rows;
      std::vector<int32_t> sampled(kSeqs);
      be.step(b, sampled.data(), nullptr);
      for (int i = 0; i < kSeqs; ++i) seqs[size_t(i)].next = sampled[size_t(i)];
    }

    std::vector<float> eager, g1, g2;
    std::vector<int32_t> s_eager, s1, s2;
    // One decode step of the first n sequences.
    auto decode = [&](int n, std::vector<float>* logits, std::vector<int32_t>* sampled, float temperature) {
      std::vector<StepSeq> v;
      for (int i = 0; i < n; ++i) v.push_back(step_seq(seqs[size_t(i)], &seqs[size_t(i)].next, 1, seqs[size_t(i)].len, temperature));
      StepBatch b = batch_of(v);
      logits->assign(size_t(n) * V, NAN);
      sampled->assign(size_t(n), -2);
      be.step(b, sampled->data(), temperature > 0.0f ? nullptr : logits->data());
    };
    auto compare = [&](int n, const char* what) {
      char name[160];
      std::snprintf(name, sizeof name, "batch %d %s", n, what);
      const double e1 = rel_l2(g1.data(), eager.data(), g1.size());
      rep.check(e1 <= kTol, std::string(name) + ": capture+replay logits vs eager, rel L2 " + std::to_string(e1));
      rep.check(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)) == 0,
                std::string(name) + ": two replays bit-equal");
      int map_ok = 0, agree = 0, clear = 0;
      for (int i = 0; i < n; ++i) {
        const float* row = g1.data() + size_t(i) * V;
        map_ok += s1[size_t(i)] == argmax(row, V);
        const float* er = eager.data() + size_t(i) * V;
        const int32_t top = argmax(er, V);
        float second = -INFINITY;
        for (int32_t k = 0; k < V; ++k)
          if (k != top) second = std::max(second, er[k]);
        if (er[top] - second > 1e-2f * std::fabs(er[top]) + 1e-3f) {
          ++clear;
          agree += s1[size_t(i)] == s_eager[size_t(i)];
        }
      }
      rep.check(map_ok == n, std::string(name) + ": each id is the argmax of its own logits row (" +
                                 std::to_string(map_ok) + "/" + std::to_string(n) + ")");
      rep.check(agree == clear, std::string(name) + ": greedy ids equal eager where the margin is clear (" +
                                    std::to_string(agree) + "/" + std::to_string(clear) + ")");
    };

    for (int n : {1, 3, 8, 13, 37, 64, 70}) {
      be.set_decode_graphs(false);
      decode(n, &eager, &s_eager, 0.0f);
      const std::vector<uint8_t> slab_eager = slab_bytes(be);
      be.set_decode_graphs(true);
      const DecodeGraphStats before = be.decode_graph_stats();
      std::vector<float> warm;
      std::vector<int32_t> sw;
      decode(n, &warm, &sw, 0.0f);  // warm-up (eager, padded)
      decode(n, &g1, &s1, 0.0f);    // capture + replay
      decode(n, &g2, &s2, 0.0f);    // replay
      const DecodeGraphStats& st = be.decode_graph_stats();
      char what[200];
      std::snprintf(what, sizeof what,
                    "batch %d: counters warm-ups %lld, captures %lld, replays %lld, failures %lld (want 1, 1, 2, 0)", n,
                    (long long)(st.warmups - before.warmups), (long long)(st.captures - before.captures),
                    (long long)(st.replays - before.replays), (long long)(st.failures - before.failures));
      rep.check(st.warmups - before.warmups == 1 && st.captures - before.captures == 1 &&
                    st.replays - before.replays == 2 && st.failures == before.failures,
                what);
      rep.check(rel_l2(warm.data(), eager.data(), warm.size()) <= kTol,
                "batch " + std::to_string(n) + ": padded warm-up logits vs eager");
      compare(n, "");
      // The real rows rewrite their own slots (values may differ in the last
      // bits: another GEMM shape); every other byte must be untouched.
      std::vector<uint8_t> slab_graph = slab_bytes(be);
      const int64_t pe = be.pages().page_elems(), D = p.shape.head_dim, Hkv = p.shape.num_kv_heads;
      for (int i = 0; i < n; ++i) {
        const Seq& q = seqs[size_t(i)];
        const int64_t pg = q.blocks[size_t(q.len / kP)], sl = q.len % kP;
        for (int64_t lkh = 0; lkh < int64_t(p.shape.num_layers) * 2 * Hkv; ++lkh) {
          const size_t off = size_t((pg * pe + lkh * kP * D + sl * D) * 2);
          std::memcpy(slab_graph.data() + off, slab_eager.data() + off, size_t(D * 2));
        }
      }
      rep.check(slab_graph == slab_eager, "batch " + std::to_string(n) + ": padding rows wrote no K/V");
      std::vector<float> unused;
      std::vector<int32_t> ss;
      decode(n, &unused, &ss, 0.8f);
      bool in_range = true;
      for (int32_t id : ss) in_range = in_range && id >= 0 && id < V;
      rep.check(in_range, "batch " + std::to_string(n) + ": temperature 0.8 through a graph gives ids in range");
    }

    // Re-capture after a captured address moves: a chunk larger than every
    // earlier step grows the scratch buffers.
    {
      const int n = 70;
      const DecodeGraphStats before = be.decode_graph_stats();
      Seq big;
      big.len = int32_t(prefill_rows + 64);
      for (int t = 0; t < big.len; ++t) big.prompt.push_back((t * 5) % V);
      for (int b = 0; b < (big.len + kP - 1) / kP; ++b) big.blocks.push_back(page++);
      if (page > kPages) throw EngineError(ENG_INTERNAL, "test needs more pages");
      StepBatch b = batch_of({step_seq(big, big.prompt.data(), big.len, 0)});
      int32_t out = 0;
      be.step(b, &out, nullptr);
      decode(n, &g1, &s1, 0.0f);
      decode(n, &g2, &s2, 0.0f);
      const DecodeGraphStats& st = be.decode_graph_stats();
      rep.check(st.drops - before.drops == 1 && st.captures - before.captures == 1 &&
                    st.replays - before.replays == 2,
                "after the scratch moved: drops " + std::to_string(st.drops - before.drops) + ", captures " +
                    std::to_string(st.captures - before.captures) + ", replays " +
                    std::to_string(st.replays - before.replays) + " (want 1, 1, 2)");
      be.set_decode_graphs(false);
      decode(n, &eager, &s_eager, 0.0f);
      compare(n, "after re-capture");
    }
    std::printf("graph counters: captures %lld, replays %lld, warm-ups %lld, drops %lld, failures %lld\n",
                (long long)be.decode_graph_stats().captures, (long long)be.decode_graph_stats().replays,
                (long long)be.decode_graph_stats().warmups, (long long)be.decode_graph_stats().drops,
                (long long)be.decode_graph_stats().failures);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return rep.finish();
}
