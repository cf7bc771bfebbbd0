// Element-wise kernels against scalar references in double.
#include "compute/elementwise.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "common/isa_testing.h"

namespace multislice::compute {
namespace {

using SigmoidTest = IsaLevelTest;
using SigmoidGradTest = IsaLevelTest;
using SgdUpdateTest = IsaLevelTest;
using ConvertTest = IsaLevelTest;
using SumTest = IsaLevelTest;
using FillTest = IsaLevelTest;

double SigmoidRef(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// bf16 nearest to v (ties to even), without rounding through f32 first.
uint16_t RoundToBf16(double v) {
  uint16_t guess = bf16::FromFloat(static_cast<float>(v));
  uint16_t best = guess;
  double best_err = std::fabs(bf16::ToFloat(guess) - v);
  for (int delta : {-1, 1}) {
    uint16_t c = static_cast<uint16_t>(guess + delta);
    double err = std::fabs(bf16::ToFloat(c) - v);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

// How far apart two finite bf16 values of the same sign are, in ulps.
int Bf16UlpDistance(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t x) {
    return (x & 0x8000) ? -static_cast<int>(x & 0x7fff) : static_cast<int>(x);
  };
  return std::abs(ordered(a) - ordered(b));
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16::FromFloat(v[i]);
  return out;
}

std::vector<float> SigmoidInputs() {
  std::vector<float> x = {0.0f,   -0.0f,   1e-30f,  -1e-30f, 1e-8f,   -1e-8f,
                          0.5f,   -0.5f,   1.0f,    -1.0f,   15.9f,   -15.9f,
                          17.0f,  -17.0f,  30.0f,   -30.0f,  80.0f,   -80.0f,
                          -87.0f, -87.5f,  -88.0f,  -88.8f,  -89.0f,  -95.0f,
                          -100.f, -103.0f, -103.9f, -104.5f, -110.0f, 88.0f,
                          89.0f,  100.0f,  1e10f,   -1e10f,  FLT_MAX, -FLT_MAX};
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> wide(-110.0f, 40.0f);
  std::uniform_real_distribution<float> narrow(-8.0f, 8.0f);
  for (int i = 0; i < 400000; ++i) x.push_back(wide(rng));
  for (int i = 0; i < 400000; ++i) x.push_back(narrow(rng));
  return x;
}

TEST_P(SigmoidTest, F32IsWithinTwoUlpOfDouble) {
  std::vector<float> x = SigmoidInputs();
  std::vector<float> y(x.size());
  Sigmoid(DType::kF32, x.data(), y.data(), x.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double ref = SigmoidRef(x[i]);
    if (ref >= FLT_MIN) {
      double rel = std::fabs(y[i] - ref) / ref;
      worst = std::max(worst, rel);
      ASSERT_LE(rel, 2e-7) << "x=" << x[i] << " y=" << y[i] << " ref=" << ref;
    } else {
      // Subnormal results: a couple of the smallest steps.
      ASSERT_LE(std::fabs(y[i] - ref), 2 * std::ldexp(1.0, -149))
          << "x=" << x[i] << " y=" << y[i] << " ref=" << ref;
    }
  }
  std::printf("worst relative error of f32 sigmoid: %.3g\n", worst);
}

TEST_P(SigmoidTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {inf, -inf, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> y(x.size());
  Sigmoid(DType::kF32, x.data(), y.data(), x.size());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_TRUE(std::isnan(y[2]));
}

TEST_P(SigmoidTest, Bf16ExhaustiveRoundsCorrectlyAlmostAlways) {
  std::vector<uint16_t> x, y;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float v = bf16::ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(v)) continue;
    x.push_back(static_cast<uint16_t>(bits));
  }
  y.resize(x.size());
  Sigmoid(DType::kBF16, x.data(), y.data(), x.size());
  int off_by_one = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t expected = RoundToBf16(SigmoidRef(bf16::ToFloat(x[i])));
    int distance = Bf16UlpDistance(y[i], expected);
    ASSERT_LE(distance, 1) << "x=" << bf16::ToFloat(x[i]);
    off_by_one += distance;
  }
  // Only the f32 result lying right next to a bf16 rounding boundary can go
  // the other way.
  EXPECT_LT(off_by_one, static_cast<int>(x.size() / 1000)) << off_by_one;
}

TEST_P(SigmoidTest, EveryTailLengthAndInPlace) {
  for (size_t n = 0; n <= 40; ++n) {
    std::vector<float> x(n), y(n + 1, 7.0f);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) - 20.0f;
    Sigmoid(DType::kF32, x.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y[i], SigmoidRef(x[i]), 2e-7 * SigmoidRef(x[i]));
    }
    EXPECT_EQ(y[n], 7.0f) << "wrote past the end, n=" << n;
    std::vector<uint16_t> xb = ToBf16(x), yb(n + 1, 0x1234);
    Sigmoid(DType::kBF16, xb.data(), yb.data(), n);
    EXPECT_EQ(yb[n], 0x1234);
    Sigmoid(DType::kF32, x.data(), x.data(), n);  // in place
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(x[i], y[i]);
  }
}

