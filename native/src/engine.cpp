// engine.cpp: the C entry points of engine.h.
//
// Every entry point validates its arguments completely before any backend
// work (so a rejected call changes nothing), runs inside a try/catch (no
// exception crosses the C ABI) and records the message of a failure: on the
// handle for calls that have one, in a thread-local string otherwise.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backend.h"
#include "engine_internal.h"
#include "checkpoint.h"
#include "cp_group.h"
#include "engine.h"
#include "page_slab.h"
#include "presets.h"
#include "sampling.h"
#include "status.h"
#include "stream.h"
#include "weights.h"

using lockstep::EngineError;
using lockstep::invalid_argument;
using namespace lockstep::engine_internal;

namespace lockstep::engine_internal {

thread_local std::string g_last_error;

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

bool check_handle(eng_engine_t eng) {
  if (eng != nullptr) return true;
  g_last_error = "engine handle is NULL";
  return false;
}

}  // namespace lockstep::engine_internal


namespace {

// Host memory the CPU backend may use for weights and pages. Shapes beyond it
// (llama-8b, llama-70b) are for validate_only or the CUDA backend.
constexpr double kCpuMemoryLimitBytes = 8.0 * 1024 * 1024 * 1024;
// The most threads a CPU engine may run a step on (eng_engine_config.num_threads).
constexpr int32_t kMaxThreads = 1024;

// Resolves the shape of cfg (preset or explicit) and validates it.
eng_model_shape resolve_shape(const eng_engine_config& cfg, std::string* label) {
  eng_model_shape shape = cfg.shape;
  if (cfg.preset != nullptr && cfg.preset[0] != '\0') {
    if (!lockstep::find_preset(cfg.preset, &shape))
      invalid_argument(fmt("unknown model preset \"%.100s\" (allowed: %s)", cfg.preset,
                           lockstep::preset_names().c_str()));
    *label = std::string("preset ") + cfg.preset;
  } else {
    *label = "custom shape";
  }
  lockstep::validate_shape(shape);
  return shape;
}

// Greedy sampling parameters (a NULL desc.sampling).
constexpr eng_sampling kGreedy{0.0f, 0, 1.0f, 0, 0.0f, 0.0f, 0.0f, 0.0f, 0, nullptr, nullptr, 0, nullptr, 0, nullptr, 0, 0};

bool backend_built(eng_backend b) { return (eng_supported_backends() >> b) & 1u; }

// Builds eng->batch from desc, validating every field; throws EngineError
// (ENG_INVALID_ARGUMENT) naming the field and the sequence on bad input.
// res may be NULL for a submit (the result arrives at eng_engine_wait).
void build_batch(eng_engine* eng, const eng_step_desc* d, const eng_step_result* res, bool need_res = true) {
  if (d == nullptr) invalid_argument("desc is NULL");
  if (need_res && res == nullptr) invalid_argument("res is NULL");
  const int32_t n = d->num_seqs;
  if (n < 0) invalid_argument(fmt("desc.num_seqs must be >= 0, got %d", n));
  lockstep::StepBatch& b = eng->batch;
  b.seqs.clear();
  b.num_rows = 0;
  b.num_sampled = 0;
  b.num_stochastic = 0;
  b.num_logprobs = 0;
  b.num_scored = 0;
  b.score = lockstep::ScoreOut{};
  b.cp = eng->cp.get();
  b.ep = eng->ep.get();
  if (n == 0) return;

  const char* null_field = d->num_tokens == nullptr  ? "desc.num_tokens"
                           : d->start_pos == nullptr ? "desc.start_pos"
                           : d->num_blocks == nullptr ? "desc.num_blocks"
                           : d->sample == nullptr     ? "desc.sample"
                           : need_res && res->sampled == nullptr ? "res.sampled"
                                                      : nullptr;
  if (null_field != nullptr) invalid_argument(fmt("%s is NULL (num_seqs = %d)", null_field, n));

  // Under Helix a block-table entry is a ledger block of P * cp global tokens.
  const int32_t P = eng->params.tokens_per_page;
  const int64_t ledger = int64_t{P} * eng->cp_size;
  const int32_t V = eng->params.shape.vocab_size;
  const int32_t num_pages = eng->params.num_pages;
  int64_t total_tokens = 0, total_blocks = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t nt = d->num_tokens[i], sp = d->start_pos[i], nb = d->num_blocks[i];
    if (nt < 1) invalid_argument(fmt("num_tokens[%d] must be >= 1, got %d", i, nt));
    if (sp < 0) invalid_argument(fmt("start_pos[%d] must be >= 0, got %d", i, sp));
    if (nb < 0) invalid_argument(fmt("num_blocks[%d] must be >= 0, got %d", i, nb));
    const int64_t end = int64_t{sp} + nt;
    if (end > INT32_MAX)
      invalid_argument(fmt("start_pos[%d] + num_tokens[%d] = %" PRId64 " exceeds the int32 position range",
                           i, i, end));
    const int64_t need = (end + ledger - 1) / ledger;
    if (nb < need)
      invalid_argument(fmt("num_blocks[%d] = %d is too short: sequence %d covers positions [0, %" PRId64
                           ") which need %" PRId64 " pages of %" PRId64 " tokens",
                           i, nb, i, end, need, ledger));
    total_tokens += nt;
    total_blocks += nb;
  }
  if (d->tokens == nullptr) invalid_argument(fmt("desc.tokens is NULL (%" PRId64 " tokens)", total_tokens));
  if (d->block_table == nullptr && total_blocks > 0)
    invalid_argument(fmt("desc.block_table is NULL (%" PRId64 " blocks)", total_blocks));

