// End-to-end tests of `multislice train`: the real binary, launched as a
// user would, on several meshes, killed with SIGKILL mid-run and during an
// asynchronous save, restored onto other meshes and from corrupt files; on a
// "full disk" (a file size limit: EFBIG, and /dev/full: ENOSPC) and with too
// little memory, its estimate checked against the peak RSS of real runs.
//
// The reference for every mesh is the same run on one device; for a resumed
// run it is the uninterrupted run. Models are tiny (f32, 2 layers of width
// 64) so each run takes about a second.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/train_test_fixture.h"
#include "common/cpu_isa.h"
#include "common/temp_dir.h"
#include "runtime/launcher.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/train_state.h"

namespace multislice {
namespace {

namespace fs = std::filesystem;

using testing_util::Child;
using testing_util::Clock;
using testing_util::CompleteSteps;
using testing_util::ExpectClose;
using testing_util::ExpectLossesFrom;
using testing_util::KillWorker;
using testing_util::LoadState;
using testing_util::Losses;
using testing_util::MaxRelativeDifference;
using testing_util::ReadFile;
using testing_util::Spawn;
using testing_util::WaitExit;
using testing_util::WaitForFile;
using testing_util::With;
using testing_util::Workers;

// A mesh of EveryMeshMatchesOneDevice: a run name and its train arguments.
struct TrainMesh {
  std::string name;
  std::vector<std::string> args;
};

class TrainCommandTest : public testing_util::TrainRunTest {
 protected:
  // `model`: overrides of the tiny model for the reference and every mesh.
  // Kills slice 1 of a 2-slice run on `mesh` after its step-13 in-memory
  // replica; the restart restores that step from slice 0's replica.
  void ExpectInMemoryRecovery(const std::vector<std::string>& mesh);
  void ExpectMeshesMatchOneDevice(const std::vector<TrainMesh>& meshes,
                                  const std::vector<std::string>& model = {});
};

// Spawn with the soft limit `resource` at `bytes` and SIGXFSZ ignored in
// the child: under RLIMIT_FSIZE a write past the limit fails with EFBIG, as
// one on a full disk fails with ENOSPC; under RLIMIT_DATA an allocation past
// it fails. Both are inherited through fork and exec, and this process has
// its own back as soon as the child is forked.
Child SpawnWithLimit(int resource, rlim_t bytes,
                     const std::vector<std::string>& args,
                     const std::vector<std::string>& env,
                     const std::string& dir, const std::string& name) {
  rlimit saved{};
  ::getrlimit(resource, &saved);
  struct sigaction ignore = {};
  struct sigaction previous = {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &previous);
  const rlimit limited{bytes, saved.rlim_max};
  ::setrlimit(resource, &limited);
  Child child = Spawn(args, env, dir, name);
  ::setrlimit(resource, &saved);
  ::sigaction(SIGXFSZ, &previous, nullptr);
  return child;
}

// WaitExit that also returns the resources of the child and of the
// descendants it waited for (ru_maxrss: the largest peak RSS among them).
int WaitExitWithUsage(const Child& c, double seconds, rusage* usage) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (::wait4(c.pid, &status, WNOHANG, usage) != c.pid) {
    // Out of time: WaitExit with none left kills the group, returns -1.
    if (Clock::now() > deadline) return WaitExit(c, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The step of the last record in RUN_DIR/metrics.jsonl, or -1.
int64_t LastMetricsStep(const std::string& run_dir) {
  auto records = train::MetricsWriter::ReadAll(run_dir + "/metrics.jsonl");
  if (!records.ok() || records->empty()) return -1;
  return records->back().value("step", int64_t{-1});
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + what.size())) {
    ++n;
  }
  return n;
}

// One device and each mesh train the same global batch of 8 rows: in f32,
// the losses of 3 steps and the first step's gradient (AdamW's m after step
// 1 is 0.1 x the clipped gradient) agree within 1e-5 relative, and the
// weights after 3 steps within 1e-4 (AdamW divides by sqrt(v), which
// magnifies rounding where gradients are near 0).
void TrainCommandTest::ExpectMeshesMatchOneDevice(
    const std::vector<TrainMesh>& meshes,
    const std::vector<std::string>& model) {
  const std::vector<std::string> common =
      With({"steps=3", "checkpoint_period=1"}, model);
  nlohmann::json one = Train(
      With({"run_name=one", "per_device_batch_size=8", "dcn_data_parallelism=1",
            "--num_slices", "1", "--accelerator_type", "cpu-1"},
           common),
      "one");
  ASSERT_EQ(Losses(one).size(), 3u);
  const train::FullState reference = LoadState(RunDir("one"), 3);
  const train::FullState reference_step1 = LoadState(RunDir("one"), 1);
  for (const TrainMesh& mesh : meshes) {
    nlohmann::json result = Train(
        With(With(mesh.args, common), {"run_name=" + mesh.name}), mesh.name);
    ExpectClose(Losses(result), Losses(one), 1e-5, mesh.name);
    const train::FullState step1 = LoadState(RunDir(mesh.name), 1);
    ASSERT_EQ(step1.adam_m.size(), reference_step1.adam_m.size());
    EXPECT_LT(MaxRelativeDifference(step1.adam_m, reference_step1.adam_m), 1e-5)
        << mesh.name;
    const train::FullState state = LoadState(RunDir(mesh.name), 3);
    ASSERT_EQ(state.params.size(), reference.params.size());
    EXPECT_LT(MaxRelativeDifference(state.params, reference.params), 1e-4)
        << mesh.name;
  }
}

// The meshes 1x2 fsdp, 2x1 data over DCN, 2x2 and a v4-16 slice (fsdp 8
// over 2 hosts).
TEST_F(TrainCommandTest, EveryMeshMatchesOneDevice) {
  ExpectMeshesMatchOneDevice({
      {"fsdp1x2",
       {"per_device_batch_size=4", "ici_fsdp_parallelism=2",
        "dcn_data_parallelism=1", "--num_slices", "1", "--accelerator_type",
        "cpu-2"}},
      {"dcn2x1",
       {"per_device_batch_size=4", "dcn_data_parallelism=2", "--num_slices",
        "2", "--accelerator_type", "cpu-1"}},
      {"mesh2x2",
       {"per_device_batch_size=2", "ici_fsdp_parallelism=2",
        "dcn_data_parallelism=2", "--accelerator_type", "cpu-2"}},
      // A slice of 2 hosts (2 worker processes of 4 devices), fsdp over
      // both: its checkpoint is written as one shard file per host.
      {"v4_16_fsdp8",
       {"per_device_batch_size=1", "ici_fsdp_parallelism=8",
        "dcn_data_parallelism=1", "--num_slices", "1", "--accelerator_type",
        "v4-16"}},
  });
}

// Tensor parallelism (Megatron: heads and MLP split over the tensor axis)
// alone, with fsdp, with data over DCN, and across slices: each trains the
// one-device run's global batch of 8 rows (per_device_batch_size x devices;
// a tensor group shares its rows) within the same tolerances; the
// checkpoint, saved as each tensor rank's shards, restores whole.
TEST_F(TrainCommandTest, TensorParallelMeshesMatchOneDevice) {
  ExpectMeshesMatchOneDevice({
      {"tensor2",
       {"per_device_batch_size=4", "ici_tensor_parallelism=2",
        "dcn_data_parallelism=1", "--num_slices", "1", "--accelerator_type",
        "cpu-2"}},
      {"fsdp2_tensor2",
       {"per_device_batch_size=2", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2", "dcn_data_parallelism=1", "--num_slices",
        "1", "--accelerator_type", "cpu-4"}},
      {"dcn_data2_tensor2",
       {"per_device_batch_size=2", "ici_tensor_parallelism=2",
        "dcn_data_parallelism=2", "--num_slices", "2", "--accelerator_type",
        "cpu-2"}},
      {"dcn_tensor2",
       {"per_device_batch_size=4", "dcn_tensor_parallelism=2",
        "dcn_data_parallelism=1", "--num_slices", "2", "--accelerator_type",
        "cpu-1"}},
  });
}

// Pipeline stages (the layers split over the stage axis, microbatches in
// GPipe's or 1F1B's order, activations and gradients sent between stages):
// inside a slice, across slices with data parallelism there too, and with
// tensor parallelism and fsdp inside each stage's slice; each trains the
// one-device run's losses, gradients (AdamW's first moment after step 1)
// and weights.
TEST_F(TrainCommandTest, PipelineMeshesMatchOneDevice) {
  ExpectMeshesMatchOneDevice({
      {"stage2_gpipe",
       {"per_device_batch_size=4", "ici_pipeline_parallelism=2",
        "ici_fsdp_parallelism=1", "dcn_data_parallelism=1",
        "num_pipeline_microbatches=4", "pipeline_parallel_schedule=GPipe",
        "--num_slices", "1", "--accelerator_type", "cpu-2"}},
      {"stage2_1f1b",
       {"per_device_batch_size=4", "ici_pipeline_parallelism=2",
        "ici_fsdp_parallelism=1", "dcn_data_parallelism=1",
        "num_pipeline_microbatches=4", "pipeline_parallel_schedule=1F1B",
        "--num_slices", "1", "--accelerator_type", "cpu-2"}},
      {"dcn_stage2_dcn_data2",
       {"per_device_batch_size=2", "dcn_pipeline_parallelism=2",
        "dcn_data_parallelism=2", "ici_fsdp_parallelism=1",
        "num_pipeline_microbatches=4", "--num_slices", "4",
        "--accelerator_type", "cpu-1"}},
      {"dcn_stage2_tensor2_fsdp2",
       {"per_device_batch_size=1", "dcn_pipeline_parallelism=2",
        "dcn_data_parallelism=1", "ici_fsdp_parallelism=2",
        "ici_tensor_parallelism=2", "num_pipeline_microbatches=4",
        "--num_slices", "2", "--accelerator_type", "cpu-4"}},
  });
}

// The Llama block (RMSNorm, rotary embeddings, 4 query heads on 2 key/value
// heads of 16 channels, SwiGLU, an untied head over 8192 tokens) and the
// Gemma block (GeGLU, a tied head whose logits are divided by sqrt(C)):
// fsdp 2, tensor 2, data 2 over DCN and 2 pipeline stages over DCN each
// train the one-device run's losses, first gradient and weights.
const std::vector<TrainMesh> kBlockMeshes = {
    {"fsdp2",
     {"per_device_batch_size=4", "ici_fsdp_parallelism=2",
      "dcn_data_parallelism=1", "--num_slices", "1", "--accelerator_type",
      "cpu-2"}},
    {"tensor2",
     {"per_device_batch_size=4", "ici_tensor_parallelism=2",
      "dcn_data_parallelism=1", "--num_slices", "1", "--accelerator_type",
      "cpu-2"}},
    {"dcn_data2",
     {"per_device_batch_size=4", "dcn_data_parallelism=2", "--num_slices", "2",
      "--accelerator_type", "cpu-1"}},
    {"dcn_stage2",
     {"per_device_batch_size=4", "dcn_pipeline_parallelism=2",
      "dcn_data_parallelism=1", "ici_fsdp_parallelism=1",
      "num_pipeline_microbatches=4", "--num_slices", "2", "--accelerator_type",
      "cpu-1"}},
};

// The Llama run trains on the fortunes corpus tokenized by a SentencePiece
// model of 8192 pieces trained on it (data prepare --train_tokenizer).
TEST_F(TrainCommandTest, LlamaMeshesMatchOneDevice) {
  const std::string sp = dir_.path() + "/fortunes-sp8k";
  Child prep =
      Spawn({"data", "prepare", "--train_tokenizer", "8192", "--output", sp},
            {}, dir_.path(), "prepare-sp8k");
  ASSERT_EQ(WaitExit(prep, 300), 0) << ReadFile(prep.err);
  ExpectMeshesMatchOneDevice(
      kBlockMeshes,
      {"decoder_block=llama2", "num_heads=4", "num_kv_heads=2", "head_dim=16",
       "mlp_activations=[silu,linear]", "logits_via_embedding=false",
       "vocab_size=8192", "dataset_path=" + sp,
       "tokenizer_path=" + sp + "/tokenizer.model"});
}

TEST_F(TrainCommandTest, GemmaMeshesMatchOneDevice) {
  ExpectMeshesMatchOneDevice(
      kBlockMeshes,
      {"decoder_block=gemma", "num_heads=4", "num_kv_heads=2", "head_dim=16",
       "mlp_activations=[gelu,linear]", "logits_via_embedding=true"});
}

// Four stages of one layer each, both schedules, 8 microbatches.
TEST_F(TrainCommandTest, FourStagePipelinesMatchOneDevice) {
  ExpectMeshesMatchOneDevice(
      {
          {"stage4_gpipe",
           {"per_device_batch_size=2", "ici_pipeline_parallelism=4",
            "ici_fsdp_parallelism=1", "dcn_data_parallelism=1",
            "num_pipeline_microbatches=8", "pipeline_parallel_schedule=GPipe",
            "--num_slices", "1", "--accelerator_type", "cpu-4"}},
          {"stage4_1f1b",
           {"per_device_batch_size=2", "ici_pipeline_parallelism=4",
            "ici_fsdp_parallelism=1", "dcn_data_parallelism=1",
            "num_pipeline_microbatches=8", "--num_slices", "1",
            "--accelerator_type", "cpu-4"}},
      },
      {"num_decoder_layers=4"});
}

// Stage 2 across slices x tensor 2: resumed from its step-5 checkpoint it
// trains steps 6-10 bit for bit as the uninterrupted run; the same
// checkpoint restores onto one device (no stage, no tensor) and onto stage
// 2 x fsdp 2 inside a slice (no tensor, GPipe), each going on as the run
// that never moved.
TEST_F(TrainCommandTest, PipelineCheckpointsResumeAndReshard) {
  const std::vector<std::string> pipeline = {"steps=10",
                                             "checkpoint_period=5",
                                             "per_device_batch_size=2",
                                             "dcn_data_parallelism=1",
                                             "dcn_pipeline_parallelism=2",
                                             "ici_fsdp_parallelism=1",
                                             "ici_tensor_parallelism=2",
                                             "num_pipeline_microbatches=4",
                                             "--num_slices",
                                             "2",
                                             "--accelerator_type",
                                             "cpu-2"};
  const std::vector<double> unmoved =
      Losses(Train(With(pipeline, {"run_name=pp"}), "pp"));
  ASSERT_EQ(unmoved.size(), 10u);
  fs::remove_all(RunDir("pp") + "/checkpoints/10");
  for (const char* run : {"pp-resumed", "pp-to1", "pp-tofsdp"}) {
    fs::copy(RunDir("pp"), RunDir(run), fs::copy_options::recursive);
  }
  nlohmann::json resumed =
      Train(With(pipeline, {"run_name=pp-resumed"}), "pp-resumed");
  EXPECT_EQ(resumed.value("restored_step", int64_t{-1}), 5);
  ExpectLossesFrom(resumed, 5, unmoved);

  const std::vector<double> expected(unmoved.begin() + 5, unmoved.end());
  nlohmann::json one =
      Train({"run_name=pp-to1", "steps=10", "checkpoint_period=5",
             "per_device_batch_size=8", "dcn_data_parallelism=1",
             "--num_slices", "1", "--accelerator_type", "cpu-1"},
            "pp-to1");
  EXPECT_EQ(one.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(one), expected, 1e-5, "stage 2 x tensor 2 -> 1 device");
  nlohmann::json fsdp =
      Train({"run_name=pp-tofsdp", "steps=10", "checkpoint_period=5",
             "per_device_batch_size=2", "ici_pipeline_parallelism=2",
             "ici_fsdp_parallelism=2", "dcn_data_parallelism=1",
             "pipeline_parallel_schedule=GPipe", "--num_slices", "1",
             "--accelerator_type", "cpu-4"},
            "pp-tofsdp");
  EXPECT_EQ(fsdp.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(fsdp), expected, 1e-5,
              "stage 2 x tensor 2 -> stage 2 x fsdp 2");
}

// fsdp 2 x tensor 2: a run resumed from its step-5 checkpoint (the later one
// removed) trains steps 6-10 with the uninterrupted run's losses, bit for
// bit: the tensor ranks' shards go back where they were.
TEST_F(TrainCommandTest, TensorParallelResumeIsBitwiseExact) {
  const std::vector<std::string> mesh = {"steps=10",
                                         "checkpoint_period=5",
                                         "per_device_batch_size=2",
                                         "ici_fsdp_parallelism=2",
                                         "ici_tensor_parallelism=2",
                                         "dcn_data_parallelism=1",
                                         "--num_slices",
                                         "1",
                                         "--accelerator_type",
                                         "cpu-4"};
  const std::vector<double> uninterrupted =
      Losses(Train(With(mesh, {"run_name=tp"}), "tp"));
  ASSERT_EQ(uninterrupted.size(), 10u);
  fs::copy(RunDir("tp"), RunDir("tp-resumed"), fs::copy_options::recursive);
  fs::remove_all(RunDir("tp-resumed") + "/checkpoints/10");
  nlohmann::json resumed =
      Train(With(mesh, {"run_name=tp-resumed", "steps=10"}), "tp-resumed");
  EXPECT_EQ(resumed.value("restored_step", int64_t{-1}), 5);
  ExpectLossesFrom(resumed, 5, uninterrupted);
}

// 2 slices, f32: an uninterrupted run, and the same run killed with SIGKILL
// (one worker) after its step-10 checkpoint and started again. Every step the
// second attempt trains has the loss of the uninterrupted run, bit for bit.
TEST_F(TrainCommandTest, ResumeAfterKillIsBitwiseExact) {
  const std::vector<std::string> args = {"steps=24", "checkpoint_period=5",
                                         "per_device_batch_size=4"};
  auto named = [&](const std::string& run) {
    return With(args, {"run_name=" + run});
  };
  const std::vector<double> uninterrupted = Losses(Train(named("a"), "a"));
  ASSERT_EQ(uninterrupted.size(), 24u);

  Child victim = Spawn(Args(named("b")), {"MULTISLICE_TEST_STEP_DELAY_MS=150"},
                       dir_.path(), "b-first");
  ASSERT_TRUE(WaitForFile(RunDir("b") + "/checkpoints/10/COMMITTED", 120))
      << ReadFile(victim.err);
  ASSERT_NO_FATAL_FAILURE(KillWorker(victim, 1));

  nlohmann::json resumed = Train(named("b"), "b-second");
  const int64_t restored = resumed.value("restored_step", int64_t{-1});
  ASSERT_GE(restored, 10);
  ASSERT_LT(restored, 24) << "the kill came after the end";
  ExpectLossesFrom(resumed, restored, uninterrupted);
}

// In-memory recovery: 2 slices keep a replica of their state in host memory
// every step. Slice 1's worker is killed after step 13 (checkpoint: step 10)
// and its host's memory is wiped, as on a replacement host. The restart
// restores a step newer than the checkpoint from slice 0's replica, sent over
// DCN, and continues with the uninterrupted run's losses, bit for bit.
void TrainCommandTest::ExpectInMemoryRecovery(
    const std::vector<std::string>& mesh) {
  const std::string tag = std::to_string(::getpid());
  const std::vector<std::string> args =
      With({"steps=24", "checkpoint_period=10",
            "enable_in_memory_recovery=true", "in_memory_replica_period=1"},
           mesh);
  auto named = [&](const std::string& run) {
    return With(args, {"run_name=" + run + tag});
  };
  const std::string memory =
      "/dev/shm/multislice-" + std::to_string(::getuid());
  const std::vector<double> uninterrupted = Losses(Train(named("a"), "a"));
  ASSERT_EQ(uninterrupted.size(), 24u);
  // A finished run frees its host memory.
  EXPECT_FALSE(fs::exists(memory + "/local-slice0/a" + tag + "/worker0"));

  Child victim = Spawn(Args(named("b")), {"MULTISLICE_TEST_STEP_DELAY_MS=150"},
                       dir_.path(), "b-first");
  const std::string replica0 = memory + "/local-slice0/b" + tag;
  const std::string replica1 = memory + "/local-slice1/b" + tag;
  ASSERT_TRUE(WaitForFile(replica0 + "/worker0/13/COMMITTED", 120))
      << ReadFile(victim.err);
  ASSERT_NO_FATAL_FAILURE(KillWorker(victim, 1));
  fs::remove_all(replica1);  // slice 1 comes back on a fresh host

  Child second = Spawn(Args(named("b")), {}, dir_.path(), "b-second");
  ASSERT_EQ(WaitExit(second, 240), 0) << ReadFile(second.err);
  std::string out = ReadFile(second.out);
  nlohmann::json resumed =
      nlohmann::json::parse(testing_util::LastJsonLine(out));
  EXPECT_EQ(resumed.value("restored_from", std::string()), "replica");
  const int64_t restored = resumed.value("restored_step", int64_t{-1});
  EXPECT_GE(restored, 13) << "newer than the step-10 checkpoint";
  ASSERT_LT(restored, 24);
  ASSERT_NO_FATAL_FAILURE(ExpectLossesFrom(resumed, restored, uninterrupted));
  fs::remove_all(replica0);
  fs::remove_all(replica1);
}

TEST_F(TrainCommandTest, InMemoryRecoveryRestoresANewerStepFromAReplica) {
  ExpectInMemoryRecovery({"per_device_batch_size=4"});
}

// The same with 2 pipeline stages x tensor 2 inside each slice: each
// (stage, tensor rank) shard comes back from slice 0's copy of it.
TEST_F(TrainCommandTest, InMemoryRecoveryUnderPipelineAndTensorParallelism) {
  ExpectInMemoryRecovery(
      {"per_device_batch_size=1", "ici_pipeline_parallelism=2",
       "ici_fsdp_parallelism=1", "ici_tensor_parallelism=2",
       "dcn_data_parallelism=2", "num_pipeline_microbatches=2",
       "--accelerator_type", "cpu-4"});
}

// The second save (step 10) is stopped after writing its files and before
// its commit; the job is killed there. The restart restores step 5, never
// the half-written step 10, and still matches the uninterrupted run.
TEST_F(TrainCommandTest, KillDuringAsyncSaveRestoresThePreviousStep) {
  const std::vector<std::string> args = {"steps=16", "checkpoint_period=5",
                                         "per_device_batch_size=4"};
  auto named = [&](const std::string& run) {
    return With(args, {"run_name=" + run});
  };
  const std::vector<double> uninterrupted = Losses(Train(named("a"), "a"));
  ASSERT_EQ(uninterrupted.size(), 16u);

  Child victim = Spawn(Args(named("b")), {"MULTISLICE_TEST_PAUSE_CHECKPOINT=2"},
                       dir_.path(), "b-first");
  const std::string tmp = RunDir("b") + "/checkpoints/10.tmp";
  ASSERT_TRUE(WaitForFile(tmp + "/host0.json", 120)) << ReadFile(victim.err);
  ASSERT_TRUE(WaitForFile(tmp + "/host1.json", 60)) << ReadFile(victim.err);
  // Training went on while the save was stuck: it only blocks at the next
  // save (step 15), which waits for this one.
  ASSERT_NO_FATAL_FAILURE(KillWorker(victim, 0));
  EXPECT_FALSE(fs::exists(RunDir("b") + "/checkpoints/10/COMMITTED"));

  nlohmann::json resumed = Train(named("b"), "b-second");
  EXPECT_EQ(resumed.value("restored_step", int64_t{-1}), 5);
  ExpectLossesFrom(resumed, 5, uninterrupted);
}

// A checkpoint saved on 2 slices x 2 devices (data 2, fsdp 2) restores on one
// device and on one slice of 4 devices (fsdp 4); both continue with the
// losses of the run that never moved.
TEST_F(TrainCommandTest, CheckpointReshardsOntoOtherMeshes) {
  const std::vector<std::string> mesh2x2 = {"per_device_batch_size=2",
                                            "ici_fsdp_parallelism=2",
                                            "dcn_data_parallelism=2",
                                            "--accelerator_type",
                                            "cpu-2",
                                            "checkpoint_period=5"};
  auto on_2x2 = [&](const std::string& run, int steps) {
    return With(mesh2x2, {"run_name=" + run, "steps=" + std::to_string(steps)});
  };
  const std::vector<double> unmoved =
      Losses(Train(on_2x2("unmoved", 10), "unmoved"));
  ASSERT_EQ(unmoved.size(), 10u);
  // The same run again, with only its step-5 checkpoint kept: the state a
  // job that stopped there leaves (same schedule as the unmoved run).
  Train(on_2x2("saved", 10), "saved");
  fs::remove_all(RunDir("saved") + "/checkpoints/10");
  fs::copy(RunDir("saved"), RunDir("to1x1"), fs::copy_options::recursive);
  fs::copy(RunDir("saved"), RunDir("to1x4"), fs::copy_options::recursive);
  fs::copy(RunDir("saved"), RunDir("tov4"), fs::copy_options::recursive);
  const std::vector<double> expected(unmoved.begin() + 5, unmoved.end());

  nlohmann::json one =
      Train({"run_name=to1x1", "steps=10", "checkpoint_period=5",
             "per_device_batch_size=8", "dcn_data_parallelism=1",
             "--num_slices", "1", "--accelerator_type", "cpu-1"},
            "to1x1");
  EXPECT_EQ(one.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(one), expected, 1e-5, "2x2 -> 1x1");

  nlohmann::json four =
      Train({"run_name=to1x4", "steps=10", "checkpoint_period=5",
             "per_device_batch_size=2", "ici_fsdp_parallelism=4",
             "dcn_data_parallelism=1", "--num_slices", "1",
             "--accelerator_type", "cpu-4"},
            "to1x4");
  EXPECT_EQ(four.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(four), expected, 1e-5, "2x2 -> 1x4");

  // Onto a pipeline of 2 stages with fsdp 2 in each (1F1B).
  fs::copy(RunDir("saved"), RunDir("topipeline"), fs::copy_options::recursive);
  nlohmann::json pipeline =
      Train({"run_name=topipeline", "steps=10", "checkpoint_period=5",
             "per_device_batch_size=2", "ici_pipeline_parallelism=2",
             "ici_fsdp_parallelism=2", "dcn_data_parallelism=1", "--num_slices",
             "1", "--accelerator_type", "cpu-4"},
            "topipeline");
  EXPECT_EQ(pipeline.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(pipeline), expected, 1e-5, "2x2 -> stage 2 x fsdp 2");

  // Onto tensor parallelism with fsdp, then from it back onto one device.
  fs::copy(RunDir("saved"), RunDir("totensor"), fs::copy_options::recursive);
  nlohmann::json tensor =
      Train({"run_name=totensor", "steps=10", "checkpoint_period=5",
             "per_device_batch_size=2", "ici_fsdp_parallelism=2",
             "ici_tensor_parallelism=2", "dcn_data_parallelism=1",
             "--num_slices", "1", "--accelerator_type", "cpu-4"},
            "totensor");
  EXPECT_EQ(tensor.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(tensor), expected, 1e-5, "2x2 -> fsdp 2 x tensor 2");
  fs::remove_all(RunDir("totensor") + "/checkpoints/5");
  fs::copy(RunDir("totensor"), RunDir("fromtensor"),
           fs::copy_options::recursive);
  nlohmann::json back =
      Train({"run_name=fromtensor", "steps=12", "checkpoint_period=5",
             "per_device_batch_size=8", "dcn_data_parallelism=1",
             "--num_slices", "1", "--accelerator_type", "cpu-1"},
            "fromtensor");
  EXPECT_EQ(back.value("restored_step", int64_t{-1}), 10);
  EXPECT_EQ(Losses(back).size(), 2u) << "tensor 2 -> 1x1";

  // Onto one v4-16 slice: 2 hosts of 4 devices, fsdp over all 8.
  nlohmann::json v4 =
      Train({"run_name=tov4", "steps=10", "checkpoint_period=5",
             "per_device_batch_size=1", "ici_fsdp_parallelism=8",
             "dcn_data_parallelism=1", "--num_slices", "1",
             "--accelerator_type", "v4-16"},
            "tov4");
  EXPECT_EQ(v4.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(v4), expected, 1e-5, "2x2 -> v4-16 (2 hosts)");
}

// A checkpoint written with the kernels capped at the x86-64 baseline (no
// FMA, SSE2 element-wise code, oneDNN's SSE4.1 matmuls) restores with this
// CPU's own kernels and continues as the run that never stopped, within the
// rounding differences of the two levels.
TEST_F(TrainCommandTest, CheckpointRestoresUnderAnotherIsaLevel) {
  const std::string native =
      "MULTISLICE_MAX_ISA=" + std::string(IsaName(DetectedIsa()));
  auto run = [&](const std::string& name) {
    return std::vector<std::string>{"run_name=" + name, "steps=10",
                                    "checkpoint_period=5", "--num_slices", "1"};
  };
  const std::vector<double> unmoved =
      Losses(Train(run("native"), "native", {native}));
  ASSERT_EQ(unmoved.size(), 10u);
  Train(run("moved"), "baseline", {"MULTISLICE_MAX_ISA=baseline"});
  fs::remove_all(RunDir("moved") + "/checkpoints/10");
  nlohmann::json resumed = Train(run("moved"), "moved", {native});
  EXPECT_EQ(resumed.value("restored_step", int64_t{-1}), 5);
  ExpectClose(Losses(resumed),
              std::vector<double>(unmoved.begin() + 5, unmoved.end()), 1e-4,
              "baseline -> " + native);
}

// A flipped byte, then a truncated shard, in the newest step: each is named
// in one warning line and the previous complete step is restored.
TEST_F(TrainCommandTest, CorruptCheckpointFallsBackToThePreviousStep) {
  const std::vector<std::string> base = {"run_name=c", "checkpoint_period=5",
                                         "per_device_batch_size=4",
                                         "max_num_checkpoints_to_keep=5"};
  auto with_steps = [&](int steps) {
    return With(base, {"steps=" + std::to_string(steps)});
  };
  // Trains on to `steps`; expects a warning that step `skipped` was skipped,
  // naming `file`, and the restore of step `restored`.
  auto expect_fallback = [&](int steps, const std::string& name, int skipped,
                             const std::string& file, int restored) {
    Child c = Spawn(Args(with_steps(steps)), {}, dir_.path(), name);
    ASSERT_EQ(WaitExit(c, 240), 0) << ReadFile(c.err);
    const std::string err = ReadFile(c.err);
    EXPECT_NE(
        err.find("checkpoint step " + std::to_string(skipped) + " skipped"),
        std::string::npos)
        << err;
    EXPECT_NE(err.find(file), std::string::npos) << err;
    EXPECT_NE(
        ReadFile(c.out).find("\"restored_step\":" + std::to_string(restored)),
        std::string::npos);
  };
  Train(with_steps(10), "first");
  const std::string shard = RunDir("c") + "/checkpoints/10/host0.bin";
  ASSERT_TRUE(fs::exists(shard));
  const auto size = fs::file_size(shard);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x10;
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.write(&byte, 1);
  }
  ASSERT_NO_FATAL_FAILURE(expect_fallback(12, "flipped", 10, "host0.bin", 5));

