// decode_graph.cu: CUDA graphs for decode-only steps (see model_cuda.h).
//
// A graph step, per call:
//   1. the padded descriptors of bucket B (fixed layout) in pinned memory,
//      one host-to-device copy, and FlashInfer's graph-safe decode plan of
//      the B sequences (padding included), queued before the graph;
//   2. if a captured address moved since the graphs were made, drop them all;
//   3. the bucket's graph: replay it; or, the first time the bucket is seen,
//      run it eagerly (warm-up); or, the second time, capture and replay it;
//   4. sampled ids (and, where asked or needed, logits) back, then the map
//      from bucket rows to the batch's sequences (row i is sequence i).
// Everything queued around the graph (copies, plan, events) stays outside
// the capture, so a replay reads the step's fresh descriptors and plan.
#include "model_cuda.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sampling.h"

namespace lockstep {
namespace {

size_t bucket_index(int32_t n) {
  const auto& b = CudaBackend::kGraphBuckets;
  return size_t(std::lower_bound(b.begin(), b.end(), n) - b.begin());
}

}  // namespace

// Reads LOCKSTEP_CUDA_GRAPHS (0 = off) and says once, on stderr, whether the
// decode graphs are on.
void CudaBackend::init_decode_graphs() {
  const char* env = std::getenv("LOCKSTEP_CUDA_GRAPHS");
  const bool wanted = env == nullptr || std::strcmp(env, "0") != 0;
  set_decode_graphs(wanted);
  if (!wanted) graphs_note_ = "off (LOCKSTEP_CUDA_GRAPHS=0)";
  std::fprintf(stderr, "lockstep cuda: decode graphs %s\n", graphs_note_.c_str());
}

void CudaBackend::set_decode_graphs(bool on) {
  drop_decode_graphs();
  graph_slots_.clear();
  graphs_on_ = false;
  if (!on) {
    graphs_note_ = "off (turned off)";
    return;
  }
#ifdef LOCKSTEP_CUDA_SYNC_CHECK
  graphs_note_ = "off (LOCKSTEP_CUDA_SYNC_CHECK build: a synchronise after each launch cannot be captured)";
  return;
#endif
  if (mla_) {
    graphs_note_ = "off (MLA steps run eagerly)";
    return;
  }
  if (!fi_) {
    graphs_note_ = "off (head_dim " + std::to_string(shape_.head_dim) +
                   " runs the hand-written attention, whose split is chosen on the host per step)";
    return;
  }
  graph_slots_.resize(kGraphBuckets.size());
  graphs_on_ = true;
  graphs_note_ = "on (decode-only steps of 1.." + std::to_string(kMaxGraphBatch) + " sequences, " +
                 std::to_string(kGraphBuckets.size()) + " buckets; LOCKSTEP_CUDA_GRAPHS=0 turns them off)";
}

bool CudaBackend::graph_eligible(const StepBatch& b) const {
  // A MoE step routes on the host between its layers: no graph.
  if (!graphs_on_ || b.cp != nullptr || b.seqs.empty() || b.seqs.size() > size_t(kMaxGraphBatch) ||
      shape_.num_experts > 0)
    return false;
  for (const StepSeq& s : b.seqs)
    if (s.num_tokens != 1) return false;
  return true;
}

void CudaBackend::drop_decode_graphs() {
  bool had = false;
  for (GraphSlot& s : graph_slots_) {
    had = had || s.exec.get() != nullptr;
    s.exec.reset();
    s.failed = false;  // new addresses: try again (a warm-up, already done, is not repeated)
  }
  if (had) ++graph_stats_.drops;
}

CudaBackend::GraphKey CudaBackend::graph_key() const {
  return {dev_desc_.as<void>(), hidden_.as<void>(), xb_.as<void>(),     qkv_.as<void>(),
          attn_.as<void>(),     q_bf16_.as<void>(), gu_.as<void>(),     act_.as<void>(),
          logits_.as<void>(),   sampled_.as<void>(), pages_->device_page(0)};
}

// The fixed layout of bucket B and its padded rows (step_layout.h:
// size_graph_desc, fill_graph_desc), one copy, and FlashInfer's graph-safe
// plan of the B rows.
void CudaBackend::upload_graph_descriptors(const StepBatch& b, int32_t B) {
  size_graph_desc(B, &desc_);
  host_desc_.reserve(6 * size_t(kMaxGraphBatch) * sizeof(int32_t));  // (dev_desc_: by the caller)
  int32_t* h = host_desc_.as<int32_t>();
  fill_graph_desc(b, B, tokens_per_page_, &desc_, h);
  CUDA_CHECK(cudaMemcpyAsync(dev_desc_.as<void>(), h, desc_.total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  fi_->plan(desc_.fi_decode.data(), B, nullptr, 0, /*graph_safe=*/true);
}

// Captures forward() of the step set up by upload_graph_descriptors. Returns
// false with the reason in *why when anything in the capture failed; the
// stream is then out of capture mode and the (non-sticky) error cleared, so
// the caller can run the step eagerly.
bool CudaBackend::capture_decode_graph(GraphSlot& slot, const StepBatch& b, std::string* why) {
  why->clear();
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    forward(b, false);
  } catch (const std::exception& e) {
    *why = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (why->empty() && end != cudaSuccess)
    *why = std::string("cudaStreamEndCapture: ") + cudaGetErrorName(end) + " (" + cudaGetErrorString(end) + ")";
  cudaGraphExec_t exec = nullptr;
  if (why->empty()) {
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    if (inst != cudaSuccess) {
      exec = nullptr;
      *why = std::string("cudaGraphInstantiate: ") + cudaGetErrorName(inst) + " (" + cudaGetErrorString(inst) + ")";
    }
  }
  if (graph) {
    const cudaError_t d = cudaGraphDestroy(graph);
    if (d != cudaSuccess && why->empty())
      *why = std::string("cudaGraphDestroy: ") + cudaGetErrorName(d) + " (" + cudaGetErrorString(d) + ")";
  }
  if (!why->empty()) {
    if (exec) cudaGraphExecDestroy(exec);
    cudaGetLastError();  // capture errors are not sticky; a sticky one resurfaces in the eager run
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &st));
    if (st != cudaStreamCaptureStatusNone)
      throw EngineError(ENG_DEVICE_ERROR, "decode graph: the stream is still capturing after a failed capture (" +
                                              *why + ")");
    return false;
  }
  slot.exec.reset(exec);
  return true;
}

void CudaBackend::graph_step(const StepBatch& b, int32_t* sampled, float* logits, float* ms) {
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t n = int32_t(b.seqs.size());
  const size_t k = bucket_index(n);
  const int32_t B = kGraphBuckets[k];
  // Fixed sizes first (no-ops once done), then the key of what a graph holds.
  reserve_scratch(kMaxGraphBatch, kMaxGraphBatch);
  dev_desc_.reserve(6 * size_t(kMaxGraphBatch) * sizeof(int32_t));
  upload_graph_descriptors(b, B);  // may move FlashInfer's lists (generation)
  const GraphKey key = graph_key();
  if (key != graph_key_ || fi_->generation() != graph_fi_generation_) {
    drop_decode_graphs();
    graph_key_ = key;
    graph_fi_generation_ = fi_->generation();
  }
  GraphSlot& slot = graph_slots_[k];
  CUDA_CHECK(cudaEventRecord(ev_start_.get(), stream_));
  bool replay = slot.exec.get() != nullptr;
  if (!replay && slot.warmed && !slot.failed) {
    std::string why;
    if (capture_decode_graph(slot, b, &why)) {
      ++graph_stats_.captures;
      replay = true;
    } else {
      slot.failed = true;
      ++graph_stats_.failures;
      std::fprintf(stderr, "lockstep cuda: decode graph for batch %d not captured, running eagerly: %s\n", B,
                   why.c_str());
    }
  }
  if (replay) {
    CUDA_CHECK(cudaGraphLaunch(slot.exec.get(), stream_));
    ++graph_stats_.replays;
  } else {
    forward(b, false);
    if (!slot.failed) ++graph_stats_.warmups;
    slot.warmed = true;
  }
  CUDA_CHECK(cudaEventRecord(ev_stop_.get(), stream_));
  last_host_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  // Results: row i is sequence i. Greedy ids for all n rows in one copy; the
  // logits of every row when asked (one copy), else only of the rows
  // sampled on the host (temperature > 0 or logits processors: sampling_on_host).
  const size_t V = size_t(shape_.vocab_size);
  const bool host_rows = logits != nullptr || b.num_stochastic > 0;
  host_out_.reserve(size_t(n) * sizeof(int32_t) + (host_rows ? size_t(n) * V * sizeof(float) : 0) + 16);
  int32_t* h_sampled = host_out_.as<int32_t>();
  float* h_logits = reinterpret_cast<float*>(h_sampled + (size_t(n) + 3) / 4 * 4);
  CUDA_CHECK(cudaMemcpyAsync(h_sampled, sampled_.as<void>(), size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                             stream_));
  if (logits) {
    CUDA_CHECK(cudaMemcpyAsync(h_logits, logits_.as<void>(), size_t(n) * V * sizeof(float), cudaMemcpyDeviceToHost,
                               stream_));
  } else if (b.num_stochastic > 0) {
    for (int32_t i = 0; i < n; ++i)
      if (b.seqs[size_t(i)].sample && sampling_on_host(b.seqs[size_t(i)].sampling))
        CUDA_CHECK(cudaMemcpyAsync(h_logits + size_t(i) * V, logits_.as<float>() + size_t(i) * V, V * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  CUDA_CHECK(cudaEventElapsedTime(ms, ev_start_.get(), ev_stop_.get()));
  int32_t out_row = 0;
  for (int32_t i = 0; i < n; ++i) {
    const StepSeq& s = b.seqs[size_t(i)];
    sampled[i] = -1;
    if (!s.sample) continue;
    const float* row = h_logits + size_t(i) * V;
    sampled[i] = sampling_on_host(s.sampling)
                     ? sample_token(row, shape_.vocab_size, s.sampling, s.sample_pos(), &sampling_)
                     : h_sampled[i];
    if (logits) std::memcpy(logits + size_t(out_row) * V, row, V * sizeof(float));
    ++out_row;
  }
}

}  // namespace lockstep
