// Vectorised element-wise reductions used by every transport. bf16 inputs
// are reduced in f32 and rounded once to bf16 (round to nearest even).
//
// All functions are thread-safe and pure; pointers may alias exactly
// (dst == a) but must not partially overlap. Sizes are in elements.
#pragma once

#include <cstddef>

#include "runtime/comm/types.h"

namespace multislice::comm {

// dst[i] = op(a[i], b[i]).
void Reduce2(DType dtype, ReduceOp op, void* dst, const void* a, const void* b,
             size_t count);

// dst[i] = op over srcs[0..n)[i], for n >= 1, accumulated in f32 and
// rounded once. dst may be one of the sources.
void ReduceN(DType dtype, ReduceOp op, void* dst, const void* const* srcs,
             int n, size_t count);

// As ReduceN, writing the result to each of dsts[0..m) in the same pass
// (the fused "reduce and broadcast" of the shared-memory all-reduce). Any
// dst may be one of the sources: each element is read from every source
// before it is written.
void ReduceNTo(DType dtype, ReduceOp op, void* const* dsts, int m,
               const void* const* srcs, int n, size_t count);

}  // namespace multislice::comm