  // Token ids and page indices, with the sequence they belong to.
  int64_t tok = 0, blk = 0;
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t t = 0; t < d->num_tokens[i]; ++t, ++tok) {
      const int32_t id = d->tokens[tok];
      if (id < 0 || id >= V)
        invalid_argument(fmt("tokens[%" PRId64 "] (sequence %d, token %d) = %d is out of range [0, %d)",
                             tok, i, t, id, V));
    }
    for (int32_t k = 0; k < d->num_blocks[i]; ++k, ++blk) {
      const int32_t page = d->block_table[blk];
      if (page < 0 || page >= num_pages)
        invalid_argument(fmt("block_table[%" PRId64 "] (sequence %d, block %d) = %d is out of range [0, %d)",
                             blk, i, k, page, num_pages));
    }
  }

  // Write conflicts: a page written by two sequences of one step would make
  // their results depend on each other (and on the order of the writes).
  // Sequences may share pages they only read (a common prefix).
  std::vector<int32_t>& writer = eng->page_writer;
  std::vector<int32_t>& touched = eng->touched_pages;
  if (writer.size() != static_cast<size_t>(num_pages)) writer.assign(num_pages, -1);
  touched.clear();
  std::string conflict;
  blk = 0;
  for (int32_t i = 0; i < n && conflict.empty(); ++i) {
    const int32_t sp = d->start_pos[i];
    const int32_t first = sp / P, last = static_cast<int32_t>((int64_t{sp} + d->num_tokens[i] - 1) / P);
    for (int32_t g = first; g <= last; ++g) {
      // Global page g; under Helix only the member owning it writes it.
      if (eng->cp && g % eng->cp_size != eng->cp->rank()) continue;
      const int32_t k = g / eng->cp_size;
      const int32_t page = d->block_table[blk + k];
      if (writer[page] == -1) {
        writer[page] = i;
        touched.push_back(page);
      } else if (writer[page] != i) {
        conflict = fmt("block_table[%" PRId64 "] (sequence %d, block %d) = page %d is also written by sequence %d in this step; "
                       "sequences of one step may share pages only for reading",
                       blk + k, i, k, page, writer[page]);
        break;
      }
    }
    blk += d->num_blocks[i];
  }
  for (int32_t page : touched) writer[page] = -1;
  if (!conflict.empty()) invalid_argument(conflict);

  // Sampling parameters (optional array): every field of every sequence.
  if (d->sampling != nullptr) {
    for (int32_t i = 0; i < n; ++i) {
      const std::string msg = lockstep::sampling_invalid(d->sampling[i], V, fmt("sampling[%d]", i));
      if (!msg.empty()) invalid_argument(msg + fmt(" (sequence %d)", i));
    }
  }

  // Prompt scoring (optional arrays): targets in the vocabulary or -1, top
  // counts in [0, ENG_MAX_LOGPROBS].
  if (d->score_top != nullptr)
    for (int32_t i = 0; i < n; ++i)
      if (d->score_top[i] < 0 || d->score_top[i] > ENG_MAX_LOGPROBS)
        invalid_argument(fmt("score_top[%d] = %d is out of range [0, %d] (sequence %d)", i, d->score_top[i],
                             ENG_MAX_LOGPROBS, i));
  std::vector<uint8_t>& scored = eng->seq_scored;
  scored.assign(static_cast<size_t>(n), 0);
  if (d->score_targets != nullptr) {
    tok = 0;
    for (int32_t i = 0; i < n; ++i)
      for (int32_t t = 0; t < d->num_tokens[i]; ++t, ++tok) {
        const int32_t id = d->score_targets[tok];
        if (id < -1 || id >= V)
          invalid_argument(fmt("score_targets[%" PRId64 "] (sequence %d, token %d) = %d is out of range [0, %d) "
                               "(-1 = not scored)", tok, i, t, id, V));
        if (id >= 0) {
          scored[static_cast<size_t>(i)] = 1;
          ++b.num_scored;
        }
      }
  }
  if (b.num_scored > 0 && !eng->validate_only && !eng->backend->can_score())
    throw EngineError(ENG_UNSUPPORTED, fmt("the %s backend does not score prompts (desc.score_targets sets %" PRId64
                                           " rows); send NULL score_targets", eng->backend->name(), b.num_scored));

  b.seqs.reserve(static_cast<size_t>(n));
  tok = 0;
  blk = 0;
  for (int32_t i = 0; i < n; ++i) {
    const bool sample = d->sample[i] != 0;
    const eng_sampling sp = d->sampling != nullptr ? d->sampling[i] : kGreedy;
    b.seqs.push_back({d->tokens + tok, d->num_tokens[i], d->start_pos[i], d->block_table + blk,
                      d->num_blocks[i], sample, sp});
    if (sample && lockstep::sampling_on_host(sp)) ++b.num_stochastic;
    if (sample && sp.logprobs != 0) ++b.num_logprobs;
    if (scored[static_cast<size_t>(i)]) {
      b.seqs.back().score_targets = d->score_targets + tok;
      b.seqs.back().score_top = d->score_top != nullptr ? d->score_top[i] : 0;
    }
    tok += d->num_tokens[i];
    blk += d->num_blocks[i];
    if (sample) ++b.num_sampled;
  }
  b.num_rows = total_tokens;
  b.cp = eng->cp.get();
}