  // That run saved steps 10 and 12 afresh; now truncate step 12's shard.
  const std::string shard12 = RunDir("c") + "/checkpoints/12/host0.bin";
  ASSERT_TRUE(fs::exists(shard12));
  fs::resize_file(shard12, fs::file_size(shard12) / 3);
  expect_fallback(14, "truncated", 12, "12/host0.bin", 10);
}

// A full disk at the third save (step 15; steps 5 and 10 are on disk, as a
// run that stopped after step 10 leaves them): host0.bin (1 MiB) runs into a
// 256 KiB file size limit. The background save's failure is noticed at the
// next step boundary (step 16, not at the next save), the run ends with exit
// code 1 and one sentence naming the file, strerror's text and step 10, no
// trace of step 15 is left, and the same command without the fault resumes
// from step 10 with the uninterrupted run's losses, bit for bit.
TEST_F(TrainCommandTest, FailedSaveStopsAtTheNextStepAndResumesFromTheLast) {
  const std::vector<std::string> args = {"steps=24", "checkpoint_period=5",
                                         "per_device_batch_size=4",
                                         "max_num_checkpoints_to_keep=5"};
  auto named = [&](const std::string& run) {
    return With(args, {"run_name=" + run});
  };
  const std::vector<double> uninterrupted = Losses(Train(named("a"), "a"));
  ASSERT_EQ(uninterrupted.size(), 24u);
  fs::copy(RunDir("a"), RunDir("b"), fs::copy_options::recursive);
  for (const char* step : {"15", "20", "24"}) {
    fs::remove_all(RunDir("b") + "/checkpoints/" + step);
  }
  fs::remove(RunDir("b") + "/metrics.jsonl");

  // The step delay gives the writer time to fail before step 16 begins.
  Child full = SpawnWithLimit(RLIMIT_FSIZE, 256 << 10, Args(named("b")),
                              {"MULTISLICE_TEST_STEP_DELAY_MS=200"},
                              dir_.path(), "b-full");
  EXPECT_EQ(WaitExit(full, 240), 1);
  const std::string err = ReadFile(full.err);
  const std::string sentence =
      "multislice train: checkpoint of step 15 failed: " + RunDir("b") +
      "/checkpoints/15.tmp/host0.bin: write failed: File too large; the last "
      "good checkpoint is step 10\n";
  EXPECT_NE(err.find(sentence), std::string::npos) << err;
  EXPECT_EQ(Count(err, "checkpoint of step 15 failed"), 1u) << err;
  std::cout << "stderr of the run on the full disk:\n" << err << std::flush;
  EXPECT_EQ(LastMetricsStep(RunDir("b")), 15) << "stopped at step 16";
  EXPECT_FALSE(fs::exists(RunDir("b") + "/checkpoints/15.tmp"));
  EXPECT_FALSE(fs::exists(RunDir("b") + "/checkpoints/15"));
  EXPECT_EQ(CompleteSteps(RunDir("b")), (std::vector<int64_t>{5, 10}));

  nlohmann::json resumed = Train(named("b"), "b-second");
  EXPECT_EQ(resumed.value("restored_step", int64_t{-1}), 10);
  ExpectLossesFrom(resumed, 10, uninterrupted);
}

// metrics.jsonl on a full disk (/dev/full: every write is ENOSPC): the run
// ends with exit code 1 and one sentence instead of losing the record, and
// the step whose record was lost is not committed as a checkpoint, so the
// rerun on a disk with room trains and logs it.
TEST_F(TrainCommandTest, MetricsWriteFailureStopsTheRun) {
  const std::vector<std::string> args = {"run_name=m",
                                         "steps=4",
                                         "checkpoint_period=1",
                                         "--num_slices",
                                         "1",
                                         "dcn_data_parallelism=1",
                                         "per_device_batch_size=4",
                                         "--accelerator_type",
                                         "cpu-1"};
  fs::create_directories(RunDir("m"));
  fs::create_symlink("/dev/full", RunDir("m") + "/metrics.jsonl");
  Child full = Spawn(Args(args), {}, dir_.path(), "m-full");
  EXPECT_EQ(WaitExit(full, 240), 1);
  const std::string err = ReadFile(full.err);
  EXPECT_NE(err.find("multislice train: the metrics record of step 1 could "
                     "not be written: cannot write " +
                     RunDir("m") +
                     "/metrics.jsonl: No space left on device; there is no "
                     "complete checkpoint yet\n"),
            std::string::npos)
      << err;
  std::cout << "stderr of the run on the full disk:\n" << err << std::flush;
  EXPECT_EQ(CompleteSteps(RunDir("m")), std::vector<int64_t>{});

  fs::remove(RunDir("m") + "/metrics.jsonl");
  nlohmann::json rerun = Train(args, "m-rerun");
  EXPECT_EQ(rerun.value("restored_step", int64_t{0}), -1);
  auto records = train::MetricsWriter::ReadAll(RunDir("m") + "/metrics.jsonl");
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 4u);
  EXPECT_EQ(records->front().value("step", 0), 1);
}

