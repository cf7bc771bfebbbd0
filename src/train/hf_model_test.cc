// The Hugging Face mapping: which models export and which refuse, config.json
// written and read back (the classes' defaults for keys left out, every
// option not implemented refused in a sentence naming the key), and the
// tensors: their names and shapes, each element against an index computed
// here from the layouts' definitions, export then import giving the flat
// buffer back bit for bit.
#include "train/hf_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "model/layout.h"

namespace multislice::train {
namespace {

using model::Activation;
using model::BlockKind;
using model::DecoderConfig;
using nlohmann::json;

DecoderConfig Gpt3() { return model::GptShape(256, 32, 64, 2, 2, 128); }

DecoderConfig Llama(BlockKind kind = BlockKind::kLlama2) {
  DecoderConfig c = Gpt3();
  c.block = kind;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.mlp_dim = 96;
  c.mlp_activation = Activation::kSilu;
  c.gated_mlp = true;
  c.tied_embedding = false;
  c.rope_max_timescale = 500000;
  c.norm_epsilon = 1e-6;
  return c;
}

DecoderConfig Gemma() {
  DecoderConfig c = Llama(BlockKind::kGemma);
  c.num_kv_heads = 1;
  c.mlp_activation = Activation::kGelu;
  c.tied_embedding = true;
  c.normalize_embedding_logits = true;
  return c;
}

DecoderConfig Mistral() {
  DecoderConfig c = Llama(BlockKind::kMistral);
  c.tied_embedding = true;
  return c;
}

std::map<std::string, model::ParamTensor> ByName(const DecoderConfig& c) {
  std::map<std::string, model::ParamTensor> m;
  for (const model::ParamTensor& t : model::ParameterLayout(c)) m[t.name] = t;
  return m;
}

void ExpectRefused(const Status& s, const std::vector<std::string>& phrases) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const std::string& p : phrases) {
    EXPECT_NE(s.message().find(p), std::string::npos)
        << "'" << p << "' not in: " << s.message();
  }
}

TEST(HfModelTest, EachBlockExportsAsItsClassOrSaysWhyNot) {
  EXPECT_EQ(*HfArchitectureOf(Gpt3()), HfArchitecture::kGpt2);
  EXPECT_EQ(*HfArchitectureOf(Llama()), HfArchitecture::kLlama);
  EXPECT_EQ(*HfArchitectureOf(Mistral()), HfArchitecture::kMistral);
  EXPECT_EQ(*HfArchitectureOf(Gemma()), HfArchitecture::kGemma);
  EXPECT_STREQ(HfClassName(HfArchitecture::kGemma), "GemmaForCausalLM");
  DecoderConfig untied_gemma = Gemma();
  untied_gemma.tied_embedding = false;
  untied_gemma.normalize_embedding_logits = false;
  EXPECT_TRUE(HfArchitectureOf(untied_gemma).ok());

  DecoderConfig gpt3 = Gpt3();
  gpt3.normalize_embedding_logits = true;
  ExpectRefused(HfArchitectureOf(gpt3).status(),
                {"gpt3", "normalize_embedding_logits=true",
                 "GPT2LMHeadModel does not divide"});
  DecoderConfig gemma = Gemma();
  gemma.normalize_embedding_logits = false;
  ExpectRefused(HfArchitectureOf(gemma).status(),
                {"tied gemma head without normalize_embedding_logits"});
  DecoderConfig mistral = Mistral();
  mistral.normalize_embedding_logits = true;
  ExpectRefused(HfArchitectureOf(mistral).status(), {"MistralForCausalLM"});
}

TEST(HfModelTest, ConfigJsonReadsBackAsTheSameModel) {
  for (const DecoderConfig& c : {Gpt3(), Llama(), Mistral(), Gemma()}) {
    SCOPED_TRACE(model::BlockName(c.block));
    const HfArchitecture a = *HfArchitectureOf(c);
    // Through text, as the file carries it.
    const json text = json::parse(HfConfigJson(c, a, {1, 2}).dump(2));
    auto back = HfModelFromConfig(text, "config.json");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->architecture, a);
    EXPECT_TRUE(back->config == c);
    EXPECT_EQ(text["bos_token_id"], 1);
  }
}

