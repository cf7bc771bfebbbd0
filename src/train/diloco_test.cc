// DiLoCo's outer step against the algorithm written out: 2 and 4 replicas
// (devices of one slice, or slices) each move their inner copy of a shard
// by a replica-specific amount for 3 rounds; after each Sync every replica
// holds the outer parameters a plain loop computes (mean pseudo-gradient,
// SGD with Nesterov momentum), within f32 rounding, equal on all replicas;
// with lr 1 and momentum 0 the outer step is the plain average of the
// replicas' parameters.
#include "train/diloco.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/test_support.h"

namespace multislice::train {
namespace {

constexpr int64_t kCount = 1001;

float Start(int64_t i) { return 0.01f * static_cast<float>(i % 37) - 0.2f; }
// What replica r's inner steps add to value i in round k.
float Move(int r, int k, int64_t i) {
  return 0.001f * static_cast<float>((r * 7 + k * 3 + i) % 11) - 0.005f;
}

// The algorithm for `replicas`, with double accumulation.
std::vector<double> Reference(int replicas, int rounds, double lr, double mu) {
  std::vector<double> outer(kCount), momentum(kCount, 0.0);
  for (int64_t i = 0; i < kCount; ++i) outer[i] = Start(i);
  for (int k = 0; k < rounds; ++k) {
    for (int64_t i = 0; i < kCount; ++i) {
      double delta = 0;
      for (int r = 0; r < replicas; ++r) delta -= Move(r, k, i);
      delta /= replicas;  // outer - (outer + move)
      momentum[i] = mu * momentum[i] + delta;
      outer[i] -= lr * (delta + mu * momentum[i]);
    }
  }
  return outer;
}

int CheckOnDevice(runtime::Runtime& rt, int local, double lr, double mu) {
  runtime::DeviceCollectives& coll = rt.collectives(local);
  Result<const runtime::AxisGroup*> group = coll.Group({"data"});
  if (!group.ok()) return 1;
  const int r = (*group)->rank, replicas = (*group)->size;
  std::vector<float> inner(kCount);
  for (int64_t i = 0; i < kCount; ++i) inner[i] = Start(i);
  OuterOptimizerOptions o;
  o.learning_rate = lr;
  o.momentum = mu;
  o.replica_axes = {"data"};
  OuterOptimizer outer(o, inner.data(), kCount);
  int wrong = 0;
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < kCount; ++i) inner[i] += Move(r, k, i);
    if (!outer.Sync(coll, inner.data()).ok()) return 1;
    const std::vector<double> want = Reference(replicas, k + 1, lr, mu);
    for (int64_t i = 0; i < kCount; ++i) {
      if (std::fabs(inner[i] - want[i]) > 1e-6 * (1 + std::fabs(want[i]))) {
        if (wrong++ < 3) {
          std::fprintf(stderr, "round %d value %lld: %.9g, want %.9g\n", k,
                       static_cast<long long>(i), inner[i], want[i]);
        }
      }
    }
    // Equal on every replica: the sum of (value - replica 0's) is 0.
    std::vector<float> first(inner);
    if (!coll.Broadcast({"data"}, 0, first.data(), kCount, runtime::DType::kF32)
             .Wait()
             .ok()) {
      return 1;
    }
    if (first != inner) wrong++;
  }
  return wrong;
}

int WorkerMain(char** argv) {
  mesh::ParallelismConfig parallelism;
  parallelism.ici[mesh::kData] = std::atoi(argv[2]);
  parallelism.ici[mesh::kFsdp] = 1;
  parallelism.dcn[mesh::kData] = std::atoi(argv[3]);
  const double lr = std::atof(argv[4]), mu = std::atof(argv[5]);
  return runtime::testing::RunDeviceChecks(
      parallelism, [&](runtime::Runtime& rt, int local) {
        return CheckOnDevice(rt, local, lr, mu);
      });
}

struct Case {
  const char* name;
  int slices, devices;
  const char* lr;
  const char* momentum;
};

class DilocoTest : public ::testing::TestWithParam<Case> {};

TEST_P(DilocoTest, OuterStepIsTheAlgorithms) {
  const Case& c = GetParam();
  runtime::LaunchResult result = runtime::testing::RunSelfAsWorkers(
      c.slices, c.devices,
      {"--worker", std::to_string(c.devices), std::to_string(c.slices), c.lr,
       c.momentum});
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

INSTANTIATE_TEST_SUITE_P(
    Replicas, DilocoTest,
    ::testing::Values(Case{"ici2_nesterov", 1, 2, "0.7", "0.9"},
                      Case{"dcn4_nesterov", 4, 1, "0.7", "0.9"},
                      // lr 1, momentum 0: the plain average.
                      Case{"dcn2_average", 2, 1, "1", "0"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace multislice::train

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--worker") {
    return multislice::train::WorkerMain(argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
