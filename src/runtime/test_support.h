// Helpers for the runtime's multi-process tests: a test binary re-runs itself
// as the workers of a local job (argv[1] == "--worker"), each worker builds a
// Runtime from the worker environment, and the parent checks exit codes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/temp_dir.h"
#include "runtime/comm/types.h"
#include "runtime/launcher.h"
#include "runtime/mesh/parallelism.h"
#include "runtime/runtime.h"
#include "runtime/worker_env.h"

namespace multislice::runtime::testing {

// Runs `args` (after argv[0]) in the local workers of this test binary for
// `num_slices` slices of `accelerator_type` (one worker per host of each
// slice); returns the launcher's result. `store_address` empty: a file://
// store in a temporary directory.
inline LaunchResult RunSelfAsWorkersOf(const std::string& accelerator_type,
                                       int num_slices,
                                       const std::vector<std::string>& args,
                                       const std::string& run_id = "test",
                                       const std::string& store_address = "") {
  TempDir store("multislice-test-");
  LocalJobOptions job;
  job.store_address = store_address;
  job.num_slices = num_slices;
  job.accelerator_type = accelerator_type;
  job.run_id = run_id;
  job.argv = {"self"};
  job.argv.insert(job.argv.end(), args.begin(), args.end());
  LaunchOptions launch;
  launch.workers = LocalWorkers(job, store.path());
  return RunWorkers(launch);
}

// The same with a cpu-`devices` accelerator (one host per slice).
inline LaunchResult RunSelfAsWorkers(int num_slices, int devices,
                                     const std::vector<std::string>& args,
                                     const std::string& run_id = "test",
                                     const std::string& store_address = "") {
  return RunSelfAsWorkersOf("cpu-" + std::to_string(devices), num_slices, args,
                            run_id, store_address);
}

// One level of a parallelism configuration, by mesh::Axis.
using AxisValues = mesh::AxisSizes;

// A worker's command-line form of a parallelism configuration: the ici
// values, then the dcn values, each in axis order (data, stage, fsdp,
// tensor): 2 * kNumAxes arguments, read back by ParallelismFromArgs.
inline std::vector<std::string> ParallelismArgs(const AxisValues& ici,
                                                const AxisValues& dcn) {
  std::vector<std::string> args;
  for (int v : ici) args.push_back(std::to_string(v));
  for (int v : dcn) args.push_back(std::to_string(v));
  return args;
}

// The configuration of the 2 * kNumAxes arguments from `args` on.
inline mesh::ParallelismConfig ParallelismFromArgs(char** args) {
  mesh::ParallelismConfig config;
  for (int a = 0; a < mesh::kNumAxes; ++a) {
    config.ici[a] = std::atoi(args[a]);
    config.dcn[a] = std::atoi(args[mesh::kNumAxes + a]);
  }
  return config;
}

// "1121" for {1, 1, 2, 1}: the values of one level in a test name.
inline std::string AxisDigits(const AxisValues& values) {
  std::string text;
  for (int v : values) text += std::to_string(v);
  return text;
}

// The body of a worker of RunSelfAsWorkers: a Runtime from the worker
// environment with `parallelism`, then check(runtime, local) on every device
// thread, which returns its number of wrong values. The worker's exit code:
// 0 when every device found none, 1 otherwise, 2 without the environment.
inline int RunDeviceChecks(const mesh::ParallelismConfig& parallelism,
                           const std::function<int(Runtime&, int)>& check) {
  auto env = ReadWorkerEnv(ProcessEnvironment());
  if (!env.ok() || !env->has_value()) return 2;
  RuntimeOptions options;
  options.env = **env;
  options.parallelism = parallelism;
  options.timeout = std::chrono::seconds(60);
  auto rt = Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "runtime: %s\n", rt.status().message().c_str());
    return 1;
  }
  std::vector<int> wrong((*rt)->local_devices().size());
  Status s = (*rt)->RunOnDevices([&](int local) {
    wrong[local] = check(**rt, local);
    return OkStatus();
  });
  int total = 0;
  for (int w : wrong) total += w;
  return s.ok() && total == 0 ? 0 : 1;
}

// The group of `device` over `axes`, by rank, from the mesh coordinates: every
// device that agrees with `device` on the other axes, ordered row-major over
// `axes` in the order given.
inline std::vector<int> ReferenceGroup(const mesh::DeviceMesh& mesh,
                                       const std::vector<std::string>& axes,
                                       int device) {
  std::vector<int> axis_index;
  for (const std::string& a : axes) {
    axis_index.push_back(static_cast<int>(
        std::find(mesh.axis_names.begin(), mesh.axis_names.end(), a) -
        mesh.axis_names.begin()));
  }
  const std::vector<int> mine = *mesh.coords_of(device);
  std::vector<std::pair<int, int>> ranked;  // (rank, id)
  for (int id : mesh.device_ids) {
    const std::vector<int> c = *mesh.coords_of(id);
    bool same = true;
    for (size_t a = 0; a < c.size(); ++a) {
      bool in_axes = std::find(axis_index.begin(), axis_index.end(),
                               static_cast<int>(a)) != axis_index.end();
      if (!in_axes && c[a] != mine[a]) same = false;
    }
    if (!same) continue;
    int rank = 0;
    for (int a : axis_index) rank = rank * mesh.shape[a] + c[a];
    ranked.push_back({rank, id});
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<int> ids;
  for (auto& [rank, id] : ranked) ids.push_back(id);
  return ids;
}

// The main of a test binary that re-runs itself as workers: `worker` when
// argv[1] is "--worker", else the tests.
inline int WorkerOrTestsMain(int argc, char** argv,
                             int (*worker)(int, char**)) {
  if (argc > 1 && std::string(argv[1]) == "--worker") {
    return worker(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

// Element access for f32 and bf16 buffers held as bytes.
inline void SetElement(comm::DType t, void* buf, size_t i, float v) {
  if (t == comm::DType::kF32) {
    static_cast<float*>(buf)[i] = v;
  } else {
    static_cast<bf16*>(buf)[i] = bf16(v);
  }
}
inline float GetElement(comm::DType t, const void* buf, size_t i) {
  if (t == comm::DType::kF32) return static_cast<const float*>(buf)[i];
  return static_cast<float>(static_cast<const bf16*>(buf)[i]);
}

}  // namespace multislice::runtime::testing
