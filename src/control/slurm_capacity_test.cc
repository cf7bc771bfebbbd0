// Slurm as the capacity without a Slurm cluster: SlurmCapacity against a
// fake command runner (the commands it runs and how it reads their output),
// the batch script run with fake srun/scontrol (the worker environment of
// every task), FollowClusterJob's state mapping, the quota rule for cluster
// requests, and the real controller on a fake gang-scheduling cluster
// (create, ACTIVE, gang refusal, repair, reset, delete, quotas). The same path
// on a real Slurm cluster: slurm_controller_test.sh.
#include "control/slurm_capacity.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"
#include "control/control_testing.h"
#include "control/controller.h"
#include "control/controller_fixture.h"
#include "control/reconciler.h"
#include "control/scheduler.h"

namespace multislice::control {
namespace {

using nlohmann::json;
using testing::WaitFor;

// Answers each command with the first canned reply whose key is a prefix of
// the command line (argv joined by spaces); records every command.
class FakeRunner : public CommandRunner {
 public:
  std::map<std::string, Result<std::string>> replies;
  std::vector<std::vector<std::string>> calls;

  Result<std::string> Run(const std::vector<std::string>& argv) override {
    calls.push_back(argv);
    std::string line;
    for (const std::string& a : argv) line += (line.empty() ? "" : " ") + a;
    for (const auto& [key, reply] : replies) {
      if (line.rfind(key, 0) == 0) return reply;
    }
    return Unavailable(line + " failed: no reply");
  }
};

SlurmOptions Options(const std::string& partition, const std::string& workdir) {
  SlurmOptions o;
  o.partition = partition;
  o.workdir = workdir;
  return o;
}

bool Has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

TEST(SlurmCapacityTest, SubmitsOneGangJobOfEverySlicesNodes) {
  TempDir dir("slurm-capacity-");
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner& fake = *runner;
  fake.replies.emplace("sbatch", std::string("4242;cluster\n"));
  SlurmCapacity slurm(Options("batch", dir.path() + "/work"),
                      std::move(runner));
  ClusterJobSpec spec;
  spec.name = "qr1";
  spec.run_id = "qr1-abc";
  spec.slices = 2;
  spec.hosts_per_slice = 2;
  spec.accelerator_type = "v4-16";
  spec.startup_script = "echo hi";
  spec.tier = "on-demand";
  Result<std::string> job = slurm.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(*job, "4242");
  ASSERT_EQ(fake.calls.size(), 1u);
  const std::vector<std::string>& argv = fake.calls[0];
  EXPECT_EQ(argv[0], "sbatch");
  EXPECT_TRUE(Has(argv, "--parsable"));
  EXPECT_TRUE(Has(argv, "--nodes=4"));
  EXPECT_TRUE(Has(argv, "--ntasks-per-node=1"));
  EXPECT_TRUE(Has(argv, "--requeue"));
  EXPECT_TRUE(Has(argv, "--partition=batch"));
  EXPECT_TRUE(Has(argv, "--job-name=qr1"));
  for (const std::string& a : argv) {
    EXPECT_NE(a.rfind("--deadline", 0), 0u) << "a deadline also ends a job "
                                               "that started";
  }
  std::ifstream startup(dir.path() + "/work/qr1-qr1-abc.startup.sh");
  std::stringstream text;
  text << startup.rdbuf();
  EXPECT_EQ(text.str(), "echo hi");
  // An answer that is not a job id is an error, not a job.
  fake.replies.clear();
  fake.replies.emplace("sbatch", std::string("Submitted batch job 1\n"));
  EXPECT_FALSE(slurm.Submit(spec).ok());
  fake.replies.clear();
  fake.replies.emplace("sbatch", std::string("4243\n"));
  fake.calls.clear();
  SlurmOptions tiers = Options("batch", dir.path() + "/work");
  tiers.tier_partitions["spot"] = "preemptible";
  auto tier_runner = std::make_unique<FakeRunner>();
  FakeRunner& tier_fake = *tier_runner;
  tier_fake.replies.emplace("sbatch", std::string("4243\n"));
  SlurmCapacity tiered(tiers, std::move(tier_runner));
  spec.tier = "spot";
  ASSERT_TRUE(tiered.Submit(spec).ok());
  EXPECT_TRUE(Has(tier_fake.calls.back(), "--partition=preemptible"));
  spec.tier = "reserved";
  ASSERT_TRUE(tiered.Submit(spec).ok());
  EXPECT_TRUE(Has(tier_fake.calls.back(), "--partition=batch"));
  fake.replies.clear();
  fake.replies.emplace(
      "sbatch", Unavailable("sbatch failed: Requested node configuration is "
                            "not available"));
  Result<std::string> refused = slurm.Submit(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("node configuration"),
            std::string::npos);
}

TEST(SlurmCapacityTest, QueryReadsStateNodesRestartsAndTheWorkersStep) {
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner& fake = *runner;
  SlurmCapacity slurm(Options("", "/tmp"), std::move(runner));
  fake.replies.emplace(
      "scontrol show job --oneliner 7",
      std::string("JobId=7 JobName=qr1 UserId=root(0) JobState=RUNNING "
                  "Reason=None Dependency=(null) Requeue=1 Restarts=2 "
                  "BatchFlag=1 NodeList=h[1-2,4] BatchHost=h1 "
                  "Command=/tmp/x y=z\n"));
  fake.replies.emplace("scontrol show hostnames h[1-2,4]",
                       std::string("h1\nh2\nh4\n"));
  fake.replies.emplace("squeue --noheader --steps --jobs=7",
                       std::string("7.0|RUNNING\n"));
  Result<ClusterJobStatus> st = slurm.Query("7");
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(st->phase, ClusterJobStatus::Phase::kRunning);
  EXPECT_EQ(st->state, "RUNNING");
  EXPECT_EQ(st->restarts, 2);
  EXPECT_TRUE(st->workers_started);
  EXPECT_EQ(st->nodes, (std::vector<std::string>{"h1", "h2", "h4"}));
  // Only the batch step (or none): the workers have not started.
  fake.replies.insert_or_assign("squeue --noheader --steps --jobs=7",
                                std::string("7.batch|RUNNING\n"));
  EXPECT_FALSE(slurm.Query("7")->workers_started);
  // Unless the batch script marked that this run's step ran and ended (a
  // startup script that exits at once); a mark of an earlier run does not
  // count.
  fake.replies.insert_or_assign(
      "scontrol show job --oneliner 7",
      std::string("JobId=7 JobState=RUNNING Restarts=2 NodeList=h[1-2,4] "
                  "Comment=multislice-workers-ran-3\n"));
  EXPECT_TRUE(slurm.Query("7")->workers_started);
  fake.replies.insert_or_assign(
      "scontrol show job --oneliner 7",
      std::string("JobId=7 JobState=RUNNING Restarts=2 NodeList=h[1-2,4] "
                  "Comment=multislice-workers-ran-2\n"));
  EXPECT_FALSE(slurm.Query("7")->workers_started);
  // Pending: no nodes, no step asked for.
  fake.replies.insert_or_assign(
      "scontrol show job --oneliner 7",
      std::string("JobId=7 JobState=PENDING Reason=Resources Restarts=0 "
                  "NodeList=(null)\n"));
  fake.calls.clear();
  st = slurm.Query("7");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, ClusterJobStatus::Phase::kPending);
  EXPECT_EQ(st->reason, "Resources");
  EXPECT_TRUE(st->nodes.empty());
  EXPECT_EQ(fake.calls.size(), 1u);
  // Purged from slurmctld: gone.
  fake.replies.insert_or_assign(
      "scontrol show job --oneliner 7",
      Unavailable("scontrol show failed: slurm_load_jobs error: Invalid job id "
                  "specified"));
  st = slurm.Query("7");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->phase, ClusterJobStatus::Phase::kGone);
  // Other errors are errors.
  fake.replies.insert_or_assign(
      "scontrol show job --oneliner 7",
      Unavailable("scontrol show failed: Unable to contact slurm controller"));
  EXPECT_FALSE(slurm.Query("7").ok());
}