// A configuration that does not fit in the memory available (here set with
// MULTISLICE_MEMORY_LIMIT_BYTES) is refused before any worker starts: one
// line with the estimate, its terms and the memory available; exit code 2.
TEST_F(TrainCommandTest, ConfigThatDoesNotFitInMemoryIsRefused) {
  Child c =
      Spawn(Args({"run_name=big", "per_device_batch_size=64"}),
            {"MULTISLICE_MEMORY_LIMIT_BYTES=100000000"}, dir_.path(), "big");
  EXPECT_EQ(WaitExit(c, 60), 2);
  const std::string err = ReadFile(c.err);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(err.rfind("multislice train: this configuration needs about ", 0),
            0u)
      << err;
  for (const char* part :
       {"for its 2 local slices", "weights and optimizer ", "activations ",
        " for 1 device x batch 64", "checkpoint staging ",
        "; this machine has 95 MiB available (MULTISLICE_MEMORY_LIMIT_BYTES); "
        "lower per_device_batch_size or max_target_length"}) {
    EXPECT_NE(err.find(part), std::string::npos) << part << "\n" << err;
  }
  std::cout << err << std::flush;
  EXPECT_FALSE(fs::exists(RunDir("big") + "/config.json"));
}

// MaxText's llama2-7b model file is refused here with an estimate of its
// real size: its 6,738,415,616 f32 weights, gradient and two AdamW moments
// alone are 16 bytes a parameter (100.4 GiB), on each of the 2 slices.
TEST_F(TrainCommandTest, Llama2SevenBIsRefusedWithItsRealSize) {
  Child c = Spawn(Args({"run_name=big", "model_name=llama2-7b"}), {},
                  dir_.path(), "big");
  EXPECT_EQ(WaitExit(c, 120), 2);
  const std::string err = ReadFile(c.err);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  const std::string what = "weights and optimizer ";
  const size_t at = err.find(what);
  ASSERT_NE(at, std::string::npos) << err;
  const double gib = std::stod(err.substr(at + what.size()));
  const double floor_gib = 16.0 * 6738415616.0 / (1 << 30);
  EXPECT_GE(gib, floor_gib) << err;
  EXPECT_LE(gib, 1.3 * floor_gib) << err;
  EXPECT_NE(err.find("for its 2 local slices"), std::string::npos) << err;
}

