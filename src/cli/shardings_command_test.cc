// `multislice shardings` on bad input: every case ends in one line naming
// what is wrong and exit code 2, before any worker starts. (The workload
// itself is tested in model/shardings_test.cc.)
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/command.h"
#include "cli/commands.h"
#include "cli/progress.h"

namespace multislice::cli {
namespace {

struct CommandRun {
  int exit_code = 0;
  std::string err;
};

// Parses `multislice shardings ARGS` (with shardings.py's short flags
// rewritten as main() does) and runs it.
CommandRun RunShardings(const std::vector<std::string>& args) {
  CLI::App root{"test", "multislice"};
  root.require_subcommand(1);
  CommandTable table;
  AddShardingsCommand(root, table);
  std::vector<std::string> full = {"shardings"};
  full.insert(full.end(), args.begin(), args.end());
  full = ApplyFlagAliases(full);
  std::reverse(full.begin(), full.end());
  CommandRun run;
  try {
    root.parse(full);
  } catch (const CLI::ParseError& e) {
    run.exit_code = 2;
    run.err = e.what();
    return run;
  }
  testing::internal::CaptureStderr();
  run.exit_code = table.at(root.get_subcommands().front())();
  run.err = testing::internal::GetCapturedStderr();
  return run;
}

TEST(ShardingsCommandTest, ShortFlagsOfTheOriginalAreRewritten) {
  CLI::App root;
  CommandTable table;
  AddShardingsCommand(root, table);  // registers the aliases
  EXPECT_EQ(ApplyFlagAliases({"shardings", "-dd", "2", "-if", "4", "-d", "8"}),
            (std::vector<std::string>{"shardings", "--dcn_data_parallelism",
                                      "2", "--ici_fsdp_parallelism", "4",
                                      "--embedding_dimension", "8"}));
  // Other commands keep their arguments.
  EXPECT_EQ(ApplyFlagAliases({"mesh", "-dd", "2"}),
            (std::vector<std::string>{"mesh", "-dd", "2"}));
}

struct BadCase {
  std::vector<std::string> args;
  std::string message;
};

class ShardingsBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ShardingsBadInputTest, OneLineAndExitTwo) {
  CommandRun run = RunShardings(GetParam().args);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find(GetParam().message), std::string::npos) << run.err;
  if (run.err.find('\n') != std::string::npos) {
    EXPECT_EQ(run.err.find('\n'), run.err.size() - 1) << run.err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ShardingsBadInputTest,
    ::testing::Values(
        BadCase{{"-d", "100", "-if", "8"},
                "--embedding_dimension 100 must be divisible by the fsdp "
                "parallelism 8"},
        BadCase{{"-d", "100", "-it", "3"},
                "--embedding_dimension 100 must be divisible by the tensor "
                "parallelism 3"},
        BadCase{{"--accelerator_type", "cpu-4", "-if", "2"},
                "Number of devices per slice 4 does not match the product of "
                "the ICI parallelism 2"},
        BadCase{{"-if", "-1", "-it", "-1", "--accelerator_type", "cpu-4"},
                "Found unspecified values (-1) for more than one ICI "
                "parallelism axis"},
        BadCase{{"-dd", "-1"}, "every --dcn_*_parallelism needs a value"},
        BadCase{{"-b", "0"}, "--batch_size: expected a positive size, got 0"},
        BadCase{{"-n", "0"}, "--num_layers: expected at least 1, got 0"},
        BadCase{{"--dtype", "fp8"},
                "--dtype: 'fp8' is not a dtype; expected bfloat16 (bf16) or "
                "float32 (f32)"},
        BadCase{{"--steps", "0"}, "--steps: expected at least 1, got 0"},
        BadCase{{"--dcn_timeout_seconds", "0"},
                "--dcn_timeout_seconds: expected at least 1, got 0"},
        BadCase{{"--accelerator_type", "v4-8", "-if", "8"},
                "Number of devices per slice 4 does not match the product of "
                "the ICI parallelism 8"},
        BadCase{{"--accelerator_type", "gpu-2"}, "unknown accelerator type"},
        BadCase{{"-d", "abc"},
                "--embedding_dimension: 'abc' is not an integer"},
        // MaxText's keys of the stage axis are accepted, and refused above 1
        // (or what a -1 resolves to).
        BadCase{{"--ici_pipeline_parallelism", "2"},
                "multislice shardings: ici_pipeline_parallelism=2: "
                "multislice shardings has no pipeline stages; expected 1"},
        BadCase{{"--dcn_pipeline_parallelism", "2"},
                "multislice shardings: dcn_pipeline_parallelism=2: "
                "multislice shardings has no pipeline stages; expected 1"},
        BadCase{{"--accelerator_type", "cpu-4", "-if", "2",
                 "--ici_pipeline_parallelism", "-1"},
                "multislice shardings: ici_pipeline_parallelism=2: "
                "multislice shardings has no pipeline stages; expected 1"},
        BadCase{{"--dcn_diloco_parallelism", "2"},
                "multislice shardings: dcn_diloco_parallelism=2: multislice "
                "shardings has no DiLoCo replicas (multislice train has); "
                "expected 1"},
        BadCase{{"--ici_diloco_parallelism", "2", "-if", "1"},
                "multislice shardings: ici_diloco_parallelism=2: multislice "
                "shardings has no DiLoCo replicas (multislice train has); "
                "expected 1"}));

// What a Progress wrote to a temporary file.
std::string Contents(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  return text;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

TEST(ProgressTest, WithoutATerminalALongPhaseIsNeverSilent) {
  FILE* f = std::tmpfile();
  Progress::Options options{.out = f, .prefix = "shardings"};
  options.quiet_seconds = 0.2;
  Progress progress(options);
  progress.Phase("measuring the matmul peak");
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  progress.Stop();
  const std::string text = Contents(f);
  std::fclose(f);
  // Once at the start, then at least every 0.2 s (checked every 0.05 s).
  EXPECT_GE(Count(text, "shardings: measuring the matmul peak, "), 4) << text;
  EXPECT_EQ(Count(text, "\n"), Count(text, "shardings: ")) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
}

// A phase whose line changes (data prepare's counts) keeps its clock; a new
// phase starts its own.
TEST(ProgressTest, UpdatingAPhaseKeepsItsElapsedTime) {
  FILE* f = std::tmpfile();
  Progress progress({.out = f, .prefix = "data"});
  progress.Phase("reading: 10 documents");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  progress.UpdatePhase("reading: 20 documents");
  EXPECT_EQ(progress.Text().rfind("reading: 20 documents, 1s", 0), 0u)
      << progress.Text();
  progress.Phase("tokenizing: 0 documents");
  EXPECT_EQ(progress.Text().rfind("tokenizing: 0 documents, 0s", 0), 0u)
      << progress.Text();
  progress.Stop();
  std::fclose(f);
}

TEST(ProgressTest, StepsSayWhereTheRunIsAndTheEta) {
  FILE* f = std::tmpfile();
  Progress progress({.out = f, .prefix = "shardings"});
  progress.StartSteps(4, 1);
  EXPECT_NE(progress.Text().find("step 1/4 running"), std::string::npos)
      << progress.Text();
  progress.StepDone(1, 5.0);  // the warm-up: no ETA from it
  EXPECT_EQ(progress.Text().find("ETA"), std::string::npos) << progress.Text();
  progress.StepDone(2, 2.0);
  EXPECT_NE(progress.Text().find("step 3/4 running, last step 2.00 s, ETA 4s"),
            std::string::npos)
      << progress.Text();
  progress.StepDone(3, 2.0);
  progress.StepDone(4, 2.0);
  progress.Stop();
  const std::string text = Contents(f);
  std::fclose(f);
  // The first and the last step always have a line; steps within a second
  // of the previous line do not.
  EXPECT_NE(text.find("shardings: step 1/4 running"), std::string::npos)
      << text;
  EXPECT_NE(text.find("shardings: step 4/4 done, last step 2.00 s"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("step 3/4"), std::string::npos) << text;
}

TEST(ProgressTest, OnATerminalOneLineIsRedrawnAndClearedAtTheEnd) {
  FILE* f = std::tmpfile();
  Progress::Options options{.out = f, .in_place = true, .prefix = "x"};
  options.redraw_seconds = 0.05;
  Progress progress(options);
  progress.Phase("creating the weights");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  progress.Stop();
  const std::string text = Contents(f);
  std::fclose(f);
  EXPECT_GE(Count(text, "\r\033[Kx: creating the weights, "), 3) << text;
  EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  EXPECT_EQ(text.rfind("\r\033[K"), text.size() - 4) << text;
}

// The command itself: progress on stderr without a terminal (stdout stays the
// original's report), on stdout in place with one.
TEST(ShardingsProgressTest, EveryPhaseAndStepIsReported) {
  using testing_util::ReadFile;
  const std::string dir = ::testing::TempDir();
  const std::vector<std::string> args = {
      "shardings", "-d", "64", "-b", "64", "-n", "1", "--steps", "3"};
  testing_util::Child c =
      testing_util::Spawn(args, {}, dir, "shardings_progress");
  ASSERT_EQ(testing_util::WaitExit(c, 100), 0) << ReadFile(c.err);
  const std::string err = ReadFile(c.err);
  EXPECT_NE(err.find("shardings: measuring the matmul peak"), std::string::npos)
      << err;
  EXPECT_NE(err.find("shardings: creating the weights"), std::string::npos)
      << err;
  EXPECT_NE(err.find("shardings: step 4/4 done"), std::string::npos) << err;
  EXPECT_EQ(ReadFile(c.out).find("shardings: step"), std::string::npos);

  testing_util::Child t = testing_util::Spawn(args, {"MULTISLICE_PROGRESS=1"},
                                              dir, "shardings_progress_tty");
  ASSERT_EQ(testing_util::WaitExit(t, 100), 0) << ReadFile(t.err);
  const std::string out = ReadFile(t.out);
  EXPECT_NE(out.find("\r\033[Kshardings: step"), std::string::npos) << out;
  // The line is cleared before the report.
  EXPECT_NE(out.find("\r\033[Kaverage time: "), std::string::npos) << out;
}

}  // namespace
}  // namespace multislice::cli
