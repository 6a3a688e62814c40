// cp_group.h: the exchanges an engine makes inside a forward step, with the
// other members of its group.
//
// Under Helix each CP rank holds the K/V of its own pages only. Every layer,
// each member computes the per-page attention partials (attention_partial.h)
// of its pages and the members exchange them, so that every member merges all
// partials in global page order: the result is bit-identical on every member
// and to a single-rank engine. Under expert parallelism (MoE) every MoE layer
// sends each token's activations to the members owning its experts and the
// results back (dispatch and combine).
//
// Exchange is one member's handle on such a group. Two transports implement
// it: LocalCpGroup for members that are engines of one process (in-process
// ranks, each on its own thread), and an MPI group (exchange_mpi.cpp) for one
// member per process. Every exchange carries a tag (what and which layer):
// members that disagree on it fail with a message naming both sides, and a
// member that does not arrive within the group's timeout makes the others
// fail with ENG_TIMEOUT naming the exchange and what each missing peer last
// entered, instead of hanging.
#ifndef LOCKSTEP_NATIVE_CP_GROUP_H
#define LOCKSTEP_NATIVE_CP_GROUP_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lockstep {

// What an exchange is for.
enum class ExchangeKind : int32_t {
  kHelixAttention = 0,  // Helix CP: attention partials of one layer
  kMoeDispatch = 1,     // MoE EP: tokens to the ranks of their experts
  kMoeCombine = 2,      // MoE EP: expert outputs back to the tokens' ranks
  kTest = 3,            // tests and benchmarks
};
const char* exchange_kind_name(ExchangeKind k);

struct ExchangeTag {
  ExchangeKind kind = ExchangeKind::kTest;
  int32_t layer = -1;
  bool operator==(const ExchangeTag& o) const { return kind == o.kind && layer == o.layer; }
  bool operator!=(const ExchangeTag& o) const { return !(*this == o); }
};
// "Helix attention exchange at layer 3".
std::string describe(const ExchangeTag& t);
// "Helix attention exchange at layer 3 (round 57)".
std::string describe(const ExchangeTag& t, uint64_t round);

// One member's handle on a group. Every member makes the same exchanges in
// the same order (the round counter of each member counts its calls); each
// throws EngineError (ENG_TIMEOUT, ENG_COMM_ERROR) instead of hanging.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  // Gathers every member's bytes, in rank order, into out[size()].
  virtual void allgather(const ExchangeTag& tag, const void* data, size_t bytes,
                         std::vector<std::vector<char>>* out) = 0;
  // Sends send[r] to member r (send.size() == size()) and receives member
  // r's bytes for this member into out[r]; out[rank()] = send[rank()].
  virtual void alltoallv(const ExchangeTag& tag, const std::vector<std::vector<char>>& send,
                         std::vector<std::vector<char>>* out) = 0;
  // Bytes this member sent to and received from other members, and the
  // number of exchanges, since creation (benchmarks, reports).
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }
  uint64_t exchanges() const { return exchanges_; }

  // Fault injection for tests (eng_engine_test_stall): the next exchange
  // matching kind and layer (-1 = any) first sleeps for ms, as a member that
  // stopped inside it would, so that its peers' bounded waits are exercised.
  // May be called from any thread.
  void arm_stall(int32_t kind, int32_t layer, int32_t ms);

 protected:
  // Called by each transport on entry to an exchange.
  void maybe_stall(const ExchangeTag& tag);
  uint64_t bytes_sent_ = 0, bytes_received_ = 0, exchanges_ = 0;

 private:
  std::atomic<int32_t> stall_ms_{0}, stall_kind_{-1}, stall_layer_{-1};
};
using CpExchange = Exchange;

// A group handle: hands out members.
class ExchangeGroup {
 public:
  virtual ~ExchangeGroup() = default;
  virtual int32_t size() const = 0;
  // The handle of member `rank` (validated by the caller to be in range).
  // A group of one member per process accepts only that member's rank.
  virtual std::unique_ptr<Exchange> member(int32_t rank) = 0;
  // "in-process" or "MPI".
  virtual const char* transport() const = 0;
  // The only rank this process may join, or -1 when every rank is local.
  virtual int32_t local_rank() const { return -1; }
};

// An in-process group: members are engines of one process, each driven by
// its own thread. One round completes when every member has contributed.
class LocalCpGroup final : public ExchangeGroup, public std::enable_shared_from_this<LocalCpGroup> {
 public:
  LocalCpGroup(int32_t size, std::chrono::milliseconds timeout);
  int32_t size() const override { return size_; }
  std::unique_ptr<Exchange> member(int32_t rank) override;
  const char* transport() const override { return "in-process"; }
  // Fails every current and future round (a member went away).
  void abort(const char* why);

  void allgather(int32_t rank, const ExchangeTag& tag, const void* data, size_t bytes,
                 std::vector<std::vector<char>>* out);

 private:
  const int32_t size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t round_ = 0;                       // completed rounds
  int32_t arrived_ = 0;                      // members in the current round
  ExchangeTag round_tag_;                    // the tag of the current round's first member
  std::vector<std::vector<char>> slots_;     // contributions of the current round
  std::vector<std::vector<char>> result_;    // the last completed round
  std::vector<uint64_t> member_round_;       // rounds each member has entered
  std::vector<ExchangeTag> member_tag_;      // the tag of each member's last round
  bool aborted_ = false;
  std::string abort_reason_;
};

// A group of one member per process over MPI (ENGINE_MPI): the processes of
// MPI_COMM_WORLD with the same color, ranked by world rank. Collective over
// every world process (each passes its own color). Needs MPI_THREAD_MULTIPLE:
// exchanges run on the engine's thread while the control plane uses its own
// communicator. Throws ENG_UNSUPPORTED without ENGINE_MPI.
std::shared_ptr<ExchangeGroup> open_mpi_exchange_group(int32_t color, std::chrono::milliseconds timeout);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_CP_GROUP_H
