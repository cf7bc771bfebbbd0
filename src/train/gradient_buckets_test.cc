// GradientBuckets against a plain loop: every device of a data axis that
// spans slices (over DCN) and the devices of each slice (shared memory)
// reports the ranges of its gradient in a backward pass's order; the
// buckets start where the sizes say, and the summed buffer equals the sum
// of every member's buffer computed here, with buckets still in flight while
// later ranges are reported.
#include "train/gradient_buckets.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "runtime/test_support.h"

namespace multislice::train {
namespace {

constexpr int kSlices = 2, kDevices = 2;  // data = 2 (ICI) x 2 (DCN)
constexpr int64_t kSize = 10007;

// Small integers: the sums are exact in any order.
float Value(int device, int64_t i) {
  return static_cast<float>((device * 13 + i * 7) % 17) - 8.0f;
}

// Ranges as a backward pass reports them: from the end of the buffer down,
// each ending where the previous began, but for a gap at [5000, 5003) that
// is reported last (a range not adjacent to the pending one).
std::vector<std::pair<int64_t, int64_t>> Ranges() {
  return {{9000, 1007}, {8990, 10}, {6000, 2990}, {5003, 997},
          {100, 4900},  {0, 100},   {5000, 3}};
}

// With buckets of at least 3000 elements.
std::vector<std::pair<int64_t, int64_t>> ExpectedBuckets() {
  return {{6000, 4007}, {5003, 997}, {100, 4900}, {0, 100}, {5000, 3}};
}

int CheckOnDevice(runtime::Runtime& rt, int local) {
  runtime::DeviceCollectives& coll = rt.collectives(local);
  const int me = rt.local_devices()[local];
  std::vector<float> grads(kSize);
  for (int64_t i = 0; i < kSize; ++i) grads[i] = Value(me, i);
  GradientBuckets buckets(coll, {"data"}, grads.data(), 3000);
  for (auto [offset, count] : Ranges()) buckets.Ready(offset, count);
  if (Status s = buckets.Finish(); !s.ok()) {
    std::fprintf(stderr, "device %d: %s\n", me, s.message().c_str());
    return 1;
  }
  int wrong = 0;
  if (buckets.buckets() != ExpectedBuckets()) {
    std::fprintf(stderr, "device %d: other buckets than expected\n", me);
    ++wrong;
  }
  for (int64_t i = 0; i < kSize; ++i) {
    float want = 0;
    for (int d = 0; d < kSlices * kDevices; ++d) want += Value(d, i);
    if (grads[i] != want && wrong++ < 3) {
      std::fprintf(stderr, "device %d [%lld]: got %g want %g\n", me,
                   static_cast<long long>(i), grads[i], want);
    }
  }
  return wrong;
}

int WorkerMain() {
  mesh::ParallelismConfig parallelism;
  parallelism.ici[mesh::kData] = kDevices;
  parallelism.dcn[mesh::kData] = kSlices;
  return runtime::testing::RunDeviceChecks(parallelism, CheckOnDevice);
}

TEST(GradientBucketsTest, SumsEveryBucketOverSlicesAsOneAllReduce) {
  runtime::LaunchResult result =
      runtime::testing::RunSelfAsWorkers(kSlices, kDevices, {"--worker"});
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

}  // namespace
}  // namespace multislice::train

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") {
    return multislice::train::WorkerMain();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