// An allocation that fails during training (the check passed: the memory
// limit is set far above what the host has, and the process may hold only
// 8 GiB of data; the 32 GiB logits of 4096 x 32 tokens x a 65536-entry
// vocabulary fail at once, before any of them is touched) ends the run with
// one sentence about memory and exit code 1, not a raw std::bad_alloc.
TEST_F(TrainCommandTest, OutOfMemoryDuringTrainingIsOneSentence) {
  Child c = SpawnWithLimit(
      RLIMIT_DATA, rlim_t{8} << 30,
      Args({"run_name=oom", "steps=2", "per_device_batch_size=4096",
            "emb_dim=16", "num_heads=2", "num_decoder_layers=1", "mlp_dim=32",
            "vocab_size=65536", "dcn_data_parallelism=1", "--num_slices", "1",
            "--accelerator_type", "cpu-1"}),
      {"MULTISLICE_MEMORY_LIMIT_BYTES=1000000000000000"}, dir_.path(), "oom");
  EXPECT_EQ(WaitExit(c, 120), 1);
  const std::string err = ReadFile(c.err);
  EXPECT_NE(err.find("multislice train: out of memory at step 1 (an "
                     "allocation failed); this configuration needs about "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("lower per_device_batch_size or max_target_length, or "
                     "free memory on the host\n"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("bad_alloc"), std::string::npos) << err;
  std::cout << err << std::flush;
}

// The estimate is honest: within [0.5x, 2x] of the peak RSS of real runs,
// one f32 device, two bf16 devices with fsdp, tensor 2 and a GPipe pipeline
// of 2 stages (the launcher's and the worker's largest peak, from wait4).
TEST_F(TrainCommandTest, MemoryEstimateMatchesPeakRss) {
  const std::vector<std::string> common = {"steps=2",
                                           "checkpoint_period=1",
                                           "eval_batches=1",
                                           "max_target_length=128",
                                           "emb_dim=128",
                                           "mlp_dim=512",
                                           "dcn_data_parallelism=1",
                                           "--num_slices",
                                           "1"};
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"rss-f32", {"per_device_batch_size=32", "--accelerator_type", "cpu-1"}},
      {"rss-bf16-fsdp2",
       {"dtype=bf16", "per_device_batch_size=16", "ici_fsdp_parallelism=2",
        "--accelerator_type", "cpu-2"}},
      // Each of the 2 devices trains its group's 32 rows on half the heads
      // and half the MLP.
      {"rss-f32-tensor2",
       {"per_device_batch_size=16", "ici_tensor_parallelism=2",
        "--accelerator_type", "cpu-2"}},
      // Two stages, GPipe: each keeps the models of all 8 microbatches.
      {"rss-f32-gpipe2",
       {"per_device_batch_size=16", "ici_pipeline_parallelism=2",
        "ici_fsdp_parallelism=1", "num_pipeline_microbatches=8",
        "pipeline_parallel_schedule=GPipe", "--accelerator_type", "cpu-2"}},
      // Two DiLoCo replicas in the slice, streaming with an overlapped
      // sync: the outer state's four buffers per device.
      {"rss-f32-diloco2",
       {"per_device_batch_size=16", "ici_diloco_parallelism=2",
        "ici_fsdp_parallelism=1", "enable_diloco=true",
        "enable_streaming_diloco=true", "diloco_sync_period=4",
        "num_diloco_fragments=2", "num_communication_overlapping_steps=1",
        "--accelerator_type", "cpu-2"}}};
  // Under an ISA cap (the @avx2 and @baseline runs) only the first two
  // cases (one f32, one bf16: the buffers that depend on the matmul
  // route); the other f32 meshes allocate alike at every level.
  const bool capped = std::getenv("MULTISLICE_MAX_ISA") != nullptr;
  for (const auto& [name, extra] : cases) {
    if (capped && name != "rss-f32" && name != "rss-bf16-fsdp2") {
      continue;
    }
    Child c = Spawn(Args(With(With(common, extra), {"run_name=" + name})), {},
                    dir_.path(), name);
    rusage usage{};
    ASSERT_EQ(WaitExitWithUsage(c, 240, &usage), 0) << ReadFile(c.err);
    const nlohmann::json summary =
        nlohmann::json::parse(testing_util::LastJsonLine(ReadFile(c.out)));
    const double estimate = summary.value("memory_estimate_bytes", 0.0);
    const double measured = static_cast<double>(usage.ru_maxrss) * 1024;
    const double ratio = estimate / measured;
    std::cout << name << ": estimate " << estimate / (1 << 20)
              << " MiB, peak RSS " << measured / (1 << 20) << " MiB, ratio "
              << ratio << std::endl;
    RecordProperty(name + "_estimate_over_rss", std::to_string(ratio));
    EXPECT_GE(ratio, 0.5) << name;
    EXPECT_LE(ratio, 2.0) << name;
  }
}

