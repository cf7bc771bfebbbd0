#include "runtime/worker_env.h"

#include <gtest/gtest.h>

#include <map>

namespace multislice::runtime {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(WorkerEnvTest, NotAWorkerWithoutNumSlices) {
  auto env = ReadWorkerEnv(FakeEnv({}));
  ASSERT_TRUE(env.ok());
  EXPECT_FALSE(env->has_value());
}

TEST(WorkerEnvTest, RoundTripsThroughEnvironmentStrings) {
  WorkerEnv in;
  in.coordinator_address = "file:///tmp/store";
  in.num_slices = 4;
  in.slice_id = 3;
  in.worker_id = 1;
  in.worker_hostnames = {"10.0.0.1", "10.0.0.2"};
  in.accelerator_type = "cpu-2";
  in.run_id = "run7";
  in.attempt = 5;
  std::map<std::string, std::string> vars;
  for (const std::string& kv : in.ToEnvironment()) {
    vars[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  auto out = ReadWorkerEnv(FakeEnv(vars));
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_TRUE(out->has_value());
  const WorkerEnv& e = **out;
  EXPECT_EQ(e.coordinator_address, "file:///tmp/store");
  EXPECT_EQ(e.num_slices, 4);
  EXPECT_EQ(e.slice_id, 3);
  EXPECT_EQ(e.worker_id, 1);
  EXPECT_EQ(e.hostname(), "10.0.0.2");
  EXPECT_EQ(e.accelerator_type, "cpu-2");
  EXPECT_EQ(e.run_id, "run7");
  EXPECT_EQ(e.attempt, 5);
  EXPECT_EQ(e.name(), "slice 3 worker 1");
}

TEST(WorkerEnvTest, MalformedValuesNameTheVariable) {
  auto bad = ReadWorkerEnv(FakeEnv({{"MEGASCALE_NUM_SLICES", "two"},
                                    {"MEGASCALE_SLICE_ID", "0"},
                                    {"MEGASCALE_COORDINATOR_ADDRESS", "x"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "MEGASCALE_NUM_SLICES='two' is not a non-negative integer");

  auto out_of_range =
      ReadWorkerEnv(FakeEnv({{"MEGASCALE_NUM_SLICES", "2"},
                             {"MEGASCALE_SLICE_ID", "2"},
                             {"MEGASCALE_COORDINATOR_ADDRESS", "file:///x"}}));
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_EQ(out_of_range.status().message(),
            "MEGASCALE_SLICE_ID=2 is not below MEGASCALE_NUM_SLICES=2");

  auto no_store = ReadWorkerEnv(
      FakeEnv({{"MEGASCALE_NUM_SLICES", "2"}, {"MEGASCALE_SLICE_ID", "1"}}));
  ASSERT_FALSE(no_store.ok());
  EXPECT_NE(no_store.status().message().find("MEGASCALE_COORDINATOR_ADDRESS"),
            std::string::npos);
}

}  // namespace
}  // namespace multislice::runtime
