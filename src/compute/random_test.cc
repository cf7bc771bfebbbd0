// Counter-based random numbers: determinism, blocks equal to single
// elements (so shards match the unsharded tensor), and distribution sanity
// with bounds that chance cannot break.
#include "compute/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/bf16.h"

namespace multislice::compute {
namespace {

TEST(RandomTest, SameArgumentsSameValue) {
  for (uint64_t i : {0ull, 1ull, 2ull, 12345ull, 1ull << 40}) {
    EXPECT_EQ(UniformAt(7, 3, i), UniformAt(7, 3, i));
    EXPECT_EQ(NormalAt(7, 3, i), NormalAt(7, 3, i));
  }
}

TEST(RandomTest, SeedStreamAndIndexAllMatter) {
  int same_seed = 0, same_stream = 0, same_index = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_seed += UniformAt(1, 0, i) == UniformAt(2, 0, i);
    same_stream += UniformAt(1, 0, i) == UniformAt(1, 1, i);
    same_index += UniformAt(1, 0, i) == UniformAt(1, 0, i + 1);
  }
  // Two independent 24-bit values agree with probability 2^-24.
  EXPECT_LE(same_seed, 1);
  EXPECT_LE(same_stream, 1);
  EXPECT_LE(same_index, 1);
}

TEST(RandomTest, UniformHas24BitsInRange) {
  for (uint64_t i = 0; i < 100000; ++i) {
    float u = UniformAt(5, 9, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    float scaled = u * 16777216.0f;
    ASSERT_EQ(scaled, std::floor(scaled)) << "not a multiple of 2^-24";
  }
}

struct Moments {
  double mean = 0, variance = 0;
};

template <typename F>
Moments MomentsOf(int n, F f) {
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    double v = f(i);
    sum += v;
    sum_sq += v * v;
  }
  Moments m;
  m.mean = sum / n;
  m.variance = sum_sq / n - m.mean * m.mean;
  return m;
}

// With 10^6 samples the standard errors are about 3e-4 (uniform mean),
// 1e-3 (normal mean) and 1.4e-3 (normal variance): the bounds below are
// more than 7 of them away.
TEST(RandomTest, UniformMoments) {
  Moments m = MomentsOf(1000000, [](int i) { return UniformAt(123, 0, i); });
  EXPECT_NEAR(m.mean, 0.5, 0.003);
  EXPECT_NEAR(m.variance, 1.0 / 12, 0.003);
}

TEST(RandomTest, NormalMomentsAndTails) {
  Moments m = MomentsOf(1000000, [](int i) { return NormalAt(123, 0, i); });
  EXPECT_NEAR(m.mean, 0.0, 0.01);
  EXPECT_NEAR(m.variance, 1.0, 0.02);
  // P(|z| > 3) = 0.0027: expect 2700 of 10^6 (standard deviation 52).
  int beyond3 = 0;
  for (int i = 0; i < 1000000; ++i) {
    float z = NormalAt(99, 1, i);
    ASSERT_TRUE(std::isfinite(z));
    beyond3 += std::fabs(z) > 3.0f;
  }
  EXPECT_GT(beyond3, 2300);
  EXPECT_LT(beyond3, 3100);
}

TEST(RandomTest, NeighboursAndStreamsAreUncorrelated) {
  const int n = 1000000;
  double adjacent = 0, streams = 0, uniform_normal = 0;
  for (int i = 0; i < n; ++i) {
    // Elements 2j and 2j+1 share a Box-Muller pair: check that pair too.
    adjacent += NormalAt(8, 0, i) * NormalAt(8, 0, i + 1);
    streams += NormalAt(8, 0, i) * NormalAt(8, 1, i);
    uniform_normal += (UniformAt(8, 0, i) - 0.5) * NormalAt(8, 0, i);
  }
  // Each mean has a standard error of about 1e-3 (0.3e-3 for the last).
  EXPECT_NEAR(adjacent / n, 0.0, 0.01);
  EXPECT_NEAR(streams / n, 0.0, 0.01);
  EXPECT_NEAR(uniform_normal / n, 0.0, 0.005);
}

// FillBlock at (row0, col0) of a [*, full_cols] tensor equals the element
// functions, in both layouts and both types.
void CheckBlock(Distribution dist, bool transposed, DType dtype, int64_t row0,
                int64_t col0, int64_t rows, int64_t cols) {
  SCOPED_TRACE(testing::Message()
               << "row0=" << row0 << " col0=" << col0 << " rows=" << rows
               << " cols=" << cols << (transposed ? " transposed" : ""));
  const int64_t full_cols = 37;
  const float scale = 0.5f;
  const int64_t ld = (transposed ? rows : cols) + 2;
  const int64_t out_rows = transposed ? cols : rows;
  std::vector<float> out32(out_rows * ld, -99.0f);
  std::vector<uint16_t> out16(out_rows * ld, 0xbeef);
  void* out = dtype == DType::kF32 ? static_cast<void*>(out32.data())
                                   : static_cast<void*>(out16.data());
  FillBlock(dist, 42, 6, scale, full_cols, row0, col0, rows, cols, transposed,
            dtype, out, ld);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      uint64_t index = (row0 + r) * full_cols + col0 + c;
      float expected =
          scale * (dist == Distribution::kUniform ? UniformAt(42, 6, index)
                                                  : NormalAt(42, 6, index));
      int64_t at = transposed ? c * ld + r : r * ld + c;
      if (dtype == DType::kF32) {
        ASSERT_EQ(out32[at], expected) << r << "," << c;
      } else {
        ASSERT_EQ(out16[at], bf16::FromFloat(expected)) << r << "," << c;
      }
    }
  }
  // Nothing outside the block was written.
  int written_padding = 0;
  for (int64_t i = 0; i < out_rows; ++i) {
    for (int64_t j = transposed ? rows : cols; j < ld; ++j) {
      written_padding += dtype == DType::kF32 ? out32[i * ld + j] != -99.0f
                                              : out16[i * ld + j] != 0xbeef;
    }
  }
  EXPECT_EQ(written_padding, 0);
}

