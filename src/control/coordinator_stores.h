// The rendezvous stores of queued resources (MEGASCALE_COORDINATOR_ADDRESS):
// a file:// directory under the data directory when every host of a queued
// resource is this machine, else one redis-server the controller starts and
// shares between them.
//
// Thread-safety: none; the controller calls it under its lock.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/status.h"
#include "control/api_types.h"
#include "control/control_state.h"

namespace multislice::control {

class CoordinatorStores {
 public:
  explicit CoordinatorStores(const ControllerOptions& options)
      : options_(options) {}
  ~CoordinatorStores() { Stop(); }
  CoordinatorStores(const CoordinatorStores&) = delete;
  CoordinatorStores& operator=(const CoordinatorStores&) = delete;

  // The coordinator address for the workers of `r` on `hosts`.
  Result<std::string> For(const QueuedResourceRecord& r,
                          const std::map<std::string, Host>& hosts);
  // Stops the redis-server, if one runs.
  void Stop();

 private:
  Result<std::string> EnsureRedis();

  const ControllerOptions& options_;
  pid_t redis_pid_ = -1;
  int redis_port_ = 0;
};

}  // namespace multislice::control
