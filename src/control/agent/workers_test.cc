// The worker and exec tables without HTTP: the error codes agent.cc maps to
// HTTP statuses, and shutdown.
#include "control/agent/workers.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/temp_dir.h"

namespace multislice::control {
namespace {

using std::chrono::milliseconds;

TEST(WorkerTableTest, ReportsEachErrorWithItsCode) {
  TempDir dir("workers-test-");
  auto launcher = NewProcessLauncher();
  WorkerTable table(dir.path(), launcher.get(), milliseconds(1000));

  EXPECT_EQ(table.Start("Bad", 1, "true", {}).status().code(),
            StatusCode::kInvalidArgument);
  auto started = table.Start("w.0.0", 1, "sleep 100", {"A=1"});
  ASSERT_TRUE(started.ok()) << started.status().message();
  EXPECT_EQ((*started)["state"], "RUNNING");
  EXPECT_EQ(table.Start("w.0.0", 2, "true", {}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.Stop("nobody", milliseconds(0)).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(table.StartExec("true", "nobody", {}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(table.ReadExec("nothing", 0).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(table.StopExec("nothing", milliseconds(0)).status().code(),
            StatusCode::kNotFound);

  // An exec in the worker sees its environment.
  auto id = table.StartExec("echo $A$B", "w.0.0", {"B=2"});
  ASSERT_TRUE(id.ok());
  ExecChunk chunk;
  for (int i = 0; i < 1000 && !chunk.done; ++i) {
    auto read = table.ReadExec(*id, 0);
    ASSERT_TRUE(read.ok());
    chunk = *read;
    if (!chunk.done) std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(chunk.done);
  EXPECT_EQ(chunk.output, "12\n");
  EXPECT_EQ(chunk.exit_code, 0);
  EXPECT_EQ(chunk.next_offset, 3);

  const pid_t pid = (*started)["pid"];
  table.Shutdown();
  EXPECT_FALSE(ProcessGroupAlive(pid));
  EXPECT_EQ(table.Statuses()[0]["state"], "EXITED");
  EXPECT_EQ(table.Start("w.0.1", 1, "true", {}).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(table.StartExec("true", "", {}).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace multislice::control
