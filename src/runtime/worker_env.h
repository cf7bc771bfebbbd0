// The worker environment contract between whoever starts a worker (the
// local launcher, a host agent, or a person on each machine) and the runtime.
//
// Variables (names as JAX reads them on Cloud TPU, plus ours):
//   MEGASCALE_COORDINATOR_ADDRESS  rendezvous store: file://DIR or
//                                  redis://HOST:PORT
//   MEGASCALE_NUM_SLICES           number of slices in the job
//   MEGASCALE_SLICE_ID             this worker's slice
//   MEGASCALE_PORT                 accepted for compatibility; Gloo advertises
//                                  its own ports through the store
//   TPU_WORKER_ID                  worker (host) index inside the slice
//   TPU_WORKER_HOSTNAMES           comma-separated addresses of the slice's
//                                  workers; entry TPU_WORKER_ID is the
//                                  address this worker binds for DCN
//   MULTISLICE_ACCELERATOR_TYPE    e.g. cpu-4 (devices per host follow)
//   MULTISLICE_RUN_ID              run identity (store key prefix)
//   MULTISLICE_ATTEMPT             restart attempt (store key prefix)
//   MULTISLICE_INCARNATION         times this worker was restarted within
//                                  the attempt (default 0); above 0 it
//                                  rejoins a running job (membership.h)
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace multislice::runtime {

struct WorkerEnv {
  std::string coordinator_address;
  int num_slices = 1;
  int slice_id = 0;
  int port = 0;
  int worker_id = 0;
  std::vector<std::string> worker_hostnames = {"127.0.0.1"};
  std::string accelerator_type;
  std::string run_id;
  int attempt = 0;
  int incarnation = 0;

  // This worker's DCN address: worker_hostnames[worker_id].
  std::string hostname() const;
  // "slice 1 worker 0", the name used in every message about this worker.
  std::string name() const;
  // The variables above as "NAME=value" strings.
  std::vector<std::string> ToEnvironment() const;
};

std::string WorkerName(int slice_id, int worker_id);

// Looks up an environment variable; returns nullopt when unset. A seam so
// that tests need not change the real environment.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
EnvLookup ProcessEnvironment();

// Reads the contract. Returns nullopt when MEGASCALE_NUM_SLICES is unset
// (this process was not started as a worker). A variable that is set but
// malformed is kInvalidArgument naming the variable, its value and what was
// expected.
Result<std::optional<WorkerEnv>> ReadWorkerEnv(const EnvLookup& lookup);

}  // namespace multislice::runtime
