// Tests of `multislice plan` end to end: parsed with CLI11 from an argv, run
// from the command table, output captured (as flags_test.cc does for mesh);
// and the real binary's recommended keys given to `multislice train`.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/command.h"
#include "cli/commands.h"
#include "common/temp_dir.h"

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
                       "dcn_pipeline_parallelism=4 dcn_tensor_parallelism=1 "
                       "num_pipeline_microbatches=16 "
                       "pipeline_parallel_schedule=1F1B)\n"))
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

// A MaxText model file gives the parameters (the published counts of Llama 2
// 7B, Mistral 7B and Gemma 2B) and the width.
TEST(PlanCommandTest, ModelFileGivesParametersAndWidth) {
  for (const auto& [name, parameters, width] :
       {std::tuple{"llama2-7b", 6738415616.0, 4096},
        std::tuple{"mistral-7b", 7241732096.0, 4096},
        std::tuple{"gemma-2b", 2506172416.0, 2048}}) {
    CommandRun run =
        RunPlan({"--accelerator_type", "v5litepod-16", "--num_slices", "2",
                 "--model_name", name, "--tokens_per_slice", "1M", "--json"});
    ASSERT_EQ(run.exit_code, 0) << name << ": " << run.err;
    const nlohmann::json in = nlohmann::json::parse(run.out)["inputs"];
    EXPECT_EQ(in["parameters"], parameters) << name;
    EXPECT_EQ(in["emb_dim"], width) << name;
  }
  CommandRun missing = RunPlan({"--accelerator_type", "v4-16", "--model_name",
                                "llama9-1b", "--tokens_per_slice", "1M"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(Contains(missing.err,
                       "--model_name 'llama9-1b': there is no model file "
                       "llama9-1b.yml in"))
      << missing.err;
  CommandRun both =
      RunPlan({"--accelerator_type", "v4-16", "--model_name", "llama2-7b",
               "--parameters", "7B", "--tokens_per_slice", "1M"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_TRUE(Contains(both.err, "give one")) << both.err;
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
       "multislice plan: --parameters or --model_name is required (e.g. "
       "--parameters 16e9 or --model_name llama2-7b)\n"},
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
       "multislice plan: --pipeline_depth must be 0 (the fastest depth) or a "
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

// This machine's DCN case (two cpu-1 slices at 1e11 FLOP/s and 1 Gbit/s)
// with the quickstart model: the data-parallel minimum is 800 tokens per
// slice.
std::vector<std::string> ThisMachine(const std::string& tokens_per_slice) {
  return {"--accelerator_type",
          "cpu-1",
          "--num_slices",
          "2",
          "--parameters",
          "1.2e7",
          "--tokens_per_slice",
          tokens_per_slice,
          "--peak_flops_per_chip",
          "1e11",
          "--dcn_gbps_per_host",
          "1",
          "--emb_dim",
          "256"};
}

std::vector<std::string> With(std::vector<std::string> args,
                              const std::vector<std::string>& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(PlanCommandTest, TableComparesStrategiesByTokensPerSecond) {
  CommandRun run = RunPlan(ThisMachine("256"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string& out = run.out;
  EXPECT_TRUE(Contains(out, "  emb_dim                     256\n")) << out;
  EXPECT_TRUE(Contains(out,
                       "Strategies across 2 slices, same global batch "
                       "(activations between stages counted, emb_dim 256)\n"
                       "  strategy                step     tokens/s "
                       "DCN/host/step bubble DCN hidden\n"
                       "  dcn_data                445.4 ms 1,149    48 MB  "
                       "       -      no\n"
                       "  dcn_fsdp                576 ms   889      72 MB  "
                       "       -      no\n"
                       "  pipeline depth 2 x 1 dp 208.4 ms 2,457    524.3 KB "
                       "     11.1%  yes        <- recommended\n"))
      << out;
  EXPECT_TRUE(Contains(out,
                       "Recommendation: pipeline of depth 2 "
                       "(dcn_data_parallelism=1 dcn_fsdp_parallelism=1 "
                       "dcn_pipeline_parallelism=2 dcn_tensor_parallelism=1 "
                       "num_pipeline_microbatches=8 "
                       "pipeline_parallel_schedule=1F1B)\n"))
      << out;
  EXPECT_TRUE(Contains(out, "  fill and drain              1.049 ms\n")) << out;
  EXPECT_TRUE(Contains(out, "multiple of 4")) << out;

  // Ten times the minimum: data parallelism, marked in the table.
  CommandRun above = RunPlan(ThisMachine("8192"));
  ASSERT_EQ(above.exit_code, 0) << above.err;
  EXPECT_TRUE(Contains(above.out,
                       "  dcn_data                5.898 s 2,778    48 MB    "
                       "     -      yes        <- recommended\n"))
      << above.out;
  EXPECT_TRUE(Contains(above.out, "Recommendation: dcn_data (")) << above.out;
}

TEST(PlanCommandTest, WithoutEmbDimActivationsAreSaidNotCounted) {
  std::vector<std::string> args = ThisMachine("256");
  args.resize(args.size() - 2);  // no --emb_dim
  CommandRun run = RunPlan(args);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(Contains(run.out,
                       "  emb_dim                     not given: the "
                       "activations between pipeline stages are not "
                       "counted\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out,
                       "(activations between stages not counted: give "
                       "--emb_dim)\n"))
      << run.out;
  EXPECT_TRUE(Contains(run.out,
                       "  activations                 not counted (give "
                       "--emb_dim)\n"))
      << run.out;
  // --base_emb_dim is MaxText's other name for the width.
  CommandRun alias = RunPlan(With(args, {"--base_emb_dim", "256", "--json"}));
  ASSERT_EQ(alias.exit_code, 0) << alias.err;
  const nlohmann::json out = nlohmann::json::parse(alias.out);
  EXPECT_EQ(out["inputs"]["emb_dim"], 256);
  EXPECT_EQ(out["activations_counted"], true);
  EXPECT_TRUE(nlohmann::json::parse(
                  RunPlan(With(args, {"--json"})).out)["inputs"]["emb_dim"]
                  .is_null());
  CommandRun bad = RunPlan(With(args, {"--emb_dim", "2.5"}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err,
            "multislice plan: --emb_dim must be a positive whole number (the "
            "model width), got 2.5\n");
}

TEST(PlanCommandTest, JsonListsEveryStrategyAndTheTrainKeys) {
  CommandRun run = RunPlan(With(ThisMachine("256"), {"--json"}));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json out = nlohmann::json::parse(run.out);
  const nlohmann::json& strategies = out["strategies"];
  ASSERT_EQ(strategies.size(), 3u);
  EXPECT_EQ(strategies[0]["strategy"], "dcn_data");
  EXPECT_EQ(strategies[1]["strategy"], "dcn_fsdp");
  EXPECT_EQ(strategies[2]["strategy"], "pipeline");
  EXPECT_EQ(strategies[2]["pipeline_depth"], 2);
  EXPECT_DOUBLE_EQ(strategies[2]["bubble_fraction"].get<double>(), 1.0 / 9);
  // 512 tokens per step / (forward + backward of 6 x 256 x 1.2e7 FLOPs at
  // 1e11 FLOP/s, x 9/8, + the fill and drain 2 x 512 x 256 x 32 / 1e9 / 8).
  const double step = 6 * 256 * 1.2e7 / 1e11 * 9 / 8 + 2 * 512 * 256 * 32 / 8e9;
  EXPECT_DOUBLE_EQ(strategies[2]["step_seconds"].get<double>(), step);
  EXPECT_DOUBLE_EQ(strategies[2]["tokens_per_second"].get<double>(),
                   512 / step);
  EXPECT_DOUBLE_EQ(strategies[2]["dcn_bytes_per_host"].get<double>(),
                   512 * 256 * 4);
  EXPECT_DOUBLE_EQ(strategies[0]["dcn_bytes_per_host"].get<double>(),
                   32 * 1.2e7 / 8);
  const nlohmann::json& rec = out["recommendation"];
  EXPECT_EQ(rec["strategy"], "pipeline");
  EXPECT_EQ(rec["num_pipeline_microbatches"], 8);
  EXPECT_EQ(rec["pipeline_parallel_schedule"], "1F1B");
  EXPECT_EQ(rec["keys"],
            nlohmann::json::parse(
                R"(["dcn_data_parallelism=1", "dcn_fsdp_parallelism=1",
                    "dcn_pipeline_parallelism=2", "dcn_tensor_parallelism=1",
                    "num_pipeline_microbatches=8",
                    "pipeline_parallel_schedule=1F1B"])"));
}

// The real `multislice plan` and `multislice train` binaries: the keys plan
// recommends (--json's recommendation.keys, which the text's key line
// repeats) train one step on a tiny model over the same 2 cpu-1 slices, and
// the run's config.json holds them.
class PlanIntoTrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir("multislice-plan-data-");
    testing_util::Child prep = testing_util::Spawn(
        {"data", "prepare", "--output", data_->path() + "/ds"}, {},
        data_->path(), "prepare");
    ASSERT_EQ(testing_util::WaitExit(prep, 60), 0)
        << testing_util::ReadFile(prep.err);
    std::ofstream(data_->path() + "/tiny.yml")
        << "emb_dim: 64\nnum_heads: 2\nnum_decoder_layers: 2\nmlp_dim: 128\n"
           "max_target_length: 32\ndtype: f32\neval_interval: 1000\n";
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }

  // Runs the binary's plan with --json and the text output; returns the
  // recommendation (the text key line checked against its keys).
  nlohmann::json Plan(const std::vector<std::string>& args,
                      const std::string& name) {
    std::vector<std::string> full = {"plan"};
    full.insert(full.end(), args.begin(), args.end());
    testing_util::Child text =
        testing_util::Spawn(full, {}, dir_.path(), name + "-text");
    full.push_back("--json");
    testing_util::Child json =
        testing_util::Spawn(full, {}, dir_.path(), name + "-json");
    EXPECT_EQ(testing_util::WaitExit(text, 30), 0)
        << testing_util::ReadFile(text.err);
    EXPECT_EQ(testing_util::WaitExit(json, 30), 0)
        << testing_util::ReadFile(json.err);
    const nlohmann::json rec = nlohmann::json::parse(
        testing_util::ReadFile(json.out))["recommendation"];
    const std::string out = testing_util::ReadFile(text.out);
    const size_t line = out.find("Recommendation: ");
    const size_t open = out.find('(', line), close = out.find(')', open);
    std::istringstream keys(out.substr(open + 1, close - open - 1));
    std::vector<std::string> text_keys;
    for (std::string key; keys >> key;) text_keys.push_back(key);
    EXPECT_EQ(nlohmann::json(text_keys), rec["keys"]) << out;
    return rec;
  }

  struct TrainRun {
    int exit_code = -1;
    std::string err;
    nlohmann::json config;  // the run's config.json; null when absent
  };

  // `multislice train` for one step with `keys` on 2 cpu-1 slices.
  TrainRun Train(const nlohmann::json& keys, const std::string& name) {
    std::vector<std::string> args = {"train",
                                     data_->path() + "/tiny.yml",
                                     "base_output_directory=" + dir_.path(),
                                     "dataset_path=" + data_->path() + "/ds",
                                     "run_name=" + name,
                                     "steps=1",
                                     "per_device_batch_size=4"};
    for (const auto& key : keys) args.push_back(key.get<std::string>());
    for (const char* arg :
         {"--num_slices", "2", "--accelerator_type", "cpu-1", "--json"}) {
      args.push_back(arg);
    }
    testing_util::Child c = testing_util::Spawn(args, {}, dir_.path(), name);
    TrainRun run;
    run.exit_code = testing_util::WaitExit(c, 60);
    run.err = testing_util::ReadFile(c.err);
    std::ifstream in(dir_.path() + "/" + name + "/config.json");
    if (in) run.config = nlohmann::json::parse(in, nullptr, false);
    return run;
  }

  static TempDir* data_;
  TempDir dir_{"multislice-plan-test-"};
};

TempDir* PlanIntoTrainTest::data_ = nullptr;

TEST_F(PlanIntoTrainTest, PipelineKeysTrain) {
  const nlohmann::json rec = Plan(ThisMachine("256"), "pipe");
  ASSERT_EQ(rec["strategy"], "pipeline");
  const TrainRun run = Train(rec["keys"], "pipe");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.config["dcn_pipeline_parallelism"], 2);
  EXPECT_EQ(run.config["dcn_data_parallelism"], 1);
  EXPECT_EQ(run.config["num_pipeline_microbatches"], 8);
  EXPECT_EQ(run.config["pipeline_parallel_schedule"], "1F1B");
}

TEST_F(PlanIntoTrainTest, DataParallelKeysTrain) {
  const nlohmann::json rec = Plan(ThisMachine("8192"), "dp");
  ASSERT_EQ(rec["strategy"], "dcn_data");
  const TrainRun run = Train(rec["keys"], "dp");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.config["dcn_data_parallelism"], 2);
  EXPECT_EQ(run.config["dcn_pipeline_parallelism"], 1);
}

// The check can fail: train refuses microbatches that do not divide the 8
// rows of a pipeline (per_device_batch_size 4 x tensor 1 x 2 stages).
TEST_F(PlanIntoTrainTest, TrainRefusesKeysItCannotRun) {
  nlohmann::json keys = Plan(ThisMachine("256"), "bad")["keys"];
  for (auto& key : keys) {
    if (key == "num_pipeline_microbatches=8") {
      key = "num_pipeline_microbatches=3";
    }
  }
  const TrainRun run = Train(keys, "bad");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_TRUE(Contains(run.err, "num_pipeline_microbatches")) << run.err;
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