// Writes the log-probabilities of every sequence of b (eng_sampling.logprobs)
// from the sampled rows' logits [num_sampled * V] in batch order.
void fill_logprobs(const lockstep::StepBatch& b, int32_t V, const int32_t* sampled, const float* logits,
                   float* lp, int32_t* ids, float* tlp) {
  int64_t row = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const lockstep::StepSeq& q = b.seqs[i];
    lp[i] = 0.0f;
    int32_t* id = ids + i * ENG_MAX_LOGPROBS;
    float* t = tlp + i * ENG_MAX_LOGPROBS;
    for (int j = 0; j < ENG_MAX_LOGPROBS; ++j) {
      id[j] = -1;
      t[j] = 0.0f;
    }
    if (!q.sample) continue;
    if (q.sampling.logprobs != 0)
      lockstep::row_logprobs(logits + row * V, V, sampled[i], q.sampling.top_logprobs, &lp[i], id, t);
    ++row;
  }
}

// Points b's scoring output at out and resets every row of it (0, -1, 0):
// the backend writes the scored rows.
void reset_scores(lockstep::StepBatch* b, const lockstep::ScoreOut& out) {
  b->score = out;
  if (b->num_scored == 0) return;
  std::fill(out.logprobs, out.logprobs + b->num_rows, 0.0f);
  std::fill(out.top_ids, out.top_ids + b->num_rows * ENG_MAX_LOGPROBS, -1);
  std::fill(out.top_logprobs, out.top_logprobs + b->num_rows * ENG_MAX_LOGPROBS, 0.0f);
  std::fill(out.ranks, out.ranks + b->num_rows, 0);
}

// Runs b on the backend; when some sequence asks for log-probabilities,
// the sampled rows' logits go to `logits` (or to scratch when the caller
// wants none) and the log-probabilities to lp/ids/tlp. Scored rows go to
// b.score (reset_scores).
double run_step(lockstep::Backend* backend, const lockstep::StepBatch& b, int32_t V, int32_t* sampled,
                float* logits, float* lp, int32_t* ids, float* tlp, std::vector<float>* scratch) {
  float* lg = logits;
  if (b.num_logprobs > 0 && lg == nullptr) {
    scratch->resize(static_cast<size_t>(b.num_sampled) * static_cast<size_t>(V));
    lg = scratch->data();
  }
  const double ms = backend->step(b, sampled, lg);
  if (b.num_logprobs > 0) fill_logprobs(b, V, sampled, lg, lp, ids, tlp);
  return ms;
}

