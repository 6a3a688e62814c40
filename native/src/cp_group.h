// cp_group.h: the collective a Helix context-parallel (CP) engine uses inside
// a forward step.
//
// Under Helix each CP rank holds the K/V of its own pages only. Every layer,
// each member computes the per-page attention partials (attention_partial.h)
// of its pages and the members exchange them, so that every member merges all
// partials in global page order: the result is bit-identical on every member
// and to a single-rank engine. CpExchange is that exchange; LocalCpGroup
// implements it for members that are engines in one process (in-process
// ranks), a multi-process transport implements the same interface.
#ifndef LOCKSTEP_NATIVE_CP_GROUP_H
#define LOCKSTEP_NATIVE_CP_GROUP_H

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace lockstep {

// One member's handle on a CP group.
class CpExchange {
 public:
  virtual ~CpExchange() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;
  // Gathers every member's bytes, in rank order, into out[size()]. Every
  // member calls it the same number of times (once per layer of each step);
  // throws EngineError (ENG_TIMEOUT, ENG_COMM_ERROR) instead of hanging.
  virtual void allgather(const void* data, size_t bytes, std::vector<std::vector<char>>* out) = 0;
};

// An in-process group: members are engines of one process, each driven by
// its own thread. One round completes when every member has contributed.
class LocalCpGroup : public std::enable_shared_from_this<LocalCpGroup> {
 public:
  LocalCpGroup(int32_t size, std::chrono::milliseconds timeout);
  int32_t size() const { return size_; }
  // The handle of member `rank`.
  std::unique_ptr<CpExchange> member(int32_t rank);
  // Fails every current and future round (a member went away).
  void abort(const char* why);

  void allgather(int32_t rank, const void* data, size_t bytes, std::vector<std::vector<char>>* out);

 private:
  const int32_t size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t round_ = 0;                       // completed rounds
  int32_t arrived_ = 0;                      // members in the current round
  std::vector<std::vector<char>> slots_;     // contributions of the current round
  std::vector<std::vector<char>> result_;    // the last completed round
  std::vector<uint64_t> member_round_;       // rounds each member has entered
  bool aborted_ = false;
  const char* abort_reason_ = "";
};

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_CP_GROUP_H
