// stream.h: an in-order work queue, the CPU backend's analogue of a CUDA
// stream. Work enqueued on a Stream runs on one worker thread, one item at a
// time, in enqueue order, so a backend driven only through it is never called
// concurrently. The worker starts with the first item and is joined by the
// destructor after the queue drained.
#ifndef LOCKSTEP_NATIVE_STREAM_H
#define LOCKSTEP_NATIVE_STREAM_H

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace lockstep {

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  // Queues fn behind everything enqueued before. fn must not throw (items
  // record their own failures).
  void enqueue(std::function<void()> fn);
  // Blocks until every item enqueued so far has run.
  void drain();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable wake_;  // an item was queued, or stop
  std::condition_variable idle_;  // the queue drained
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_STREAM_H