// A step whose sequences ask for log-probabilities needs the result arrays.
void check_logprob_results(const lockstep::StepBatch& b, const eng_step_result* res) {
  if (b.num_logprobs == 0) return;
  const char* null_field = res->logprobs == nullptr          ? "res.logprobs"
                           : res->top_logprob_ids == nullptr ? "res.top_logprob_ids"
                           : res->top_logprobs == nullptr    ? "res.top_logprobs"
                                                             : nullptr;
  if (null_field != nullptr)
    invalid_argument(fmt("%s is NULL but %d sampled sequences set sampling.logprobs", null_field, b.num_logprobs));
}

// A step with scored rows needs the scoring result arrays.
void check_score_results(const lockstep::StepBatch& b, const eng_step_result* res) {
  if (b.num_scored == 0) return;
  const char* null_field = res->score_logprobs == nullptr      ? "res.score_logprobs"
                           : res->score_top_ids == nullptr      ? "res.score_top_ids"
                           : res->score_top_logprobs == nullptr ? "res.score_top_logprobs"
                           : res->score_ranks == nullptr        ? "res.score_ranks"
                                                                : nullptr;
  if (null_field != nullptr)
    invalid_argument(fmt("%s is NULL but desc.score_targets scores %" PRId64 " rows", null_field, b.num_scored));
}

// Validates the indices of a page copy; throws before anything is copied.
void validate_copy(const eng_engine* eng, eng_tier src_tier, const int32_t* src, eng_tier dst_tier,
                   const int32_t* dst, int32_t n) {
  if (n < 0) invalid_argument(fmt("n must be >= 0, got %d", n));
  auto tier_pages = [&](eng_tier t, const char* field) -> int32_t {
    if (t == ENG_TIER_DEVICE) return eng->params.num_pages;
    if (t == ENG_TIER_HOST) return eng->params.num_host_pages;
    invalid_argument(fmt("%s = %d is not a tier (0 = device, 1 = host)", field, static_cast<int>(t)));
  };
  const int32_t src_pages = tier_pages(src_tier, "src_tier");
  const int32_t dst_pages = tier_pages(dst_tier, "dst_tier");
  if (n == 0) return;
  if (src == nullptr) invalid_argument(fmt("src is NULL (n = %d)", n));
  if (dst == nullptr) invalid_argument(fmt("dst is NULL (n = %d)", n));
  const char* tier_name[] = {"device", "host"};
  for (int32_t k = 0; k < n; ++k) {
    if (src[k] < 0 || src[k] >= src_pages)
      invalid_argument(fmt("src[%d] = %d is out of range [0, %d) of the %s tier", k, src[k], src_pages,
                           tier_name[src_tier]));
    if (dst[k] < 0 || dst[k] >= dst_pages)
      invalid_argument(fmt("dst[%d] = %d is out of range [0, %d) of the %s tier", k, dst[k], dst_pages,
                           tier_name[dst_tier]));
  }
}

}  // namespace

