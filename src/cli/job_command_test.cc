// The self-healing training job, end to end on local hosts (issue 6):
// `multislice controller` with 3 local hosts, `multislice job` training a
// tiny model on 2 slices; mid-training `multislice admin fail-host` takes
// down slice 1's host. Nothing else is done by hand: the controller replaces
// the slice and restarts both, the startup script reruns the trainer, which
// resumes; the job ends by itself. Every step's final loss equals the
// uninterrupted run's (f32, bit for bit), and goodput.json accounts for the
// failure, in ml-goodput-measurement's buckets that sum to the wall time.
// With in-memory recovery, the restored step is newer than the
// last checkpoint and came from slice 0's replica.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "common/temp_dir.h"
#include "control/agent/local_cluster_test_util.h"
#include "control/http.h"
#include "runtime/hang_digest.h"
#include "train/metrics.h"

namespace multislice {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_util::Child;
using testing_util::ReadFile;
using testing_util::Spawn;
using testing_util::WaitExit;

constexpr char kQueuedResources[] =
    "/v2alpha1/projects/local/locations/local-a/queuedResources/";

template <typename F>
bool WaitUntil(F done, double seconds) {
  const auto deadline =
      testing_util::Clock::now() + std::chrono::duration<double>(seconds);
  while (testing_util::Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

class JobCommandTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir("multislice-job-data-");
    Child prep = Spawn({"data", "prepare", "--output", data_->path() + "/ds"},
                       {}, data_->path(), "prepare");
    ASSERT_EQ(WaitExit(prep, 120), 0) << ReadFile(prep.err);
    std::ofstream(data_->path() + "/tiny.yml")
        << "emb_dim: 64\nnum_heads: 2\nnum_decoder_layers: 2\nmlp_dim: 128\n"
           "max_target_length: 32\ndtype: f32\nwarmup_steps: 2\n"
           "learning_rate: 3.0e-3\neval_interval: 1000\nsteps: 40\n"
           "checkpoint_period: 10\nper_device_batch_size: 4\n";
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(
        controller_.Start(3, "cpu-1", {"--heartbeat-timeout", "1"}).ok());
    url_ = controller_.url();
    token_file_ = controller_.token_file();
    client_.emplace(*control::ApiClient::Create(url_, controller_.token(),
                                                std::chrono::seconds(5)));
    ASSERT_TRUE(WaitUntil(
        [&] {
          auto r = client_->Call("GET", "/internal/v1/hosts");
          return r.ok() && r->body.value("hosts", json::array()).size() == 3;
        },
        20));
  }

  void TearDown() override { EXPECT_TRUE(controller_.Stop().ok()); }

  // The uninterrupted run: the same trainer on 2 local slices.
  std::vector<double> ReferenceLosses(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "train", data_->path() + "/tiny.yml",
        "base_output_directory=" + dir_.path() + "/ref", "run_name=ref",
        "dataset_path=" + data_->path() + "/ds"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--json");
    Child ref = Spawn(args, {}, dir_.path(), "reference");
    EXPECT_EQ(WaitExit(ref, 240), 0) << ReadFile(ref.err);
    const std::string out = ReadFile(ref.out);
    return json::parse(testing_util::LastJsonLine(out))
        .value("losses", std::vector<double>{});
  }

  // Runs the job, fails slice 1's host once `fail_after` steps are in
  // metrics.jsonl, waits for the job; returns the job's directory.
  std::string RunJobWithAFailure(const std::string& run,
                                 const std::vector<std::string>& extra,
                                 int fail_after) {
    std::string command = "MULTISLICE_TEST_STEP_DELAY_MS=150 " +
                          testing_util::Binary() + " train " + data_->path() +
                          "/tiny.yml base_output_directory=$MULTISLICE_OUTPUT_"
                          "DIR run_name=$MULTISLICE_RUN_NAME dataset_path=" +
                          data_->path() + "/ds";
    for (const std::string& e : extra) command += " " + e;
    fs::create_directories(dir_.path() + "/code");
    std::ofstream(dir_.path() + "/code/README") << "the job's code\n";
    const std::string out = dir_.path() + "/out";
    Child job = Spawn({"job",
                       "--controller",
                       url_,
                       "--token-file",
                       token_file_,
                       "--accelerator_type",
                       "cpu-1",
                       "--num_slices",
                       "2",
                       "--output_dir",
                       out,
                       "--run_name",
                       run,
                       "--script_dir",
                       dir_.path() + "/code",
                       "--command",
                       command,
                       "--failure_grace_seconds",
                       "30",
                       "--timeout_seconds",
                       "300"},
                      {}, dir_.path(), "job-" + run);
    const std::string job_dir = out + "/" + run;
    const std::string metrics = job_dir + "/metrics.jsonl";
    EXPECT_TRUE(WaitUntil(
        [&] {
          std::ifstream in(metrics);
          return std::count(std::istreambuf_iterator<char>(in),
                            std::istreambuf_iterator<char>(),
                            '\n') >= fail_after;
        },
        120))
        << ReadFile(job.out) << ReadFile(job.err);
    auto qr =
        client_->Call("GET", kQueuedResources + std::string("job-") + run);
    EXPECT_TRUE(qr.ok() && qr->status == 200);
    const std::string host = qr->body["nodes"][1]["hosts"][0];
    failed_at_ = std::chrono::duration<double>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
    Child fail = Spawn({"admin", "fail-host", host, "--controller", url_,
                        "--token-file", token_file_},
                       {}, dir_.path(), "fail-host");
    EXPECT_EQ(WaitExit(fail, 30), 0) << ReadFile(fail.err);
    EXPECT_EQ(WaitExit(job, 300), 0) << ReadFile(job.out) << ReadFile(job.err);
    return job_dir;
  }

  static TempDir* data_;
  TempDir dir_{"multislice-job-test-"};
  control::testing::LocalController controller_{testing_util::Binary(),
                                                dir_.path()};
  std::string url_, token_file_;
  double failed_at_ = 0;  // Unix seconds of the fail-host command
  std::optional<control::ApiClient> client_;
};

TempDir* JobCommandTest::data_ = nullptr;

struct JobRecords {
  std::map<int64_t, double> final_loss;  // the last record of each step
  std::map<int, int> steps_per_attempt;
  double last_attempt_first_step_start = 0;  // Unix seconds
};

JobRecords ReadRecords(const std::string& job_dir) {
  JobRecords r;
  auto all = train::MetricsWriter::ReadAll(job_dir + "/metrics.jsonl");
  EXPECT_TRUE(all.ok());
  if (!all.ok()) return r;
  for (const json& record : *all) {
    if (!record.contains("step")) continue;
    r.final_loss[record["step"].get<int64_t>()] = record["loss"].get<double>();
    const int attempt = record.value("attempt", 0);
    if (r.steps_per_attempt.empty() ||
        attempt > r.steps_per_attempt.rbegin()->first) {
      r.last_attempt_first_step_start =
          record.value("time", 0.0) - record.value("step_time_s", 0.0);
    }
    ++r.steps_per_attempt[attempt];
  }
  return r;
}

// goodput.json's buckets (train/goodput.h) with the productive time add up
// to the wall time, the recovery's parts to the recovery, and the failure
// cost both wasted progress and a recovery.
void ExpectBucketsSumToTheWallTime(const json& goodput) {
  const json& badput = goodput["badput"];
  const json& recovery = badput["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"];
  double sum = goodput.value("productive_seconds", 0.0);
  for (const auto& [name, value] : badput.items()) {
    sum +=
        value.is_object() ? value.value("seconds", 0.0) : value.get<double>();
  }
  const double wall = goodput.value("wall_seconds", 0.0);
  EXPECT_NEAR(sum, wall, 1e-6 * wall) << goodput.dump(2);
  EXPECT_NEAR(recovery.value("detection_seconds", 0.0) +
                  recovery.value("repair_seconds", 0.0) +
                  recovery.value("restart_seconds", 0.0) +
                  recovery.value("unsplit_seconds", 0.0),
              recovery.value("seconds", -1.0), 1e-9);
  EXPECT_GT(recovery.value("seconds", 0.0), 0.0) << goodput.dump(2);
  EXPECT_EQ(badput.size(), 9u);
}

void ExpectSameLosses(const JobRecords& job, const std::vector<double>& ref) {
  ASSERT_EQ(job.final_loss.size(), ref.size());
  for (const auto& [step, loss] : job.final_loss) {
    EXPECT_EQ(loss, ref[step - 1]) << "step " << step;
  }
}

TEST_F(JobCommandTest, SelfHealingJobResumesFromTheCheckpoint) {
  const std::vector<double> reference = ReferenceLosses({});
  ASSERT_EQ(reference.size(), 40u);
  const std::string job_dir = RunJobWithAFailure("heal", {}, 15);
  const JobRecords records = ReadRecords(job_dir);
  ExpectSameLosses(records, reference);
  EXPECT_EQ(records.steps_per_attempt.size(), 2u) << "one restart";
  const std::string log =
      ReadFile(job_dir + "/main_command_log_slice_0_worker_0");
  EXPECT_NE(log.find("resumed from checkpoint step"), std::string::npos) << log;

  const json goodput = json::parse(ReadFile(job_dir + "/goodput.json"));
  EXPECT_EQ(goodput.value("failures", 0), 1) << goodput.dump(2);
  EXPECT_EQ(goodput.value("steps", 0), 40);
  EXPECT_GE(goodput.value("recomputed_steps", 0), 5) << goodput.dump(2);
  EXPECT_GT(goodput.value("repair_seconds", 0.0) +
                goodput.value("detection_seconds", 0.0),
            0.0);
  EXPECT_GT(goodput.value("goodput_percent", 0.0), 0.0);
  EXPECT_LT(goodput.value("goodput_percent", 100.0), 100.0);
  ExpectBucketsSumToTheWallTime(goodput);
  // `multislice goodput` on the job's directory: the job's span and states.
  Child query = Spawn({"goodput", job_dir, "--json"}, {}, dir_.path(), "gp");
  ASSERT_EQ(WaitExit(query, 60), 0) << ReadFile(query.err);
  const json again =
      json::parse(testing_util::LastJsonLine(ReadFile(query.out)));
  EXPECT_TRUE(again.value("job", false));
  EXPECT_NEAR(again.value("wall_seconds", 0.0),
              goodput.value("wall_seconds", -1.0), 1e-6);
  EXPECT_NEAR(again.value("productive_seconds", 0.0),
              goodput.value("productive_seconds", -1.0), 1e-6);
  // Issue 6's figure: host failure to the first step of the new attempt.
  const double recovery = records.last_attempt_first_step_start - failed_at_;
  std::printf(
      "host failure to the first step of attempt 2: %.2f s\n"
      "goodput.json: %s\n",
      recovery, goodput.dump().c_str());
  EXPECT_LT(recovery, 15.0);
  // The job deleted its queued resource.
  auto qr = client_->Call("GET", std::string(kQueuedResources) + "job-heal");
  ASSERT_TRUE(qr.ok());
  EXPECT_EQ(qr->status, 404);
}

TEST_F(JobCommandTest, InMemoryRecoveryRestoresANewerStepFromSlice0) {
  const std::vector<std::string> extra = {"enable_in_memory_recovery=true"};
  const std::vector<double> reference = ReferenceLosses(extra);
  ASSERT_EQ(reference.size(), 40u);
  const std::string job_dir =
      RunJobWithAFailure("memory" + std::to_string(::getpid()), extra, 15);
  const JobRecords records = ReadRecords(job_dir);
  ExpectSameLosses(records, reference);
  const std::string log =
      ReadFile(job_dir + "/main_command_log_slice_0_worker_0");
  const std::string marker = "restored step ";
  const size_t at = log.find(marker);
  ASSERT_NE(at, std::string::npos) << log;
  const int restored = std::stoi(log.substr(at + marker.size()));
  EXPECT_GE(restored, 14) << "newer than the step-10 checkpoint";
  EXPECT_NE(log.find("from the in-memory replica of data rank 0"),
            std::string::npos);
  const json goodput = json::parse(ReadFile(job_dir + "/goodput.json"));
  EXPECT_EQ(goodput.value("failures", 0), 1);
  EXPECT_LE(goodput.value("recomputed_steps", 99), 1) << goodput.dump(2);
  ExpectBucketsSumToTheWallTime(goodput);
  const double recovery = records.last_attempt_first_step_start - failed_at_;
  std::printf(
      "in-memory recovery of step %d: host failure to the first "
      "step of attempt 2: %.2f s\ngoodput.json: %s\n",
      restored, recovery, goodput.dump().c_str());
  EXPECT_LT(recovery, 15.0);
  // The failed host's memory is not cleaned by anyone else: free it.
  std::error_code ec;
  for (const auto& host : fs::directory_iterator(
           "/dev/shm/multislice-" + std::to_string(::getuid()), ec)) {
    fs::remove_all(host.path() / ("memory" + std::to_string(::getpid())), ec);
    fs::remove(host.path(), ec);  // only when empty
  }
}

// The first hour's traps, on 2 local hosts: no dataset, no trainer.
class JobTrapsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(controller_.Start(2, "cpu-1").ok()) << controller_.log();
    fs::create_directories(code_dir());
    std::ofstream(code_dir() + "/data.txt") << "payload\n";
  }
  void TearDown() override { EXPECT_TRUE(controller_.Stop().ok()); }
  std::string code_dir() { return dir_.path() + "/code"; }

  TempDir dir_{"multislice-job-traps-"};
  control::testing::LocalController controller_{testing_util::Binary(),
                                                dir_.path()};
};

