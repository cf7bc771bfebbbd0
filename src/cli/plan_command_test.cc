// Tests of `multislice plan` end to end: parsed with CLI11 from an argv, run
// from the command table, output captured (as flags_test.cc does for mesh).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/commands.h"

namespace multislice::cli {

// Declared in cli/commands.h once the command is registered there; repeated
// here so that this test does not depend on that.
void AddPlanCommand(CLI::App& root, CommandTable& table);

namespace {

struct CommandRun {
  int exit_code = 0;
  std::string out;
  std::string err;
};

CommandRun RunPlan(const std::vector<std::string>& args) {
  CLI::App root{"test", "multislice"};
  root.require_subcommand(1);
  CommandTable table;
  AddPlanCommand(root, table);
  std::vector<std::string> full = {"multislice", "plan"};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<const char*> argv;
  for (const std::string& arg : full) argv.push_back(arg.c_str());
  CommandRun run;
  try {
    root.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    run.exit_code = 2;
    run.err = e.what();
    return run;
  }
  const CLI::App* plan_app = root.get_subcommands().front();
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  run.exit_code = table.at(plan_app)();
  run.out = testing::internal::GetCapturedStdout();
  run.err = testing::internal::GetCapturedStderr();
  return run;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PlanCommandTest, V4TwoSlicesPrintsTheSeedsNumbers) {
  CommandRun run =
      RunPlan({"--accelerator_type", "v4-16", "--num_slices", "2",
               "--parameters", "16e9", "--tokens_per_slice", "350000"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err, "");
  const std::string& out = run.out;
  EXPECT_TRUE(Contains(out,
                       "Plan: v4-16 x 2 slices (8 chips per slice, 4 per "
                       "host, 2 hosts per slice)\n"))
      << out;
  EXPECT_TRUE(Contains(out,
                       "  arithmetic intensity        22,000 FLOP/bit = 4 x "
                       "275e12 / 50e9\n"))
      << out;
  EXPECT_TRUE(Contains(out,
                       "  DCN bits per parameter      32 (32-bit gradients x "
                       "all-reduce factor 1, seed)\n"))
      << out;
  EXPECT_TRUE(Contains(out,
                       "  operational intensity       43,750 FLOP/bit = 4 x "
                       "350,000 / 32\n"))
      << out;
  EXPECT_TRUE(Contains(out,
                       "  minimum per slice           176,000 tokens = 22,000 "
                       "x 32 / 4\n"))
      << out;
  EXPECT_TRUE(Contains(out,
                       "  recommended per slice       350,000 tokens (margin "
                       "2x, 2 significant digits)\n"))
      << out;
  EXPECT_TRUE(Contains(out, "  DCN hidden                  yes\n")) << out;
  EXPECT_TRUE(Contains(out, "  scaling efficiency          100.0%\n")) << out;
  EXPECT_TRUE(Contains(out,
                       "Recommendation: dcn_data (dcn_data_parallelism=2 "
                       "dcn_fsdp_parallelism=1 dcn_pipeline_parallelism=1 "
                       "dcn_tensor_parallelism=1)\n"))
      << out;
}

TEST(PlanCommandTest, V4ManySlicesNeed352kAnd700k) {
  CommandRun run =
      RunPlan({"--accelerator-type", "v4-16", "--num-slices", "8",
               "--parameters", "16B", "--global-batch-tokens", "5.6M"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(Contains(run.out,
                       "tokens per slice            700,000 (global "
                       "5,600,000)\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out,
                       "  minimum per slice           352,000 tokens = 22,000 "
                       "x 64 / 4\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out, "  recommended per slice       700,000 tokens"))
      << run.out;
  EXPECT_TRUE(Contains(run.out,
                       "Recommendation: dcn_data (dcn_data_"
                       "parallelism=8 "))
      << run.out;
}

TEST(PlanCommandTest, SmallBatchAcrossManySlicesRecommendsAPipeline) {
  CommandRun run =
      RunPlan({"--accelerator_type", "v4-16", "--num_slices", "8",
               "--parameters", "16e9", "--tokens_per_slice", "100k"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(Contains(run.out,
                       "Predicted step: pipeline (depth 4, 2 data-parallel "
                       "replicas, 16 microbatches)\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out,
                       "Recommendation: pipeline of depth 4 "
                       "(dcn_data_parallelism=2 dcn_fsdp_parallelism=1 "
                       "dcn_pipeline_parallelism=4 dcn_tensor_parallelism=1)"))
      << run.out;
}

TEST(PlanCommandTest, CpuWithGivenPeakAndBandwidth) {
  CommandRun run =
      RunPlan({"--accelerator_type", "cpu-2", "--num_slices", "2",
               "--parameters", "100M", "--tokens_per_slice", "4k",
               "--peak_flops_per_chip", "50e9", "--dcn_gbps_per_host", "10"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(Contains(run.out,
                       "Plan: cpu-2 x 2 slices (2 devices per slice, 2 per "
                       "host, 1 host per slice)\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out,
                       "  peak per chip               50 GFLOP/s "
                       "(given)\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out,
                       "  arithmetic intensity        10 FLOP/bit = 2 x 50e9 "
                       "/ 10e9\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out, "  minimum per slice           80 tokens"))
      << run.out;
  EXPECT_TRUE(Contains(run.out, "(memory not checked)")) << run.out;
}

TEST(PlanCommandTest, JsonHasEveryInputAndOutput) {
  CommandRun run = RunPlan({"--accelerator_type", "v4-16", "--num_slices", "2",
                            "--parameters", "16e9", "--tokens_per_slice",
                            "350k", "--mfu", "0.5", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json out = nlohmann::json::parse(run.out);
  const nlohmann::json& in = out["inputs"];
  EXPECT_EQ(in["accelerator_type"], "v4-16");
  EXPECT_EQ(in["num_slices"], 2);
  EXPECT_EQ(in["parameters"], 16e9);
  EXPECT_EQ(in["tokens_per_slice"], 350000);
  EXPECT_EQ(in["global_batch_tokens"], 700000);
  EXPECT_EQ(in["peak_flops_per_chip"], 275e12);
  EXPECT_EQ(in["dcn_bits_per_second_per_host"], 50e9);
  EXPECT_EQ(in["mfu"], 0.5);
  EXPECT_EQ(in["gradient_bits"], 32);
  EXPECT_EQ(in["strategy"], "auto");
  EXPECT_EQ(out["arithmetic_intensity_flops_per_bit"], 22000);
  EXPECT_EQ(out["dcn_bits_per_parameter"], 32);
  EXPECT_EQ(out["operational_intensity_flops_per_bit"], 43750);
  EXPECT_EQ(out["minimum_tokens_per_slice"], 176000);
  EXPECT_EQ(out["recommended_tokens_per_slice"], 350000);
  EXPECT_EQ(out["estimate"]["strategy"], "dcn_data");
  EXPECT_EQ(out["estimate"]["dcn_hidden"], true);
  EXPECT_EQ(out["estimate"]["scaling_efficiency"], 1.0);
  EXPECT_DOUBLE_EQ(out["estimate"]["backward_seconds"].get<double>(),
                   4 * 350000 * 16e9 / (8 * 275e12 * 0.5));
  EXPECT_EQ(out["recommendation"]["strategy"], "dcn_data");
  EXPECT_EQ(out["recommendation"]["dcn_tensor_parallelism"], 1);
  EXPECT_TRUE(out["recommendation"]["reason"].is_string());
}

TEST(PlanCommandTest, OneSliceJsonHasNullIntensity) {
  CommandRun run =
      RunPlan({"--accelerator_type", "v5litepod-16", "--parameters", "1e9",
               "--tokens_per_slice", "1e5", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json out = nlohmann::json::parse(run.out);
  EXPECT_TRUE(out["operational_intensity_flops_per_bit"].is_null());
  EXPECT_EQ(out["arithmetic_intensity_flops_per_bit"], 7880);
}

TEST(PlanCommandTest, NumbersTakeSuffixesAndExponents) {
  struct Case {
    std::string text;
    double value;
  };
  const Case cases[] = {{"16e9", 16e9},   {"16B", 16e9},   {"16b", 16e9},
                        {"16G", 16e9},    {"1.5M", 1.5e6}, {"350k", 350000},
                        {"350K", 350000}, {"2T", 2e12},    {"123", 123},
                        {"0.5e3", 500}};
  for (const Case& c : cases) {
    CommandRun run = RunPlan({"--accelerator_type", "v4-16", "--parameters",
                              c.text, "--tokens_per_slice", "1000", "--json"});
    ASSERT_EQ(run.exit_code, 0) << c.text << ": " << run.err;
    EXPECT_EQ(nlohmann::json::parse(run.out)["inputs"]["parameters"], c.value)
        << c.text;
  }
}

TEST(PlanCommandTest, BadNumbersNameTheFlag) {
  for (const std::string bad : {"abc", "", "1x", "+5", " 5", "5 ", "16BB",
                                "inf", "nan", "1e999", "0x10", "1e"}) {
    CommandRun run = RunPlan({"--accelerator_type", "v4-16", "--parameters",
                              bad, "--tokens_per_slice", "1000"});
    EXPECT_EQ(run.exit_code, 2) << bad;
    EXPECT_EQ(run.err, "--parameters: '" + bad +
                           "' is not a number (e.g. 16e9, 350k, 1.5M, 16B)");
  }
  CommandRun run = RunPlan({"--accelerator_type", "v4-16", "--parameters",
                            "1e9", "--tokens-per-slice", "lots"});
  EXPECT_EQ(run.err,
            "--tokens_per_slice: 'lots' is not a number (e.g. 16e9, 350k, "
            "1.5M, 16B)");
}

TEST(PlanCommandTest, PipelineDepthImpliesThePipelineStrategy) {
  CommandRun run = RunPlan({"--accelerator_type", "v4-16", "--num_slices", "4",
                            "--parameters", "16e9", "--tokens_per_slice",
                            "350k", "--pipeline_depth", "2", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json out = nlohmann::json::parse(run.out);
  EXPECT_EQ(out["inputs"]["strategy"], "pipeline");
  EXPECT_EQ(out["estimate"]["pipeline_depth"], 2);
  EXPECT_EQ(out["estimate"]["pipeline_microbatches"], 8);
}

TEST(PlanCommandTest, ErrorsAreOneLineAndExitTwo) {
  const std::vector<std::string> v4 = {"--accelerator_type", "v4-16",
                                       "--parameters",       "16e9",
                                       "--tokens_per_slice", "350k"};
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  auto with = [&v4](std::vector<std::string> extra) {
    std::vector<std::string> args = v4;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const Case cases[] = {
      {{"--accelerator_type", "v9-8", "--parameters", "1e9",
        "--tokens_per_slice", "1k"},
       "multislice plan: unknown accelerator type 'v9-8': expected one of "
       "v4-N, v5p-N, v5litepod-N, v6e-N (TPU) or cpu-N "
       "(CPU devices)\n"},
      {{"--parameters", "1e9", "--tokens_per_slice", "1k"},
       "multislice plan: --accelerator_type is required (e.g. v4-16, or "
       "cpu-4 with --peak_flops_per_chip and --dcn_gbps_per_host)\n"},
      {{"--accelerator_type", "v4-16", "--tokens_per_slice", "1k"},
       "multislice plan: --parameters is required (e.g. 16e9 or 16B)\n"},
      {{"--accelerator_type", "cpu-2", "--num_slices", "2", "--parameters",
        "1e8", "--tokens_per_slice", "4k", "--dcn_gbps_per_host", "10"},
       "multislice plan: --peak_flops_per_chip is required for cpu-2 (a CPU "
       "has no published peak; measure it with `multislice peak`)\n"},
      {{"--accelerator_type", "cpu-2", "--num_slices", "2", "--parameters",
        "1e8", "--tokens_per_slice", "4k", "--peak_flops_per_chip", "5e10"},
       "multislice plan: --dcn_gbps_per_host is required for cpu-2 (measure "
       "it with `multislice bench collectives` --paths dcn)\n"},
      {with({"--num_slices", "0"}),
       "multislice plan: --num_slices must be from 1 to 256, got 0\n"},
      {with({"--parameters", "-16e9"}),
       "multislice plan: --parameters must be a positive number, got "
       "-1.6e+10\n"},
      {with({"--tokens_per_slice", "0"}),
       "multislice plan: --tokens_per_slice must be a positive number, got "
       "0\n"},
      {with({"--dcn_gbps_per_host", "0"}),
       "multislice plan: --dcn_gbps_per_host must be a positive number, got "
       "0\n"},
      {with({"--mfu", "2"}),
       "multislice plan: --mfu must be in (0, 1], got 2\n"},
      {with({"--gradient_dtype", "f64"}),
       "multislice plan: --gradient_dtype: 'f64' is not a dtype; expected "
       "bfloat16 (bf16) or float32 (f32)\n"},
      {with({"--strategy", "dcn_tensor"}),
       "multislice plan: --strategy: 'dcn_tensor' is not one of auto, "
       "dcn_data, dcn_fsdp, pipeline\n"},
      {with({"--dcn_volume", "tree"}),
       "multislice plan: --dcn_volume: 'tree' is not one of seed, ring\n"},
      {with({"--num_slices", "4", "--pipeline_depth", "3"}),
       "multislice plan: --pipeline_depth must be 0 (the seed's rule) or a "
       "divisor of --num_slices 4 from 2 to 4, got 3\n"},
      {with({"--num_slices", "2", "--global_batch_tokens", "1M"}),
       "multislice plan: --global_batch_tokens 1000000 does not equal "
       "--tokens_per_slice 350000 times --num_slices 2 (700000); give one of "
       "them\n"},
  };
  for (const Case& c : cases) {
    CommandRun run = RunPlan(c.args);
    EXPECT_EQ(run.exit_code, 2) << c.err;
    EXPECT_EQ(run.err, c.err);
    EXPECT_EQ(run.out, "");
  }
}

TEST(PlanCommandTest, HelpHasAnExample) {
  CLI::App root{"test", "multislice"};
  CommandTable table;
  AddPlanCommand(root, table);
  const std::string help = root.get_subcommand("plan")->help();
  EXPECT_TRUE(Contains(help,
                       "multislice plan --accelerator_type v4-16 --num_slices "
                       "2 --parameters 16e9 --tokens_per_slice 350000"))
      << help;
  EXPECT_TRUE(Contains(help, "--dcn-gbps-per-host")) << help;
}

}  // namespace
}  // namespace multislice::cli
