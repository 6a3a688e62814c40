#include "stream.h"

namespace lockstep {

Stream::~Stream() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Stream::enqueue(std::function<void()> fn) {
  std::unique_lock<std::mutex> lk(mu_);
  queue_.push_back(std::move(fn));
  if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
  lk.unlock();
  wake_.notify_one();
}

void Stream::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [this] { return queue_.empty() && !busy_; });
}

void Stream::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    wake_.wait(lk, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop requested and nothing left
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    fn();
    lk.lock();
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace lockstep
