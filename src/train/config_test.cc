// Tests for TrainConfig: defaults, YAML and command-line layering, the exact
// error sentences, the shipped configs/base.yml, and the ToJson round trip.
#include "train/config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/temp_dir.h"
#include "train/maxtext_keys.h"

namespace multislice {
namespace {

// configs/base.yml in the source tree (MULTISLICE_SOURCE_DIR is set by
// CMake: __FILE__ is relative where ccache's base_dir rewrites paths).
std::string ShippedBaseYaml() {
  return std::string(MULTISLICE_SOURCE_DIR) + "/configs/base.yml";
}

class ConfigTest : public ::testing::Test {
 protected:
  // Writes `contents` to a file in the temp dir and returns its path.
  std::string WriteYaml(const std::string& contents,
                        const std::string& name = "run.yml") {
    std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << contents;
    return path;
  }

  // The message of the error from loading `contents` with `overrides`.
  std::string LoadError(const std::string& contents,
                        const std::vector<std::string>& overrides = {}) {
    Result<TrainConfig> config =
        LoadTrainConfig(WriteYaml(contents), overrides);
    EXPECT_FALSE(config.ok());
    if (config.ok()) return "";
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    return config.status().message();
  }

  std::string ValidateError(const TrainConfig& config) {
    Status status = ValidateTrainConfig(config);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    return status.message();
  }

  std::string KnownKeys() {
    std::string list;
    for (const std::string& key : TrainConfigKeys()) {
      list += (list.empty() ? "" : ", ") + key;
    }
    return list;
  }

  TempDir dir_;
};

TEST_F(ConfigTest, Defaults) {
  TrainConfig c;
  EXPECT_EQ(c.run_name, "");
  EXPECT_EQ(c.base_output_directory, "runs");
  EXPECT_EQ(c.steps, 200);
  EXPECT_EQ(c.per_device_batch_size, 8);
  EXPECT_EQ(c.max_target_length, 128);
  EXPECT_EQ(c.ici_data_parallelism, 1);
  EXPECT_EQ(c.ici_fsdp_parallelism, -1);
  EXPECT_EQ(c.ici_tensor_parallelism, 1);
  EXPECT_EQ(c.dcn_data_parallelism, -1);
  EXPECT_EQ(c.dcn_fsdp_parallelism, 1);
  EXPECT_EQ(c.dcn_tensor_parallelism, 1);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.emb_dim, 256);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_decoder_layers, 4);
  EXPECT_EQ(c.mlp_dim, 1024);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-3);
  EXPECT_EQ(c.warmup_steps, 20);
  EXPECT_DOUBLE_EQ(c.cosine_learning_rate_final_fraction, 0.1);
  EXPECT_DOUBLE_EQ(c.adam_b1, 0.9);
  EXPECT_DOUBLE_EQ(c.adam_b2, 0.95);
  EXPECT_DOUBLE_EQ(c.adam_eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.adam_weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.gradient_clipping_threshold, 1.0);
  EXPECT_EQ(c.checkpoint_period, 50);
  EXPECT_EQ(c.max_num_checkpoints_to_keep, 3);
  EXPECT_TRUE(c.async_checkpointing);
  EXPECT_TRUE(c.enable_checkpointing);
  EXPECT_EQ(c.dataset_path, "");
  EXPECT_EQ(c.eval_interval, 20);
  EXPECT_EQ(c.eval_batches, 4);
  EXPECT_EQ(c.seed, 0);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_FALSE(c.deterministic);
  EXPECT_EQ(c.log_period, 1);
  EXPECT_TRUE(ValidateTrainConfig(c).ok());
}

TEST_F(ConfigTest, EmptyFileGivesDefaults) {
  Result<TrainConfig> config = LoadTrainConfig(WriteYaml(""), {});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(*config, TrainConfig());
}

TEST_F(ConfigTest, YamlSetsKeysOfEveryType) {
  Result<TrainConfig> config =
      LoadTrainConfig(WriteYaml("run_name: smoke\n"
                                "steps: 10\n"
                                "ici_fsdp_parallelism: +2\n"
                                "learning_rate: 3e-4\n"
                                "adam_b2: .99\n"
                                "async_checkpointing: False\n"
                                "deterministic: TRUE\n"
                                "dtype: f32\n"
                                "dataset_path: ~\n"),
                      {});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->run_name, "smoke");
  EXPECT_EQ(config->steps, 10);
  EXPECT_EQ(config->ici_fsdp_parallelism, 2);
  EXPECT_DOUBLE_EQ(config->learning_rate, 3e-4);
  EXPECT_DOUBLE_EQ(config->adam_b2, 0.99);
  EXPECT_FALSE(config->async_checkpointing);
  EXPECT_TRUE(config->deterministic);
  EXPECT_EQ(config->dtype, "float32");  // MaxText's spelling from here on
  EXPECT_EQ(config->dataset_path, "");
  EXPECT_EQ(config->per_device_batch_size, 8);  // untouched keys keep defaults
}

TEST_F(ConfigTest, OverridesWinOverYamlAndLaterOverridesWin) {
  Result<TrainConfig> config =
      LoadTrainConfig(WriteYaml("steps: 10\nrun_name: from_yaml\n"),
                      {"steps=20", "run_name=first", "run_name=second",
                       "dataset_path=/data/a=b", "deterministic=true"});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->steps, 20);
  EXPECT_EQ(config->run_name, "second");
  EXPECT_EQ(config->dataset_path, "/data/a=b");  // split at the first '='
  EXPECT_TRUE(config->deterministic);
}

TEST_F(ConfigTest, UnknownKeyInYaml) {
  EXPECT_EQ(LoadError("steps: 10\nfoo: 1\n"),
            "unknown key 'foo' in " + dir_.path() +
                "/run.yml; known keys: " + KnownKeys());
  EXPECT_EQ(KnownKeys().substr(0, 38),
            "run_name, base_output_directory, steps");
}

TEST_F(ConfigTest, UnknownKeyOnCommandLine) {
  EXPECT_EQ(LoadError("", {"steps=5", "stpes=5"}),
            "unknown key 'stpes' in the command line; did you mean 'steps'?");
  EXPECT_EQ(LoadError("", {"learning_rat=0.1"}),
            "unknown key 'learning_rat' in the command line; did you mean "
            "'learning_rate'?");
  EXPECT_EQ(
      LoadError("", {"zzz=1"}),
      "unknown key 'zzz' in the command line; known keys: " + KnownKeys());
}

// The seed's recovery script writes to gs://: refused, not a directory
// named "gs:".
TEST_F(ConfigTest, UrlOutputDirectoryIsRefused) {
  TrainConfig config;
  config.base_output_directory = "gs://bucket/runs";
  const std::string error = ValidateError(config);
  EXPECT_NE(error.find("not a gs:// URL"), std::string::npos) << error;
  config.base_output_directory = "runs/a:b";  // a colon is fine
  EXPECT_TRUE(ValidateTrainConfig(config).ok());
}