TEST_F(JobTrapsTest, MaxTextSpellingsAndTheCurrentDirectoryWithItsOutputIn) {
  // multihost_job.py's flags; the script directory is the current one and
  // the job's own directory lies inside it (before, tar packed its own
  // archive: "file changed as we read it").
  auto [code, out] = controller_.Run(
      {"job",
       "--TPU_TYPE",
       "cpu-1",
       "--NUM_SLICES=2",
       "--BUCKET_NAME",
       "out",
       "--BUCKET_DIR",
       "jobs",
       "--RUN_NAME",
       "dot",
       "--SCRIPT_DIR",
       ".",
       "--ZONE",
       "local-a",
       "--PROJECT",
       "local",
       "--CQR_EXTRA_ARGS",
       "--spot",
       "--VERSION",
       "v2-alpha",
       "--COMMAND",
       "cat data.txt; find . -name 'main_command_log_*' -o -name "
       "'code.tar.gz*' | wc -l"},
      code_dir(), std::chrono::seconds(60));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("multislice job: packed .: 1 file, 8 B into "),
            std::string::npos)
      << out;
  const std::string job_dir = code_dir() + "/out/jobs/dot";
  for (int slice = 0; slice < 2; ++slice) {
    const std::string log = ReadFile(job_dir + "/main_command_log_slice_" +
                                     std::to_string(slice) + "_worker_0");
    EXPECT_NE(log.find("payload\n0\n"), std::string::npos) << log;
  }
}

