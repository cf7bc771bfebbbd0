#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "compute/adamw.h"
#include "compute/random.h"
#include "model/decoder.h"
#include "model/schedule.h"

namespace multislice::model {
namespace {

// V=11, T=4, C=8, NH=2, L=2, mlp=16.
DecoderConfig TinyConfig() { return GptShape(11, 4, 8, 2, 2, 16); }

// A fixed batch of B rows of T tokens; targets are the next token.
struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch MakeBatch(int B, int T, int V, uint64_t seed) {
  Batch b;
  for (int i = 0; i < B * (T + 1); ++i) {
    b.tokens.push_back(static_cast<int32_t>(
        compute::UniformAt(seed, 7, static_cast<uint64_t>(i)) * V));
  }
  std::vector<int32_t> stream = b.tokens;
  b.tokens.clear();
  for (int r = 0; r < B; ++r) {
    for (int t = 0; t < T; ++t) {
      b.tokens.push_back(stream[r * (T + 1) + t]);
      b.targets.push_back(stream[r * (T + 1) + t + 1]);
    }
  }
  return b;
}

TEST(GptTest, LayoutIsContiguousAndCountedByHand) {
  const DecoderConfig c = TinyConfig();
  const std::vector<ParamTensor> layout = ParameterLayout(c);
  ASSERT_EQ(layout.size(), 2u + 12u * 2u + 2u);
  int64_t offset = 0;
  std::set<std::string> names;
  for (const ParamTensor& t : layout) {
    EXPECT_EQ(t.offset, offset) << t.name;
    int64_t size = 1;
    for (int64_t d : t.shape) size *= d;
    EXPECT_EQ(t.size, size) << t.name;
    offset += t.size;
    names.insert(t.name);
  }
  EXPECT_EQ(names.size(), layout.size());
  EXPECT_EQ(offset, NumParameters(c));
  // wte 11*8 + wpe 4*8 + 2 * (ln1 16 + qkv 8*24+24 + proj 8*8+8 + ln2 16 +
  // fc 8*16+16 + fc_proj 16*8+8) + lnf 16 = 88 + 32 + 2*600 + 16.
  EXPECT_EQ(NumParameters(c), 1336);
  EXPECT_EQ(layout[0].name, "wte");
  EXPECT_EQ(layout[0].shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(layout[4].name, "h0.qkv.w");
  EXPECT_EQ(layout[4].shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(layout.back().name, "lnf.b");

  // GPT-2 small: 124,439,808 parameters with the tied head.
  const DecoderConfig gpt2 = GptShape(50257, 1024, 768, 12, 12, 3072);
  EXPECT_EQ(NumParameters(gpt2), 124439808);
}

TEST(GptTest, InitFollowsGpt2Recipe) {
  const DecoderConfig c = GptShape(11, 4, 64, 2, 2, 256);
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 5, params.data());
  const std::vector<uint8_t> mask = WeightDecayMask(c);
  for (const ParamTensor& t : ParameterLayout(c)) {
    const float* p = params.data() + t.offset;
    double sum2 = 0.0;
    for (int64_t i = 0; i < t.size; ++i) sum2 += double{p[i]} * p[i];
    const double rms = std::sqrt(sum2 / t.size);
    if (t.shape.size() == 2) {
      const bool residual = t.name.find("proj.w") != std::string::npos;
      const double want = 0.02 * (residual ? 1.0 / std::sqrt(4.0) : 1.0);
      EXPECT_NEAR(rms, want, 0.25 * want) << t.name;
      EXPECT_EQ(mask[t.offset], 1) << t.name;
    } else {
      const bool ln_weight =
          t.name.find("ln") != std::string::npos && t.name.back() == 'w';
      EXPECT_EQ(rms, ln_weight ? 1.0 : 0.0) << t.name;
      EXPECT_EQ(mask[t.offset], 0) << t.name;
    }
  }
}

TEST(GptTest, InitialLossIsNearLogVocab) {
  const DecoderConfig c = GptShape(256, 16, 64, 4, 2, 256);
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 1, params.data());
  const Batch batch = MakeBatch(4, 16, c.vocab_size, 3);
  Decoder model(c);
  Result<float> loss = model.Forward(params.data(), batch.tokens.data(),
                                     batch.targets.data(), 4, 16);
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_NEAR(*loss, std::log(256.0), 0.1);
}

TEST(GptTest, ForwardRejectsBadInput) {
  const DecoderConfig c = TinyConfig();
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 1, params.data());
  Decoder model(c);
  std::vector<int32_t> tokens = {0, 1, 2, 3, 4};
  EXPECT_EQ(model.Forward(params.data(), tokens.data(), nullptr, 1, 5)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  tokens[2] = 11;
  EXPECT_EQ(model.Forward(params.data(), tokens.data(), nullptr, 1, 4)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  std::vector<float> grads(params.size());
  EXPECT_EQ(model.Backward(params.data(), grads.data()).code(),
            StatusCode::kFailedPrecondition);
  DecoderConfig bad = c;
  bad.num_heads = 3;
  EXPECT_EQ(ValidateConfig(bad).code(), StatusCode::kInvalidArgument);
}

TEST(GptTest, GradientMatchesFiniteDifferences) {
  const DecoderConfig c = TinyConfig();
  const int B = 2, T = 4;
  const int64_t n = NumParameters(c);
  // Larger than the GPT-2 init so every path carries a sizeable gradient.
  std::vector<float> params(n);
  InitParameters(c, 11, params.data());
  for (int64_t i = 0; i < n; ++i) {
    params[i] += 0.3f * compute::NormalAt(12, 0, static_cast<uint64_t>(i));
  }
  const Batch batch = MakeBatch(B, T, c.vocab_size, 4);
  Decoder model(c);
  ASSERT_TRUE(model
                  .Forward(params.data(), batch.tokens.data(),
                           batch.targets.data(), B, T)
                  .ok());
  std::vector<float> grads(n, 0.0f);
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
    // Two elements per small tensor, one more for the large ones: ~60.
    std::vector<int64_t> picks = {0, t.size / 2 + 1};
    if (t.size > 100) picks.push_back(t.size - 3);
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
  EXPECT_GE(checked, 40);
}

// Backward writes every entry of the gradient, whatever the buffer held:
// into NaNs, and twice into the same buffer, it gives the gradient it gives
// into zeros (with a shorter sequence than wpe's rows, whose gradient is 0).
TEST(GptTest, BackwardOverwritesEveryEntry) {
  const DecoderConfig c = TinyConfig();
  const int64_t n = NumParameters(c);
  std::vector<float> params(n);
  InitParameters(c, 2, params.data());
  const Batch batch = MakeBatch(2, 3, c.vocab_size, 9);  // T=3 of 4 rows
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
  const ParamTensor wpe =
      ParameterLayout(c)[1];  // a copy: the vector is a temporary
  for (int64_t i = 3 * c.emb_dim; i < wpe.size; ++i) {
    EXPECT_EQ(nans[wpe.offset + i], 0.0f) << "wpe entry " << i;
  }
}

// Backward reports each range of the gradient once it is final: a copy taken
// at the report equals the finished gradient, the ranges tile the buffer in
// the order the pass runs (lnf, the layers from the last, the embeddings),
// each ending where the previous one began; and the gradient is the one a
// Backward without the callback writes.
TEST(GptTest, BackwardReportsEachRangeWhenFinal) {
  DecoderConfig c = TinyConfig();
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
  const std::vector<int64_t> begins = {
      offset_of("lnf.w"), offset_of("h2.ln1.w"), offset_of("h1.ln1.w"),
      offset_of("h0.ln1.w"), 0};
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

// Trains on one fixed batch; returns the losses of every step.
std::vector<float> Train(const DecoderConfig& c, uint64_t seed, int steps,
                         DType matmul_type = DType::kF32) {
  const int B = 2, T = c.max_seq_len;
  const int64_t n = NumParameters(c);
  std::vector<float> params(n), grads(n), m(n, 0.0f), v(n, 0.0f);
  InitParameters(c, seed, params.data());
  const std::vector<uint8_t> mask = WeightDecayMask(c);
  const Batch batch = MakeBatch(B, T, c.vocab_size, seed + 1);
  Decoder model(c, matmul_type);
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    Result<float> loss = model.Forward(params.data(), batch.tokens.data(),
                                       batch.targets.data(), B, T);
    EXPECT_TRUE(loss.ok());
    losses.push_back(*loss);
    EXPECT_TRUE(model.Backward(params.data(), grads.data()).ok());
    const float scale =
        model::ClipScale(compute::GlobalNorm(grads.data(), n), 1.0f);
    for (float& g : grads) g *= scale;
    compute::AdamWOptions options;
    options.lr = 1e-2f;
    options.weight_decay = 0.0f;
    compute::AdamWUpdate(params.data(), grads.data(), m.data(), v.data(), n,
                         options, step, mask.data());
  }
  return losses;
}

TEST(GptTest, AdamWStepsReduceLossOnFixedBatch) {
  const DecoderConfig c = GptShape(32, 8, 32, 2, 2, 64);
  const std::vector<float> losses = Train(c, 21, 30);
  EXPECT_LT(losses.back(), 0.5f * losses.front())
      << "first " << losses.front() << " last " << losses.back();
}

TEST(GptTest, Bf16MatmulsTrackF32) {
  const DecoderConfig c = GptShape(32, 8, 32, 2, 2, 64);
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
  std::vector<float> diff(n);
  for (int64_t i = 0; i < n; ++i) diff[i] = grads16[i] - grads32[i];
  EXPECT_LT(compute::GlobalNorm(diff.data(), n),
            0.05 * compute::GlobalNorm(grads32.data(), n));
  const std::vector<float> losses = Train(c, 21, 30, DType::kBF16);
  EXPECT_LT(losses.back(), 0.5f * losses.front());
}

TEST(GptTest, SameSeedGivesBitIdenticalLoss) {
  const DecoderConfig c = TinyConfig();
  const std::vector<float> a = Train(c, 33, 3);
  const std::vector<float> b = Train(c, 33, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  const std::vector<float> other = Train(c, 34, 1);
  EXPECT_NE(a[0], other[0]);
}

TEST(GptTest, LogitsWithoutTargets) {
  const DecoderConfig c = TinyConfig();
  std::vector<float> params(NumParameters(c));
  InitParameters(c, 3, params.data());
  const Batch batch = MakeBatch(1, 4, c.vocab_size, 5);
  Decoder model(c);
  ASSERT_TRUE(model
                  .Forward(params.data(), batch.tokens.data(),
                           batch.targets.data(), 1, 4)
                  .ok());
  const std::vector<float> with(model.logits(), model.logits() + 4 * 11);
  Result<float> loss =
      model.Forward(params.data(), batch.tokens.data(), nullptr, 1, 4);
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(*loss, 0.0f);
  for (int i = 0; i < 4 * 11; ++i) EXPECT_EQ(model.logits()[i], with[i]);
  std::vector<float> grads(params.size());
  EXPECT_EQ(model.Backward(params.data(), grads.data()).code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace multislice::model
