// config.json of the Hugging Face classes (hf_model.h), both ways: written
// with the keys transformers saves for each class, read with its defaults
// for the keys left out, refusing every option the decoder does not
// implement in one sentence.
#include <cmath>
#include <string>

#include "train/hf_model.h"

namespace multislice::train {
namespace {

using model::Activation;
using model::BlockKind;
using model::DecoderConfig;
using nlohmann::json;

// Typed keys of one config.json, each missing key its class's default.
class ConfigKeys {
 public:
  ConfigKeys(const json& j, const std::string& file) : j_(j), file_(file) {}

  bool Present(const char* key) const {
    return j_.contains(key) && !j_[key].is_null();
  }
  bool Null(const char* key) const {
    return j_.contains(key) && j_[key].is_null();
  }
  // An integer from 1 to 2^30; missing or null: `fallback`.
  Result<int> Int(const char* key, int fallback) const {
    if (!Present(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 ||
        v.get<int64_t>() > (int64_t{1} << 30)) {
      return Bad(key, v, "an integer from 1 to 1073741824");
    }
    return static_cast<int>(v.get<int64_t>());
  }
  // A number above 0.
  Result<double> Positive(const char* key, double fallback) const {
    if (!Present(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number() || !(v.get<double>() > 0) ||
        !std::isfinite(v.get<double>())) {
      return Bad(key, v, "a number above 0");
    }
    return v.get<double>();
  }
  Result<bool> Bool(const char* key, bool fallback) const {
    if (!Present(key)) return fallback;
    if (!j_[key].is_boolean()) return Bad(key, j_[key], "true or false");
    return j_[key].get<bool>();
  }
  Result<std::string> String(const char* key,
                             const std::string& fallback) const {
    if (!Present(key)) return fallback;
    if (!j_[key].is_string()) return Bad(key, j_[key], "a string");
    return j_[key].get<std::string>();
  }
  // Refuses `key` unless it is missing or has the one value implemented.
  Status Require(const char* key, const json& implemented,
                 const std::string& why) const {
    if (!j_.contains(key) || j_[key] == implemented) return OkStatus();
    return InvalidArgument(file_ + ": " + key + " = " + j_[key].dump() +
                           " is not implemented (" + why + ")");
  }
  Status Refuse(const std::string& what) const {
    return InvalidArgument(file_ + ": " + what);
  }

 private:
  Status Bad(const char* key, const json& v,
             const std::string& expected) const {
    return InvalidArgument(file_ + ": " + key + " = " + v.dump() +
                           ": expected " + expected);
  }

  const json& j_;
  const std::string& file_;
};

// GPT-2's tanh GELU under its names; "gelu" is the exact (erf) form.
Result<Activation> ActivationNamed(const ConfigKeys& k, const char* key,
                                   const std::string& name, bool allow_silu) {
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") {
    return Activation::kGelu;
  }
  if (allow_silu && name == "silu") return Activation::kSilu;
  return k.Refuse(std::string(key) + " = \"" + name +
                  "\" is not implemented (the MLP computes " +
                  (allow_silu ? "silu or " : "") +
                  "GELU's tanh approximation: gelu_new, gelu_pytorch_tanh)");
}

Result<DecoderConfig> Gpt2FromConfig(const ConfigKeys& k) {
  RETURN_IF_ERROR(k.Require("scale_attn_weights", true,
                            "attention scores are scaled by 1/sqrt(head_dim)"));
  RETURN_IF_ERROR(k.Require("scale_attn_by_inverse_layer_idx", false,
                            "no per-layer attention scaling"));
  RETURN_IF_ERROR(
      k.Require("add_cross_attention", false, "a decoder-only model"));
  ASSIGN_OR_RETURN(const int C, k.Int("n_embd", 768));
  ASSIGN_OR_RETURN(const int heads, k.Int("n_head", 12));
  ASSIGN_OR_RETURN(const int layers, k.Int("n_layer", 12));
  ASSIGN_OR_RETURN(const int positions, k.Int("n_positions", 1024));
  ASSIGN_OR_RETURN(const int vocab, k.Int("vocab_size", 50257));
  if (C % heads != 0) {
    return k.Refuse("n_embd " + std::to_string(C) +
                    " is not a multiple of n_head " + std::to_string(heads));
  }
  ASSIGN_OR_RETURN(const int inner, k.Int("n_inner", 4 * C));
  DecoderConfig c = model::GptShape(vocab, positions, C, heads, layers, inner);
  ASSIGN_OR_RETURN(c.norm_epsilon, k.Positive("layer_norm_epsilon", 1e-5));
  ASSIGN_OR_RETURN(c.tied_embedding, k.Bool("tie_word_embeddings", true));
  ASSIGN_OR_RETURN(const std::string act,
                   k.String("activation_function", "gelu_new"));
  ASSIGN_OR_RETURN(c.mlp_activation,
                   ActivationNamed(k, "activation_function", act, false));
  return c;
}

// LlamaConfig's, MistralConfig's and GemmaConfig's defaults.
struct LlamaDefaults {
  int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;
  int positions;
  bool tied;
};

Result<DecoderConfig> LlamaFromConfig(const ConfigKeys& k, HfArchitecture a) {
  const bool gemma = a == HfArchitecture::kGemma;
  const bool mistral = a == HfArchitecture::kMistral;
  const LlamaDefaults d =
      gemma ? LlamaDefaults{256000, 3072, 24576, 28, 16, 16, 256, 8192, true}
      : mistral ? LlamaDefaults{32000, 4096, 14336, 32, 32, 8, 0, 131072, false}
                : LlamaDefaults{32000, 4096, 11008, 32, 32, 0, 0, 2048, false};
  RETURN_IF_ERROR(k.Require("attention_bias", false, "no attention biases"));
  RETURN_IF_ERROR(k.Require("mlp_bias", false, "no MLP biases"));
  RETURN_IF_ERROR(k.Require("rope_scaling", nullptr,
                            "plain rotary embeddings, no scaling"));
  DecoderConfig c;
  c.block = gemma     ? BlockKind::kGemma
            : mistral ? BlockKind::kMistral
                      : BlockKind::kLlama2;
  ASSIGN_OR_RETURN(c.vocab_size, k.Int("vocab_size", d.vocab));
  ASSIGN_OR_RETURN(c.emb_dim, k.Int("hidden_size", d.hidden));
  ASSIGN_OR_RETURN(c.mlp_dim, k.Int("intermediate_size", d.intermediate));
  ASSIGN_OR_RETURN(c.num_layers, k.Int("num_hidden_layers", d.layers));
  ASSIGN_OR_RETURN(c.num_heads, k.Int("num_attention_heads", d.heads));
  ASSIGN_OR_RETURN(
      c.num_kv_heads,
      k.Int("num_key_value_heads", d.kv_heads ? d.kv_heads : c.num_heads));
  if (!gemma && !k.Present("head_dim") && c.emb_dim % c.num_heads != 0) {
    return k.Refuse("hidden_size " + std::to_string(c.emb_dim) +
                    " is not a multiple of num_attention_heads " +
                    std::to_string(c.num_heads) + " and head_dim is not set");
  }
  ASSIGN_OR_RETURN(
      c.head_dim,
      k.Int("head_dim", gemma ? d.head_dim : c.emb_dim / c.num_heads));
  ASSIGN_OR_RETURN(c.max_seq_len,
                   k.Int("max_position_embeddings", d.positions));
  ASSIGN_OR_RETURN(c.norm_epsilon, k.Positive("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rope_max_timescale, k.Positive("rope_theta", 10000.0));
  ASSIGN_OR_RETURN(c.tied_embedding, k.Bool("tie_word_embeddings", d.tied));
  if (mistral && !k.Null("sliding_window")) {
    // MistralConfig's default window is 4096; null is full attention.
    ASSIGN_OR_RETURN(const int window, k.Int("sliding_window", 4096));
    if (window < c.max_seq_len) {
      return k.Refuse("sliding_window " + std::to_string(window) +
                      " is shorter than max_position_embeddings " +
                      std::to_string(c.max_seq_len) +
                      "; sliding-window attention is not implemented");
    }
  }
  // Gemma's MLP reads hidden_activation (gelu_pytorch_tanh when unset).
  const char* act_key = gemma ? "hidden_activation" : "hidden_act";
  ASSIGN_OR_RETURN(const std::string act,
                   k.String(act_key, gemma ? "gelu_pytorch_tanh" : "silu"));
  ASSIGN_OR_RETURN(c.mlp_activation, ActivationNamed(k, act_key, act, true));
  c.gated_mlp = true;
  // GemmaForCausalLM's tied logits x (wte / sqrt(C))^T (hf_model.h).
  c.normalize_embedding_logits = gemma;
  return c;
}

}  // namespace

nlohmann::json HfConfigJson(const DecoderConfig& c, HfArchitecture a,
                            const HfTokenIds& tokens) {
  auto id = [](int v) { return v >= 0 ? json(v) : json(nullptr); };
  json j = {{"architectures", {HfClassName(a)}},
            {"model_type", HfModelType(a)},
            {"vocab_size", c.vocab_size},
            {"tie_word_embeddings", c.tied_embedding},
            {"initializer_range", 0.02},
            {"bos_token_id", id(tokens.bos)},
            {"eos_token_id", id(tokens.eos)},
            {"torch_dtype", "float32"},
            {"use_cache", true}};
  if (a == HfArchitecture::kGpt2) {
    j.update({{"activation_function", "gelu_new"},
              {"n_embd", c.emb_dim},
              {"n_head", c.num_heads},
              {"n_layer", c.num_layers},
              {"n_inner", c.mlp_dim},
              {"n_positions", c.max_seq_len},
              {"n_ctx", c.max_seq_len},
              {"layer_norm_epsilon", c.norm_epsilon},
              {"attn_pdrop", 0.0},
              {"embd_pdrop", 0.0},
              {"resid_pdrop", 0.0},
              {"scale_attn_weights", true},
              {"scale_attn_by_inverse_layer_idx", false},
              {"reorder_and_upcast_attn", false},
              {"summary_activation", nullptr},
              {"summary_first_dropout", 0.1},
              {"summary_proj_to_labels", true},
              {"summary_type", "cls_index"},
              {"summary_use_proj", true}});
    return j;
  }
  const char* act =
      c.mlp_activation == Activation::kSilu ? "silu" : "gelu_pytorch_tanh";
  j.update({{"hidden_act", act},
            {"hidden_size", c.emb_dim},
            {"intermediate_size", c.mlp_dim},
            {"num_attention_heads", c.num_heads},
            {"num_key_value_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"num_hidden_layers", c.num_layers},
            {"max_position_embeddings", c.max_seq_len},
            {"rms_norm_eps", c.norm_epsilon},
            {"rope_theta", c.rope_max_timescale},
            {"attention_dropout", 0.0}});
  if (a == HfArchitecture::kMistral) {
    j["sliding_window"] = nullptr;  // full attention, as trained
  } else {
    j["attention_bias"] = false;
    j["rope_scaling"] = nullptr;
  }
  if (a == HfArchitecture::kLlama) {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (a == HfArchitecture::kGemma) j["hidden_activation"] = act;
  return j;
}

Result<HfModel> HfModelFromConfig(const nlohmann::json& j,
                                  const std::string& file) {
  if (!j.is_object()) return InvalidArgument(file + " is not a JSON object");
  const ConfigKeys k(j, file);
  if (!k.Present("model_type") || !j["model_type"].is_string()) {
    return InvalidArgument(file + " has no model_type string");
  }
  const std::string type = j["model_type"].get<std::string>();
  HfModel m;
  bool known = false;
  for (HfArchitecture a : {HfArchitecture::kGpt2, HfArchitecture::kLlama,
                           HfArchitecture::kMistral, HfArchitecture::kGemma}) {
    if (type == HfModelType(a)) {
      m.architecture = a;
      known = true;
    }
  }
  if (!known) {
    return InvalidArgument(file + ": model_type \"" + type +
                           "\" is not implemented (gpt2, llama, mistral and "
                           "gemma are)");
  }
  Result<DecoderConfig> c = m.architecture == HfArchitecture::kGpt2
                                ? Gpt2FromConfig(k)
                                : LlamaFromConfig(k, m.architecture);
  if (!c.ok()) return c.status();
  if (Status s = model::ValidateConfig(*c); !s.ok()) {
    return InvalidArgument(file + ": the model it describes is not one the " +
                           "decoder builds: " + s.message());
  }
  m.config = *c;
  return m;
}

}  // namespace multislice::train
