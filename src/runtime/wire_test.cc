// The wire types' quantisers on their own: sizes, the round-trip error
// against the bounds wire.h states (and the rounding itself against a
// reference computed here in double), and the edge cases: zeros, a block
// with one huge value, tiny and subnormal values, NaN and infinities, runs
// that are not a multiple of the block, and the same bytes whatever the
// thread's subnormal mode.
#include "runtime/wire.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "common/float_env.h"

namespace multislice::runtime {
namespace {

std::vector<float> RoundTrip(WireType type, const std::vector<float>& in) {
  std::vector<std::byte> wire(WireBytes(type, in.size()));
  Quantize(type, in.data(), in.size(), wire.data());
  std::vector<float> out(in.size(), -1.0f);
  Dequantize(type, wire.data(), in.size(), out.data());
  return out;
}

// Values of every sign and of magnitudes up to 2^max_exponent and down to
// 2^-max_exponent (and a little below), each run of 64 in one range of
// exponents, so that int8 blocks see both uniform and mixed magnitudes.
std::vector<float> Sweep(size_t n, unsigned seed, int max_exponent = 60) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const int exponent =
        static_cast<int>((i / 64) * 37 % (2 * max_exponent + 1)) - max_exponent;
    v[i] = std::ldexp(mantissa(rng), exponent);
  }
  return v;
}

TEST(WireTest, NamesParseAndSizes) {
  EXPECT_EQ(Name(WireType::kInt8), "int8");
  EXPECT_EQ(*ParseWireType("BF16", "k"), WireType::kBF16);
  EXPECT_EQ(*ParseWireType("float32", "k"), WireType::kF32);
  EXPECT_EQ(*ParseWireType("int8", "k"), WireType::kInt8);
  Result<WireType> bad = ParseWireType("fp8", "diloco_wire_dtype");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "diloco_wire_dtype: 'fp8' is not a wire type; expected f32, bf16 "
            "or int8");
  EXPECT_EQ(WireBytes(WireType::kF32, 7), 28u);
  EXPECT_EQ(WireBytes(WireType::kBF16, 7), 14u);
  EXPECT_EQ(WireBytes(WireType::kInt8, 0), 0u);
  EXPECT_EQ(WireBytes(WireType::kInt8, 1), 5u);
  EXPECT_EQ(WireBytes(WireType::kInt8, 256), 260u);
  EXPECT_EQ(WireBytes(WireType::kInt8, 257), 265u);
}

TEST(WireTest, F32IsUnchanged) {
  std::vector<float> v = Sweep(1000, 1);
  v.push_back(1e-40f);
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> out = RoundTrip(WireType::kF32, v);
  EXPECT_EQ(std::memcmp(out.data(), v.data(), v.size() * 4), 0);
}

// The reference rounding: x to 8 significant bits, nearest, ties to even,
// in double (exact: x has 24 bits); subnormals read as zero.
float Bf16Reference(float x) {
  if (std::fabs(x) < FLT_MIN) return std::copysign(0.0f, x);
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, e - 8);
  return static_cast<float>(std::nearbyint(x / ulp) * ulp);
}

TEST(WireTest, Bf16RoundsToNearestEvenWithinHalfAnUlp) {
  const std::vector<float> v = Sweep(100000, 2, 125);
  const std::vector<float> out = RoundTrip(WireType::kBF16, v);
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(out[i], Bf16Reference(v[i])) << v[i];
    const double err = std::fabs(static_cast<double>(out[i]) - v[i]);
    ASSERT_LE(err, Bf16WireError(v[i])) << v[i];
    if (std::fabs(v[i]) >= FLT_MIN) {
      ASSERT_LE(Bf16WireError(v[i]), std::ldexp(std::fabs(v[i]), -8)) << v[i];
    }
  }
  // Ties go to the even neighbour, and there the bound is attained.
  const float tie_down = 1.0f + 0x1p-8f, tie_up = 1.0f + 3 * 0x1p-8f;
  const std::vector<float> ties =
      RoundTrip(WireType::kBF16, {tie_down, tie_up, -tie_down});
  EXPECT_EQ(ties[0], 1.0f);
  EXPECT_EQ(ties[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(ties[2], -1.0f);
  EXPECT_EQ(std::fabs(ties[0] - tie_down), Bf16WireError(tie_down));
  EXPECT_EQ(Bf16WireError(tie_down), 0x1p-8);
}

TEST(WireTest, Bf16EdgeCases) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float below_overflow = std::bit_cast<float>(0x7f7f7fffu);
  const std::vector<float> v = {0.0f,  -0.0f, 1e-40f, -1e-40f, FLT_MIN,
                                nan,   inf,   -inf,   FLT_MAX, below_overflow,
                                -3.5f, 1e38f};
  const std::vector<float> out = RoundTrip(WireType::kBF16, v);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[0]), 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[1]), 0x80000000u);
  // Subnormals are read as zero, keeping the sign; the bound covers them.
  EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[3]), 0x80000000u);
  EXPECT_LE(1e-40, Bf16WireError(1e-40f));
  EXPECT_EQ(out[4], FLT_MIN);
  EXPECT_TRUE(std::isnan(out[5]));
  EXPECT_EQ(out[6], inf);
  EXPECT_EQ(out[7], -inf);
  // FLT_MAX is past the midpoint below 2^128: infinity, an unbounded error.
  EXPECT_EQ(out[8], inf);
  EXPECT_EQ(Bf16WireError(FLT_MAX), std::numeric_limits<double>::infinity());
  EXPECT_EQ(std::bit_cast<uint32_t>(out[9]), 0x7f7f0000u);  // largest bf16
  EXPECT_LE(std::fabs(static_cast<double>(out[9]) - below_overflow),
            Bf16WireError(below_overflow));
  EXPECT_EQ(out[10], -3.5f);
  EXPECT_TRUE(std::isnan(Bf16WireError(nan)));
  EXPECT_TRUE(std::isnan(Bf16WireError(inf)));
}

