// One pipeline stage's part of a training step: the forward and backward
// passes of its microbatches in the order of the schedule
// (pipeline_schedule.h), with the activations sent to the next stage and
// their gradients back over the mesh's stage axis (Send/Recv, started at
// once so the stage computes while they move: ICI inside a slice, DCN
// across slices).
//
// A stage keeps one model (its activations) per microbatch in flight: m
// with GPipe, p - s with 1F1B. The gradient is the mean over the
// microbatches of theirs, so that the step equals one pass over the whole
// batch; the loss is the last stage's mean over them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "model/decoder.h"
#include "runtime/collectives.h"
#include "train/pipeline_schedule.h"

namespace multislice::train {

// Also the options of train/model_step.h's step without stages.
struct PipelineStepOptions {
  model::DecoderConfig model;
  DType matmul_type = DType::kF32;
  model::PipelineStage stage;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int microbatches = 1;
  int rows = 1;     // of the device's batch, divisible by microbatches
  int seq_len = 1;  // T
};

class PipelineStep {
 public:
  // tensor: the stage's tensor group (ParallelPlan::ModelTensor()).
  PipelineStep(runtime::DeviceCollectives& coll, PipelineStepOptions options,
               const model::TensorParallel& tensor);
  ~PipelineStep();
  PipelineStep(const PipelineStep&) = delete;
  PipelineStep& operator=(const PipelineStep&) = delete;

  // Forward and backward of every microbatch of the batch (rows x T inputs
  // and targets; a stage before the last ignores targets, one after the
  // first inputs): grads (=) their mean gradient. Returns the mean loss on
  // the last stage and 0 on the others.
  Result<float> Train(const float* weights, const int32_t* inputs,
                      const int32_t* targets, float* grads);

  // The last Train's wall time and the part of it this stage computed
  // (the model's passes, without the waits for its neighbours): 1 -
  // compute / wall is its measured bubble.
  double last_wall_seconds() const { return wall_s_; }
  double last_compute_seconds() const { return compute_s_; }

  // The forward passes alone (evaluation), with the same return value.
  Result<float> Evaluate(const float* weights, const int32_t* inputs,
                         const int32_t* targets);

 private:
  struct Slot;
  Slot& SlotOf(int microbatch);
  // Waits for the sends still reading a slot's buffers.
  Status Drain(Slot& slot);
  Status DrainAll();
  Status Forward(const float* weights, const int32_t* inputs,
                 const int32_t* targets, int i, float& loss_sum);
  Status Backward(const float* weights, float* grads, int i);
  void Post(const PipelineOp& op);

  runtime::DeviceCollectives& coll_;
  const PipelineStepOptions o_;
  const int64_t micro_rows_, activation_size_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<float> micro_grads_;
  int backwards_done_ = 0;
  double wall_s_ = 0, compute_s_ = 0;
};

}  // namespace multislice::train