// MaxText's names for the same keys.
TEST_F(ConfigTest, MaxTextNamesAreAliases) {
  Result<TrainConfig> config =
      LoadTrainConfig(WriteYaml("run_name: a\n"),
                      {"save_period=7", "base_emb_dim=96", "base_mlp_dim=384",
                       "base_num_decoder_layers=3", "base_num_query_heads=4"});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->checkpoint_period, 7);
  EXPECT_EQ(config->emb_dim, 96);
  EXPECT_EQ(config->mlp_dim, 384);
  EXPECT_EQ(config->num_decoder_layers, 3);
  EXPECT_EQ(config->num_heads, 4);
}

TEST_F(ConfigTest, WrongTypes) {
  std::string where = " in " + dir_.path() + "/run.yml: expected ";
  EXPECT_EQ(LoadError("steps: ten\n"),
            "key 'steps' = 'ten'" + where + "an integer");
  EXPECT_EQ(LoadError("steps: 1.5\n"),
            "key 'steps' = '1.5'" + where + "an integer");
  EXPECT_EQ(LoadError("steps:\n"), "key 'steps' = ''" + where + "an integer");
  EXPECT_EQ(LoadError("steps: 99999999999\n"),
            "key 'steps' = '99999999999'" + where +
                "an integer between -2147483648 and 2147483647");
  EXPECT_EQ(LoadError("learning_rate: fast\n"),
            "key 'learning_rate' = 'fast'" + where + "a finite number");
  EXPECT_EQ(LoadError("learning_rate: .inf\n"),
            "key 'learning_rate' = '.inf'" + where + "a finite number");
  EXPECT_EQ(LoadError("deterministic: yes\n"),
            "key 'deterministic' = 'yes'" + where + "true or false");
  EXPECT_EQ(LoadError("", {"steps=ten"}),
            "key 'steps' = 'ten' in the command line: expected an integer");
  EXPECT_EQ(LoadError("", {"learning_rate=inf"}),
            "key 'learning_rate' = 'inf' in the command line: expected a "
            "finite number");
}

TEST_F(ConfigTest, NonScalarValue) {
  EXPECT_EQ(LoadError("steps: [1, 2]\n"),
            "key 'steps' in " + dir_.path() +
                "/run.yml: expected a single value, not a list");
  EXPECT_EQ(LoadError("steps:\n  a: 1\n"),
            "key 'steps' in " + dir_.path() +
                "/run.yml: expected a single value, not a mapping");
}

TEST_F(ConfigTest, DuplicateYamlKey) {
  EXPECT_EQ(LoadError("steps: 1\nsteps: 2\n"),
            "key 'steps' appears twice in " + dir_.path() + "/run.yml");
}

TEST_F(ConfigTest, TopLevelMustBeAMapping) {
  EXPECT_EQ(LoadError("- steps\n"),
            "config file '" + dir_.path() +
                "/run.yml' must be a YAML mapping of key: value lines");
}

TEST_F(ConfigTest, MalformedOverride) {
  EXPECT_EQ(LoadError("", {"steps"}),
            "override 'steps' in the command line is not of the form "
            "key=value");
  EXPECT_EQ(LoadError("", {"=3"}),
            "override '=3' in the command line is not of the form key=value");
}

TEST_F(ConfigTest, MissingFile) {
  std::string path = dir_.path() + "/missing.yml";
  Result<TrainConfig> config = LoadTrainConfig(path, {});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(config.status().message(), "cannot read config file '" + path +
                                           "': No such file or directory");
}

TEST_F(ConfigTest, DirectoryIsNotAConfigFile) {
  Result<TrainConfig> config = LoadTrainConfig(dir_.path(), {});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            "cannot read config file '" + dir_.path() + "': it is a directory");
}

TEST_F(ConfigTest, YamlSyntaxErrorNamesLineAndColumn) {
  EXPECT_EQ(LoadError("steps: 10\nrun_name: [a, b\n"),
            "YAML syntax error in " + dir_.path() +
                "/run.yml at line 3, column 1: end of sequence flow not "
                "found");
}

TEST_F(ConfigTest, ShippedBaseYamlEqualsDefaults) {
  Result<TrainConfig> config = LoadTrainConfig(ShippedBaseYaml(), {});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(*config, TrainConfig());
}

TEST_F(ConfigTest, ShippedBaseYamlListsEveryKeyInTableOrder) {
  YAML::Node root = YAML::LoadFile(ShippedBaseYaml());
  std::vector<std::string> keys;
  for (const auto& entry : root) keys.push_back(entry.first.Scalar());
  EXPECT_EQ(keys, TrainConfigKeys());
}

TEST_F(ConfigTest, ToJsonHasEveryKey) {
  nlohmann::json json = ToJson(TrainConfig());
  std::set<std::string> json_keys;
  for (const auto& [key, value] : json.items()) json_keys.insert(key);
  std::vector<std::string> keys = TrainConfigKeys();
  EXPECT_EQ(json_keys, std::set<std::string>(keys.begin(), keys.end()));
  EXPECT_EQ(json["steps"], 200);
  EXPECT_EQ(json["dtype"], "bfloat16");
  EXPECT_EQ(json["async_checkpointing"], true);
  EXPECT_DOUBLE_EQ(json["adam_eps"].get<double>(), 1e-8);
}

// Writes every JSON value back as a key=value override.
std::vector<std::string> AsOverrides(const nlohmann::json& json) {
  std::vector<std::string> overrides;
  for (const auto& [key, value] : json.items()) {
    overrides.push_back(
        key + "=" +
        (value.is_string() ? value.get<std::string>() : value.dump()));
  }
  return overrides;
}

TEST_F(ConfigTest, ToJsonRoundTripsThroughOverrides) {
  TrainConfig original;
  original.run_name = "round trip";
  original.dataset_path = "/data/fortunes";
  original.steps = 7;
  original.ici_tensor_parallelism = -1;
  original.learning_rate = 0.1 + 0.2;  // not exactly representable in short
  original.adam_eps = 3.3e-9;
  original.async_checkpointing = false;
  original.deterministic = true;
  original.dtype = "float32";
  original.mlp_activations = {"silu", "linear"};
  original.decoder_block = "llama2";
  original.num_kv_heads = 2;
  original.logits_via_embedding = false;
  original.normalization_layer_epsilon = 1e-6;

  // Start from a file that differs everywhere it can, so that every key must
  // come from the overrides.
  Result<TrainConfig> config = LoadTrainConfig(
      WriteYaml("steps: 1\nlearning_rate: 5\ndtype: bf16\nrun_name: x\n"),
      AsOverrides(ToJson(original)));
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(*config, original);

  Result<TrainConfig> defaults =
      LoadTrainConfig(WriteYaml(""), AsOverrides(ToJson(TrainConfig())));
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(*defaults, TrainConfig());
}

