#include "runtime/slurm_env.h"

#include <charconv>

#include "runtime/mesh/topology.h"

namespace multislice::runtime {
namespace {

std::optional<long> ParseLong(const std::string& text) {
  long value = 0;
  auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) {
    return std::nullopt;
  }
  return value;
}

// Splits at commas outside brackets.
std::vector<std::string> SplitTopLevel(const std::string& text) {
  std::vector<std::string> parts;
  std::string part;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(part);
      part.clear();
    } else {
      part += c;
    }
  }
  parts.push_back(part);
  return parts;
}

Status BadHostlist(const std::string& hostlist, const std::string& why) {
  return InvalidArgument("SLURM_STEP_NODELIST='" + hostlist +
                         "' is not a Slurm hostlist: " + why);
}

// Expands one name with zero or more bracket groups, e.g. "r[1-2]n[01-02]".
Status ExpandName(const std::string& hostlist, const std::string& name,
                  std::vector<std::string>* out) {
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    if (name.find(']') != std::string::npos) {
      return BadHostlist(hostlist, "']' without '['");
    }
    out->push_back(name);
    return OkStatus();
  }
  const size_t close = name.find(']', open);
  if (close == std::string::npos)
    return BadHostlist(hostlist, "'[' not closed");
  const std::string prefix = name.substr(0, open);
  const std::string rest = name.substr(close + 1);
  for (const std::string& range :
       SplitTopLevel(name.substr(open + 1, close - open - 1))) {
    const size_t dash = range.find('-');
    const std::string first = range.substr(0, dash);
    const std::string last =
        dash == std::string::npos ? first : range.substr(dash + 1);
    auto lo = ParseLong(first), hi = ParseLong(last);
    if (first.empty() || !lo || !hi || *hi < *lo || *hi - *lo > 100000) {
      return BadHostlist(hostlist, "'" + range + "' is not a range like 1-4");
    }
    for (long i = *lo; i <= *hi; ++i) {
      std::string number = std::to_string(i);
      if (number.size() < first.size()) {
        number.insert(0, first.size() - number.size(), '0');
      }
      RETURN_IF_ERROR(ExpandName(hostlist, prefix + number + rest, out));
    }
  }
  return OkStatus();
}

Result<int> Count(const EnvLookup& lookup, const char* name) {
  auto value = lookup(name);
  if (!value) return InvalidArgument(std::string(name) + " is not set");
  auto n = ParseLong(*value);
  if (!n || *n > 1 << 20) {
    return InvalidArgument(std::string(name) + "='" + *value +
                           "' is not a non-negative integer");
  }
  return static_cast<int>(*n);
}

}  // namespace

bool InSlurmStep(const EnvLookup& lookup) {
  return lookup("SLURM_PROCID").has_value() &&
         lookup("SLURM_STEP_ID").has_value();
}

Result<std::vector<std::string>> ExpandHostlist(const std::string& hostlist) {
  std::vector<std::string> hosts;
  for (const std::string& name : SplitTopLevel(hostlist)) {
    if (name.empty()) return BadHostlist(hostlist, "an empty name");
    RETURN_IF_ERROR(ExpandName(hostlist, name, &hosts));
  }
  return hosts;
}

Result<std::vector<int>> ExpandTasksPerNode(const std::string& spec) {
  std::vector<int> tasks;
  for (const std::string& part : SplitTopLevel(spec)) {
    const size_t paren = part.find("(x");
    auto count = ParseLong(part.substr(0, paren));
    long repeat = 1;
    if (paren != std::string::npos) {
      const size_t end = part.find(')', paren);
      auto r = end == std::string::npos
                   ? std::nullopt
                   : ParseLong(part.substr(paren + 2, end - paren - 2));
      if (!r || end + 1 != part.size()) count.reset();
      repeat = r.value_or(0);
    }
    if (!count || *count < 1 || repeat < 1 || repeat > 100000) {
      return InvalidArgument("SLURM_STEP_TASKS_PER_NODE='" + spec +
                             "' is not a list like 2(x3),1");
    }
    tasks.insert(tasks.end(), repeat, static_cast<int>(*count));
  }
  return tasks;
}

