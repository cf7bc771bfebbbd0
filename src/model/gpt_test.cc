// GPT-2's block (gpt3): its layout counted by hand, GPT-2 small's parameter
// count, the GPT-2 initialisation and the learned positions' gradient; the
// properties every block shares are decoder_test's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "model/decoder.h"
#include "model/decoder_testing.h"

namespace multislice::model {
namespace {

// V=11, T=4, C=8, NH=2, L=2, mlp=16.
DecoderConfig TinyConfig() { return GptShape(11, 4, 8, 2, 2, 16); }

using testing::Batch;
using testing::MakeBatch;

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

  DecoderConfig bad = TinyConfig();
  bad.num_heads = 3;  // 8 channels do not split into 3 heads
  EXPECT_EQ(ValidateConfig(bad).code(), StatusCode::kInvalidArgument);
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

// The rows of wpe past a shorter sequence get a zero gradient, whatever the
// gradient buffer held (decoder_test checks every other entry).
TEST(GptTest, PositionsPastTheSequenceGetZeroGradient) {
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
  std::vector<float> nans(n, std::nanf(""));
  ASSERT_TRUE(model.Backward(params.data(), nans.data()).ok());
  const ParamTensor wpe =
      ParameterLayout(c)[1];  // a copy: the vector is a temporary
  for (int64_t i = 3 * c.emb_dim; i < wpe.size; ++i) {
    EXPECT_EQ(nans[wpe.offset + i], 0.0f) << "wpe entry " << i;
  }
}

}  // namespace
}  // namespace multislice::model