// Every spelling of a dtype loads, and is kept as MaxText's.
TEST_F(ConfigTest, DtypeTakesEverySpellingAndKeepsOne) {
  for (const auto& [given, kept] :
       std::vector<std::pair<std::string, std::string>>{
           {"bf16", "bfloat16"},
           {"bfloat16", "bfloat16"},
           {"f32", "float32"},
           {"float32", "float32"},
           {"Float32", "float32"}}) {
    Result<TrainConfig> config =
        LoadTrainConfig(WriteYaml(""), {"dtype=" + given});
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(config->dtype, kept) << given;
    EXPECT_TRUE(ValidateTrainConfig(*config).ok());
    EXPECT_EQ(MatmulDType(*config),
              kept == "float32" ? DType::kF32 : DType::kBF16);
  }
}

TEST_F(ConfigTest, RunDirectory) {
  TrainConfig config;
  config.run_name = "smoke";
  EXPECT_EQ(RunDirectory(config), "runs/smoke");
  config.base_output_directory = "/tmp/out";
  EXPECT_EQ(RunDirectory(config), "/tmp/out/smoke");
}

TEST_F(ConfigTest, ValidationErrors) {
  auto with = [](auto edit) {
    TrainConfig config;
    edit(config);
    return config;
  };
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) { c.steps = 0; })),
            "key 'steps' = 0: expected an integer >= 1");
  EXPECT_EQ(
      ValidateError(with([](TrainConfig& c) { c.per_device_batch_size = -2; })),
      "key 'per_device_batch_size' = -2: expected an integer >= 1");
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) { c.emb_dim = 250; })),
            "key 'emb_dim' = 250: expected a multiple of num_heads (4)");
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) { c.learning_rate = 0; })),
            "key 'learning_rate' = 0: expected a number > 0");
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) { c.adam_b1 = 1; })),
            "key 'adam_b1' = 1: expected a number >= 0 and < 1");
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) {
              c.cosine_learning_rate_final_fraction = 1.5;
            })),
            "key 'cosine_learning_rate_final_fraction' = 1.5: expected a "
            "number >= 0 and <= 1");
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) { c.dtype = "f16"; })),
            "key 'dtype' = 'f16': expected bfloat16 (bf16) or float32 (f32)");
  EXPECT_EQ(
      ValidateError(with([](TrainConfig& c) { c.checkpoint_period = 0; })),
      "key 'checkpoint_period' = 0: expected an integer >= 1");
  EXPECT_EQ(ValidateError(with(
                [](TrainConfig& c) { c.max_num_checkpoints_to_keep = 0; })),
            "key 'max_num_checkpoints_to_keep' = 0: expected an integer >= 1");
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) { c.warmup_steps = -1; })),
            "key 'warmup_steps' = -1: expected an integer >= 0");
  EXPECT_EQ(ValidateError(with([](TrainConfig& c) { c.run_name = "a/b"; })),
            "key 'run_name' = 'a/b': expected a single directory name "
            "without '/'");
  EXPECT_EQ(
      ValidateError(with([](TrainConfig& c) { c.base_output_directory = ""; })),
      "key 'base_output_directory' = '': expected a directory path");
}

TEST_F(ConfigTest, ValidationOfParallelism) {
  TrainConfig config;
  config.ici_tensor_parallelism = 0;
  EXPECT_EQ(ValidateError(config),
            "key 'ici_tensor_parallelism' = 0: expected -1 (use the remaining "
            "devices) or an integer >= 1");
  config = TrainConfig();
  config.dcn_fsdp_parallelism = -1;
  EXPECT_EQ(ValidateError(config),
            "keys 'dcn_data_parallelism' and 'dcn_fsdp_parallelism' are both "
            "-1: expected at most one dcn_* axis to be -1");
  config = TrainConfig();
  config.ici_fsdp_parallelism = 2;
  config.ici_tensor_parallelism = 4;
  EXPECT_TRUE(ValidateTrainConfig(config).ok());  // 4 heads, mlp_dim 1024
  config.ici_tensor_parallelism = 3;
  EXPECT_EQ(ValidateError(config),
            "keys ici_tensor_parallelism (3) x dcn_tensor_parallelism (1) = "
            "3: expected a divisor of num_heads (4) and of mlp_dim (1024): "
            "each tensor rank holds whole heads and an equal part of the MLP");
  config.ici_tensor_parallelism = 2;
  config.dcn_tensor_parallelism = 4;
  EXPECT_EQ(ValidateError(config),
            "keys ici_tensor_parallelism (2) x dcn_tensor_parallelism (4) = "
            "8: expected a divisor of num_heads (4) and of mlp_dim (1024): "
            "each tensor rank holds whole heads and an equal part of the MLP");
}

TEST_F(ConfigTest, DescribeListsEveryKeyWithItsDefault) {
  std::string text = DescribeTrainConfigKeys();
  for (const std::string& key : TrainConfigKeys()) {
    EXPECT_NE(text.find("  " + key + " ("), std::string::npos) << key;
  }
  EXPECT_NE(text.find("  steps (int, default 200): "), std::string::npos);
  EXPECT_NE(text.find("  dtype (string, default \"bfloat16\"): "),
            std::string::npos);
  EXPECT_NE(text.find("  adam_eps (float, default 1e-08): "),
            std::string::npos);
  EXPECT_NE(text.find("  mlp_activations (list, default []): "),
            std::string::npos);
}

// Issue 28: the model keys MaxText's model files set, with MaxText's names
// and meanings; each bad value one sentence.
TEST_F(ConfigTest, ModelKeysDefaultsAndMaxTextSpellings) {
  TrainConfig c;
  EXPECT_EQ(c.model_name, "default");
  EXPECT_EQ(c.decoder_block, "gpt3");
  EXPECT_EQ(c.num_kv_heads, -1);
  EXPECT_EQ(c.head_dim, -1);
  EXPECT_TRUE(c.mlp_activations.empty());
  EXPECT_TRUE(c.logits_via_embedding);
  EXPECT_EQ(c.rope_max_timescale, 10000);
  EXPECT_EQ(c.normalization_layer_epsilon, 1e-5);
  EXPECT_EQ(c.tokenizer_path, "");
  EXPECT_EQ(c.tokenizer_type, "sentencepiece");
  EXPECT_TRUE(c.add_bos);
  EXPECT_TRUE(c.add_eos);
  EXPECT_EQ(c.weight_dtype, "float32");

  Result<TrainConfig> config =
      LoadTrainConfig(WriteYaml("decoder_block: Llama2\n"
                                "base_num_kv_heads: 2\n"
                                "head_dim: 16\n"
                                "mlp_activations: [\"silu\", \"linear\"]\n"
                                "logits_via_embedding: false\n"
                                "normalization_layer_epsilon: 1.e-06\n"
                                "rope_max_timescale: 500000\n"
                                "tokenizer_path: /tokenizers/llama2.model\n"
                                "add_bos: false\n"),
                      {"add_eos=false"});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->decoder_block, "llama2");  // MaxText lower-cases it
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->mlp_activations,
            (std::vector<std::string>{"silu", "linear"}));
  EXPECT_FALSE(config->logits_via_embedding);
  EXPECT_EQ(config->normalization_layer_epsilon, 1e-6);
  EXPECT_EQ(config->rope_max_timescale, 500000);
  EXPECT_EQ(config->tokenizer_path, "/tokenizers/llama2.model");
  EXPECT_FALSE(config->add_bos);
  EXPECT_FALSE(config->add_eos);
  EXPECT_TRUE(ValidateTrainConfig(*config).ok());
  EXPECT_EQ(ToJson(*config)["mlp_activations"],
            nlohmann::json::array({"silu", "linear"}));
}