TEST_F(JobTrapsTest, AFailingWorkerShowsTheEndOfItsLog) {
  auto [code, out] = controller_.Run(
      {"job", "--accelerator_type", "cpu-1", "--num_slices", "2",
       "--output_dir", dir_.path() + "/out", "--run_name", "fails",
       "--script_dir", code_dir(), "--failure_grace_seconds", "0", "--command",
       "if [ $MEGASCALE_SLICE_ID = 1 ]; then for i in $(seq 30); do echo "
       "line $i; done; echo 'Traceback: boom' >&2; exit 3; fi; sleep 30"},
      "", std::chrono::seconds(60));
  EXPECT_EQ(code, 3) << out;
  const std::string log =
      dir_.path() + "/out/fails/main_command_log_slice_1_worker_0";
  EXPECT_NE(out.find("multislice job: slice 1 worker 0 exited with code 3 "
                     "(attempt 1); the last lines of " +
                     log + ":\nline 12\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("line 30\nTraceback: boom\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("line 11\n"), std::string::npos) << out;
}

// A job whose trainer wrote the hang digest (here the digest of a stopped
// slice 1, as the runtime's analysis writes it, put in place by the
// command): `job` names the culprits and the file, in goodput.json too.
TEST_F(JobTrapsTest, AHungJobPointsAtItsHangDigest) {
  runtime::DeviceProgress progress(0);
  progress.Issued(1, "all_reduce[data]#1 grads");
  const runtime::HangDigest digest = runtime::AnalyzeHang(
      {{0, "slice 0 worker 0", "h0", {{progress.Snapshot(), 0}}}}, {0, 1},
      {"slice 0 worker 0", "slice 1 worker 0"}, 3, 3);
  std::ofstream(code_dir() + "/digest.json") << runtime::ToJson(digest).dump();
  auto [code, out] = controller_.Run(
      {"job", "--accelerator_type", "cpu-1", "--num_slices", "2",
       "--output_dir", dir_.path() + "/out", "--run_name", "hung",
       "--script_dir", code_dir(), "--failure_grace_seconds", "0", "--command",
       "if [ $MEGASCALE_SLICE_ID = 0 ]; then cp digest.json "
       "$MULTISLICE_OUTPUT_DIR/$MULTISLICE_RUN_NAME/hang_digest.json; exit 1; "
       "fi; sleep 30"},
      "", std::chrono::seconds(60));
  EXPECT_EQ(code, 1) << out;
  const std::string file = dir_.path() + "/out/hung/hang_digest.json";
  EXPECT_NE(out.find("multislice job: a collective hung (hang); suspected "
                     "culprit(s): slice 1 worker 0; hang digest: " +
                     file),
            std::string::npos)
      << out;
  const json goodput =
      json::parse(ReadFile(dir_.path() + "/out/hung/goodput.json"));
  EXPECT_EQ(goodput["hang_digest"]["file"], file) << goodput.dump(2);
  EXPECT_EQ(goodput["hang_digest"]["culprits"],
            json::array({"slice 1 worker 0"}));
}

TEST_F(JobTrapsTest, BadUpperCaseValuesNameTheFlagTyped) {
  auto [code, out] =
      controller_.Run({"job", "--TPU_TYPE", "cpu-1", "--NUM_SLICES", "0",
                       "--BUCKET_NAME", dir_.path(), "--COMMAND", "true"});
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "multislice job: --NUM_SLICES: expected 1 to 256, got 0\n");
  auto [url, url_out] =
      controller_.Run({"job", "--TPU_TYPE", "cpu-1", "--BUCKET_NAME",
                       "gs://bucket", "--COMMAND", "true"});
  EXPECT_EQ(url, 2);
  EXPECT_EQ(url_out,
            "multislice job: --BUCKET_NAME: 'gs://bucket' is a URL; expected "
            "a directory every host can read\n");
}

}  // namespace
}  // namespace multislice
