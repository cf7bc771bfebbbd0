// Checks the vectorised reductions bit for bit against a scalar loop that
// follows the documented rules: f32 accumulation in source order, one
// round-to-nearest-even to bf16, NaN-propagating max/min.
#include "runtime/comm/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/bf16.h"
#include "common/isa_testing.h"

namespace multislice::comm {
namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Random values spread over several binades, so that sums round.
float RandomValue(uint64_t& state) {
  const uint64_t x = SplitMix(state);
  const float mantissa =
      static_cast<float>(static_cast<int32_t>(x & 0xffffff) - 0x800000) /
      0x800000;
  return std::ldexp(mantissa, static_cast<int>((x >> 32) % 24) - 12);
}

// An array of `count` elements of `dtype`, stored as raw bytes.
std::vector<char> RandomArray(DType dtype, size_t count, uint64_t seed) {
  std::vector<char> bytes(count * SizeOf(dtype));
  uint64_t state = seed * 7919 + 17;
  for (size_t i = 0; i < count; ++i) {
    const float v = RandomValue(state);
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t b = bf16::FromFloat(v);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  return bytes;
}

float Load(DType dtype, const char* p, size_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t b;
  std::memcpy(&b, p + 2 * i, 2);
  return bf16::ToFloat(b);
}

void Store(DType dtype, char* p, size_t i, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    const uint16_t b = bf16::FromFloat(v);
    std::memcpy(p + 2 * i, &b, 2);
  }
}

float RefCombine(ReduceOp op, float acc, float x) {
  switch (op) {
    case ReduceOp::kSum:
      return acc + x;
    case ReduceOp::kMax:
      return (acc > x || std::isnan(acc)) ? acc : x;
    case ReduceOp::kMin:
      return (acc < x || std::isnan(acc)) ? acc : x;
  }
  return 0;
}

// The straightforward reduction every result is compared against.
std::vector<char> Reference(DType dtype, ReduceOp op,
                            const std::vector<std::vector<char>>& srcs,
                            size_t count) {
  if (srcs.size() == 1) return srcs[0];
  std::vector<char> out(count * SizeOf(dtype));
  for (size_t i = 0; i < count; ++i) {
    float acc = Load(dtype, srcs[0].data(), i);
    for (size_t s = 1; s < srcs.size(); ++s) {
      acc = RefCombine(op, acc, Load(dtype, srcs[s].data(), i));
    }
    Store(dtype, out.data(), i, acc);
  }
  return out;
}

// Index of the first differing element, or -1.
long FirstMismatch(const char* a, const char* b, size_t count, size_t es) {
  if (std::memcmp(a, b, count * es) == 0) return -1;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * es, b + i * es, es) != 0)
      return static_cast<long>(i);
  }
  return -1;
}

using Param = std::tuple<Isa, DType, ReduceOp, size_t /*count*/, int /*n*/>;

class ReduceNToTest : public ::testing::TestWithParam<Param> {};

// Every destination of ReduceNTo, including one that is not 64-byte aligned
// (the streaming path's unaligned head), receives the reference result.
TEST_P(ReduceNToTest, MatchesReferenceForEveryDestination) {
  const auto [isa, dtype, op, count, n] = GetParam();
  ScopedIsaCap cap(isa);
  const size_t es = SizeOf(dtype);
  std::vector<std::vector<char>> srcs;
  for (int s = 0; s < n; ++s) srcs.push_back(RandomArray(dtype, count, s + 1));
  const std::vector<char> want = Reference(dtype, op, srcs, count);

  for (int m : {1, 3}) {
    // Destination d starts d elements into its buffer.
    std::vector<std::vector<char>> storage(m);
    std::vector<void*> dsts(m);
    for (int d = 0; d < m; ++d) {
      storage[d].assign((count + d) * es, 0x5a);
      dsts[d] = storage[d].data() + d * es;
    }
    std::vector<const void*> src_ptrs;
    for (const auto& s : srcs) src_ptrs.push_back(s.data());
    ReduceNTo(dtype, op, dsts.data(), m, src_ptrs.data(), n, count);
    for (int d = 0; d < m; ++d) {
      EXPECT_EQ(FirstMismatch(static_cast<const char*>(dsts[d]), want.data(),
                              count, es),
                -1)
          << "destination " << d << " of " << m;
    }
  }
}