extern "C" {

const char* eng_last_error(void) { return g_last_error.c_str(); }

uint32_t eng_supported_backends(void) {
  uint32_t bits = 1u << ENG_BACKEND_CPU;
#ifdef ENGINE_HAVE_CUDA
  bits |= 1u << ENG_BACKEND_CUDA;
#endif
  return bits;
}

eng_status eng_dequantize_row(int32_t dtype, const void* src, int64_t nbytes, int64_t cols, float* out) {
  return guarded(&g_last_error, [&] {
    if (src == nullptr || out == nullptr) invalid_argument("src or out is NULL");
    if (cols <= 0) invalid_argument(fmt("cols must be positive, got %lld", static_cast<long long>(cols)));
    const int64_t rb = lockstep::dtype_row_bytes(dtype, cols);
    if (rb == -2) invalid_argument(fmt("dtype %d is not an eng_dtype", dtype));
    if (rb == -1) invalid_argument(fmt("cols %lld is not a multiple of the dtype's block", static_cast<long long>(cols)));
    if (rb != nbytes)
      invalid_argument(fmt("nbytes %lld, but a row of %lld elements is %lld bytes", static_cast<long long>(nbytes),
                           static_cast<long long>(cols), static_cast<long long>(rb)));
    lockstep::dequantize_row(dtype, src, cols, out);
  });
}

eng_status eng_preset_shape(const char* name, eng_model_shape* out) {
  return guarded(&g_last_error, [&] {
    if (name == nullptr) invalid_argument("preset name is NULL");
    if (out == nullptr) invalid_argument("out is NULL");
    if (!lockstep::find_preset(name, out))
      invalid_argument(fmt("unknown model preset \"%.100s\" (allowed: %s)", name,
                           lockstep::preset_names().c_str()));
  });
}

eng_status eng_engine_init(const eng_engine_config* cfg, eng_engine_t* out) {
  return guarded(&g_last_error, [&] {
    if (out == nullptr) invalid_argument("out is NULL");
    *out = nullptr;
    if (cfg == nullptr) invalid_argument("cfg is NULL");
    if (cfg->abi_version != ENG_ABI_VERSION)
      invalid_argument(fmt("abi_version %u does not match this library's ENG_ABI_VERSION %d; "
                           "rebuild the caller against native/include/engine.h and the library together",
                           cfg->abi_version, ENG_ABI_VERSION));
    if (cfg->backend != ENG_BACKEND_CPU && cfg->backend != ENG_BACKEND_CUDA)
      invalid_argument(fmt("backend = %d is not an eng_backend (0 = cpu, 1 = cuda)", static_cast<int>(cfg->backend)));
    std::string label;
    const eng_model_shape shape = resolve_shape(*cfg, &label);
    if (cfg->num_pages <= 0) invalid_argument(fmt("num_pages must be positive, got %d", cfg->num_pages));
    if (cfg->tokens_per_page <= 0)
      invalid_argument(fmt("tokens_per_page must be positive, got %d", cfg->tokens_per_page));
    if (cfg->num_host_pages < 0)
      invalid_argument(fmt("num_host_pages must be >= 0, got %d", cfg->num_host_pages));
    if (cfg->num_threads < 0 || cfg->num_threads > kMaxThreads)
      invalid_argument(fmt("num_threads must be in 0 .. %d (0 = 1), got %d", kMaxThreads, cfg->num_threads));
    if (cfg->cpu_kernels != ENG_CPU_KERNELS_EXACT && cfg->cpu_kernels != ENG_CPU_KERNELS_QUANT)
      invalid_argument(fmt("cpu_kernels = %d is not an eng_cpu_kernels (0 = exact, 1 = quant)", cfg->cpu_kernels));
    if (cfg->backend == ENG_BACKEND_CUDA && cfg->device_id < 0)
      invalid_argument(fmt("device_id must be >= 0, got %d", cfg->device_id));
    if (cfg->num_tensors != 0 || cfg->tensors != nullptr) {
      if (cfg->num_tensors <= 0)
        invalid_argument(fmt("num_tensors must be positive when tensors is set, got %d", cfg->num_tensors));
      lockstep::validate_tensors(shape, cfg->tensors, cfg->num_tensors);
    }
    if (!backend_built(cfg->backend))
      throw EngineError(ENG_UNSUPPORTED,
                        "the CUDA backend is not available: this engine library was built without CUDA "
                        "(configure CMake with -DENGINE_CUDA=ON); supported backends: cpu");

    const double bytes =
        4.0 * (lockstep::weight_elements(shape) +
               (double(cfg->num_pages) + cfg->num_host_pages) *
                   lockstep::page_elements(cfg->tokens_per_page, shape.num_layers, lockstep::kv_width(shape),
                                           lockstep::kv_planes(shape)));
    if (!cfg->validate_only && cfg->backend == ENG_BACKEND_CPU && bytes > kCpuMemoryLimitBytes)
      throw EngineError(ENG_OUT_OF_MEMORY,
                        fmt("%s with %d device + %d host pages of %d tokens needs %.1f GiB of host memory for "
                            "float32 weights and KV pages, over the CPU backend's %.0f GiB limit; use validate_only "
                            "to check the configuration, or the CUDA backend to run it",
                            label.c_str(), cfg->num_pages, cfg->num_host_pages, cfg->tokens_per_page,
                            bytes / (1u << 30), kCpuMemoryLimitBytes / (1u << 30)));

    auto eng = std::make_unique<eng_engine>();
    eng->params.shape = shape;
    eng->params.seed = cfg->seed;
    eng->params.num_pages = cfg->num_pages;
    eng->params.tokens_per_page = cfg->tokens_per_page;
    eng->params.num_host_pages = cfg->num_host_pages;
    eng->params.device_id = cfg->device_id;
    eng->params.tensors = cfg->tensors;
    eng->params.num_tensors = cfg->num_tensors;
    eng->params.num_threads = cfg->num_threads > 0 ? cfg->num_threads : 1;
    eng->params.cpu_kernels = cfg->cpu_kernels;
    eng->backend_kind = cfg->backend;
    eng->validate_only = cfg->validate_only != 0;
    if (!eng->validate_only) {
#ifdef ENGINE_HAVE_CUDA
      if (cfg->backend == ENG_BACKEND_CUDA) eng->backend = lockstep::make_cuda_backend(eng->params);
#endif
      if (cfg->backend == ENG_BACKEND_CPU) eng->backend = lockstep::make_cpu_backend(eng->params);
    }
    // The caller's tensors are read during init only.
    eng->params.tensors = nullptr;
    eng->params.num_tensors = 0;
    *out = eng.release();
  });
}

eng_status eng_engine_free(eng_engine_t eng) {
  // Freeing NULL is a no-op, as with free(3).
  std::string ignored;
  return guarded(&ignored, [&] { delete eng; });
}

const char* eng_engine_last_error(eng_engine_t eng) {
  if (eng == nullptr) return "engine handle is NULL";
  return eng->last_error.c_str();
}

eng_status eng_engine_shape(eng_engine_t eng, eng_model_shape* out) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (out == nullptr) invalid_argument("out is NULL");
    *out = eng->params.shape;
  });
}

