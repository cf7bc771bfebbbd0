// Tests of gpt_ops: every backward against central finite differences of its
// forward (in double, on a small problem), every forward against a direct
// reference, and the structural properties (softmax rows sum to one, the
// causal mask, accumulation into gradients).
#include "compute/gpt_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/isa_testing.h"
#include "compute/elementwise.h"
#include "compute/op_testing.h"

namespace multislice::compute::gpt {
namespace {

using GptOpsTest = IsaLevelTest;
using namespace compute::testing;  // NOLINT

constexpr int kB = 2;
constexpr int kT = 3;
constexpr int kC = 8;
constexpr int kV = 11;
constexpr int kN = kB * kT;
TEST_P(GptOpsTest, EncoderForwardAddsTokenAndPositionRows) {
  const std::vector<std::int32_t> tokens = {3, 0, 3, 10, 5, 3};
  const auto wte = Random(kV * kC, 1);
  const auto wpe = Random(kT * kC, 2);
  std::vector<float> out(kN * kC);
  EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT, kC);
  for (int b = 0; b < kB; ++b) {
    for (int t = 0; t < kT; ++t) {
      for (int i = 0; i < kC; ++i) {
        EXPECT_EQ(out[(b * kT + t) * kC + i],
                  wte[tokens[b * kT + t] * kC + i] + wpe[t * kC + i]);
      }
    }
  }
}

TEST_P(GptOpsTest, EncoderBackwardMatchesFiniteDifferences) {
  // Token 3 repeats, so its gradient row must sum several contributions.
  const std::vector<std::int32_t> tokens = {3, 0, 3, 10, 5, 3};
  auto wte = Random(kV * kC, 1);
  auto wpe = Random(kT * kC, 2);
  const auto r = Random(kN * kC, 3);
  std::vector<float> out(kN * kC);
  auto f = [&] {
    EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), kB, kT,
                   kC);
    return Dot(out, r);
  };
  auto dwte = Seeded(wte.size());
  auto dwpe = Seeded(wpe.size());
  EncoderBackward(dwte.data(), dwpe.data(), r.data(), tokens.data(), kB, kT,
                  kC);
  ExpectGradient(wte, f, dwte, "dwte");
  ExpectGradient(wpe, f, dwpe, "dwpe");
}

TEST_P(GptOpsTest, LayerNormForwardMatchesReference) {
  const auto inp = Random(kN * kC, 4, -3.0f, 3.0f);
  const auto weight = Random(kC, 5);
  const auto bias = Random(kC, 6);
  std::vector<float> out(kN * kC), mean(kN), rstd(kN);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(),
                   weight.data(), bias.data(), kN, kC);
  for (int r = 0; r < kN; ++r) {
    double mu = 0.0;
    for (int i = 0; i < kC; ++i) mu += inp[r * kC + i];
    mu /= kC;
    double var = 0.0;
    for (int i = 0; i < kC; ++i) {
      var += (inp[r * kC + i] - mu) * (inp[r * kC + i] - mu);
    }
    var /= kC;
    const double s = 1.0 / std::sqrt(var + 1e-5);
    EXPECT_NEAR(mean[r], mu, 1e-6);
    EXPECT_NEAR(rstd[r], s, 1e-5 * s);
    for (int i = 0; i < kC; ++i) {
      EXPECT_NEAR(out[r * kC + i],
                  (inp[r * kC + i] - mu) * s * weight[i] + bias[i], 1e-5);
    }
  }
}

TEST_P(GptOpsTest, LayerNormBackwardMatchesFiniteDifferences) {
  auto inp = Random(kN * kC, 4, -3.0f, 3.0f);
  auto weight = Random(kC, 5);
  auto bias = Random(kC, 6);
  const auto r = Random(kN * kC, 7);
  std::vector<float> out(kN * kC), mean(kN), rstd(kN);
  auto f = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(),
                     weight.data(), bias.data(), kN, kC);
    return Dot(out, r);
  };
  f();
  auto dinp = Seeded(inp.size());
  auto dweight = Seeded(weight.size());
  auto dbias = Seeded(bias.size());
  LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), r.data(),
                    inp.data(), weight.data(), mean.data(), rstd.data(), kN,
                    kC);
  ExpectGradient(inp, f, dinp, "dinp");
  ExpectGradient(weight, f, dweight, "dweight");
  ExpectGradient(bias, f, dbias, "dbias");
}