// Bad configs end in one line on stderr and exit code 2, before any worker.
TEST_F(TrainCommandTest, BadConfigIsOneLineAndExitCode2) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"run_name=x", "stepz=3"}, "stepz"},
      {{"run_name=x", "steps=many"}, "many"},
      {{"run_name=x", "ici_fsdp_parallelism=3", "--accelerator_type", "cpu-2"},
       "3"},
      {{"run_name=x", "dataset_path=/nonexistent/data"}, "/nonexistent/data"},
      // Tensor parallelism that does not split the heads (tiny.yml: 2).
      {{"run_name=x", "ici_tensor_parallelism=4", "dcn_data_parallelism=1",
        "--num_slices", "1", "--accelerator_type", "cpu-4"},
       "ici_tensor_parallelism (4)"},
      // -1 that resolves to a tensor size that does not split them.
      {{"run_name=x", "ici_fsdp_parallelism=1", "ici_tensor_parallelism=-1",
        "dcn_data_parallelism=1", "--num_slices", "1", "--accelerator_type",
        "cpu-3"},
       "ici_tensor_parallelism (3)"},
      // Stages that do not divide the layers (tiny.yml: 2), a -1 that
      // resolves to such, microbatches that do not divide the rows.
      {{"run_name=x", "ici_pipeline_parallelism=3", "ici_fsdp_parallelism=1",
        "dcn_data_parallelism=1", "--num_slices", "1", "--accelerator_type",
        "cpu-3"},
       "= 3 stages: expected a divisor of num_decoder_layers (2)"},
      {{"run_name=x", "dcn_pipeline_parallelism=-1", "dcn_data_parallelism=1",
        "--num_slices", "4", "--accelerator_type", "cpu-1"},
       "= 4 stages: expected a divisor of num_decoder_layers (2)"},
      {{"run_name=x", "ici_pipeline_parallelism=2", "ici_fsdp_parallelism=1",
        "dcn_data_parallelism=1", "per_device_batch_size=3",
        "num_pipeline_microbatches=4", "--num_slices", "1",
        "--accelerator_type", "cpu-2"},
       "'num_pipeline_microbatches' = 4: expected a divisor of the 6 rows"},
      // A -1 that resolves to stages on both levels.
      {{"run_name=x", "ici_pipeline_parallelism=-1", "ici_fsdp_parallelism=1",
        "dcn_pipeline_parallelism=2", "dcn_data_parallelism=1", "--num_slices",
        "2", "--accelerator_type", "cpu-2"},
       "keys ici_pipeline_parallelism (2) x dcn_pipeline_parallelism (2): "
       "expected at most one of them above 1"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train", data_->path() + "/tiny.yml",
                                     "base_output_directory=" + dir_.path()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Child child = Spawn(args, {}, dir_.path(), "bad");
    EXPECT_EQ(WaitExit(child, 60), 2) << c.expected;
    const std::string err = ReadFile(child.err);
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find(c.expected), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(dir_.path() + "/x/config.json"));
  }
}

