// `multislice bench collectives`: the nccl-tests table for our collectives
// on the ICI, DCN and two-level paths, with Gloo's and Open MPI's flat
// all-reduce as baselines and the host's memory bandwidth, all measured in
// the same run (see ../shared/benchmarking.md and docs/performance.md).
//
// The mesh is fixed: data across slices (dcn_data = slices) and fsdp inside
// them (ici_fsdp = devices per slice), so the path `ici` is a collective over
// fsdp, `dcn` over data, and `two-level` over (data, fsdp).
#pragma once

#include <string>
#include <vector>

#include "runtime/comm/types.h"
#include "runtime/runtime.h"

namespace multislice::bench {

struct CollectivesBenchOptions {
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather"};
  std::vector<std::string> paths = {"ici", "dcn", "two-level"};
  std::vector<std::string> baselines = {"gloo-flat", "mpi-flat"};
  long long min_bytes = 1024;
  long long max_bytes = 256ll << 20;
  int step_factor = 2;
  int iters = 5;
  int warmup_iters = 1;
  comm::DType dtype = comm::DType::kF32;
  bool json = false;
};

// Validates the options; kInvalidArgument names the flag and value.
Status ValidateCollectivesBenchOptions(const CollectivesBenchOptions& options);

// Runs on every worker of the job (the runtime's mesh must be the one
// described above). Slice 0 worker 0 prints the table (or the JSON). Returns
// the exit code: 0, or 1 when any value was wrong or a baseline failed.
int RunCollectivesBench(runtime::Runtime& rt,
                        const CollectivesBenchOptions& options);

}  // namespace multislice::bench
