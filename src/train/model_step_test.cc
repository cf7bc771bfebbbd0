// ModelStep against the whole model on one device: on meshes of data 2,
// fsdp 2, tensor 2 and stage 2 (and data 2 over DCN), every device trains
// its rows of one global batch through MakeModelStep's step; its shard of
// the reduced gradient, divided by the batch shards, is its part of the
// whole model's gradient of the global batch (f32, within 1e-5 of the
// largest value). MeanLoss over two validation batches is the whole
// model's mean loss of them. Every device computes the reference itself.
#include "train/model_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compute/random.h"
#include "model/tensor_shard.h"
#include "runtime/test_support.h"

namespace multislice::train {
namespace {

model::DecoderConfig Config() { return model::GptShape(17, 8, 16, 2, 2, 32); }

constexpr int kRowsPerShard = 4;

// Rows [first, first + rows) of global batch `k`.
Batch MakeBatch(const model::DecoderConfig& c, int k, int first, int rows) {
  Batch b;
  b.rows = rows;
  b.seq_len = c.max_seq_len;
  for (int i = first * c.max_seq_len; i < (first + rows) * c.max_seq_len; ++i) {
    b.inputs.push_back(
        static_cast<int32_t>(compute::UniformAt(20 + k, 1, i) * c.vocab_size));
    b.targets.push_back(
        static_cast<int32_t>(compute::UniformAt(20 + k, 2, i) * c.vocab_size));
  }
  return b;
}

int CheckOnDevice(runtime::Runtime& rt, int local) {
  const model::DecoderConfig c = Config();
  auto plan = ParallelPlan::Create(rt.collectives(local), c);
  if (!plan.ok()) return 1;
  const int shards = plan->batch_shards();
  const int global_rows = kRowsPerShard * shards;
  std::vector<float> whole(model::NumParameters(c));
  model::InitParameters(c, 3, whole.data());
  // The reference: the whole model on the whole batch.
  model::Decoder reference(c);
  const Batch global = MakeBatch(c, 0, 0, global_rows);
  (void)reference.Forward(whole.data(), global.inputs.data(),
                          global.targets.data(), global_rows, c.max_seq_len);
  std::vector<float> whole_grads(whole.size());
  (void)reference.Backward(whole.data(), whole_grads.data());
  double val_loss = 0, largest = 0;
  for (int k = 1; k <= 2; ++k) {
    const Batch v = MakeBatch(c, k, 0, global_rows);
    val_loss +=
        *reference.Forward(whole.data(), v.inputs.data(), v.targets.data(),
                           global_rows, c.max_seq_len) /
        2;
  }
  for (float g : whole_grads) largest = std::max(largest, double{std::fabs(g)});

  // This device's state: its part of the model, its shard of that.
  const model::PipelineStage stage = plan->ModelStage();
  const int t = plan->tensor_size();
  std::vector<float> part(plan->num_parameters()), want(part.size());
  model::ExtractTensorShard(c, t, plan->tensor_rank(), whole.data(),
                            part.data(), stage);
  model::ExtractTensorShard(c, t, plan->tensor_rank(), whole_grads.data(),
                            want.data(), stage);
  DeviceBuffers b = plan->Allocate();
  std::copy_n(part.begin() + plan->shard_begin(), plan->shard_count(),
              b.shard.begin());
  if (!plan->GatherWeights(b).ok()) return 1;
  PipelineStepOptions o;
  o.model = c;
  o.microbatches = 2;
  o.rows = kRowsPerShard;
  o.seq_len = c.max_seq_len;
  std::unique_ptr<ModelStep> step = MakeModelStep(*plan, o);
  const int first = plan->batch_shard() * kRowsPerShard;
  Result<float> loss =
      step->Train(MakeBatch(c, 0, first, kRowsPerShard), *plan, b);
  int wrong = 0;
  auto fail = [&](const std::string& why) {
    if (wrong++ < 5) std::fprintf(stderr, "%s\n", why.c_str());
  };
  if (!loss.ok()) fail("Train: " + loss.status().message());
  for (int64_t i = 0; i < plan->shard_count(); ++i) {
    const double got = b.gradient[i] / shards;
    if (std::fabs(got - want[plan->shard_begin() + i]) > 1e-5 * largest) {
      fail("gradient " + std::to_string(plan->shard_begin() + i) + " is " +
           std::to_string(got) + ", want " +
           std::to_string(want[plan->shard_begin() + i]));
      break;
    }
  }
  Result<double> mean = MeanLoss(
      *step, *plan, b.weights,
      [&](int k) { return MakeBatch(c, k + 1, first, kRowsPerShard); }, 2);
  if (!mean.ok() || std::fabs(*mean - val_loss) > 1e-5 * val_loss) {
    fail("MeanLoss " + (mean.ok() ? std::to_string(*mean) : "failed") +
         ", want " + std::to_string(val_loss));
  }
  return wrong;
}

int WorkerMain(char** argv) {
  mesh::ParallelismConfig parallelism;
  for (int a = 0; a < mesh::kNumAxes; ++a) {
    parallelism.ici[a] = std::atoi(argv[2 + a]);
  }
  parallelism.dcn[mesh::kData] = std::atoi(argv[2 + mesh::kNumAxes]);
  return runtime::testing::RunDeviceChecks(parallelism, CheckOnDevice);
}

struct MeshCase {
  const char* name;
  int slices;
  mesh::AxisSizes ici;
};

class ModelStepTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(ModelStepTest, GradientAndMeanLossAreTheWholeModels) {
  const MeshCase& c = GetParam();
  int devices = 1;
  std::vector<std::string> args = {"--worker"};
  for (int v : c.ici) {
    devices *= v;
    args.push_back(std::to_string(v));
  }
  args.push_back(std::to_string(c.slices));
  runtime::LaunchResult result =
      runtime::testing::RunSelfAsWorkers(c.slices, devices, args);
  EXPECT_EQ(result.exit_code, 0) << "failed worker " << result.failed_worker;
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ModelStepTest,
    ::testing::Values(MeshCase{"data2", 1, {1, 2, 1, 1, 1}},
                      MeshCase{"fsdp2", 1, {1, 1, 1, 2, 1}},
                      MeshCase{"tensor2", 1, {1, 1, 1, 1, 2}},
                      MeshCase{"stage2", 1, {1, 1, 2, 1, 1}},
                      MeshCase{"stage2_tensor2", 1, {1, 1, 2, 1, 2}},
                      MeshCase{"dcn_data2_fsdp2", 2, {1, 1, 1, 2, 1}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace multislice::train

int main(int argc, char** argv) {
  if (argc == 3 + multislice::mesh::kNumAxes &&
      std::string(argv[1]) == "--worker") {
    return multislice::train::WorkerMain(argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