// The first line names the CPU's ISA level and the matmul route, with the
// cap and the explicit bfloat16 noted on the lines after it; every dtype
// spelling trains, and the JSON names the route the same way.
// Issue 13 (first-hour trap): a 1-step run printed "0.000 s/step, 0
// tokens/s, MFU 0.0%"; the first step is start-up, so it now says there are
// too few steps for those figures.
TEST_F(TrainCommandTest, OneStepRunPrintsNoZeroFigures) {
  std::vector<std::string> args = {"train",
                                   data_->path() + "/tiny.yml",
                                   "base_output_directory=" + dir_.path(),
                                   "dataset_path=" + data_->path() + "/ds",
                                   "run_name=one",
                                   "steps=1",
                                   "eval_interval=-1",
                                   "--num_slices",
                                   "1"};
  Child c = Spawn(args, {}, dir_.path(), "one");
  ASSERT_EQ(WaitExit(c, 240), 0) << ReadFile(c.err);
  const std::string out = ReadFile(c.out);
  EXPECT_NE(out.find("done, steps 1-1"), std::string::npos) << out;
  EXPECT_NE(out.find("too few steps for step-time"), std::string::npos) << out;
  // eval_interval -1 (MaxText's): no evaluation, said in words, not as -1.
  EXPECT_NE(out.find("loss "), std::string::npos) << out;
  EXPECT_NE(out.find(", no evaluation "), std::string::npos) << out;
  EXPECT_EQ(out.find("val_loss -1"), std::string::npos) << out;
  EXPECT_EQ(out.find("MFU 0.0%"), std::string::npos) << out;
  // " 0 tokens/s", not "0 tokens/s": 35590 tokens/s is a real figure.
  EXPECT_EQ(out.find(" 0 tokens/s"), std::string::npos) << out;
}

