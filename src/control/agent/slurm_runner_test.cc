// `multislice run` on Slurm (slurm_runner.h) without a Slurm cluster: fake
// srun, squeue, scancel and scontrol on PATH (scripts this test writes)
// stand for a job of 4 nodes holding 2 slices of v4-16 (2 workers each).
// The fake srun runs every task of its --nodelist at once on this machine,
// each in a session of its own with the node's Slurm variables, so the
// real task driver replays the controller's real batch script
// (SlurmBatchScript). Checked: the srun steps and their flags, each
// worker's output file with the startup script's environment and working
// directory, the echo, exit codes, the stop of the other workers, of an
// earlier run and on Ctrl-C, and the refusals. The same path on a real
// cluster: slurm_controller_test.sh (phase active).
#include "control/agent/slurm_runner.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"
#include "control/process.h"
#include "control/slurm_capacity.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteExecutable(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
}

// Records its options, registers its step ("J.S|NAME|PIDS" in
// $FAKE_SLURM/steps), starts every task of --nodelist at once, each a
// session of its own (so only scancel reaches it, as on Slurm), with the
// Slurm variables a task of the job has; --input=all gives each task all
// of stdin. Each task's output is passed on in whole lines (a last one
// without a newline at its end) by a relay outside its session, as
// slurmstepd buffers it. Exits with the highest task exit code.
constexpr const char* kFakeSrun = R"sh(#!/bin/bash
opts=
while [[ $1 == --* ]]; do
  case $1 in
    --jobid=*) job=${1#*=} ;; --job-name=*) name=${1#*=} ;;
    --nodelist=*) nodes=${1#*=} ;; --input=*) input=${1#*=} ;;
    --chdir=*) chdir=${1#*=} ;;
  esac
  opts+="$1 "; shift
done
echo "srun $opts" >> "$FAKE_SLURM/calls"
stdin=/dev/null
if [ "$input" = all ]; then stdin=$(mktemp -p "$FAKE_SLURM"); cat > "$stdin"; fi
n=$(cat "$FAKE_SLURM/next_step" 2>/dev/null || echo 1)
echo $((n + 1)) > "$FAKE_SLURM/next_step"
IFS=, read -ra list <<<"$nodes"
pids=$FAKE_SLURM/pids.$n
relay() {
  while IFS= read -r l; do printf '%s\n' "$l"; done
  if [ -n "$l" ]; then printf %s "$l"; fi
}
set -o pipefail
tasks=() i=0
for node in "${list[@]}"; do
  (cd "$chdir" && SLURMD_NODENAME=$node SLURM_JOB_ID=$job SLURM_STEP_ID=$n \
     SLURM_JOB_NODELIST=h1,h2,h3,h4 SLURM_NTASKS=${#list[@]} SLURM_PROCID=$i \
     exec setsid bash -c 'echo $$ >> "$0"; exec "$@"' "$pids" "$@" \
     < "$stdin") | relay &
  tasks+=($!) i=$((i + 1))
done
until [ "$(cat "$pids" 2>/dev/null | wc -l)" = ${#list[@]} ]; do sleep 0.01; done
echo "$job.$n|$name|$(tr '\n' ' ' < "$pids")" >> "$FAKE_SLURM/steps"
code=0
for t in "${tasks[@]}"; do wait "$t"; c=$?; [ $c -gt $code ] && code=$c; done
exit $code
)sh";

// The steps with a process of a task alive (zombies aside).
constexpr const char* kFakeSqueue = R"(#!/bin/bash
echo "squeue $*" >> "$FAKE_SLURM/calls"
[ -f "$FAKE_SLURM/steps" ] || exit 0
live=" $(ps -e -o pgid=,stat= | awk '$2 !~ /^Z/ { print $1 }' | tr '\n' ' ') "
while IFS='|' read -r id name pids; do
  for p in $pids; do
    if [[ $live == *" $p "* ]]; then echo "$id|$name"; break; fi
  done
done < "$FAKE_SLURM/steps"
)";

// --signal=SIG STEP...: SIG to each task's session.
constexpr const char* kFakeScancel = R"(#!/bin/bash
echo "scancel $*" >> "$FAKE_SLURM/calls"
sig=${1#--signal=}; shift
for step in "$@"; do
  while IFS='|' read -r id name pids; do
    [ "$id" = "$step" ] || continue
    for p in $pids; do kill -"$sig" -- -"$p" 2>/dev/null; done
  done < "$FAKE_SLURM/steps"
done
exit 0
)";

// show job 7: the job as $FAKE_SLURM/job says (state, restarts); show
// hostnames A,B: one per line. Anything else (update) is refused: a run
// must not touch the job.
constexpr const char* kFakeScontrol = R"(#!/bin/bash
if [ "$1 $2" = "show job" ]; then
  echo "scontrol $*" >> "$FAKE_SLURM/calls"
  cat "$FAKE_SLURM/job"; exit 0
fi
if [ "$1 $2" = "show hostnames" ]; then tr , '\n' <<<"$3"; exit 0; fi
echo "scontrol $*" >> "$FAKE_SLURM/calls"
echo "scontrol: refused: $*" >&2; exit 1
)";

// hosts hN: the node's address, 10.9.0.N (no name service: a lookup of
// an unknown name may wait for DNS's timeout).
constexpr const char* kFakeGetent = R"(#!/bin/bash
[ "$1" = hosts ] && [[ $2 == h[0-9]* ]] || exit 2
echo "10.9.0.${2#h}     $2"
)";

class SlurmRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    const std::string bin = dir_.path() + "/bin";
    std::filesystem::create_directories(bin);
    std::filesystem::create_directories(slurm());
    std::filesystem::create_directories(work());
    std::filesystem::create_directories(scripts());
    WriteExecutable(bin + "/srun", kFakeSrun);
    WriteExecutable(bin + "/squeue", kFakeSqueue);
    WriteExecutable(bin + "/scancel", kFakeScancel);
    WriteExecutable(bin + "/scontrol", kFakeScontrol);
    WriteExecutable(bin + "/getent", kFakeGetent);
    old_path_ = std::getenv("PATH");
    ::setenv("PATH", (bin + ":" + old_path_).c_str(), 1);
    ::setenv("FAKE_SLURM", slurm().c_str(), 1);
    // The controller's batch script of a 2 x v4-16 queued resource.
    ClusterJobSpec spec;
    spec.name = "a";
    spec.run_id = "qr-abc";
    spec.slices = 2;
    spec.hosts_per_slice = 2;
    spec.accelerator_type = "v4-16";
    batch_ = work() + "/a-qr-abc.sbatch";
    std::ofstream(batch_) << SlurmBatchScript(spec, work(),
                                              work() + "/a.startup.sh");
    SetJob("RUNNING", 1);
    std::ofstream(scripts() + "/data.txt") << "payload\n";
  }
  void TearDown() override { ::setenv("PATH", old_path_.c_str(), 1); }

  std::string slurm() { return dir_.path() + "/slurm"; }
  std::string work() { return dir_.path() + "/work"; }
  std::string scripts() { return dir_.path() + "/scripts"; }
  std::string out_dir() { return dir_.path() + "/out"; }

  void SetJob(const std::string& state, int restarts) {
    std::ofstream(slurm() + "/job")
        << "JobId=7 JobName=a\n   JobState=" << state
        << " Reason=None Dependency=(null)\n   Requeue=1 Restarts=" << restarts
        << " BatchFlag=1\n   NodeList=h[1-4]\n   Command=" << batch_
        << "\n   WorkDir=" << work() << "\n";
  }

  static json QueuedResource() {
    return json{{"name", "projects/local/locations/local-a/queuedResources/a"},
                {"clusterJob", "7"},
                {"nodes",
                 {{{"nodeId", "a-0"}, {"hosts", {"h1", "h2"}}},
                  {{"nodeId", "a-1"}, {"hosts", {"h3", "h4"}}}}}};
  }

  RunOptions Options(const std::string& run, const std::string& command) {
    RunOptions o;
    o.queued_resource = "a";
    o.run_name = run;
    o.command = command;
    o.script_dir = scripts();
    o.output_dir = out_dir();
    o.poll_interval = milliseconds(20);
    o.stop_grace = milliseconds(1000);
    return o;
  }

  // Runs with out and err captured.
  struct Outcome {
    Result<int> code;
    std::string out, err;
  };
  Outcome Run(RunOptions options, const json& qr = QueuedResource()) {
    FILE* out = std::tmpfile();
    FILE* err = std::tmpfile();
    options.out = out;
    options.err = err;
    Outcome o{RunOverSlurm(options, qr), Read(out), Read(err)};
    std::fclose(out);
    std::fclose(err);
    return o;
  }
  static std::string Read(FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) {
      text.append(buf, n);
    }
    return text;
  }

  std::string OutputFile(const std::string& run, int slice, int worker) {
    char name[64];
    std::snprintf(name, sizeof name, "/output_slice_%04d_worker_%04d.txt",
                  slice, worker);
    return ReadWhole(out_dir() + "/" + run + name);
  }
  std::string WorkerDir(int slice, int worker) {
    return work() + "/workers/a." + std::to_string(slice) + "." +
           std::to_string(worker);
  }
  std::string Calls() { return ReadWhole(slurm() + "/calls"); }
  // The task sessions of the fake steps named `name`.
  std::vector<pid_t> Tasks(const std::string& name) {
    std::vector<pid_t> pids;
    std::istringstream lines(ReadWhole(slurm() + "/steps"));
    for (std::string line; std::getline(lines, line);) {
      const size_t a = line.find('|'), b = line.rfind('|');
      if (line.substr(a + 1, b - a - 1) != name) continue;
      std::istringstream words(line.substr(b + 1));
      for (pid_t p; words >> p;) pids.push_back(p);
    }
    return pids;
  }
  // Zombies aside: this process, a subreaper (the process launcher's),
  // reaps the tasks' orphans only when it polls.
  static bool AnyAlive(const std::vector<pid_t>& sessions) {
    for (pid_t p : sessions) {
      if (ProcessGroupAlive(p)) return true;
    }
    return false;
  }
  bool WaitForTasks(const std::string& name, size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Tasks(name).size() == n && AnyAlive(Tasks(name))) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  // Until every worker's output file of `run` starts with `text`.
  bool WaitForOutput(const std::string& run, const std::string& text) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      bool all = true;
      for (int slice = 0; slice < 2 && all; ++slice) {
        for (int worker = 0; worker < 2 && all; ++worker) {
          all = OutputFile(run, slice, worker).starts_with(text);
        }
      }
      if (all) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  TempDir dir_{"slurm-runner-test-"};
  std::string old_path_;
  std::string batch_;
};