// The scale of each block, computed here: max |x| / 127 in f32 (the values
// of these tests are all normal and far from the range limits).
std::vector<float> ReferenceScales(const std::vector<float>& v) {
  std::vector<float> scales;
  for (size_t b = 0; b < v.size(); b += kInt8Block) {
    float m = 0;
    for (size_t i = b; i < std::min(v.size(), b + kInt8Block); ++i) {
      m = std::max(m, std::fabs(v[i]));
    }
    scales.push_back(m / 127.0f);
  }
  return scales;
}

TEST(WireTest, Int8WithinHalfAStepOfEachBlocksScale) {
  // 1000 values: three whole blocks and one of 232.
  for (unsigned seed : {3u, 4u, 5u}) {
    const std::vector<float> v = Sweep(1000, seed);
    const std::vector<float> scales = ReferenceScales(v);
    ASSERT_EQ(scales.size(), 4u);
    std::vector<std::byte> wire(WireBytes(WireType::kInt8, v.size()));
    Quantize(WireType::kInt8, v.data(), v.size(), wire.data());
    std::vector<float> out(v.size());
    Dequantize(WireType::kInt8, wire.data(), v.size(), out.data());
    for (size_t b = 0; b < scales.size(); ++b) {
      float stored;
      std::memcpy(&stored, wire.data() + 4 * b, 4);
      EXPECT_EQ(stored, scales[b]);
      const size_t n = std::min(kInt8Block, v.size() - b * kInt8Block);
      EXPECT_EQ(Int8Scale(v.data() + b * kInt8Block, n), scales[b]);
    }
    size_t max_at_127 = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const float s = scales[i / kInt8Block];
      const double err = std::fabs(static_cast<double>(out[i]) - v[i]);
      ASSERT_LE(err, Int8WireError(s)) << i;
      // Up to f32 rounding, the value is the nearest multiple of the scale.
      ASSERT_LE(err, s * (0.5 + 0x1p-16)) << i;
      const int8_t q = static_cast<int8_t>(wire[4 * scales.size() + i]);
      ASSERT_LE(std::abs(q), 127);
      if (std::abs(q) == 127) ++max_at_127;
    }
    EXPECT_GE(max_at_127, scales.size());  // each block's max maps to +-127
  }
}

