#include "compute/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/isa_testing.h"

namespace multislice::compute {
namespace {

// A scalar AdamW in double, written from the formula, for one parameter.
struct ScalarAdamW {
  double p, m = 0.0, v = 0.0;
  void Step(double g, const AdamWOptions& o, int t, bool decay) {
    m = o.beta1 * m + (1.0 - o.beta1) * g;
    v = o.beta2 * v + (1.0 - o.beta2) * g * g;
    const double m_hat = m / (1.0 - std::pow(double{o.beta1}, t));
    const double v_hat = v / (1.0 - std::pow(double{o.beta2}, t));
    const double wd = decay ? o.weight_decay : 0.0;
    p -= o.lr * (m_hat / (std::sqrt(v_hat) + o.eps) + wd * p);
  }
};

TEST(AdamWTest, FirstStepMovesByLrTimesSignPlusDecay) {
  // Step 1: m_hat = g and v_hat = g^2, so the update is g / |g| = sign(g).
  AdamWOptions o;
  o.lr = 0.1f;
  o.weight_decay = 0.5f;
  std::vector<float> p = {1.0f, -2.0f}, g = {0.3f, 4.0f}, m(2, 0.0f),
                     v(2, 0.0f);
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), 2, o, 1, nullptr);
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-6);
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (1.0 + 0.5 * -2.0), 1e-6);
  EXPECT_NEAR(m[0], 0.1 * 0.3, 1e-7);
  EXPECT_NEAR(v[1], 0.05 * 16.0, 1e-6);
}

TEST(AdamWTest, ThreeStepsMatchScalarReferenceWithAndWithoutMask) {
  AdamWOptions o;
  o.lr = 0.01f;
  const std::vector<std::vector<float>> grads = {
      {0.5f, -1.0f, 0.25f}, {0.1f, -0.5f, -2.0f}, {-0.3f, 0.2f, 1.0f}};
  const std::vector<float> init = {0.8f, -0.4f, 1.5f};
  const std::vector<uint8_t> mask = {1, 0, 1};
  for (const bool use_mask : {false, true}) {
    std::vector<float> p = init, m(3, 0.0f), v(3, 0.0f);
    std::vector<ScalarAdamW> ref;
    for (float x : init) ref.push_back({x});
    for (int t = 1; t <= 3; ++t) {
      AdamWUpdate(p.data(), grads[t - 1].data(), m.data(), v.data(), 3, o, t,
                  use_mask ? mask.data() : nullptr);
      for (int i = 0; i < 3; ++i) {
        ref[i].Step(grads[t - 1][i], o, t, !use_mask || mask[i] != 0);
      }
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(p[i], ref[i].p, 1e-6) << "i=" << i << " mask=" << use_mask;
      EXPECT_NEAR(m[i], ref[i].m, 1e-6);
      EXPECT_NEAR(v[i], ref[i].v, 1e-6);
    }
  }
  // Masked-out parameter 1 differs from the decayed one only by the decay.
  std::vector<float> a = init, b = init, ma(3, 0.0f), va(3, 0.0f), mb(3, 0.0f),
                     vb(3, 0.0f);
  AdamWUpdate(a.data(), grads[0].data(), ma.data(), va.data(), 3, o, 1,
              nullptr);
  AdamWUpdate(b.data(), grads[0].data(), mb.data(), vb.data(), 3, o, 1,
              mask.data());
  EXPECT_NEAR(b[1] - a[1], o.lr * o.weight_decay * init[1], 1e-7);
  EXPECT_EQ(a[0], b[0]);
}

// The plain f32 loop of the formulas in adamw.h, one operation at a time
// (this file is built for the x86-64 baseline, which has no FMA to fuse
// them).
void ScalarLoop(float* p, const float* grads, float* m, float* v, int n,
                const AdamWOptions& o, int t, const uint8_t* mask) {
  const float inv_c1 =
      static_cast<float>(1.0 / (1.0 - std::pow(double{o.beta1}, t)));
  const float inv_sqrt_c2 =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{o.beta2}, t)));
  for (int i = 0; i < n; ++i) {
    const float g = grads[i] * o.grad_scale;
    m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * g;
    v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * g * g;
    const float m_hat = m[i] * inv_c1;
    const float denom = std::sqrt(v[i]) * inv_sqrt_c2 + o.eps;
    const float wd = mask == nullptr || mask[i] != 0 ? o.weight_decay : 0.0f;
    p[i] -= o.lr * (m_hat / denom + wd * p[i]);
  }
}

