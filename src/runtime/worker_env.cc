#include "runtime/worker_env.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace multislice::runtime {
namespace {

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) parts.push_back(part);
  return parts;
}

Result<int> ParseNonNegative(const char* name, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < 0 || v > 1 << 30) {
    return InvalidArgument(std::string(name) + "='" + value +
                           "' is not a non-negative integer");
  }
  return static_cast<int>(v);
}

}  // namespace

std::string WorkerName(int slice_id, int worker_id) {
  return "slice " + std::to_string(slice_id) + " worker " +
         std::to_string(worker_id);
}

std::string WorkerEnv::hostname() const {
  if (worker_id < static_cast<int>(worker_hostnames.size())) {
    return worker_hostnames[worker_id];
  }
  return "127.0.0.1";
}

std::string WorkerEnv::name() const { return WorkerName(slice_id, worker_id); }

std::vector<std::string> WorkerEnv::ToEnvironment() const {
  std::string hosts;
  for (size_t i = 0; i < worker_hostnames.size(); ++i) {
    hosts += (i ? "," : "") + worker_hostnames[i];
  }
  std::vector<std::string> vars = {
      "MEGASCALE_COORDINATOR_ADDRESS=" + coordinator_address,
      "MEGASCALE_NUM_SLICES=" + std::to_string(num_slices),
      "MEGASCALE_SLICE_ID=" + std::to_string(slice_id),
      "MEGASCALE_PORT=" + std::to_string(port),
      "TPU_WORKER_ID=" + std::to_string(worker_id),
      "TPU_WORKER_HOSTNAMES=" + hosts,
      "MULTISLICE_ACCELERATOR_TYPE=" + accelerator_type,
      "MULTISLICE_RUN_ID=" + run_id,
      "MULTISLICE_ATTEMPT=" + std::to_string(attempt),
  };
  if (incarnation > 0) {
    vars.push_back("MULTISLICE_INCARNATION=" + std::to_string(incarnation));
  }
  return vars;
}

EnvLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<std::optional<WorkerEnv>> ReadWorkerEnv(const EnvLookup& lookup) {
  auto num_slices = lookup("MEGASCALE_NUM_SLICES");
  if (!num_slices) return std::optional<WorkerEnv>();
  WorkerEnv env;
  ASSIGN_OR_RETURN(env.num_slices,
                   ParseNonNegative("MEGASCALE_NUM_SLICES", *num_slices));
  if (env.num_slices < 1) {
    return InvalidArgument("MEGASCALE_NUM_SLICES='" + *num_slices +
                           "' must be at least 1");
  }
  struct IntVar {
    const char* name;
    int* target;
    bool required;
  };
  for (IntVar var :
       {IntVar{"MEGASCALE_SLICE_ID", &env.slice_id, true},
        IntVar{"TPU_WORKER_ID", &env.worker_id, false},
        IntVar{"MEGASCALE_PORT", &env.port, false},
        IntVar{"MULTISLICE_ATTEMPT", &env.attempt, false},
        IntVar{"MULTISLICE_INCARNATION", &env.incarnation, false}}) {
    auto value = lookup(var.name);
    if (!value) {
      if (var.required) {
        return InvalidArgument(std::string(var.name) +
                               " is not set but MEGASCALE_NUM_SLICES is");
      }
      continue;
    }
    ASSIGN_OR_RETURN(*var.target, ParseNonNegative(var.name, *value));
  }
  if (env.slice_id >= env.num_slices) {
    return InvalidArgument(
        "MEGASCALE_SLICE_ID=" + std::to_string(env.slice_id) +
        " is not below MEGASCALE_NUM_SLICES=" + std::to_string(env.num_slices));
  }
  auto address = lookup("MEGASCALE_COORDINATOR_ADDRESS");
  if (!address || address->empty()) {
    return InvalidArgument(
        "MEGASCALE_COORDINATOR_ADDRESS is not set: expected file://DIR or "
        "redis://HOST:PORT");
  }
  env.coordinator_address = *address;
  if (auto hosts = lookup("TPU_WORKER_HOSTNAMES"); hosts && !hosts->empty()) {
    env.worker_hostnames = SplitCommas(*hosts);
  }
  if (env.worker_id >= static_cast<int>(env.worker_hostnames.size())) {
    return InvalidArgument("TPU_WORKER_ID=" + std::to_string(env.worker_id) +
                           " has no entry in TPU_WORKER_HOSTNAMES");
  }
  env.accelerator_type = lookup("MULTISLICE_ACCELERATOR_TYPE").value_or("");
  env.run_id = lookup("MULTISLICE_RUN_ID").value_or("default");
  return std::optional<WorkerEnv>(std::move(env));
}

}  // namespace multislice::runtime
