// engine_internal.h: what the C entry points' units share (engine.cpp,
// engine_groups.cpp): the handles behind eng_engine_t and eng_cp_group_t,
// the asynchronous step, and the entry points' guard and messages. Not part
// of the C ABI.
#ifndef LOCKSTEP_NATIVE_ENGINE_INTERNAL_H
#define LOCKSTEP_NATIVE_ENGINE_INTERNAL_H

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backend.h"
#include "cp_group.h"
#include "engine.h"
#include "status.h"
#include "stream.h"

namespace lockstep::engine_internal {

// A submitted step: an owned copy of the validated descriptor, and its
// result once the stream ran it.
struct AsyncStep {
  std::vector<int32_t> tokens, blocks;
  // The sampling token arrays (bias ids, prompt and output tokens) and bias
  // values of every sequence, which the copied seqs point into.
  std::vector<int32_t> sampling_ids;
  std::vector<float> bias_values;
  std::vector<uint32_t> allowed;  // the sequences' allowed-token masks, back to back
  lockstep::StepBatch batch;  // seqs point into tokens and blocks
  bool want_logits = false;
  std::vector<int32_t> sampled;
  std::vector<float> logits;
  // Log-probabilities (batch.num_logprobs > 0): [num_seqs], and
  // [num_seqs * ENG_MAX_LOGPROBS] twice.
  std::vector<float> logprobs, top_logprobs;
  std::vector<int32_t> top_ids;
  // Prompt scoring (batch.num_scored > 0): every row's target (-1 = not
  // scored), which the copied seqs point into, and the results by row.
  std::vector<int32_t> score_targets, score_top_ids, score_ranks;
  std::vector<float> score_logprobs, score_top_logprobs;
  double device_ms = 0;
  double moe_wait_ms = 0;
  eng_status status = ENG_OK;
  std::string error;
  // Completion, signalled by the stream worker.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

}  // namespace lockstep::engine_internal

// The handle behind eng_cp_group_t: a reference to the shared group.
struct eng_cp_group {
  std::shared_ptr<lockstep::ExchangeGroup> group;
};

// The handle behind eng_engine_t.
struct eng_engine {
  lockstep::EngineParams params;
  eng_backend backend_kind = ENG_BACKEND_CPU;
  bool validate_only = false;
  std::unique_ptr<lockstep::Backend> backend;  // null when validate_only
  std::string last_error;
  // Reused per step: the validated batch and the page → writer map of the
  // write-conflict check ([num_pages], -1 = unwritten; reset after each check).
  lockstep::StepBatch batch;
  // The sampled rows' logits of a step that wants log-probabilities but
  // not the logits (reused).
  std::vector<float> logprob_logits;
  std::vector<int32_t> page_writer;
  std::vector<uint8_t> seq_scored;  // build_batch's scratch: sequences with a scored row
  std::vector<int32_t> touched_pages;
  // Helix membership (null without Helix); cp_size 1 without.
  std::unique_ptr<lockstep::CpExchange> cp;
  int32_t cp_size = 1;
  // Expert-parallel membership (MoE; null without EP).
  std::unique_ptr<lockstep::Exchange> ep;
  bool stepped = false;  // a step ran or was submitted (joins come before)
  // The overlap loop's asynchronous steps, oldest first, and the stream they
  // run on (created at the first submit). Declared last: destroyed first, so
  // the worker is joined before the backend goes away.
  std::deque<std::shared_ptr<lockstep::engine_internal::AsyncStep>> inflight;
  std::unique_ptr<lockstep::Stream> stream;
};


namespace lockstep::engine_internal {

// The message of the last failure of a call without a handle (this thread's).
extern thread_local std::string g_last_error;

// printf into a std::string.
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

// Runs body, converting any exception into a status and a message stored in
// *err. Storing the message cannot throw out of here.
template <class Body>
eng_status guarded(std::string* err, Body&& body) {
  eng_status status = ENG_INTERNAL;
  const char* msg = "internal error: unknown exception";
  std::string what;
  try {
    body();
    return ENG_OK;
  } catch (const EngineError& e) {
    status = e.status();
    msg = e.what();
    try { what = msg; } catch (...) {}
  } catch (const std::bad_alloc&) {
    status = ENG_OUT_OF_MEMORY;
    msg = "out of host memory";
  } catch (const std::exception& e) {
    status = ENG_INTERNAL;
    try { what = std::string("internal error: ") + e.what(); } catch (...) {}
  } catch (...) {
  }
  try {
    *err = what.empty() ? std::string(msg) : what;
  } catch (...) {
    err->clear();
  }
  return status;
}

// A handle is required; without one the message goes to eng_last_error().
bool check_handle(eng_engine_t eng);

}  // namespace lockstep::engine_internal

#endif  // LOCKSTEP_NATIVE_ENGINE_INTERNAL_H