// A list key: a YAML list in a file; on the command line OmegaConf's YAML
// flow list or MaxText's coerced plain string, comma-separated.
TEST_F(ConfigTest, ListKeyTakesEverySpelling) {
  const std::vector<std::string> gated = {"silu", "linear"};
  for (const char* spelling :
       {"[silu,linear]", "[silu, linear]", "['silu', \"linear\"]",
        "silu,linear", " silu , linear "}) {
    Result<TrainConfig> config = LoadTrainConfig(
        WriteYaml(""), {std::string("mlp_activations=") + spelling});
    ASSERT_TRUE(config.ok()) << spelling << ": " << config.status().message();
    EXPECT_EQ(config->mlp_activations, gated) << spelling;
  }
  for (const char* empty : {"", "[]"}) {
    Result<TrainConfig> config =
        LoadTrainConfig(WriteYaml("mlp_activations: [gelu]\n"),
                        {std::string("mlp_activations=") + empty});
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_TRUE(config->mlp_activations.empty()) << empty;
  }
  Result<TrainConfig> one =
      LoadTrainConfig(WriteYaml("mlp_activations:\n  - gelu\n"), {});
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->mlp_activations, std::vector<std::string>{"gelu"});

  EXPECT_EQ(LoadError("", {"mlp_activations=silu,,linear"}),
            "key 'mlp_activations' = 'silu,,linear' in the command line: "
            "expected a list such as [a,b] or a,b");
  EXPECT_EQ(LoadError("", {"mlp_activations=[silu,[linear]]"}),
            "key 'mlp_activations' = '[silu,[linear]]' in the command line: "
            "expected a list of plain values such as [a,b] or a,b");
  EXPECT_EQ(LoadError("", {"mlp_activations=[silu"}),
            "key 'mlp_activations' = '[silu' in the command line: expected a "
            "list such as [a,b] or a,b");
  EXPECT_EQ(LoadError("mlp_activations: [[silu]]\n"),
            "key 'mlp_activations' in " + dir_.path() +
                "/run.yml: expected a list of plain values such as [a, b]");
  EXPECT_EQ(LoadError("mlp_activations: {a: 1}\n"),
            "key 'mlp_activations' in " + dir_.path() +
                "/run.yml: expected a single value, not a mapping");
}

TEST_F(ConfigTest, ModelKeysBadValuesAreOneSentence) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"decoder_block=deepseek",
       "key 'decoder_block' = 'deepseek': expected gpt3, llama2, mistral or "
       "gemma (the decoder blocks this trainer implements)"},
      {"decoder_block=qwen3",
       "key 'decoder_block' = 'qwen3': expected gpt3, llama2, mistral or "
       "gemma (the decoder blocks this trainer implements)"},
      {"num_kv_heads=0",
       "key 'num_kv_heads' = 0: expected -1 (as many as num_heads) or an "
       "integer >= 1"},
      {"head_dim=-2",
       "key 'head_dim' = -2: expected -1 (emb_dim / num_heads) or an integer "
       ">= 1"},
      {"mlp_activations=silu,linear,gelu",
       "key 'mlp_activations' = [\"silu\",\"linear\",\"gelu\"]: expected 1 "
       "or 2 activations (2 make a gated MLP), or [] for the decoder block's "
       "own"},
      {"mlp_activations=[swish]",
       "key 'mlp_activations' has 'swish': expected each of gelu, silu, relu "
       "or linear"},
      {"normalization_layer_epsilon=0",
       "key 'normalization_layer_epsilon' = 0: expected a number > 0"},
      {"rope_max_timescale=-1",
       "key 'rope_max_timescale' = -1: expected a number > 0"},
      {"weight_dtype=bfloat16",
       "key 'weight_dtype' = 'bfloat16': expected float32 (the master "
       "weights are f32; dtype sets the matmuls' type)"},
      {"tokenizer_type=tiktoken",
       "key 'tokenizer_type' = 'tiktoken': expected sentencepiece (the only "
       "tokenizer type here; tiktoken tokenizers are not implemented)"},
      {"tokenizer_type=huggingface",
       "key 'tokenizer_type' = 'huggingface': expected sentencepiece (the "
       "only tokenizer type here; huggingface tokenizers are not "
       "implemented)"},
      {"tokenizer_type=bpe",
       "key 'tokenizer_type' = 'bpe': expected sentencepiece (the only "
       "tokenizer type here)"},
      {"model_name=",
       "key 'model_name' = '': expected default (no model file) or the name "
       "of a model file"},
  };
  for (const auto& [override_text, expected] : refused) {
    Result<TrainConfig> config =
        LoadTrainConfig(WriteYaml(""), {override_text});
    ASSERT_TRUE(config.ok()) << override_text;
    EXPECT_EQ(ValidateError(*config), expected) << override_text;
  }
  for (const char* block : {"gpt3", "llama2", "mistral", "gemma"}) {
    TrainConfig config;
    config.decoder_block = block;
    EXPECT_TRUE(ValidateTrainConfig(config).ok()) << block;
  }
}

}  // namespace
}  // namespace multislice

