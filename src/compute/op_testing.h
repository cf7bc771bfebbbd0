// Helpers the kernel tests of compute/ share: random inputs, a random linear
// functional of an output, and the check of an accumulated analytic
// gradient against central finite differences. Tests only.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace multislice::compute::testing {

inline constexpr double kStep = 1e-3;
// Backwards start from this value to check that they accumulate (+=).
inline constexpr float kGradSeed = 0.25f;

inline std::vector<float> Random(std::size_t n, std::uint32_t seed,
                                 float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// sum(out * r) in double: the random linear functional whose gradient with
// respect to out is r.
inline double Dot(const std::vector<float>& out, const std::vector<float>& r) {
  double sum = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) sum += double{out[i]} * r[i];
  return sum;
}

inline std::vector<float> Seeded(std::size_t n) {
  return std::vector<float>(n, kGradSeed);
}

// Compares grad - kGradSeed (the accumulated analytic gradient) with central
// differences of `f`, which reads `x` by reference.
inline void ExpectGradient(std::vector<float>& x,
                           const std::function<double()>& f,
                           const std::vector<float>& grad,
                           const std::string& what, double abs_tol = 2e-4,
                           double rel_tol = 2e-3) {
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

}  // namespace multislice::compute::testing