class AdamWIsaTest : public ::testing::TestWithParam<Isa> {};

// Every level's vector loop (and its zero-padded tail: 53 = 3 * 16 + 5)
// gives the scalar loop's bits, with and without the decay mask and a
// gradient scale, over three steps; and tracks the double reference.
TEST_P(AdamWIsaTest, MatchesScalarLoopBitForBit) {
  ScopedIsaCap cap(GetParam());
  constexpr int kN = 53;
  std::vector<float> init(kN);
  std::vector<uint8_t> mask(kN);
  for (int i = 0; i < kN; ++i) {
    init[i] = 0.1f * static_cast<float>((i * 37) % 23) - 1.0f;
    mask[i] = static_cast<uint8_t>((i * 7) % 3 != 0);
  }
  for (const float grad_scale : {1.0f, 0.37f}) {
    for (const bool use_mask : {false, true}) {
      AdamWOptions o;
      o.lr = 0.02f;
      o.grad_scale = grad_scale;
      std::vector<float> p = init, m(kN, 0.0f), v(kN, 0.0f);
      std::vector<float> q = init, mq(kN, 0.0f), vq(kN, 0.0f);
      std::vector<ScalarAdamW> ref;
      for (float x : init) ref.push_back({x});
      const uint8_t* mask_or_null = use_mask ? mask.data() : nullptr;
      for (int t = 1; t <= 3; ++t) {
        std::vector<float> g(kN);
        for (int i = 0; i < kN; ++i) {
          g[i] = 0.05f * static_cast<float>((i * 13 + t * 5) % 17) - 0.4f;
        }
        AdamWUpdate(p.data(), g.data(), m.data(), v.data(), kN, o, t,
                    mask_or_null);
        ScalarLoop(q.data(), g.data(), mq.data(), vq.data(), kN, o, t,
                   mask_or_null);
        for (int i = 0; i < kN; ++i) {
          ref[i].Step(g[i] * double{grad_scale}, o, t,
                      !use_mask || mask[i] != 0);
        }
      }
      for (int i = 0; i < kN; ++i) {
        ASSERT_EQ(p[i], q[i]) << "i=" << i << " mask=" << use_mask;
        ASSERT_EQ(m[i], mq[i]);
        ASSERT_EQ(v[i], vq[i]);
        EXPECT_NEAR(p[i], ref[i].p, 1e-6);
      }
    }
  }
}

// The sum of squares is the same double on every level, and within
// rounding of a plain double loop.
TEST_P(AdamWIsaTest, SumOfSquaresIsTheSameOnEveryLevel) {
  std::vector<float> g(1003);
  double plain = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.01f * static_cast<float>(static_cast<int>(i * 7919 % 401) - 200);
    plain += double{g[i]} * g[i];
  }
  const double baseline = [&] {
    ScopedIsaCap cap(Isa::kBaseline);
    return SumOfSquares(g.data(), static_cast<int64_t>(g.size()));
  }();
  ScopedIsaCap cap(GetParam());
  const double sum = SumOfSquares(g.data(), static_cast<int64_t>(g.size()));
  EXPECT_EQ(sum, baseline);
  EXPECT_NEAR(sum, plain, 1e-12 * plain);
}

INSTANTIATE_TEST_SUITE_P(Levels, AdamWIsaTest,
                         ::testing::ValuesIn(RunnableIsaLevels()),
                         [](const auto& info) {
                           return IsaTestName(info.param);
                         });

TEST(AdamWTest, GlobalNorm) {
  const std::vector<float> g = {3.0f, -4.0f, 0.0f, 12.0f};
  EXPECT_DOUBLE_EQ(GlobalNorm(g.data(), 4), 13.0);
  EXPECT_DOUBLE_EQ(GlobalNorm(g.data(), 0), 0.0);
  // Longer than the eight partial sums, with a remainder.
  std::vector<float> ones(21, 2.0f);
  EXPECT_DOUBLE_EQ(GlobalNorm(ones.data(), 21), std::sqrt(84.0));
}

}  // namespace
}  // namespace multislice::compute