eng_status eng_engine_step(eng_engine_t eng, const eng_step_desc* desc, eng_step_result* res) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (eng->validate_only)
      throw EngineError(ENG_UNSUPPORTED,
                        "this engine was created with validate_only: it holds no weights or pages and cannot step");
    if (!eng->inflight.empty())
      invalid_argument(fmt("%zu submitted steps have not been waited for; call eng_engine_wait first",
                           eng->inflight.size()));
    build_batch(eng, desc, res);
    check_logprob_results(eng->batch, res);
    check_score_results(eng->batch, res);
    reset_scores(&eng->batch, {res->score_logprobs, res->score_top_ids, res->score_top_logprobs, res->score_ranks});
    eng->stepped = true;
    res->moe_wait_ms = 0;
    // An EP member runs even an empty step: its peers need it in every
    // MoE exchange.
    if (eng->batch.seqs.empty() && !eng->ep) {
      res->device_ms = 0;
      return;
    }
    res->device_ms = run_step(eng->backend.get(), eng->batch, eng->params.shape.vocab_size, res->sampled,
                              res->logits, res->logprobs, res->top_logprob_ids, res->top_logprobs,
                              &eng->logprob_logits);
    res->moe_wait_ms = eng->backend->moe_stats().last_step_wait_ms;
  });
}

eng_status eng_sample_row(const float* logits, int32_t vocab, const eng_sampling* params, int64_t pos,
                          int32_t* out) {
  return guarded(&g_last_error, [&] {
    if (logits == nullptr) invalid_argument("logits is NULL");
    if (params == nullptr) invalid_argument("params is NULL");
    if (out == nullptr) invalid_argument("out is NULL");
    if (vocab < 1) invalid_argument(fmt("vocab must be >= 1, got %d", vocab));
    if (pos < 0) invalid_argument(fmt("pos must be >= 0, got %" PRId64, pos));
    const eng_sampling& s = *params;
    const std::string msg = lockstep::sampling_invalid(s, vocab, "params");
    if (!msg.empty()) invalid_argument(msg);
    lockstep::SamplingScratch scratch;
    *out = lockstep::sample_token(logits, vocab, s, pos, &scratch);
  });
}

eng_status eng_logprobs_row(const float* logits, int32_t vocab, int32_t token, int32_t k, float* token_logprob,
                            int32_t* ids, float* logprobs) {
  return guarded(&g_last_error, [&] {
    if (logits == nullptr) invalid_argument("logits is NULL");
    if (token_logprob == nullptr) invalid_argument("token_logprob is NULL");
    if (vocab < 1) invalid_argument(fmt("vocab must be >= 1, got %d", vocab));
    if (token < 0 || token >= vocab) invalid_argument(fmt("token %d is out of range [0, %d)", token, vocab));
    if (k < 0 || k > ENG_MAX_LOGPROBS) invalid_argument(fmt("k must be in [0, %d], got %d", ENG_MAX_LOGPROBS, k));
    if (k > 0 && (ids == nullptr || logprobs == nullptr)) invalid_argument(fmt("ids or logprobs is NULL (k = %d)", k));
    lockstep::row_logprobs(logits, vocab, token, k, token_logprob, ids, logprobs);
  });
}

