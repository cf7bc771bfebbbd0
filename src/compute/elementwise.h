// Vectorised element-wise kernels of the shardings workload and the
// transformer: sigmoid and its gradient, dtype conversion, scaled updates.
// bf16 values are computed in f32 and rounded once (round to nearest even).
// All functions are thread-safe and run on the calling thread. Sizes are in
// elements; pointers may alias exactly (in place) but not partially overlap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace multislice::compute {

// y = 1 / (1 + exp(-x)).
void Sigmoid(DType dtype, const void* x, void* y, size_t count);

// dx = dy * y * (1 - y), where y = sigmoid(x) was the forward output.
// dy and y have dtype `dtype`; dx has dtype `dx_type`.
void SigmoidGrad(DType dtype, const void* dy, const void* y, DType dx_type,
                 void* dx, size_t count);

// p = p - lr * g (p and g of dtype `dtype`, computed in f32).
void SgdUpdate(DType dtype, void* p, const void* g, float lr, size_t count);

// Converts between f32 and bf16 (or copies when the types match).
void Convert(DType from, const void* x, DType to, void* y, size_t count);

// y = x rounded to bf16 (nearest even, NaN kept a NaN): the operands of the
// bf16 matmuls. With AVX512-BF16 (one instruction per 32 values) f32
// subnormals (|x| < 2^-126) round to zero; otherwise exactly as Convert.
void ToBf16(const float* x, std::uint16_t* y, std::int64_t n);

// The sum of every element, accumulated in f64 (deterministic order).
double Sum(DType dtype, const void* x, size_t count);

// Sets every element to `value`.
void Fill(DType dtype, void* x, float value, size_t count);

}  // namespace multislice::compute