TEST(SlurmCapacityTest, FailedNodesCancelAndRequeue) {
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner& fake = *runner;
  SlurmCapacity slurm(Options("", "/tmp"), std::move(runner));
  fake.replies.emplace(
      "sinfo --noheader --Node",
      std::string("h1|idle\nh2|down*\nh3|allocated*\nh4|drained\n"
                  "h5|allocated\nh6|mixed\n"));
  Result<std::set<std::string>> failed = slurm.FailedNodes();
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(*failed, (std::set<std::string>{"h2", "h3", "h4"}));
  fake.replies.emplace("scancel 7", std::string());
  fake.replies.emplace("scontrol", std::string());
  fake.calls.clear();
  EXPECT_TRUE(slurm.Cancel("7").ok());
  EXPECT_TRUE(slurm.Requeue("7", {"h2", "h3"}).ok());
  ASSERT_EQ(fake.calls.size(), 4u);
  EXPECT_EQ(fake.calls[0], (std::vector<std::string>{"scancel", "7"}));
  EXPECT_EQ(fake.calls[1],
            (std::vector<std::string>{"scontrol", "requeuehold", "7"}));
  EXPECT_EQ(fake.calls[2],
            (std::vector<std::string>{"scontrol", "update", "JobId=7",
                                      "ExcNodeList=h2,h3"}));
  EXPECT_EQ(fake.calls[3],
            (std::vector<std::string>{"scontrol", "release", "7"}));
}

