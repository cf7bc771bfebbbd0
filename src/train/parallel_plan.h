// The parallel plan of one device: which shard of the training state it
// holds and which collectives a training step issues, derived from the mesh.
//
// Sharding (ZeRO-3 style, on the flat parameter buffer of N values): fsdp
// rank r of f owns comm::PartitionSegment(N, f, r) of the f32 master
// weights and of the AdamW moments; data replicas hold the same shards. A
// step:
//   GatherWeights     all-gather of the weights over fsdp (nothing when f = 1:
//                     the shard is the whole buffer and is used in place);
//   ReduceGradients   the backward pass, then the gradient summed over fsdp
//                     (reduce-scatter) and data (all-reduce of the shard,
//                     chained); unsharded, in buckets started while the
//                     backward pass runs (gradient_buckets.h);
//   SumOverAll        small all-reduces over every axis (the loss, the norm,
//                     the failure flag).
// The collectives reduce in a fixed order, so a run is bitwise repeatable on
// the same mesh.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/gpt.h"
#include "runtime/collectives.h"

namespace multislice::train {

// A device's training state and work buffers, sized by its plan.
struct DeviceBuffers {
  // This device's shard of the master weights and of the AdamW moments.
  std::vector<float> shard, adam_m, adam_v;
  std::vector<float> full;        // the gathered weights (sharded only)
  std::vector<float> grads;       // the whole gradient the backward writes
  std::vector<float> grad_shard;  // its reduced shard (sharded only)
  float* weights = nullptr;       // what the model reads: full or shard
  float* gradient = nullptr;      // the reduced shard: grad_shard or grads
};

class ParallelPlan {
 public:
  // The plan of coll's device for a model of num_parameters values.
  static Result<ParallelPlan> Create(runtime::DeviceCollectives& coll,
                                     int64_t num_parameters);

  int64_t num_parameters() const { return n_; }
  int64_t shard_begin() const { return begin_; }
  int64_t shard_count() const { return count_; }
  bool sharded() const { return fsdp_->size > 1; }
  int data_rank() const { return data_->rank; }
  int data_size() const { return data_->size; }

  DeviceBuffers Allocate() const;

  Status GatherWeights(DeviceBuffers& b);

  // backward(ready, grads) runs the backward pass into grads, calling
  // ready(offset, count) for each range as it becomes final
  // (model::gpt::GptModel::Backward); then b.gradient holds this device's
  // shard of the gradient summed over every device.
  using Backward = std::function<Status(
      const model::gpt::GptModel::GradientReady& ready, float* grads)>;
  Status ReduceGradients(const Backward& backward, DeviceBuffers& b);

  // values[0..n) summed (or op) over every axis, in place.
  Status ReduceOverAll(float* values, int n, const std::string& label,
                       runtime::ReduceOp op = runtime::ReduceOp::kSum);
  // The same over the data axis alone.
  Status ReduceOverData(float* values, int n, const std::string& label,
                        runtime::ReduceOp op);
  // root's buf (this device's shard size) copied to every data replica.
  Status BroadcastOverData(int root, float* buf, const std::string& label);

 private:
  ParallelPlan(runtime::DeviceCollectives& coll, const runtime::AxisGroup* fsdp,
               const runtime::AxisGroup* data, int64_t n);

  runtime::DeviceCollectives* coll_;
  const runtime::AxisGroup* fsdp_;
  const runtime::AxisGroup* data_;
  int64_t n_, begin_ = 0, count_ = 0;
};

}  // namespace multislice::train
