// The decoder with each kind of block (GPT-2's, Llama's with grouped query
// heads, Gemma's with one key/value head and a normalised tied head, and a
// Llama with a tied head): the gradient against central finite differences
// of the loss, Backward's overwrite and range contracts, the initial loss,
// AdamW on a fixed batch, bf16 against f32, and bad input (CTest runs it
// again under each ISA cap).
#include "model/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "compute/random.h"
#include "model/decoder_testing.h"

namespace multislice::model {
namespace {

struct Case {
  const char* name;
  DecoderConfig config;
};

using testing::Batch;
using testing::GemmaShape;
using testing::LlamaShape;
using testing::MakeBatch;
using testing::Train;

DecoderConfig TiedLlama(int V, int T, int C, int heads, int kv_heads, int hd,
                        int L, int mlp) {
  DecoderConfig c = LlamaShape(V, T, C, heads, kv_heads, hd, L, mlp);
  c.tied_embedding = true;
  return c;
}

// The tiny shapes of the finite differences; head_dim differs from
// emb_dim / heads for the Llama family, as MaxText allows.
const Case kTiny[] = {
    {"gpt3", GptShape(11, 4, 8, 2, 2, 16)},
    {"llama2_gqa", LlamaShape(11, 4, 8, 4, 2, 4, 2, 12)},
    {"gemma_mqa", GemmaShape(11, 4, 8, 2, 1, 6, 2, 12)},
    {"llama2_tied", TiedLlama(11, 4, 8, 2, 2, 4, 2, 12)},
};

// Wider shapes for training and bf16.
const Case kSmall[] = {
    {"gpt3", GptShape(32, 8, 32, 2, 2, 64)},
    {"llama2_gqa", LlamaShape(32, 8, 32, 4, 2, 8, 2, 48)},
    {"gemma_mqa", GemmaShape(32, 8, 32, 2, 1, 16, 2, 48)},
};

class DecoderTest : public ::testing::TestWithParam<int> {
 protected:
  const Case& Tiny() const { return kTiny[GetParam()]; }
  const Case& Small() const { return kSmall[GetParam() % std::size(kSmall)]; }
};

// The initial weights plus noise larger than the init, so that every path
// carries a sizeable gradient.
std::vector<float> NoisyParameters(const DecoderConfig& c, uint64_t seed) {
  const int64_t n = NumParameters(c);
  std::vector<float> params(n);
  InitParameters(c, seed, params.data());
  for (int64_t i = 0; i < n; ++i) {
    params[i] +=
        0.3f * compute::NormalAt(seed + 1, 0, static_cast<uint64_t>(i));
  }
  return params;
}

TEST_P(DecoderTest, LayoutIsContiguousWithUniqueNames) {
  const DecoderConfig& c = Tiny().config;
  ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c).message();
  int64_t offset = 0;
  std::vector<std::string> names;
  for (const ParamTensor& t : ParameterLayout(c)) {
    EXPECT_EQ(t.offset, offset) << t.name;
    int64_t size = 1;
    for (int64_t d : t.shape) size *= d;
    EXPECT_EQ(t.size, size) << t.name;
    offset += t.size;
    EXPECT_EQ(std::count(names.begin(), names.end(), t.name), 0) << t.name;
    names.push_back(t.name);
  }
  EXPECT_EQ(offset, NumParameters(c));
  EXPECT_EQ(names.front(), "wte");
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head"),
            c.tied_embedding ? 0 : 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "wpe"),
            UsesLearnedPositions(c) ? 1 : 0);
}

