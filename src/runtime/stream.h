// A stream: a FIFO of tasks run in order by one thread, like a CUDA stream.
// Each device has one stream for ICI work and one for DCN work, so that a
// DCN transfer and an ICI reduction of different collectives proceed at the
// same time while the device thread computes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace multislice::runtime {

class Stream {
 public:
  explicit Stream(std::string name);
  // Runs what is queued, then joins the thread.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues a task; tasks run in the order they were queued. Thread-safe.
  void Enqueue(std::function<void()> task);

 private:
  void Loop();

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool closing_ = false;
  std::thread thread_;
};

}  // namespace multislice::runtime