TEST_P(SigmoidGradTest, AllTypeCombinations) {
  const size_t n = 1003;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist_dy(-2.0f, 2.0f);
  std::uniform_real_distribution<float> dist_y(0.0f, 1.0f);
  std::vector<float> dy(n), y(n);
  for (size_t i = 0; i < n; ++i) {
    dy[i] = dist_dy(rng);
    y[i] = dist_y(rng);
  }
  std::vector<uint16_t> dy16 = ToBf16(dy), y16 = ToBf16(y);
  for (DType in : {DType::kF32, DType::kBF16}) {
    for (DType out : {DType::kF32, DType::kBF16}) {
      std::vector<float> dx32(n);
      std::vector<uint16_t> dx16(n);
      void* dx = out == DType::kF32 ? static_cast<void*>(dx32.data())
                                    : static_cast<void*>(dx16.data());
      if (in == DType::kF32) {
        SigmoidGrad(in, dy.data(), y.data(), out, dx, n);
      } else {
        SigmoidGrad(in, dy16.data(), y16.data(), out, dx, n);
      }
      for (size_t i = 0; i < n; ++i) {
        double dyv = in == DType::kF32 ? dy[i] : bf16::ToFloat(dy16[i]);
        double yv = in == DType::kF32 ? y[i] : bf16::ToFloat(y16[i]);
        double ref = dyv * yv * (1.0 - yv);
        if (out == DType::kF32) {
          // Three f32 roundings.
          ASSERT_NEAR(dx32[i], ref, 2e-7 * std::fabs(ref) + 1e-38) << i;
        } else {
          ASSERT_LE(Bf16UlpDistance(dx16[i], RoundToBf16(ref)), 1) << i;
        }
      }
    }
  }
}

TEST_P(SgdUpdateTest, F32AndBf16) {
  const size_t n = 517;
  const float lr = 1e-2f;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = dist(rng);
    g[i] = dist(rng) * 10;
  }
  std::vector<float> p32 = p;
  SgdUpdate(DType::kF32, p32.data(), g.data(), lr, n);
  std::vector<uint16_t> p16 = ToBf16(p), g16 = ToBf16(g);
  std::vector<uint16_t> p16_before = p16;
  SgdUpdate(DType::kBF16, p16.data(), g16.data(), lr, n);
  for (size_t i = 0; i < n; ++i) {
    double ref = static_cast<double>(p[i]) - static_cast<double>(lr) * g[i];
    double scale = std::fabs(p[i]) + std::fabs(lr * g[i]);
    ASSERT_NEAR(p32[i], ref, 1.2e-7 * scale) << i;
    double ref16 = bf16::ToFloat(p16_before[i]) -
                   static_cast<double>(lr) * bf16::ToFloat(g16[i]);
    ASSERT_LE(Bf16UlpDistance(p16[i], RoundToBf16(ref16)), 1) << i;
  }
}

