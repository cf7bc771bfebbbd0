// The vector building blocks the CPU backend's kernels share: loads and
// stores of 16 f32 lanes (whole or a row's last < 16 values), bf16
// rounding, horizontal sums in a fixed order, exp, sigmoid, GPT-2's GELU and
// its derivative, and the row softmax. Everything is always-inline, so it is
// compiled for the ISA of each kernel version that inlines it (vec16.h,
// isa_dispatch.h). Include only from .cc files of compute/cpu/.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/isa_dispatch.h"
#include "compute/cpu/vec16.h"

#pragma GCC diagnostic push
// Vector arguments whose calling convention depends on the ISA: fine here,
// everything is inlined.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute::kernels {

#define MS_INLINE [[gnu::always_inline]] inline

constexpr int kLanes = 16;
// sqrt(2 / pi), the scale inside GPT-2's tanh-approximate GELU.
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

using vec::F16;
using vec::H16;
using vec::I16;
using vec::Splat;
using vec::U16;

MS_INLINE F16 Load(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
MS_INLINE void Store(float* p, const F16& v) { std::memcpy(p, &v, sizeof(v)); }
// The first n (< 16) elements of p, the other lanes zero.
MS_INLINE F16 LoadPart(const float* p, int n) {
  F16 v = {};
  std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(float));
  return v;
}
MS_INLINE void StorePart(float* p, const F16& v, int n) {
  std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(float));
}
// The first n (<= 16) lanes rounded to bf16 (nearest even, NaN kept a quiet
// NaN: exactly compute::Convert).
template <typename Tag>
MS_INLINE void StoreBf16(Tag tag, std::uint16_t* p, const F16& v, int n) {
  const H16 h = vec::RoundToBf16(tag, v);
  std::memcpy(p, &h, static_cast<size_t>(n) * sizeof(std::uint16_t));
}
// Lanes [0, n) true.
template <typename Tag>
MS_INLINE I16 LaneMask(Tag tag, int n) {
  const I16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return vec::Less(tag, iota, I16{} + n);
}
// Pairwise, in a fixed order: lanes i and i + 8, then i and i + 4, then
// (0 + 2) + (1 + 3). Through half-width vectors and a copy, never by
// indexing the 64-byte vector: GCC keeps a 64-byte vector whose lanes are
// indexed in memory on AVX2, moved through general registers on every use
// of the loop that built it (LayerNorm ran at 1.5 ns an element).
MS_INLINE float HSum(const F16& v) {
  typedef float F8 __attribute__((vector_size(32)));
  typedef float F4 __attribute__((vector_size(16)));
  F8 halves[2];
  std::memcpy(halves, &v, sizeof(v));
  const F8 s8 = halves[0] + halves[1];
  F4 quarters[2];
  std::memcpy(quarters, &s8, sizeof(s8));
  const F4 s4 = quarters[0] + quarters[1];
  float s[4];
  std::memcpy(s, &s4, sizeof(s4));
  return (s[0] + s[2]) + (s[1] + s[3]);
}
MS_INLINE float HMax(const F16& v) {
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof(v));
  float m = lanes[0];
  for (int i = 1; i < kLanes; ++i) m = lanes[i] > m ? lanes[i] : m;
  return m;
}
// exp(a) for a <= 0; below -104 the result underflows to 0 anyway, so a is
// clamped there (-inf and NaN give 0).
template <typename Tag>
MS_INLINE F16 ExpNonPositive(Tag tag, F16 a) {
  a = vec::Max(tag, a, Splat(-104.0f));
  return vec::ExpNonPositive(a);
}

// s = sigmoid(z) and 1 - s, each without cancellation.
template <typename Tag>
MS_INLINE void Sigmoid(Tag tag, const F16& z, F16& s, F16& one_minus_s) {
  F16 az = reinterpret_cast<F16>(reinterpret_cast<U16>(z) & 0x7fffffffu);
  az = vec::Min(tag, az, Splat(104.0f));   // also maps NaN to 104
  const F16 t = ExpNonPositive(tag, -az);  // exp(-|z|) in (0, 1]
  const F16 inv = 1.0f / (1.0f + t);
  const I16 positive = vec::GreaterEq(tag, z, F16{});
  s = vec::Select(tag, positive, Splat(1.0f), t) * inv;
  one_minus_s = vec::Select(tag, positive, t, Splat(1.0f)) * inv;
}

