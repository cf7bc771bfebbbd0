// Element-wise reductions. Every entry point funnels into one blocked loop,
// ReduceBlocks<T, op>, instantiated for each element type and reduction and
// compiled three times by isa::Dispatch (AVX-512, AVX2 and the x86-64
// baseline), which runs the version of the active ISA level at each call.
//
// The loop walks the arrays in blocks of kBlockElems elements: each block of
// every source is combined into an f32 accumulator that stays in L1, the
// accumulator is rounded once (bf16) and then copied to every destination.
// Reading a whole block of every source before writing it is what makes
// exact aliasing of a destination with a source safe.
//
// Large outputs are written with non-temporal stores: they do not fit in the
// cache anyway, and streaming them avoids reading every destination line
// before it is overwritten (about a third of the memory traffic of the fused
// all-reduce).
//
// Floating-point behaviour:
//   - sum adds in source order 0..n-1 in f32 (no reassociation, no FMA), so
//     a reference loop that adds in the same order gets bit-identical results.
//     A sum with a NaN is a NaN; with several NaNs, which payload survives
//     is up to the hardware (fixed for a given build).
//   - max/min: if any source element is a NaN the result is a NaN (the first
//     NaN in source order, quieted when rounded to bf16). Otherwise the usual
//     order, except that +0 and -0 compare equal and the later source wins
//     a tie (max(+0, -0) = -0, max(-0, +0) = +0). Deterministic for a given
//     source order.
//   - n == 1 copies the source bits unchanged (a signalling NaN stays one).
#include "runtime/comm/reduce.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/isa_dispatch.h"

namespace multislice::comm {
namespace {

// 2048 elements: an 8 KiB f32 accumulator plus a 4 KiB bf16 staging block,
// well inside the 48 KiB L1 of the machines we target, with room for the
// source lines in flight.
constexpr size_t kBlockElems = 2048;

// Outputs of at least this many bytes in total are streamed past the cache.
// Below it the result is likely to be read again soon (and fits in L2/L3).
constexpr size_t kStreamThresholdBytes = size_t{4} << 20;

// Everything a multi-versioned function calls in its loops must be inlined
// into it, or the loops stop vectorising. GCC refuses to inline a plain
// helper into a clone whose ISA is not a superset of the command line's
// (for example under -march=native on a CPU with more than x86-64-v4), but
// always inlines an always_inline one. Hence also __builtin_bit_cast rather
// than std::bit_cast, and no std::min, in the loops.
#define MS_ALWAYS_INLINE inline __attribute__((always_inline))

MS_ALWAYS_INLINE float Bf16ToF32(uint16_t b) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16);
}

// bf16::FromFloat written without branches so that it vectorises: round to
// nearest even, and a NaN stays a (quiet) NaN.
MS_ALWAYS_INLINE uint16_t F32ToBf16(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan
                                                               : rounded);
}

template <typename T>
MS_ALWAYS_INLINE float ToF32(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return Bf16ToF32(v);
  }
}

// acc op x, with the NaN and signed-zero rules of the file comment. Written
// as selects so that the compiler emits compare + blend vector code.
template <ReduceOp kOp>
MS_ALWAYS_INLINE float Combine(float acc, float x) {
  if constexpr (kOp == ReduceOp::kSum) {
    return acc + x;
  } else if constexpr (kOp == ReduceOp::kMax) {
    return (acc > x || acc != acc) ? acc : x;
  } else {
    return (acc < x || acc != acc) ? acc : x;
  }
}

// Copies `bytes` from src (hot in L1) to dst with non-temporal stores.
// Unaligned head and tail bytes use ordinary stores.
__attribute__((target("avx2"))) void StreamCopyAvx2(char* dst, const char* src,
                                                    size_t bytes) {
  const size_t misalignment =
      (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & size_t{31};
  const size_t head = misalignment < bytes ? misalignment : bytes;
  std::memcpy(dst, src, head);
  size_t i = head;
  // (Lambdas would not inherit this function's target, so no helpers.)
  for (; i + 128 <= bytes; i += 128) {
    const auto* from = reinterpret_cast<const __m256i*>(src + i);
    auto* to = reinterpret_cast<__m256i*>(dst + i);
    const __m256i v0 = _mm256_loadu_si256(from);
    const __m256i v1 = _mm256_loadu_si256(from + 1);
    const __m256i v2 = _mm256_loadu_si256(from + 2);
    const __m256i v3 = _mm256_loadu_si256(from + 3);
    _mm256_stream_si256(to, v0);
    _mm256_stream_si256(to + 1, v1);
    _mm256_stream_si256(to + 2, v2);
    _mm256_stream_si256(to + 3, v3);
  }
  for (; i + 32 <= bytes; i += 32) {
    _mm256_stream_si256(
        reinterpret_cast<__m256i*>(dst + i),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, bytes - i);
}

// The same with SSE2's 16-byte non-temporal stores (the x86-64 baseline).
void StreamCopySse2(char* dst, const char* src, size_t bytes) {
  const size_t misalignment =
      (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & size_t{15};
  const size_t head = misalignment < bytes ? misalignment : bytes;
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const auto* from = reinterpret_cast<const __m128i*>(src + i);
    auto* to = reinterpret_cast<__m128i*>(dst + i);
    const __m128i v0 = _mm_loadu_si128(from);
    const __m128i v1 = _mm_loadu_si128(from + 1);
    const __m128i v2 = _mm_loadu_si128(from + 2);
    const __m128i v3 = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, v0);
    _mm_stream_si128(to + 1, v1);
    _mm_stream_si128(to + 2, v2);
    _mm_stream_si128(to + 3, v3);
  }
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, bytes - i);
}