namespace multislice {
namespace {

// Issue 13 (first-hour trap): `multislice plan` recommends
// "dcn_data_parallelism=2 dcn_fsdp_parallelism=1 dcn_pipeline_parallelism=1
// dcn_tensor_parallelism=1", which train must take as it is. Issue 16: the
// pipeline keys, and one sentence for each bad pipeline configuration.
TEST(PipelineKeysTest, PlanLinePastesInAndBadPipelinesAreOneSentence) {
  TempDir dir;
  const std::string yaml = dir.path() + "/empty.yml";
  std::ofstream(yaml) << "";
  Result<TrainConfig> pasted = LoadTrainConfig(
      yaml, {"dcn_data_parallelism=2", "dcn_fsdp_parallelism=1",
             "dcn_pipeline_parallelism=1", "dcn_tensor_parallelism=1",
             "ici_pipeline_parallelism=1", "ici_tensor_parallelism=1"});
  ASSERT_TRUE(pasted.ok()) << pasted.status().message();
  EXPECT_TRUE(ValidateTrainConfig(*pasted).ok());
  Result<TrainConfig> pipeline = LoadTrainConfig(
      yaml,
      {"dcn_data_parallelism=1", "dcn_pipeline_parallelism=2",
       "num_pipeline_microbatches=4", "pipeline_parallel_schedule=gpipe"});
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().message();
  EXPECT_TRUE(ValidateTrainConfig(*pipeline).ok());
  EXPECT_EQ(pipeline->dcn_pipeline_parallelism, 2);
  EXPECT_EQ(pipeline->num_pipeline_microbatches, 4);
  EXPECT_EQ(PipelineMicrobatches(*pasted, 4), 4);  // -1: one per stage
  // A -1 stage axis beside stages on the other level is checked once the
  // mesh resolves it (it may resolve to 1).
  Result<TrainConfig> filled = LoadTrainConfig(
      yaml, {"ici_pipeline_parallelism=-1", "ici_fsdp_parallelism=1",
             "dcn_pipeline_parallelism=2", "dcn_data_parallelism=1"});
  ASSERT_TRUE(filled.ok()) << filled.status().message();
  EXPECT_TRUE(ValidateTrainConfig(*filled).ok());

  const std::vector<std::pair<std::vector<std::string>, std::string>> refused =
      {
          {{"ici_pipeline_parallelism=3", "ici_fsdp_parallelism=1"},
           "keys ici_pipeline_parallelism (3) x dcn_pipeline_parallelism (1) "
           "= 3 stages: expected a divisor of num_decoder_layers (4): each "
           "stage holds an equal number of whole layers"},
          {{"ici_pipeline_parallelism=2", "ici_fsdp_parallelism=1",
            "num_pipeline_microbatches=3"},
           "key 'num_pipeline_microbatches' = 3: expected a divisor of the 16 "
           "rows each pipeline trains on per step (per_device_batch_size 8 x "
           "tensor 1 x stages 2)"},
          {{"num_pipeline_microbatches=0"},
           "key 'num_pipeline_microbatches' = 0: expected -1 (one per stage) "
           "or an integer >= 1"},
          {{"ici_pipeline_parallelism=2", "dcn_pipeline_parallelism=2",
            "ici_fsdp_parallelism=1", "dcn_data_parallelism=1"},
           "keys ici_pipeline_parallelism (2) x dcn_pipeline_parallelism "
           "(2): expected at most one of them above 1: a pipeline's stages "
           "run either inside a slice or across slices"},
          {{"pipeline_parallel_schedule=interleaved"},
           "key 'pipeline_parallel_schedule' = 'interleaved': expected GPipe "
           "or 1F1B"},
      };
  for (const auto& [overrides, expected] : refused) {
    Result<TrainConfig> config = LoadTrainConfig(yaml, overrides);
    ASSERT_TRUE(config.ok()) << overrides[0];
    Status status = ValidateTrainConfig(*config);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << overrides[0];
    EXPECT_EQ(status.message(), expected);
  }
}

// The DiLoCo keys: MaxText's names and defaults, torchft's rules for the
// streaming ones, each violation one sentence naming the key and value.
TEST(DilocoKeysTest, DefaultsAndBadValuesAreOneSentence) {
  TempDir dir;
  const std::string yaml = dir.path() + "/empty.yml";
  std::ofstream(yaml) << "";
  Result<TrainConfig> defaults = LoadTrainConfig(yaml, {});
  ASSERT_TRUE(defaults.ok());
  EXPECT_FALSE(defaults->enable_diloco);
  EXPECT_EQ(defaults->diloco_sync_period, 36);
  EXPECT_EQ(defaults->diloco_outer_lr, 0.3);
  EXPECT_EQ(defaults->diloco_outer_momentum, 0.9);
  EXPECT_EQ(defaults->ici_diloco_parallelism, 1);
  EXPECT_EQ(defaults->dcn_diloco_parallelism, 1);
  Result<TrainConfig> streaming = LoadTrainConfig(
      yaml, {"enable_diloco=true", "dcn_diloco_parallelism=2",
             "dcn_data_parallelism=1", "enable_streaming_diloco=true",
             "diloco_sync_period=8", "num_diloco_fragments=2",
             "num_communication_overlapping_steps=3",
             "communication_overlapping_alpha=0.5", "diloco_wire_dtype=int8",
             "dcn_gradient_wire_dtype=bfloat16"});
  ASSERT_TRUE(streaming.ok()) << streaming.status().message();
  EXPECT_TRUE(ValidateTrainConfig(*streaming).ok())
      << ValidateTrainConfig(*streaming).message();
  // A -1 diloco axis is checked once the mesh resolves it.
  Result<TrainConfig> filled = LoadTrainConfig(
      yaml, {"dcn_diloco_parallelism=-1", "dcn_data_parallelism=1"});
  ASSERT_TRUE(filled.ok());
  EXPECT_TRUE(ValidateTrainConfig(*filled).ok());
  EXPECT_EQ(CheckDilocoReplicas(*filled, 1, 2).message(),
            "keys ici_diloco_parallelism (1) x dcn_diloco_parallelism (2) = 2 "
            "replicas: expected enable_diloco=true (the diloco axis holds "
            "DiLoCo's replicas; use the data axes for data parallelism)");
  EXPECT_TRUE(CheckDilocoReplicas(*filled, 1, 1).ok());
  // Losing a slice without stopping needs one replica per slice.
  Result<TrainConfig> losable = LoadTrainConfig(
      yaml, {"enable_diloco=true", "diloco_continue_on_failure=true"});
  ASSERT_TRUE(losable.ok());
  EXPECT_FALSE(defaults->diloco_continue_on_failure);
  EXPECT_EQ(defaults->diloco_max_slice_restarts, 3);
  EXPECT_TRUE(CheckLosableSlices(*losable, 1, 3, 3).ok());
  EXPECT_TRUE(CheckLosableSlices(*defaults, 2, 1, 1).ok());
  EXPECT_EQ(CheckLosableSlices(*losable, 2, 1, 1).message(),
            "key 'diloco_continue_on_failure' = true with "
            "ici_diloco_parallelism 2 and dcn_diloco_parallelism 1 over 1 "
            "slices: expected one DiLoCo replica per slice (ici 1, dcn the "
            "number of slices, at least 2), so that a lost slice takes "
            "exactly one replica with it");
  EXPECT_FALSE(CheckLosableSlices(*losable, 1, 2, 4).ok());

  const std::vector<std::string> on = {"enable_diloco=true"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), on.begin(), on.end());
    return extra;
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused =
      {
          {{"dcn_diloco_parallelism=2", "dcn_data_parallelism=1"},
           "keys ici_diloco_parallelism (1) x dcn_diloco_parallelism (2) = 2 "
           "replicas: expected enable_diloco=true (the diloco axis holds "
           "DiLoCo's replicas; use the data axes for data parallelism)"},
          {{"ici_diloco_parallelism=0"},
           "key 'ici_diloco_parallelism' = 0: expected -1 (use the remaining "
           "devices) or an integer >= 1"},
          {{"enable_streaming_diloco=true"},
           "key 'enable_streaming_diloco' = true: expected enable_diloco=true "
           "too (Streaming DiLoCo is DiLoCo that syncs fragments in turn)"},
          {with({"diloco_sync_period=0"}),
           "key 'diloco_sync_period' = 0: expected an integer >= 1"},
          {with({"diloco_outer_lr=0"}),
           "key 'diloco_outer_lr' = 0: expected a number > 0"},
          {with({"diloco_outer_momentum=1"}),
           "key 'diloco_outer_momentum' = 1: expected a number >= 0 and < 1"},
          {with({"num_diloco_fragments=2"}),
           "keys num_diloco_fragments (2) and "
           "num_communication_overlapping_steps (0): expected "
           "enable_streaming_diloco=true for fragments or overlap"},
          {with({"enable_streaming_diloco=true", "num_diloco_fragments=5"}),
           "key 'num_diloco_fragments' = 5: expected at most "
           "num_decoder_layers (4): each fragment holds whole layers"},
          {with({"enable_streaming_diloco=true", "diloco_sync_period=10",
                 "num_diloco_fragments=4"}),
           "key 'num_diloco_fragments' = 4: expected a divisor of "
           "diloco_sync_period (10): the fragments sync in turn, one every "
           "period / fragments steps"},
          {with({"enable_streaming_diloco=true", "diloco_sync_period=8",
                 "num_diloco_fragments=2",
                 "num_communication_overlapping_steps=4"}),
           "key 'num_communication_overlapping_steps' = 4: expected fewer "
           "than diloco_sync_period / num_diloco_fragments (4) steps: a "
           "fragment's sync must land before the next starts"},
          {with({"enable_streaming_diloco=true",
                 "communication_overlapping_alpha=1.5"}),
           "key 'communication_overlapping_alpha' = 1.5: expected a number "
           ">= 0 and <= 1"},
          {{"diloco_wire_dtype=fp8"},
           "key 'diloco_wire_dtype': 'fp8' is not a wire type; expected f32, "
           "bf16 or int8"},
          {{"dcn_gradient_wire_dtype=int4"},
           "key 'dcn_gradient_wire_dtype': 'int4' is not a wire type; "
           "expected f32, bf16 or int8"},
          {{"diloco_max_slice_restarts=-1"},
           "key 'diloco_max_slice_restarts' = -1: expected an integer >= 0"},
          {{"diloco_continue_on_failure=true"},
           "key 'diloco_continue_on_failure' = true: expected "
           "enable_diloco=true too (only DiLoCo's replicas can go on without "
           "a lost slice)"},
          {{"hang_timeout_seconds=-1"},
           "key 'hang_timeout_seconds' = -1: expected a number >= 0"},
          {{"straggler_report_interval=-5"},
           "key 'straggler_report_interval' = -5: expected an integer >= 0"},
          {{"straggler_relative_threshold=0"},
           "key 'straggler_relative_threshold' = 0: expected a number > 0 "
           "and <= 1"},
          {{"straggler_individual_threshold=1.5"},
           "key 'straggler_individual_threshold' = 1.5: expected a number > 0 "
           "and <= 1"},
          {{"profiler=nsys"},
           "key 'profiler' = 'nsys': expected \"\" or xplane (nsys profiles "
           "NVIDIA GPUs, not these CPU devices)"},
          {{"profiler=perfetto"},
           "key 'profiler' = 'perfetto': expected \"\" or xplane"},
          {{"profiler_steps=0"},
           "key 'profiler_steps' = 0: expected an integer >= 1"},
          {{"skip_first_n_steps_for_profiler=-1"},
           "key 'skip_first_n_steps_for_profiler' = -1: expected an integer "
           ">= 0"},
      };
  for (const auto& [overrides, expected] : refused) {
    Result<TrainConfig> config = LoadTrainConfig(yaml, overrides);
    ASSERT_TRUE(config.ok()) << overrides.back();
    Status status = ValidateTrainConfig(*config);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << overrides.back();
    EXPECT_EQ(status.message(), expected);
  }
}

}  // namespace
}  // namespace multislice

