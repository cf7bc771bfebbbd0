// Wire types: how f32 values are compressed while they cross a link, for the
// compressed all-reduce (DeviceCollectives::CompressedAllReduce) and anything
// else that wants to move f32 data in fewer bytes.
//
//   kF32   4 bytes a value, unchanged.
//   kBF16  2 bytes a value: the value rounded to bfloat16 (round to nearest,
//          ties to even).
//   kInt8  1 byte a value plus one f32 scale per block of kInt8Block values
//          (the last block of a run may be shorter): scale = max|x| / 127
//          over the block, in f32, and each value the nearest integer to
//          the f32 quotient x / scale (ties to even), in [-127, 127]. A
//          block whose max|x| is below 127 * 2^-126 takes the scale 2^-126
//          (so that no scale is subnormal), one whose max|x| is so close to
//          FLT_MAX that 127 * scale would round to infinity the next float
//          below that does not, and a block of zeros the scale 0. Layout of
//          a run of n values: ceil(n / kInt8Block) scales, then the n int8
//          values.
//
// Both lossy types read subnormal inputs (|x| < 2^-126) as zero, as every
// device and stream thread does (common/float_env.h), so that the bytes do
// not depend on the calling thread's floating-point mode.
//
// Error of one value x through the wire (|Dequantize(Quantize(x)) - x|):
//   kBF16  at most Bf16WireError(x): half an ulp of x's binade,
//          2^(floor(log2 |x|) - 8) <= 2^-8 |x|, for normal x; below 2^-126 for
//          subnormal x. A value of magnitude (2 - 2^-8) 2^127 or more rounds
//          to infinity (the error bound is then infinite).
//   kInt8  at most Int8WireError(scale) = max(scale (1/2 + 2^-16), 2^-126):
//          half the quantisation step, plus at most 2^-16 scale for the f32
//          division and the f32 product of the dequantisation; 2^-126 covers
//          subnormal inputs.
// Non-finite values: kF32 and kBF16 carry NaN as NaN and infinities as
// infinities (bf16 keeps the sign); in kInt8 a NaN or infinity anywhere in a
// block makes the block's scale NaN, so that every value of that block comes
// out NaN. Neither is refused: a collective cannot refuse on one member
// without the others, and a NaN is what f32 arithmetic would produce too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace multislice::runtime {

enum class WireType { kF32, kBF16, kInt8 };

// "f32", "bf16" or "int8".
std::string_view Name(WireType type);
// f32/float32, bf16/bfloat16 or int8 (any case); kInvalidArgument naming
// `field`, the value and the spellings otherwise.
Result<WireType> ParseWireType(std::string_view value, std::string_view field);

inline constexpr size_t kInt8Block = 256;

// Bytes of a run of n values on the wire: 4n, 2n, or n + 4 ceil(n / 256).
size_t WireBytes(WireType type, size_t n);

// Writes the n values of `in` as WireBytes(type, n) bytes to `wire`
// (unaligned is fine), blocks of kInt8 counted from in[0].
void Quantize(WireType type, const float* in, size_t n, std::byte* wire);
// The n values a run written by Quantize stands for.
void Dequantize(WireType type, const std::byte* wire, size_t n, float* out);

// The scale Quantize(kInt8) gives a block of n <= kInt8Block values (NaN for
// a block with a NaN or infinity).
float Int8Scale(const float* block, size_t n);

// The bounds above, in double (NaN for a non-finite x or scale).
double Bf16WireError(float x);
double Int8WireError(float scale);

// A bound on the error of an f32 sum of `terms` values, in any order, on a
// thread that flushes subnormals: gamma_(terms-1) * sum_abs + 2 terms 2^-126,
// where sum_abs is the sum of the magnitudes of the terms and gamma_j =
// j u / (1 - j u), u = 2^-24 (Higham, "Accuracy and Stability of Numerical
// Algorithms", 4.2); the second part covers subnormal terms read as zero and
// partial sums flushed to zero. 0 for one term (no arithmetic).
double F32SumError(int terms, double sum_abs);

}  // namespace multislice::runtime