TEST(SlurmCapacityTest, PhasesOfSlurmStates) {
  using P = ClusterJobStatus::Phase;
  EXPECT_EQ(SlurmPhase("PENDING"), P::kPending);
  EXPECT_EQ(SlurmPhase("REQUEUED"), P::kPending);
  EXPECT_EQ(SlurmPhase("CONFIGURING"), P::kConfiguring);
  // Between a requeue and the next run, a job is COMPLETING: not ended.
  EXPECT_EQ(SlurmPhase("COMPLETING"), P::kConfiguring);
  EXPECT_EQ(SlurmPhase("RUNNING"), P::kRunning);
  for (const char* s : {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                        "DEADLINE", "NODE_FAIL", "PREEMPTED"}) {
    EXPECT_EQ(SlurmPhase(s), P::kEnded) << s;
  }
  EXPECT_EQ(SlurmPhase(""), P::kGone);
}

// The batch script under fake srun (every task in turn) and scontrol: each
// task's startup script sees the agents' worker environment and runs in its
// own worker's directory.
TEST(SlurmCapacityTest, BatchScriptGivesEveryTaskItsWorkerEnvironment) {
  TempDir dir("slurm-script-");
  const std::string bin = dir.path() + "/bin";
  ASSERT_EQ(std::system(("mkdir -p " + bin).c_str()), 0);
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
    ASSERT_EQ(std::system(("chmod +x " + path).c_str()), 0);
  };
  write(bin + "/srun",
        "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n"
        "for ((p = 0; p < SLURM_JOB_NUM_NODES; p++)); do\n"
        "  SLURM_PROCID=$p SLURM_NTASKS=$SLURM_JOB_NUM_NODES \"$@\"\n"
        "done\n");
  write(bin + "/scontrol",
        "#!/bin/bash\n[ \"$1\" = update ] && { echo \"$*\" > " + dir.path() +
            "/update.txt; exit 0; }\nprintf 'h1\\nh2\\nh3\\nh4\\n'\n");
  write(bin + "/sleep", "#!/bin/bash\nexit 0\n");
  ClusterJobSpec spec;
  spec.name = "qr1";
  spec.run_id = "qr1-abc";
  spec.slices = 2;
  spec.hosts_per_slice = 2;
  spec.accelerator_type = "v4-16";
  const std::string out = dir.path() + "/env.txt";
  write(dir.path() + "/startup.sh",
        "echo \"$SLURM_PROCID $MEGASCALE_SLICE_ID $TPU_WORKER_ID "
        "$TPU_WORKER_HOSTNAMES $MEGASCALE_NUM_SLICES $MULTISLICE_ATTEMPT "
        "$MULTISLICE_ACCELERATOR_TYPE $MULTISLICE_RUN_ID $RANK $WORLD_SIZE "
        "$MEGASCALE_COORDINATOR_ADDRESS $PWD\" >> " +
            out + "\n");
  const std::string shared = dir.path() + "/shared";
  write(dir.path() + "/batch.sh",
        SlurmBatchScript(spec, shared, dir.path() + "/startup.sh"));
  const std::string cmd =
      "cd " + dir.path() + " && PATH=" + bin +
      ":$PATH SLURM_JOB_ID=7 SLURM_JOB_NUM_NODES=4 SLURM_JOB_NODELIST='h[1-4]' "
      "SLURM_RESTART_COUNT=1 bash batch.sh";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(out);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const std::string store = "file://" + shared + "/.multislice-store/qr1-abc-2";
  const std::string workers = " " + shared + "/workers/qr1.";
  EXPECT_EQ(
      lines,
      (std::vector<std::string>{
          "0 0 0 h1,h2 2 2 v4-16 qr1-abc 0 4 " + store + workers + "0.0",
          "1 0 1 h1,h2 2 2 v4-16 qr1-abc 1 4 " + store + workers + "0.1",
          "2 1 0 h3,h4 2 2 v4-16 qr1-abc 2 4 " + store + workers + "1.0",
          "3 1 1 h3,h4 2 2 v4-16 qr1-abc 3 4 " + store + workers + "1.1"}));
  std::ifstream update(dir.path() + "/update.txt");
  std::string mark;
  std::getline(update, mark);
  EXPECT_EQ(mark, "update JobId=7 Comment=multislice-workers-ran-2");
}