// Issue 13 (first-hour trap): running a finished run again ("nothing to
// do") rewrote loss.svg as empty axes. The plot is redrawn from
// metrics.jsonl: the same file as the run's own.
TEST_F(TrainCommandTest, NothingToDoKeepsTheLossPlot) {
  const std::vector<std::string> args = {"run_name=plot", "steps=3",
                                         "--num_slices", "1"};
  Train(args, "plot-first");
  const std::string plot = ReadFile(RunDir("plot") + "/loss.svg");
  ASSERT_NE(plot.find("<polyline"), std::string::npos) << plot;
  nlohmann::json again = Train(args, "plot-again");
  EXPECT_EQ(again.value("restored_step", int64_t{-1}), 3);
  EXPECT_EQ(ReadFile(RunDir("plot") + "/loss.svg"), plot);
}

// Issue 13: a second training of the same run directory interleaved
// metrics.jsonl and collided on checkpoints. Worker 0 of the first holds the
// directory's lock; the second exits 1 with one sentence naming the
// directory and that worker's pid, before writing anything. A killed holder
// leaves no stale lock: the next run resumes.
TEST_F(TrainCommandTest, SecondTrainingOfARunDirectoryIsRefused) {
  const std::vector<std::string> args = {
      "run_name=busy", "steps=40", "checkpoint_period=5",
      "--num_slices",  "1",        "--accelerator_type",
      "cpu-1"};
  Child first = Spawn(Args(args), {"MULTISLICE_TEST_STEP_DELAY_MS=200"},
                      dir_.path(), "busy-first");
  ASSERT_TRUE(WaitForFile(RunDir("busy") + "/metrics.jsonl", 120))
      << ReadFile(first.err);
  const std::vector<pid_t> workers = Workers(first);
  ASSERT_EQ(workers.size(), 1u);
  const size_t records =
      train::MetricsWriter::ReadAll(RunDir("busy") + "/metrics.jsonl")->size();

  Child second = Spawn(Args(args), {}, dir_.path(), "busy-second");
  EXPECT_EQ(WaitExit(second, 60), 1);
  const std::string err = ReadFile(second.err);
  EXPECT_EQ(Count(err, "\n"), 1u) << err;
  EXPECT_NE(err.find("the run directory " + RunDir("busy") +
                     " is in use by another training (pid " +
                     std::to_string(workers[0])),
            std::string::npos)
      << err;
  // Only the first training's records: one per step, in order.
  auto all = train::MetricsWriter::ReadAll(RunDir("busy") + "/metrics.jsonl");
  ASSERT_TRUE(all.ok());
  ASSERT_GE(all->size(), records);
  for (size_t i = 0; i < all->size(); ++i) {
    EXPECT_EQ((*all)[i].value("step", int64_t{0}), static_cast<int64_t>(i + 1));
  }

  // kill -9 of the holder; the launcher reaps it before it exits.
  ::kill(workers[0], SIGKILL);
  EXPECT_EQ(WaitExit(first, 60), 128 + SIGKILL);
  nlohmann::json resumed = Train(args, "busy-third");
  EXPECT_EQ(resumed.value("last_step", int64_t{0}), 40);
}

