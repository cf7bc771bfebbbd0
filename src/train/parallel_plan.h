// The parallel plan of one device: which shard of the training state it
// holds and which collectives a training step issues, derived from the mesh.
//
// Pipeline stages (model/layout.h, PipelineStage): a device of stage s holds
// stage s's tensors, the flat buffer below is that stage's
// (ParameterLayout(model, t, stage)), and the stage group sees the same rows
// of the batch (pipeline_step.h runs them).
//
// Tensor parallelism (Megatron, model/tensor_shard.h): the devices of a
// tensor group hold the parts of one model replica (the flat buffer of N
// values is the tensor rank's, ParameterLayout(model, t)), see the same rows
// of the batch, and the model all-reduces activations over the group.
//
// Sharding (ZeRO-3 style, on that flat buffer): fsdp rank r of f owns
// comm::PartitionSegment(N, f, r) of the f32 master weights and of the
// AdamW moments; data replicas hold the same shards. A step:
//   GatherWeights     all-gather of the weights over fsdp (nothing when f = 1:
//                     the shard is the whole buffer and is used in place);
//   ReduceGradients   the backward pass, then the gradient summed over fsdp
//                     (reduce-scatter) and data (all-reduce of the shard,
//                     chained; compressed on the wire when asked,
//                     set_gradient_wire); unsharded, in buckets started
//                     while the backward pass runs (gradient_buckets.h);
//   SumOverAll        small all-reduces over every axis (the loss, the norm,
//                     the failure flag).
// DiLoCo (diloco.h): the devices of one diloco rank are one replica that
// trains on its own: the gradient is summed over its data and fsdp axes
// only, and the replicas' different parameters meet in the outer optimizer.
// The batch is split over diloco, data and fsdp (each replica trains its
// share of the global batch).
//
// The collectives reduce in a fixed order, so a run is bitwise repeatable on
// the same mesh.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/decoder.h"
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
  // The plan of coll's device for `model`, split over the mesh's tensor
  // axis (kInvalidArgument when it does not divide the heads and the MLP).
  static Result<ParallelPlan> Create(runtime::DeviceCollectives& coll,
                                     const model::DecoderConfig& model);
  // For a flat buffer of num_parameters values without a model (no tensor
  // axis larger than 1).
  static Result<ParallelPlan> Create(runtime::DeviceCollectives& coll,
                                     int64_t num_parameters);

  int64_t num_parameters() const { return n_; }  // the tensor rank's
  int64_t shard_begin() const { return begin_; }
  int64_t shard_count() const { return count_; }
  bool sharded() const { return fsdp_->size > 1; }
  int data_rank() const { return data_->rank; }
  int data_size() const { return data_->size; }
  int tensor_rank() const { return tensor_->rank; }
  int tensor_size() const { return tensor_->size; }
  int stage_rank() const { return stage_->rank; }
  int stage_size() const { return stage_->size; }
  // The pipeline stage of the model this device runs (the stage axis).
  model::PipelineStage ModelStage() const;
  int diloco_rank() const { return diloco_->rank; }
  int diloco_size() const { return diloco_->size; }
  // This device's part of the batch: the tensor group's index over diloco,
  // data and fsdp, of batch_shards().
  int batch_shard() const { return batch_->rank; }
  int batch_shards() const { return batch_->size; }
  // The devices whose gradients ReduceGradients sums: the replica's batch
  // shards (data x fsdp).
  int gradient_shards() const { return batch_->size / diloco_->size; }

  // The wire of the data axis's gradient all-reduce (default kF32).
  void set_gradient_wire(runtime::WireType wire) { gradient_wire_ = wire; }

  runtime::DeviceCollectives& collectives() const { return *coll_; }

  // What the model needs for its tensor all-reduces (model/block.h).
  model::TensorParallel ModelTensor();

  // On the first and the last pipeline stage (p > 1): grads' wte part
  // (at offset 0 of both layouts) += the other end's, so that both hold
  // the tied weight's whole gradient. Nothing on the other devices.
  Status SumTiedEmbedding(float* grads);

  // The squared norm of the gradient this device's shard adds to the
  // model's over every device: the shard's, with the values the tensor
  // ranks all hold (replicated tensors) counted 1/t each, the last stage's
  // copy of the tied wte not at all, and divided by the data replicas that
  // hold the same shard.
  double ShardSquaredNorm(const float* gradient) const;

  // The weight of this device's mean loss in the mean over the global
  // batch (every DiLoCo replica's rows), so that a sum over every device
  // gives it: 1 / (batch shards x tensor ranks, which hold equal losses) on
  // a pipeline's last stage, 0 on the stages before it (they have no loss).
  float LossShare() const;
  // The same in the mean over the replica's rows (LossShare x replicas).
  float ReplicaLossShare() const { return LossShare() * diloco_->size; }

  DeviceBuffers Allocate() const;

  Status GatherWeights(DeviceBuffers& b);

  // backward(ready, grads) runs the backward pass into grads, calling
  // ready(offset, count) for each range as it becomes final
  // (model::Decoder::Backward); then b.gradient holds this device's
  // shard of the gradient summed over every device.
  using Backward = std::function<Status(
      const model::Decoder::GradientReady& ready, float* grads)>;
  Status ReduceGradients(const Backward& backward, DeviceBuffers& b);

  // values[0..n) summed (or op) over every axis, in place.
  Status ReduceOverAll(float* values, int n, const std::string& label,
                       runtime::ReduceOp op = runtime::ReduceOp::kSum);
  // The same over this device's DiLoCo replica (every axis but diloco:
  // every axis without DiLoCo), so that the replicas' steps never wait for
  // each other.
  Status ReduceOverReplica(float* values, int n, const std::string& label,
                           runtime::ReduceOp op = runtime::ReduceOp::kSum);
  // The same over the data axis alone.
  Status ReduceOverData(float* values, int n, const std::string& label,
                        runtime::ReduceOp op);
  // root's buf (this device's shard size) copied to every data replica.
  Status BroadcastOverData(int root, float* buf, const std::string& label);
  // The same over the diloco axis (DiLoCo's replicas), and its reduction.
  Status BroadcastOverDiloco(int root, float* buf, const std::string& label);
  Status ReduceOverDiloco(float* values, int n, const std::string& label,
                          runtime::ReduceOp op);

 private:
  ParallelPlan(runtime::DeviceCollectives& coll, int64_t n);
  Status FindGroups();
  void Partition();  // the fsdp shard of n_

  runtime::DeviceCollectives* coll_;
  const runtime::AxisGroup* fsdp_ = nullptr;
  const runtime::AxisGroup* data_ = nullptr;
  const runtime::AxisGroup* tensor_ = nullptr;
  const runtime::AxisGroup* stage_ = nullptr;
  const runtime::AxisGroup* diloco_ = nullptr;
  const runtime::AxisGroup* batch_ = nullptr;  // diloco, data and fsdp
  runtime::WireType gradient_wire_ = runtime::WireType::kF32;
  int64_t n_, begin_ = 0, count_ = 0;
  // The shard's ranges [begin, end) (shard positions) of replicated tensors;
  // empty without tensor parallelism.
  std::vector<std::pair<int64_t, int64_t>> replicated_;
  // The same for the last stage's copy of the tied wte; its size on the
  // first and last stage (0 elsewhere) and the other end's part.
  std::vector<std::pair<int64_t, int64_t>> tied_copy_;
  int64_t tied_count_ = 0;
  std::vector<float> tied_scratch_;
};

}  // namespace multislice::train
