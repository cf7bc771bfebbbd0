// The shape and kind of the decoder-only language model `multislice train`
// trains (model/decoder.h): MaxText's decoder_block values and the keys of
// its model files that change the network.
//
// Every block is pre-norm with a residual stream of width emb_dim; what the
// kind decides (model/block.h has the blocks):
//
//   block    norm            positions   attention        MLP          head
//   gpt3     LayerNorm+bias  learned     MHA, biases      GELU, biases tied
//   llama2   RMSNorm         rotary      GQA, no biases   [silu,linear] untied
//   mistral  as llama2 (MaxText's sliding window is not implemented)
//   gemma    RMSNorm         rotary      GQA (MQA)        [gelu,linear] tied
//
// The head's column is the MaxText key logits_via_embedding (tied or not)
// for every kind; the table gives each kind's usual choice.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace multislice::model {

enum class BlockKind { kGpt3, kLlama2, kMistral, kGemma };

// MaxText's spelling: "gpt3", "llama2", "mistral", "gemma".
const char* BlockName(BlockKind kind);
// kInvalidArgument naming the value and the supported ones.
Result<BlockKind> ParseBlockKind(std::string_view name);

// The MLP's activation: GELU is GPT-2's tanh approximation (also Gemma's);
// SiLU is x sigmoid(x).
enum class Activation { kGelu, kSilu };

struct DecoderConfig {
  BlockKind block = BlockKind::kGpt3;
  int vocab_size = 256;   // V
  int max_seq_len = 128;  // the largest T (gpt3: rows of the position table)
  int emb_dim = 256;      // C
  int num_heads = 4;      // query heads
  int num_kv_heads = 4;   // key/value heads; divides num_heads
  int head_dim = 64;      // gpt3: emb_dim / num_heads
  int num_layers = 4;     // L
  int mlp_dim = 1024;     // the MLP's hidden width
  Activation mlp_activation = Activation::kGelu;
  // MaxText's mlp_activations [act, "linear"]: act(x W_gate) * (x W_up)
  // instead of act(x W_fc).
  bool gated_mlp = false;
  // logits = x wte^T (MaxText's logits_via_embedding), else x lm_head^T.
  bool tied_embedding = true;
  // MaxText's normalize_embedding_logits: a tied head's logits divided by
  // sqrt(emb_dim).
  bool normalize_embedding_logits = false;
  double rope_max_timescale = 10000;  // rotary embeddings' longest period
  double norm_epsilon = 1e-5;         // LayerNorm's / RMSNorm's epsilon

  friend bool operator==(const DecoderConfig&, const DecoderConfig&) = default;
};

// What each kind builds (the table above).
bool UsesLayerNorm(const DecoderConfig& c);         // else RMSNorm
bool UsesLearnedPositions(const DecoderConfig& c);  // else rotary (rope)

// The GPT-2 shape of earlier versions: gpt3 with head_dim = C / heads and
// num_kv_heads = num_heads.
DecoderConfig GptShape(int vocab_size, int max_seq_len, int emb_dim,
                       int num_heads, int num_layers, int mlp_dim);

// kInvalidArgument naming the field and value: sizes not positive, kv heads
// not dividing the query heads, an odd head_dim with rotary embeddings,
// gpt3's fixed choices (head_dim = emb_dim / num_heads, one key/value head
// per query head, a plain GELU MLP), a Llama-family block without a gated
// MLP, a non-positive epsilon or timescale.
Status ValidateConfig(const DecoderConfig& config);

}  // namespace multislice::model
