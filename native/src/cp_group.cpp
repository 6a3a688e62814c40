#include "cp_group.h"

#include "exchange_wire.h"

#include <cstring>
#include <string>
#include <thread>

#include "status.h"

namespace lockstep {

const char* exchange_kind_name(ExchangeKind k) {
  switch (k) {
    case ExchangeKind::kHelixAttention: return "Helix attention";
    case ExchangeKind::kMoeDispatch: return "MoE dispatch";
    case ExchangeKind::kMoeCombine: return "MoE combine";
    case ExchangeKind::kTest: return "test";
  }
  return "unknown";
}

std::string describe(const ExchangeTag& t) {
  std::string s = std::string(exchange_kind_name(t.kind)) + " exchange";
  if (t.layer >= 0) s += " at layer " + std::to_string(t.layer);
  return s;
}

std::string describe(const ExchangeTag& t, uint64_t round) {
  return describe(t) + " (round " + std::to_string(round) + ")";
}

void Exchange::arm_stall(int32_t kind, int32_t layer, int32_t ms) {
  stall_kind_.store(kind);
  stall_layer_.store(layer);
  stall_ms_.store(ms);  // last: arms
}

void Exchange::maybe_stall(const ExchangeTag& tag) {
  const int32_t ms = stall_ms_.load();
  if (ms <= 0) return;
  const int32_t kind = stall_kind_.load(), layer = stall_layer_.load();
  if (kind >= 0 && kind != static_cast<int32_t>(tag.kind)) return;
  if (layer >= 0 && layer != tag.layer) return;
  if (stall_ms_.exchange(0) <= 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

namespace {

class LocalMember final : public Exchange {
 public:
  LocalMember(std::shared_ptr<LocalCpGroup> g, int32_t rank) : g_(std::move(g)), rank_(rank) {}
  ~LocalMember() override { g_->abort("a member was freed"); }
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return g_->size(); }
  void allgather(const ExchangeTag& tag, const void* data, size_t bytes,
                 std::vector<std::vector<char>>* out) override {
    maybe_stall(tag);
    g_->allgather(rank_, tag, data, bytes, out);
    ++exchanges_;
    bytes_sent_ += bytes * static_cast<size_t>(size() - 1);
    for (int32_t r = 0; r < size(); ++r)
      if (r != rank_) bytes_received_ += (*out)[static_cast<size_t>(r)].size();
  }
  // One allgather of every member's per-destination blocks (a length table,
  // then the blocks); each member keeps the blocks addressed to it. The bytes
  // counted are those a point-to-point transport would move.
  void alltoallv(const ExchangeTag& tag, const std::vector<std::vector<char>>& send,
                 std::vector<std::vector<char>>* out) override {
    maybe_stall(tag);
    const int32_t n = size();
    if (static_cast<int32_t>(send.size()) != n)
      throw EngineError(ENG_INTERNAL, describe(tag) + ": alltoallv with " + std::to_string(send.size()) +
                                          " blocks in a group of " + std::to_string(n));
    size_t total = sizeof(uint64_t) * static_cast<size_t>(n);
    for (const auto& b : send) total += b.size();
    blob_.resize(total);
    char* p = blob_.data();
    for (const auto& b : send) {
      const uint64_t len = b.size();
      std::memcpy(p, &len, sizeof len);
      p += sizeof len;
    }
    for (const auto& b : send) {
      if (!b.empty()) std::memcpy(p, b.data(), b.size());
      p += b.size();
    }
    g_->allgather(rank_, tag, blob_.data(), blob_.size(), &all_);
    out->resize(static_cast<size_t>(n));
    for (int32_t r = 0; r < n; ++r) {
      const std::vector<char>& from = all_[static_cast<size_t>(r)];
      if (from.size() < sizeof(uint64_t) * static_cast<size_t>(n))
        throw EngineError(ENG_COMM_ERROR, describe(tag) + ": member " + std::to_string(r) + " sent a short table");
      size_t off = sizeof(uint64_t) * static_cast<size_t>(n), len = 0;
      for (int32_t d = 0; d <= rank_; ++d) {
        uint64_t l = 0;
        std::memcpy(&l, from.data() + sizeof(uint64_t) * static_cast<size_t>(d), sizeof l);
        if (d < rank_) off += l; else len = l;
      }
      if (off + len > from.size())
        throw EngineError(ENG_COMM_ERROR, describe(tag) + ": member " + std::to_string(r) + " sent a bad table");
      (*out)[static_cast<size_t>(r)].assign(from.data() + off, from.data() + off + len);
      if (r != rank_) {
        bytes_received_ += len;
        bytes_sent_ += send[static_cast<size_t>(r)].size();
      }
    }
    ++exchanges_;
  }

 private:
  std::shared_ptr<LocalCpGroup> g_;
  int32_t rank_;
  std::vector<char> blob_;
  std::vector<std::vector<char>> all_;
};

}  // namespace

LocalCpGroup::LocalCpGroup(int32_t size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), slots_(static_cast<size_t>(size)),
      member_round_(static_cast<size_t>(size), 0), member_tag_(static_cast<size_t>(size)) {}

std::unique_ptr<Exchange> LocalCpGroup::member(int32_t rank) {
  return std::make_unique<LocalMember>(shared_from_this(), rank);
}

void LocalCpGroup::abort(const char* why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = why;
  }
  cv_.notify_all();
}

void LocalCpGroup::allgather(int32_t rank, const ExchangeTag& tag, const void* data, size_t bytes,
                             std::vector<std::vector<char>>* out) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t my_round = member_round_[static_cast<size_t>(rank)]++;
  member_tag_[static_cast<size_t>(rank)] = tag;
  const std::string what = describe(tag, my_round) + " (member " + std::to_string(rank) + ")";
  auto fail = [&](eng_status st, const std::string& msg) { throw EngineError(st, msg); };
  auto aborted = [&] { fail(ENG_COMM_ERROR, what + ": the group was aborted: " + abort_reason_); };
  // Which members have not entered this round, and what each last entered.
  auto missing = [&] {
    std::string s;
    for (int32_t r = 0; r < size_; ++r) {
      const uint64_t entered = member_round_[static_cast<size_t>(r)];
      if (entered > my_round) continue;
      s += s.empty() ? "; waiting for " : ", ";
      s += "member " + std::to_string(r);
      s += entered == 0 ? " (no exchange yet)"
                        : " (last entered " + describe(member_tag_[static_cast<size_t>(r)], entered - 1) + ")";
    }
    return s;
  };
  if (aborted_) aborted();
  // A member can be at most one round ahead of the last completed round:
  // round my_round opens once round my_round - 1 completed.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  if (!cv_.wait_until(lk, deadline, [&] { return aborted_ || round_ >= my_round; }))
    fail(ENG_TIMEOUT, what + ": timed out waiting for the previous round to complete" + missing());
  if (aborted_) aborted();
  if (arrived_ == 0) {
    round_tag_ = tag;
  } else if (round_tag_ != tag) {
    aborted_ = true;
    abort_reason_ = "members disagreed on an exchange";
    cv_.notify_all();
    fail(ENG_COMM_ERROR, what + ": another member entered " + describe(round_tag_, my_round) +
                             " (the members' steps diverged)");
  }
  std::vector<char>& slot = slots_[static_cast<size_t>(rank)];
  slot.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  if (++arrived_ == size_) {
    result_.swap(slots_);
    slots_.assign(static_cast<size_t>(size_), {});
    arrived_ = 0;
    ++round_;
    cv_.notify_all();
  } else if (!cv_.wait_until(lk, deadline, [&] { return aborted_ || round_ > my_round; })) {
    const std::string m = missing();
    aborted_ = true;
    abort_reason_ = "a member timed out";
    cv_.notify_all();
    fail(ENG_TIMEOUT, what + ": timed out after " + std::to_string(timeout_.count()) + " ms" + m);
  }
  if (aborted_ && round_ <= my_round) aborted();
  *out = result_;  // result_ stays until every member entered the next round
}

