// Tests of gpt_ops: every backward against central finite differences of its
// forward (in double, on a small problem), every forward against a direct
// reference, and the structural properties (softmax rows sum to one, the
// causal mask, accumulation into gradients).
#include "model/gpt_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace multislice::model::gpt {
namespace {

constexpr int kB = 2;
constexpr int kT = 3;
constexpr int kC = 8;
constexpr int kNH = 2;
constexpr int kV = 11;
constexpr int kN = kB * kT;
constexpr double kStep = 1e-3;
// Backwards start from this value to check that they accumulate (+=).
constexpr float kGradSeed = 0.25f;

std::vector<float> Random(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                          float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// sum(out * r) in double: the random linear functional whose gradient with
// respect to out is r.
double Dot(const std::vector<float>& out, const std::vector<float>& r) {
  double sum = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) sum += double{out[i]} * r[i];
  return sum;
}

std::vector<float> Seeded(std::size_t n) {
  return std::vector<float>(n, kGradSeed);
}

// Compares grad - kGradSeed (the accumulated analytic gradient) with central
// differences of `functional`, which reads `x` by reference.
void ExpectGradient(std::vector<float>& x, const std::function<double()>& f,
                    const std::vector<float>& grad, const std::string& what,
                    double abs_tol = 2e-4, double rel_tol = 2e-3) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    const float plus = static_cast<float>(saved + kStep);
    const float minus = static_cast<float>(saved - kStep);
    x[i] = plus;
    const double f_plus = f();
    x[i] = minus;
    const double f_minus = f();
    x[i] = saved;
    const double numeric = (f_plus - f_minus) / (double{plus} - double{minus});
    const double analytic = double{grad[i]} - kGradSeed;
    EXPECT_NEAR(analytic, numeric, abs_tol + rel_tol * std::fabs(numeric))
        << what << "[" << i << "]";
  }
}

TEST(GptOpsTest, EncoderForwardAddsTokenAndPositionRows) {
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

TEST(GptOpsTest, EncoderBackwardMatchesFiniteDifferences) {
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

TEST(GptOpsTest, LayerNormForwardMatchesReference) {
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

TEST(GptOpsTest, LayerNormBackwardMatchesFiniteDifferences) {
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

TEST(GptOpsTest, GeluForwardMatchesReference) {
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

TEST(GptOpsTest, GeluBackwardMatchesFiniteDifferences) {
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

struct AttentionBuffers {
  std::vector<float> out = std::vector<float>(kN * kC);
  std::vector<float> preatt = std::vector<float>(kB * kNH * kT * kT);
  std::vector<float> att = std::vector<float>(kB * kNH * kT * kT);

  void Forward(const std::vector<float>& qkv) {
    AttentionForward(out.data(), preatt.data(), att.data(), qkv.data(), kB, kT,
                     kC, kNH);
  }
};

TEST(GptOpsTest, AttentionForwardMatchesReference) {
  const auto qkv = Random(kN * 3 * kC, 10, -2.0f, 2.0f);
  AttentionBuffers buf;
  buf.Forward(qkv);
  const int hs = kC / kNH;
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < kNH; ++h) {
      for (int t = 0; t < kT; ++t) {
        const float* a = &buf.att[((b * kNH + h) * kT + t) * kT];
        // Reference softmax over the causal prefix, in double.
        std::vector<double> w(t + 1);
        double denom = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0.0;
          for (int i = 0; i < hs; ++i) {
            dot += double{qkv[(b * kT + t) * 3 * kC + h * hs + i]} *
                   qkv[(b * kT + t2) * 3 * kC + kC + h * hs + i];
          }
          w[t2] = std::exp(dot / std::sqrt(double{hs}));
          denom += w[t2];
        }
        double row_sum = 0.0;
        for (int t2 = 0; t2 < kT; ++t2) {
          row_sum += a[t2];
          if (t2 > t) {
            EXPECT_EQ(a[t2], 0.0f);
          } else {
            EXPECT_NEAR(a[t2], w[t2] / denom, 1e-6);
          }
        }
        EXPECT_NEAR(row_sum, 1.0, 1e-6);
        for (int i = 0; i < hs; ++i) {
          double o = 0.0;
          for (int t2 = 0; t2 <= t; ++t2) {
            o += w[t2] / denom *
                 qkv[(b * kT + t2) * 3 * kC + 2 * kC + h * hs + i];
          }
          EXPECT_NEAR(buf.out[(b * kT + t) * kC + h * hs + i], o, 1e-5);
        }
      }
    }
  }
}

TEST(GptOpsTest, AttentionIsCausal) {
  const auto qkv = Random(kN * 3 * kC, 11, -2.0f, 2.0f);
  AttentionBuffers base;
  base.Forward(qkv);
  // Changing any input at position t' leaves outputs at t < t' untouched.
  for (int b = 0; b < kB; ++b) {
    for (int later = 1; later < kT; ++later) {
      auto changed = qkv;
      for (int j = 0; j < 3 * kC; ++j)
        changed[(b * kT + later) * 3 * kC + j] += 0.5f;
      AttentionBuffers buf;
      buf.Forward(changed);
      for (int t = 0; t < later; ++t) {
        for (int i = 0; i < kC; ++i) {
          EXPECT_EQ(buf.out[(b * kT + t) * kC + i],
                    base.out[(b * kT + t) * kC + i]);
        }
      }
      bool later_changed = false;
      for (int i = 0; i < kC; ++i) {
        later_changed |= buf.out[(b * kT + later) * kC + i] !=
                         base.out[(b * kT + later) * kC + i];
      }
      EXPECT_TRUE(later_changed);
    }
  }
}

TEST(GptOpsTest, AttentionBackwardMatchesFiniteDifferences) {
  auto qkv = Random(kN * 3 * kC, 12, -2.0f, 2.0f);
  const auto r = Random(kN * kC, 13);
  AttentionBuffers buf;
  auto f = [&] {
    buf.Forward(qkv);
    return Dot(buf.out, r);
  };
  f();
  auto dqkv = Seeded(qkv.size());
  std::vector<float> dpreatt(buf.preatt.size()), datt(buf.att.size());
  AttentionBackward(dqkv.data(), dpreatt.data(), datt.data(), r.data(),
                    qkv.data(), buf.att.data(), kB, kT, kC, kNH);
  ExpectGradient(qkv, f, dqkv, "dqkv");
}

TEST(GptOpsTest, ResidualForwardAndBackward) {
  auto a = Random(kN * kC, 14);
  auto b = Random(kN * kC, 15);
  const auto r = Random(kN * kC, 16);
  std::vector<float> out(a.size());
  const auto n = static_cast<std::int64_t>(a.size());
  auto f = [&] {
    ResidualForward(out.data(), a.data(), b.data(), n);
    return Dot(out, r);
  };
  f();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  auto da = Seeded(a.size());
  auto db = Seeded(b.size());
  ResidualBackward(da.data(), db.data(), r.data(), n);
  ExpectGradient(a, f, da, "da");
  ExpectGradient(b, f, db, "db");
}

const std::vector<std::int32_t> kTargets = {0, 10, 4, 4, 7, 1};

TEST(GptOpsTest, CrossEntropyForwardIsNegativeLogProbOfTarget) {
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

TEST(GptOpsTest, CrossEntropyForwardIsStableForLargeLogits) {
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

TEST(GptOpsTest, CrossEntropySoftmaxBackwardMatchesFiniteDifferences) {
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
}

}  // namespace
}  // namespace multislice::model::gpt
