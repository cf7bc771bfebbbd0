// The rendezvous stores of queued resources (MEGASCALE_COORDINATOR_ADDRESS):
// a file:// directory under the data directory when every host of a queued
// resource is this machine, else one redis-server the controller starts and
// shares between them.
//
// Each queued resource meets under its run identity (RunIdentity: from its
// uid, never reused), so a QR deleted and created again under the same id,
// or QRs of one id in two projects or zones, never share a key. Its
// namespace is made when its workers first start and removed when it is
// deleted. On Redis the default user is off; the controller is an admin user
// whose password is only in a 0600 file, and each queued resource gets an
// ACL user of its own that may touch only its own keys (its workers find
// the credentials in their coordinator address).
//
// Thread-safety: none; the controller calls it under its lock.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/api_types.h"
#include "control/control_state.h"

namespace multislice::control {

// The run identity of r's workers (MULTISLICE_RUN_ID, and the name of its
// rendezvous namespace): "qr-" + its uid.
std::string RunIdentity(const QueuedResourceRecord& r);

class CoordinatorStores {
 public:
  explicit CoordinatorStores(const ControllerOptions& options)
      : options_(options) {}
  ~CoordinatorStores() { Stop(); }
  CoordinatorStores(const CoordinatorStores&) = delete;
  CoordinatorStores& operator=(const CoordinatorStores&) = delete;

  // The coordinator address for the workers of `r` on `hosts` (with r's
  // credentials on Redis), making r's namespace when it has none yet.
  Result<std::string> For(const QueuedResourceRecord& r,
                          const std::map<std::string, Host>& hosts);
  // Removes r's namespace: its directory, or its Redis keys and user.
  void Release(const QueuedResourceRecord& r);
  // Removes the file stores of runs not in `live` (left by a controller
  // killed between a delete and its Release).
  void RemoveFileStoresExcept(const std::set<std::string>& live);
  // Stops the redis-server, if one runs.
  void Stop();

 private:
  Result<std::string> EnsureRedis();
  Status StartRedis();
  // Runs one command (argv) as the controller's Redis admin.
  Status RedisCommand(const std::vector<std::string>& argv,
                      std::vector<std::string>* replies = nullptr);

  const ControllerOptions& options_;
  pid_t redis_pid_ = -1;
  int redis_port_ = 0;
  std::string admin_password_;
  std::map<std::string, std::string> passwords_;  // run identity -> password
};

}  // namespace multislice::control
