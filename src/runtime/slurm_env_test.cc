#include "runtime/slurm_env.h"

#include <gtest/gtest.h>

#include <map>

namespace multislice::runtime {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// What srun sets for task `procid` of `-N 4 --ntasks-per-node 1`.
std::map<std::string, std::string> Srun4(int procid) {
  return {{"SLURM_JOB_ID", "417"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NTASKS", "4"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_STEP_NODELIST", "h[1-2],node[09-10]"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x4)"},
          {"SLURM_SUBMIT_DIR", "/home/u/exp"}};
}

TEST(SlurmEnvTest, HostlistsExpandAsSlurmWritesThem) {
  EXPECT_EQ(*ExpandHostlist("h1"), (std::vector<std::string>{"h1"}));
  EXPECT_EQ(*ExpandHostlist("h[1-3,5],gpu[08-10],x"),
            (std::vector<std::string>{"h1", "h2", "h3", "h5", "gpu08", "gpu09",
                                      "gpu10", "x"}));
  EXPECT_EQ(*ExpandHostlist("r[1-2]n[1-2]"),
            (std::vector<std::string>{"r1n1", "r1n2", "r2n1", "r2n2"}));
  for (const char* bad : {"h[1-", "h[3-1]", "h]", "h[a-b]", "", "h1,,h2"}) {
    auto r = ExpandHostlist(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("SLURM_STEP_NODELIST='"),
              std::string::npos);
  }
}

TEST(SlurmEnvTest, TasksPerNodeExpand) {
  EXPECT_EQ(*ExpandTasksPerNode("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(*ExpandTasksPerNode("4"), (std::vector<int>{4}));
  for (const char* bad : {"", "0", "2(x)", "2(x3", "a", "2(x3)1"}) {
    EXPECT_FALSE(ExpandTasksPerNode(bad).ok()) << bad;
  }
}

TEST(SlurmEnvTest, OutsideAStepThereIsNoWorker) {
  auto env = ReadSlurmWorkerEnv(Env({{"SLURM_JOB_ID", "1"}}), 2, "cpu-1");
  ASSERT_TRUE(env.ok());
  EXPECT_FALSE(env->has_value());
}

// 2 slices of v4-16 (2 hosts each) from 4 tasks: JAX's process index is
// SLURM_PROCID = TPU_WORKER_ID + MEGASCALE_SLICE_ID * 2.
TEST(SlurmEnvTest, FourTasksAreTwoSlicesOfTwoHosts) {
  for (int procid = 0; procid < 4; ++procid) {
    auto env = ReadSlurmWorkerEnv(Env(Srun4(procid)), 2, "v4-16");
    ASSERT_TRUE(env.ok()) << env.status().message();
    ASSERT_TRUE(env->has_value());
    const WorkerEnv& w = **env;
    EXPECT_EQ(w.num_slices, 2);
    EXPECT_EQ(w.slice_id, procid / 2);
    EXPECT_EQ(w.worker_id, procid % 2);
    EXPECT_EQ(w.worker_id + w.slice_id * 2, procid);
    const std::vector<std::string> slice0 = {"h1", "h2"};
    const std::vector<std::string> slice1 = {"node09", "node10"};
    EXPECT_EQ(w.worker_hostnames, procid < 2 ? slice0 : slice1);
    EXPECT_EQ(w.accelerator_type, "v4-16");
    EXPECT_EQ(w.run_id, "slurm-417.0");
    EXPECT_EQ(w.attempt, 0);
    EXPECT_EQ(w.coordinator_address,
              "file:///home/u/exp/.multislice-store/slurm-417.0");
  }
}

TEST(SlurmEnvTest, VariablesOverrideAndRequeueCountsAttempts) {
  auto vars = Srun4(3);
  vars["MEGASCALE_NUM_SLICES"] = "4";
  vars["MEGASCALE_COORDINATOR_ADDRESS"] = "redis://h1:6379";
  vars["SLURM_RESTART_COUNT"] = "2";
  auto env = ReadSlurmWorkerEnv(Env(vars), 2, "cpu-2");
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ((*env)->num_slices, 4);
  EXPECT_EQ((*env)->slice_id, 3);
  EXPECT_EQ((*env)->worker_hostnames, (std::vector<std::string>{"node10"}));
  EXPECT_EQ((*env)->coordinator_address, "redis://h1:6379");
  EXPECT_EQ((*env)->attempt, 2);
}

TEST(SlurmEnvTest, SeveralTasksPerNodeShareItsName) {
  auto vars = Srun4(1);
  vars["SLURM_STEP_NODELIST"] = "a,b";
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  auto env = ReadSlurmWorkerEnv(Env(vars), 4, "cpu-1");
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ((*env)->worker_hostnames, (std::vector<std::string>{"a"}));
  vars["SLURM_PROCID"] = "2";
  EXPECT_EQ((*ReadSlurmWorkerEnv(Env(vars), 4, "cpu-1"))->worker_hostnames,
            (std::vector<std::string>{"b"}));
}

TEST(SlurmEnvTest, AJobThatDoesNotFormSlicesIsOneSentence) {
  auto env = ReadSlurmWorkerEnv(Env(Srun4(0)), 3, "v4-16");
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().message(),
            "SLURM_NTASKS=4 tasks cannot be 3 slice(s) of v4-16 (2 host(s) "
            "each): expected 6 tasks, one per host (srun -N ... "
            "--ntasks-per-node 1), or set --num_slices / MEGASCALE_NUM_SLICES "
            "to match");
  auto vars = Srun4(0);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "1(x3)";
  auto short_list = ReadSlurmWorkerEnv(Env(vars), 2, "v4-16");
  ASSERT_FALSE(short_list.ok());
  EXPECT_NE(short_list.status().message().find("places 3 tasks"),
            std::string::npos);
  vars = Srun4(0);
  vars["SLURM_NTASKS"] = "four";
  EXPECT_EQ(ReadSlurmWorkerEnv(Env(vars), 2, "v4-16").status().message(),
            "SLURM_NTASKS='four' is not a non-negative integer");
}

}  // namespace
}  // namespace multislice::runtime