// ReduceN writes over its first and its last source (exact aliasing).
TEST_P(ReduceNToTest, InPlaceOverASource) {
  const auto [isa, dtype, op, count, n] = GetParam();
  ScopedIsaCap cap(isa);
  const size_t es = SizeOf(dtype);
  for (int target : {0, n - 1}) {
    std::vector<std::vector<char>> srcs;
    for (int s = 0; s < n; ++s) {
      srcs.push_back(RandomArray(dtype, count, 100 + s));
    }
    const std::vector<char> want = Reference(dtype, op, srcs, count);
    std::vector<const void*> src_ptrs;
    for (const auto& s : srcs) src_ptrs.push_back(s.data());
    ReduceN(dtype, op, srcs[target].data(), src_ptrs.data(), n, count);
    EXPECT_EQ(FirstMismatch(srcs[target].data(), want.data(), count, es), -1)
        << "in place over source " << target;
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [isa, dtype, op, count, n] = info.param;
  return IsaTestName(isa) + "_" +
         std::string(dtype == DType::kF32 ? "f32" : "bf16") + "_" +
         std::string(Name(op)) + "_count" + std::to_string(count) + "_n" +
         std::to_string(n);
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, ReduceNToTest,
    ::testing::Combine(
        ::testing::ValuesIn(RunnableIsaLevels()),
        ::testing::Values(DType::kF32, DType::kBF16),
        ::testing::Values(ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin),
        ::testing::Values(size_t{1}, size_t{7}, size_t{4099}, size_t{1000003}),
        ::testing::Values(1, 2, 3, 5)),
    ParamName);

TEST(Reduce2Test, MatchesReduceN) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      const size_t count = 3001;
      std::vector<std::vector<char>> srcs = {RandomArray(dtype, count, 5),
                                             RandomArray(dtype, count, 6)};
      const std::vector<char> want = Reference(dtype, op, srcs, count);
      std::vector<char> got(want.size());
      Reduce2(dtype, op, got.data(), srcs[0].data(), srcs[1].data(), count);
      EXPECT_EQ(got, want) << Name(dtype) << " " << Name(op);
      // dst == b.
      Reduce2(dtype, op, srcs[1].data(), srcs[0].data(), srcs[1].data(), count);
      EXPECT_EQ(srcs[1], want) << Name(dtype) << " " << Name(op);
    }
  }
}

TEST(Reduce2Test, ZeroCountTouchesNothing) {
  float a = 1, b = 2, dst = 3;
  Reduce2(DType::kF32, ReduceOp::kSum, &dst, &a, &b, 0);
  EXPECT_EQ(dst, 3);
}

// The vectorised f32 -> bf16 rounding equals bf16::FromFloat for every bf16
// sum x + y whose exact f32 value needs rounding, including ties (round to
// even), overflow to infinity, subnormals and NaN.
TEST(Reduce2Test, Bf16RoundingMatchesFromFloat) {
  std::vector<uint16_t> a, b;
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f,
                               0x0080, 0x3f80, 0x3f81, 0xbf80, 0x7f7f,
                               0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7fa0};
  // 1 + 2^-8 is an exact tie: rounds down to even 0x3f80; 1.0078125 + 2^-8
  // rounds up to 0x3f82.
  a.push_back(0x3f80);
  b.push_back(0x3b80);
  a.push_back(0x3f81);
  b.push_back(0x3b80);
  for (uint16_t x : specials) {
    for (uint16_t y : specials) {
      a.push_back(x);
      b.push_back(y);
    }
  }
  uint64_t state = 99;
  for (int i = 0; i < (1 << 20); ++i) {
    const uint64_t r = SplitMix(state);
    a.push_back(static_cast<uint16_t>(r));
    b.push_back(static_cast<uint16_t>(r >> 16));
  }
  std::vector<uint16_t> got(a.size());
  Reduce2(DType::kBF16, ReduceOp::kSum, got.data(), a.data(), b.data(),
          a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const float fa = bf16::ToFloat(a[i]), fb = bf16::ToFloat(b[i]);
    if (std::isnan(fa) && std::isnan(fb)) {
      // Which of two NaN payloads an addition keeps is not specified.
      ASSERT_TRUE(std::isnan(bf16::ToFloat(got[i])));
      continue;
    }
    ASSERT_EQ(got[i], bf16::FromFloat(fa + fb))
        << std::hex << a[i] << " + " << b[i];
  }
}

