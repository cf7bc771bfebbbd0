// What a training checkpoint holds, and how it is put back on any mesh.
//
// The trainer keeps the model's parameters as one flat f32 buffer (see
// model/gpt.h) split over the fsdp axis: fsdp rank r of f owns elements
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
// With pipeline stages p > 1 (model/gpt.h, PipelineStage) each stage's
// buffer is its own (ParameterLayout(model, t, stage)): the metadata holds
// "pipeline_parallelism": p, each shard its "stage", and the blobs are
// "params.s<stage>.<begin>" (or "params.s<stage>.t<rank>.<begin>").
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
#include "model/gpt.h"
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
};

// The name of a shard's blob of `kind` ("params", "adam_m", "adam_v"):
// "params.<begin>", with ".s<stage>" under pipeline stages and ".t<rank>"
// under tensor parallelism before the begin.
std::string ShardBlobName(const std::string& kind, int64_t begin,
                          int tensor_rank, int tensor_size, int stage = 0,
                          int stages = 1);

// The blobs of `shards` (copied: this is the copy out of the device buffers
// that blocks training during an asynchronous save).
std::vector<Blob> ShardBlobs(const std::vector<StateShard>& shards);

// The metadata of one host's checkpoint (format above).
nlohmann::json StateMetadata(int64_t step, const model::gpt::GptConfig& model,
                             const std::vector<std::string>& axis_names,
                             const std::vector<int>& mesh_shape, int num_slices,
                             const std::vector<StateShard>& shards,
                             const IteratorState& iterator,
                             int tensor_parallelism = 1,
                             int pipeline_parallelism = 1);

// The whole training state of one step, unsharded.
struct FullState {
  int64_t step = 0;
  model::gpt::GptConfig model;
  std::vector<float> params, adam_m, adam_v;
  IteratorState iterator;  // host 0's
  nlohmann::json saved_mesh;
};

// Reads every host's files of complete step `step` and reassembles the full
// buffers. kInvalidArgument (one line naming the file, blob or field) for a
// corrupt, truncated or inconsistent checkpoint.
Result<FullState> LoadFullState(const CheckpointManager& manager, int64_t step);

// LoadFullState of the newest complete step that loads, falling back to older
// complete steps; each step skipped adds its one-line reason to `warnings`.
// NotFound when no step is complete.
Result<FullState> LoadLatestFullState(const CheckpointManager& manager,
                                      std::vector<std::string>* warnings);

// The GptConfig recorded in a checkpoint's metadata "model" object.
Result<model::gpt::GptConfig> ModelFromJson(const nlohmann::json& json);

}  // namespace multislice::train