QueuedResourceRecord TwoSlices() {
  QueuedResourceRecord r;
  r.id = "qr";
  r.cluster_job = "7";
  r.hosts_per_slice = 1;
  r.attempt = 1;
  r.holds_quota = true;
  r.state = QrState::kWaitingForResources;
  r.nodes.resize(2);
  return r;
}

ClusterJobStatus Job(ClusterJobStatus::Phase phase, std::string state,
                     std::vector<std::string> nodes = {}, int restarts = 0,
                     bool started = false) {
  ClusterJobStatus st;
  st.phase = phase;
  st.state = std::move(state);
  st.nodes = std::move(nodes);
  st.restarts = restarts;
  st.workers_started = started;
  return st;
}

TEST(FollowClusterJobTest, StatesFollowTheJob) {
  using P = ClusterJobStatus::Phase;
  QueuedResourceRecord r = TwoSlices();
  EXPECT_FALSE(
      FollowClusterJob(r, Job(P::kPending, "PENDING"), {}, false).changed);
  EXPECT_EQ(r.state, QrState::kWaitingForResources);
  FollowClusterJob(r, Job(P::kConfiguring, "CONFIGURING", {"h1", "h2"}), {},
                   false);
  EXPECT_EQ(r.state, QrState::kProvisioning);
  EXPECT_EQ(r.nodes[1].hosts, (std::vector<std::string>{"h2"}));
  FollowClusterJob(r, Job(P::kRunning, "RUNNING", {"h1", "h2"}), {}, false);
  EXPECT_EQ(r.state, QrState::kProvisioning);  // the workers' step not yet
  ClusterFollow f = FollowClusterJob(
      r, Job(P::kRunning, "RUNNING", {"h1", "h2"}, 0, true), {}, false);
  EXPECT_TRUE(f.finish_ops);
  EXPECT_EQ(r.state, QrState::kActive);
  EXPECT_TRUE(r.nodes[0].started);
  EXPECT_EQ(r.nodes[0].state, "READY");
  // The startup script ended (no step): still ACTIVE, the nodes are held.
  EXPECT_FALSE(
      FollowClusterJob(r, Job(P::kRunning, "RUNNING", {"h1", "h2"}), {}, false)
          .changed);
  EXPECT_EQ(r.state, QrState::kActive);
  // h2 failed under the job and we requeued it away from h2: attempt 2, h2's
  // slice REPAIRING, the other RESTARTING.
  FollowClusterJob(r, Job(P::kRunning, "RUNNING", {"h1", "h2"}, 0, true),
                   {"h2"}, true);
  EXPECT_EQ(r.attempt, 2);
  EXPECT_EQ(r.state, QrState::kProvisioning);
  EXPECT_EQ(r.nodes[1].state, "REPAIRING");
  EXPECT_EQ(r.nodes[0].state, "RESTARTING");
  // Slurm's answer before the requeue took hold changes nothing.
  FollowClusterJob(r, Job(P::kRunning, "RUNNING", {"h1", "h2"}, 0, true), {},
                   false);
  EXPECT_EQ(r.state, QrState::kProvisioning);
  FollowClusterJob(r, Job(P::kPending, "PENDING", {}, 1), {"h2"}, false);
  EXPECT_EQ(r.state, QrState::kWaitingForResources);
  FollowClusterJob(r, Job(P::kRunning, "RUNNING", {"h1", "h3"}, 1, true),
                   {"h2"}, false);
  EXPECT_EQ(r.state, QrState::kActive);
  EXPECT_EQ(r.attempt, 2);
  EXPECT_EQ(r.nodes[1].hosts, (std::vector<std::string>{"h3"}));
  EXPECT_EQ(r.nodes[1].state, "READY");
  // Slurm requeued it by itself (a node failed, --requeue): attempt 3.
  FollowClusterJob(r, Job(P::kPending, "PENDING", {}, 2), {"h3"}, false);
  EXPECT_EQ(r.attempt, 3);
  EXPECT_EQ(r.state, QrState::kWaitingForResources);
  EXPECT_EQ(r.nodes[1].state, "REPAIRING");
  // Preempted (PreemptMode=CANCEL) for a higher-priority job: SUSPENDED.
  {
    QueuedResourceRecord spot = TwoSlices();
    spot.state = QrState::kActive;
    f = FollowClusterJob(spot, Job(P::kEnded, "PREEMPTED"), {}, false);
    EXPECT_TRUE(f.finish_ops);
    EXPECT_EQ(spot.state, QrState::kSuspended);
    EXPECT_EQ(spot.state_initiator, "SERVICE");
    EXPECT_EQ(spot.nodes[0].state, "PREEMPTED");
  }
  // The deadline (valid_until) passed: FAILED, saying so.
  f = FollowClusterJob(r, Job(P::kEnded, "DEADLINE"), {}, false);
  EXPECT_TRUE(f.finish_ops);
  EXPECT_EQ(r.state, QrState::kFailed);
  EXPECT_NE(r.failed_error.find("valid_until"), std::string::npos);
}