TEST_P(GptOpsTest, GeluForwardMatchesReference) {
  const auto inp = Random(64, 8, -5.0f, 5.0f);
  std::vector<float> out(inp.size());
  GeluForward(out.data(), inp.data(), static_cast<std::int64_t>(inp.size()));
  const double pi = std::acos(-1.0);
  for (std::size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i];
    const double tanh_form =
        0.5 * x *
        (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(out[i], tanh_form, 1e-5);
    // The approximation stays close to the exact erf form.
    const double erf_form = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    EXPECT_NEAR(out[i], erf_form, 2e-3);
  }
}

TEST_P(GptOpsTest, GeluBackwardMatchesFiniteDifferences) {
  auto inp = Random(64, 8, -5.0f, 5.0f);
  const auto r = Random(inp.size(), 9);
  std::vector<float> out(inp.size());
  const auto n = static_cast<std::int64_t>(inp.size());
  auto f = [&] {
    GeluForward(out.data(), inp.data(), n);
    return Dot(out, r);
  };
  auto dinp = Seeded(inp.size());
  GeluBackward(dinp.data(), inp.data(), r.data(), n);
  ExpectGradient(inp, f, dinp, "dinp");
}

const std::vector<std::int32_t> kTargets = {0, 10, 4, 4, 7, 1};

TEST_P(GptOpsTest, CrossEntropyForwardIsNegativeLogProbOfTarget) {
  const auto logits = Random(kN * kV, 17, -4.0f, 4.0f);
  std::vector<float> losses(kN), probs(kN * kV);
  CrossEntropyForward(losses.data(), probs.data(), logits.data(),
                      kTargets.data(), kN, kV);
  for (int r = 0; r < kN; ++r) {
    double denom = 0.0;
    double row_sum = 0.0;
    for (int v = 0; v < kV; ++v) {
      denom += std::exp(double{logits[r * kV + v]});
      row_sum += probs[r * kV + v];
    }
    EXPECT_NEAR(row_sum, 1.0, 1e-6);
    for (int v = 0; v < kV; ++v) {
      EXPECT_NEAR(probs[r * kV + v],
                  std::exp(double{logits[r * kV + v]}) / denom, 1e-6);
    }
    EXPECT_NEAR(losses[r], -std::log(probs[r * kV + kTargets[r]]), 1e-5);
  }
}

TEST_P(GptOpsTest, CrossEntropyForwardIsStableForLargeLogits) {
  auto logits = Random(kN * kV, 18, -4.0f, 4.0f);
  std::vector<float> losses(kN), probs(kN * kV);
  CrossEntropyForward(losses.data(), probs.data(), logits.data(),
                      kTargets.data(), kN, kV);
  // A shift leaves softmax unchanged; exp(1000) would overflow a float.
  for (float& z : logits) z += 1000.0f;
  std::vector<float> shifted_losses(kN), shifted_probs(kN * kV);
  CrossEntropyForward(shifted_losses.data(), shifted_probs.data(),
                      logits.data(), kTargets.data(), kN, kV);
  for (int r = 0; r < kN; ++r) {
    ASSERT_TRUE(std::isfinite(shifted_losses[r]));
    EXPECT_NEAR(shifted_losses[r], losses[r], 1e-3);
  }
  for (int i = 0; i < kN * kV; ++i) {
    EXPECT_NEAR(shifted_probs[i], probs[i], 1e-4);
  }
}

