// thread_pool.cpp: see thread_pool.h.
#include "thread_pool.h"

#include <chrono>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOCKSTEP_PAUSE() _mm_pause()
#else
#define LOCKSTEP_PAUSE() std::this_thread::yield()
#endif

namespace lockstep {
namespace {

// How long a worker spins for the next job before it sleeps: the jobs of a
// step (one per GEMM, attention, ...) come microseconds apart, a wake-up
// from sleep costs tens of microseconds.
constexpr auto kSpin = std::chrono::microseconds(200);

uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

ThreadPool::ThreadPool(int threads) : size_(threads < 1 ? 1 : threads) {
  workers_.reserve(static_cast<size_t>(size_ - 1));
  for (int i = 1; i < size_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_items(int thread) {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    try {
      (*fn_)(i, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::for_each(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (size_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(size_ - 1, std::memory_order_relaxed);
  // Sequentially consistent, with the sleeper's increment of sleeping_ and
  // its read of generation_ (under mu_): either it sees the new job, or
  // this sees it asleep and wakes it.
  generation_.fetch_add(1);  // publishes the job
  if (sleeping_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    wake_.notify_all();
  }
  run_items(0);
  // Every worker must be done with the job (fn is the caller's) before it
  // returns, even one that found no item left.
  for (int spins = 0; busy_.load(std::memory_order_acquire) > 0; ++spins) {
    if (spins < 4096)
      LOCKSTEP_PAUSE();
    else
      std::this_thread::yield();
  }
  fn_ = nullptr;
  if (error_) {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      e = error_;
      error_ = nullptr;
    }
    std::rethrow_exception(e);
  }
}

void ThreadPool::for_ranges(int64_t n, int64_t group, int64_t work, int64_t min_work,
                            const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t groups = (n + group - 1) / group;
  int64_t parts = size_;
  if (work < min_work * parts) parts = work / min_work;
  parts = parts < groups ? parts : groups;
  if (parts <= 1) return fn(0, n);
  for_each(parts, [&](int64_t p, int) {
    const int64_t o0 = groups * p / parts * group;
    const int64_t o1 = p + 1 == parts ? n : groups * (p + 1) / parts * group;
    fn(o0, o1);
  });
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for the next job, then sleep until it comes.
    const auto until = std::chrono::steady_clock::now() + kSpin;
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spins = 0; g == seen && !stop_.load(std::memory_order_relaxed); ++spins) {
      LOCKSTEP_PAUSE();
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() > until) {
        std::unique_lock<std::mutex> lock(mu_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return generation_.load() != seen || stop_.load(); });
        sleeping_.fetch_sub(1);
        break;
      }
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    g = generation_.load(std::memory_order_acquire);
    if (g == seen) continue;
    seen = g;
    const uint64_t t0 = thread_cpu_ns();
    run_items(index);
    worker_cpu_ns_.fetch_add(thread_cpu_ns() - t0, std::memory_order_relaxed);
    busy_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace lockstep
