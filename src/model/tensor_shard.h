// The parameters of one tensor-parallel rank (model/gpt.h, TensorParallel)
// and pipeline stage (PipelineStage) against the whole model's: which part
// of each tensor rank r of t holds, of the tensors its stage holds.
//
// qkv.w [C,3C] and qkv.b [3C] keep, in each of the q, k and v blocks, the
// columns of the rank's heads [r C/t, (r+1) C/t); fc.w [C,mlp] and fc.b keep
// the columns [r mlp/t, (r+1) mlp/t); attn_proj.w and fc_proj.w keep the
// matching rows; every other tensor (embeddings, LayerNorms, the row-parallel
// biases) is whole on every rank.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/gpt.h"

namespace multislice::model::gpt {

// kInvalidArgument naming the value unless num_heads and mlp_dim divide by
// `tensor_parallelism` (>= 1).
Status ValidateTensorParallelism(const GptConfig& config,
                                 int tensor_parallelism);

// local (NumParameters(config, t, stage) values) = rank's part of whole
// (NumParameters(config) values), of the tensors pipeline `stage` holds.
void ExtractTensorShard(const GptConfig& config, int t, int rank,
                        const float* whole, float* local,
                        const PipelineStage& stage = {});

// The reverse: rank's part of whole = local (the replicated tensors too).
// The first and the last stage both hold wte; inserting either writes it.
void InsertTensorShard(const GptConfig& config, int t, int rank,
                       const float* local, float* whole,
                       const PipelineStage& stage = {});

// Whether tensor `name` of the layout is whole on every rank.
bool IsReplicatedTensor(const std::string& name);

}  // namespace multislice::model::gpt
