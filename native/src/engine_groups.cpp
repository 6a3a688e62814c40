// engine_groups.cpp: the C entry points of engine.h's exchange groups: Helix
// CP and expert-parallel groups (in process, TCP, MPI), an engine's joins,
// its MoE counters and the test stall (engine.cpp has the rest).
#include <chrono>
#include <memory>
#include <string>

#include "engine_internal.h"
#include "exchange_tcp.h"

using lockstep::EngineError;
using lockstep::invalid_argument;
using namespace lockstep::engine_internal;

namespace {

// rank must name a member of g, and in a group of processes this process's own.
void check_member_rank(const eng_cp_group& g, int32_t rank) {
  const int32_t size = g.group->size();
  if (rank < 0 || rank >= size) invalid_argument(fmt("rank = %d is out of range [0, %d)", rank, size));
  const int32_t local = g.group->local_rank();
  if (local >= 0 && rank != local)
    invalid_argument(fmt("this process is rank %d of its %s group; it cannot join as rank %d", local,
                         g.group->transport(), rank));
}

}  // namespace

extern "C" {

eng_status eng_cp_group_create(int32_t size, int32_t timeout_ms, eng_cp_group_t* out) {
  return guarded(&g_last_error, [&] {
    if (out == nullptr) invalid_argument("out is NULL");
    *out = nullptr;
    if (size < 1) invalid_argument(fmt("size must be >= 1, got %d", size));
    if (timeout_ms < 1) invalid_argument(fmt("timeout_ms must be >= 1, got %d", timeout_ms));
    auto g = std::make_unique<eng_cp_group>();
    g->group = std::make_shared<lockstep::LocalCpGroup>(size, std::chrono::milliseconds(timeout_ms));
    *out = g.release();
  });
}

eng_status eng_tcp_listen(const char* host, int32_t* port, eng_tcp_listener_t* out) {
  return guarded(&g_last_error, [&] {
    if (out == nullptr || port == nullptr) invalid_argument("out or port is NULL");
    *out = nullptr;
    auto l = std::make_unique<lockstep::TcpListener>(host == nullptr ? "" : host);
    *port = l->port();
    *out = reinterpret_cast<eng_tcp_listener_t>(l.release());
  });
}

eng_status eng_tcp_listener_free(eng_tcp_listener_t ln) {
  std::string ignored;
  return guarded(&ignored, [&] { delete reinterpret_cast<lockstep::TcpListener*>(ln); });
}

eng_status eng_cp_group_create_tcp(eng_tcp_listener_t ln, int32_t rank, int32_t size, const char* const* addrs,
                                   const uint8_t* secret, int32_t timeout_ms, eng_cp_group_t* out) {
  return guarded(&g_last_error, [&] {
    if (out == nullptr) invalid_argument("out is NULL");
    *out = nullptr;
    if (ln == nullptr) invalid_argument("listener is NULL");
    if (size < 1) invalid_argument(fmt("size must be >= 1, got %d", size));
    if (rank < 0 || rank >= size) invalid_argument(fmt("rank = %d is out of range [0, %d)", rank, size));
    if (addrs == nullptr || secret == nullptr) invalid_argument("addrs or secret is NULL");
    if (timeout_ms < 1) invalid_argument(fmt("timeout_ms must be >= 1, got %d", timeout_ms));
    std::vector<std::string> a;
    for (int32_t r = 0; r < size; ++r) {
      if (addrs[r] == nullptr) invalid_argument(fmt("addrs[%d] is NULL", r));
      a.emplace_back(addrs[r]);
    }
    auto g = std::make_unique<eng_cp_group>();
    g->group = lockstep::open_tcp_exchange_group(reinterpret_cast<lockstep::TcpListener*>(ln), rank, a, secret,
                                                 std::chrono::milliseconds(timeout_ms));
    *out = g.release();
  });
}

eng_status eng_cp_group_create_mpi(int32_t color, int32_t timeout_ms, eng_cp_group_t* out) {
  return guarded(&g_last_error, [&] {
    if (out == nullptr) invalid_argument("out is NULL");
    *out = nullptr;
    if (color < 0) invalid_argument(fmt("color must be >= 0, got %d", color));
    if (timeout_ms < 1) invalid_argument(fmt("timeout_ms must be >= 1, got %d", timeout_ms));
    auto g = std::make_unique<eng_cp_group>();
    g->group = lockstep::open_mpi_exchange_group(color, std::chrono::milliseconds(timeout_ms));
    *out = g.release();
  });
}

int32_t eng_cp_group_size(eng_cp_group_t group) { return group == nullptr ? -1 : group->group->size(); }

int32_t eng_cp_group_local_rank(eng_cp_group_t group) {
  return group == nullptr ? -1 : group->group->local_rank();
}

eng_status eng_cp_group_free(eng_cp_group_t group) {
  std::string ignored;
  return guarded(&ignored, [&] { delete group; });
}

eng_status eng_engine_join_cp(eng_engine_t eng, eng_cp_group_t group, int32_t rank) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (group == nullptr) invalid_argument("group is NULL");
    if (eng->cp) invalid_argument("this engine already joined a CP group");
    if (eng->ep && eng->ep->size() > 1 && group->group->size() > 1)
      throw EngineError(ENG_UNSUPPORTED, "Helix CP together with expert parallelism over more than one member is not "
                                         "supported: a CP group's members hold every expert (docs/moe.md)");
    if (!eng->inflight.empty()) invalid_argument("join the CP group before submitting steps");
    const int32_t size = group->group->size();
    check_member_rank(*group, rank);
    // A backend refuses by name what its Helix cannot run (the CUDA backend: MLA).
    if (!eng->validate_only && size > 1) eng->backend->join_cp(size, rank);
    eng->cp = group->group->member(rank);
    eng->cp_size = size;
  });
}

