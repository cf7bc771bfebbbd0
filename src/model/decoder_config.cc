#include "model/decoder_config.h"

#include <string>

namespace multislice::model {
namespace {

struct Named {
  BlockKind kind;
  const char* name;
};
constexpr Named kBlocks[] = {{BlockKind::kGpt3, "gpt3"},
                             {BlockKind::kLlama2, "llama2"},
                             {BlockKind::kMistral, "mistral"},
                             {BlockKind::kGemma, "gemma"}};

Status Positive(const char* field, double value) {
  if (value > 0) return OkStatus();
  return InvalidArgument("DecoderConfig." + std::string(field) + " is " +
                         std::to_string(value) + "; expected > 0");
}

Status CheckGpt3(const DecoderConfig& c) {
  if (c.emb_dim % c.num_heads != 0 || c.head_dim != c.emb_dim / c.num_heads) {
    return InvalidArgument("the gpt3 block needs emb_dim (" +
                           std::to_string(c.emb_dim) + ") = num_heads (" +
                           std::to_string(c.num_heads) + ") x head_dim (" +
                           std::to_string(c.head_dim) + ")");
  }
  if (c.num_kv_heads != c.num_heads) {
    return InvalidArgument(
        "the gpt3 block has one key/value head per query "
        "head: num_kv_heads is " +
        std::to_string(c.num_kv_heads) + ", expected num_heads (" +
        std::to_string(c.num_heads) + ")");
  }
  if (c.gated_mlp || c.mlp_activation != Activation::kGelu) {
    return InvalidArgument(
        "the gpt3 block's MLP is mlp_activations [gelu]; gated MLPs are the "
        "llama2, mistral and gemma blocks'");
  }
  return OkStatus();
}

}  // namespace

const char* BlockName(BlockKind kind) {
  for (const Named& b : kBlocks) {
    if (b.kind == kind) return b.name;
  }
  return "?";
}

Result<BlockKind> ParseBlockKind(std::string_view name) {
  for (const Named& b : kBlocks) {
    if (name == b.name) return b.kind;
  }
  return InvalidArgument("decoder_block '" + std::string(name) +
                         "' is not one this trainer implements: expected "
                         "gpt3, llama2, mistral or gemma");
}

bool UsesLayerNorm(const DecoderConfig& c) {
  return c.block == BlockKind::kGpt3;
}

bool UsesLearnedPositions(const DecoderConfig& c) {
  return c.block == BlockKind::kGpt3;
}

DecoderConfig GptShape(int vocab_size, int max_seq_len, int emb_dim,
                       int num_heads, int num_layers, int mlp_dim) {
  DecoderConfig c;
  c.vocab_size = vocab_size;
  c.max_seq_len = max_seq_len;
  c.emb_dim = emb_dim;
  c.num_heads = c.num_kv_heads = num_heads;
  c.head_dim = num_heads > 0 ? emb_dim / num_heads : 0;
  c.num_layers = num_layers;
  c.mlp_dim = mlp_dim;
  return c;
}

Status ValidateConfig(const DecoderConfig& c) {
  RETURN_IF_ERROR(Positive("vocab_size", c.vocab_size));
  RETURN_IF_ERROR(Positive("max_seq_len", c.max_seq_len));
  RETURN_IF_ERROR(Positive("emb_dim", c.emb_dim));
  RETURN_IF_ERROR(Positive("num_heads", c.num_heads));
  RETURN_IF_ERROR(Positive("num_kv_heads", c.num_kv_heads));
  RETURN_IF_ERROR(Positive("head_dim", c.head_dim));
  RETURN_IF_ERROR(Positive("num_layers", c.num_layers));
  RETURN_IF_ERROR(Positive("mlp_dim", c.mlp_dim));
  RETURN_IF_ERROR(Positive("norm_epsilon", c.norm_epsilon));
  if (c.num_heads % c.num_kv_heads != 0) {
    return InvalidArgument("num_kv_heads " + std::to_string(c.num_kv_heads) +
                           " does not divide num_heads " +
                           std::to_string(c.num_heads) +
                           ": each key/value head serves an equal group of "
                           "query heads");
  }
  if (c.block == BlockKind::kGpt3) return CheckGpt3(c);
  RETURN_IF_ERROR(Positive("rope_max_timescale", c.rope_max_timescale));
  if (c.head_dim % 2 != 0) {
    return InvalidArgument("head_dim " + std::to_string(c.head_dim) +
                           " is odd; rotary embeddings rotate pairs of "
                           "channels, so it must be even");
  }
  if (!c.gated_mlp) {
    return InvalidArgument(std::string("the ") + BlockName(c.block) +
                           " block's MLP is gated: mlp_activations [silu, "
                           "linear] or [gelu, linear]");
  }
  return OkStatus();
}

}  // namespace multislice::model