// On cluster capacity the scheduler only applies the quotas: a request of
// no hosts is granted when its tier's quota holds its chips, FIFO per tier
// (the agents' rule), whatever hosts are free.
TEST(ClusterQuotaTest, RequestsOfNoHostsAreGrantedOnQuotaAlone) {
  SchedulerInput in;  // no free hosts: Slurm has them
  in.quota_chips[static_cast<int>(Tier::kOnDemand)] = 8;
  in.quota_chips[static_cast<int>(Tier::kSpot)] = 2;
  SchedHolder failed;  // a FAILED QR still holds its 4 chips
  failed.name = "failed";
  failed.tier = Tier::kOnDemand;
  failed.chips = 4;
  failed.holds_quota = true;
  in.holders = {failed};
  auto request = [](std::string name, int64_t seq, Tier tier, int slices) {
    SchedRequest r;
    r.name = std::move(name);
    r.seq = seq;
    r.tier = tier;
    r.accelerator_type = "cpu-2";
    r.hosts_per_slice = 0;
    r.chips_per_slice = 2;
    r.slices = slices;
    return r;
  };
  // 4 held + 2 (fits 8), then 6 + 4 > 8: "big" and the younger "small"
  // behind it wait although 2 chips are left; spot within its own quota.
  in.requests = {request("small", 4, Tier::kOnDemand, 1),
                 request("first", 1, Tier::kOnDemand, 1),
                 request("big", 2, Tier::kOnDemand, 2),
                 request("spot", 3, Tier::kSpot, 1),
                 request("spot2", 5, Tier::kSpot, 1),
                 request("reserved", 6, Tier::kReserved, 50)};
  SchedulerDecision d = Schedule(in);
  std::vector<std::string> granted;
  for (const Grant& g : d.grants) granted.push_back(g.name);
  EXPECT_EQ(granted, (std::vector<std::string>{"reserved", "first", "spot"}));
  EXPECT_TRUE(d.preempted.empty());
  // The FAILED holder deleted: both on-demand requests fit (2 + 4 <= 8), the
  // younger one too (8).
  in.holders.clear();
  granted.clear();
  for (const Grant& g : Schedule(in).grants) granted.push_back(g.name);
  EXPECT_EQ(granted, (std::vector<std::string>{"reserved", "first", "big",
                                               "small", "spot"}));
}

// A cluster of `nodes` nodes that starts a job only when every node it asks
// for is free and up (gang), lowest-numbered nodes first.
class FakeCluster : public ClusterCapacity {
 public:
  explicit FakeCluster(int nodes) {
    for (int i = 1; i <= nodes; ++i) up_.insert("n" + std::to_string(i));
  }

