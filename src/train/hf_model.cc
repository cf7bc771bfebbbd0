// The Hugging Face classes' config.json keys and state-dict names, and the
// element maps between their tensors and the flat buffer (hf_model.h).
#include "train/hf_model.h"

#include <cmath>

namespace multislice::train {
namespace {

using model::Activation;
using model::BlockKind;
using model::DecoderConfig;

std::string Layer(int l) { return "h" + std::to_string(l) + "."; }

void AddGpt2Tensors(const DecoderConfig& c, std::vector<HfTensor>& out) {
  const int64_t C = c.emb_dim, H = c.mlp_dim, V = c.vocab_size;
  const std::string t = "transformer.";
  out.push_back({t + "wte.weight", {V, C}, "wte"});
  out.push_back({t + "wpe.weight", {c.max_seq_len, C}, "wpe"});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string hf = t + "h." + std::to_string(l) + ".";
    const std::string ours = Layer(l);
    out.push_back({hf + "ln_1.weight", {C}, ours + "ln1.w"});
    out.push_back({hf + "ln_1.bias", {C}, ours + "ln1.b"});
    out.push_back({hf + "attn.c_attn.weight", {C, 3 * C}, ours + "qkv.w"});
    out.push_back({hf + "attn.c_attn.bias", {3 * C}, ours + "qkv.b"});
    out.push_back({hf + "attn.c_proj.weight", {C, C}, ours + "attn_proj.w"});
    out.push_back({hf + "attn.c_proj.bias", {C}, ours + "attn_proj.b"});
    out.push_back({hf + "ln_2.weight", {C}, ours + "ln2.w"});
    out.push_back({hf + "ln_2.bias", {C}, ours + "ln2.b"});
    out.push_back({hf + "mlp.c_fc.weight", {C, H}, ours + "fc.w"});
    out.push_back({hf + "mlp.c_fc.bias", {H}, ours + "fc.b"});
    out.push_back({hf + "mlp.c_proj.weight", {H, C}, ours + "fc_proj.w"});
    out.push_back({hf + "mlp.c_proj.bias", {C}, ours + "fc_proj.b"});
  }
  out.push_back({t + "ln_f.weight", {C}, "lnf.w"});
  out.push_back({t + "ln_f.bias", {C}, "lnf.b"});
}

void AddLlamaTensors(const DecoderConfig& c, bool gemma,
                     std::vector<HfTensor>& out) {
  const int64_t C = c.emb_dim, M = c.mlp_dim, V = c.vocab_size;
  const int64_t q = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim;
  const HfValue norm = gemma ? HfValue::kGemmaNorm : HfValue::kSame;
  out.push_back({"model.embed_tokens.weight",
                 {V, C},
                 "wte",
                 0,
                 false,
                 gemma ? HfValue::kGemmaEmbedding : HfValue::kSame});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const std::string ours = Layer(l);
    const std::string qkv = ours + "qkv.w", gate_up = ours + "gate_up.w";
    out.push_back({hf + "self_attn.q_proj.weight", {q, C}, qkv, 0, true});
    out.push_back({hf + "self_attn.k_proj.weight", {kv, C}, qkv, q, true});
    out.push_back({hf + "self_attn.v_proj.weight", {kv, C}, qkv, q + kv, true});
    out.push_back({hf + "self_attn.o_proj.weight",
                   {C, q},
                   ours + "attn_proj.w",
                   0,
                   true});
    out.push_back({hf + "mlp.gate_proj.weight", {M, C}, gate_up, 0, true});
    out.push_back({hf + "mlp.up_proj.weight", {M, C}, gate_up, M, true});
    out.push_back(
        {hf + "mlp.down_proj.weight", {C, M}, ours + "down.w", 0, true});
    out.push_back({hf + "input_layernorm.weight",
                   {C},
                   ours + "attn_norm.w",
                   0,
                   false,
                   norm});
    out.push_back({hf + "post_attention_layernorm.weight",
                   {C},
                   ours + "mlp_norm.w",
                   0,
                   false,
                   norm});
  }
  out.push_back({"model.norm.weight", {C}, "lnf.w", 0, false, norm});
}

// Gemma's embedding scale as Hugging Face computes it: sqrt(hidden_size)
// rounded to the f32 the embedding is multiplied by.
float GemmaEmbeddingScale(const DecoderConfig& c) {
  return static_cast<float>(std::sqrt(static_cast<double>(c.emb_dim)));
}