TEST_P(GptOpsTest, CrossEntropySoftmaxBackwardMatchesFiniteDifferences) {
  auto logits = Random(kN * kV, 19, -4.0f, 4.0f);
  const auto r = Random(kN, 20);
  std::vector<float> losses(kN), probs(kN * kV);
  auto f = [&] {
    CrossEntropyForward(losses.data(), probs.data(), logits.data(),
                        kTargets.data(), kN, kV);
    return Dot(losses, r);
  };
  f();
  auto dlogits = Seeded(logits.size());
  CrossEntropySoftmaxBackward(dlogits.data(), r.data(), probs.data(),
                              kTargets.data(), kN, kV);
  ExpectGradient(logits, f, dlogits, "dlogits");
  // The writing form gives the accumulated one's gradient, whatever the
  // buffer held.
  std::vector<float> written(logits.size(), std::nanf(""));
  f();
  CrossEntropySoftmaxGrad(written.data(), r.data(), probs.data(),
                          kTargets.data(), kN, kV);
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_FLOAT_EQ(written[i] + kGradSeed, dlogits[i]) << i;
  }
}

// The kernels run 16 lanes at a time with a masked tail: sizes with both
// full vectors and a tail, checked against double references and finite
// differences.
TEST_P(GptOpsTest, VectorPathsMatchReferences) {
  constexpr int kRows = 3, kWide = 40;
  auto inp = Random(kRows * kWide, 30, -3.0f, 3.0f);
  auto weight = Random(kWide, 31);
  auto bias = Random(kWide, 32);
  const auto r = Random(kRows * kWide, 33);
  std::vector<float> out(inp.size()), mean(kRows), rstd(kRows);
  auto f = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(),
                     weight.data(), bias.data(), kRows, kWide);
    return Dot(out, r);
  };
  f();
  for (int row = 0; row < kRows; ++row) {
    double mu = 0.0, var = 0.0;
    for (int i = 0; i < kWide; ++i) mu += inp[row * kWide + i];
    mu /= kWide;
    for (int i = 0; i < kWide; ++i) {
      var += (inp[row * kWide + i] - mu) * (inp[row * kWide + i] - mu);
    }
    const double s = 1.0 / std::sqrt(var / kWide + 1e-5);
    for (int i = 0; i < kWide; ++i) {
      EXPECT_NEAR(out[row * kWide + i],
                  (inp[row * kWide + i] - mu) * s * weight[i] + bias[i], 1e-5);
    }
  }
  auto dinp = Seeded(inp.size());
  auto dweight = Seeded(weight.size());
  auto dbias = Seeded(bias.size());
  LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), r.data(),
                    inp.data(), weight.data(), mean.data(), rstd.data(), kRows,
                    kWide);
  // Central differences of the functional through LayerNorm in double: on
  // these wide rows of values up to 3, the f32 forward's own rounding
  // (without FMA, on the baseline level) is as large as the tolerance.
  auto exact = [&] {
    double sum = 0.0;
    for (int row = 0; row < kRows; ++row) {
      double mu = 0.0, var = 0.0;
      for (int i = 0; i < kWide; ++i) mu += inp[row * kWide + i];
      mu /= kWide;
      for (int i = 0; i < kWide; ++i) {
        const double d = inp[row * kWide + i] - mu;
        var += d * d;
      }
      const double s = 1.0 / std::sqrt(var / kWide + 1e-5);
      for (int i = 0; i < kWide; ++i) {
        const double y = (inp[row * kWide + i] - mu) * s * weight[i] + bias[i];
        sum += y * r[row * kWide + i];
      }
    }
    return sum;
  };
  ExpectGradient(inp, exact, dinp, "layernorm dinp");
  ExpectGradient(weight, exact, dweight, "layernorm dweight");
  ExpectGradient(bias, exact, dbias, "layernorm dbias");

  // Cross-entropy over 37 classes, with a large shift on one row.
  constexpr int kClasses = 37;
  auto logits = Random(kRows * kClasses, 34, -6.0f, 6.0f);
  for (int v = 0; v < kClasses; ++v) logits[kClasses + v] += 500.0f;
  const std::vector<std::int32_t> targets = {36, 0, 17};
  std::vector<float> losses(kRows), probs(logits.size());
  CrossEntropyForward(losses.data(), probs.data(), logits.data(),
                      targets.data(), kRows, kClasses);
  for (int row = 0; row < kRows; ++row) {
    double mx = -INFINITY;
    for (int v = 0; v < kClasses; ++v) {
      mx = std::max(mx, double{logits[row * kClasses + v]});
    }
    double denom = 0.0;
    for (int v = 0; v < kClasses; ++v) {
      denom += std::exp(logits[row * kClasses + v] - mx);
    }
    for (int v = 0; v < kClasses; ++v) {
      const double want = std::exp(logits[row * kClasses + v] - mx) / denom;
      EXPECT_NEAR(probs[row * kClasses + v], want, 1e-6 + 1e-5 * want);
    }
    EXPECT_NEAR(losses[row],
                std::log(denom) - (logits[row * kClasses + targets[row]] - mx),
                1e-5);
  }
  const auto rl = Random(kRows, 35);
  auto ce = [&] {
    CrossEntropyForward(losses.data(), probs.data(), logits.data(),
                        targets.data(), kRows, kClasses);
    return Dot(losses, rl);
  };
  ce();
  auto dlogits = Seeded(logits.size());
  CrossEntropySoftmaxBackward(dlogits.data(), rl.data(), probs.data(),
                              targets.data(), kRows, kClasses);
  // The shifted row against the formula (its finite differences would be
  // swamped by the ~3e-5 spacing of floats near 500).
  for (int v = 0; v < kClasses; ++v) {
    EXPECT_NEAR(dlogits[kClasses + v] - kGradSeed,
                rl[1] * (probs[kClasses + v] - (v == targets[1] ? 1.0 : 0.0)),
                1e-6);
  }

  // The bias gradient (column sums, accumulated).
  std::vector<float> col(33, 1.0f);
  const auto m = Random(2 * 33, 38);
  BiasBackward(col.data(), m.data(), 2, 33);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(col[i], (1.0f + m[i]) + m[33 + i]);
}