TEST_P(ConvertTest, F32ToBf16MatchesScalarRoundingOnAnyBits) {
  std::mt19937 rng(11);
  std::vector<float> x;
  for (int i = 0; i < 1000000; ++i)
    x.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  // Ties, carries into the exponent, infinities, NaNs, subnormals.
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3fffffffu, 0x7f7fffffu,
                        0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                        0xffffffffu, 0x00000001u, 0x807fffffu, 0x00008000u}) {
    x.push_back(std::bit_cast<float>(bits));
  }
  std::vector<uint16_t> y(x.size());
  Convert(DType::kF32, x.data(), DType::kBF16, y.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(y[i], bf16::FromFloat(x[i]))
        << "bits 0x" << std::hex << std::bit_cast<uint32_t>(x[i]);
  }
}

TEST_P(ConvertTest, Bf16ToF32IsExactAndSameTypeCopies) {
  std::vector<uint16_t> x(0x10000);
  for (uint32_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i);
  std::vector<float> y(x.size());
  Convert(DType::kBF16, x.data(), DType::kF32, y.data(), x.size());
  for (uint32_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), i << 16);
  }
  std::vector<float> z(y.size());
  Convert(DType::kF32, y.data(), DType::kF32, z.data(), y.size());
  EXPECT_EQ(0, std::memcmp(y.data(), z.data(), y.size() * sizeof(float)));
  std::vector<uint16_t> w(x.size());
  Convert(DType::kBF16, x.data(), DType::kBF16, w.data(), x.size());
  EXPECT_EQ(x, w);
}

TEST_P(SumTest, MatchesDoubleAndIsDeterministic) {
  for (size_t n : {0, 1, 15, 16, 17, 1000, 123457}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_real_distribution<float> dist(-1.0f, 3.0f);
    std::vector<float> x(n);
    double ref = 0, abs_ref = 0;
    for (float& v : x) {
      v = dist(rng);
      ref += v;
      abs_ref += std::fabs(v);
    }
    double s = Sum(DType::kF32, x.data(), n);
    EXPECT_NEAR(s, ref, 1e-12 * abs_ref + 1e-300) << n;
    EXPECT_EQ(s, Sum(DType::kF32, x.data(), n));
    std::vector<uint16_t> xb = ToBf16(x);
    double ref16 = 0;
    for (uint16_t b : xb) ref16 += bf16::ToFloat(b);
    EXPECT_NEAR(Sum(DType::kBF16, xb.data(), n), ref16,
                1e-12 * abs_ref + 1e-300);
  }
  // Integers are summed exactly in f64.
  std::vector<float> ints(100000);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<float>(i);
  EXPECT_EQ(Sum(DType::kF32, ints.data(), ints.size()), 4999950000.0);
}

TEST_P(FillTest, F32AndRoundedBf16) {
  std::vector<float> x(37, 1.0f);
  Fill(DType::kF32, x.data(), 0.3f, 36);
  for (int i = 0; i < 36; ++i) EXPECT_EQ(x[i], 0.3f);
  EXPECT_EQ(x[36], 1.0f);
  std::vector<uint16_t> y(37, 0);
  Fill(DType::kBF16, y.data(), 0.3f, 36);
  for (int i = 0; i < 36; ++i) EXPECT_EQ(y[i], bf16::FromFloat(0.3f));
  EXPECT_EQ(y[36], 0);
}

MS_INSTANTIATE_ISA_LEVELS(SigmoidTest);
MS_INSTANTIATE_ISA_LEVELS(SigmoidGradTest);
MS_INSTANTIATE_ISA_LEVELS(SgdUpdateTest);
MS_INSTANTIATE_ISA_LEVELS(ConvertTest);
MS_INSTANTIATE_ISA_LEVELS(SumTest);
MS_INSTANTIATE_ISA_LEVELS(FillTest);

}  // namespace
}  // namespace multislice::compute
