// The embedded capacity provider: workers run by the host agents
// (docs/agent.md) over their /agent/v1/ API, at most 16 calls in flight.
#pragma once

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/capacity.h"
#include "control/controller.h"
#include "control/http.h"

namespace multislice::control {

// A client of the agent at `address` (HOST:PORT).
Result<ApiClient> AgentClient(const std::string& address,
                              const std::string& token,
                              std::chrono::milliseconds timeout);

// Runs fn(item, index) over items with at most 16 calls in flight.
template <typename T, typename F>
void ForEachParallel(const std::vector<T>& items, F fn) {
  const size_t kWidth = 16;
  for (size_t start = 0; start < items.size(); start += kWidth) {
    std::vector<std::future<void>> futures;
    for (size_t i = start; i < std::min(items.size(), start + kWidth); ++i) {
      futures.push_back(
          std::async(std::launch::async, [&, i] { fn(items[i], i); }));
    }
    for (auto& f : futures) f.get();
  }
}

// Runs `command` in worker `worker`'s directory through the agent's exec
// call and returns its output (read back until done or `deadline_ms` of
// steady time passed).
Result<std::string> ExecOnWorker(ApiClient& client, const std::string& worker,
                                 const std::string& command,
                                 int64_t deadline_ms);

class AgentCapacity : public CapacityProvider {
 public:
  explicit AgentCapacity(const ControllerOptions& options)
      : options_(options) {}

  WorkResult StartWorkers(const std::vector<StartTarget>& targets, int attempt,
                          const std::string& script, int nodes) override;
  WorkResult StopWorkers(const std::vector<HostCall>& hosts,
                         const std::string& worker_prefix) override;
  bool Alive(const HostCall& host, std::chrono::milliseconds timeout) override;

 private:
  const ControllerOptions& options_;
};

}  // namespace multislice::control