namespace multislice {
namespace {

// Issue 28: MaxText's configs load. The shipped configs/maxtext/base.yml.
std::string MaxTextBaseYaml() {
  return std::string(MULTISLICE_SOURCE_DIR) + "/configs/maxtext/base.yml";
}

class MaxTextConfigTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = dir_.path() + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }
  std::string Empty() { return Write("empty.yml", ""); }
  std::string Error(const std::string& yaml,
                    const std::vector<std::string>& overrides) {
    Result<TrainConfig> config = LoadTrainConfig(yaml, overrides);
    EXPECT_FALSE(config.ok()) << (overrides.empty() ? "" : overrides.back());
    if (config.ok()) return "";
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    return config.status().message();
  }
  TempDir dir_;
};

// The file loads as it is, and each honoured key has the file's value in
// the config (the file read here with yaml-cpp on its own), converted
// where MaxText's meaning is spelled differently here.
TEST_F(MaxTextConfigTest, BaseYmlLoadsVerbatimAndHonouredKeysTakeItsValues) {
  Result<TrainConfig> config = LoadTrainConfig(MaxTextBaseYaml(), {});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_TRUE(ValidateTrainConfig(*config).ok())
      << ValidateTrainConfig(*config).message();
  const nlohmann::json json = ToJson(*config);
  const YAML::Node root = YAML::LoadFile(MaxTextBaseYaml());
  int honoured = 0;
  for (const auto& entry : root) {
    const std::string key = entry.first.Scalar();
    const MaxTextKey* maxtext = FindMaxTextKey(key);
    ASSERT_NE(maxtext, nullptr) << key;
    if (maxtext->status != MaxTextKeyStatus::kHonoured) continue;
    ++honoured;
    const nlohmann::json file_value = MaxTextValue(entry.second);
    const std::string ours = maxtext->ours;
    if (key == "max_num_checkpoints_to_keep") {
      ASSERT_TRUE(file_value.is_null());
      EXPECT_EQ(json[ours], 2147483647);  // None: keep every checkpoint
    } else if (key == "num_diloco_fragments") {
      ASSERT_TRUE(file_value.is_null());
      EXPECT_EQ(json[ours], 1);
    } else if (key == "warmup_steps_fraction") {
      EXPECT_EQ(json["warmup_steps"],
                static_cast<int>(MaxTextValue(root["steps"]).get<double>() *
                                 file_value.get<double>()))
          << "int(steps x fraction)";
    } else if (key == "learning_rate_schedule_steps" || key == "eval_steps") {
      EXPECT_EQ(file_value, -1) << key;  // -1: steps, and eval_batches stays
      EXPECT_EQ(json["eval_batches"], TrainConfig().eval_batches);
    } else if (key == "base_output_directory") {
      EXPECT_EQ(file_value, "");
      EXPECT_EQ(json[ours], "maxtext_output");  // MaxText's default
    } else if (key == "override_model_config") {
      EXPECT_EQ(file_value, false);  // read by the loader, not stored
    } else {
      EXPECT_TRUE(SameMaxTextValue(json[ours], file_value))
          << key << " -> " << ours << ": " << json[ours] << " vs "
          << file_value;
    }
  }
  EXPECT_EQ(honoured, 66);
  EXPECT_EQ(config->steps, 150001);              // 150_001
  EXPECT_EQ(config->per_device_batch_size, 12);  // 12.0
  EXPECT_EQ(config->eval_interval, -1);          // no evaluation
  EXPECT_EQ(config->decoder_block, "llama2");
}