// Issue 13: Ctrl-C stopped the run without a word about what was saved, a
// resume logged its steps again with the same attempt, and a new `steps`
// stretched the schedule silently. Now: the interrupt names the newest
// committed checkpoint and the command that resumes; every record carries
// its start's "resume", the record of the highest one counting for each
// step; changing steps on resume is one warning with both values.
TEST_F(TrainCommandTest, CtrlCSaysHowToResumeAndTheResumeIsTold) {
  const std::vector<std::string> args = {
      "run_name=ctrlc", "steps=30", "checkpoint_period=5",
      "--num_slices",   "1",        "--accelerator_type",
      "cpu-1"};
  Child victim = Spawn(Args(args), {"MULTISLICE_TEST_STEP_DELAY_MS=150"},
                       dir_.path(), "ctrlc-first");
  ASSERT_TRUE(WaitForFile(RunDir("ctrlc") + "/checkpoints/5/COMMITTED", 120))
      << ReadFile(victim.err);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ::kill(victim.pid, SIGINT);  // the launcher, as a terminal's Ctrl-C
  EXPECT_EQ(WaitExit(victim, 60), 128 + SIGINT);
  const std::vector<int64_t> complete = CompleteSteps(RunDir("ctrlc"));
  ASSERT_FALSE(complete.empty());
  const int64_t newest = complete.back();
  const std::string err = ReadFile(victim.err);
  EXPECT_NE(err.find("multislice train: interrupted (Ctrl-C); the newest "
                     "committed checkpoint is step " +
                     std::to_string(newest) + " (" + RunDir("ctrlc") +
                     "/checkpoints/" + std::to_string(newest) +
                     "); resume with: " + testing_util::Binary() + " train "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(" run_name=ctrlc steps=30 "), std::string::npos) << err;

  Child second =
      Spawn(Args(With(args, {"steps=40"})), {}, dir_.path(), "ctrlc-second");
  ASSERT_EQ(WaitExit(second, 240), 0) << ReadFile(second.err);
  const std::string warned = ReadFile(second.err);
  EXPECT_NE(warned.find("multislice train: warning: steps changed from 30 to "
                        "40 since this run's last start: the learning-rate "
                        "schedule is recomputed"),
            std::string::npos)
      << warned;

  auto records =
      train::MetricsWriter::ReadAll(RunDir("ctrlc") + "/metrics.jsonl");
  ASSERT_TRUE(records.ok());
  const int64_t last_first = [&] {
    int64_t last = 0;
    for (const nlohmann::json& r : *records) {
      if (r.value("resume", -1) == 0) last = r.value("step", int64_t{0});
    }
    return last;
  }();
  EXPECT_GT(last_first, newest) << "the interrupt came right at a checkpoint";
  const std::vector<nlohmann::json> current =
      train::CurrentStepRecords(*records);
  ASSERT_EQ(current.size(), 40u);
  for (const nlohmann::json& r : current) {
    const int64_t step = r.value("step", int64_t{0});
    EXPECT_EQ(r.value("resume", -1), step <= newest ? 0 : 1) << step;
  }
}

// Issue 13: an empty run_name picked a new timestamp at every start, so the
// same command never resumed. The launcher names the run and the command
// that resumes it, and that command does.
TEST_F(TrainCommandTest, EmptyRunNameSaysTheNameAndHowToResume) {
  const std::vector<std::string> args = {"steps=2", "--num_slices", "1"};
  Child first = Spawn(Args(args), {}, dir_.path(), "unnamed");
  ASSERT_EQ(WaitExit(first, 240), 0) << ReadFile(first.err);
  const std::string err = ReadFile(first.err);
  const std::string intro =
      "multislice train: run_name is empty, so this run is named ";
  const size_t at = err.find(intro);
  ASSERT_NE(at, std::string::npos) << err;
  const std::string name = err.substr(
      at + intro.size(), err.find(' ', at + intro.size()) - at - intro.size());
  EXPECT_EQ(name.rfind("run-", 0), 0u) << err;
  EXPECT_NE(err.find("resume it with: " + testing_util::Binary() + " train "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(" run_name=" + name + "\n"), std::string::npos) << err;
  nlohmann::json again = Train(With(args, {"run_name=" + name}), "named");
  EXPECT_EQ(again.value("restored_step", int64_t{-1}), 2);
}

// Issue 13: `multislice plan` recommends dcn_pipeline_parallelism=1, which
// train refused as an unknown key; its recommendation now pastes into train.
TEST_F(TrainCommandTest, PlanRecommendationPastesIntoTrain) {
  Child plan =
      Spawn({"plan", "--accelerator_type", "v4-16", "--num_slices", "2",
             "--parameters", "16e9", "--tokens_per_slice", "350k"},
            {}, dir_.path(), "plan");
  ASSERT_EQ(WaitExit(plan, 60), 0) << ReadFile(plan.err);
  const std::string out = ReadFile(plan.out);
  const size_t line = out.find("Recommendation: ");
  ASSERT_NE(line, std::string::npos) << out;
  const size_t open = out.find('(', line), close = out.find(')', open);
  std::istringstream keys(out.substr(open + 1, close - open - 1));
  std::vector<std::string> args = {"run_name=planned",
                                   "steps=1",
                                   "per_device_batch_size=2",
                                   "--num_slices",
                                   "2",
                                   "--accelerator_type",
                                   "cpu-1"};
  for (std::string key; keys >> key;) args.push_back(key);
  ASSERT_NE(std::find(args.begin(), args.end(), "dcn_pipeline_parallelism=1"),
            args.end())
      << out;
  nlohmann::json result = Train(args, "planned");
  EXPECT_EQ(result.value("last_step", int64_t{0}), 1);
}

TEST_F(TrainCommandTest, FirstLineNamesIsaAndMatmulRoute) {
  const std::string level = DetectedIsa() >= Isa::kAvx2
                                ? "avx2"
                                : std::string(IsaName(DetectedIsa()));
  std::vector<std::string> args = {"train",
                                   data_->path() + "/tiny.yml",
                                   "base_output_directory=" + dir_.path(),
                                   "dataset_path=" + data_->path() + "/ds",
                                   "run_name=text",
                                   "steps=2",
                                   "dtype=bf16",
                                   "--num_slices",
                                   "1"};
  Child c = Spawn(args, {"MULTISLICE_MAX_ISA=" + level}, dir_.path(), "text");
  ASSERT_EQ(WaitExit(c, 240), 0) << ReadFile(c.err);
  const std::string out = ReadFile(c.out);
  const std::string first = out.substr(0, out.find('\n'));
  EXPECT_NE(first.find(", ISA " + level), std::string::npos) << first;
  EXPECT_NE(first.find("matmul bfloat16 via float32 kernels (" + level + ")"),
            std::string::npos)
      << first;
  const std::string second = out.substr(
      first.size() + 1, out.find('\n', first.size() + 1) - first.size() - 1);
  EXPECT_EQ(second.rfind("multislice train: note: dtype bfloat16 on a CPU "
                         "without bf16 matmul instructions",
                         0),
            0u)
      << out;
  // Not a terminal: the step lines carry the ETA themselves.
  EXPECT_NE(out.find("step 1/2  loss "), std::string::npos) << out;
  const std::string step1 = out.substr(out.find("step 1/2  loss "));
  EXPECT_NE(step1.substr(0, step1.find('\n')).find("  ETA "), std::string::npos)
      << step1;

  nlohmann::json summary = Train(
      {"run_name=spelling", "steps=2", "dtype=float32", "--num_slices", "1"},
      "spelling", {"MULTISLICE_MAX_ISA=" + level});
  EXPECT_EQ(summary["platform"]["matmul"], "float32 (" + level + ")");
  EXPECT_EQ(nlohmann::json::parse(
                ReadFile(RunDir("spelling") + "/config.json"))["dtype"],
            "float32");
}

}  // namespace
}  // namespace multislice
