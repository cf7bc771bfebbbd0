// Tests of the flag helpers, and of `multislice mesh` end to end (parsed
// with CLI11 from an argv, run from the command table, output captured).
#include "cli/flags.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/commands.h"

namespace multislice::cli {
namespace {

// Parses `args` (without the program name); returns the error text, or ""
// when parsing succeeded.
std::string Parse(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"prog"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(FlagNamesTest, UnderscoreFirstThenDashed) {
  EXPECT_EQ(FlagNames("ici_fsdp_parallelism"),
            "--ici_fsdp_parallelism,--ici-fsdp-parallelism");
  EXPECT_EQ(FlagNames("json"), "--json");
  EXPECT_EQ(FlagNames("batch_size", "-b"), "--batch_size,--batch-size,-b");
  EXPECT_EQ(FlagNames("batch_size", "b"), "--batch_size,--batch-size,-b");
}

TEST(ParseIntegerTest, WholeDecimalsOnly) {
  EXPECT_EQ(ParseInteger("42"), 42);
  EXPECT_EQ(ParseInteger("-1"), -1);
  EXPECT_EQ(ParseInteger("007"), 7);
  EXPECT_EQ(ParseInteger("0"), 0);
  EXPECT_EQ(ParseInteger("9223372036854775807"), 9223372036854775807LL);
  for (const std::string bad : {"", "-", "abc", "1.5", "0x10", "+3", " 3", "3 ",
                                "1e3", "--1", "4k", "9223372036854775808"}) {
    EXPECT_FALSE(ParseInteger(bad).has_value()) << bad;
  }
}

TEST(AddIntFlagTest, BothSpellingsAndDefaults) {
  for (const std::string spelling :
       {"--ici_fsdp_parallelism", "--ici-fsdp-parallelism"}) {
    CLI::App app;
    int value = 1;
    AddIntFlag(&app, "ici_fsdp_parallelism", &value, "help");
    EXPECT_EQ(Parse(app, {spelling, "4"}), "");
    EXPECT_EQ(value, 4);
  }
  CLI::App app;
  int value = 1;
  int untouched = 7;
  AddIntFlag(&app, "ici_fsdp_parallelism", &value, "help");
  AddIntFlag(&app, "num_slices", &untouched, "help");
  EXPECT_EQ(Parse(app, {"--ici_fsdp_parallelism=-1"}), "");
  EXPECT_EQ(value, -1);
  EXPECT_EQ(untouched, 7);
}

TEST(AddIntFlagTest, NegativeValueAfterASpace) {
  CLI::App app;
  int value = 1;
  AddIntFlag(&app, "dcn_data_parallelism", &value, "help");
  EXPECT_EQ(Parse(app, {"--dcn_data_parallelism", "-1"}), "");
  EXPECT_EQ(value, -1);
}

TEST(AddIntFlagTest, LastOfRepeatedFlagsWins) {
  CLI::App app;
  int value = 1;
  AddIntFlag(&app, "num_slices", &value, "help");
  EXPECT_EQ(Parse(app, {"--num_slices", "2", "--num-slices", "3"}), "");
  EXPECT_EQ(value, 3);
}

TEST(AddIntFlagTest, BadValuesNameTheUnderscoreFlag) {
  for (const std::string spelling :
       {"--ici_fsdp_parallelism", "--ici-fsdp-parallelism"}) {
    CLI::App app;
    int value = 1;
    AddIntFlag(&app, "ici_fsdp_parallelism", &value, "help");
    EXPECT_EQ(Parse(app, {spelling, "abc"}),
              "--ici_fsdp_parallelism: 'abc' is not an integer");
  }
  for (const std::string bad : {"1.5", "0x10", "4k", "-"}) {
    CLI::App app;
    int value = 1;
    AddIntFlag(&app, "num_slices", &value, "help");
    EXPECT_EQ(Parse(app, {"--num_slices=" + bad}),
              "--num_slices: '" + bad + "' is not an integer");
    EXPECT_EQ(value, 1);
  }
  CLI::App app;
  int value = 1;
  AddIntFlag(&app, "num_slices", &value, "help");
  EXPECT_EQ(Parse(app, {"--num_slices", "3000000000"}),
            "--num_slices: '3000000000' is not an integer from -2147483648 "
            "to 2147483647");
}

TEST(AddIntFlagTest, HelpShowsTheDefault) {
  CLI::App app;
  int value = 4;
  AddIntFlag(&app, "ici_fsdp_parallelism", &value, "Devices along fsdp.");
  const std::string help = app.help();
  EXPECT_NE(help.find("--ici_fsdp_parallelism"), std::string::npos) << help;
  EXPECT_NE(help.find("--ici-fsdp-parallelism"), std::string::npos) << help;
  EXPECT_NE(help.find("INT"), std::string::npos) << help;
  EXPECT_NE(help.find("4"), std::string::npos) << help;
}

TEST(AddParallelismFlagsTest, EightFlagsWithDefaultsFromTheConfig) {
  CLI::App app;
  mesh::ParallelismConfig config;
  config.ici = {1, 1, 1, 4, 1};
  AddParallelismFlags(&app, &config);
  EXPECT_EQ(
      Parse(app, {"--ici_data_parallelism", "2",
                  "--ici-tensor-"
                  "parallelism",
                  "-1", "--dcn_data_parallelism", "3", "--dcn-fsdp-parallelism",
                  "5", "--dcn_tensor_parallelism=7"}),
      "");
  EXPECT_EQ(config.ici, (mesh::AxisSizes{1, 2, 1, 4, -1}));
  EXPECT_EQ(config.dcn, (mesh::AxisSizes{1, 3, 1, 5, 7}));

  // The stage axis has MaxText's keys, *_pipeline_parallelism.
  CLI::App stages;
  mesh::ParallelismConfig staged;
  AddParallelismFlags(&stages, &staged);
  EXPECT_EQ(Parse(stages, {"--ici_pipeline_parallelism", "2",
                           "--dcn_pipeline_parallelism", "2"}),
            "");
  EXPECT_EQ(staged.ici[mesh::kStage], 2);
  EXPECT_EQ(staged.dcn[mesh::kStage], 2);
  EXPECT_EQ(staged.ici, (mesh::AxisSizes{1, 1, 2, 1, 1}));
  EXPECT_EQ(staged.dcn, (mesh::AxisSizes{1, 1, 2, 1, 1}));
  CLI::App dashes;
  mesh::ParallelismConfig dashed;
  AddParallelismFlags(&dashes, &dashed);
  EXPECT_EQ(Parse(dashes, {"--dcn-pipeline-parallelism=-1"}), "");
  EXPECT_EQ(dashed.dcn, (mesh::AxisSizes{1, 1, -1, 1, 1}));

  CLI::App bad;
  mesh::ParallelismConfig other;
  AddParallelismFlags(&bad, &other);
  EXPECT_EQ(Parse(bad, {"--dcn-tensor-parallelism", "x"}),
            "--dcn_tensor_parallelism: 'x' is not an integer");
}

TEST(AddStringAndBoolFlagTest, BothSpellings) {
  CLI::App app;
  std::string type;
  bool json = false;
  AddStringFlag(&app, "accelerator_type", &type, "help");
  AddBoolFlag(&app, "json", &json, "help");
  EXPECT_EQ(Parse(app, {"--accelerator-type", "v4-16", "--json"}), "");
  EXPECT_EQ(type, "v4-16");
  EXPECT_TRUE(json);
}

TEST(AliasTest, UpperCaseSpellingsWriteTheSameTargetAndNameThemselves) {
  CLI::App app;
  int slices = 1;
  std::string command;
  bool existing = false;
  AddIntFlag(&app, "num_slices", &slices, "Slices.");
  AddIntAlias(&app, "NUM_SLICES", &slices);
  AddStringFlag(&app, "command", &command, "Command.");
  AddStringAlias(&app, "COMMAND", &command);
  AddBoolFlag(&app, "use_existing_folder", &existing, "Existing.");
  AddBoolAlias(&app, "USE_EXISTING_FOLDER", &existing);
  EXPECT_EQ(Parse(app, {"--NUM_SLICES=3", "--COMMAND", "bash x.sh",
                        "--USE_EXISTING_FOLDER=True"}),
            "");
  EXPECT_EQ(slices, 3);
  EXPECT_EQ(command, "bash x.sh");
  EXPECT_TRUE(existing);
  EXPECT_EQ(Spelled(&app, "num_slices", "NUM_SLICES"), "--NUM_SLICES");
  EXPECT_EQ(Spelled(&app, "command", "COMMAND"), "--COMMAND");
  EXPECT_EQ(app.help().find("NUM_SLICES"), std::string::npos) << app.help();

  CLI::App lower;
  AddIntFlag(&lower, "num_slices", &slices, "Slices.");
  AddIntAlias(&lower, "NUM_SLICES", &slices);
  AddBoolAlias(&lower, "USE_EXISTING_FOLDER", &existing);
  EXPECT_EQ(
      Parse(lower, {"--num_slices", "2", "--USE_EXISTING_FOLDER", "false"}),
      "");
  EXPECT_EQ(slices, 2);
  EXPECT_FALSE(existing);
  EXPECT_EQ(Spelled(&lower, "num_slices", "NUM_SLICES"), "--num_slices");
}

TEST(AliasTest, BadValuesNameTheSpellingTyped) {
  CLI::App app;
  int slices = 1;
  bool existing = false;
  AddIntFlag(&app, "num_slices", &slices, "Slices.");
  AddIntAlias(&app, "NUM_SLICES", &slices);
  AddBoolAlias(&app, "USE_EXISTING_FOLDER", &existing);
  EXPECT_EQ(Parse(app, {"--NUM_SLICES", "two"}),
            "--NUM_SLICES: 'two' is not an integer");
  CLI::App other;
  AddBoolAlias(&other, "USE_EXISTING_FOLDER", &existing);
  EXPECT_EQ(Parse(other, {"--USE_EXISTING_FOLDER=maybe"}),
            "--USE_EXISTING_FOLDER: 'maybe' is not true or false");
}

TEST(ParseByteSizeTest, BinarySuffixes) {
  EXPECT_EQ(ParseByteSize("1048576"), 1048576);
  EXPECT_EQ(ParseByteSize("0"), 0);
  EXPECT_EQ(ParseByteSize("1K"), 1024);
  EXPECT_EQ(ParseByteSize("1k"), 1024);
  EXPECT_EQ(ParseByteSize("2KB"), 2048);
  EXPECT_EQ(ParseByteSize("64M"), 64LL << 20);
  EXPECT_EQ(ParseByteSize("256MiB"), 256LL << 20);
  EXPECT_EQ(ParseByteSize("1G"), 1LL << 30);
  EXPECT_EQ(ParseByteSize("3gib"), 3LL << 30);
  EXPECT_EQ(ParseByteSize("2T"), 2LL << 40);
  EXPECT_EQ(ParseByteSize("512B"), 512);
  for (const std::string bad :
       {"", "abc", "K", "-1", "1.5M", "1 K", "1KX", "1Mi", "+1",
        "99999999999999999999", "9999999999T"}) {
    EXPECT_EQ(ParseByteSize(bad), -1) << bad;
  }
}

TEST(AddSizeFlagTest, ParsesAndRejects) {
  CLI::App app;
  long long bytes = 1024;
  AddSizeFlag(&app, "buffer_size", &bytes, "help");
  EXPECT_EQ(Parse(app, {"--buffer-size", "64MiB"}), "");
  EXPECT_EQ(bytes, 64LL << 20);
  CLI::App bad;
  AddSizeFlag(&bad, "buffer_size", &bytes, "help");
  EXPECT_EQ(Parse(bad, {"--buffer_size", "lots"}),
            "--buffer_size: 'lots' is not a byte size (e.g. 1048576, 64K, "
            "256MiB)");
}

// `multislice mesh`, run the way main.cc runs it.
struct CommandRun {
  int exit_code = 0;
  std::string out;
  std::string err;
};

CommandRun RunMesh(const std::vector<std::string>& args) {
  CLI::App root{"test", "multislice"};
  root.require_subcommand(1);
  CommandTable table;
  AddMeshCommand(root, table);
  std::vector<std::string> full = {"mesh"};
  full.insert(full.end(), args.begin(), args.end());
  CommandRun run;
  const std::string parse_error = Parse(root, full);
  if (!parse_error.empty()) {
    run.exit_code = 2;
    run.err = parse_error;
    return run;
  }
  const CLI::App* mesh_app = root.get_subcommands().front();
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  run.exit_code = table.at(mesh_app)();
  run.out = testing::internal::GetCapturedStdout();
  run.err = testing::internal::GetCapturedStderr();
  return run;
}

TEST(MeshCommandTest, TwoCpuSlicesPrintLikeShardingsPy) {
  CommandRun run =
      RunMesh({"--accelerator_type", "cpu-4", "--num_slices", "2",
               "--dcn_data_parallelism", "2", "--ici_fsdp_parallelism", "4"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out,
            "Devices: [CpuDevice(id=0, slice_index=0), CpuDevice(id=1, "
            "slice_index=0), CpuDevice(id=2, slice_index=0), CpuDevice(id=3, "
            "slice_index=0), CpuDevice(id=4, slice_index=1), CpuDevice(id=5, "
            "slice_index=1), CpuDevice(id=6, slice_index=1), CpuDevice(id=7, "
            "slice_index=1)] (num_devices: 8)\n"
            "Axis names: ('diloco', 'data', 'stage', 'fsdp', 'tensor')\n"
            "Mesh shape: (1, 2, 1, 4, 1)\n"
            "Device ids:\n"
            "[[[[[0]\n    [1]\n    [2]\n    [3]]]\n\n\n"
            "  [[[4]\n    [5]\n    [6]\n    [7]]]]]\n");
  EXPECT_EQ(run.err, "");
}

// Two pipeline stages, one per slice, as MaxText's mesh holds them.
TEST(MeshCommandTest, StageAxisAcrossSlices) {
  CommandRun run = RunMesh({"--accelerator_type", "cpu-2", "--num_slices", "2",
                            "--dcn_pipeline_parallelism", "2",
                            "--ici_fsdp_parallelism", "2"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(
      run.out.find("Axis names: ('diloco', 'data', 'stage', 'fsdp', 'tensor')\n"
                   "Mesh shape: (1, 1, 2, 2, 1)\n"
                   "Device ids:\n"
                   "[[[[[0]\n    [1]]\n\n   [[2]\n    [3]]]]]\n"),
      std::string::npos)
      << run.out;
}

TEST(MeshCommandTest, DefaultTypeIsCpuOfTheIciProduct) {
  CommandRun run =
      RunMesh({"--ici_fsdp_parallelism", "2", "--ici_tensor_parallelism", "2"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("(num_devices: 4)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("Mesh shape: (1, 1, 1, 2, 2)\n"), std::string::npos);
  EXPECT_NE(run.out.find("[[[[[0 1]\n    [2 3]]]]]\n"), std::string::npos);
}

TEST(MeshCommandTest, TpuTypesPlan) {
  CommandRun run =
      RunMesh({"--accelerator_type", "v4-16", "--num_slices", "4",
               "--dcn_data_parallelism", "-1", "--ici_fsdp_parallelism", "-1"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("TpuDevice(id=0, slice_index=0, host=0), "
                         "TpuDevice(id=1, slice_index=0, host=0)"),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("TpuDevice(id=31, slice_index=3, host=1)] "
                         "(num_devices: 32)\n"),
            std::string::npos);
  EXPECT_NE(run.out.find("Mesh shape: (1, 4, 1, 8, 1)\n"), std::string::npos);
}

TEST(MeshCommandTest, JsonObject) {
  CommandRun run = RunMesh({"--accelerator-type", "cpu-2", "--num-slices", "2",
                            "--dcn-fsdp-parallelism", "2",
                            "--ici-fsdp-parallelism", "2", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json out = nlohmann::json::parse(run.out);
  EXPECT_EQ(out["accelerator_type"], "cpu-2");
  EXPECT_EQ(out["num_slices"], 2);
  EXPECT_EQ(out["axis_names"],
            nlohmann::json::parse(
                R"(["diloco", "data", "stage", "fsdp", "tensor"])"));
  EXPECT_EQ(out["shape"], nlohmann::json::parse("[1, 1, 1, 4, 1]"));
  EXPECT_EQ(out["ici_parallelism"], nlohmann::json::parse("[1, 1, 1, 2, 1]"));
  EXPECT_EQ(out["dcn_parallelism"], nlohmann::json::parse("[1, 1, 1, 2, 1]"));
  EXPECT_EQ(out["device_ids"],
            nlohmann::json::parse("[[[[[0], [1], [2], [3]]]]]"));
  ASSERT_EQ(out["devices"].size(), 4u);
  EXPECT_EQ(out["devices"][3],
            nlohmann::json::parse(
                R"({"id": 3, "slice_index": 1, "host": 0, "local_index": 1})"));
}

TEST(MeshCommandTest, ErrorsAreOneLineAndExitTwo) {
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  const Case cases[] = {
      {{"--accelerator_type", "cpu-4", "--ici_fsdp_parallelism", "3"},
       "multislice mesh: Number of devices per slice 4 does not match the "
       "product of the ICI parallelism 3\n"},
      {{"--accelerator_type", "cpu-4", "--ici_fsdp_parallelism", "-1",
        "--ici_tensor_parallelism", "-1"},
       "multislice mesh: Found unspecified values (-1) for more than one ICI "
       "parallelism axis. At most one axis can be unspecified.\n"},
      {{"--accelerator_type", "v9-8"},
       "multislice mesh: unknown accelerator type 'v9-8': expected one of "
       "v4-N, v5p-N, v5litepod-N, v6e-N (TPU) or cpu-N "
       "(CPU devices)\n"},
      {{"--ici_fsdp_parallelism", "-1"},
       "multislice mesh: --accelerator_type is required when an ICI "
       "parallelism value is -1 (for example --accelerator_type cpu-8)\n"},
      {{"--ici_fsdp_parallelism", "0"},
       "multislice mesh: ici_fsdp_parallelism must be a positive integer or "
       "-1, got 0\n"},
      {{"--dcn_pipeline_parallelism", "-2"},
       "multislice mesh: dcn_pipeline_parallelism must be a positive integer "
       "or -1, got -2\n"},
      {{"--accelerator_type", "cpu-4", "--ici_fsdp_parallelism", "-1",
        "--ici_pipeline_parallelism", "-1"},
       "multislice mesh: Found unspecified values (-1) for more than one ICI "
       "parallelism axis. At most one axis can be unspecified.\n"},
      {{"--dcn_data_parallelism", "2"},
       "multislice mesh: DCN parallelism requested but only one slice "
       "available.\n"},
      {{"--num_slices", "2"},
       "multislice mesh: Number of slices 2 does not match the product of "
       "the DCN parallelism 1\n"},
      {{"--num_slices", "0"},
       "multislice mesh: --num_slices must be from 1 to 256, got 0\n"},
      {{"--accelerator_type", "v4-12"},
       "multislice mesh: accelerator type 'v4-12' has an invalid size: v4-N "
       "takes N (TensorCores, 2 per chip) a multiple of 8 from 8 to 8192\n"},
  };
  for (const Case& c : cases) {
    CommandRun run = RunMesh(c.args);
    EXPECT_EQ(run.exit_code, 2) << c.err;
    EXPECT_EQ(run.err, c.err);
    EXPECT_EQ(run.out, "");
  }
}

TEST(MeshCommandTest, NonNumericValueIsAParseError) {
  CommandRun run = RunMesh({"--ici_fsdp_parallelism", "abc"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_EQ(run.err, "--ici_fsdp_parallelism: 'abc' is not an integer");
}

}  // namespace
}  // namespace multislice::cli
