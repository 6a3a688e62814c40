// moe_cpu.cpp: the CPU backend's mixture-of-experts layers (see
// model_cpu.h): experts shared out over an expert-parallel group, the
// routed rows exchanged with its members, each expert a SwiGLU MLP.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "checkpoint.h"
#include "cp_group.h"
#include "gemm_cpu.h"
#include "model_cpu.h"
#include "presets.h"
#include "status.h"

namespace lockstep {

void CpuBackend::join_ep(int32_t size, int32_t rank) {
  ep_size_ = size;
  ep_rank_ = rank;
  // Other members' experts are never read again: free them (synthetic
  // weights; checkpoint weights are shared by the in-process engines built
  // from the same tensors, so every member keeps the whole set).
  if (own_weights_)
    for (LayerWeights& L : own_weights_->layers)
      for (size_t e = 0; e < L.experts.size(); ++e)
        if (expert_owner(static_cast<int32_t>(e), size) != rank) L.experts[e] = ExpertWeights{};
}

void CpuBackend::swiglu(const ExpertWeights& w, int64_t width, int64_t n, const float* x, float* y) {
  static const QuantMatrix kExact;  // experts never take the quantised kernels
  const int64_t H = shape_.hidden_size;
  for (int64_t r0 = 0; r0 < n; r0 += kRowChunk) {
    const int64_t m = n - r0 < kRowChunk ? n - r0 : kRowChunk;
    float* gate = grow(gate_, static_cast<size_t>(m * width));
    float* up = grow(up_, static_cast<size_t>(m * width));
    linear(x + r0 * H, m, H, w.gate, kExact, w.pgate, width, gate);
    linear(x + r0 * H, m, H, w.up, kExact, w.pup, width, up);
    act_mul(gate, up, m * width);
    linear(gate, m, width, w.down, kExact, w.pdown, H, y + r0 * H);
  }
}

void moe_route_row(const float* logits, int32_t E, int32_t K, int32_t norm, int32_t* experts, float* weights,
                   std::vector<char>& taken) {
  RouteParams p;
  p.E = E;
  p.K = K;
  p.norm = norm;
  moe_route_row(logits, p, experts, weights, taken);
}

void moe_route_row(const float* logits, const RouteParams& rp, int32_t* experts, float* weights,
                   std::vector<char>& taken) {
  const int32_t E = rp.E, K = rp.K;
  const bool sigmoid = rp.norm == ENG_ROUTER_SIGMOID_TOPK || rp.norm == ENG_ROUTER_SIGMOID_TOPK_RAW;
  thread_local std::vector<double> score, choice;  // per expert: weight score, choice score
  score.resize(static_cast<size_t>(E));
  choice.resize(static_cast<size_t>(E));
  for (int32_t e = 0; e < E; ++e) {
    score[e] = sigmoid ? 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e]))) : static_cast<double>(logits[e]);
    choice[e] = score[e] + (sigmoid && rp.bias != nullptr ? static_cast<double>(rp.bias[e]) : 0.0);
  }
  taken.assign(static_cast<size_t>(E), 0);
  if (rp.groups > 0) {
    // Group scores: the best choice score (softmax routers) or the sum of
    // the two best (sigmoid routers); the experts of the groups not among
    // the groups_used best are out of the running.
    const int32_t G = rp.groups, per = E / G;
    thread_local std::vector<double> gs;
    thread_local std::vector<char> gtaken;
    gs.assign(static_cast<size_t>(G), 0.0);
    for (int32_t g = 0; g < G; ++g) {
      double b1 = -INFINITY, b2 = -INFINITY;
      for (int32_t e = g * per; e < (g + 1) * per; ++e) {
        if (choice[e] > b1) {
          b2 = b1;
          b1 = choice[e];
        } else if (choice[e] > b2) {
          b2 = choice[e];
        }
      }
      gs[g] = sigmoid ? b1 + b2 : b1;
    }
    gtaken.assign(static_cast<size_t>(G), 0);
    for (int32_t k = 0; k < rp.groups_used; ++k) {
      int32_t best = -1;
      for (int32_t g = 0; g < G; ++g)
        if (!gtaken[g] && (best < 0 || gs[g] > gs[best])) best = g;
      gtaken[best] = 1;
    }
    for (int32_t e = 0; e < E; ++e) taken[e] = gtaken[e / per] ? 0 : 1;
  }
  for (int32_t k = 0; k < K; ++k) {
    int32_t best = -1;
    for (int32_t e = 0; e < E; ++e)
      if (!taken[static_cast<size_t>(e)] && (best < 0 || choice[e] > choice[best])) best = e;
    taken[static_cast<size_t>(best)] = 1;
    experts[k] = best;
  }
  std::sort(experts, experts + K);
  const double scale = rp.scaling;
  double p[512];  // K <= E; K above 512 is refused by moe_block
  if (sigmoid) {
    double sum = 0;
    for (int32_t k = 0; k < K; ++k) sum += p[k] = score[experts[k]];
    for (int32_t k = 0; k < K; ++k)
      weights[k] = static_cast<float>((rp.norm == ENG_ROUTER_SIGMOID_TOPK ? p[k] / sum : p[k]) * scale);
  } else if (rp.norm == ENG_ROUTER_SOFTMAX_TOPK || rp.norm == ENG_ROUTER_SOFTMAX_TOPK_RAW) {
    // Softmax over every expert (max-subtracted, in double), then the
    // chosen probabilities, renormalised over the k unless RAW.
    double mx = logits[0];
    for (int32_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
    double all = 0;
    for (int32_t e = 0; e < E; ++e) all += std::exp(static_cast<double>(logits[e]) - mx);
    double sum = 0;
    for (int32_t k = 0; k < K; ++k) sum += p[k] = std::exp(static_cast<double>(logits[experts[k]]) - mx) / all;
    for (int32_t k = 0; k < K; ++k)
      weights[k] = static_cast<float>((rp.norm == ENG_ROUTER_SOFTMAX_TOPK ? p[k] / sum : p[k]) * scale);
  } else {
    // Softmax over the k chosen logits.
    double mx = logits[experts[0]];
    for (int32_t k = 1; k < K; ++k) mx = std::max(mx, static_cast<double>(logits[experts[k]]));
    double sum = 0;
    for (int32_t k = 0; k < K; ++k) sum += p[k] = std::exp(static_cast<double>(logits[experts[k]]) - mx);
    for (int32_t k = 0; k < K; ++k) weights[k] = static_cast<float>(p[k] / sum * scale);
  }
}

