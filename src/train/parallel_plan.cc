#include "train/parallel_plan.h"

#include "train/gradient_buckets.h"

namespace multislice::train {
namespace {

using runtime::DType;

const runtime::Axes kAll = {"data", "fsdp"};

// The smallest all-reduce of the gradient the backward pass starts (64 Ki
// floats, 256 KiB): a layer of the quickstart model is one bucket; LayerNorm
// and bias ranges join the next layer's.
constexpr int64_t kGradientBucketElements = int64_t{1} << 16;

}  // namespace

Result<ParallelPlan> ParallelPlan::Create(runtime::DeviceCollectives& coll,
                                          int64_t num_parameters) {
  ASSIGN_OR_RETURN(const runtime::AxisGroup* fsdp, coll.Group({"fsdp"}));
  ASSIGN_OR_RETURN(const runtime::AxisGroup* data, coll.Group({"data"}));
  return ParallelPlan(coll, fsdp, data, num_parameters);
}

ParallelPlan::ParallelPlan(runtime::DeviceCollectives& coll,
                           const runtime::AxisGroup* fsdp,
                           const runtime::AxisGroup* data, int64_t n)
    : coll_(&coll), fsdp_(fsdp), data_(data), n_(n) {
  const comm::Segment seg =
      comm::PartitionSegment(static_cast<size_t>(n), fsdp->size, fsdp->rank);
  begin_ = static_cast<int64_t>(seg.offset);
  count_ = static_cast<int64_t>(seg.count);
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
                            kGradientBucketElements);
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
  runtime::CollectiveHandle reduce = coll_->AllReduce(
      {"data"}, b.gradient, b.gradient, static_cast<size_t>(count_),
      DType::kF32, runtime::ReduceOp::kSum, "grads", scatter);
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

}  // namespace multislice::train
