// AdamW and the sum of squares, written once on 16-lane vectors and compiled
// for every ISA level (isa_dispatch.h).
//
// The AdamW loop gives exactly the scalar loop's values on every level: this
// file is compiled with -ffp-contract=off (no multiply-add is fused into an
// FMA, which would round once instead of twice), division and sqrt are the
// correctly rounded instructions, and each lane does the scalar loop's
// operations in its order. One sqrt and one division per element (the bias
// corrections are multiplied by their reciprocals, as PyTorch's AdamW does):
// division and sqrt are the slowest vector instructions, and with three
// divisions AdamW took 4 % of an AVX2 training step. The last n % 16 elements
// run through the same vector code on a zero-padded copy. The sum of squares
// keeps 16 partial sums in double (lane i % 16 gets element i) added in a fixed
// order at the end, so it is the same on every level too.
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

struct AdamWStep {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float inv_correction1, inv_sqrt_correction2, lr, eps, weight_decay,
      grad_scale;
};

// Lane-wise sqrt; GCC makes it one sqrtps per register (the file is built
// with -fno-math-errno).
MS_KERNEL F16 Sqrt(const F16& x) {
  F16 r;
  for (int j = 0; j < 16; ++j) r[j] = __builtin_sqrtf(x[j]);
  return r;
}

// weight_decay where the mask byte is non-zero, else 0, for 16 lanes. The
// mask follows the tensors (all 1 inside a weight, all 0 inside a bias), so
// the 16 bytes are nearly always all one or all zero: tested as two 64-bit
// words. (GCC 12 widens a vector of bytes to 32-bit lanes one byte at a time
// on AVX2, which made this select 4 % of an AVX2 training step.)
template <typename Tag>
MS_KERNEL F16 DecayOf16(Tag tag, float weight_decay, const uint8_t* mask) {
  if (mask == nullptr) return Splat(weight_decay);
  constexpr std::uint64_t kOnes = 0x0101010101010101ull;
  std::uint64_t words[2];
  std::memcpy(words, mask, sizeof(words));
  if (words[0] == kOnes && words[1] == kOnes) return Splat(weight_decay);
  if ((words[0] | words[1]) == 0) return F16{};
  F16 wd;
  for (int j = 0; j < 16; ++j) wd[j] = mask[j] != 0 ? weight_decay : 0.0f;
  (void)tag;
  return wd;
}

// 16 elements starting at i of each array (params, m, v updated in place).
template <typename Tag>
MS_KERNEL void AdamW16(Tag tag, const AdamWStep& s, float* params,
                       const float* grads, float* m, float* v,
                       const std::uint8_t* decay_mask) {
  F16 g, mi, vi, p;
  std::memcpy(&g, grads, sizeof(g));
  std::memcpy(&mi, m, sizeof(mi));
  std::memcpy(&vi, v, sizeof(vi));
  std::memcpy(&p, params, sizeof(p));
  g = g * s.grad_scale;
  mi = s.beta1 * mi + s.one_minus_beta1 * g;
  vi = s.beta2 * vi + s.one_minus_beta2 * g * g;
  const F16 m_hat = mi * s.inv_correction1;
  const F16 denom = Sqrt(vi) * s.inv_sqrt_correction2 + s.eps;
  const F16 wd = DecayOf16(tag, s.weight_decay, decay_mask);
  p = p - s.lr * (m_hat / denom + wd * p);
  std::memcpy(m, &mi, sizeof(mi));
  std::memcpy(v, &vi, sizeof(vi));
  std::memcpy(params, &p, sizeof(p));
}

struct AdamWKernel {
  MS_KERNEL void operator()(auto tag, const AdamWStep& s, float* params,
                            const float* grads, float* m, float* v,
                            std::int64_t n,
                            const std::uint8_t* decay_mask) const {
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      AdamW16(tag, s, params + i, grads + i, m + i, v + i,
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
    AdamW16(tag, s, tail[0], tail[1], tail[2], tail[3],
            decay_mask != nullptr ? tail_mask : nullptr);
    std::memcpy(params + i, tail[0], bytes);
    std::memcpy(m + i, tail[2], bytes);
    std::memcpy(v + i, tail[3], bytes);
  }
};

struct SumOfSquaresKernel {
  MS_KERNEL double operator()(auto, const float* g, std::int64_t n) const {
    // Lane j of 16 sums elements j, j + 16, ...: GCC keeps the lanes in
    // registers (four ymm of doubles on AVX2).
    double acc[16] = {};
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      for (int j = 0; j < 16; ++j) {
        const double x = g[i + j];
        acc[j] += x * x;
      }
    }
    for (int j = 0; i + j < n; ++j) {
      const double x = g[i + j];
      acc[j] += x * x;
    }
    double sum = 0;
    for (double lane : acc) sum += lane;
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
  s.inv_correction1 =
      static_cast<float>(1.0 / (1.0 - std::pow(double{options.beta1}, t)));
  s.inv_sqrt_correction2 = static_cast<float>(
      1.0 / std::sqrt(1.0 - std::pow(double{options.beta2}, t)));
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