TEST_F(SlurmRunnerTest, EveryWorkerRunsInItsFolderWithTheStartupEnvironment) {
  auto o = Run(Options(
      "exp",
      "echo \"$SLURMD_NODENAME $MEGASCALE_SLICE_ID $TPU_WORKER_ID "
      "$TPU_WORKER_HOSTNAMES $MEGASCALE_NUM_SLICES $MULTISLICE_ATTEMPT "
      "$MULTISLICE_ACCELERATOR_TYPE $MULTISLICE_RUN_ID $RANK $WORLD_SIZE "
      "$MEGASCALE_COORDINATOR_ADDRESS $MULTISLICE_RUN_NAME $(cat data.txt) "
      "$PWD\"; env | grep -o '^MULTISLICE_RUN_[A-Z_]*' | sort | tr '\\n' ' ';"
      " printf 'no newline'"));
  ASSERT_TRUE(o.code.ok()) << o.code.status().message() << o.err;
  EXPECT_EQ(*o.code, 0) << o.err;
  // Attempt 2: the job's Restarts=1, as the batch script's tasks see it.
  const std::string store = "file://" + work() + "/.multislice-store/qr-abc-2";
  const char* nodes[2][2] = {{"h1", "h2"}, {"h3", "h4"}};
  const char* addresses[2] = {"10.9.0.1,10.9.0.2", "10.9.0.3,10.9.0.4"};
  for (int slice = 0; slice < 2; ++slice) {
    for (int worker = 0; worker < 2; ++worker) {
      EXPECT_EQ(OutputFile("exp", slice, worker),
                std::string(nodes[slice][worker]) + " " +
                    std::to_string(slice) + " " + std::to_string(worker) + " " +
                    addresses[slice] + " 2 2 v4-16 qr-abc " +
                    std::to_string(slice * 2 + worker) + " 4 " + store +
                    " exp payload " + WorkerDir(slice, worker) +
                    "/exp\nMULTISLICE_RUN_ID MULTISLICE_RUN_NAME no newline");
    }
  }
  EXPECT_EQ(o.out, OutputFile("exp", 0, 0));
  EXPECT_NE(o.err.find("multislice run: completed 4/4, every worker exited "
                       "with code 0 (output in " +
                       out_dir() + "/exp/)"),
            std::string::npos)
      << o.err;
  // A stop of earlier runs, the setup step with the archive on stdin, the
  // command's step; the job itself untouched.
  const std::string calls = Calls();
  const std::string common = "--jobid=7 --overlap --quiet ";
  const std::string where = " --chdir=" + work() +
                            " --nodelist=h1,h2,h3,h4 --nodes=4 --ntasks=4 "
                            "--ntasks-per-node=1 --kill-on-bad-exit=0 ";
  const size_t list = calls.find("squeue --noheader --steps --jobs=7");
  const size_t setup =
      calls.find("srun " + common + "--job-name=multislice-run/exp/setup" +
                 where + "--input=all \n");
  const size_t run =
      calls.find("srun " + common + "--job-name=multislice-run/exp" + where +
                 "--input=none \n");
  EXPECT_NE(list, std::string::npos) << calls;
  EXPECT_NE(setup, std::string::npos) << calls;
  EXPECT_NE(run, std::string::npos) << calls;
  EXPECT_TRUE(list < setup && setup < run) << calls;
  EXPECT_EQ(calls.find("scontrol update"), std::string::npos) << calls;
  EXPECT_EQ(calls.find("scancel"), std::string::npos) << calls;
  EXPECT_EQ(ReadWhole(WorkerDir(1, 1) + "/exp/data.txt"), "payload\n");

  // --use_existing_folder: no copy, the folder found again.
  RunOptions again = Options("exp", "cat data.txt");
  again.use_existing_folder = true;
  std::filesystem::remove(scripts() + "/data.txt");
  auto reused = Run(again);
  ASSERT_TRUE(reused.code.ok()) << reused.code.status().message();
  EXPECT_EQ(*reused.code, 0) << reused.err;
  EXPECT_EQ(OutputFile("exp", 1, 0), "payload\n");
  const std::string all = Calls();
  EXPECT_EQ(all.find("--input=all"), all.rfind("--input=all")) << all;
}