// GELU over a wide range (tiny, ordinary, large and huge inputs, lengths
// with a tail) against double, to float precision. The reference uses the
// identity 0.5 x (1 + tanh u) = x / (1 + exp(-2u)), which, unlike 1 + tanh u,
// keeps its relative accuracy for negative x (where the result is tiny).
TEST_P(GptOpsTest, GeluIsAccurateOverWideRange) {
  std::vector<float> inp;
  for (float x : {0.0f, 1e-30f, -1e-30f, 1e-8f, -1e-8f, 1e-3f, -1e-3f, 30.0f,
                  -30.0f, 1e6f, -1e6f, 1e20f, -1e20f}) {
    inp.push_back(x);
  }
  for (int i = 0; i <= 200; ++i) inp.push_back(-10.0f + 0.1f * i);
  std::vector<float> out(inp.size());
  const auto n = static_cast<std::int64_t>(inp.size());
  GeluForward(out.data(), inp.data(), n);
  const double k = std::sqrt(2.0 / std::acos(-1.0));
  for (std::size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i];
    const double u = k * (x + 0.044715 * x * x * x);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
    const double y = x * s;
    // Rounding u to float alone moves exp(-2u) by ~1e-7 |2u| relative.
    EXPECT_NEAR(out[i], y, 1e-37 + 1e-6 * (1.0 + std::fabs(u)) * std::fabs(y))
        << "x=" << x;
    const double du = k * (1.0 + 3.0 * 0.044715 * x * x);
    const double dy = s + x * 2.0 * s * (1.0 - s) * du;
    std::vector<float> dinp = {0.5f}, one = {1.0f};
    GeluBackward(dinp.data(), &inp[i], one.data(), 1);
    ASSERT_TRUE(std::isfinite(dinp[0])) << "x=" << x;
    EXPECT_NEAR(dinp[0] - 0.5, dy, 1e-6 + 1e-5 * std::fabs(dy)) << "x=" << x;
  }
  // The whole array at once takes the vector path and gives the same values.
  std::vector<float> dinp(inp.size(), 0.0f), ones(inp.size(), 1.0f);
  GeluBackward(dinp.data(), inp.data(), ones.data(), n);
  for (std::size_t i = 0; i < inp.size(); ++i) {
    std::vector<float> one_grad = {0.0f}, one = {1.0f};
    GeluBackward(one_grad.data(), &inp[i], one.data(), 1);
    EXPECT_EQ(dinp[i], one_grad[0]) << "x=" << inp[i];
  }
}