eng_status eng_engine_copy_pages(eng_engine_t eng, eng_tier src_tier, const int32_t* src,
                                 eng_tier dst_tier, const int32_t* dst, int32_t n) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (eng->validate_only)
      throw EngineError(ENG_UNSUPPORTED,
                        "this engine was created with validate_only: it holds no pages to copy");
    validate_copy(eng, src_tier, src, dst_tier, dst, n);
    if (n == 0) return;
    // Stream order: the copy runs after every submitted step.
    if (eng->stream) eng->stream->drain();
    eng->backend->copy_pages(src_tier, src, dst_tier, dst, n);
  });
}

eng_status eng_engine_submit(eng_engine_t eng, const eng_step_desc* desc, int32_t want_logits) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (eng->validate_only)
      throw EngineError(ENG_UNSUPPORTED,
                        "this engine was created with validate_only: it holds no weights or pages and cannot step");
    if (eng->inflight.size() >= ENG_MAX_INFLIGHT)
      invalid_argument(fmt("%zu steps are already in flight (ENG_MAX_INFLIGHT = %d); call eng_engine_wait first",
                           eng->inflight.size(), ENG_MAX_INFLIGHT));
    build_batch(eng, desc, nullptr, /*need_res=*/false);
    eng->stepped = true;
    // Own a copy of the validated batch: the caller may reuse its arrays now.
    auto job = std::make_shared<AsyncStep>();
    int64_t nblocks = 0;
    for (const auto& q : eng->batch.seqs) nblocks += q.num_blocks;
    job->tokens.reserve(static_cast<size_t>(eng->batch.num_rows));
    job->blocks.reserve(static_cast<size_t>(nblocks));
    for (const auto& q : eng->batch.seqs) {
      job->tokens.insert(job->tokens.end(), q.tokens, q.tokens + q.num_tokens);
      job->blocks.insert(job->blocks.end(), q.blocks, q.blocks + q.num_blocks);
    }
    int64_t nids = 0, nbias = 0;
    for (const auto& q : eng->batch.seqs) {
      nids += int64_t{q.sampling.num_bias} + q.sampling.num_prompt + q.sampling.num_output;
      nbias += q.sampling.num_bias;
    }
    job->sampling_ids.reserve(static_cast<size_t>(nids));
    job->bias_values.reserve(static_cast<size_t>(nbias));
    for (const auto& q : eng->batch.seqs) {
      const eng_sampling& sp = q.sampling;
      job->sampling_ids.insert(job->sampling_ids.end(), sp.bias_ids, sp.bias_ids + sp.num_bias);
      job->sampling_ids.insert(job->sampling_ids.end(), sp.prompt_tokens, sp.prompt_tokens + sp.num_prompt);
      job->sampling_ids.insert(job->sampling_ids.end(), sp.output_tokens, sp.output_tokens + sp.num_output);
      job->bias_values.insert(job->bias_values.end(), sp.bias_values, sp.bias_values + sp.num_bias);
    }
    const size_t words = (static_cast<size_t>(eng->params.shape.vocab_size) + 31) / 32;
    size_t nmasks = 0;
    for (const auto& q : eng->batch.seqs) nmasks += q.sampling.allowed != nullptr;
    job->allowed.reserve(nmasks * words);
    for (const auto& q : eng->batch.seqs)
      if (q.sampling.allowed != nullptr)
        job->allowed.insert(job->allowed.end(), q.sampling.allowed, q.sampling.allowed + words);
    if (eng->batch.num_scored > 0) {
      job->score_targets.reserve(static_cast<size_t>(eng->batch.num_rows));
      for (const auto& q : eng->batch.seqs) {
        if (q.score_targets != nullptr)
          job->score_targets.insert(job->score_targets.end(), q.score_targets, q.score_targets + q.num_tokens);
        else
          job->score_targets.insert(job->score_targets.end(), static_cast<size_t>(q.num_tokens), -1);
      }
      const size_t rows = static_cast<size_t>(eng->batch.num_rows);
      job->score_logprobs.assign(rows, 0.0f);
      job->score_top_ids.assign(rows * ENG_MAX_LOGPROBS, -1);
      job->score_top_logprobs.assign(rows * ENG_MAX_LOGPROBS, 0.0f);
      job->score_ranks.assign(rows, 0);
    }
    job->batch = eng->batch;
    job->batch.score = lockstep::ScoreOut{};
    if (job->batch.num_scored > 0)
      job->batch.score = {job->score_logprobs.data(), job->score_top_ids.data(), job->score_top_logprobs.data(),
                          job->score_ranks.data()};
    int64_t tok = 0, blk = 0, ids = 0, bias = 0;
    size_t mask = 0;
    for (auto& q : job->batch.seqs) {
      if (q.score_targets != nullptr) q.score_targets = job->score_targets.data() + tok;
      q.tokens = job->tokens.data() + tok;
      q.blocks = job->blocks.data() + blk;
      tok += q.num_tokens;
      blk += q.num_blocks;
      eng_sampling& sp = q.sampling;
      const int32_t* base = job->sampling_ids.data() + ids;
      sp.bias_ids = base;
      sp.prompt_tokens = base + sp.num_bias;
      sp.output_tokens = base + sp.num_bias + sp.num_prompt;
      sp.bias_values = job->bias_values.data() + bias;
      ids += int64_t{sp.num_bias} + sp.num_prompt + sp.num_output;
      bias += sp.num_bias;
      if (sp.allowed != nullptr) {
        sp.allowed = job->allowed.data() + mask;
        mask += words;
      }
    }
    job->want_logits = want_logits != 0;
    job->sampled.assign(job->batch.seqs.size(), -1);
    if (job->want_logits || job->batch.num_logprobs > 0)
      job->logits.assign(static_cast<size_t>(job->batch.num_sampled) * eng->params.shape.vocab_size, 0.0f);
    if (job->batch.num_logprobs > 0) {
      const size_t ns = job->batch.seqs.size();
      job->logprobs.assign(ns, 0.0f);
      job->top_ids.assign(ns * ENG_MAX_LOGPROBS, -1);
      job->top_logprobs.assign(ns * ENG_MAX_LOGPROBS, 0.0f);
    }
    const int32_t vocab = eng->params.shape.vocab_size;
    if (!eng->stream) eng->stream = std::make_unique<lockstep::Stream>();
    lockstep::Backend* backend = eng->backend.get();
    eng->inflight.push_back(job);
    eng->stream->enqueue([job, backend, vocab] {
      std::string error;
      eng_status status = guarded(&error, [&] {
        if (job->batch.seqs.empty() && job->batch.ep == nullptr) return;
        job->device_ms = run_step(backend, job->batch, vocab, job->sampled.data(),
                                  job->logits.empty() ? nullptr : job->logits.data(), job->logprobs.data(),
                                  job->top_ids.data(), job->top_logprobs.data(), nullptr);
        job->moe_wait_ms = backend->moe_stats().last_step_wait_ms;
      });
      std::lock_guard<std::mutex> lk(job->mu);
      job->status = status;
      job->error = std::move(error);
      job->done = true;
      job->cv.notify_all();
    });
  });
}

