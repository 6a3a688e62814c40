// bench_graphs.cu: host time per decode iteration with and without CUDA
// graphs, llama-8b (32 layers: the launch count of a real model) on the CUDA
// backend (internal API, no cgo), decode-only steps at context 512.
//
// Per (batch, mode): the median over 15 steps (after warm-up; with graphs
// the warm-up includes the bucket's capture) of
//   host_us    the backend's host time from step entry until the last launch
//              (or the graph launch) is queued: descriptors, FlashInfer plan,
//              launches (CudaBackend::last_host_us)
//   wall_us    the whole step call, device time included
//   device_ms  the device time between the step's events
// Rows are appended to OUT.tsv as
//   hostgraph <batch> <graphs|eager> <host_us> <wall_us> <device_ms>
// Usage: cuda_graph_bench OUT.tsv
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "model_cuda.h"
#include "../tests/test_util.h"

using namespace lockstep;

namespace {

constexpr int kP = 32, kCtx = 512, kMaxBatch = 256;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  lockstep_test::skip_without_device("cuda_graph_bench");
  FILE* tsv = std::fopen(argc > 1 ? argv[1] : "bench.tsv", "a");
  if (!tsv) return 2;
  bool failed = false;
  try {
    EngineParams p;
    eng_preset_shape("llama-8b", &p.shape);
    p.seed = 1;
    p.tokens_per_page = kP;
    const int pages_per_seq = (kCtx + kP - 1) / kP;
    p.num_pages = kMaxBatch * pages_per_seq;  // 4 MiB pages: 16 GiB
    p.num_host_pages = 0;
    p.device_id = 0;
    CudaBackend be(p);
    std::printf("decode graphs: %s\n", be.decode_graphs_note().c_str());
    std::vector<std::vector<int32_t>> blocks(kMaxBatch);
    std::vector<int32_t> tokens(kMaxBatch);
    for (int i = 0; i < kMaxBatch; ++i) {
      for (int b = 0; b < pages_per_seq; ++b) blocks[size_t(i)].push_back(i * pages_per_seq + b);
      tokens[size_t(i)] = (i * 31 + 7) % p.shape.vocab_size;
    }
    std::printf("%6s %7s %10s %10s %10s\n", "batch", "mode", "host_us", "wall_us", "device_ms");
    for (int batch : {1, 8, 64, 100, 256}) {
      StepBatch b;
      for (int i = 0; i < batch; ++i) {
        StepSeq s{};
        s.tokens = &tokens[size_t(i)];
        s.num_tokens = 1;
        s.start_pos = kCtx - 1;
        s.blocks = blocks[size_t(i)].data();
        s.num_blocks = pages_per_seq;
        s.sample = true;
        b.seqs.push_back(s);
      }
      b.num_rows = batch;
      b.num_sampled = batch;
      std::vector<int32_t> sampled(static_cast<size_t>(batch));
      for (bool graphs : {false, true}) {
        be.set_decode_graphs(graphs);
        std::vector<double> host, wall, dev;
        for (int rep = 0; rep < 18; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          const double ms = be.step(b, sampled.data(), nullptr);
          const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
          if (rep < 3) continue;  // warm-up (and, with graphs, the capture)
          host.push_back(be.last_host_us());
          wall.push_back(us);
          dev.push_back(ms);
        }
        const char* mode = graphs ? "graphs" : "eager";
        if (graphs && be.decode_graph_stats().replays == 0) {
          failed = true;
          std::printf("FAIL: batch %d: graphs on but no step replayed a graph (%s)\n", batch,
                      be.decode_graphs_note().c_str());
        }
        std::printf("%6d %7s %10.1f %10.1f %10.3f\n", batch, mode, median(host), median(wall), median(dev));
        std::fprintf(tsv, "hostgraph\t%d\t%s\t%.1f\t%.1f\t%.4f\n", batch, mode, median(host), median(wall),
                     median(dev));
        std::fflush(tsv);
      }
    }
    const DecodeGraphStats& st = be.decode_graph_stats();
    std::printf("graph counters: captures %lld, replays %lld, failures %lld\n", (long long)st.captures,
                (long long)st.replays, (long long)st.failures);
    if (st.failures > 0) {
      failed = true;
      std::printf("FAIL: %lld graph captures failed (see stderr)\n", (long long)st.failures);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::fclose(tsv);
  return failed ? 1 : 0;
}