// ToBf16 rounds as compute::Convert does (nearest even, NaN kept a NaN) for
// every non-subnormal value, at lengths with a tail; subnormals give a value
// no larger in magnitude than the smallest normal.
TEST_P(GptOpsTest, ToBf16MatchesConvert) {
  std::vector<float> x = Random(100, 50, -1e3f, 1e3f);
  for (std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu,
                             0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u,
                             0x00800000u, 0x80000000u, 0x0u}) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  for (const std::size_t n :
       {x.size(), std::size_t{37}, std::size_t{16}, std::size_t{5}}) {
    std::vector<std::uint16_t> got(n, 0xdead), want(n), guard(n + 3, 0xbeef);
    ToBf16(x.data(), got.data(), static_cast<std::int64_t>(n));
    compute::Convert(DType::kF32, x.data(), DType::kBF16, want.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(got[i], want[i]) << "n=" << n << " i=" << i << " x=" << x[i];
    }
    // Nothing past n is written.
    ToBf16(x.data(), guard.data(), static_cast<std::int64_t>(n));
    for (std::size_t i = n; i < guard.size(); ++i) EXPECT_EQ(guard[i], 0xbeef);
  }
  const float subnormal = 1e-40f;
  std::uint16_t h = 0xffff;
  ToBf16(&subnormal, &h, 1);
  EXPECT_LE(h & 0x7fffu, 0x0080u);
}

// The fused bf16 forms give the plain kernels' values, and their bf16
// copies round as compute::Convert does.
// The forward that keeps GELU'(x) in x gives GeluForward's values (and their
// bf16 rounding) and GeluBackward's derivative, bit for bit, with and without
// each output, over a tail length and a multiple of 16.
TEST_P(GptOpsTest, GeluForwardSaveGradMatchesThePlainForms) {
  for (const std::size_t n : {std::size_t{45}, std::size_t{64}}) {
    const auto x = Random(n, 60, -6.0f, 6.0f);
    const auto len = static_cast<std::int64_t>(n);
    std::vector<float> y(n), one(n, 1.0f), grad(n, 0.0f);
    std::vector<std::uint16_t> want16(n);
    GeluForward(y.data(), x.data(), len);
    GeluBackward(grad.data(), x.data(), one.data(), len);
    compute::Convert(DType::kF32, y.data(), DType::kBF16, want16.data(), n);
    std::vector<float> both = x, f32_only = x, bf16_only = x, y_both(n),
                       y_f32(n);
    std::vector<std::uint16_t> y16_both(n), y16_only(n);
    GeluForwardSaveGrad(both.data(), y_both.data(), y16_both.data(), len);
    GeluForwardSaveGrad(f32_only.data(), y_f32.data(), nullptr, len);
    GeluForwardSaveGrad(bf16_only.data(), nullptr, y16_only.data(), len);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(y_both[i], y[i]) << i;
      EXPECT_EQ(y_f32[i], y[i]) << i;
      EXPECT_EQ(y16_both[i], want16[i]) << i;
      EXPECT_EQ(y16_only[i], want16[i]) << i;
      EXPECT_EQ(both[i], grad[i]) << "GELU'(x) at " << i;
      EXPECT_EQ(f32_only[i], grad[i]) << i;
      EXPECT_EQ(bf16_only[i], grad[i]) << i;
    }
  }
}

MS_INSTANTIATE_ISA_LEVELS(GptOpsTest);

}  // namespace
}  // namespace multislice::compute::gpt