eng_status eng_engine_join_ep(eng_engine_t eng, eng_cp_group_t group, int32_t rank) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (group == nullptr) invalid_argument("group is NULL");
    if (eng->ep) invalid_argument("this engine already joined an EP group");
    if (eng->stepped || !eng->inflight.empty()) invalid_argument("join the EP group before the first step");
    if (eng->params.shape.num_experts == 0)
      invalid_argument("expert parallelism needs a mixture-of-experts model (num_experts > 0); this shape is dense");
    const int32_t size = group->group->size();
    check_member_rank(*group, rank);
    if (eng->cp && eng->cp_size > 1 && size > 1)
      throw EngineError(ENG_UNSUPPORTED, "Helix CP together with expert parallelism over more than one member is not "
                                         "supported: a CP group's members hold every expert (docs/moe.md)");
    if (eng->validate_only) {
      eng->ep = group->group->member(rank);
      return;
    }
    // The CUDA backend refuses it by name when built without NCCL.
    eng->backend->join_ep(size, rank);
    eng->ep = group->group->member(rank);
  });
}

eng_status eng_engine_moe_stats(eng_engine_t eng, eng_moe_stats* out) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (out == nullptr) invalid_argument("out is NULL");
    *out = eng_moe_stats{};
    if (!eng->backend) return;
    if (eng->stream) eng->stream->drain();  // counters of submitted steps
    const lockstep::MoeStats& m = eng->backend->moe_stats();
    *out = eng_moe_stats{m.exchanges, m.bytes_sent, m.bytes_received, m.tokens_routed, m.wait_ms};
  });
}

eng_status eng_engine_moe_layer_stats(eng_engine_t eng, int32_t layer, eng_moe_layer_stats* out) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (out == nullptr) invalid_argument("out is NULL");
    if (layer < 0 || layer >= eng->params.shape.num_layers)
      invalid_argument(fmt("layer = %d is out of range [0, %d)", layer, eng->params.shape.num_layers));
    *out = eng_moe_layer_stats{};
    if (!eng->backend) return;
    if (eng->stream) eng->stream->drain();
    const lockstep::MoeStats& m = eng->backend->moe_stats();
    if (static_cast<size_t>(layer) >= m.layers.size()) return;  // a dense model
    const lockstep::MoeLayerStats& l = m.layers[static_cast<size_t>(layer)];
    *out = eng_moe_layer_stats{l.calls, l.dispatch_bytes, l.combine_bytes, l.dispatch_ms, l.combine_ms};
  });
}

eng_status eng_engine_test_stall(eng_engine_t eng, int32_t kind, int32_t layer, int32_t ms) {
  if (!check_handle(eng)) return ENG_INVALID_ARGUMENT;
  return guarded(&eng->last_error, [&] {
    if (kind < -1 || kind > static_cast<int32_t>(lockstep::ExchangeKind::kTest))
      invalid_argument(fmt("kind = %d is not an exchange kind (or -1 for any)", kind));
    if (layer < -1) invalid_argument(fmt("layer = %d must be >= -1", layer));
    if (ms < 1) invalid_argument(fmt("ms = %d must be >= 1", ms));
    if (!eng->cp && !eng->ep) invalid_argument("this engine is in no exchange group: nothing to stall");
    if (eng->cp) eng->cp->arm_stall(kind, layer, ms);
    if (eng->ep) eng->ep->arm_stall(kind, layer, ms);
  });
}

}  // extern "C"
