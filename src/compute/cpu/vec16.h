// 16-lane f32 vectors (GCC vector extensions) and the element-wise math the
// CPU backend's kernels share. Everything is always-inline, so it is compiled
// for the ISA of each kernel version that inlines it (isa_dispatch.h:
// AVX-512, AVX2 and the baseline). Include only from .cc files.
//
// Arithmetic, bitwise operations, shifts and conversions on these 64-byte
// vectors compile to one AVX-512 instruction, two AVX2 or four SSE2 ones.
// Comparisons and selects (`a < b`, `m ? a : b`) do not: GCC 12 lowers them
// lane by lane, in scalar code, on a target without 512-bit registers, which
// made the AVX2 GELU 10x slower than it should be. So kernels compare and
// select only through Less/.../Select below, which take the kernel's ISA tag
// and work on native-width parts (one zmm, two ymm or four xmm registers).
// Every level computes the same 16 logical lanes in the same order, so the
// results differ between levels only where a product and a sum are fused
// into one FMA (AVX2 and AVX-512 have FMA, the baseline does not).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/isa_dispatch.h"

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

// Native registers per 64-byte vector at the level of `Tag`.
template <typename Tag>
inline constexpr int kParts = isa::kLevel<Tag> >= Isa::kAvx512 ? 1
                              : isa::kLevel<Tag> == Isa::kAvx2 ? 2
                                                               : 4;

template <typename E, int kBytes>
struct VectorOf {
  typedef E type __attribute__((vector_size(kBytes)));
};

enum class Cmp { kLt, kLe, kGt, kGe, kEq };

template <Cmp kOp, typename V>
[[gnu::always_inline]] inline auto CompareWhole(const V& a, const V& b) {
  if constexpr (kOp == Cmp::kLt) {
    return a < b;
  } else if constexpr (kOp == Cmp::kLe) {
    return a <= b;
  } else if constexpr (kOp == Cmp::kGt) {
    return a > b;
  } else if constexpr (kOp == Cmp::kGe) {
    return a >= b;
  } else {
    return a == b;
  }
}

// Lane masks (-1 where the relation holds, else 0) of two 64-byte vectors of
// 32-bit lanes (float or integer), part by part.
template <Cmp kOp, typename Tag, typename V>
[[gnu::always_inline]] inline I16 Compare(Tag, const V& a, const V& b) {
  constexpr int kP = kParts<Tag>;
  if constexpr (kP == 1) {
    return CompareWhole<kOp>(a, b);
  } else {
    typedef std::remove_cvref_t<decltype(a[0])> E;
    typedef typename VectorOf<E, 64 / kP>::type Part;
    typedef typename VectorOf<int32_t, 64 / kP>::type MaskPart;
    Part pa[kP], pb[kP];
    MaskPart r[kP];
    std::memcpy(pa, &a, sizeof(a));
    std::memcpy(pb, &b, sizeof(b));
    for (int i = 0; i < kP; ++i) r[i] = CompareWhole<kOp>(pa[i], pb[i]);
    I16 out;
    std::memcpy(&out, r, sizeof(out));
    return out;
  }
}

template <typename Tag, typename V>
[[gnu::always_inline]] inline I16 Less(Tag tag, const V& a, const V& b) {
  return Compare<Cmp::kLt>(tag, a, b);
}
template <typename Tag, typename V>
[[gnu::always_inline]] inline I16 Greater(Tag tag, const V& a, const V& b) {
  return Compare<Cmp::kGt>(tag, a, b);
}
template <typename Tag, typename V>
[[gnu::always_inline]] inline I16 GreaterEq(Tag tag, const V& a, const V& b) {
  return Compare<Cmp::kGe>(tag, a, b);
}
template <typename Tag, typename V>
[[gnu::always_inline]] inline I16 Equal(Tag tag, const V& a, const V& b) {
  return Compare<Cmp::kEq>(tag, a, b);
}

// mask ? a : b lane by lane (mask lanes -1 or 0), part by part.
template <typename Tag, typename V>
[[gnu::always_inline]] inline V Select(Tag, const I16& mask, const V& a,
                                       const V& b) {
  constexpr int kP = kParts<Tag>;
  if constexpr (kP == 1) {
    return mask ? a : b;
  } else {
    typedef std::remove_cvref_t<decltype(a[0])> E;
    typedef typename VectorOf<E, 64 / kP>::type Part;
    typedef typename VectorOf<int32_t, 64 / kP>::type MaskPart;
    MaskPart pm[kP];
    Part pa[kP], pb[kP], r[kP];
    std::memcpy(pm, &mask, sizeof(mask));
    std::memcpy(pa, &a, sizeof(a));
    std::memcpy(pb, &b, sizeof(b));
    for (int i = 0; i < kP; ++i) r[i] = pm[i] ? pa[i] : pb[i];
    V out;
    std::memcpy(&out, r, sizeof(out));
    return out;
  }
}

template <typename Tag>
[[gnu::always_inline]] inline F16 Max(Tag tag, const F16& a, const F16& b) {
  return Select(tag, Greater(tag, a, b), a, b);
}
template <typename Tag>
[[gnu::always_inline]] inline F16 Min(Tag tag, const F16& a, const F16& b) {
  return Select(tag, Less(tag, a, b), a, b);
}

// A 16-lane f32 value carried from one loop iteration to the next (a sum,
// a running max), held as native-width parts. GCC 12 keeps a loop-carried
// 64-byte vector in memory on AVX2 and the baseline, moving it through
// general registers on every iteration (LayerNorm ran at 1.5 ns an element,
// slower than on the baseline); its native parts stay in registers.
template <typename Tag>
class Carry16 {
 public:
  Carry16() = default;  // every lane 0
  explicit Carry16(const F16& v) { Set(v); }

  [[gnu::always_inline]] F16 Get() const {
    F16 v;
    std::memcpy(&v, parts_, sizeof(v));
    return v;
  }
  [[gnu::always_inline]] void Set(const F16& v) {
    std::memcpy(parts_, &v, sizeof(v));
  }
  [[gnu::always_inline]] void operator+=(const F16& v) {
    Part in[kParts<Tag>];
    std::memcpy(in, &v, sizeof(v));
    for (int i = 0; i < kParts<Tag>; ++i) parts_[i] += in[i];
  }

 private:
  typedef typename VectorOf<float, 64 / kParts<Tag>>::type Part;
  Part parts_[kParts<Tag>] = {};
};

// f32 -> bf16 bits, round to nearest even, a NaN kept a (quiet) NaN: as
// bf16::FromFloat.
template <typename Tag>
[[gnu::always_inline]] inline H16 RoundToBf16(Tag tag, const F16& v) {
  const U16 u = reinterpret_cast<U16>(v);
  const U16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U16 nan = (u >> 16) | 0x40u;
  const U16 magnitude = u & 0x7fffffffu;
  const U16 inf = U16{} + 0x7f800000u;
  // |v| > inf as integers: a NaN (the unsigned compare done as signed is
  // exact here: both sides are below 2^31).
  const I16 is_nan = Greater(tag, reinterpret_cast<I16>(magnitude),
                             reinterpret_cast<I16>(inf));
  return __builtin_convertvector(Select(tag, is_nan, nan, rounded), H16);
}

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