TEST(FillBlockTest, EqualsElementFunctions) {
  for (Distribution dist : {Distribution::kUniform, Distribution::kNormal}) {
    for (bool transposed : {false, true}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        // Odd and even starts and widths: pairs split across rows and ends.
        CheckBlock(dist, transposed, dtype, 0, 0, 5, 37);
        CheckBlock(dist, transposed, dtype, 3, 1, 4, 6);
        CheckBlock(dist, transposed, dtype, 2, 4, 3, 7);
        CheckBlock(dist, transposed, dtype, 7, 36, 2, 1);
        CheckBlock(dist, transposed, dtype, 1, 5, 0, 3);
        // More rows than FillBlock generates at a time.
        CheckBlock(dist, transposed, dtype, 1, 3, 37, 30);
      }
    }
  }
}

TEST(FillBlockTest, ShardsTileTheWholeTensor) {
  // A [6, 8] tensor filled whole equals four [3, 4] shards filled apart.
  const int64_t rows = 6, cols = 8;
  std::vector<float> whole(rows * cols);
  FillBlock(Distribution::kNormal, 1, 2, 1e-4f, cols, 0, 0, rows, cols, false,
            DType::kF32, whole.data(), cols);
  for (int64_t r0 : {0, 3}) {
    for (int64_t c0 : {0, 4}) {
      std::vector<float> shard(3 * 4);
      FillBlock(Distribution::kNormal, 1, 2, 1e-4f, cols, r0, c0, 3, 4, false,
                DType::kF32, shard.data(), 4);
      for (int64_t r = 0; r < 3; ++r) {
        for (int64_t c = 0; c < 4; ++c) {
          EXPECT_EQ(shard[r * 4 + c], whole[(r0 + r) * cols + c0 + c]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace multislice::compute