  Result<std::string> Submit(const ClusterJobSpec& spec) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int need = spec.slices * spec.hosts_per_slice;
    if (need > static_cast<int>(up_.size() + down_.size())) {
      return Unavailable(
          "sbatch failed: Requested node configuration is not available");
    }
    const std::string id = std::to_string(next_++);
    ++submits;
    jobs_[id].need = need;
    Place();
    return id;
  }
  Result<ClusterJobStatus> Query(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    Place();
    ClusterJobStatus st;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return st;
    st.restarts = it->second.restarts;
    if (!it->second.ended.empty()) {
      st.phase = ClusterJobStatus::Phase::kEnded;
      st.state = it->second.ended;
    } else if (it->second.nodes.empty()) {
      st.phase = ClusterJobStatus::Phase::kPending;
      st.state = "PENDING";
      st.reason = "Resources";
    } else {
      st.phase = ClusterJobStatus::Phase::kRunning;
      st.state = "RUNNING";
      st.nodes = it->second.nodes;
      st.workers_started = true;
    }
    return st;
  }
  Status Cancel(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.erase(id);
    ++cancels;
    return OkStatus();
  }
  Status Requeue(const std::string& id,
                 const std::vector<std::string>& exclude) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound("no job " + id);
    it->second.nodes.clear();
    it->second.restarts += 1;
    it->second.exclude.insert(exclude.begin(), exclude.end());
    Place();
    return OkStatus();
  }
  Result<std::set<std::string>> FailedNodes() override {
    std::lock_guard<std::mutex> lock(mu_);
    return down_;
  }
  void Fail(const std::string& node) {
    std::lock_guard<std::mutex> lock(mu_);
    up_.erase(node);
    down_.insert(node);
  }
  // The job ends by itself in `state` (FAILED, TIMEOUT, ...); its nodes free.
  void End(const std::string& id, const std::string& state) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_[id].ended = state;
    jobs_[id].nodes.clear();
  }
  int cancels = 0;
  int submits = 0;

 private:
  struct Job {
    int need = 0;
    int restarts = 0;
    std::vector<std::string> nodes;
    std::set<std::string> exclude;
    std::string ended;  // the state it ended in, or ""
  };
  void Place() {
    std::set<std::string> busy;
    for (const auto& [id, j] : jobs_)
      busy.insert(j.nodes.begin(), j.nodes.end());
    for (auto& [id, j] : jobs_) {
      if (!j.nodes.empty() || !j.ended.empty()) continue;
      std::vector<std::string> free;
      for (const std::string& n : up_) {
        if (!busy.count(n) && !j.exclude.count(n)) free.push_back(n);
      }
      if (static_cast<int>(free.size()) < j.need) continue;  // all or none
      j.nodes.assign(free.begin(), free.begin() + j.need);
      busy.insert(j.nodes.begin(), j.nodes.end());
    }
  }
  std::mutex mu_;
  std::set<std::string> up_, down_;
  std::map<std::string, Job> jobs_;
  int next_ = 1;
};

class ClusterControllerTest : public testing::ControllerFixture {
 protected:
  ClusterControllerTest() : ControllerFixture("test-token") {}
  static constexpr char kParent[] =
      "/v2alpha1/projects/proj/locations/us-test1-a";

  json Call(const std::string& method, const std::string& path,
            const json* body = nullptr, int* status = nullptr) {
    Result<HttpResponse> r = client_->Call(method, path, body);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (status) *status = r.ok() ? r->status : 0;
    return r.ok() ? r->body : json();
  }
  json Get(const std::string& id) {
    return Call("GET", std::string(kParent) + "/queuedResources/" + id);
  }
  std::string State(const std::string& id) {
    json qr = Get(id);
    return qr.contains("state") ? qr["state"].value("state", "") : "<none>";
  }
  bool WaitState(const std::string& id, const std::string& state) {
    bool ok = WaitFor([&] { return State(id) == state; });
    EXPECT_TRUE(ok) << id << " is " << State(id) << ", expected " << state;
    return ok;
  }
};

