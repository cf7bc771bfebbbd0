// Counter-based random numbers: the value at an index depends only on the
// seed, a stream id and the index, so any shard of a tensor can be generated
// on its own device and matches the unsharded tensor exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace multislice::compute {

// Uniform in [0, 1) for element `index` of stream `stream`.
float UniformAt(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal (Box-Muller on two counter-based uniforms).
float NormalAt(uint64_t seed, uint64_t stream, uint64_t index);

// Fills a rows x cols block of a logical [*, full_cols] row-major tensor,
// starting at (row0, col0), into `out` with leading dimension `ld` (elements):
// out[r * ld + c] = scale * dist(index = (row0 + r) * full_cols + col0 + c).
// If `transposed`, writes out[c * ld + r] instead (a [cols, rows] block).
enum class Distribution { kUniform, kNormal };
void FillBlock(Distribution dist, uint64_t seed, uint64_t stream, float scale,
               int64_t full_cols, int64_t row0, int64_t col0, int64_t rows,
               int64_t cols, bool transposed, DType dtype, void* out,
               int64_t ld);

}  // namespace multislice::compute
