#include "train/gradient_buckets.h"

#include <string>
#include <utility>

namespace multislice::train {

GradientBuckets::GradientBuckets(runtime::DeviceCollectives& coll,
                                 runtime::Axes axes, float* grads,
                                 int64_t min_bucket, runtime::WireType wire)
    : coll_(coll),
      axes_(std::move(axes)),
      grads_(grads),
      min_bucket_(min_bucket),
      wire_(wire) {}

GradientBuckets::~GradientBuckets() {
  for (runtime::CollectiveHandle& h : handles_) (void)h.Wait();
}

void GradientBuckets::Ready(int64_t offset, int64_t count) {
  if (count <= 0) return;
  if (pending_begin_ == pending_end_) {
    pending_end_ = offset + count;
  } else if (offset + count != pending_begin_) {
    Start();
    pending_end_ = offset + count;
  }
  pending_begin_ = offset;
  if (pending_end_ - pending_begin_ >= min_bucket_) Start();
}

void GradientBuckets::Start() {
  const int64_t count = pending_end_ - pending_begin_;
  if (count <= 0) return;
  float* bucket = grads_ + pending_begin_;
  const std::string label = "grads/bucket" + std::to_string(buckets_.size());
  const auto n = static_cast<size_t>(count);
  handles_.push_back(
      wire_ == runtime::WireType::kF32
          ? coll_.AllReduce(axes_, bucket, bucket, n, runtime::DType::kF32,
                            runtime::ReduceOp::kSum, label)
          : coll_.CompressedAllReduce(axes_, bucket, bucket, n, wire_, label));
  buckets_.emplace_back(pending_begin_, count);
  pending_begin_ = pending_end_ = 0;
}

Status GradientBuckets::Finish() {
  Start();
  Status first = OkStatus();
  for (runtime::CollectiveHandle& h : handles_) {
    if (Status s = h.Wait(); !s.ok() && first.ok()) first = s;
  }
  handles_.clear();
  return first;
}

}  // namespace multislice::train
