// The memory estimate's terms, the available memory from (fake) /proc and
// cgroup files, and the refusal's sentence. The estimate against the peak
// RSS of real runs is train_command_test's MemoryEstimateMatchesPeakRss.
#include "train/memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "model/decoder.h"
#include "train/trainer.h"

namespace multislice::train {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TrainConfig SmallConfig() {
  TrainConfig c;
  c.emb_dim = 64;
  c.num_heads = 2;
  c.num_decoder_layers = 2;
  c.mlp_dim = 128;
  c.max_target_length = 32;
  c.per_device_batch_size = 4;
  c.dtype = "float32";
  return c;
}

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(MemoryEstimateTest, TermsFollowTheAllocations) {
  TrainConfig c = SmallConfig();
  c.enable_checkpointing = false;
  const uint64_t N = model::NumParameters(DecoderConfigOf(c));
  WorkerShape one;
  const MemoryEstimate base = EstimateWorkerMemory(c, one);
  // f32, one device, no fsdp: weights, m, v and the gradient, plus the mask.
  EXPECT_EQ(base.weights_and_optimizer, 16 * N + N);
  EXPECT_EQ(base.checkpoint_staging, 0u);

  // Activations are linear in the tokens of a device and in its devices.
  TrainConfig twice = c;
  twice.per_device_batch_size *= 2;
  const MemoryEstimate big = EstimateWorkerMemory(twice, one);
  EXPECT_NEAR(static_cast<double>(big.activations),
              2.0 * static_cast<double>(base.activations),
              0.01 * static_cast<double>(big.activations));
  WorkerShape four = one;
  four.local_devices = four.devices = four.fsdp = 4;
  const MemoryEstimate sharded = EstimateWorkerMemory(c, four);
  EXPECT_EQ(sharded.activations, 4 * base.activations);
  // fsdp 4: each device keeps 1/4 of weights, m, v and gradient shard, and
  // the whole gathered weights and gradient.
  const uint64_t shard = (N + 3) / 4;
  EXPECT_EQ(sharded.weights_and_optimizer, 4 * (4 * (4 * shard + 2 * N)) + N);
  EXPECT_EQ(sharded.startup_peak, 4 * base.startup_peak);

  // A restore keeps the unsharded state; async saves stage twice.
  WorkerShape restoring = one;
  restoring.restoring = true;
  EXPECT_EQ(EstimateWorkerMemory(c, restoring).weights_and_optimizer,
            base.weights_and_optimizer + 12 * N);
  c.enable_checkpointing = true;
  c.async_checkpointing = false;
  EXPECT_EQ(EstimateWorkerMemory(c, one).checkpoint_staging, 12 * N);
  c.async_checkpointing = true;
  EXPECT_EQ(EstimateWorkerMemory(c, one).checkpoint_staging, 24 * N);

  // bf16 adds the weights' bf16 copy.
  c.dtype = "bfloat16";
  EXPECT_EQ(EstimateWorkerMemory(c, one).weights_and_optimizer,
            base.weights_and_optimizer + 2 * N);
}

TEST(MemoryEstimateTest, TotalIsTheLargerOfStartupAndTraining) {
  TrainConfig c = SmallConfig();
  const MemoryEstimate tiny = EstimateWorkerMemory(c, WorkerShape{});
  ASSERT_GT(tiny.startup_peak, tiny.training());
  EXPECT_EQ(tiny.total(), tiny.runtime + tiny.startup_peak);
  c.per_device_batch_size = 64;
  c.max_target_length = 256;
  c.emb_dim = 256;
  const MemoryEstimate big = EstimateWorkerMemory(c, WorkerShape{});
  ASSERT_GT(big.training(), big.startup_peak);
  EXPECT_EQ(big.total(), big.runtime + big.training());
}

TEST(MemoryEstimateTest, RefusalIsOneSentenceWithTheFigures) {
  MemoryEstimate e;
  e.weights_and_optimizer = static_cast<uint64_t>(3.1 * kGiB);
  e.activations = static_cast<uint64_t>(35.1 * kGiB);
  e.checkpoint_staging = 0;
  e.runtime = 24 << 20;
  e.local_devices = 4;
  e.per_device_batch_size = 64;
  const AvailableMemory available{static_cast<uint64_t>(22.9 * kGiB),
                                  "MemAvailable"};
  Status s = CheckHostMemory(e, 1, available);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "this configuration needs about 38.2 GiB per host (weights and "
            "optimizer 3.1 GiB, activations 35.1 GiB for 4 devices x batch "
            "64, checkpoint staging 0 MiB, runtime 24 MiB); the host has "
            "22.9 GiB available (MemAvailable); lower per_device_batch_size "
            "or max_target_length");
  // Two local slices need twice as much.
  s = CheckHostMemory(e, 2, {static_cast<uint64_t>(60 * kGiB), "x"});
  EXPECT_NE(s.message().find("about 76.4 GiB for its 2 local slices (38.2 GiB "
                             "each: weights"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(CheckHostMemory(e, 1, {e.total(), "x"}).ok());
  // Weights that dominate get the advice about the model.
  std::swap(e.weights_and_optimizer, e.activations);
  s = CheckHostMemory(e, 1, available);
  EXPECT_NE(s.message().find("use a smaller model"), std::string::npos);
}

TEST(AvailableMemoryTest, MemAvailableCgroupAndOverride) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  MemorySources s;
  s.meminfo = dir.path() + "/meminfo";
  s.self_cgroup = dir.path() + "/self_cgroup";
  s.cgroup_root = dir.path() + "/cgroup";
  Write(s.meminfo,
        "MemTotal:       32000000 kB\nMemFree:  1000 kB\n"
        "MemAvailable:   20000000 kB\nBuffers: 5 kB\n");
  Result<AvailableMemory> m = AvailableHostMemory(s);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->bytes, uint64_t{20000000} * 1024);
  EXPECT_EQ(m->source, "MemAvailable");

  // A cgroup (or an ancestor) with less headroom wins; "max" is no limit.
  Write(s.self_cgroup, "0::/job/worker\n");
  Write(s.cgroup_root + "/job/worker/memory.max", "max\n");
  Write(s.cgroup_root + "/job/memory.max", "4294967296\n");
  Write(s.cgroup_root + "/job/memory.current", "1073741824\n");
  m = AvailableHostMemory(s);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->bytes, uint64_t{3} << 30);
  EXPECT_EQ(m->source, "the cgroup's memory.max");

  s.limit_override = "123456789";
  m = AvailableHostMemory(s);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->bytes, 123456789u);
  EXPECT_EQ(m->source, kMemoryLimitVariable);
  for (const char* bad : {"", "-5", "12GB", "0"}) {
    s.limit_override = bad;
    m = AvailableHostMemory(s);
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(m.status().message().find(kMemoryLimitVariable),
              std::string::npos);
  }
}

TEST(AvailableMemoryTest, TheRealHostHasSome) {
  MemorySources s = SystemMemorySources();
  s.limit_override.reset();
  Result<AvailableMemory> m = AvailableHostMemory(s);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_GT(m->bytes, uint64_t{16} << 20);
}

TEST(FormatBytesTest, MiBBelowOneGiB) {
  EXPECT_EQ(FormatBytes(0), "0 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{300} << 20), "300 MiB");
  EXPECT_EQ(FormatBytes(kGiB), "1.0 GiB");
  EXPECT_EQ(FormatBytes(static_cast<uint64_t>(38.24 * kGiB)), "38.2 GiB");
}

}  // namespace
}  // namespace multislice::train
