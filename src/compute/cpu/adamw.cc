// AdamW and the sum of squares, written once on 16-lane vectors and compiled
// for every ISA level (isa_dispatch.h).
//
// The AdamW loop gives exactly the scalar loop's values on every level: this
// file is compiled with -ffp-contract=off (no multiply-add is fused into an
// FMA, which would round once instead of twice), division and sqrt are the
// correctly rounded instructions, and each lane does the scalar loop's
// operations in its order. The last n % 16 elements run through the same
// vector code on a zero-padded copy. The sum of squares keeps 16 partial sums
// in double (lane i % 16 gets element i) added in a fixed order at the end,
// so it is the same on every level too.
#include "compute/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/isa_dispatch.h"
#include "compute/cpu/vec16.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute {
namespace {

using vec::F16;
using vec::I16;
using vec::Splat;
typedef std::uint8_t B16 __attribute__((vector_size(16)));
typedef double D8 __attribute__((vector_size(64)));

struct AdamWStep {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float correction1, correction2, lr, eps, weight_decay, grad_scale;
};

// Lane-wise sqrt; GCC makes it one sqrtps per register (the file is built
// with -fno-math-errno).
MS_KERNEL F16 Sqrt(const F16& x) {
  F16 r;
  for (int j = 0; j < 16; ++j) r[j] = __builtin_sqrtf(x[j]);
  return r;
}

// 16 elements starting at i of each array (params, m, v updated in place).
MS_KERNEL void AdamW16(const AdamWStep& s, float* params, const float* grads,
                       float* m, float* v, const std::uint8_t* decay_mask) {
  F16 g, mi, vi, p;
  std::memcpy(&g, grads, sizeof(g));
  std::memcpy(&mi, m, sizeof(mi));
  std::memcpy(&vi, v, sizeof(vi));
  std::memcpy(&p, params, sizeof(p));
  g = g * s.grad_scale;
  mi = s.beta1 * mi + s.one_minus_beta1 * g;
  vi = s.beta2 * vi + s.one_minus_beta2 * g * g;
  const F16 m_hat = mi / s.correction1;
  const F16 v_hat = vi / s.correction2;
  F16 wd = Splat(s.weight_decay);
  if (decay_mask != nullptr) {
    B16 bytes;
    std::memcpy(&bytes, decay_mask, sizeof(bytes));
    wd = __builtin_convertvector(bytes, I16) != 0 ? wd : F16{};
  }
  p = p - s.lr * (m_hat / (Sqrt(v_hat) + s.eps) + wd * p);
  std::memcpy(m, &mi, sizeof(mi));
  std::memcpy(v, &vi, sizeof(vi));
  std::memcpy(params, &p, sizeof(p));
}

struct AdamWKernel {
  MS_KERNEL void operator()(auto, const AdamWStep& s, float* params,
                            const float* grads, float* m, float* v,
                            std::int64_t n,
                            const std::uint8_t* decay_mask) const {
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      AdamW16(s, params + i, grads + i, m + i, v + i,
              decay_mask != nullptr ? decay_mask + i : nullptr);
    }
    const std::int64_t rest = n - i;
    if (rest == 0) return;
    alignas(64) float tail[4][16] = {};
    alignas(16) std::uint8_t tail_mask[16] = {};
    const size_t bytes = static_cast<size_t>(rest) * sizeof(float);
    std::memcpy(tail[0], params + i, bytes);
    std::memcpy(tail[1], grads + i, bytes);
    std::memcpy(tail[2], m + i, bytes);
    std::memcpy(tail[3], v + i, bytes);
    if (decay_mask != nullptr) {
      std::memcpy(tail_mask, decay_mask + i, static_cast<size_t>(rest));
    }
    AdamW16(s, tail[0], tail[1], tail[2], tail[3],
            decay_mask != nullptr ? tail_mask : nullptr);
    std::memcpy(params + i, tail[0], bytes);
    std::memcpy(m + i, tail[2], bytes);
    std::memcpy(v + i, tail[3], bytes);
  }
};

struct SumOfSquaresKernel {
  MS_KERNEL double operator()(auto, const float* g, std::int64_t n) const {
    D8 lo = {}, hi = {};
    auto add = [&lo, &hi](const float* x) {
      typedef float F8 __attribute__((vector_size(32)));
      F8 a, b;
      std::memcpy(&a, x, sizeof(a));
      std::memcpy(&b, x + 8, sizeof(b));
      const D8 da = __builtin_convertvector(a, D8);
      const D8 db = __builtin_convertvector(b, D8);
      lo += da * da;
      hi += db * db;
    };
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) add(g + i);
    if (i < n) {
      alignas(64) float tail[16] = {};
      std::memcpy(tail, g + i, static_cast<size_t>(n - i) * sizeof(float));
      add(tail);
    }
    double lanes[16];
    std::memcpy(lanes, &lo, sizeof(lo));
    std::memcpy(lanes + 8, &hi, sizeof(hi));
    double sum = 0;
    for (double lane : lanes) sum += lane;
    return sum;
  }
};

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
  s.grad_scale = options.grad_scale;
  isa::Dispatch<AdamWKernel>(s, params, grads, m, v, n, decay_mask);
}

double SumOfSquares(const float* g, int64_t n) {
  return isa::Dispatch<SumOfSquaresKernel>(g, n);
}

double GlobalNorm(const float* g, int64_t n) {
  return std::sqrt(SumOfSquares(g, n));
}

}  // namespace multislice::compute
