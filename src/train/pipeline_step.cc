#include "train/pipeline_step.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace multislice::train {
namespace {

const runtime::Axes kStage = {"stage"};

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct PipelineStep::Slot {
  std::unique_ptr<model::Decoder> model;
  std::vector<float> input, output_grad;  // what the neighbours send
  runtime::CollectiveHandle input_recv, grad_recv;
  std::vector<runtime::CollectiveHandle> sends;
};

PipelineStep::PipelineStep(runtime::DeviceCollectives& coll,
                           PipelineStepOptions options,
                           const model::TensorParallel& tensor)
    : coll_(coll),
      o_(std::move(options)),
      micro_rows_(o_.rows / o_.microbatches),
      activation_size_(micro_rows_ * o_.seq_len * o_.model.emb_dim) {
  const int slots = MicrobatchesInFlight(o_.schedule, o_.stage.index,
                                         o_.stage.count, o_.microbatches);
  for (int k = 0; k < slots; ++k) {
    auto slot = std::make_unique<Slot>();
    slot->model = std::make_unique<model::Decoder>(o_.model, o_.matmul_type,
                                                   tensor, o_.stage);
    if (!o_.stage.first()) slot->input.resize(activation_size_);
    if (!o_.stage.last()) slot->output_grad.resize(activation_size_);
    slots_.push_back(std::move(slot));
  }
  if (o_.microbatches > 1) {
    micro_grads_.resize(static_cast<size_t>(
        model::NumParameters(o_.model, tensor.size, o_.stage)));
  }
}

PipelineStep::~PipelineStep() { (void)DrainAll(); }

PipelineStep::Slot& PipelineStep::SlotOf(int microbatch) {
  return *slots_[static_cast<size_t>(microbatch) % slots_.size()];
}

Status PipelineStep::Drain(Slot& slot) {
  Status status = OkStatus();
  for (runtime::CollectiveHandle& h : slot.sends) {
    Status s = h.Wait();
    if (status.ok()) status = s;
  }
  slot.sends.clear();
  return status;
}

Status PipelineStep::DrainAll() {
  Status status = OkStatus();
  for (auto& slot : slots_) {
    Status s = Drain(*slot);
    if (status.ok()) status = s;
  }
  return status;
}

// Posts a message of the program; the compute ops wait for their inputs.
void PipelineStep::Post(const PipelineOp& op) {
  Slot& slot = SlotOf(op.microbatch);
  const int s = o_.stage.index;
  const auto n = static_cast<size_t>(activation_size_);
  switch (op.kind) {
    case PipelineOp::kRecvActivation:
      slot.input_recv = coll_.Recv(kStage, s - 1, slot.input.data(), n,
                                   DType::kF32, "stage-activation");
      break;
    case PipelineOp::kSendActivation:
      slot.sends.push_back(coll_.Send(kStage, s + 1, slot.model->output(), n,
                                      DType::kF32, "stage-activation"));
      break;
    case PipelineOp::kRecvGradient:
      slot.grad_recv = coll_.Recv(kStage, s + 1, slot.output_grad.data(), n,
                                  DType::kF32, "stage-gradient");
      break;
    case PipelineOp::kSendGradient:
      slot.sends.push_back(coll_.Send(kStage, s - 1, slot.model->input_grad(),
                                      n, DType::kF32, "stage-gradient"));
      break;
    default:
      break;
  }
}

Status PipelineStep::Forward(const float* weights, const int32_t* inputs,
                             const int32_t* targets, int i, float& loss_sum) {
  Slot& slot = SlotOf(i);
  // The slot's last microbatch may still be sending its output.
  RETURN_IF_ERROR(Drain(slot));
  if (!o_.stage.first()) RETURN_IF_ERROR(slot.input_recv.Wait());
  const int64_t offset = i * micro_rows_ * o_.seq_len;
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(float loss,
                   slot.model->Forward(
                       weights, o_.stage.first() ? inputs + offset : nullptr,
                       o_.stage.last() && targets ? targets + offset : nullptr,
                       static_cast<int>(micro_rows_), o_.seq_len,
                       o_.stage.first() ? nullptr : slot.input.data()));
  compute_s_ += Since(start);
  loss_sum += loss;
  return OkStatus();
}

Status PipelineStep::Backward(const float* weights, float* grads, int i) {
  Slot& slot = SlotOf(i);
  if (!o_.stage.last()) RETURN_IF_ERROR(slot.grad_recv.Wait());
  // The first backward writes the gradient in place; the others add.
  float* out = backwards_done_ == 0 ? grads : micro_grads_.data();
  const Clock::time_point start = Clock::now();
  RETURN_IF_ERROR(slot.model->Backward(
      weights, out, {}, o_.stage.last() ? nullptr : slot.output_grad.data()));
  if (backwards_done_++ > 0) {
    for (size_t k = 0; k < micro_grads_.size(); ++k) grads[k] += out[k];
  }
  compute_s_ += Since(start);
  return OkStatus();
}

Result<float> PipelineStep::Train(const float* weights, const int32_t* inputs,
                                  const int32_t* targets, float* grads) {
  float loss_sum = 0;
  backwards_done_ = 0;
  compute_s_ = 0;
  const Clock::time_point start = Clock::now();
  for (const PipelineOp& op : StageProgram(o_.schedule, o_.stage.index,
                                           o_.stage.count, o_.microbatches)) {
    if (op.kind == PipelineOp::kForward) {
      RETURN_IF_ERROR(
          Forward(weights, inputs, targets, op.microbatch, loss_sum));
    } else if (op.kind == PipelineOp::kBackward) {
      RETURN_IF_ERROR(Backward(weights, grads, op.microbatch));
    } else {
      Post(op);
    }
  }
  RETURN_IF_ERROR(DrainAll());
  wall_s_ = Since(start);
  const float scale = 1.0f / static_cast<float>(o_.microbatches);
  if (o_.microbatches > 1) {
    for (size_t k = 0; k < micro_grads_.size(); ++k) grads[k] *= scale;
  }
  return loss_sum * scale;
}

Result<float> PipelineStep::Evaluate(const float* weights,
                                     const int32_t* inputs,
                                     const int32_t* targets) {
  float loss_sum = 0;
  for (int i = 0; i < o_.microbatches; ++i) {
    if (!o_.stage.first()) Post({PipelineOp::kRecvActivation, i});
    RETURN_IF_ERROR(Forward(weights, inputs, targets, i, loss_sum));
    if (!o_.stage.last()) Post({PipelineOp::kSendActivation, i});
  }
  RETURN_IF_ERROR(DrainAll());
  return loss_sum / static_cast<float>(o_.microbatches);
}

}  // namespace multislice::train