float ToHf(HfValue value, float w, float scale) {
  switch (value) {
    case HfValue::kGemmaNorm:
      return w - 1.0f;
    case HfValue::kGemmaEmbedding:
      return w / scale;
    case HfValue::kSame:
      break;
  }
  return w;
}

float FromHf(HfValue value, float hf, float scale) {
  switch (value) {
    case HfValue::kGemmaNorm:
      return hf + 1.0f;
    case HfValue::kGemmaEmbedding:
      return hf * scale;
    case HfValue::kSame:
      break;
  }
  return hf;
}

// Calls each(hf_index, param_index) over every element t takes from source.
template <typename Each>
void ForEachElement(const HfTensor& t, const model::ParamTensor& source,
                    Each&& each) {
  if (source.shape.size() != 2) {
    for (int64_t i = 0; i < source.size; ++i) each(i, source.offset + i);
    return;
  }
  const int64_t rows = source.shape[0], cols = source.shape[1];
  const int64_t width = t.transpose ? t.shape[0] : t.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = source.offset + r * cols + t.column;
    for (int64_t j = 0; j < width; ++j) {
      each(t.transpose ? j * rows + r : r * width + j, row + j);
    }
  }
}

}  // namespace

namespace {

// Each class's name and model_type, in HfArchitecture's order.
struct HfNames {
  const char* class_name;
  const char* model_type;
};
constexpr HfNames kHfNames[] = {{"GPT2LMHeadModel", "gpt2"},
                                {"LlamaForCausalLM", "llama"},
                                {"MistralForCausalLM", "mistral"},
                                {"GemmaForCausalLM", "gemma"}};

}  // namespace

const char* HfClassName(HfArchitecture a) {
  return kHfNames[static_cast<int>(a)].class_name;
}

const char* HfModelType(HfArchitecture a) {
  return kHfNames[static_cast<int>(a)].model_type;
}

Result<HfArchitecture> HfArchitectureOf(const DecoderConfig& c) {
  const bool normalized = c.tied_embedding && c.normalize_embedding_logits;
  HfArchitecture a = HfArchitecture::kGpt2;
  switch (c.block) {
    case BlockKind::kGpt3:
      a = HfArchitecture::kGpt2;
      break;
    case BlockKind::kLlama2:
      a = HfArchitecture::kLlama;
      break;
    case BlockKind::kMistral:
      a = HfArchitecture::kMistral;
      break;
    case BlockKind::kGemma:
      if (c.tied_embedding && !c.normalize_embedding_logits) {
        return InvalidArgument(
            "a tied gemma head without normalize_embedding_logits cannot be "
            "exported: GemmaForCausalLM's tied logits are divided by "
            "sqrt(emb_dim) (train with normalize_embedding_logits=true, as "
            "MaxText's gemma files do)");
      }
      return HfArchitecture::kGemma;
  }
  if (normalized) {
    return InvalidArgument(
        std::string("a tied ") + model::BlockName(c.block) +
        " head with normalize_embedding_logits=true cannot be exported: " +
        HfClassName(a) + " does not divide its logits by sqrt(emb_dim)");
  }
  return a;
}

std::vector<HfTensor> HfTensors(const DecoderConfig& c, HfArchitecture a) {
  std::vector<HfTensor> out;
  if (a == HfArchitecture::kGpt2) {
    AddGpt2Tensors(c, out);
  } else {
    AddLlamaTensors(c, a == HfArchitecture::kGemma, out);
  }
  if (!c.tied_embedding) {
    out.push_back(
        {"lm_head.weight", {c.vocab_size, c.emb_dim}, "lm_head", 0, false});
  }
  return out;
}

void ExportHfTensor(const DecoderConfig& c, const HfTensor& t,
                    const model::ParamTensor& source, const float* params,
                    float* hf) {
  const float scale = GemmaEmbeddingScale(c);
  ForEachElement(t, source, [&](int64_t h, int64_t p) {
    hf[h] = ToHf(t.value, params[p], scale);
  });
}

void ImportHfTensor(const DecoderConfig& c, const HfTensor& t,
                    const model::ParamTensor& source, const float* hf,
                    float* params) {
  const float scale = GemmaEmbeddingScale(c);
  ForEachElement(t, source, [&](int64_t h, int64_t p) {
    params[p] = FromHf(t.value, hf[h], scale);
  });
}

}  // namespace multislice::train