TEST(HfModelTest, ConfigJsonHasTheClassesKeys) {
  const json llama = HfConfigJson(Llama(), HfArchitecture::kLlama);
  EXPECT_EQ(llama["architectures"], json({"LlamaForCausalLM"}));
  EXPECT_EQ(llama["model_type"], "llama");
  EXPECT_EQ(llama["hidden_size"], 64);
  EXPECT_EQ(llama["intermediate_size"], 96);
  EXPECT_EQ(llama["num_attention_heads"], 4);
  EXPECT_EQ(llama["num_key_value_heads"], 2);
  EXPECT_EQ(llama["head_dim"], 16);
  EXPECT_EQ(llama["num_hidden_layers"], 2);
  EXPECT_EQ(llama["max_position_embeddings"], 32);
  EXPECT_EQ(llama["rms_norm_eps"], 1e-6);
  EXPECT_EQ(llama["rope_theta"], 500000.0);
  EXPECT_EQ(llama["hidden_act"], "silu");
  EXPECT_EQ(llama["tie_word_embeddings"], false);
  EXPECT_EQ(llama["torch_dtype"], "float32");
  EXPECT_TRUE(llama["bos_token_id"].is_null());  // byte-level: none
  const json gpt2 = HfConfigJson(Gpt3(), HfArchitecture::kGpt2);
  EXPECT_EQ(gpt2["activation_function"], "gelu_new");
  EXPECT_EQ(gpt2["n_embd"], 64);
  EXPECT_EQ(gpt2["n_head"], 2);
  EXPECT_EQ(gpt2["n_inner"], 128);
  EXPECT_EQ(gpt2["n_positions"], 32);
  EXPECT_EQ(gpt2["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(gpt2["tie_word_embeddings"], true);
  const json gemma = HfConfigJson(Gemma(), HfArchitecture::kGemma);
  EXPECT_EQ(gemma["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(gemma["num_key_value_heads"], 1);
  EXPECT_TRUE(HfConfigJson(Mistral(), HfArchitecture::kMistral)
                  .at("sliding_window")
                  .is_null());
}

TEST(HfModelTest, KeysLeftOutTakeTheClassesDefaults) {
  auto gpt2 = HfModelFromConfig({{"model_type", "gpt2"}}, "c.json");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status().message();
  EXPECT_TRUE(gpt2->config ==
              model::GptShape(50257, 1024, 768, 12, 12, 3072));  // GPT-2 small
  auto llama = HfModelFromConfig({{"model_type", "llama"},
                                  {"hidden_size", 64},
                                  {"num_attention_heads", 4},
                                  {"intermediate_size", 128},
                                  {"num_hidden_layers", 2}},
                                 "c.json");
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  EXPECT_EQ(llama->config.num_kv_heads, 4);
  EXPECT_EQ(llama->config.head_dim, 16);
  EXPECT_EQ(llama->config.vocab_size, 32000);
  EXPECT_EQ(llama->config.max_seq_len, 2048);
  EXPECT_EQ(llama->config.norm_epsilon, 1e-6);
  EXPECT_EQ(llama->config.rope_max_timescale, 10000.0);
  EXPECT_EQ(llama->config.mlp_activation, Activation::kSilu);
  EXPECT_FALSE(llama->config.tied_embedding);
  auto gemma = HfModelFromConfig({{"model_type", "gemma"},
                                  {"hidden_size", 64},
                                  {"num_hidden_layers", 1},
                                  {"intermediate_size", 64},
                                  {"num_attention_heads", 2},
                                  {"num_key_value_heads", 1},
                                  {"head_dim", 32},
                                  {"vocab_size", 300}},
                                 "c.json");
  ASSERT_TRUE(gemma.ok()) << gemma.status().message();
  EXPECT_TRUE(gemma->config.tied_embedding);
  EXPECT_TRUE(gemma->config.normalize_embedding_logits);
  EXPECT_EQ(gemma->config.mlp_activation, Activation::kGelu);
}

TEST(HfModelTest, OptionsNotImplementedAreRefusedNamingTheKey) {
  const json llama = HfConfigJson(Llama(), HfArchitecture::kLlama);
  auto refused = [&](json j, const std::vector<std::string>& phrases) {
    ExpectRefused(HfModelFromConfig(j, "in/config.json").status(), [&] {
      std::vector<std::string> all = phrases;
      all.push_back("in/config.json");
      return all;
    }());
  };
  auto with = [&](json base, const char* key, json value) {
    base[key] = std::move(value);
    return base;
  };
  refused(with(llama, "model_type", "qwen2"),
          {"model_type \"qwen2\" is not implemented"});
  refused(with(llama, "attention_bias", true), {"attention_bias = true"});
  refused(with(llama, "mlp_bias", true), {"mlp_bias = true"});
  refused(with(llama, "rope_scaling", {{"type", "linear"}, {"factor", 2.0}}),
          {"rope_scaling", "not implemented"});
  refused(with(llama, "hidden_act", "gelu"),
          {"hidden_act = \"gelu\"", "tanh approximation"});
  refused(with(llama, "num_key_value_heads", 3), {"not one the decoder"});
  refused(with(llama, "num_attention_heads", "4"),
          {"num_attention_heads = \"4\"", "expected an integer"});
  refused(with(llama, "rms_norm_eps", -1), {"rms_norm_eps = -1"});
  json mistral = HfConfigJson(Mistral(), HfArchitecture::kMistral);
  refused(with(mistral, "sliding_window", 16),
          {"sliding_window 16 is shorter than max_position_embeddings 32"});
  mistral.erase("sliding_window");  // MistralConfig's default: 4096
  refused(with(mistral, "max_position_embeddings", 8192),
          {"sliding_window 4096 is shorter"});
  const json gpt2 = HfConfigJson(Gpt3(), HfArchitecture::kGpt2);
  refused(with(gpt2, "scale_attn_by_inverse_layer_idx", true),
          {"scale_attn_by_inverse_layer_idx = true"});
  refused(with(gpt2, "add_cross_attention", true), {"add_cross_attention"});
  refused(with(gpt2, "n_head", 3), {"n_embd 64 is not a multiple of n_head 3"});
  refused(with(gpt2, "activation_function", "relu"),
          {"activation_function = \"relu\""});
  refused(json::object(), {"no model_type"});
  refused(json::array(), {"not a JSON object"});
}

TEST(HfModelTest, TensorsAreTheClassesStateDict) {
  const DecoderConfig llama = Llama();
  std::map<std::string, HfTensor> names;
  int64_t elements = 0;
  for (const HfTensor& t : HfTensors(llama, HfArchitecture::kLlama)) {
    EXPECT_TRUE(names.emplace(t.name, t).second) << t.name;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    elements += n;
  }
  EXPECT_EQ(elements, model::NumParameters(llama));  // each element once
  EXPECT_EQ(names.size(), 3u + 9u * 2u);
  EXPECT_EQ(names.at("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(names.at("model.layers.0.mlp.down_proj.weight").shape,
            (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(names.count("lm_head.weight"), 1u);
  for (const HfTensor& t : HfTensors(Gemma(), HfArchitecture::kGemma)) {
    EXPECT_NE(t.name, "lm_head.weight");  // tied
  }
  std::map<std::string, std::vector<int64_t>> gpt2;
  for (const HfTensor& t : HfTensors(Gpt3(), HfArchitecture::kGpt2)) {
    gpt2[t.name] = t.shape;
  }
  EXPECT_EQ(gpt2.at("transformer.h.1.attn.c_attn.weight"),
            (std::vector<int64_t>{64, 192}));
  EXPECT_EQ(gpt2.at("transformer.wpe.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(gpt2.count("transformer.ln_f.bias"), 1u);
  EXPECT_EQ(gpt2.size(), 4u + 12u * 2u);
}

// The exported tensors of `c`, by name, from params.
std::map<std::string, std::vector<float>> Export(const DecoderConfig& c,
                                                 const std::vector<float>& p) {
  const auto layout = ByName(c);
  std::map<std::string, std::vector<float>> out;
  for (const HfTensor& t : HfTensors(c, *HfArchitectureOf(c))) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float>& hf = out[t.name];
    hf.assign(n, NAN);
    ExportHfTensor(c, t, layout.at(t.source), p.data(), hf.data());
  }
  return out;
}

TEST(HfModelTest, LlamaTensorsAreTheTransposedBlocksOfOurs) {
  const DecoderConfig c = Llama();
  std::vector<float> p(model::NumParameters(c));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i);
  auto hf = Export(c, p);
  const auto layout = ByName(c);
  const int64_t C = 64, q = 64, kv = 32, M = 96;
  // Our [in, out] element (i, o) of a tensor with `cols` columns.
  auto ours = [&](const std::string& name, int64_t i, int64_t o, int64_t cols) {
    return p[layout.at(name).offset + i * cols + o];
  };
  const std::string l = "model.layers.1.";
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t o = 0; o < q; ++o) {
      ASSERT_EQ(hf[l + "self_attn.q_proj.weight"][o * C + i],
                ours("h1.qkv.w", i, o, q + 2 * kv));
    }
    for (int64_t o = 0; o < kv; ++o) {
      ASSERT_EQ(hf[l + "self_attn.k_proj.weight"][o * C + i],
                ours("h1.qkv.w", i, q + o, q + 2 * kv));
      ASSERT_EQ(hf[l + "self_attn.v_proj.weight"][o * C + i],
                ours("h1.qkv.w", i, q + kv + o, q + 2 * kv));
    }
    for (int64_t o = 0; o < M; ++o) {
      ASSERT_EQ(hf[l + "mlp.gate_proj.weight"][o * C + i],
                ours("h1.gate_up.w", i, o, 2 * M));
      ASSERT_EQ(hf[l + "mlp.up_proj.weight"][o * C + i],
                ours("h1.gate_up.w", i, M + o, 2 * M));
      ASSERT_EQ(hf[l + "mlp.down_proj.weight"][i * M + o],
                ours("h1.down.w", o, i, C));
    }
    for (int64_t o = 0; o < q; ++o) {
      ASSERT_EQ(hf[l + "self_attn.o_proj.weight"][i * q + o],
                ours("h1.attn_proj.w", o, i, C));
    }
  }
  EXPECT_EQ(hf["lm_head.weight"][5], p[layout.at("lm_head").offset + 5]);
}

TEST(HfModelTest, GemmaNormsAreStoredMinusOneAndItsEmbeddingOverSqrtC) {
  const DecoderConfig c = Gemma();
  std::vector<float> p(model::NumParameters(c));
  model::InitParameters(c, 3, p.data());
  const auto layout = ByName(c);
  p[layout.at("h0.attn_norm.w").offset + 3] = 1.25f;
  auto hf = Export(c, p);
  EXPECT_EQ(hf["model.layers.0.input_layernorm.weight"][3], 0.25f);
  EXPECT_EQ(hf["model.norm.weight"][0], 0.0f);
  const float wte7 = p[layout.at("wte").offset + 7];
  EXPECT_EQ(hf["model.embed_tokens.weight"][7], wte7 / 8.0f);  // sqrt(64)
}

TEST(HfModelTest, ExportThenImportGivesTheBufferBackBitForBit) {
  for (const DecoderConfig& c : {Gpt3(), Llama(), Mistral(), Gemma()}) {
    SCOPED_TRACE(model::BlockName(c.block));
    std::vector<float> p(model::NumParameters(c));
    model::InitParameters(c, 5, p.data());
    // Trained norms move off 1: still exact for weights in [0.5, 2].
    for (const model::ParamTensor& t : model::ParameterLayout(c)) {
      if (t.init != model::TensorInit::kOne) continue;
      for (int64_t i = 0; i < t.size; ++i) p[t.offset + i] += 0.001f * i;
    }
    auto hf = Export(c, p);
    std::vector<float> back(p.size(), NAN);
    const auto layout = ByName(c);
    for (const HfTensor& t : HfTensors(c, *HfArchitectureOf(c))) {
      for (float v : hf[t.name]) ASSERT_FALSE(std::isnan(v)) << t.name;
      ImportHfTensor(c, t, layout.at(t.source), hf[t.name].data(), back.data());
    }
    EXPECT_EQ(std::memcmp(back.data(), p.data(), p.size() * 4), 0);
  }
}

}  // namespace
}  // namespace multislice::train