// One MoE block over n rows (see model_cpu.h). Dispatch record: int32 expert
// id, then the row's x [hidden] as floats; member d receives, from each
// member, the (row, expert) pairs it owns in (row, expert id) order, and
// answers each record with y [hidden] in the same order.
void CpuBackend::moe_block(int32_t layer, const StepBatch& batch, int64_t n, const float* x, float* out) {
  const LayerWeights& w = weights_->layers[static_cast<size_t>(layer)];
  const int64_t H = shape_.hidden_size, Fm = shape_.moe_intermediate_size;
  const int32_t E = shape_.num_experts, K = shape_.num_experts_per_tok;
  const int32_t ep = batch.ep != nullptr ? batch.ep->size() : 1, me = batch.ep != nullptr ? batch.ep->rank() : 0;
  if (ep != ep_size_ || me != ep_rank_)
    throw EngineError(ENG_INTERNAL, "MoE step with an EP group the engine did not join");
  if (K > 512) throw EngineError(ENG_UNSUPPORTED, "num_experts_per_tok above 512");
  MoeLayerStats& ls = moe_stats_.layers[static_cast<size_t>(layer)];
  ++ls.calls;

  // Router, top-k and weights of every row.
  float* logits = grow(moe_logits_, static_cast<size_t>(n * E));
  for (int64_t r0 = 0; r0 < n; r0 += kRowChunk) {
    const int64_t m = n - r0 < kRowChunk ? n - r0 : kRowChunk;
    gemm_rows_pool(pool_.get(), x + r0 * H, m, H, w.router.data(), E, logits + r0 * E);
  }
  int32_t* ex = grow(moe_experts_, static_cast<size_t>(n * K));
  float* wt = grow(moe_weights_, static_cast<size_t>(n * K));
  std::vector<char> taken;
  RouteParams rp;
  rp.E = E;
  rp.K = K;
  rp.norm = shape_.router_norm;
  rp.bias = w.router_bias.empty() ? nullptr : w.router_bias.data();
  rp.scaling = shape_.routed_scaling_factor == 0 ? 1.0 : static_cast<double>(shape_.routed_scaling_factor);
  rp.groups = shape_.expert_groups;
  rp.groups_used = shape_.expert_groups_used;
  for (int64_t i = 0; i < n; ++i) moe_route_row(logits + i * E, rp, ex + i * K, wt + i * K, taken);

  // Dispatch.
  const size_t xrec = sizeof(float) * static_cast<size_t>(H);
  const size_t rec = sizeof(int32_t) + xrec;
  moe_send_.resize(static_cast<size_t>(ep));
  for (auto& b : moe_send_) b.clear();
  for (int64_t i = 0; i < n; ++i)
    for (int32_t k = 0; k < K; ++k) {
      const int32_t e = ex[i * K + k];
      std::vector<char>& b = moe_send_[static_cast<size_t>(expert_owner(e, ep))];
      const size_t at = b.size();
      b.resize(at + rec);
      std::memcpy(b.data() + at, &e, sizeof e);
      std::memcpy(b.data() + at + sizeof e, x + i * H, xrec);
    }
  moe_stats_.tokens_routed += static_cast<uint64_t>(n * K);
  auto exchange = [&](ExchangeKind kind, double* ms, uint64_t* bytes) {
    if (batch.ep == nullptr) {
      moe_recv_.swap(moe_send_);
      moe_recv_.resize(1);
      return;
    }
    const uint64_t sent0 = batch.ep->bytes_sent(), recv0 = batch.ep->bytes_received();
    const auto t0 = std::chrono::steady_clock::now();
    batch.ep->alltoallv(ExchangeTag{kind, layer}, moe_send_, &moe_recv_);
    const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    *ms += dt;
    *bytes += batch.ep->bytes_sent() - sent0;
    moe_stats_.wait_ms += dt;
    moe_stats_.last_step_wait_ms += dt;
    moe_stats_.bytes_sent += batch.ep->bytes_sent() - sent0;
    moe_stats_.bytes_received += batch.ep->bytes_received() - recv0;
    ++moe_stats_.exchanges;
  };
  exchange(ExchangeKind::kMoeDispatch, &ls.dispatch_ms, &ls.dispatch_bytes);

  // Expert compute: every owned expert over the rows it received, in
  // (source member, record) order; the answers go back in record order.
  const int32_t members = static_cast<int32_t>(moe_recv_.size());
  std::vector<std::vector<std::pair<int32_t, int64_t>>> by_expert(static_cast<size_t>(E));
  for (int32_t s = 0; s < members; ++s) {
    const std::vector<char>& b = moe_recv_[static_cast<size_t>(s)];
    if (b.size() % rec != 0)
      throw EngineError(ENG_COMM_ERROR, describe(ExchangeTag{ExchangeKind::kMoeDispatch, layer}) + ": member " +
                                            std::to_string(s) + " sent " + std::to_string(b.size()) +
                                            " bytes, not a whole number of token records");
    for (int64_t r = 0; r < static_cast<int64_t>(b.size() / rec); ++r) {
      int32_t e = -1;
      std::memcpy(&e, b.data() + r * rec, sizeof e);
      if (e < 0 || e >= E || expert_owner(e, ep) != me)
        throw EngineError(ENG_COMM_ERROR, describe(ExchangeTag{ExchangeKind::kMoeDispatch, layer}) + ": member " +
                                              std::to_string(s) + " sent a token for expert " + std::to_string(e) +
                                              ", which member " + std::to_string(me) + " does not own");
      by_expert[static_cast<size_t>(e)].emplace_back(s, r);
    }
  }
  moe_send_.resize(static_cast<size_t>(members));
  for (int32_t s = 0; s < members; ++s)
    moe_send_[static_cast<size_t>(s)].resize(moe_recv_[static_cast<size_t>(s)].size() / rec * xrec);
  for (int32_t e = 0; e < E; ++e) {
    const auto& list = by_expert[static_cast<size_t>(e)];
    if (list.empty()) continue;
    const int64_t cnt = static_cast<int64_t>(list.size());
    float* rows = grow(moe_rows_, static_cast<size_t>(cnt * H));
    for (int64_t j = 0; j < cnt; ++j)
      std::memcpy(rows + j * H, moe_recv_[static_cast<size_t>(list[j].first)].data() + list[j].second * rec + sizeof(int32_t),
                  xrec);
    float* y = grow(moe_y_, static_cast<size_t>(cnt * H));
    swiglu(w.experts[static_cast<size_t>(e)], Fm, cnt, rows, y);
    for (int64_t j = 0; j < cnt; ++j)
      std::memcpy(moe_send_[static_cast<size_t>(list[j].first)].data() + list[j].second * xrec, y + j * H, xrec);
  }

  // Combine, then every row's sum: the shared expert, then the routed
  // experts in ascending id, each answer read from its owner in order.
  exchange(ExchangeKind::kMoeCombine, &ls.combine_ms, &ls.combine_bytes);
  if (shape_.num_shared_experts > 0) {
    swiglu(w.shared, int64_t{shape_.num_shared_experts} * Fm, n, x, out);
  } else {
    std::fill(out, out + n * H, 0.0f);
  }
  std::vector<size_t> cursor(static_cast<size_t>(ep), 0);
  for (int64_t i = 0; i < n; ++i) {
    float* o = out + i * H;
    for (int32_t k = 0; k < K; ++k) {
      const int32_t d = expert_owner(ex[i * K + k], ep);
      const std::vector<char>& b = moe_recv_[static_cast<size_t>(d)];
      const size_t at = cursor[static_cast<size_t>(d)]++ * xrec;
      if (at + xrec > b.size())
        throw EngineError(ENG_COMM_ERROR, describe(ExchangeTag{ExchangeKind::kMoeCombine, layer}) + ": member " +
                                              std::to_string(d) + " answered fewer tokens than were dispatched to it");
      const float* y = reinterpret_cast<const float*>(b.data() + at);
      const float g = wt[i * K + k];
      for (int64_t c = 0; c < H; ++c) o[c] += g * y[c];
    }
  }
}

}  // namespace lockstep
