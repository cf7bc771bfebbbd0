// The decoder (model/) in Hugging Face transformers' form: which of its
// classes a DecoderConfig is (GPT2LMHeadModel, LlamaForCausalLM,
// MistralForCausalLM, GemmaForCausalLM), that class's config.json both ways,
// and each of its tensors: the name, the shape and how it is made from the
// flat parameter buffer (model/layout.h) and back.
//
// The conversions (docs/export.md has the tables):
//   - GPT-2 keeps our layouts: its Conv1D weights are [in, out] like ours,
//     c_attn's columns q | k | v like our qkv.w.
//   - Llama, Mistral and Gemma use torch Linear weights, [out, in]: q_proj,
//     k_proj and v_proj are the transposed column blocks of our qkv.w,
//     gate_proj and up_proj those of gate_up.w, o_proj and down_proj the
//     transposed attn_proj.w and down.w. Rotary embeddings pair channel i
//     with i + head_dim/2 on both sides (rotate_half), so q and k need no
//     permutation.
//   - Gemma (as MaxText) applies its norm weights as x * w, where Hugging
//     Face stores w - 1 and applies 1 + w; and Hugging Face multiplies the
//     input embedding by sqrt(hidden_size) (in f32) where we do not, so its
//     embed_tokens is our wte / sqrt(C), and its tied logits x embed^T are
//     then our logits divided by sqrt(C): normalize_embedding_logits.
// Exact round trips: every conversion but Gemma's is a copy or a transpose;
// Gemma's w - 1 and + 1 are exact for weights in [0.5, 2], and / sqrt(C)
// and * sqrt(C) when sqrt(C) is a power of two (else within an ulp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/decoder_config.h"
#include "model/layout.h"

namespace multislice::train {

enum class HfArchitecture { kGpt2, kLlama, kMistral, kGemma };

// "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM",
// "GemmaForCausalLM".
const char* HfClassName(HfArchitecture architecture);
// config.json's model_type: "gpt2", "llama", "mistral", "gemma".
const char* HfModelType(HfArchitecture architecture);

// The class a model exports as (gpt3 -> GPT-2, llama2 -> Llama, mistral ->
// Mistral, gemma -> Gemma), or kInvalidArgument in one sentence for what
// that class cannot compute: a tied head with normalize_embedding_logits
// outside Gemma, and a tied Gemma head without it.
Result<HfArchitecture> HfArchitectureOf(const model::DecoderConfig& config);

// The tokenizer's special ids for config.json; -1: none (byte-level runs).
struct HfTokenIds {
  int bos = -1, eos = -1;
};

// config.json as transformers writes it for the class (every key its
// config class saves that bears on the model, torch_dtype float32; no
// dropout, as we trained without), keys sorted.
nlohmann::json HfConfigJson(const model::DecoderConfig& config,
                            HfArchitecture architecture,
                            const HfTokenIds& tokens = {});

// A config.json read back: the architecture (by model_type) and the model.
// A key left out takes its config class's default, as transformers reads
// it. kInvalidArgument in one sentence naming `file` and the key for
// another model_type, a mistyped or out-of-range value, and an option the
// decoder does not implement (biases in Llama's attention or MLP,
// rope_scaling, a sliding window shorter than the positions, GPT-2's
// cross-attention or layer-scaled attention, an activation other than the
// class's GELU or SiLU).
struct HfModel {
  HfArchitecture architecture = HfArchitecture::kGpt2;
  model::DecoderConfig config;
};
Result<HfModel> HfModelFromConfig(const nlohmann::json& config_json,
                                  const std::string& file);

// How a Hugging Face tensor's values come from ours: as they are, Gemma's
// norm weight (HF = w - 1) or Gemma's embedding (HF = w / sqrt(C)).
enum class HfValue { kSame, kGemmaNorm, kGemmaEmbedding };

// One tensor of the class's state dict. For a 2-D source [rows, cols] it
// takes the source's columns [column, column + width) (width the HF
// tensor's second dimension, or its first when transposed): all of them
// for most tensors, one block for q | k | v and gate | up.
struct HfTensor {
  std::string name;            // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // Hugging Face's
  std::string source;          // ours (layout.h): "h0.qkv.w"
  int64_t column = 0;
  bool transpose = false;  // HF [out, in] from our [in, out]
  HfValue value = HfValue::kSame;
};

// Every tensor of the class for `config`, in state-dict order (embeddings,
// layers, final norm, lm_head when untied). Together they cover every
// element of ParameterLayout(config) exactly once.
std::vector<HfTensor> HfTensors(const model::DecoderConfig& config,
                                HfArchitecture architecture);

// hf (the product of t.shape values, HF's layout) from the whole model's
// flat buffer `params`, whose tensor t.source is `source`.
void ExportHfTensor(const model::DecoderConfig& config, const HfTensor& t,
                    const model::ParamTensor& source, const float* params,
                    float* hf);
// The inverse: writes t's elements of `params` from hf.
void ImportHfTensor(const model::DecoderConfig& config, const HfTensor& t,
                    const model::ParamTensor& source, const float* hf,
                    float* params);

}  // namespace multislice::train