Result<std::optional<WorkerEnv>> ReadSlurmWorkerEnv(
    const EnvLookup& lookup, int num_slices,
    const std::string& accelerator_type) {
  if (!InSlurmStep(lookup)) return std::optional<WorkerEnv>();
  ASSIGN_OR_RETURN(const int procid, Count(lookup, "SLURM_PROCID"));
  ASSIGN_OR_RETURN(const int ntasks, Count(lookup, "SLURM_NTASKS"));
  if (auto slices = lookup("MEGASCALE_NUM_SLICES")) {
    auto n = ParseLong(*slices);
    if (!n || *n < 1) {
      return InvalidArgument("MEGASCALE_NUM_SLICES='" + *slices +
                             "' is not a number of slices (1 or more)");
    }
    num_slices = static_cast<int>(*n);
  }
  ASSIGN_OR_RETURN(mesh::AcceleratorType type,
                   mesh::ParseAcceleratorType(accelerator_type));
  const int hosts = type.hosts_per_slice();
  if (ntasks != num_slices * hosts) {
    return InvalidArgument(
        "SLURM_NTASKS=" + std::to_string(ntasks) + " tasks cannot be " +
        std::to_string(num_slices) + " slice(s) of " + accelerator_type + " (" +
        std::to_string(hosts) + " host(s) each): expected " +
        std::to_string(num_slices * hosts) +
        " tasks, one per host (srun -N ... --ntasks-per-node 1), or set "
        "--num_slices / MEGASCALE_NUM_SLICES to match");
  }
  if (procid >= ntasks) {
    return InvalidArgument(
        "SLURM_PROCID=" + std::to_string(procid) +
        " is not below SLURM_NTASKS=" + std::to_string(ntasks));
  }
  const std::string nodelist =
      lookup("SLURM_STEP_NODELIST")
          .value_or(lookup("SLURM_JOB_NODELIST").value_or(""));
  ASSIGN_OR_RETURN(std::vector<std::string> nodes, ExpandHostlist(nodelist));
  std::vector<int> per_node(nodes.size(), 1);
  if (auto spec = lookup("SLURM_STEP_TASKS_PER_NODE")) {
    ASSIGN_OR_RETURN(per_node, ExpandTasksPerNode(*spec));
  }
  std::vector<std::string> node_of_task;
  for (size_t n = 0; n < nodes.size() && n < per_node.size(); ++n) {
    node_of_task.insert(node_of_task.end(), per_node[n], nodes[n]);
  }
  if (static_cast<int>(node_of_task.size()) != ntasks) {
    return InvalidArgument(
        "SLURM_STEP_NODELIST='" + nodelist +
        "' with SLURM_STEP_TASKS_PER_NODE places " +
        std::to_string(node_of_task.size()) +
        " tasks, not SLURM_NTASKS=" + std::to_string(ntasks));
  }
  WorkerEnv env;
  env.num_slices = num_slices;
  env.slice_id = procid / hosts;
  env.worker_id = procid % hosts;
  env.worker_hostnames.assign(
      node_of_task.begin() + env.slice_id * hosts,
      node_of_task.begin() + (env.slice_id + 1) * hosts);
  env.accelerator_type = accelerator_type;
  const std::string job = lookup("SLURM_JOB_ID").value_or("0");
  const std::string step = lookup("SLURM_STEP_ID").value_or("0");
  env.run_id = "slurm-" + job + "." + step;
  if (lookup("SLURM_RESTART_COUNT")) {
    ASSIGN_OR_RETURN(env.attempt, Count(lookup, "SLURM_RESTART_COUNT"));
  }
  if (auto address = lookup("MEGASCALE_COORDINATOR_ADDRESS")) {
    env.coordinator_address = *address;
  } else {
    const std::string dir =
        lookup("SLURM_SUBMIT_DIR").value_or(lookup("PWD").value_or("."));
    env.coordinator_address =
        "file://" + dir + "/.multislice-store/" + env.run_id;
  }
  return std::optional<WorkerEnv>(std::move(env));
}

}  // namespace multislice::runtime