TEST_F(SlurmRunnerTest, AFailingWorkerStopsTheOthersAndGivesItsExitCode) {
  const auto start = std::chrono::steady_clock::now();
  // Slice 1 worker 0 fails once every worker has written its line.
  const std::string said = slurm() + "/said";
  std::filesystem::create_directories(said);
  auto o = Run(
      Options("fail",
              "me=$MEGASCALE_SLICE_ID.$TPU_WORKER_ID; echo \"output of $me\"; "
              "touch " +
                  said +
                  "/$me; if [ $me = 1.0 ]; then "
                  "for i in $(seq 100); do [ $(ls " +
                  said +
                  " | wc -l) = 4 ] && "
                  "break; sleep 0.1; done; echo failing now; exit 7; fi; "
                  "exec sleep 60"));
  ASSERT_TRUE(o.code.ok()) << o.code.status().message();
  EXPECT_EQ(*o.code, 7) << o.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
  EXPECT_NE(o.err.find("multislice run: slice 1 worker 0 failed with exit "
                       "code 7; stopped the 3 other workers still running"),
            std::string::npos)
      << o.err;
  EXPECT_EQ(OutputFile("fail", 1, 0), "output of 1.0\nfailing now\n");
  EXPECT_EQ(OutputFile("fail", 0, 1), "output of 0.1\n");
  EXPECT_EQ(o.out, "output of 0.0\n");
  EXPECT_NE(Calls().find("scancel --signal=TERM 7.2"), std::string::npos)
      << Calls();
  EXPECT_FALSE(AnyAlive(Tasks("multislice-run/fail")));
}

