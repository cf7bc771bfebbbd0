// 16-lane f32 vectors (GCC vector extensions) and the element-wise math the
// compute and model kernels share. Everything is always-inline, so it is
// compiled for the ISA of each multi-versioned caller (target_clones for
// AVX-512, AVX2 and the baseline). Include only from .cc files.
#pragma once

#include <cstdint>

#pragma GCC diagnostic push
// Vector arguments whose calling convention depends on the ISA: fine here,
// everything is inlined.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute::vec {

typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));
typedef uint32_t U16 __attribute__((vector_size(64)));
typedef uint16_t H16 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline F16 Splat(float v) { return F16{} + v; }

// exp(a) for a in [-104, 0] (below that the result underflows to 0 anyway;
// callers clamp). a = n ln2 + r with |r| <= ln2/2; exp(r) by its Taylor
// series to r^7 (truncation error below 1e-8 relative); 2^n applied as two
// exact powers of two so that a subnormal result is rounded only once.
[[gnu::always_inline]] inline F16 ExpNonPositive(const F16& a) {
  const float kLog2e = 1.44269504088896341f;
  // ln2 split so that n * kLn2Hi is exact for |n| < 2^11.
  const float kLn2Hi = 0x1.62ep-1f;
  const float kLn2Lo = static_cast<float>(0.69314718055994530942 - 0x1.62ep-1);
  const float kRoundMagic = 0x1.8p23f;  // adding it rounds to an integer
  F16 n = (a * kLog2e + kRoundMagic) - kRoundMagic;
  F16 r = (a - n * kLn2Hi) - n * kLn2Lo;
  F16 p = Splat(1.0f / 5040);
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  I16 ni = __builtin_convertvector(n, I16);  // in [-151, 0]
  I16 n1 = ni >> 1;
  I16 n2 = ni - n1;
  F16 s1 = reinterpret_cast<F16>((n1 + 127) << 23);
  F16 s2 = reinterpret_cast<F16>((n2 + 127) << 23);
  return (p * s1) * s2;
}

}  // namespace multislice::compute::vec

#pragma GCC diagnostic pop
