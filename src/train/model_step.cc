#include "train/model_step.h"

namespace multislice::train {
namespace {

class WholeModelStep : public ModelStep {
 public:
  WholeModelStep(ParallelPlan& plan, const PipelineStepOptions& o)
      : o_(o), gpt_(o.model, o.matmul_type, plan.ModelTensor()) {}

  Result<float> Train(const Batch& batch, ParallelPlan& plan,
                      DeviceBuffers& b) override {
    ASSIGN_OR_RETURN(float loss, Evaluate(batch, b.weights));
    RETURN_IF_ERROR(plan.ReduceGradients(
        [&](const model::Decoder::GradientReady& ready, float* grads) {
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
  const PipelineStepOptions o_;
  model::Decoder gpt_;
};

class PipelineModelStep : public ModelStep {
 public:
  PipelineModelStep(ParallelPlan& plan, const PipelineStepOptions& o)
      : step_(plan.collectives(), o, plan.ModelTensor()) {}

  Result<float> Train(const Batch& batch, ParallelPlan& plan,
                      DeviceBuffers& b) override {
    float loss = 0;
    // The whole gradient is final only after the last microbatch: one
    // range, reduced after the schedule.
    RETURN_IF_ERROR(plan.ReduceGradients(
        [&](const model::Decoder::GradientReady& ready,
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
  PipelineStep step_;
};

}  // namespace

std::unique_ptr<ModelStep> MakeModelStep(ParallelPlan& plan,
                                         PipelineStepOptions options) {
  options.stage = plan.ModelStage();
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
  float mean = sum * plan.LossShare() / static_cast<float>(batches);
  RETURN_IF_ERROR(plan.ReduceOverAll(&mean, 1, "val-loss"));
  return static_cast<double>(mean);
}

}  // namespace multislice::train
