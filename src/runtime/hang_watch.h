// The thread of each worker that notices a hang and, with the other
// workers' threads, writes the hang digest (hang_digest.h).
//
// Every poll period it asks how long the oldest unfinished collective of
// this worker's devices has been in flight. Past the threshold it starts a
// round: it raises the job's alarm in the rendezvous store and posts its
// own report; the other workers' watches see the alarm at their next poll
// and post theirs (a watch runs on its own thread, so it answers while its
// devices are blocked: its answer is the worker's heartbeat). After every
// live worker reported, or the grace period, the lowest worker that
// reported analyses the reports, writes the digest's JSON file and posts
// the digest; the others wait for it (or analyse on their own when it does
// not come) and all of them hand it to on_digest, which prints it and ends
// the process. One round per attempt.
//
// Store keys, under the attempt's prefix: hang/alarm, hang/report/<process>,
// hang/digest.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/hang_digest.h"

namespace multislice::runtime {

struct HangWatchOptions {
  gloo::rendezvous::Store* store = nullptr;
  int process = 0;
  std::vector<std::string> names;  // every process's, by index
  // The processes expected to report (the live ones).
  std::function<std::vector<int>()> live;
  // This worker's report, now.
  std::function<WorkerHangReport()> report;
  // The age of the oldest collective in flight on this worker's devices.
  std::function<std::chrono::steady_clock::duration()> oldest_pending;
  std::chrono::milliseconds poll{200};
  std::chrono::milliseconds grace{3000};
  // Called once on the watch thread with the digest (its `file` the JSON
  // file the writer wrote).
  std::function<void(const HangDigest&)> on_digest;
};

class HangWatch {
 public:
  explicit HangWatch(HangWatchOptions options);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  // Off (zero, the start) until set; the digest is written to `path`.
  void Arm(std::chrono::milliseconds threshold, const std::string& path);
  std::chrono::milliseconds threshold() const;
  // Whether a round has started (this worker's or another's alarm); a
  // failing device then leaves the ending of the process to the round.
  bool round_started() const { return round_started_.load(); }
  // The longest a round takes once started.
  std::chrono::milliseconds round_bound() const {
    return options_.grace * 2 + options_.poll * 4;
  }

 private:
  void Loop();
  bool AlarmRaised();
  void RunRound(bool raise_alarm);
  std::vector<WorkerHangReport> CollectReports(
      const std::vector<int>& live, std::chrono::steady_clock::time_point end);
  HangDigest DigestOf(const std::vector<WorkerHangReport>& reports,
                      const std::vector<int>& live);

  const HangWatchOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::chrono::milliseconds threshold_{0};
  std::string path_;
  std::atomic<bool> round_started_{false};
  std::thread thread_;
};

}  // namespace multislice::runtime
