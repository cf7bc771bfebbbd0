// ShardOptimizer against the formulas written out as a plain loop: the mean
// of a summed gradient, clipped to the threshold by the global norm, the
// schedule's learning rate, AdamW with bias corrections, and the weight
// decay mask read at the shard's offset.
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace multislice::train {
namespace {

TEST(ShardOptimizerTest, ClippedMeanAdamWStepMatchesThePlainLoop) {
  TrainConfig config;
  config.steps = 10;
  config.warmup_steps = 2;
  config.learning_rate = 1e-2;
  config.gradient_clipping_threshold = 0.5;
  const int devices = 4;
  const int64_t begin = 3, n = 6;
  std::vector<uint8_t> mask = {1, 1, 1, 0, 1, 0, 1, 1, 0, 1};  // whole buffer
  ShardOptimizer optimizer(config, mask, begin, devices);

  DeviceBuffers b;
  b.shard = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  b.adam_m.assign(n, 0.0f);
  b.adam_v.assign(n, 0.0f);
  b.grads = {4.0f, -2.0f, 1.0f, 3.0f, -1.0f, 0.5f};  // the sum over devices
  b.gradient = b.grads.data();
  const std::vector<float> p0 = b.shard, g = b.grads;

  double sumsq = 0;
  for (float x : g) sumsq += static_cast<double>(x) * x;
  const double norm = optimizer.MeanNorm(sumsq);
  EXPECT_DOUBLE_EQ(norm, std::sqrt(sumsq) / devices);
  ASSERT_GT(norm, 0.5);  // the clip applies
  const int64_t step = 3;
  const double lr = optimizer.Apply(step, norm, b);
  // Step 3 of 10, warm-up 2: the cosine from 1e-2 to 1e-2 * final fraction.
  const double progress = (3.0 - 2.0) / (10.0 - 2.0);
  const double frac = config.cosine_learning_rate_final_fraction;
  const double want_lr =
      1e-2 * (frac + (1 - frac) * 0.5 * (1 + std::cos(M_PI * progress)));
  EXPECT_NEAR(lr, want_lr, 1e-12);

  const float scale = static_cast<float>(0.5 / norm) * (1.0f / devices);
  const float b1 = static_cast<float>(config.adam_b1),
              b2 = static_cast<float>(config.adam_b2),
              eps = static_cast<float>(config.adam_eps),
              wd = static_cast<float>(config.adam_weight_decay);
  const double c1 = 1 - std::pow(static_cast<double>(b1), step),
               c2 = 1 - std::pow(static_cast<double>(b2), step);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float m = (1 - b1) * gi, v = (1 - b2) * gi * gi;
    const float mhat = m / static_cast<float>(c1);
    const float vhat = v / static_cast<float>(c2);
    const float decay = mask[begin + i] ? wd : 0.0f;
    const float want =
        p0[i] - static_cast<float>(lr) *
                    (mhat / (std::sqrt(vhat) + eps) + decay * p0[i]);
    EXPECT_NEAR(b.shard[i], want, 1e-6f * std::fabs(want) + 1e-7f)
        << "entry " << i;
    EXPECT_FLOAT_EQ(b.adam_m[i], m) << "entry " << i;
  }
}

}  // namespace
}  // namespace multislice::train
