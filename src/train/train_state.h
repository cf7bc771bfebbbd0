// What a training checkpoint holds, and how it is put back on any mesh.
//
// The trainer keeps the model's parameters as one flat f32 buffer (see
// model/layout.h) split over the fsdp axis: fsdp rank r of f owns elements
// comm::PartitionSegment(N, f, r), and so do the AdamW moments m and v.
// Devices of other data replicas hold the same shards, so only the devices
// whose data rank is 0 write theirs; every host writes its metadata (the
// iterator state included).
//
// A host's checkpoint is its blobs "params.<begin>", "adam_m.<begin>",
// "adam_v.<begin>" (f32, shape [count], <begin> the shard's first element in
// the flat buffer) plus metadata:
//
//   {"format_version": 1, "step": S, "num_params": N,
//    "model": {vocab_size, max_seq_len, emb_dim, num_heads, num_layers,
//              mlp_dim},
//    "mesh": {"axis_names": [...], "shape": [...], "num_slices": k},
//    "shards": [{"begin": b, "count": c}, ...],
//    "iterator": <IteratorState JSON>}
//
// With tensor parallelism t > 1 (model/tensor_shard.h) the flat buffer is a
// tensor rank's own (ParameterLayout(model, t)): the metadata also holds
// "tensor_parallelism": t, each shard its "tensor_rank", and the blobs are
// "params.t<rank>.<begin>" etc.
//
// With pipeline stages p > 1 (model/layout.h, PipelineStage) each stage's
// buffer is its own (ParameterLayout(model, t, stage)): the metadata holds
// "pipeline_parallelism": p, each shard its "stage", and the blobs are
// "params.s<stage>.<begin>" (or "params.s<stage>.t<rank>.<begin>").
//
// With DiLoCo (train/diloco.h; K replicas on the mesh's outermost "diloco"
// axis) every replica's inner state is saved, and the outer state (outer
// parameters, outer momentum and, with overlapped Streaming DiLoCo syncs,
// the pending reduced pseudo-gradient of the fragment in flight), sharded
// like the inner state and equal on every replica, is saved once, on replica
// 0's shards. The metadata holds "diloco": {"replicas": K, "pending": bool}
// (on every host) and, for K > 1, each shard its "replica"; under K > 1 every
// blob name has ".r<replica>" right after the kind; the outer blobs are
// "outer.<...>", "outer_momentum.<...>" and "outer_pending.<...>", named as
// the shard's params. A checkpoint without "diloco" is one without DiLoCo.
//
// Restoring reads every host's file of the step and reassembles the full
// buffers (each tensor rank's, then the whole model's from them), so a
// checkpoint saved on one mesh restores on any other (another fsdp/data split,
// another number of slices or hosts): each device then takes its own new shard.
// Every element must be covered by some shard, or the restore fails naming the
// first missing range.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/decoder.h"
#include "train/checkpoint.h"
#include "train/data.h"

