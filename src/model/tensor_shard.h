// The parameters of one tensor-parallel rank (block.h, TensorParallel) and
// pipeline stage (layout.h, PipelineStage) against the whole model's: which
// part of each tensor rank r of t holds, of the tensors its stage holds.
//
// A tensor split by columns keeps, in each of its column blocks (gpt3's
// q | k | v, a Llama block's q | k | v with fewer key/value heads, gate |
// up), the rank's share of the block's columns [r w/t, (r+1) w/t); a tensor
// split by rows keeps rows [r n/t, (r+1) n/t); every other tensor
// (embeddings, norms, the row-parallel biases, the head) is whole on every
// rank.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "model/decoder_config.h"
#include "model/layout.h"

namespace multislice::model {

// kInvalidArgument naming the value unless the block's heads, key/value
// heads and MLP width divide by `tensor_parallelism` (>= 1).
Status ValidateTensorParallelism(const DecoderConfig& config,
                                 int tensor_parallelism);

// local (NumParameters(config, t, stage) values) = rank's part of whole
// (NumParameters(config) values), of the tensors pipeline `stage` holds.
void ExtractTensorShard(const DecoderConfig& config, int t, int rank,
                        const float* whole, float* local,
                        const PipelineStage& stage = {});

// The reverse: rank's part of whole = local (the replicated tensors too).
// The first and the last stage both hold a tied wte; inserting either
// writes it.
void InsertTensorShard(const DecoderConfig& config, int t, int rank,
                       const float* local, float* whole,
                       const PipelineStage& stage = {});

}  // namespace multislice::model