// The widest stream copy of the active ISA level (AVX-512 stores would not
// move memory any faster than AVX2's).
void StreamCopy(char* dst, const char* src, size_t bytes) {
  if (ActiveIsa() >= Isa::kAvx2) {
    StreamCopyAvx2(dst, src, bytes);
  } else {
    StreamCopySse2(dst, src, bytes);
  }
}

// n == 1: the source bits are copied unchanged (no bf16 re-rounding of
// NaNs), block by block so that it is read from memory once for all m
// destinations. A destination equal to the source is left alone.
void CopyToAll(void* const* dsts, int m, const void* src, size_t bytes) {
  constexpr size_t kBlockBytes = kBlockElems * sizeof(float);
  const bool stream = bytes * m >= kStreamThresholdBytes;
  const char* from = static_cast<const char*>(src);
  for (size_t base = 0; base < bytes; base += kBlockBytes) {
    const size_t len = std::min(kBlockBytes, bytes - base);
    for (int d = 0; d < m; ++d) {
      char* to = static_cast<char*>(dsts[d]);
      if (to == from) continue;
      if (stream) {
        StreamCopy(to + base, from + base, len);
      } else {
        std::memcpy(to + base, from + base, len);
      }
    }
  }
  if (stream) _mm_sfence();
}

template <typename T, ReduceOp kOp>
MS_ALWAYS_INLINE void ReduceBlocks(void* const* dsts, int m,
                                   const void* const* srcs, int n,
                                   size_t count) {
  alignas(64) float acc[kBlockElems];
  alignas(64) uint16_t packed[std::is_same_v<T, float> ? 1 : kBlockElems];
  const bool stream = count * sizeof(T) * m >= kStreamThresholdBytes;
  for (size_t base = 0; base < count; base += kBlockElems) {
    const size_t len = count - base < kBlockElems ? count - base : kBlockElems;
    // n >= 2 here (one source is a copy): the first pass combines two.
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    const T* s1 = static_cast<const T*>(srcs[1]) + base;
    for (size_t i = 0; i < len; ++i) {
      acc[i] = Combine<kOp>(ToF32(s0[i]), ToF32(s1[i]));
    }
    for (int s = 2; s < n; ++s) {
      const T* p = static_cast<const T*>(srcs[s]) + base;
      for (size_t i = 0; i < len; ++i) {
        acc[i] = Combine<kOp>(acc[i], ToF32(p[i]));
      }
    }
    const char* result;
    if constexpr (std::is_same_v<T, float>) {
      result = reinterpret_cast<const char*>(acc);
    } else {
      for (size_t i = 0; i < len; ++i) packed[i] = F32ToBf16(acc[i]);
      result = reinterpret_cast<const char*>(packed);
    }
    const size_t bytes = len * sizeof(T);
    for (int d = 0; d < m; ++d) {
      char* dst = static_cast<char*>(dsts[d]) + base * sizeof(T);
      if (stream) {
        StreamCopy(dst, result, bytes);
      } else {
        std::memcpy(dst, result, bytes);
      }
    }
  }
  // Non-temporal stores are weakly ordered: make them visible before the
  // caller publishes completion (for example at a barrier).
  if (stream) _mm_sfence();
}

template <typename T, ReduceOp kOp>
struct ReduceKernel {
  MS_ALWAYS_INLINE void operator()(auto, void* const* dsts, int m,
                                   const void* const* srcs, int n,
                                   size_t count) const {
    ReduceBlocks<T, kOp>(dsts, m, srcs, n, count);
  }
};

template <typename T>
void Reduce(ReduceOp op, void* const* dsts, int m, const void* const* srcs,
            int n, size_t count) {
  switch (op) {
    case ReduceOp::kSum:
      return isa::Dispatch<ReduceKernel<T, ReduceOp::kSum>>(dsts, m, srcs, n,
                                                            count);
    case ReduceOp::kMax:
      return isa::Dispatch<ReduceKernel<T, ReduceOp::kMax>>(dsts, m, srcs, n,
                                                            count);
    case ReduceOp::kMin:
      return isa::Dispatch<ReduceKernel<T, ReduceOp::kMin>>(dsts, m, srcs, n,
                                                            count);
  }
}

}  // namespace

void ReduceNTo(DType dtype, ReduceOp op, void* const* dsts, int m,
               const void* const* srcs, int n, size_t count) {
  if (count == 0 || m <= 0 || n <= 0) return;
  if (n == 1) {
    CopyToAll(dsts, m, srcs[0], count * SizeOf(dtype));
    return;
  }
  if (dtype == DType::kF32) {
    Reduce<float>(op, dsts, m, srcs, n, count);
  } else {
    Reduce<uint16_t>(op, dsts, m, srcs, n, count);
  }
}

void ReduceN(DType dtype, ReduceOp op, void* dst, const void* const* srcs,
             int n, size_t count) {
  ReduceNTo(dtype, op, &dst, 1, srcs, n, count);
}

void Reduce2(DType dtype, ReduceOp op, void* dst, const void* a, const void* b,
             size_t count) {
  const void* srcs[2] = {a, b};
  ReduceNTo(dtype, op, &dst, 1, srcs, 2, count);
}

}  // namespace multislice::comm