PeerLedger::PeerLedger(int32_t rank, int32_t size, const char* transport, uint32_t magic)
    : rank_(rank), size_(size), transport_(transport), magic_(magic), last_(static_cast<size_t>(size)) {}

WireHeader PeerLedger::header(const ExchangeTag& tag, uint64_t round, uint64_t bytes) const {
  return WireHeader{magic_, static_cast<int32_t>(tag.kind), tag.layer, rank_, round, bytes};
}

std::string PeerLedger::what(const ExchangeTag& tag, uint64_t round) const {
  return describe(tag, round) + " (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ", " +
         transport_ + ")";
}

void PeerLedger::accept(const std::string& what, int32_t r, const WireHeader& h, const ExchangeTag& tag,
                        uint64_t round, uint64_t max_bytes) {
  if (h.magic != magic_ || h.sender != r || h.bytes > max_bytes)
    throw EngineError(ENG_COMM_ERROR, what + ": rank " + std::to_string(r) + " sent a malformed message");
  const ExchangeTag got{static_cast<ExchangeKind>(h.kind), h.layer};
  last_[static_cast<size_t>(r)] = Last{got, h.round, true};
  if (got != tag || h.round != round)
    throw EngineError(ENG_COMM_ERROR, what + ": rank " + std::to_string(r) + " is in " + describe(got, h.round) +
                                          " (the members' steps diverged)");
}

void PeerLedger::timed_out(const std::string& what, std::chrono::milliseconds timeout,
                           const std::vector<int32_t>& pending) const {
  std::string msg = what + ": timed out after " + std::to_string(timeout.count()) + " ms";
  for (size_t i = 0; i < pending.size(); ++i) {
    const Last& l = last_[static_cast<size_t>(pending[i])];
    msg += (i == 0 ? "; waiting for rank " : ", rank ") + std::to_string(pending[i]) + " (" +
           (l.heard ? "last received from it: " + describe(l.tag, l.round) : "nothing received from it yet") + ")";
  }
  if (pending.empty()) msg += "; every peer's message arrived but this rank's sends did not complete";
  throw EngineError(ENG_TIMEOUT, msg);
}

}  // namespace lockstep