template <typename Tag>
MS_INLINE F16 Gelu(Tag tag, const F16& x) {
  const F16 z = (2.0f * kGeluScale) * (x + kGeluCubic * x * x * x);
  F16 s, oms;
  Sigmoid(tag, z, s, oms);
  return x * s;
}

// GELU'(x); with `value`, also GELU(x) = x s from the same sigmoid.
template <typename Tag>
MS_INLINE F16 GeluGrad(Tag tag, const F16& x, F16* value = nullptr) {
  const F16 z = (2.0f * kGeluScale) * (x + kGeluCubic * x * x * x);
  F16 s, oms;
  Sigmoid(tag, z, s, oms);
  if (value != nullptr) *value = x * s;
  const F16 dz_dx = (2.0f * kGeluScale) * (1.0f + (3.0f * kGeluCubic) * x * x);
  const F16 tail = (x * s) * (oms * dz_dx);
  // Where the sigmoid saturates (|z| >= 104, so |x| > 13) the second term is
  // below 1e-40 of the first; dropping it there keeps huge x finite (x * 0
  // still propagates a NaN x).
  const F16 az = reinterpret_cast<F16>(reinterpret_cast<U16>(z) & 0x7fffffffu);
  return s +
         vec::Select(tag, vec::Less(tag, az, Splat(104.0f)), tail, x * 0.0f);
}

// GELU(x) and GELU'(x) from one sigmoid.
template <typename Tag>
MS_INLINE void GeluAndGrad(Tag tag, const F16& x, F16& y, F16& dy) {
  dy = GeluGrad(tag, x, &y);
}

// y[i] = f(y[i], x[i]) over n elements.
template <typename F>
MS_INLINE void Update(float* y, const float* x, std::int64_t n, F f) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Store(y + i, f(Load(y + i), Load(x + i)));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    StorePart(y + i, f(LoadPart(y + i, rest), LoadPart(x + i, rest)), rest);
  }
}

// out = a + b over n elements (out may alias a or b).
MS_INLINE void Add(float* out, const float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    Store(out + i, Load(a + i) + Load(b + i));
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    StorePart(out + i, LoadPart(a + i, rest) + LoadPart(b + i, rest), rest);
  }
}

// p[0, n) = exp(z - max) / sum over z[0, n) (z may be p: in place); returns
// the sum of exp(z - max) and sets *row_max. p[n, len) is set to zero
// (len >= n >= 1).
template <typename Tag>
MS_INLINE float SoftmaxRow(Tag tag, const float* z, float* p, int n, int len,
                           float* row_max) {
  const int full = n / kLanes * kLanes;
  const int rest = n - full;
  const I16 tail = LaneMask(tag, rest);
  const F16 neg_inf = Splat(-INFINITY);
  vec::Carry16<Tag> m(neg_inf);
  for (int i = 0; i < full; i += kLanes) {
    m.Set(vec::Max(tag, m.Get(), Load(z + i)));
  }
  if (rest) {
    m.Set(vec::Max(tag, m.Get(),
                   vec::Select(tag, tail, LoadPart(z + full, rest), neg_inf)));
  }
  const float mx = HMax(m.Get());
  vec::Carry16<Tag> sum;
  for (int i = 0; i < full; i += kLanes) {
    const F16 e = ExpNonPositive(tag, Load(z + i) - mx);
    sum += e;
    Store(p + i, e);
  }
  F16 e_tail = {};
  if (rest) {
    e_tail = vec::Select(
        tag, tail, ExpNonPositive(tag, LoadPart(z + full, rest) - mx), F16{});
    sum += e_tail;
  }
  const float denom = HSum(sum.Get());
  const float inv = 1.0f / denom;
  for (int i = 0; i < full; i += kLanes) Store(p + i, Load(p + i) * inv);
  if (rest) StorePart(p + full, e_tail * inv, rest);
  if (len > n)
    std::memset(p + n, 0, static_cast<size_t>(len - n) * sizeof(float));
  *row_max = mx;
  return denom;
}

// y[0, n) = bf16(x[0, n)).
template <typename Tag>
MS_INLINE void RowToBf16(Tag tag, std::uint16_t* y, const float* x, int n) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    StoreBf16(tag, y + i, Load(x + i), kLanes);
  if (i < n) StoreBf16(tag, y + i, LoadPart(x + i, n - i), n - i);
}

}  // namespace multislice::compute::kernels

#pragma GCC diagnostic pop
