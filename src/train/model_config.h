// The model a TrainConfig describes: MaxText's model keys (decoder_block,
// emb_dim, num_heads, num_kv_heads, head_dim, mlp_dim, mlp_activations,
// logits_via_embedding, rope_max_timescale, normalization_layer_epsilon...)
// as the model::DecoderConfig the trainer builds, and the FLOPs of a step.
#pragma once

#include "common/status.h"
#include "model/decoder_config.h"
#include "train/config.h"

namespace multislice::train {

// kInvalidArgument with one sentence naming the key, its value and what the
// block accepts: emb_dim not a multiple of num_heads without head_dim,
// mlp_activations the block does not implement, and every check of
// model::ValidateConfig. -1 keys take their defaults (num_kv_heads =
// num_heads, head_dim = emb_dim / num_heads) and an empty mlp_activations
// the block's own ([gelu] for gpt3, [silu, linear] for llama2 and mistral,
// [gelu, linear] for gemma).
Result<model::DecoderConfig> DecoderConfigFrom(const TrainConfig& config);

// The same for a config ValidateTrainConfig accepted.
model::DecoderConfig DecoderConfigOf(const TrainConfig& config);

// FLOPs of one training step of one device (forward + backward), counted as
// PaLM does: 6 per parameter of every matmul per token (the head's
// included), plus 12 * layers * T * heads * head_dim per token for
// attention.
double StepFlopsPerDevice(const TrainConfig& config);

}  // namespace multislice::train