eng_status eng_engine_wait(eng_engine_t eng, eng_step_result* res) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (res == nullptr) invalid_argument("res is NULL");
    if (eng->inflight.empty()) invalid_argument("no submitted step to wait for");
    std::shared_ptr<AsyncStep> job = eng->inflight.front();
    const size_t n = job->batch.seqs.size();
    if (n > 0 && res->sampled == nullptr) invalid_argument(fmt("res.sampled is NULL (num_seqs = %zu)", n));
    check_logprob_results(job->batch, res);
    check_score_results(job->batch, res);
    {
      std::unique_lock<std::mutex> lk(job->mu);
      job->cv.wait(lk, [&] { return job->done; });
    }
    eng->inflight.pop_front();
    if (job->status != ENG_OK) throw EngineError(job->status, "submitted step failed: " + job->error);
    std::copy(job->sampled.begin(), job->sampled.end(), res->sampled);
    if (res->logits != nullptr && job->want_logits)
      std::copy(job->logits.begin(), job->logits.end(), res->logits);
    if (job->batch.num_logprobs > 0) {
      std::copy(job->logprobs.begin(), job->logprobs.end(), res->logprobs);
      std::copy(job->top_ids.begin(), job->top_ids.end(), res->top_logprob_ids);
      std::copy(job->top_logprobs.begin(), job->top_logprobs.end(), res->top_logprobs);
    }
    if (job->batch.num_scored > 0) {
      std::copy(job->score_logprobs.begin(), job->score_logprobs.end(), res->score_logprobs);
      std::copy(job->score_top_ids.begin(), job->score_top_ids.end(), res->score_top_ids);
      std::copy(job->score_top_logprobs.begin(), job->score_top_logprobs.end(), res->score_top_logprobs);
      std::copy(job->score_ranks.begin(), job->score_ranks.end(), res->score_ranks);
    }
    res->device_ms = job->device_ms;
    res->moe_wait_ms = job->moe_wait_ms;
  });
}

int32_t eng_engine_inflight(eng_engine_t eng) {
  return eng == nullptr ? 0 : static_cast<int32_t>(eng->inflight.size());
}

}  // extern "C"