TEST_F(SlurmRunnerTest, StopsAnEarlierRunAndAnswersCtrlC) {
  std::atomic<bool> cancel_first{false}, cancel_second{false};
  RunOptions first = Options("first", "exec sleep 60");
  first.cancel = &cancel_first;
  std::optional<Outcome> first_outcome;
  std::thread first_thread([&] { first_outcome = Run(first); });
  ASSERT_TRUE(WaitForTasks("multislice-run/first", 4)) << Calls();

  // A command that answers the stop's TERM: what it says then is kept.
  RunOptions second =
      Options("second",
              "trap 'echo got TERM; exit 9' TERM; echo started; sleep 60 & "
              "wait");
  second.cancel = &cancel_second;
  std::optional<Outcome> second_outcome;
  std::thread second_thread([&] { second_outcome = Run(second); });
  first_thread.join();  // its step is stopped by the second run
  ASSERT_TRUE(first_outcome->code.ok());
  EXPECT_NE(*first_outcome->code, 0);
  EXPECT_NE(Calls().find("scancel --signal=TERM 7.2"), std::string::npos)
      << Calls();
  // The second run starts once the first one's step is gone.
  EXPECT_TRUE(WaitForTasks("multislice-run/second", 4)) << Calls();
  EXPECT_FALSE(AnyAlive(Tasks("multislice-run/first")));
  // Ctrl-C only once every command has set its trap: a TERM that came
  // earlier would end the shell before it could say anything.
  EXPECT_TRUE(WaitForOutput("second", "started\n")) << Calls();
  cancel_second = true;
  second_thread.join();
  ASSERT_TRUE(second_outcome->code.ok())
      << second_outcome->code.status().message();
  EXPECT_EQ(*second_outcome->code, 130) << second_outcome->err;
  EXPECT_NE(second_outcome->err.find(
                "multislice run: interrupted; stopped the commands of 4 "
                "workers"),
            std::string::npos)
      << second_outcome->err;
  EXPECT_FALSE(AnyAlive(Tasks("multislice-run/second")));
  EXPECT_EQ(OutputFile("second", 1, 1), "started\ngot TERM\n");
}

TEST_F(SlurmRunnerTest, RefusesWhatItCannotRunOn) {
  // No folder of that name on the workers: no command step.
  RunOptions existing = Options("never", "true");
  existing.use_existing_folder = true;
  auto missing = Run(existing);
  EXPECT_EQ(missing.code.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.code.status().message(),
            "slice 0 worker 0 (node h1): no folder never in " +
                WorkerDir(0, 0) +
                " (--use_existing_folder needs an earlier run named never "
                "on every worker)");
  EXPECT_EQ(Calls().find("--job-name=multislice-run/never "),
            std::string::npos);

  // A slice without its nodes (not ACTIVE), a job not running.
  json provisioning = QueuedResource();
  provisioning["nodes"][1]["hosts"] = json::array();
  EXPECT_EQ(Run(Options("r", "true"), provisioning).code.status().message(),
            "queued resource a has no workers (is it ACTIVE?)");
  SetJob("PENDING", 0);
  auto pending = Run(Options("r", "true"));
  EXPECT_EQ(pending.code.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pending.code.status().message(),
            "queued resource a: its Slurm job 7 is PENDING, not RUNNING (is "
            "the queued resource ACTIVE?)");
}

}  // namespace
}  // namespace multislice::control
