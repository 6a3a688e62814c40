// thread_pool.h: the CPU backend's fixed pool of threads for one step.
//
// A step's work is cut into items whose results do not depend on which
// thread computes them or in which order (a GEMM's column range, an
// attention head's rows): every output element is computed by exactly one
// item in the reference order, so the step's bits are the same for any
// number of threads (model_cpu.h). The pool only decides who runs an item.
//
// The caller thread runs items too. Between the jobs of a step the workers
// spin for a short while (jobs come back to back, microseconds apart), then
// sleep until the next job, so an idle engine costs no CPU.
#ifndef LOCKSTEP_NATIVE_THREAD_POOL_H
#define LOCKSTEP_NATIVE_THREAD_POOL_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lockstep {

class ThreadPool {
 public:
  // threads >= 1: the caller and threads - 1 workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The threads a job may use, the caller included.
  int size() const { return size_; }

  // Runs fn(item, thread) for every item in [0, n), each exactly once, on
  // whichever thread takes it first (thread: 0 the caller, 1 .. size()-1 the
  // workers, for per-thread scratch), and returns when all have run. An
  // exception thrown by fn is rethrown here once every item has finished
  // (the items after it still run). Not reentrant: fn must not call
  // for_each; one caller at a time.
  void for_each(int64_t n, const std::function<void(int64_t item, int thread)>& fn);

  // Runs fn(o0, o1) over [0, n) cut into at most size() ranges of whole
  // groups of `group` (the last range ends at n), each worth at least
  // min_work of work_per_unit·(its length) — with `work` the whole job's work;
  // one range (on the caller) when the job is too small to share. For
  // products whose output columns the threads share out (gemm, quant_gemm).
  void for_ranges(int64_t n, int64_t group, int64_t work, int64_t min_work,
                  const std::function<void(int64_t o0, int64_t o1)>& fn);

  // CPU time the workers spent running items so far, in nanoseconds (the
  // caller's own share is on its thread's clock).
  uint64_t worker_cpu_ns() const { return worker_cpu_ns_.load(std::memory_order_relaxed); }

 private:
  void worker_loop(int index);
  void run_items(int thread);

  int size_;
  std::vector<std::thread> workers_;
  // The current job: published by a release increment of generation_.
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};      // the next item to take
  std::atomic<int> busy_{0};          // workers not done with the current job
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> worker_cpu_ns_{0};
  std::mutex mu_;  // sleeping workers and the first error
  std::condition_variable wake_;
  std::exception_ptr error_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_THREAD_POOL_H
