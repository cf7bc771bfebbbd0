// Counter-based random numbers.
//
// The 64 random bits of element `index` are splitmix64's output function
// applied to key + (index + 1) * golden, where the key hashes (seed, stream):
// this is exactly splitmix64's sequence started at the key, so elements are
// as independent as splitmix64's outputs (it passes BigCrush), and any
// element costs one hash. Normals come in Box-Muller pairs: elements 2j and
// 2j + 1 are r cos(theta) and r sin(theta) of pair j, whose two uniforms
// both come from the bits of index j of a derived stream.
#include "compute/random.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "common/bf16.h"

namespace multislice::compute {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t StreamKey(uint64_t seed, uint64_t stream) {
  return Mix64(seed ^ Mix64(stream * kGolden + 0x632be59bd9b4e019ull));
}

uint64_t BitsAt(uint64_t key, uint64_t index) {
  return Mix64(key + (index + 1) * kGolden);
}

float UniformFromBits(uint64_t bits) {
  return static_cast<float>(bits >> 40) * 0x1p-24f;
}

// The Box-Muller pair j of (seed, stream): {r cos(theta), r sin(theta)}.
struct NormalPair {
  float cos_value, sin_value;
};

NormalPair NormalPairAt(uint64_t normal_key, uint64_t pair) {
  const uint64_t bits = BitsAt(normal_key, pair);
  // u1 in (0, 1] from 32 bits (the float conversion keeps the relative
  // precision near 0, so tails reach about 6.7 sigma); theta from 24 others.
  const float u1 = static_cast<float>((bits >> 32) + 1) * 0x1p-32f;
  const float theta =
      static_cast<float>(bits & 0xffffff) * (0x1p-24f * 6.28318530717958648f);
  const float r = std::sqrt(-2.0f * std::log(u1));
  return {r * std::cos(theta), r * std::sin(theta)};
}

// Normals use a stream of their own so that UniformAt and NormalAt of the
// same (seed, stream) are unrelated.
uint64_t NormalKey(uint64_t seed, uint64_t stream) {
  return StreamKey(seed ^ 0x5851f42d4c957f2dull, stream);
}

// Writes scale * dist(first + c) for c in [0, cols) to row[c].
void GenerateRow(Distribution dist, uint64_t uniform_key, uint64_t normal_key,
                 float scale, uint64_t first, int64_t cols, float* row) {
  if (dist == Distribution::kUniform) {
    for (int64_t c = 0; c < cols; ++c) {
      row[c] = scale * UniformFromBits(BitsAt(uniform_key, first + c));
    }
    return;
  }
  // One Box-Muller pair per two elements, with a lone element at either end
  // when the row starts or ends in the middle of a pair.
  int64_t c = 0;
  while (c < cols) {
    const uint64_t index = first + c;
    NormalPair pair = NormalPairAt(normal_key, index >> 1);
    if ((index & 1) == 0) {
      row[c++] = scale * pair.cos_value;
      if (c < cols) row[c++] = scale * pair.sin_value;
    } else {
      row[c++] = scale * pair.sin_value;
    }
  }
}

void Store(DType dtype, void* out, int64_t offset, float value) {
  if (dtype == DType::kF32) {
    static_cast<float*>(out)[offset] = value;
  } else {
    static_cast<uint16_t*>(out)[offset] = bf16::FromFloat(value);
  }
}

}  // namespace

float UniformAt(uint64_t seed, uint64_t stream, uint64_t index) {
  return UniformFromBits(BitsAt(StreamKey(seed, stream), index));
}

float NormalAt(uint64_t seed, uint64_t stream, uint64_t index) {
  NormalPair pair = NormalPairAt(NormalKey(seed, stream), index >> 1);
  return (index & 1) ? pair.sin_value : pair.cos_value;
}

void FillBlock(Distribution dist, uint64_t seed, uint64_t stream, float scale,
               int64_t full_cols, int64_t row0, int64_t col0, int64_t rows,
               int64_t cols, bool transposed, DType dtype, void* out,
               int64_t ld) {
  assert(rows >= 0 && cols >= 0 && row0 >= 0 && col0 >= 0);
  assert(col0 + cols <= full_cols);
  assert(ld >= (transposed ? rows : cols));
  const uint64_t uniform_key = StreamKey(seed, stream);
  const uint64_t normal_key = NormalKey(seed, stream);
  // Rows are generated a block at a time so that a transposed block is
  // written kRowBlock consecutive elements at a time, not one per line.
  constexpr int64_t kRowBlock = 16;
  std::vector<float> block(static_cast<size_t>(kRowBlock * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t n = std::min(kRowBlock, rows - r0);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t first =
          static_cast<uint64_t>(row0 + r0 + i) * full_cols + col0;
      GenerateRow(dist, uniform_key, normal_key, scale, first, cols,
                  block.data() + i * cols);
    }
    if (transposed) {
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t i = 0; i < n; ++i) {
          Store(dtype, out, c * ld + r0 + i, block[i * cols + c]);
        }
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t c = 0; c < cols; ++c) {
          Store(dtype, out, (r0 + i) * ld + c, block[i * cols + c]);
        }
      }
    }
  }
}

}  // namespace multislice::compute
