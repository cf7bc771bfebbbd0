// Element-wise kernels, written once on GCC vector types of 16 f32 lanes and
// compiled three times (AVX-512, AVX2, baseline SSE2) by isa::Dispatch, which
// runs the version of the active ISA level (common/cpu_isa.h). bf16 lanes are
// widened to f32 on load and rounded to nearest even on store, so every kernel
// computes in f32 and rounds once, exactly as bf16::FromFloat does.
//
// Sigmoid uses its own exp (Cody-Waite range reduction, a degree-7
// polynomial, exact scaling by 2^n) because libm's exp does not vectorise;
// it is within about 1 ulp of f32, and sigmoid within about 2 ulp.
#include "compute/elementwise.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/bf16.h"
#include "common/cpu_isa.h"
#include "common/isa_dispatch.h"
#include "compute/cpu/vec16.h"

// The vector types below are passed between inline functions of this file
// only, never across an ABI boundary, so GCC's note that their calling
// convention depends on the ISA does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace multislice::compute {
namespace {

// 16 lanes: one AVX-512 register, two AVX2 or four SSE2 ones.
constexpr size_t kLanes = 16;
using vec::F16;
using vec::H16;
using vec::I16;
using vec::Splat;
using vec::U16;
typedef float F8 __attribute__((vector_size(32)));

#define MS_INLINE [[gnu::always_inline]] inline

// Loads 16 elements of type T from p[i..i+16) as f32.
template <DType T>
MS_INLINE F16 Load(const void* p, size_t i) {
  if constexpr (T == DType::kF32) {
    F16 v;
    std::memcpy(&v, static_cast<const float*>(p) + i, sizeof(v));
    return v;
  } else {
    H16 h;
    std::memcpy(&h, static_cast<const uint16_t*>(p) + i, sizeof(h));
    return reinterpret_cast<F16>(__builtin_convertvector(h, U16) << 16);
  }
}

template <DType T, typename Tag>
MS_INLINE void Store(Tag tag, void* p, size_t i, const F16& v) {
  if constexpr (T == DType::kF32) {
    std::memcpy(static_cast<float*>(p) + i, &v, sizeof(v));
  } else {
    H16 h = vec::RoundToBf16(tag, v);
    std::memcpy(static_cast<uint16_t*>(p) + i, &h, sizeof(h));
  }
}

// Copies the last n < 16 elements of type T from p + i into a zero-padded
// block, so that the tail runs through the same vector code.
template <DType T>
struct Tail {
  alignas(64) unsigned char bytes[kLanes * 4] = {};
  Tail(const void* p, size_t i, size_t n) {
    std::memcpy(bytes, static_cast<const unsigned char*>(p) + i * SizeOf(T),
                n * SizeOf(T));
  }
  Tail() = default;
};

template <DType X, DType Y, typename Tag, typename F>
MS_INLINE void Map1(Tag tag, const void* x, void* y, size_t n, F f) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Store<Y>(tag, y, i, f(tag, Load<X>(x, i)));
  }
  if (i < n) {
    Tail<X> tx(x, i, n - i);
    Tail<Y> ty;
    Store<Y>(tag, ty.bytes, 0, f(tag, Load<X>(tx.bytes, 0)));
    std::memcpy(static_cast<unsigned char*>(y) + i * SizeOf(Y), ty.bytes,
                (n - i) * SizeOf(Y));
  }
}

template <DType X0, DType X1, DType Y, typename Tag, typename F>
MS_INLINE void Map2(Tag tag, const void* x0, const void* x1, void* y, size_t n,
                    F f) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Store<Y>(tag, y, i, f(tag, Load<X0>(x0, i), Load<X1>(x1, i)));
  }
  if (i < n) {
    Tail<X0> t0(x0, i, n - i);
    Tail<X1> t1(x1, i, n - i);
    Tail<Y> ty;
    Store<Y>(tag, ty.bytes, 0,
             f(tag, Load<X0>(t0.bytes, 0), Load<X1>(t1.bytes, 0)));
    std::memcpy(static_cast<unsigned char*>(y) + i * SizeOf(Y), ty.bytes,
                (n - i) * SizeOf(Y));
  }
}

struct SigmoidOp {
  MS_INLINE F16 operator()(auto tag, const F16& x) const {
    F16 ax = reinterpret_cast<F16>(reinterpret_cast<U16>(x) & 0x7fffffffu);
    ax = vec::Min(tag, ax, Splat(104.0f));  // also maps NaN to 104
    F16 t = vec::ExpNonPositive(-ax);       // exp(-|x|) in (0, 1]
    // 1 / (1 + e^-x) for x >= 0; e^x / (1 + e^x) for x < 0, so that nothing
    // overflows and small results keep their relative accuracy.
    F16 y = vec::Select(tag, vec::GreaterEq(tag, x, F16{}), Splat(1.0f), t) /
            (1.0f + t);
    return vec::Select(tag, vec::Equal(tag, x, x), y, x);
  }
};

struct SigmoidGradOp {
  MS_INLINE F16 operator()(auto, const F16& dy, const F16& y) const {
    return dy * (y * (1.0f - y));
  }
};

struct SgdOp {
  float lr;
  MS_INLINE F16 operator()(auto, const F16& p, const F16& g) const {
    return p - lr * g;
  }
};

struct IdentityOp {
  MS_INLINE F16 operator()(auto, const F16& x) const { return x; }
};

// The kernels of isa_dispatch.h: Map1 and Map2 with an op, and the sum.
template <DType X, DType Y, typename Op>
struct Map1Kernel {
  MS_KERNEL void operator()(auto tag, const void* x, void* y, size_t n,
                            Op op) const {
    Map1<X, Y>(tag, x, y, n, op);
  }
};