TEST_F(ClusterControllerTest, QueuedResourcesAreGangJobsOfTheCluster) {
  auto cluster = std::make_shared<FakeCluster>(3);
  ControllerOptions options;
  options.cluster = cluster;
  StartController(options);
  json two = testing::CpuBody(2);
  int status = 0;
  Call("POST", std::string(kParent) + "/queuedResources?queued_resource_id=a",
       &two, &status);
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(WaitState("a", "ACTIVE"));
  // Gang: 4 slices of one host cannot start on 3 nodes; it waits.
  json four = testing::CpuBody(4);
  Call("POST", std::string(kParent) + "/queuedResources?queued_resource_id=b",
       &four, &status);
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(WaitState("b", "WAITING_FOR_RESOURCES"));
  json a = Get("a");
  EXPECT_EQ(a["attempt"], 1);
  EXPECT_EQ(a["nodes"][0]["hosts"], json({"n1"}));
  EXPECT_EQ(a["nodes"][1]["hosts"], json({"n2"}));
  EXPECT_EQ(a["nodes"][0]["state"], "READY");
  // Repair: n1 fails under a's job; the job is requeued away from it and
  // both slices restart as attempt 2, on n2 and n3.
  cluster->Fail("n1");
  ASSERT_TRUE(WaitFor([&] {
    json qr = Get("a");
    return qr["attempt"] == 2 && qr["state"]["state"] == "ACTIVE";
  }));
  a = Get("a");
  EXPECT_EQ(a["nodes"][0]["hosts"], json({"n2"}));
  EXPECT_EQ(a["nodes"][1]["hosts"], json({"n3"}));
  // Reset requeues the job: ACTIVE again.
  Call("POST", std::string(kParent) + "/queuedResources/a:reset", nullptr,
       &status);
  EXPECT_EQ(status, 200);
  ASSERT_TRUE(WaitFor([&] { return Get("a")["attempt"] == 3; }));
  ASSERT_TRUE(WaitState("a", "ACTIVE"));
  EXPECT_EQ(State("b"), "WAITING_FOR_RESOURCES");  // still cannot start
  // valid_until ends only the wait: c (2 nodes) pends behind a and is
  // cancelled at its deadline, FAILED saying so.
  json c_body = testing::CpuBody(2);
  c_body["queueing_policy"] = {{"valid_until_duration", "2s"}};
  Call("POST", std::string(kParent) + "/queuedResources?queued_resource_id=c",
       &c_body, &status);
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(WaitState("c", "WAITING_FOR_RESOURCES"));
  const int cancels = cluster->cancels;
  ASSERT_TRUE(WaitFor([&] { return State("c") == "FAILED"; },
                      std::chrono::seconds(10)));
  EXPECT_NE(Get("c")["state"].dump().find("valid_until"), std::string::npos)
      << Get("c")["state"].dump();
  EXPECT_EQ(cluster->cancels, cancels + 1);
  EXPECT_EQ(State("a"), "ACTIVE");
  // Delete cancels the job.
  Call("DELETE", std::string(kParent) + "/queuedResources/a?force=true",
       nullptr, &status);
  EXPECT_EQ(status, 200);
  ASSERT_TRUE(WaitFor([&] {
    int s = 0;
    Call("GET", std::string(kParent) + "/queuedResources/a", nullptr, &s);
    return s == 404;
  }));
  EXPECT_GE(cluster->cancels, 1);
}

