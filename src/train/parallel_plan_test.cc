// ParallelPlan against plain loops on meshes with and without fsdp: the
// shard bounds are the balanced split, GatherWeights assembles every shard,
// ReduceGradients leaves each device the shard of the sum of every device's
// gradient (with the backward's ranges reported as the model reports them),
// and ReduceOverAll sums over every device.
#include "train/parallel_plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/test_support.h"

namespace multislice::train {
namespace {

constexpr int64_t kSize = 200003;  // odd: uneven shards, several buckets

// Small integers: every sum is exact in any order.
float Weight(int64_t i) { return static_cast<float>(i % 23) - 11.0f; }
float Grad(int device, int64_t i) {
  return static_cast<float>((device * 5 + i * 3) % 13) - 6.0f;
}

int CheckOnDevice(runtime::Runtime& rt, int local) {
  const int me = rt.local_devices()[local];
  const int devices = static_cast<int>(rt.devices().size());
  auto plan = ParallelPlan::Create(rt.collectives(local), kSize);
  if (!plan.ok()) return 1;
  int wrong = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok && wrong++ < 5) std::fprintf(stderr, "device %d: %s\n", me, what);
  };
  DeviceBuffers b = plan->Allocate();
  const int64_t begin = plan->shard_begin(), count = plan->shard_count();
  expect(static_cast<int64_t>(b.shard.size()) == count, "shard size");
  for (int64_t i = 0; i < count; ++i) b.shard[i] = Weight(begin + i);
  expect(plan->GatherWeights(b).ok(), "GatherWeights failed");
  for (int64_t i = 0; i < kSize; ++i) {
    if (b.weights[i] != Weight(i)) {
      expect(false, "a gathered weight differs");
      break;
    }
  }
  // A backward that writes the gradient from the end in three ranges.
  auto backward = [&](const model::Decoder::GradientReady& ready,
                      float* grads) -> Status {
    const int64_t cuts[4] = {kSize, 150000, 70001, 0};
    for (int r = 0; r < 3; ++r) {
      for (int64_t i = cuts[r + 1]; i < cuts[r]; ++i) grads[i] = Grad(me, i);
      if (ready) ready(cuts[r + 1], cuts[r] - cuts[r + 1]);
    }
    return OkStatus();
  };
  expect(plan->ReduceGradients(backward, b).ok(), "ReduceGradients failed");
  for (int64_t i = 0; i < count; ++i) {
    float want = 0;
    for (int d = 0; d < devices; ++d) want += Grad(d, begin + i);
    if (b.gradient[i] != want) {
      expect(false, "a reduced gradient differs from the plain sum");
      break;
    }
  }
  float value[1] = {static_cast<float>(me + 1)};
  expect(plan->ReduceOverAll(value, 1, "test").ok(), "ReduceOverAll failed");
  expect(value[0] == devices * (devices + 1) / 2.0f, "ReduceOverAll's sum");
  return wrong;
}

int WorkerMain(char** argv) {
  mesh::ParallelismConfig parallelism;
  parallelism.ici[mesh::kData] = std::atoi(argv[2]);
  parallelism.ici[mesh::kFsdp] = std::atoi(argv[3]);
  parallelism.dcn[mesh::kData] = std::atoi(argv[4]);
  return runtime::testing::RunDeviceChecks(parallelism, CheckOnDevice);
}

struct MeshCase {
  int slices, devices, ici_data, ici_fsdp;
};

class ParallelPlanTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ParallelPlanTest, StepCollectivesMatchPlainLoops) {
  const MeshCase& c = GetParam();
  runtime::LaunchResult result = runtime::testing::RunSelfAsWorkers(
      c.slices, c.devices,
      {"--worker", std::to_string(c.ici_data), std::to_string(c.ici_fsdp),
       std::to_string(c.slices)});
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

// data over DCN with fsdp, data over DCN and ICI (buckets), fsdp alone.
INSTANTIATE_TEST_SUITE_P(Meshes, ParallelPlanTest,
                         ::testing::Values(MeshCase{2, 2, 1, 2},
                                           MeshCase{2, 2, 2, 1},
                                           MeshCase{1, 3, 1, 3}),
                         [](const auto& info) {
                           const MeshCase& c = info.param;
                           return "dcn" + std::to_string(c.slices) + "_data" +
                                  std::to_string(c.ici_data) + "_fsdp" +
                                  std::to_string(c.ici_fsdp);
                         });

}  // namespace
}  // namespace multislice::train

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--worker") {
    return multislice::train::WorkerMain(argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