// Each of the file's keys, given on the command line with the file's
// value, is known (it may be refused for its value on our defaults, never
// as unknown).
TEST_F(MaxTextConfigTest, EveryKeyOfTheFileIsKnown) {
  const YAML::Node root = YAML::LoadFile(MaxTextBaseYaml());
  const std::string empty = Empty();
  size_t keys = 0;
  for (const auto& entry : root) {
    ++keys;
    const std::string key = entry.first.Scalar();
    const std::string value =
        entry.second.IsScalar() ? entry.second.Scalar() : "[]";
    Result<TrainConfig> config = LoadTrainConfig(empty, {key + "=" + value});
    if (!config.ok()) {
      EXPECT_FALSE(config.status().message().starts_with("unknown key"))
          << config.status().message();
    }
  }
  EXPECT_EQ(keys, 696u);
  EXPECT_EQ(Error(empty, {"warmup_step_fraction=0.1"}),
            "unknown key 'warmup_step_fraction' in the command line; did you "
            "mean 'warmup_steps_fraction'?");
}

TEST_F(MaxTextConfigTest, DefaultOnlyKeysOfEachTypeRefuseOtherValues) {
  const std::string empty = Empty();
  const std::string sentence =
      "' in the command line: this trainer does not implement it, so only "
      "MaxText's default ";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"quantization=int8",
       "key 'quantization' = 'int8" + sentence +
           "\"\" is accepted (the matmuls run in dtype, unquantized and "
           "dense)"},
      {"quantization=",  // OmegaConf: null, not the empty string
       "key 'quantization' = '" + sentence +
           "\"\" is accepted (the matmuls run in dtype, unquantized and "
           "dense)"},
      {"enable_wandb=true",
       "key 'enable_wandb' = 'true" + sentence +
           "False is accepted (metrics go to metrics.jsonl in the run "
           "directory)"},
      {"num_experts=8",
       "key 'num_experts' = '8" + sentence +
           "1 is accepted (the MLPs are dense, no mixture of experts)"},
      {"dropout_rate=0.1", "key 'dropout_rate' = '0.1" + sentence +
                               "0.0 is accepted (there is no dropout)"},
      {"weight_sparsity_n=2",
       "key 'weight_sparsity_n' = '2" + sentence +
           "null is accepted (the matmuls run in dtype, unquantized and "
           "dense)"},
      {"trainable_parameters_mask=['.*norm']",
       "key 'trainable_parameters_mask' = '['.*norm']" + sentence +
           "[] is accepted (every parameter is trained)"},
      {"dataset_type=hf",
       "key 'dataset_type' = 'hf" + sentence +
           "tfds is accepted (prepare the data with multislice data prepare "
           "and give its directory as dataset_path)"},
      {"lr_schedule_type=wsd",
       "key 'lr_schedule_type' = 'wsd" + sentence +
           "\"cosine\" is accepted (the schedule is linear warmup, then "
           "cosine decay)"},
  };
  for (const auto& [override_text, expected] : refused) {
    EXPECT_EQ(Error(empty, {override_text}), expected);
  }
  // The defaults given explicitly, in other spellings of the same value.
  Result<TrainConfig> defaults = LoadTrainConfig(
      empty, {"quantization=\"\"", "enable_wandb=false", "num_experts=1.0",
              "dropout_rate=0", "weight_sparsity_n=None",
              "weight_sparsity_m=null", "trainable_parameters_mask=[]",
              "dataset_type=tfds", "lr_schedule_type='cosine'",
              "mrope_section=[24, 20, 20.0]", "checkpoint_conversion_fn=NONE"});
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(*defaults, TrainConfig());
  // In a file too, lists and nested lists included.
  EXPECT_EQ(
      Error(Write("lists.yml", "compress_ratios: [0, 4]\n"), {}),
      "key 'compress_ratios' = '[0,4]' in " + dir_.path() +
          "/lists.yml: this trainer does not implement it, so only MaxText's "
          "default [] is accepted (attention is plain multi-head (or "
          "grouped-query))");
  // Ignored keys take any value.
  Result<TrainConfig> ignored = LoadTrainConfig(
      Write("ignored.yml",
            "hardware: gpu\nremat_policy: minimal\nscan_layers: false\n"
            "logical_axis_rules: [['norm', 'fsdp']]\nprompt: hello\n"),
      {"attention=flash", "sa_block_q=1024"});
  ASSERT_TRUE(ignored.ok()) << ignored.status().message();
  EXPECT_EQ(*ignored, TrainConfig());
}

TEST_F(MaxTextConfigTest, ModelFileOverridesTheBaseAndTheCommandLineMayNot) {
  const std::string base =
      Write("configs/x/base.yml", "base_emb_dim: 32\nsteps: 7\nmlp_dim: 64\n");
  const std::string model = Write("configs/models/m.yml",
                                  "base_emb_dim: 64\nbase_num_query_heads: 2\n"
                                  "mlp_activations: [gelu]\n");
  Result<TrainConfig> config = LoadTrainConfig(base, {"model_name=m"});
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->emb_dim, 64);  // the model file over the base
  EXPECT_EQ(config->num_heads, 2);
  EXPECT_EQ(config->steps, 7);  // the base where the model is silent
  EXPECT_EQ(config->mlp_dim, 64);
  EXPECT_EQ(config->mlp_activations, std::vector<std::string>{"gelu"});
  EXPECT_EQ(config->model_name, "m");

  const std::string refusal =
      "' in the command line overrides the model file " + model +
      " (base_emb_dim: 64): set override_model_config=true to change a "
      "model's key, as in MaxText";
  EXPECT_EQ(Error(base, {"model_name=m", "base_emb_dim=128"}),
            "key 'base_emb_dim' = '128" + refusal);
  EXPECT_EQ(Error(base, {"model_name=m", "emb_dim=128"}),  // an alias
            "key 'emb_dim' = '128" + refusal);
  // The same value again is no override; keys the model does not set are
  // free; override_model_config lets the command line win.
  for (const std::vector<std::string>& overrides :
       std::vector<std::vector<std::string>>{
           {"model_name=m", "base_emb_dim=64", "steps=9",
            "mlp_activations=gelu"},
           {"model_name=m", "override_model_config=true", "emb_dim=128",
            "steps=9"},
           {"base_emb_dim=128", "model_name=m-Instruct",
            "override_model_config=True", "steps=9"}}) {
    Result<TrainConfig> loaded = LoadTrainConfig(base, overrides);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    EXPECT_EQ(loaded->steps, 9);
    EXPECT_EQ(loaded->num_heads, 2);
  }
  EXPECT_EQ(LoadTrainConfig(base, {"model_name=m", "override_model_config=true",
                                   "emb_dim=128"})
                ->emb_dim,
            128);
  // model_name and override_model_config from the config file.
  const std::string named = Write(
      "configs/x/named.yml", "model_name: m\noverride_model_config: true\n");
  Result<TrainConfig> from_file = LoadTrainConfig(named, {"emb_dim=96"});
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  EXPECT_EQ(from_file->emb_dim, 96);
  EXPECT_EQ(from_file->num_heads, 2);
  // A path as model_name; default is no model file.
  Result<TrainConfig> by_path = LoadTrainConfig(base, {"model_name=" + model});
  ASSERT_TRUE(by_path.ok()) << by_path.status().message();
  EXPECT_EQ(by_path->emb_dim, 64);
  Result<TrainConfig> none = LoadTrainConfig(base, {"model_name=default"});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->emb_dim, 32);
  // A missing model file, and a bad override_model_config.
  EXPECT_EQ(Error(base, {"model_name=nope"}),
            "key 'model_name' = 'nope': there is no model file nope.yml in " +
                dir_.path() + "/configs/x/models, " + dir_.path() +
                "/configs/models, " + dir_.path() + "/configs/x or " +
                (std::filesystem::path(MaxTextBaseYaml()).parent_path() / ".." /
                 "models")
                    .lexically_normal()
                    .string());
  EXPECT_EQ(Error(base, {"model_name=m", "override_model_config=yes"}),
            "key 'override_model_config' = 'yes' in the command line: "
            "expected true or false");
}