namespace multislice::train {

inline constexpr int kTrainStateFormatVersion = 1;

// One device's shard of the optimiser state: elements [begin, begin + count)
// of the flat parameter buffer.
struct StateShard {
  int64_t begin = 0;
  const float* params = nullptr;
  const float* adam_m = nullptr;
  const float* adam_v = nullptr;
  int64_t count = 0;
  // The tensor rank and pipeline stage whose flat buffer `begin` counts
  // in, of tensor_size and stages.
  int tensor_rank = 0;
  int tensor_size = 1;
  int stage = 0;
  int stages = 1;
  // DiLoCo: this device's replica (diloco rank) of `replicas`, and its
  // shard of the outer state (count values each; null when not saved;
  // outer_pending null without overlapped syncs). The outer state is equal
  // on every replica: the trainer passes it on replica 0's shards for a
  // checkpoint, and on every shard for an in-memory replica (a host's
  // memory copy must be enough to restore its own devices). outer_momentum
  // is set whenever outer is.
  int replica = 0;
  int replicas = 1;
  const float* outer = nullptr;
  const float* outer_momentum = nullptr;
  const float* outer_pending = nullptr;
};

// The name of a shard's blob of `kind` ("params", "adam_m", "adam_v",
// "outer", "outer_momentum", "outer_pending"): "params.<begin>", with
// ".r<replica>" under DiLoCo replicas > 1, then ".s<stage>" under pipeline
// stages and ".t<rank>" under tensor parallelism before the begin
// ("params.r1.s0.t1.<begin>").
std::string ShardBlobName(const std::string& kind, int64_t begin,
                          int tensor_rank, int tensor_size, int stage = 0,
                          int stages = 1, int replica = 0, int replicas = 1);

// The blobs of `shards` (copied: this is the copy out of the device buffers
// that blocks training during an asynchronous save): each shard's params,
// adam_m and adam_v, then outer and outer_momentum when outer is set, and
// outer_pending when it is set.
std::vector<Blob> ShardBlobs(const std::vector<StateShard>& shards);

// The metadata of one host's checkpoint (format above). diloco_replicas K >
// 0 writes "diloco" (K, diloco_pending: whether the outer_pending buffers
// are saved) whether or not this host's shards carry outer state, and with
// K > 1 each shard's "replica"; 0 is a run without DiLoCo. With
// diloco_pending, diloco_schedule (sync period, fragments, overlap steps)
// is recorded as "schedule": the fragment in flight depends on it.
nlohmann::json StateMetadata(int64_t step, const model::DecoderConfig& model,
                             const std::vector<std::string>& axis_names,
                             const std::vector<int>& mesh_shape, int num_slices,
                             const std::vector<StateShard>& shards,
                             const IteratorState& iterator,
                             int tensor_parallelism = 1,
                             int pipeline_parallelism = 1,
                             int diloco_replicas = 0,
                             bool diloco_pending = false,
                             const std::vector<int>& diloco_schedule = {});

// One DiLoCo replica's inner state, unsharded (whole-model buffers).
struct InnerState {
  std::vector<float> params, adam_m, adam_v;
};

// The whole training state of one step, unsharded.
struct FullState {
  int64_t step = 0;
  model::DecoderConfig model;
  std::vector<float> params, adam_m, adam_v;
  IteratorState iterator;  // host 0's
  nlohmann::json saved_mesh;
  // DiLoCo (a checkpoint with "diloco"): K, else 0. params/adam_m/adam_v
  // above are replica 0's inner state; more_replicas[r - 1] replica r's.
  int diloco_replicas = 0;
  std::vector<InnerState> more_replicas;
  // The outer state (whole-model buffers, like params); outer_pending
  // empty when not saved. All empty without DiLoCo.
  std::vector<float> outer, outer_momentum, outer_pending;
  // With outer_pending: the schedule it was saved under (sync period,
  // fragments, overlap steps), or empty when the checkpoint has none.
  std::vector<int> diloco_schedule;
};

// Reads every host's files of complete step `step` and reassembles the full
// buffers: every replica's, and the outer state from replica 0's outer blobs
// (other replicas' are ignored). kInvalidArgument (one line naming the file,
// blob or field) for a corrupt, truncated or inconsistent checkpoint, and
// one naming the replica or outer kind and the first missing range when an
// element is in no shard.
//
// Memory: each host's file is read once, and the (stage, tensor rank) parts
// of every buffer (of every replica) are held until all hosts are read (the
// size of what is returned, plus each tensor rank's copy of the replicated
// tensors); then each buffer is put together in turn and its parts freed, so
// at most one whole-model buffer beyond the parts exists at a time (none
// without stages and tensor parallelism, where the parts are the whole).
Result<FullState> LoadFullState(const CheckpointManager& manager, int64_t step);

// LoadFullState of the newest complete step that loads, falling back to older
// complete steps; each step skipped adds its one-line reason to `warnings`.
// NotFound when no step is complete.
Result<FullState> LoadLatestFullState(const CheckpointManager& manager,
                                      std::vector<std::string>* warnings);

// The DecoderConfig recorded in a checkpoint's metadata "model" object, and
// back (kInvalidArgument naming a missing or bad field; a checkpoint written
// before the decoder had other blocks holds GPT-2's six sizes only).
nlohmann::json ModelToJson(const model::DecoderConfig& model);
Result<model::DecoderConfig> ModelFromJson(const nlohmann::json& json);

}  // namespace multislice::train
