#include "compute/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

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

// The 16-wide loop and the scalar remainder give the same bits: the whole
// array at once equals element-by-element calls (n = 1 takes the scalar
// path), with and without the decay mask, and tracks the double reference.
TEST(AdamWTest, VectorLoopMatchesScalarBitForBit) {
  constexpr int kN = 53;
  AdamWOptions o;
  o.lr = 0.02f;
  std::vector<float> init(kN);
  std::vector<uint8_t> mask(kN);
  for (int i = 0; i < kN; ++i) {
    init[i] = 0.1f * static_cast<float>((i * 37) % 23) - 1.0f;
    mask[i] = static_cast<uint8_t>((i * 7) % 3 != 0);
  }
  for (const bool use_mask : {false, true}) {
    std::vector<float> p = init, m(kN, 0.0f), v(kN, 0.0f);
    std::vector<float> q = init, mq(kN, 0.0f), vq(kN, 0.0f);
    std::vector<ScalarAdamW> ref;
    for (float x : init) ref.push_back({x});
    for (int t = 1; t <= 3; ++t) {
      std::vector<float> g(kN);
      for (int i = 0; i < kN; ++i) {
        g[i] = 0.05f * static_cast<float>((i * 13 + t * 5) % 17) - 0.4f;
      }
      AdamWUpdate(p.data(), g.data(), m.data(), v.data(), kN, o, t,
                  use_mask ? mask.data() : nullptr);
      for (int i = 0; i < kN; ++i) {
        AdamWUpdate(&q[i], &g[i], &mq[i], &vq[i], 1, o, t,
                    use_mask ? &mask[i] : nullptr);
        ref[i].Step(g[i], o, t, !use_mask || mask[i] != 0);
      }
    }
    for (int i = 0; i < kN; ++i) {
      EXPECT_EQ(p[i], q[i]) << "i=" << i << " mask=" << use_mask;
      EXPECT_EQ(m[i], mq[i]);
      EXPECT_EQ(v[i], vq[i]);
      EXPECT_NEAR(p[i], ref[i].p, 1e-6);
    }
  }
}

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
