// The data-parallel gradient all-reduce, started bucket by bucket while the
// backward pass still runs.
//
// The backward pass finishes the gradient of the last layers first
// (model::Decoder::Backward reports each range as it becomes final).
// GradientBuckets gathers adjacent ranges until a bucket holds at least
// `min_bucket` elements and starts its all-reduce at once, so the transfer
// of the last layers' gradients (over DCN when the axis spans slices) runs
// while the first layers' backward computes, as PyTorch DDP's buckets and
// XLA's overlapped all-reduces do. Finish() starts what is left and waits
// for every bucket.
//
// Every device of the axis reports the same ranges in the same order (the
// same model), so the buckets, and the collectives' order, agree. The sums
// are those of one all-reduce of the whole buffer for two members; with more
// a bucket's elements may be added in another order (ring chunks differ).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "runtime/collectives.h"

namespace multislice::train {

class GradientBuckets {
 public:
  // Sums `grads` (float32) over `axes` in place, in buckets of at least
  // `min_bucket` elements (the last one may be smaller); with a wire other
  // than kF32, each bucket is a CompressedAllReduce (runtime/collectives.h).
  GradientBuckets(runtime::DeviceCollectives& coll, runtime::Axes axes,
                  float* grads, int64_t min_bucket,
                  runtime::WireType wire = runtime::WireType::kF32);
  // Waits for any bucket still in flight (the buffer must outlive the
  // transfers even when the step has failed).
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // grads[offset, offset + count) is final. A range that does not end where
  // the pending one begins first starts the pending bucket.
  void Ready(int64_t offset, int64_t count);

  // Starts the pending bucket and waits for every one; the first error.
  Status Finish();

  // The buckets started so far, as [offset, count) in order (for tests).
  const std::vector<std::pair<int64_t, int64_t>>& buckets() const {
    return buckets_;
  }

 private:
  void Start();

  runtime::DeviceCollectives& coll_;
  const runtime::Axes axes_;
  float* const grads_;
  const int64_t min_bucket_;
  const runtime::WireType wire_;
  int64_t pending_begin_ = 0, pending_end_ = 0;  // empty when equal
  std::vector<std::pair<int64_t, int64_t>> buckets_;
  std::vector<runtime::CollectiveHandle> handles_;
};

}  // namespace multislice::train