// Quotas on Slurm as on agents: a request over its tier's quota is not
// submitted (no job) and waits saying so; a FAILED QR keeps its quota until
// deleted, and then the waiting one is submitted; the capacity answer counts
// every tier's chips; a job cancelled pending at valid_until frees its quota.
TEST_F(ClusterControllerTest, QuotasHoldRequestsBackBeforeSlurm) {
  auto cluster = std::make_shared<FakeCluster>(6);
  ControllerOptions options;
  options.cluster = cluster;
  options.quota_chips[static_cast<int>(Tier::kOnDemand)] = 4;  // 2 x cpu-2
  StartController(options);
  int status = 0;
  auto create = [&](const std::string& id, json body) {
    Call("POST",
         std::string(kParent) + "/queuedResources?queued_resource_id=" + id,
         &body, &status);
    ASSERT_EQ(status, 200) << id;
  };
  auto tier = [&](const std::string& name) {
    json cap = Call("GET", "/internal/v1/capacity");
    for (const json& t : cap["tiers"]) {
      if (t["tier"] == name) return t;
    }
    ADD_FAILURE() << "no tier " << name << " in " << cap.dump();
    return json();
  };
  create("a", testing::CpuBody(2));
  ASSERT_TRUE(WaitState("a", "ACTIVE"));
  EXPECT_EQ(Get("a")["quotaHeldChips"], 4);
  create("over", testing::CpuBody(1));
  ASSERT_TRUE(WaitState("over", "WAITING_FOR_RESOURCES"));
  // Another tier is not held back by on-demand's quota.
  create("spot", testing::CpuBody(1, "spot"));
  ASSERT_TRUE(WaitState("spot", "ACTIVE"));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // more ticks
  json over = Get("over");
  EXPECT_EQ(over["state"]["state"], "WAITING_FOR_RESOURCES");
  EXPECT_FALSE(over.contains("clusterJob")) << over.dump();
  EXPECT_EQ(over["quotaHeldChips"], 0);
  EXPECT_EQ(over["waitingReason"],
            "the on-demand quota: 4 of 4 chips in use, this request needs 2");
  EXPECT_EQ(cluster->submits, 2);  // a and spot
  EXPECT_EQ(tier("on-demand")["usedChips"], 4);
  EXPECT_EQ(tier("on-demand")["quotaChips"], 4);
  EXPECT_EQ(tier("spot")["usedChips"], 2);
  EXPECT_EQ(tier("spot")["quotaChips"], -1);
  EXPECT_EQ(tier("reserved")["usedChips"], 0);
  // a's job ends by itself: a FAILED, still holding its 4 chips.
  cluster->End(Get("a")["clusterJob"], "FAILED");
  ASSERT_TRUE(WaitState("a", "FAILED"));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(Get("a")["quotaHeldChips"], 4);
  EXPECT_EQ(State("over"), "WAITING_FOR_RESOURCES");
  EXPECT_EQ(cluster->submits, 2);
  EXPECT_EQ(tier("on-demand")["usedChips"], 4);
  EXPECT_EQ(tier("on-demand")["heldByFailedOrSuspendedChips"], 4);
  EXPECT_EQ(tier("on-demand")["failedOrSuspended"], 1);
  // Deleted (FAILED: no force needed): over is submitted and runs.
  Call("DELETE", std::string(kParent) + "/queuedResources/a", nullptr, &status);
  EXPECT_EQ(status, 200);
  ASSERT_TRUE(WaitState("over", "ACTIVE"));
  EXPECT_EQ(cluster->submits, 3);
  EXPECT_TRUE(Get("over").contains("clusterJob"));
  EXPECT_FALSE(Get("over").contains("waitingReason"));
  EXPECT_EQ(tier("on-demand")["usedChips"], 2);
  EXPECT_EQ(tier("on-demand")["heldByFailedOrSuspendedChips"], 0);
  // A reserved request (no quota) for more nodes than are free pends in
  // Slurm, saying so; cancelled at its valid_until, it holds no quota, as a
  // QR never admitted on agents.
  json late = testing::CpuBody(5, "reserved");
  late["queueing_policy"] = {{"valid_until_duration", "1.5s"}};
  create("late", late);
  ASSERT_TRUE(WaitFor([&] { return Get("late").contains("clusterJob"); }));
  const std::string late_job = Get("late")["clusterJob"];
  EXPECT_EQ(Get("late")["waitingReason"], "Slurm job " + late_job +
                                              " is pending (squeue -j " +
                                              late_job + " says why)");
  ASSERT_TRUE(WaitFor([&] { return State("late") == "FAILED"; }));
  EXPECT_EQ(Get("late")["quotaHeldChips"], 0);
  EXPECT_EQ(tier("reserved")["usedChips"], 0);
}

// A controller restarted on its data directory follows the jobs it had
// submitted: no second job, the same attempt, and delete still cancels.
TEST_F(ClusterControllerTest, ARestartedControllerFollowsItsJobs) {
  auto cluster = std::make_shared<FakeCluster>(3);
  ControllerOptions options;
  options.cluster = cluster;
  StartController(options);
  json two = testing::CpuBody(2);
  int status = 0;
  Call("POST", std::string(kParent) + "/queuedResources?queued_resource_id=a",
       &two, &status);
  ASSERT_EQ(status, 200);
  ASSERT_TRUE(WaitState("a", "ACTIVE"));
  controller_.reset();
  StartController(options);
  EXPECT_EQ(State("a"), "ACTIVE");
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // 2 polls
  EXPECT_EQ(State("a"), "ACTIVE");
  EXPECT_EQ(Get("a")["attempt"], 1);
  EXPECT_EQ(Get("a")["clusterJob"], "1");
  EXPECT_EQ(cluster->submits, 1);
  // A node failure while it was down is repaired once it is back.
  controller_.reset();
  cluster->Fail("n2");
  StartController(options);
  ASSERT_TRUE(WaitFor([&] {
    json qr = Get("a");
    return qr["attempt"] == 2 && qr["state"]["state"] == "ACTIVE";
  }));
  Call("DELETE", std::string(kParent) + "/queuedResources/a?force=true",
       nullptr, &status);
  EXPECT_EQ(status, 200);
  ASSERT_TRUE(WaitFor([&] {
    int s = 0;
    Call("GET", std::string(kParent) + "/queuedResources/a", nullptr, &s);
    return s == 404;
  }));
  EXPECT_EQ(cluster->cancels, 1);
  EXPECT_EQ(cluster->submits, 1);
}

}  // namespace
}  // namespace multislice::control
