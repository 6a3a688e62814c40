#include "cp_group.h"

#include <cstring>
#include <string>

#include "status.h"

namespace lockstep {
namespace {

class LocalMember final : public CpExchange {
 public:
  LocalMember(std::shared_ptr<LocalCpGroup> g, int32_t rank) : g_(std::move(g)), rank_(rank) {}
  ~LocalMember() override { g_->abort("a CP member was freed"); }
  int32_t rank() const override { return rank_; }
  int32_t size() const override { return g_->size(); }
  void allgather(const void* data, size_t bytes, std::vector<std::vector<char>>* out) override {
    g_->allgather(rank_, data, bytes, out);
  }

 private:
  std::shared_ptr<LocalCpGroup> g_;
  int32_t rank_;
};

}  // namespace

LocalCpGroup::LocalCpGroup(int32_t size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), slots_(static_cast<size_t>(size)),
      member_round_(static_cast<size_t>(size), 0) {}

std::unique_ptr<CpExchange> LocalCpGroup::member(int32_t rank) {
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

void LocalCpGroup::allgather(int32_t rank, const void* data, size_t bytes,
                             std::vector<std::vector<char>>* out) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t my_round = member_round_[static_cast<size_t>(rank)]++;
  auto fail = [&](eng_status st, const std::string& msg) { throw EngineError(st, msg); };
  if (aborted_) fail(ENG_COMM_ERROR, std::string("Helix CP group aborted: ") + abort_reason_);
  // A member can be at most one round ahead of the last completed round:
  // round my_round opens once round my_round - 1 completed.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  if (!cv_.wait_until(lk, deadline, [&] { return aborted_ || round_ >= my_round; }))
    fail(ENG_TIMEOUT, "Helix CP exchange: timed out waiting for the previous round to complete");
  if (aborted_) fail(ENG_COMM_ERROR, std::string("Helix CP group aborted: ") + abort_reason_);
  std::vector<char>& slot = slots_[static_cast<size_t>(rank)];
  slot.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  if (++arrived_ == size_) {
    result_.swap(slots_);
    slots_.assign(static_cast<size_t>(size_), {});
    arrived_ = 0;
    ++round_;
    cv_.notify_all();
  } else if (!cv_.wait_until(lk, deadline, [&] { return aborted_ || round_ > my_round; })) {
    aborted_ = true;
    abort_reason_ = "a member timed out";
    cv_.notify_all();
    fail(ENG_TIMEOUT, "Helix CP exchange (member " + std::to_string(rank) + ", round " +
                          std::to_string(my_round) + "): timed out after " +
                          std::to_string(timeout_.count()) + " ms waiting for the other members");
  }
  if (aborted_ && round_ <= my_round) fail(ENG_COMM_ERROR, std::string("Helix CP group aborted: ") + abort_reason_);
  *out = result_;  // result_ stays until every member entered the next round
}

}  // namespace lockstep
