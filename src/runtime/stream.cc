#include "runtime/stream.h"

#include <pthread.h>

#include "common/float_env.h"

namespace multislice::runtime {

Stream::Stream(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { Loop(); });
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Stream::Enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void Stream::Loop() {
  // Thread names are at most 15 characters.
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  FlushSubnormalsInThisThread();
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closing_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace multislice::runtime