TEST(WireTest, Int8EdgeCases) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // A block of zeros: scale 0, zeros back.
  {
    const std::vector<float> zeros(300, 0.0f);
    const std::vector<float> out = RoundTrip(WireType::kInt8, zeros);
    for (float x : out) EXPECT_EQ(std::bit_cast<uint32_t>(x), 0u);
    EXPECT_EQ(Int8Scale(zeros.data(), 256), 0.0f);
  }
  // One huge value: the others of its block go to zero, within the bound
  // of the huge scale; the next block keeps its own scale.
  {
    std::vector<float> v(512, 1.0f);
    v[17] = 1e30f;
    v[300] = 2.0f;
    const std::vector<float> out = RoundTrip(WireType::kInt8, v);
    const float s = Int8Scale(v.data(), 256);
    EXPECT_EQ(s, 1e30f / 127.0f);
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_LE(std::fabs(static_cast<double>(out[17]) - 1e30), Int8WireError(s));
    for (size_t i = 256; i < 512; ++i) {
      EXPECT_LE(std::fabs(out[i] - v[i]), Int8WireError(2.0f / 127.0f)) << i;
    }
  }
  // FLT_MAX: the scale steps down so that 127 * scale stays finite.
  {
    const std::vector<float> v = {FLT_MAX, -FLT_MAX, 1.0f};
    const std::vector<float> out = RoundTrip(WireType::kInt8, v);
    const float s = Int8Scale(v.data(), v.size());
    EXPECT_TRUE(std::isfinite(127.0f * s));
    EXPECT_TRUE(std::isfinite(out[0]));
    EXPECT_EQ(out[1], -out[0]);
    EXPECT_LE(std::fabs(static_cast<double>(out[0]) - FLT_MAX),
              Int8WireError(s));
  }
  // Tiny blocks (max below 127 * 2^-126) take the scale 2^-126; subnormals
  // are read as zero; a block of subnormals only has scale 0.
  {
    std::vector<float> v(256, 3e-37f);
    v[1] = -1e-37f;
    v[2] = 1e-40f;
    std::vector<float> sub(10, 1e-39f);
    v.insert(v.end(), sub.begin(), sub.end());
    std::vector<std::byte> wire(WireBytes(WireType::kInt8, v.size()));
    Quantize(WireType::kInt8, v.data(), v.size(), wire.data());
    std::vector<float> out(v.size());
    Dequantize(WireType::kInt8, wire.data(), v.size(), out.data());
    EXPECT_EQ(Int8Scale(v.data(), 256), FLT_MIN);
    EXPECT_EQ(Int8Scale(v.data() + 256, 10), 0.0f);
    for (size_t i = 0; i < v.size(); ++i) {
      const float s = i < 256 ? FLT_MIN : 0.0f;
      EXPECT_LE(std::fabs(static_cast<double>(out[i]) - v[i]), Int8WireError(s))
          << i;
    }
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[256], 0.0f);
  }
  // A NaN or an infinity poisons its own block (all NaN) and no other.
  for (float bad : {nan, inf, -inf}) {
    std::vector<float> v = Sweep(600, 6);
    v[300] = bad;
    const std::vector<float> out = RoundTrip(WireType::kInt8, v);
    EXPECT_TRUE(std::isnan(Int8Scale(v.data() + 256, 256)));
    for (size_t i = 0; i < v.size(); ++i) {
      const bool poisoned = i >= 256 && i < 512;
      EXPECT_EQ(std::isnan(out[i]), poisoned) << i;
    }
  }
  EXPECT_TRUE(std::isnan(Int8WireError(nan)));
  // Nothing to move.
  RoundTrip(WireType::kInt8, {});
}

// A run that is not a multiple of the block: the tail block has its own
// scale, from its own values only.
TEST(WireTest, Int8TailBlockHasItsOwnScale) {
  std::vector<float> v(300, 0.5f);
  v[299] = 64.0f;  // in the 44-value tail
  std::vector<std::byte> wire(WireBytes(WireType::kInt8, v.size()));
  Quantize(WireType::kInt8, v.data(), v.size(), wire.data());
  float scales[2];
  std::memcpy(scales, wire.data(), 8);
  EXPECT_EQ(scales[0], 0.5f / 127.0f);
  EXPECT_EQ(scales[1], 64.0f / 127.0f);
  std::vector<float> out(v.size());
  Dequantize(WireType::kInt8, wire.data(), v.size(), out.data());
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[299], 64.0f);
  EXPECT_LE(std::fabs(out[256] - 0.5f), Int8WireError(scales[1]));
}

// The device and stream threads flush subnormals; the bytes are the same
// there as on a thread that keeps them.
TEST(WireTest, BytesDoNotDependOnTheThreadsSubnormalMode) {
  std::vector<float> v = Sweep(2000, 7, 120);
  for (size_t i = 0; i < v.size(); i += 13) v[i] = std::ldexp(v[i], -140);
  for (size_t i = 1000; i < 1256; ++i) v[i] = std::ldexp(1.0f + i, -140);
  for (WireType type : {WireType::kBF16, WireType::kInt8}) {
    std::vector<std::byte> here(WireBytes(type, v.size()));
    std::vector<std::byte> flushing(here.size());
    Quantize(type, v.data(), v.size(), here.data());
    std::vector<float> out_here(v.size()), out_flushing(v.size());
    Dequantize(type, here.data(), v.size(), out_here.data());
    std::thread([&] {
      FlushSubnormalsInThisThread();
      Quantize(type, v.data(), v.size(), flushing.data());
      Dequantize(type, flushing.data(), v.size(), out_flushing.data());
    }).join();
    EXPECT_TRUE(here == flushing) << Name(type);
    EXPECT_TRUE(out_here == out_flushing) << Name(type);
  }
}

TEST(WireTest, F32SumErrorBoundsSumsInEveryOrder) {
  EXPECT_EQ(F32SumError(1, 5.0), 0.0);
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int trial = 0; trial < 10000; ++trial) {
    float x[4];
    double exact = 0, sum_abs = 0;
    for (float& v : x) {
      v = std::ldexp(value(rng), trial % 40 - 20);
      exact += v;
      sum_abs += std::fabs(v);
    }
    const float forward = ((x[0] + x[1]) + x[2]) + x[3];
    const float tree = (x[0] + x[1]) + (x[2] + x[3]);
    ASSERT_LE(std::fabs(forward - exact), F32SumError(4, sum_abs));
    ASSERT_LE(std::fabs(tree - exact), F32SumError(4, sum_abs));
  }
}

}  // namespace
}  // namespace multislice::runtime
