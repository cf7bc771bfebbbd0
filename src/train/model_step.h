// One device's part of the model in a training step: the forward and
// backward passes with the gradient reduced by the parallel plan, and the
// forward alone for evaluation. Two kinds behind one interface: the whole
// model (tensor parallelism inside it; the gradient in buckets overlapped
// with the backward) and a pipeline stage over its microbatches
// (pipeline_step.h; the tied embedding summed between the end stages).
//
// MeanLoss is the evaluation: the mean loss over every device's batches.
#pragma once

#include <functional>
#include <memory>

#include "common/status.h"
#include "model/decoder.h"
#include "train/data.h"
#include "train/parallel_plan.h"
#include "train/pipeline_step.h"

namespace multislice::train {

class ModelStep {
 public:
  virtual ~ModelStep() = default;
  // The passes on b.weights; b.gradient then holds this device's shard of
  // the gradient of the mean loss summed over every device. Returns the
  // mean loss of the rows this device trained (0 on a pipeline stage
  // before the last).
  virtual Result<float> Train(const Batch& batch, ParallelPlan& plan,
                              DeviceBuffers& b) = 0;
  // The forward passes alone, with Train's return value.
  virtual Result<float> Evaluate(const Batch& batch, const float* weights) = 0;
  // The pipeline's last schedule, or null without stages.
  virtual const PipelineStep* pipeline() const { return nullptr; }
};

// The step of plan's device: a pipeline stage when the stage axis is larger
// than 1, else the whole model (or its tensor rank's part). options.stage is
// the plan's (what it holds is ignored); schedule and microbatches matter
// only with stages.
std::unique_ptr<ModelStep> MakeModelStep(ParallelPlan& plan,
                                         PipelineStepOptions options);

// The mean over every device of the mean of `batches` losses
// step.Evaluate(batch_at(k), weights), the last pipeline stage's standing
// for its stage group.
Result<double> MeanLoss(ModelStep& step, ParallelPlan& plan,
                        const float* weights,
                        const std::function<Batch(int)>& batch_at, int batches);

}  // namespace multislice::train