// MaxText's base.yml with a shipped model file, as the quickstart runs it.
TEST_F(MaxTextConfigTest, ShippedModelFilesLoadOverTheMaxTextBase) {
  for (const char* name : {"gpt3-tiny", "llama2-tiny", "gemma-tiny",
                           "llama2-7b", "mistral-7b", "gemma-2b"}) {
    Result<TrainConfig> config = LoadTrainConfig(
        MaxTextBaseYaml(), {std::string("model_name=") + name, "steps=5"});
    ASSERT_TRUE(config.ok()) << name << ": " << config.status().message();
    EXPECT_TRUE(ValidateTrainConfig(*config).ok())
        << name << ": " << ValidateTrainConfig(*config).message();
    const YAML::Node model =
        YAML::LoadFile((std::filesystem::path(MaxTextBaseYaml()).parent_path() /
                        ".." / "models" / (std::string(name) + ".yml"))
                           .string());
    EXPECT_EQ(config->decoder_block, model["decoder_block"].as<std::string>());
    EXPECT_EQ(config->emb_dim, model["base_emb_dim"].as<int>()) << name;
    EXPECT_EQ(config->num_kv_heads, model["base_num_kv_heads"].as<int>());
    EXPECT_EQ(config->head_dim, model["head_dim"].as<int>()) << name;
    EXPECT_EQ(config->mlp_activations,
              model["mlp_activations"].as<std::vector<std::string>>());
    EXPECT_EQ(config->logits_via_embedding,
              model["logits_via_embedding"].as<bool>());
  }
}

// MaxText's spellings of values of our keys, and its keys that convert.
TEST_F(MaxTextConfigTest, ConversionsOfMaxTextMeanings) {
  Result<TrainConfig> c = LoadTrainConfig(
      Write("maxtext.yml",
            "steps: 150_001\nper_device_batch_size: 12.0\n"
            "max_num_checkpoints_to_keep: None\nnum_diloco_fragments: null\n"
            "rope_max_timescale: 1_000_000\neval_interval: -1\n"
            "learning_rate: 3.e-5\nbase_output_directory: \"\"\n"),
      {"init_weights_seed=5", "learning_rate_final_fraction=0.2",
       "eval_steps=7", "warmup_steps_fraction=0.2", "steps=50"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->per_device_batch_size, 12);
  EXPECT_EQ(c->max_num_checkpoints_to_keep, 2147483647);
  EXPECT_EQ(c->num_diloco_fragments, 1);
  EXPECT_EQ(c->rope_max_timescale, 1e6);
  EXPECT_EQ(c->eval_interval, -1);
  EXPECT_EQ(c->learning_rate, 3e-5);
  EXPECT_EQ(c->base_output_directory, "maxtext_output");
  EXPECT_EQ(c->seed, 5);
  EXPECT_EQ(c->cosine_learning_rate_final_fraction, 0.2);
  EXPECT_EQ(c->eval_batches, 7);
  EXPECT_EQ(c->steps, 50);
  EXPECT_EQ(c->warmup_steps, 10);  // int(50 x 0.2), after steps=50
  EXPECT_TRUE(ValidateTrainConfig(*c).ok())
      << ValidateTrainConfig(*c).message();

  const std::string empty = Empty();
  // The later of warmup_steps and warmup_steps_fraction wins.
  EXPECT_EQ(LoadTrainConfig(empty, {"steps=50", "warmup_steps_fraction=0.2",
                                    "warmup_steps=3"})
                ->warmup_steps,
            3);
  EXPECT_EQ(LoadTrainConfig(empty, {"steps=50", "warmup_steps=3",
                                    "warmup_steps_fraction=0.1"})
                ->warmup_steps,
            5);
  // steps -1 takes the schedule's length; otherwise the two must agree.
  EXPECT_EQ(
      LoadTrainConfig(empty, {"steps=-1", "learning_rate_schedule_steps=30"})
          ->steps,
      30);
  EXPECT_TRUE(
      LoadTrainConfig(empty, {"steps=30", "learning_rate_schedule_steps=30"})
          .ok());
  EXPECT_EQ(Error(empty, {"steps=50", "learning_rate_schedule_steps=60"}),
            "key 'learning_rate_schedule_steps' = 60 in the command line: "
            "expected -1 or steps (50): the learning rate here warms up and "
            "decays over exactly the training steps");
  EXPECT_EQ(Error(empty, {"per_device_batch_size=0.5"}),
            "key 'per_device_batch_size' = '0.5' in the command line: "
            "expected a whole number of sequences per device (MaxText's "
            "fractional per-device batches are not implemented here)");
  EXPECT_EQ(Error(empty, {"warmup_steps_fraction=1.5"}),
            "key 'warmup_steps_fraction' = '1.5' in the command line: "
            "expected a number >= 0 and <= 1");
  EXPECT_EQ(Error(empty, {"eval_steps=all"}),
            "key 'eval_steps' = 'all' in the command line: expected -1 or an "
            "integer >= 0");
  // Ours is false (GPT-2's tied head), MaxText's base.yml says true.
  EXPECT_FALSE(TrainConfig().normalize_embedding_logits);
  EXPECT_TRUE(
      LoadTrainConfig(MaxTextBaseYaml(), {})->normalize_embedding_logits);
  // Underscores only between digits.
  EXPECT_EQ(Error(empty, {"steps=_5"}),
            "key 'steps' = '_5' in the command line: expected an integer");
}

}  // namespace
}  // namespace multislice
