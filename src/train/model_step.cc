#include "train/model_step.h"

namespace multislice::train {
namespace {

class WholeModelStep : public ModelStep {
 public:
  WholeModelStep(ParallelPlan& plan, const ModelStepOptions& o)
      : o_(o), gpt_(o.model, o.matmul_type, plan.ModelTensor()) {}

  Result<float> Train(const Batch& batch, ParallelPlan& plan,
                      DeviceBuffers& b) override {
    ASSIGN_OR_RETURN(float loss, Evaluate(batch, b.weights));
    RETURN_IF_ERROR(plan.ReduceGradients(
        [&](const model::gpt::GptModel::GradientReady& ready, float* grads) {
          return gpt_.Backward(b.weights, grads, ready);
        },
        b));
    return loss;
  }

  Result<float> Evaluate(const Batch& batch, const float* weights) override {
    return gpt_.Forward(weights, batch.inputs.data(), batch.targets.data(),
                        o_.rows, o_.seq_len);
  }

 private:
  const ModelStepOptions o_;
  model::gpt::GptModel gpt_;
};

class PipelineModelStep : public ModelStep {
 public:
  PipelineModelStep(ParallelPlan& plan, const ModelStepOptions& o)
      : step_(plan.collectives(), Options(plan, o), plan.ModelTensor()) {}

  Result<float> Train(const Batch& batch, ParallelPlan& plan,
                      DeviceBuffers& b) override {
    float loss = 0;
    // The whole gradient is final only after the last microbatch: one
    // range, reduced after the schedule.
    RETURN_IF_ERROR(plan.ReduceGradients(
        [&](const model::gpt::GptModel::GradientReady& ready,
            float* grads) -> Status {
          ASSIGN_OR_RETURN(loss, step_.Train(b.weights, batch.inputs.data(),
                                             batch.targets.data(), grads));
          RETURN_IF_ERROR(plan.SumTiedEmbedding(grads));
          if (ready) ready(0, plan.num_parameters());
          return OkStatus();
        },
        b));
    return loss;
  }

  Result<float> Evaluate(const Batch& batch, const float* weights) override {
    return step_.Evaluate(weights, batch.inputs.data(), batch.targets.data());
  }

  const PipelineStep* pipeline() const override { return &step_; }

 private:
  static PipelineStepOptions Options(const ParallelPlan& plan,
                                     const ModelStepOptions& o) {
    PipelineStepOptions p;
    p.model = o.model;
    p.matmul_type = o.matmul_type;
    p.stage = plan.ModelStage();
    p.schedule = o.schedule;
    p.microbatches = o.microbatches;
    p.rows = o.rows;
    p.seq_len = o.seq_len;
    return p;
  }

  PipelineStep step_;
};

}  // namespace

std::unique_ptr<ModelStep> MakeModelStep(ParallelPlan& plan,
                                         const ModelStepOptions& options) {
  if (plan.stage_size() > 1) {
    return std::make_unique<PipelineModelStep>(plan, options);
  }
  return std::make_unique<WholeModelStep>(plan, options);
}

Result<double> MeanLoss(ModelStep& step, ParallelPlan& plan,
                        const float* weights,
                        const std::function<Batch(int)>& batch_at,
                        int batches) {
  float sum = 0;
  for (int k = 0; k < batches; ++k) {
    ASSIGN_OR_RETURN(float loss, step.Evaluate(batch_at(k), weights));
    sum += loss;
  }
  // Every device adds its share: the batch shards' losses are averaged;
  // a tensor group's ranks hold equal losses; only a pipeline's last stage
  // has one.
  const model::gpt::PipelineStage stage = plan.ModelStage();
  const int groups = plan.batch_shards() * plan.tensor_size();
  float mean = stage.last() ? sum / static_cast<float>(batches * groups) : 0;
  RETURN_IF_ERROR(plan.ReduceOverAll(&mean, 1, "val-loss"));
  return static_cast<double>(mean);
}

}  // namespace multislice::train