template <DType X0, DType X1, DType Y, typename Op>
struct Map2Kernel {
  MS_KERNEL void operator()(auto tag, const void* x0, const void* x1, void* y,
                            size_t n, Op op) const {
    Map2<X0, X1, Y>(tag, x0, x1, y, n, op);
  }
};

// Element i goes to lane i % 16 of the accumulators, each lane adds in index
// order and the lanes are added in a fixed order at the end: the same result
// on every ISA and every call.
template <DType T>
MS_INLINE double SumImpl(const void* x, size_t n) {
  // A plain array GCC vectorises at each level's width (loop-carried 64-byte
  // vectors of doubles would go through memory on AVX2).
  double acc[kLanes] = {};
  auto add = [&acc](const F16& v) {
    float lanes[kLanes];
    std::memcpy(lanes, &v, sizeof(lanes));
    for (size_t j = 0; j < kLanes; ++j) acc[j] += lanes[j];
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) add(Load<T>(x, i));
  if (i < n) {
    Tail<T> tail(x, i, n - i);
    add(Load<T>(tail.bytes, 0));
  }
  double sum = 0;
  for (double lane : acc) sum += lane;
  return sum;
}

template <DType T>
struct SumKernel {
  MS_KERNEL double operator()(auto, const void* x, size_t n) const {
    return SumImpl<T>(x, n);
  }
};

template <DType X, DType Y, typename Op>
void RunMap1(const void* x, void* y, size_t n, Op op) {
  isa::Dispatch<Map1Kernel<X, Y, Op>>(x, y, n, op);
}

template <DType X0, DType X1, DType Y, typename Op>
void RunMap2(const void* x0, const void* x1, void* y, size_t n, Op op) {
  isa::Dispatch<Map2Kernel<X0, X1, Y, Op>>(x0, x1, y, n, op);
}

}  // namespace

void Sigmoid(DType dtype, const void* x, void* y, size_t count) {
  if (dtype == DType::kF32) {
    RunMap1<DType::kF32, DType::kF32>(x, y, count, SigmoidOp{});
  } else {
    RunMap1<DType::kBF16, DType::kBF16>(x, y, count, SigmoidOp{});
  }
}

void SigmoidGrad(DType dtype, const void* dy, const void* y, DType dx_type,
                 void* dx, size_t count) {
  constexpr DType kF32 = DType::kF32, kBF16 = DType::kBF16;
  const SigmoidGradOp op;
  if (dtype == kF32) {
    if (dx_type == kF32) {
      RunMap2<kF32, kF32, kF32>(dy, y, dx, count, op);
    } else {
      RunMap2<kF32, kF32, kBF16>(dy, y, dx, count, op);
    }
  } else {
    if (dx_type == kF32) {
      RunMap2<kBF16, kBF16, kF32>(dy, y, dx, count, op);
    } else {
      RunMap2<kBF16, kBF16, kBF16>(dy, y, dx, count, op);
    }
  }
}

void SgdUpdate(DType dtype, void* p, const void* g, float lr, size_t count) {
  if (dtype == DType::kF32) {
    RunMap2<DType::kF32, DType::kF32, DType::kF32>(p, g, p, count, SgdOp{lr});
  } else {
    RunMap2<DType::kBF16, DType::kBF16, DType::kBF16>(p, g, p, count,
                                                      SgdOp{lr});
  }
}

void Convert(DType from, const void* x, DType to, void* y, size_t count) {
  if (from == to) {
    if (x != y) std::memmove(y, x, count * SizeOf(from));
  } else if (from == DType::kF32) {
    RunMap1<DType::kF32, DType::kBF16>(x, y, count, IdentityOp{});
  } else {
    RunMap1<DType::kBF16, DType::kF32>(x, y, count, IdentityOp{});
  }
}

double Sum(DType dtype, const void* x, size_t count) {
  return dtype == DType::kF32
             ? isa::Dispatch<SumKernel<DType::kF32>>(x, count)
             : isa::Dispatch<SumKernel<DType::kBF16>>(x, count);
}

void Fill(DType dtype, void* x, float value, size_t count) {
  if (dtype == DType::kF32) {
    std::fill_n(static_cast<float*>(x), count, value);
  } else {
    std::fill_n(static_cast<uint16_t*>(x), count, bf16::FromFloat(value));
  }
}

namespace {

// AVX512-BF16's vcvtne2ps2bf16 rounds 32 values per instruction, to nearest
// even, NaN kept a quiet NaN; it reads f32 subnormals as zero.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void
ToBf16Avx512(const float* x, std::uint16_t* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16),
                                           _mm512_loadu_ps(x + i));
    std::memcpy(y + i, &h, sizeof(h));
  }
  for (; i < n; i += 16) {
    const int rest = n - i < 16 ? static_cast<int>(n - i) : 16;
    const __mmask16 k = static_cast<__mmask16>((1u << rest) - 1u);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x + i));
    __m256i bits;
    std::memcpy(&bits, &h, sizeof(h));
    _mm256_mask_storeu_epi16(y + i, k, bits);
  }
}

}  // namespace

void ToBf16(const float* x, std::uint16_t* y, std::int64_t n) {
  if (ActiveIsa() >= Isa::kAvx512Bf16) {
    ToBf16Avx512(x, y, n);
  } else {
    Convert(DType::kF32, x, DType::kBF16, y, static_cast<size_t>(n));
  }
}

}  // namespace multislice::compute
