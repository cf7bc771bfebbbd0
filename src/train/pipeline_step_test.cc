// PipelineStep against the whole model on one device: p stages (devices of
// one slice over ICI, or one slice each over DCN) train a tiny GPT on the
// same batch in m microbatches with GPipe and 1F1B; the last stage's loss is
// the whole model's, every other stage returns 0, and each stage's
// gradient, with the tied wte's parts summed between the first and the last
// stage (ParallelPlan::SumTiedEmbedding), is the whole model's gradient of
// its tensors (f32, within 1e-5 of the largest); Evaluate gives the loss
// alone. Every device computes the reference itself.
#include "train/pipeline_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compute/random.h"
#include "model/tensor_shard.h"
#include "runtime/test_support.h"
#include "train/parallel_plan.h"

namespace multislice::train {
namespace {

model::DecoderConfig Config() { return model::GptShape(17, 8, 16, 2, 4, 32); }

constexpr int kRows = 8;

struct Reference {
  std::vector<float> params, grads;
  std::vector<int32_t> tokens, targets;
  float loss = 0;
};

Reference WholeModel(const model::DecoderConfig& c) {
  Reference r;
  r.params.resize(model::NumParameters(c));
  model::InitParameters(c, 7, r.params.data());
  const int n = kRows * c.max_seq_len;
  for (int i = 0; i < n; ++i) {
    r.tokens.push_back(
        static_cast<int32_t>(compute::UniformAt(9, 1, i) * c.vocab_size));
    r.targets.push_back(
        static_cast<int32_t>(compute::UniformAt(9, 2, i) * c.vocab_size));
  }
  model::Decoder whole(c);
  r.loss = *whole.Forward(r.params.data(), r.tokens.data(), r.targets.data(),
                          kRows, c.max_seq_len);
  r.grads.resize(r.params.size());
  (void)whole.Backward(r.params.data(), r.grads.data());
  return r;
}

int CheckOnDevice(runtime::Runtime& rt, int local) {
  const model::DecoderConfig c = Config();
  const Reference ref = WholeModel(c);
  auto plan = ParallelPlan::Create(rt.collectives(local), c);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().message().c_str());
    return 1;
  }
  const model::PipelineStage stage = plan->ModelStage();
  const int64_t n = plan->num_parameters();
  std::vector<float> weights(n), want(n), grads(n);
  model::ExtractTensorShard(c, 1, 0, ref.params.data(), weights.data(), stage);
  model::ExtractTensorShard(c, 1, 0, ref.grads.data(), want.data(), stage);
  double largest = 0;
  for (float g : ref.grads) largest = std::max(largest, double{std::fabs(g)});
  int wrong = 0;
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int m : {1, 2, 4}) {
      PipelineStepOptions o;
      o.model = c;
      o.stage = stage;
      o.schedule = schedule;
      o.microbatches = m;
      o.rows = kRows;
      o.seq_len = c.max_seq_len;
      PipelineStep step(rt.collectives(local), o, plan->ModelTensor());
      const std::string what = PipelineScheduleName(schedule) +
                               " m=" + std::to_string(m) + " stage " +
                               std::to_string(stage.index);
      auto fail = [&](const std::string& why) {
        if (wrong++ < 5)
          std::fprintf(stderr, "%s: %s\n", what.c_str(), why.c_str());
      };
      Result<float> loss = step.Train(weights.data(), ref.tokens.data(),
                                      ref.targets.data(), grads.data());
      if (!loss.ok()) {
        fail(loss.status().message());
        continue;
      }
      if (!plan->SumTiedEmbedding(grads.data()).ok()) fail("tied sum");
      const float want_loss = stage.last() ? ref.loss : 0.0f;
      if (std::fabs(*loss - want_loss) > 1e-5 * std::fabs(ref.loss)) {
        fail("loss " + std::to_string(*loss) + ", want " +
             std::to_string(want_loss));
      }
      for (int64_t i = 0; i < n; ++i) {
        if (std::fabs(grads[i] - want[i]) > 1e-5 * largest) {
          fail("gradient " + std::to_string(i) + " is " +
               std::to_string(grads[i]) + ", want " + std::to_string(want[i]));
          break;
        }
      }
      Result<float> eval =
          step.Evaluate(weights.data(), ref.tokens.data(), ref.targets.data());
      if (!eval.ok() ||
          std::fabs(*eval - want_loss) > 1e-5 * std::fabs(ref.loss)) {
        fail("evaluation loss");
      }
    }
  }
  return wrong;
}

int WorkerMain(char** argv) {
  mesh::ParallelismConfig parallelism;
  parallelism.ici[mesh::kStage] = std::atoi(argv[2]);
  parallelism.dcn[mesh::kStage] = std::atoi(argv[3]);
  return runtime::testing::RunDeviceChecks(parallelism, CheckOnDevice);
}

struct StageCase {
  int slices, devices;  // stages: devices of one slice, or slices of one
};

class PipelineStepTest : public ::testing::TestWithParam<StageCase> {};

TEST_P(PipelineStepTest, StagesGiveTheWholeModelsLossAndGradient) {
  const StageCase& c = GetParam();
  runtime::LaunchResult result = runtime::testing::RunSelfAsWorkers(
      c.slices, c.devices,
      {"--worker", std::to_string(c.devices), std::to_string(c.slices)});
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

INSTANTIATE_TEST_SUITE_P(Stages, PipelineStepTest,
                         ::testing::Values(StageCase{1, 2}, StageCase{1, 4},
                                           StageCase{2, 1}),
                         [](const auto& info) {
                           return "ici" + std::to_string(info.param.devices) +
                                  "_dcn" + std::to_string(info.param.slices);
                         });

}  // namespace
}  // namespace multislice::train

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--worker") {
    return multislice::train::WorkerMain(argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
