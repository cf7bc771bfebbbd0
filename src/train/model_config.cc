#include "train/model_config.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace multislice::train {
namespace {

using model::Activation;
using model::BlockKind;

std::string ListText(const std::vector<std::string>& list) {
  return nlohmann::json(list).dump();
}

// The MLP of `acts` (empty: the block's own) into m, or the sentence.
Status SetActivations(const std::vector<std::string>& acts,
                      model::DecoderConfig& m) {
  const bool gpt3 = m.block == BlockKind::kGpt3;
  std::vector<std::string> list = acts;
  if (list.empty()) {
    list = gpt3 ? std::vector<std::string>{"gelu"}
           : m.block == BlockKind::kGemma
               ? std::vector<std::string>{"gelu", "linear"}
               : std::vector<std::string>{"silu", "linear"};
  }
  if (gpt3 && list == std::vector<std::string>{"gelu"}) {
    m.mlp_activation = Activation::kGelu;
    m.gated_mlp = false;
    return OkStatus();
  }
  if (!gpt3 && list.size() == 2 && list[1] == "linear" &&
      (list[0] == "silu" || list[0] == "gelu")) {
    m.mlp_activation =
        list[0] == "silu" ? Activation::kSilu : Activation::kGelu;
    m.gated_mlp = true;
    return OkStatus();
  }
  return InvalidArgument(
      "key 'mlp_activations' = " + ListText(acts) + ": the " +
      model::BlockName(m.block) + " block implements " +
      (gpt3 ? std::string("[\"gelu\"]")
            : std::string("[\"silu\", \"linear\"] (SwiGLU) or [\"gelu\", "
                          "\"linear\"] (GeGLU)")));
}

}  // namespace

Result<model::DecoderConfig> DecoderConfigFrom(const TrainConfig& c) {
  model::DecoderConfig m;
  ASSIGN_OR_RETURN(m.block, model::ParseBlockKind(c.decoder_block));
  m.vocab_size = c.vocab_size;
  m.max_seq_len = c.max_target_length;
  m.emb_dim = c.emb_dim;
  m.num_heads = c.num_heads;
  m.num_kv_heads = c.num_kv_heads == -1 ? c.num_heads : c.num_kv_heads;
  if ((c.head_dim == -1 || m.block == BlockKind::kGpt3) && c.num_heads > 0 &&
      c.emb_dim % c.num_heads != 0) {
    return InvalidArgument(
        "key 'emb_dim' = " + std::to_string(c.emb_dim) +
        ": expected a multiple of num_heads (" + std::to_string(c.num_heads) +
        ")" + (m.block == BlockKind::kGpt3 ? "" : ", or set head_dim"));
  }
  m.head_dim = c.head_dim == -1 && c.num_heads > 0 ? c.emb_dim / c.num_heads
                                                   : c.head_dim;
  m.num_layers = c.num_decoder_layers;
  m.mlp_dim = c.mlp_dim;
  RETURN_IF_ERROR(SetActivations(c.mlp_activations, m));
  m.tied_embedding = c.logits_via_embedding;
  m.normalize_embedding_logits = c.normalize_embedding_logits;
  m.rope_max_timescale = c.rope_max_timescale;
  m.norm_epsilon = c.normalization_layer_epsilon;
  RETURN_IF_ERROR(model::ValidateConfig(m));
  return m;
}

model::DecoderConfig DecoderConfigOf(const TrainConfig& c) {
  Result<model::DecoderConfig> m = DecoderConfigFrom(c);
  return m.ok() ? *m : model::DecoderConfig{};
}

double StepFlopsPerDevice(const TrainConfig& config) {
  const model::DecoderConfig c = DecoderConfigOf(config);
  const double C = c.emb_dim, L = c.num_layers, T = c.max_seq_len;
  const double q = double{1.0} * c.num_heads * c.head_dim;
  const double kv = double{1.0} * c.num_kv_heads * c.head_dim;
  const double mlp = (c.gated_mlp ? 3.0 : 2.0) * C * c.mlp_dim;
  const double matmul_params =
      L * (C * (q + 2 * kv) + q * C + mlp) + C * c.vocab_size;
  const double tokens = static_cast<double>(config.per_device_batch_size) * T;
  return tokens * (6 * matmul_params + 12 * L * T * q);
}

}  // namespace multislice::train
