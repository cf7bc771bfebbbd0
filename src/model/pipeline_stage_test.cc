// Pipeline stages of the decoder (GPT-2's block, and Llama's with an untied
// and a tied head) against the whole model: p stages run
// one after the other (each forward reads the previous stage's output, each
// backward the next stage's input gradient) give the whole model's loss and,
// mapped back by name, its gradient: each stage's tensors the whole model's,
// and wte's gradient the sum of the first stage's (encoder) and the last
// stage's (head) parts. p = 2 and 4, f32; the stage layouts; the ranges
// Backward reports tile each stage's buffer; bad configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "compute/random.h"
#include "model/decoder.h"
#include "model/decoder_testing.h"
#include "model/tensor_shard.h"

namespace multislice::model {
namespace {

DecoderConfig Config() { return GptShape(13, 6, 16, 4, 4, 32); }

// Llama with grouped heads and an untied head (its last stage holds no wte),
// and with a tied one.
DecoderConfig Llama(bool tied) {
  DecoderConfig c = testing::LlamaShape(13, 6, 16, 4, 2, 6, 4, 32);
  c.tied_embedding = tied;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch MakeBatch(const DecoderConfig& c, int n) {
  Batch b;
  for (int i = 0; i < n; ++i) {
    b.tokens.push_back(
        static_cast<int32_t>(compute::UniformAt(5, 1, i) * c.vocab_size));
    b.targets.push_back(
        static_cast<int32_t>(compute::UniformAt(5, 2, i) * c.vocab_size));
  }
  return b;
}

TEST(PipelineStageTest, LayoutsSplitTheLayersAndTieTheHead) {
  const DecoderConfig c = Config();
  const std::vector<ParamTensor> first = ParameterLayout(c, 1, {0, 2});
  const std::vector<ParamTensor> last = ParameterLayout(c, 1, {1, 2});
  EXPECT_EQ(first.front().name, "wte");
  EXPECT_EQ(first[1].name, "wpe");
  EXPECT_EQ(first[2].name, "h0.ln1.w");
  EXPECT_EQ(first.back().name, "h1.fc_proj.b");
  EXPECT_EQ(last.front().name, "wte");
  EXPECT_EQ(last[1].name, "h2.ln1.w");
  EXPECT_EQ(last.back().name, "lnf.b");
  const std::vector<ParamTensor> middle = ParameterLayout(c, 1, {1, 4});
  ASSERT_EQ(middle.size(), 12u);
  EXPECT_EQ(middle.front().name, "h1.ln1.w");
  EXPECT_EQ(middle.front().offset, 0);
  // Every tensor of the whole model on some stage; wte on two.
  const int64_t wte = int64_t{c.vocab_size} * c.emb_dim;
  int64_t sum = 0;
  for (int s = 0; s < 4; ++s) sum += NumParameters(c, 1, {s, 4});
  EXPECT_EQ(sum, NumParameters(c) + wte);
  EXPECT_EQ(ParameterLayout(c, 2, {0, 1}).size(), ParameterLayout(c, 2).size());
}

TEST(PipelineStageTest, StagesMustDivideTheLayers) {
  const DecoderConfig c = Config();
  EXPECT_TRUE(ValidatePipeline(c, 4).ok());
  const Status s = ValidatePipeline(c, 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "pipeline stages 3 must divide num_layers (4): each stage holds "
            "an equal number of whole layers");
  EXPECT_EQ(ValidatePipeline(c, 0).code(), StatusCode::kInvalidArgument);
}

TEST(PipelineStageTest, AnUntiedHeadLivesOnTheLastStageOnly) {
  const DecoderConfig c = Llama(/*tied=*/false);
  const std::vector<ParamTensor> first = ParameterLayout(c, 1, {0, 2});
  const std::vector<ParamTensor> last = ParameterLayout(c, 1, {1, 2});
  EXPECT_EQ(first.front().name, "wte");
  EXPECT_EQ(first[1].name, "h0.attn_norm.w");
  EXPECT_EQ(last.front().name, "h2.attn_norm.w");
  EXPECT_EQ(last[last.size() - 2].name, "lnf.w");
  EXPECT_EQ(last.back().name, "lm_head");
  int64_t sum = 0;
  for (int s = 0; s < 4; ++s) sum += NumParameters(c, 1, {s, 4});
  EXPECT_EQ(sum, NumParameters(c));  // nothing held twice
}

void ExpectStagesMatchWhole(int p, const DecoderConfig& c = Config()) {
  const int B = 2, T = c.max_seq_len, C = c.emb_dim;
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 11, params.data());
  const Batch batch = MakeBatch(c, B * T);
  Decoder whole(c);
  const float whole_loss = *whole.Forward(params.data(), batch.tokens.data(),
                                          batch.targets.data(), B, T);
  std::vector<float> whole_grads(params.size());
  ASSERT_TRUE(whole.Backward(params.data(), whole_grads.data()).ok());

  std::vector<std::unique_ptr<Decoder>> stages;
  std::vector<std::vector<float>> local(p), grads(p);
  float loss = NAN;
  for (int s = 0; s < p; ++s) {
    const PipelineStage stage{s, p};
    stages.push_back(
        std::make_unique<Decoder>(c, DType::kF32, TensorParallel{}, stage));
    local[s].resize(NumParameters(c, 1, stage));
    ExtractTensorShard(c, 1, 0, params.data(), local[s].data(), stage);
    const float* input = s > 0 ? stages[s - 1]->output() : nullptr;
    Result<float> r = stages[s]->Forward(local[s].data(),
                                         s == 0 ? batch.tokens.data() : nullptr,
                                         batch.targets.data(), B, T, input);
    ASSERT_TRUE(r.ok()) << r.status().message();
    if (s == p - 1) loss = *r;
  }
  EXPECT_NEAR(loss, whole_loss, 1e-5 * std::fabs(whole_loss));
  for (int s = p - 1; s >= 0; --s) {
    grads[s].assign(local[s].size(), NAN);
    int64_t covered = static_cast<int64_t>(local[s].size());
    auto ready = [&](int64_t offset, int64_t count) {
      EXPECT_EQ(offset + count, covered) << "stage " << s;
      covered = offset;
    };
    const float* output_grad =
        s < p - 1 ? stages[s + 1]->input_grad() : nullptr;
    ASSERT_TRUE(
        stages[s]
            ->Backward(local[s].data(), grads[s].data(), ready, output_grad)
            .ok());
    EXPECT_EQ(covered, 0) << "stage " << s;
  }
  // Assemble: a tied wte's two parts summed, every other tensor from its
  // stage.
  std::vector<float> assembled(params.size(), NAN);
  const int64_t wte = int64_t{c.vocab_size} * C;
  std::vector<float> wte_sum(wte, 0.0f);
  for (int s = 0; s < p; ++s) {
    const PipelineStage stage{s, p};
    InsertTensorShard(c, 1, 0, grads[s].data(), assembled.data(), stage);
    if (stage.first() || (stage.last() && c.tied_embedding)) {
      for (int64_t i = 0; i < wte; ++i) wte_sum[i] += grads[s][i];
    }
  }
  std::copy(wte_sum.begin(), wte_sum.end(), assembled.begin());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_FALSE(std::isnan(assembled[i])) << i;
    max_diff =
        std::max(max_diff, double{std::fabs(assembled[i] - whole_grads[i])});
    max_abs = std::max(max_abs, double{std::fabs(whole_grads[i])});
  }
  EXPECT_LE(max_diff, 1e-5 * max_abs) << p << " stages";
}

TEST(PipelineStageTest, TwoStagesGiveTheWholeModelsLossAndGradient) {
  ExpectStagesMatchWhole(2);
}

TEST(PipelineStageTest, FourStagesGiveTheWholeModelsLossAndGradient) {
  ExpectStagesMatchWhole(4);
}

TEST(PipelineStageTest, LlamaStagesGiveTheWholeModelsLossAndGradient) {
  ExpectStagesMatchWhole(2, Llama(/*tied=*/false));
  ExpectStagesMatchWhole(4, Llama(/*tied=*/false));
  ExpectStagesMatchWhole(2, Llama(/*tied=*/true));
}

TEST(PipelineStageTest, LaterStagesNeedTheirInputs) {
  const DecoderConfig c = Config();
  Decoder second(c, DType::kF32, TensorParallel{}, {1, 2});
  std::vector<float> params(NumParameters(c, 1, {1, 2}));
  const Batch batch = MakeBatch(c, 6);
  Result<float> r = second.Forward(params.data(), nullptr, batch.targets.data(),
                                   1, 6, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  Decoder first(c, DType::kF32, TensorParallel{}, {0, 2});
  std::vector<float> p0(NumParameters(c, 1, {0, 2})), g0(p0.size());
  ASSERT_TRUE(
      first.Forward(p0.data(), batch.tokens.data(), nullptr, 1, 6).ok());
  EXPECT_EQ(first.Backward(p0.data(), g0.data()).code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace multislice::model
