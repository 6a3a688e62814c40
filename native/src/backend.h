// backend.h: the internal interface between the C entry points and a compute
// backend (CPU reference here; CUDA in cuda/).
//
// engine.cpp validates every argument before calling a backend, so backends
// see only well-formed batches and in-range indices, and they report failures
// by throwing EngineError (status.h); std::bad_alloc becomes
// ENG_OUT_OF_MEMORY at the entry point. A backend is driven by one thread at a
// time (the pinned Go engine goroutine); a CUDA backend sets its device at the
// start of each call.
#ifndef LOCKSTEP_NATIVE_BACKEND_H
#define LOCKSTEP_NATIVE_BACKEND_H

#include <cstdint>
#include <memory>
#include <vector>

#include "engine.h"

namespace lockstep {

// What a backend is built from: the resolved, validated shape and sizes.
struct EngineParams {
  eng_model_shape shape{};
  uint64_t seed = 0;
  int32_t num_pages = 0;
  int32_t tokens_per_page = 0;
  int32_t num_host_pages = 0;
  int32_t device_id = 0;
  // Checkpoint weights (validated), valid during backend construction only;
  // none = synthetic weights from seed.
  const eng_tensor* tensors = nullptr;
  int32_t num_tensors = 0;
  // CPU backend: threads of a step (>= 1); the CUDA backend ignores it.
  int32_t num_threads = 1;
  // CPU backend: ENG_CPU_KERNELS_EXACT or _QUANT.
  int32_t cpu_kernels = 0;
};

// One sequence of a validated step. Pointers alias the caller's descriptor and
// are valid during the step call only.
struct StepSeq {
  const int32_t* tokens;  // [num_tokens], each in [0, vocab)
  int32_t num_tokens;     // >= 1
  int32_t start_pos;      // >= 0; start_pos + num_tokens fits in int32
  const int32_t* blocks;  // [num_blocks], each in [0, num_pages)
  int32_t num_blocks;     // >= ceil((start_pos + num_tokens) / tokens_per_page)
  bool sample;            // sample the last new token
  // How to sample it (temperature 0 = greedy). The scalars are owned by
  // value; its token arrays alias the caller's like tokens (a submitted
  // step points them into its own copy).
  eng_sampling sampling;
  // Absolute position of the sampled token: start_pos + num_tokens.
  int64_t sample_pos() const { return int64_t{start_pos} + num_tokens; }
  // Prompt scoring (eng_step_desc.score_targets): [num_tokens] targets
  // aliasing the caller's (-1 = row not scored), or null when no row of
  // the sequence is scored; score_top top entries per scored row.
  const int32_t* score_targets = nullptr;
  int32_t score_top = 0;
};

// Where a step writes its scored rows' log-probabilities (eng_step_result's
// score_* arrays, indexed by batch row); every row was reset by the entry
// point, so a backend writes the scored rows only.
struct ScoreOut {
  float* logprobs = nullptr;     // [num_rows]
  int32_t* top_ids = nullptr;    // [num_rows * ENG_MAX_LOGPROBS]
  float* top_logprobs = nullptr; // [num_rows * ENG_MAX_LOGPROBS]
  int32_t* ranks = nullptr;      // [num_rows]
};

// A validated step: sequences in batch order. No two sequences write the same
// page (their write regions are disjoint), so the K/V writes of the batch do
// not interfere.
//
// Helix (cp != nullptr): positions are global; global position p lives on CP
// rank (p / P) % cp_size, in local page blocks[p / (P * cp_size)] at slot
// p % P. The step writes only the positions this rank owns and exchanges
// attention partials with the other members every layer (cp_group.h).
class Exchange;
using CpExchange = Exchange;
struct StepBatch {
  std::vector<StepSeq> seqs;
  int64_t num_rows = 0;     // Σ num_tokens
  int32_t num_sampled = 0;  // sequences with sample set
  int32_t num_stochastic = 0;  // sampled sequences sampled on the host (sampling_on_host)
  int32_t num_logprobs = 0;    // sampled sequences that ask for log-probabilities
  int64_t num_scored = 0;      // rows with a score target (ScoreOut)
  ScoreOut score;              // set by the entry point when num_scored > 0
  CpExchange* cp = nullptr; // Helix CP group member, or null
  // Expert-parallel group member (MoE), or null: every MoE layer dispatches
  // tokens to their experts' members and combines the outputs (docs/moe.md).
  // A member runs every step, an empty one included.
  Exchange* ep = nullptr;
};

// Counters of a backend's MoE exchanges (eng_moe_stats), and per MoE layer.
struct MoeLayerStats {
  uint64_t dispatch_bytes = 0, combine_bytes = 0;  // sent to other members
  double dispatch_ms = 0, combine_ms = 0;          // inside the exchanges
  uint64_t calls = 0;                              // steps that ran the layer
};
struct MoeStats {
  uint64_t exchanges = 0, bytes_sent = 0, bytes_received = 0, tokens_routed = 0;
  double wait_ms = 0;
  double last_step_wait_ms = 0;  // of the most recent step
  std::vector<MoeLayerStats> layers;
};

// A compute backend: owns weights, the device page slab and the host tier.
class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual const char* name() const = 0;
  // Runs the forward step (contract of eng_engine_step in engine.h). Writes
  // sampled[num_seqs] (-1 where not sampled) and, if logits is not NULL,
  // logits[num_sampled * vocab] in batch order. Returns the compute time in
  // milliseconds (device time on a GPU).
  virtual double step(const StepBatch& batch, int32_t* sampled, float* logits) = 0;
  // Whether step scores rows (StepBatch::num_scored > 0, results in
  // StepBatch::score); the entry point refuses a scoring step otherwise.
  virtual bool can_score() const { return false; }
  // Copies page src[k] of src_tier to page dst[k] of dst_tier for k in
  // [0, n), in order. Every index has been validated.
  virtual void copy_pages(eng_tier src_tier, const int32_t* src, eng_tier dst_tier,
                          const int32_t* dst, int32_t n) = 0;
  // Expert parallelism: keep only the routed experts member `rank` of
  // `size` owns (expert e on member e % size). Before the first step.
  virtual void join_ep(int32_t size, int32_t rank) {
    (void)size;
    (void)rank;
  }
  // Helix context parallelism: this engine is member `rank` of a CP group of
  // `size` (size > 1), before the first step. The CPU backend needs nothing
  // (its exchange is the step's CpExchange); the CUDA backend exchanges the
  // partials over NCCL and refuses it in a build without NCCL.
  virtual void join_cp(int32_t size, int32_t rank) {
    (void)size;
    (void)rank;
  }
  // MoE exchange counters (zero without EP).
  virtual const MoeStats& moe_stats() const {
    static const MoeStats none;
    return none;
  }
};

// The member that owns routed expert e in an EP group of `size` members.
inline int32_t expert_owner(int32_t expert, int32_t size) { return expert % size; }

// The float32 CPU reference backend (model_cpu.cpp).
std::unique_ptr<Backend> make_cpu_backend(const EngineParams& params);

#ifdef ENGINE_HAVE_CUDA
// The CUDA backend, defined in cuda/ when the library is built with ENGINE_CUDA.
std::unique_ptr<Backend> make_cuda_backend(const EngineParams& params);
#endif

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_BACKEND_H