// max/min: a NaN anywhere gives a NaN (the first one in source order), and
// the result does not depend on the vector path taken (position in block).
TEST(ReduceNaNTest, MaxMinPropagateTheFirstNaN) {
  const float nan1 = std::bit_cast<float>(0x7fc00001u);
  const float nan2 = std::bit_cast<float>(0xffc00002u);
  const size_t count = 100;
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<float> s0(count, 1.0f), s1(count, 2.0f), s2(count, 3.0f);
    s1[3] = nan1;
    s2[3] = nan2;  // second NaN at the same element: the first one wins
    s2[50] = nan2;
    s0[77] = nan1;
    const void* srcs[3] = {s0.data(), s1.data(), s2.data()};
    std::vector<float> got(count);
    ReduceN(DType::kF32, op, got.data(), srcs, 3, count);
    EXPECT_EQ(std::bit_cast<uint32_t>(got[3]), 0x7fc00001u);
    EXPECT_EQ(std::bit_cast<uint32_t>(got[50]), 0xffc00002u);
    EXPECT_EQ(std::bit_cast<uint32_t>(got[77]), 0x7fc00001u);
    EXPECT_EQ(got[0], op == ReduceOp::kMax ? 3.0f : 1.0f);
  }
  // bf16: the NaN survives the rounding (quieted).
  std::vector<uint16_t> a(40, bf16::FromFloat(1.0f)), b(40, 0x7f81);
  std::vector<uint16_t> got(40);
  Reduce2(DType::kBF16, ReduceOp::kMax, got.data(), a.data(), b.data(), 40);
  for (uint16_t g : got) EXPECT_EQ(g, 0x7fc1);
}

TEST(ReduceNaNTest, SignedZeroTiesGoToTheLaterSource) {
  const float pz = 0.0f, nz = -0.0f;
  float got;
  Reduce2(DType::kF32, ReduceOp::kMax, &got, &pz, &nz, 1);
  EXPECT_TRUE(std::signbit(got));
  Reduce2(DType::kF32, ReduceOp::kMax, &got, &nz, &pz, 1);
  EXPECT_FALSE(std::signbit(got));
  Reduce2(DType::kF32, ReduceOp::kMin, &got, &pz, &nz, 1);
  EXPECT_TRUE(std::signbit(got));
}

// With one source every destination gets the bits unchanged, even a
// signalling NaN that a bf16 round trip would quiet.
TEST(ReduceSingleSourceTest, CopiesBits) {
  std::vector<uint16_t> src(5000, 0x7f81);
  src[0] = 0x1234;
  std::vector<uint16_t> d0(5000), d1(5000);
  void* dsts[3] = {d0.data(), src.data(), d1.data()};
  const void* srcs[1] = {src.data()};
  ReduceNTo(DType::kBF16, ReduceOp::kSum, dsts, 3, srcs, 1, src.size());
  EXPECT_EQ(d0, src);
  EXPECT_EQ(d1, src);
  EXPECT_EQ(src[1], 0x7f81);
}

}  // namespace
}  // namespace multislice::comm
