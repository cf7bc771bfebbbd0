// PyTorch over 2 slices: an unchanged DistributedDataParallel script
// (testdata/torch_ddp.py: Gloo, env:// init, one process per host) as the
// startup script of a queued resource of 2 cpu-1 slices on `multislice
// controller --local-hosts 2`. torch.distributed forms its job from the
// variables every worker gets (docs/control.md, Worker environment); the
// test checks DDP's averaged gradient, rank 0's broadcast weights and an
// explicit all_reduce (the sum of the ranks) against the known answers, as
// each worker wrote them. Needs Debian's python3-torch
// (scripts/install_deps.sh); skipped when the binary is not built.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "common/temp_dir.h"
#include "control/agent/local_cluster_test_util.h"

namespace multislice::control {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::seconds;
using testing::ReadWholeFile;

constexpr const char* kPython = "/usr/bin/python3";

class TorchDdpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(MULTISLICE_BINARY)) {
      GTEST_SKIP() << MULTISLICE_BINARY << " is not built";
    }
    testing::CliProcess probe({kPython, "-c", "import torch.distributed"},
                              dir_.path() + "/probe.log", "");
    ASSERT_EQ(probe.Wait(seconds(60)), 0)
        << "Debian's python3-torch is needed (scripts/install_deps.sh): "
        << probe.Output();
    fs::create_directories(out());
    ASSERT_TRUE(cluster_.Start(2, "cpu-1").ok()) << cluster_.log();
  }
  void TearDown() override {
    Status stopped = cluster_.Stop();  // its agents stop every worker
    EXPECT_TRUE(stopped.ok()) << stopped.message();
  }

  std::string out() { return dir_.path() + "/out"; }
  std::string Logs() {
    return ReadWholeFile(out() + "/log.0") + ReadWholeFile(out() + "/log.1");
  }

  // Waits (bounded) for both workers' results.
  bool WaitForResults(seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (fs::exists(out() + "/result.0.json") &&
          fs::exists(out() + "/result.1.json")) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  TempDir dir_{"torch-ddp-test-"};
  testing::LocalController cluster_{MULTISLICE_BINARY, dir_.path()};
};

TEST_F(TorchDdpTest, DdpAndAllReduceOverTwoSlicesFromTheWorkersEnvironment) {
  const std::string script = dir_.path() + "/startup-script.sh";
  std::ofstream(script) << "exec " << kPython << " " << MULTISLICE_TORCH_DDP
                        << " " << out() << " > " << out()
                        << "/log.$MEGASCALE_SLICE_ID 2>&1\n";
  const auto start = std::chrono::steady_clock::now();
  auto [code, created] =
      cluster_.Run({"queued-resources", "create", "ddp", "--accelerator-type",
                    "cpu-1", "--runtime-version", "v2-alpha", "--node-count",
                    "2", "--metadata-from-file", "startup-script=" + script});
  ASSERT_EQ(code, 0) << created;
  ASSERT_TRUE(WaitForResults(seconds(60))) << Logs() << cluster_.log();
  std::printf(
      "2 DDP workers over 2 slices finished %.1f s after create\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());

  json results[2];
  for (int rank = 0; rank < 2; ++rank) {
    results[rank] = json::parse(
        ReadWholeFile(out() + "/result." + std::to_string(rank) + ".json"));
  }
  const json& first = results[0]["env"];
  for (int rank = 0; rank < 2; ++rank) {
    const json& r = results[rank];
    const json& env = r["env"];
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + r.dump());
    EXPECT_EQ(r["rank"], rank);
    EXPECT_EQ(r["world_size"], 2);
    // One host per cpu-1 slice: JAX's process order is the slice order.
    EXPECT_EQ(env["MEGASCALE_SLICE_ID"], std::to_string(rank));
    EXPECT_EQ(env["TPU_WORKER_ID"], "0");
    EXPECT_EQ(env["LOCAL_RANK"], "0");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "1");
    EXPECT_EQ(env["JAX_PROCESS_ID"], std::to_string(rank));
    EXPECT_EQ(env["JAX_NUM_PROCESSES"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], first["MASTER_ADDR"]);
    EXPECT_EQ(env["MASTER_PORT"], first["MASTER_PORT"]);
    const int port = std::stoi(env["MASTER_PORT"].get<std::string>());
    EXPECT_EQ(
        env["JAX_COORDINATOR_ADDRESS"],
        env["MASTER_ADDR"].get<std::string>() + ":" + std::to_string(port + 1));
    // Rank 0's weights, broadcast by DDP; the gradients x = rank + 1
    // averaged: (1 + 2) / 2; all_reduce of the ranks: 0 + 1.
    EXPECT_EQ(r["weight"], json::parse("[1.0, 1.0]"));
    EXPECT_EQ(r["grad"], json::parse("[1.5, 1.5]"));
    EXPECT_EQ(r["rank_sum"], 1.0);
  }
  EXPECT_EQ(first["MASTER_ADDR"], "127.0.0.1");
}

}  // namespace
}  // namespace multislice::control
