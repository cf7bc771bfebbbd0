// AdamW: an AVX-512 loop where the CPU has it (chosen at run time), giving
// exactly the scalar loop's values; the gradient norm in double with eight
// partial sums.
#include "compute/adamw.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace multislice::compute {

namespace {

#define MS_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

struct AdamWStep {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float correction1, correction2, lr, eps, weight_decay;
};

// Elements [begin, end), one at a time.
void AdamWScalar(const AdamWStep& s, float* params, const float* grads,
                 float* m, float* v, std::int64_t begin, std::int64_t end,
                 const std::uint8_t* decay_mask) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float g = grads[i];
    m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
    v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    const float m_hat = m[i] / s.correction1;
    const float v_hat = v[i] / s.correction2;
    const bool decay = decay_mask == nullptr || decay_mask[i] != 0;
    const float wd = decay ? s.weight_decay : 0.0f;
    params[i] -= s.lr * (m_hat / (std::sqrt(v_hat) + s.eps) + wd * params[i]);
  }
}

// The same 16 elements at a time with AVX-512 (GCC does not vectorise the
// scalar loop: sqrt may set errno). Separate multiplies and adds and
// correctly rounded division and sqrt, so every element gets exactly the
// scalar loop's value. Returns how many elements it did (a multiple of 16).
// Multiply, add and subtract that GCC does not contract into FMAs (it does
// contract the plain _mm512_add_ps(_mm512_mul_ps(...)) forms), so that the
// vector loop rounds exactly as the scalar one.
#define MS_AVX512 __attribute__((target("avx512f"), always_inline)) inline
MS_AVX512 __m512 Mul(__m512 a, __m512 b) {
  return _mm512_maskz_mul_round_ps(0xffff, a, b, _MM_FROUND_CUR_DIRECTION);
}
MS_AVX512 __m512 Add(__m512 a, __m512 b) {
  return _mm512_maskz_add_round_ps(0xffff, a, b, _MM_FROUND_CUR_DIRECTION);
}
MS_AVX512 __m512 Sub(__m512 a, __m512 b) {
  return _mm512_maskz_sub_round_ps(0xffff, a, b, _MM_FROUND_CUR_DIRECTION);
}

__attribute__((target("avx512f"))) std::int64_t AdamWAvx512(
    const AdamWStep& s, float* params, const float* grads, float* m, float* v,
    std::int64_t n, const std::uint8_t* decay_mask) {
  const __m512 beta1 = _mm512_set1_ps(s.beta1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 correction1 = _mm512_set1_ps(s.correction1);
  const __m512 correction2 = _mm512_set1_ps(s.correction2);
  const __m512 lr = _mm512_set1_ps(s.lr);
  const __m512 eps = _mm512_set1_ps(s.eps);
  const __m512 weight_decay = _mm512_set1_ps(s.weight_decay);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(grads + i);
    const __m512 mi =
        Add(Mul(beta1, _mm512_loadu_ps(m + i)), Mul(one_minus_beta1, g));
    const __m512 vi = Add(Mul(beta2, _mm512_loadu_ps(v + i)),
                          Mul(Mul(one_minus_beta2, g), g));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 m_hat = _mm512_div_ps(mi, correction1);
    const __m512 v_hat = _mm512_div_ps(vi, correction2);
    __m512 wd = weight_decay;
    if (decay_mask != nullptr) {
      const __m512i bytes = _mm512_maskz_cvtepu8_epi32(
          0xffff,
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(decay_mask + i)));
      wd = _mm512_maskz_mov_ps(_mm512_test_epi32_mask(bytes, bytes), wd);
    }
    const __m512 p = _mm512_loadu_ps(params + i);
    const __m512 update =
        Add(_mm512_div_ps(m_hat, Add(_mm512_maskz_sqrt_ps(0xffff, v_hat), eps)),
            Mul(wd, p));
    _mm512_storeu_ps(params + i, Sub(p, Mul(lr, update)));
  }
  return i;
}

// Sum of squares in double, 8 independent partial sums (fixed order).
MS_CLONES __attribute__((optimize("O3"))) double SumSquares(
    const float* __restrict g, std::int64_t n) {
  double acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double x = g[i + j];
      acc[j] += x * x;
    }
  }
  for (; i < n; ++i) acc[i % 8] += double{g[i]} * g[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) +
         ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

}  // namespace

void AdamWUpdate(float* params, const float* grads, float* m, float* v,
                 int64_t n, const AdamWOptions& options, int64_t step,
                 const uint8_t* decay_mask) {
  const double t = static_cast<double>(std::max<int64_t>(step, 1));
  AdamWStep s;
  s.beta1 = options.beta1;
  s.beta2 = options.beta2;
  s.one_minus_beta1 = 1.0f - options.beta1;
  s.one_minus_beta2 = 1.0f - options.beta2;
  s.correction1 = static_cast<float>(1.0 - std::pow(double{options.beta1}, t));
  s.correction2 = static_cast<float>(1.0 - std::pow(double{options.beta2}, t));
  s.lr = options.lr;
  s.eps = options.eps;
  s.weight_decay = options.weight_decay;
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  const int64_t done =
      avx512 ? AdamWAvx512(s, params, grads, m, v, n, decay_mask) : 0;
  AdamWScalar(s, params, grads, m, v, done, n, decay_mask);
}

double GlobalNorm(const float* g, int64_t n) {
  return std::sqrt(SumSquares(g, n));
}

}  // namespace multislice::compute
