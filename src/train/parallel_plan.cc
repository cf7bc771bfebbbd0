#include "train/parallel_plan.h"

#include <algorithm>
#include <memory>

#include "compute/adamw.h"
#include "model/tensor_shard.h"
#include "train/gradient_buckets.h"

namespace multislice::train {
namespace {

using runtime::DType;

const runtime::Axes kAll = {"diloco", "data", "stage", "fsdp", "tensor"};
const runtime::Axes kReplica = {"data", "stage", "fsdp", "tensor"};

// The smallest all-reduce of the gradient the backward pass starts (64 Ki
// floats, 256 KiB): a layer of the quickstart model is one bucket; LayerNorm
// and bias ranges join the next layer's.
constexpr int64_t kGradientBucketElements = int64_t{1} << 16;

}  // namespace

ParallelPlan::ParallelPlan(runtime::DeviceCollectives& coll, int64_t n)
    : coll_(&coll), n_(n) {}

Status ParallelPlan::FindGroups() {
  ASSIGN_OR_RETURN(fsdp_, coll_->Group({"fsdp"}));
  ASSIGN_OR_RETURN(data_, coll_->Group({"data"}));
  ASSIGN_OR_RETURN(tensor_, coll_->Group({"tensor"}));
  ASSIGN_OR_RETURN(stage_, coll_->Group({"stage"}));
  ASSIGN_OR_RETURN(diloco_, coll_->Group({"diloco"}));
  ASSIGN_OR_RETURN(batch_, coll_->Group({"diloco", "data", "fsdp"}));
  return OkStatus();
}

void ParallelPlan::Partition() {
  const comm::Segment seg =
      comm::PartitionSegment(static_cast<size_t>(n_), fsdp_->size, fsdp_->rank);
  begin_ = static_cast<int64_t>(seg.offset);
  count_ = static_cast<int64_t>(seg.count);
}

Result<ParallelPlan> ParallelPlan::Create(runtime::DeviceCollectives& coll,
                                          int64_t num_parameters) {
  ParallelPlan plan(coll, num_parameters);
  RETURN_IF_ERROR(plan.FindGroups());
  if (plan.tensor_size() != 1 || plan.stage_size() != 1) {
    return InvalidArgument(
        "tensor parallelism " + std::to_string(plan.tensor_size()) +
        " and pipeline stages " + std::to_string(plan.stage_size()) +
        ": a flat buffer without a model cannot be split over the tensor or "
        "stage axis");
  }
  plan.Partition();
  return plan;
}

Result<ParallelPlan> ParallelPlan::Create(runtime::DeviceCollectives& coll,
                                          const model::DecoderConfig& model) {
  ParallelPlan plan(coll, 0);
  RETURN_IF_ERROR(plan.FindGroups());
  const int t = plan.tensor_size();
  RETURN_IF_ERROR(model::ValidateTensorParallelism(model, t));
  RETURN_IF_ERROR(model::ValidatePipeline(model, plan.stage_size()));
  const model::PipelineStage stage = plan.ModelStage();
  plan.n_ = model::NumParameters(model, t, stage);
  plan.Partition();
  const int64_t end = plan.begin_ + plan.count_;
  auto add = [&](const model::ParamTensor& p,
                 std::vector<std::pair<int64_t, int64_t>>& ranges) {
    const int64_t lo = std::max(p.offset, plan.begin_);
    const int64_t hi = std::min(p.offset + p.size, end);
    if (lo < hi) ranges.emplace_back(lo - plan.begin_, hi - plan.begin_);
  };
  for (const model::ParamTensor& p : model::ParameterLayout(model, t, stage)) {
    if (t > 1 && p.split == model::TensorSplit::kWhole) {
      add(p, plan.replicated_);
    }
    // The last stage's copy of the tied wte: the first stage counts it.
    if (p.name == "wte" && stage.last() && !stage.first()) {
      add(p, plan.tied_copy_);
      plan.tied_count_ = p.size;
    }
    if (p.name == "wte" && stage.first() && !stage.last() &&
        model.tied_embedding) {
      plan.tied_count_ = p.size;
    }
  }
  return plan;
}

model::PipelineStage ParallelPlan::ModelStage() const {
  return {stage_->rank, stage_->size};
}

Status ParallelPlan::SumTiedEmbedding(float* grads) {
  if (tied_count_ == 0) return OkStatus();
  const model::PipelineStage stage = ModelStage();
  const int other = stage.first() ? stage.count - 1 : 0;
  const auto n = static_cast<size_t>(tied_count_);
  tied_scratch_.resize(n);
  // The first stage's part goes first on both sides (the pair meets in
  // issue order); both then add the same two values, so the copies stay
  // bitwise equal.
  runtime::CollectiveHandle a, b;
  if (stage.first()) {
    a = coll_->Send({"stage"}, other, grads, n, DType::kF32, "tied-wte");
    b = coll_->Recv({"stage"}, other, tied_scratch_.data(), n, DType::kF32,
                    "tied-wte");
  } else {
    a = coll_->Recv({"stage"}, other, tied_scratch_.data(), n, DType::kF32,
                    "tied-wte");
    b = coll_->Send({"stage"}, other, grads, n, DType::kF32, "tied-wte");
  }
  RETURN_IF_ERROR(a.Wait());
  RETURN_IF_ERROR(b.Wait());
  for (size_t i = 0; i < n; ++i) grads[i] += tied_scratch_[i];
  return OkStatus();
}

model::TensorParallel ParallelPlan::ModelTensor() {
  model::TensorParallel tp;
  tp.size = tensor_->size;
  tp.rank = tensor_->rank;
  runtime::DeviceCollectives* coll = coll_;
  tp.start_all_reduce = [coll](float* buf, int64_t count) {
    auto handle = std::make_shared<runtime::CollectiveHandle>(
        coll->AllReduce({"tensor"}, buf, buf, static_cast<size_t>(count),
                        DType::kF32, runtime::ReduceOp::kSum, "activations"));
    return model::TensorParallel::Wait([handle] { return handle->Wait(); });
  };
  tp.all_reduce = [start = tp.start_all_reduce](float* buf, int64_t count) {
    return start(buf, count)();
  };
  return tp;
}

double ParallelPlan::ShardSquaredNorm(const float* gradient) const {
  double sum = compute::SumOfSquares(gradient, count_);
  // The replicated values' share: all t ranks add them, so each adds 1/t.
  double replicated = 0;
  for (auto [lo, hi] : replicated_) {
    replicated += compute::SumOfSquares(gradient + lo, hi - lo);
  }
  const double t = tensor_->size;
  sum -= replicated * (t - 1) / t;
  for (auto [lo, hi] : tied_copy_) {
    sum -= compute::SumOfSquares(gradient + lo, hi - lo) / t;
  }
  return sum / data_->size;
}

float ParallelPlan::LossShare() const {
  if (!ModelStage().last()) return 0.0f;
  return 1.0f / static_cast<float>(batch_->size * tensor_->size);
}

DeviceBuffers ParallelPlan::Allocate() const {
  DeviceBuffers b;
  const auto shard = static_cast<size_t>(count_);
  b.shard.resize(shard);
  b.adam_m.resize(shard);
  b.adam_v.resize(shard);
  b.grads.resize(static_cast<size_t>(n_));
  if (sharded()) {
    b.full.resize(static_cast<size_t>(n_));
    b.grad_shard.resize(shard);
  }
  // With one fsdp member the shard is the whole buffer: the weights are
  // used in place and the gradient is reduced in place, without copies.
  b.weights = sharded() ? b.full.data() : b.shard.data();
  b.gradient = sharded() ? b.grad_shard.data() : b.grads.data();
  return b;
}

Status ParallelPlan::GatherWeights(DeviceBuffers& b) {
  if (!sharded()) return OkStatus();
  return coll_
      ->AllGather({"fsdp"}, b.shard.data(), b.full.data(),
                  static_cast<size_t>(n_), DType::kF32, "weights")
      .Wait();
}

Status ParallelPlan::ReduceGradients(const Backward& backward,
                                     DeviceBuffers& b) {
  if (!sharded() && data_->size == 1) return backward({}, b.grads.data());
  if (!sharded()) {
    // Each bucket's all-reduce starts once the backward has finished its
    // layers, so the DCN transfer of the last layers overlaps the backward
    // of the first ones.
    GradientBuckets buckets(*coll_, {"data"}, b.grads.data(),
                            kGradientBucketElements, gradient_wire_);
    RETURN_IF_ERROR(backward(
        [&](int64_t offset, int64_t count) { buckets.Ready(offset, count); },
        b.grads.data()));
    return buckets.Finish();
  }
  // The reduce-scatter needs the whole gradient first (the shards are
  // contiguous ranges of the flat buffer), so nothing overlaps yet.
  RETURN_IF_ERROR(backward({}, b.grads.data()));
  runtime::CollectiveHandle scatter = coll_->ReduceScatter(
      {"fsdp"}, b.grads.data(), b.grad_shard.data(), static_cast<size_t>(n_),
      DType::kF32, runtime::ReduceOp::kSum, "grads");
  const auto count = static_cast<size_t>(count_);
  runtime::CollectiveHandle reduce =
      gradient_wire_ == runtime::WireType::kF32
          ? coll_->AllReduce({"data"}, b.gradient, b.gradient, count,
                             DType::kF32, runtime::ReduceOp::kSum, "grads",
                             scatter)
          : coll_->CompressedAllReduce({"data"}, b.gradient, b.gradient, count,
                                       gradient_wire_, "grads", scatter);
  RETURN_IF_ERROR(scatter.Wait());
  return reduce.Wait();
}

Status ParallelPlan::ReduceOverAll(float* values, int n,
                                   const std::string& label,
                                   runtime::ReduceOp op) {
  return coll_
      ->AllReduce(kAll, values, values, static_cast<size_t>(n), DType::kF32, op,
                  label)
      .Wait();
}

Status ParallelPlan::ReduceOverReplica(float* values, int n,
                                       const std::string& label,
                                       runtime::ReduceOp op) {
  return coll_
      ->AllReduce(kReplica, values, values, static_cast<size_t>(n), DType::kF32,
                  op, label)
      .Wait();
}

Status ParallelPlan::ReduceOverData(float* values, int n,
                                    const std::string& label,
                                    runtime::ReduceOp op) {
  return coll_
      ->AllReduce({"data"}, values, values, static_cast<size_t>(n), DType::kF32,
                  op, label)
      .Wait();
}

Status ParallelPlan::BroadcastOverData(int root, float* buf,
                                       const std::string& label) {
  return coll_
      ->Broadcast({"data"}, root, buf, static_cast<size_t>(count_), DType::kF32,
                  label)
      .Wait();
}

Status ParallelPlan::BroadcastOverDiloco(int root, float* buf,
                                         const std::string& label) {
  return coll_
      ->Broadcast({"diloco"}, root, buf, static_cast<size_t>(count_),
                  DType::kF32, label)
      .Wait();
}

Status ParallelPlan::ReduceOverDiloco(float* values, int n,
                                      const std::string& label,
                                      runtime::ReduceOp op) {
  return coll_
      ->AllReduce({"diloco"}, values, values, static_cast<size_t>(n),
                  DType::kF32, op, label)
      .Wait();
}

}  // namespace multislice::train