TEST_P(DecoderTest, GradientMatchesFiniteDifferences) {
  const DecoderConfig& c = Tiny().config;
  const int B = 2, T = 4;
  std::vector<float> params = NoisyParameters(c, 11);
  const Batch batch = MakeBatch(B, T, c.vocab_size, 4);
  Decoder model(c);
  ASSERT_TRUE(model
                  .Forward(params.data(), batch.tokens.data(),
                           batch.targets.data(), B, T)
                  .ok());
  std::vector<float> grads(params.size(), 0.0f);
  ASSERT_TRUE(model.Backward(params.data(), grads.data()).ok());

  auto loss_at = [&](int64_t index, float value) {
    const float saved = params[index];
    params[index] = value;
    Result<float> loss = model.Forward(params.data(), batch.tokens.data(),
                                       batch.targets.data(), B, T);
    params[index] = saved;
    EXPECT_TRUE(loss.ok());
    return double{*loss};
  };
  constexpr double kStep = 1e-3;
  int checked = 0;
  for (const ParamTensor& t : ParameterLayout(c)) {
    std::vector<int64_t> picks = {0, t.size / 2 + 1, t.size / 3};
    if (t.size > 60) picks.push_back(t.size - 3);
    for (int64_t local : picks) {
      local = std::min(local, t.size - 1);
      const int64_t i = t.offset + local;
      // Central difference over the perturbation the floats really hold.
      const float x = params[i];
      const float up = x + static_cast<float>(kStep);
      const float down = x - static_cast<float>(kStep);
      const double numeric =
          (loss_at(i, up) - loss_at(i, down)) / (double{up} - double{down});
      // The f32 loss (about 3) moves in steps of 2.4e-7, so the quotient
      // carries about 1.2e-4 of rounding noise.
      EXPECT_NEAR(grads[i], numeric, 3e-4 + 5e-3 * std::fabs(numeric))
          << t.name << "[" << local << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, 25);
}

// Backward writes every entry of the gradient, whatever the buffer held:
// into NaNs, and twice into the same buffer, it gives the gradient it gives
// into zeros (with a shorter sequence than max_seq_len).
TEST_P(DecoderTest, BackwardOverwritesEveryEntry) {
  const DecoderConfig& c = Tiny().config;
  const int64_t n = NumParameters(c);
  std::vector<float> params(n);
  InitParameters(c, 2, params.data());
  const Batch batch = MakeBatch(2, 3, c.vocab_size, 9);  // T = 3 of 4
  Decoder model(c);
  ASSERT_TRUE(model
                  .Forward(params.data(), batch.tokens.data(),
                           batch.targets.data(), 2, 3)
                  .ok());
  std::vector<float> zeros(n, 0.0f), nans(n, std::nanf("")), twice(n, 5.0f);
  ASSERT_TRUE(model.Backward(params.data(), zeros.data()).ok());
  ASSERT_TRUE(model.Backward(params.data(), nans.data()).ok());
  ASSERT_TRUE(model.Backward(params.data(), twice.data()).ok());
  ASSERT_TRUE(model.Backward(params.data(), twice.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(nans[i], zeros[i]) << "entry " << i;
    ASSERT_EQ(twice[i], zeros[i]) << "entry " << i;
  }
}

// Backward reports each range of the gradient once it is final: a copy
// taken at the report equals the finished gradient, and the ranges tile the
// buffer in the order the pass runs (the final norm and an untied head, the
// layers from the last, the embeddings), each ending where the previous one
// began.
TEST_P(DecoderTest, BackwardReportsEachRangeWhenFinal) {
  DecoderConfig c = Tiny().config;
  c.num_layers = 3;
  const int64_t n = NumParameters(c);
  std::vector<float> params(n);
  InitParameters(c, 4, params.data());
  const Batch batch = MakeBatch(2, c.max_seq_len, c.vocab_size, 5);
  Decoder model(c);
  ASSERT_TRUE(model
                  .Forward(params.data(), batch.tokens.data(),
                           batch.targets.data(), 2, c.max_seq_len)
                  .ok());
  std::vector<float> plain(n), grads(n, std::nanf(""));
  ASSERT_TRUE(model.Backward(params.data(), plain.data()).ok());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<std::vector<float>> copies;
  ASSERT_TRUE(model
                  .Backward(params.data(), grads.data(),
                            [&](int64_t offset, int64_t count) {
                              ranges.emplace_back(offset, count);
                              copies.emplace_back(
                                  grads.begin() + offset,
                                  grads.begin() + offset + count);
                            })
                  .ok());
  const std::vector<ParamTensor> layout = ParameterLayout(c);
  auto offset_of = [&](const std::string& name) {
    for (const ParamTensor& t : layout) {
      if (t.name == name) return t.offset;
    }
    ADD_FAILURE() << "no tensor " << name;
    return int64_t{-1};
  };
  const std::string first = BlockTensors(c, 1).front().name;
  const std::vector<int64_t> begins = {
      offset_of("lnf.w"), offset_of("h2." + first), offset_of("h1." + first),
      offset_of("h0." + first), 0};
  ASSERT_EQ(ranges.size(), begins.size());
  int64_t end = n;
  for (size_t r = 0; r < ranges.size(); ++r) {
    EXPECT_EQ(ranges[r].first, begins[r]) << "range " << r;
    EXPECT_EQ(ranges[r].first + ranges[r].second, end) << "range " << r;
    end = ranges[r].first;
    for (int64_t i = 0; i < ranges[r].second; ++i) {
      ASSERT_EQ(copies[r][i], grads[ranges[r].first + i])
          << "range " << r << " entry " << i << " changed after its report";
    }
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(grads[i], plain[i]) << i;
}

TEST_P(DecoderTest, InitialLossIsNearLogVocab) {
  DecoderConfig c = Small().config;
  c.vocab_size = 256;
  c.max_seq_len = 16;
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 1, params.data());
  const Batch batch = MakeBatch(4, 16, c.vocab_size, 3);
  Decoder model(c);
  Result<float> loss = model.Forward(params.data(), batch.tokens.data(),
                                     batch.targets.data(), 4, 16);
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_NEAR(*loss, std::log(256.0), 0.1);
}

TEST_P(DecoderTest, AdamWStepsReduceLossOnFixedBatch) {
  const std::vector<float> losses = Train(Small().config, 21, 30);
  EXPECT_LT(losses.back(), 0.5f * losses.front())
      << "first " << losses.front() << " last " << losses.back();
}

TEST_P(DecoderTest, Bf16MatmulsTrackF32) {
  const DecoderConfig& c = Small().config;
  const int B = 2, T = 8;
  const int64_t n = NumParameters(c);
  std::vector<float> params(n);
  InitParameters(c, 8, params.data());
  const Batch batch = MakeBatch(B, T, c.vocab_size, 8);
  std::vector<float> grads32(n, 0.0f), grads16(n, 0.0f);
  Decoder f32_model(c), bf16_model(c, DType::kBF16);
  Result<float> loss32 = f32_model.Forward(params.data(), batch.tokens.data(),
                                           batch.targets.data(), B, T);
  Result<float> loss16 = bf16_model.Forward(params.data(), batch.tokens.data(),
                                            batch.targets.data(), B, T);
  ASSERT_TRUE(loss32.ok() && loss16.ok());
  EXPECT_NEAR(*loss16, *loss32, 1e-2);
  EXPECT_NE(*loss16, *loss32);  // the rounding really happened
  ASSERT_TRUE(f32_model.Backward(params.data(), grads32.data()).ok());
  ASSERT_TRUE(bf16_model.Backward(params.data(), grads16.data()).ok());
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (grads16[i] - grads32[i]) * double{grads16[i] - grads32[i]};
    norm += grads32[i] * double{grads32[i]};
  }
  EXPECT_LT(std::sqrt(err), 5e-2 * std::sqrt(norm));
  const std::vector<float> losses = Train(c, 21, 30, DType::kBF16);
  EXPECT_LT(losses.back(), 0.5f * losses.front());
}

TEST_P(DecoderTest, SameSeedGivesBitIdenticalLoss) {
  const DecoderConfig& c = Tiny().config;
  const std::vector<float> a = Train(c, 33, 3);
  const std::vector<float> b = Train(c, 33, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  const std::vector<float> other = Train(c, 34, 1);
  EXPECT_NE(a[0], other[0]);
}

TEST_P(DecoderTest, LogitsWithoutTargets) {
  const DecoderConfig& c = Tiny().config;
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 3, params.data());
  const Batch batch = MakeBatch(1, 4, c.vocab_size, 5);
  Decoder model(c);
  ASSERT_TRUE(model
                  .Forward(params.data(), batch.tokens.data(),
                           batch.targets.data(), 1, 4)
                  .ok());
  const int n = 4 * c.vocab_size;
  const std::vector<float> with(model.logits(), model.logits() + n);
  Result<float> loss =
      model.Forward(params.data(), batch.tokens.data(), nullptr, 1, 4);
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(*loss, 0.0f);
  for (int i = 0; i < n; ++i) EXPECT_EQ(model.logits()[i], with[i]);
  std::vector<float> grads(params.size());
  EXPECT_EQ(model.Backward(params.data(), grads.data()).code(),
            StatusCode::kFailedPrecondition);
}

TEST_P(DecoderTest, ForwardRejectsBadInput) {
  const DecoderConfig& c = Tiny().config;
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 1, params.data());
  Decoder model(c);
  std::vector<int32_t> tokens = {0, 1, 2, 3, 4};
  EXPECT_EQ(model.Forward(params.data(), tokens.data(), nullptr, 1, 5)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  tokens[2] = c.vocab_size;
  EXPECT_EQ(model.Forward(params.data(), tokens.data(), nullptr, 1, 4)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  std::vector<float> grads(params.size());
  EXPECT_EQ(model.Backward(params.data(), grads.data()).code(),
            StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Blocks, DecoderTest,
                         ::testing::Range(0,
                                          static_cast<int>(std::size(kTiny))),
                         [](const auto& info) {
                           return std::string(kTiny[info.param].name);
                         });

}  // namespace
}  // namespace multislice::model
