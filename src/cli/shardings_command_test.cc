// `multislice shardings` on bad input: every case ends in one line naming
// what is wrong and exit code 2, before any worker starts. (The workload
// itself is tested in model/shardings_test.cc.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/commands.h"

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
        BadCase{{"--accelerator_type", "v4-8"}, "can be planned for"},
        BadCase{{"--accelerator_type", "gpu-2"}, "unknown accelerator type"},
        BadCase{{"-d", "abc"},
                "--embedding_dimension: 'abc' is not an integer"}));

}  // namespace
}  // namespace multislice::cli
