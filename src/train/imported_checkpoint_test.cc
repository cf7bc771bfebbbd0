// The imported checkpoint against the readers that use it: LoadFullState
// gives the weights back bit for bit with zero moments at step 0, the
// "imported" marker is found (and not in a checkpoint the trainer wrote),
// and the MaxText model file, read by the real config loader on top of
// configs/base.yml, describes the same model for every block.
#include "train/imported_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "model/layout.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/model_config.h"
#include "train/train_state.h"

namespace multislice::train {
namespace {

using model::Activation;
using model::BlockKind;
using model::DecoderConfig;

DecoderConfig Llama() {
  DecoderConfig c = model::GptShape(300, 48, 64, 4, 2, 96);
  c.block = BlockKind::kLlama2;
  c.num_kv_heads = 2;
  c.head_dim = 24;
  c.mlp_activation = Activation::kSilu;
  c.gated_mlp = true;
  c.tied_embedding = false;
  c.norm_epsilon = 1e-6;
  c.rope_max_timescale = 500000;
  return c;
}

TEST(ImportedCheckpointTest, LoadsBackAsStepZeroWithZeroMoments) {
  TempDir dir("multislice-imported-");
  const DecoderConfig c = Llama();
  std::vector<float> params(model::NumParameters(c));
  model::InitParameters(c, 9, params.data());
  params[3] = -0.0f;
  const std::vector<float> original = params;
  ASSERT_TRUE(
      WriteImportedCheckpoint(dir.path() + "/checkpoints", c, params,
                              {"/x/model.safetensors", "LlamaForCausalLM"})
          .ok());
  CheckpointOptions options;
  options.directory = dir.path() + "/checkpoints";
  CheckpointManager manager(options);
  auto state = LoadLatestFullState(manager, nullptr);
  ASSERT_TRUE(state.ok()) << state.status().message();
  EXPECT_EQ(state->step, 0);
  EXPECT_TRUE(state->model == c);
  ASSERT_EQ(state->params.size(), original.size());
  EXPECT_EQ(std::memcmp(state->params.data(), original.data(),
                        original.size() * sizeof(float)),
            0);
  for (float m : state->adam_m) ASSERT_EQ(m, 0.0f);
  for (float v : state->adam_v) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(state->iterator.step, 0);
  auto imported = ImportedMetadata(options.directory, 0);
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  EXPECT_EQ((*imported)["from"], "/x/model.safetensors");
  EXPECT_EQ((*imported)["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(ImportedMetadata(options.directory, 1).status().code(),
            StatusCode::kInvalidArgument);  // no such step
}

TEST(ImportedCheckpointTest, ARunStartsFromItsWeightsOnly) {
  TempDir dir("multislice-imported-");
  const DecoderConfig c = Llama();
  std::vector<float> params(model::NumParameters(c), 0.25f);
  ASSERT_TRUE(
      WriteImportedCheckpoint(dir.path(), c, params, {"d", "LlamaForCausalLM"})
          .ok());
  CheckpointOptions options;
  options.directory = dir.path();
  CheckpointManager manager(options);
  auto state = LoadLatestFullState(manager, nullptr);
  ASSERT_TRUE(state.ok()) << state.status().message();
  auto imported = StartFromImportedWeights(dir.path(), 24, 7, 128, *state);
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  EXPECT_TRUE(*imported);
  EXPECT_EQ(state->step, 0);
  EXPECT_EQ(state->iterator.step, 0);
  EXPECT_EQ(state->iterator.global_rows, 24);
  EXPECT_EQ(state->iterator.seed, 7u);
  EXPECT_EQ(state->model.max_seq_len, 128);  // rotary: the run's
  EXPECT_EQ(state->params, params);
}

TEST(ImportedCheckpointTest, ATrainersCheckpointIsNotImported) {
  TempDir dir("multislice-imported-");
  const DecoderConfig c = Llama();
  std::vector<float> params(model::NumParameters(c), 0.5f);
  StateShard shard;
  shard.params = shard.adam_m = shard.adam_v = params.data();
  shard.count = static_cast<int64_t>(params.size());
  CheckpointOptions options;
  options.directory = dir.path();
  options.async = false;
  CheckpointManager manager(options);
  ASSERT_TRUE(manager
                  .Save(4, ShardBlobs({shard}),
                        StateMetadata(4, c, {"data"}, {1}, 1, {shard}, {}))
                  .ok());
  auto imported = ImportedMetadata(dir.path(), 4);
  ASSERT_TRUE(imported.ok()) << imported.status().message();
  EXPECT_TRUE(imported->is_null());
  auto state = LoadFullState(manager, 4);
  ASSERT_TRUE(state.ok()) << state.status().message();
  auto start = StartFromImportedWeights(dir.path(), 24, 7, 128, *state);
  ASSERT_TRUE(start.ok());
  EXPECT_FALSE(*start);
  EXPECT_EQ(state->step, 4);
  EXPECT_EQ(state->model.max_seq_len, c.max_seq_len);
}

TEST(ImportedCheckpointTest, RefusesParamsOfAnotherSize) {
  TempDir dir("multislice-imported-");
  const Status s = WriteImportedCheckpoint(dir.path(), Llama(),
                                           std::vector<float>(10), {"f", "a"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("10 values"), std::string::npos) << s.message();
}

// The model train builds from configs/base.yml with model_name=FILE.
Result<DecoderConfig> TrainedModel(const std::string& model_file) {
  ASSIGN_OR_RETURN(
      TrainConfig config,
      LoadTrainConfig(std::string(MULTISLICE_SOURCE_DIR) + "/configs/base.yml",
                      {"model_name=" + model_file}));
  RETURN_IF_ERROR(ValidateTrainConfig(config));
  return DecoderConfigFrom(config);
}

TEST(ImportedCheckpointTest, ModelFileDescribesTheSameModelToTrain) {
  DecoderConfig gpt3 = model::GptShape(50257, 77, 96, 4, 3, 200);
  gpt3.norm_epsilon = 1.5e-5;
  DecoderConfig gemma = Llama();
  gemma.block = BlockKind::kGemma;
  gemma.num_kv_heads = 1;
  gemma.mlp_activation = Activation::kGelu;
  gemma.tied_embedding = true;
  gemma.normalize_embedding_logits = true;
  DecoderConfig mistral = Llama();
  mistral.block = BlockKind::kMistral;
  mistral.norm_epsilon = 1e-5;
  mistral.rope_max_timescale = 1e6;
  TempDir dir("multislice-model-file-");
  const int base_seq_len = TrainedModel("default")->max_seq_len;
  for (DecoderConfig c : {gpt3, Llama(), gemma, mistral}) {
    SCOPED_TRACE(model::BlockName(c.block));
    const std::string path =
        dir.path() + "/" + model::BlockName(c.block) + ".yml";
    std::ofstream(path) << MaxTextModelYaml(c, "imported\nfrom a test");
    auto trained = TrainedModel(path);
    ASSERT_TRUE(trained.ok()) << trained.status().message();
    // Rotary models keep the run's sequence length; gpt3's is its table's.
    if (c.block != BlockKind::kGpt3) c.max_seq_len = base_seq_len;
    EXPECT_TRUE(*trained == c) << MaxTextModelYaml(c, "");
  }
  EXPECT_EQ(MaxTextModelYaml(gpt3, "a\nb").rfind("# a\n# b\n", 0), 0u);
}

}  // namespace
}  // namespace multislice::train
