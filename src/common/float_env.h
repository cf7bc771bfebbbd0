// The floating-point environment of the threads that compute.
//
// Subnormal floats (below 2^-126 in magnitude) take a microcode assist in
// every SSE/AVX instruction on Intel cores, about 100x the time of a normal
// operand. Training produces them: a saturated sigmoid's gradient, or Adam's
// second moment of a gradient that has gone quiet. On an Intel Xeon the f32
// `shardings` step at its defaults took 43.6 s with subnormals and 2.6 s
// without. So every device and stream thread flushes them to zero (FTZ) and
// reads them as zero (DAZ), as TensorFlow's and XLA's CPU thread pools do;
// their values are far below anything bf16 or the f32 master weights resolve.
// bf16 dot-product instructions (AVX512_BF16, AMX) flush them anyway.
//
// The mode belongs to the calling thread (MXCSR), so threads set it
// themselves; every thread that runs kernels of a device does, so the same
// model gives the same bits in every thread and at every ISA level.
#pragma once

#include <xmmintrin.h>

namespace multislice {

inline constexpr unsigned kMxcsrFlushToZero = 0x8000;
inline constexpr unsigned kMxcsrDenormalsAreZero = 0x0040;

// Sets FTZ and DAZ for the calling thread's SSE/AVX arithmetic.
inline void FlushSubnormalsInThisThread() {
  _mm_setcsr(_mm_getcsr() | kMxcsrFlushToZero | kMxcsrDenormalsAreZero);
}

// Whether the calling thread flushes subnormals (both bits set).
inline bool ThisThreadFlushesSubnormals() {
  const unsigned both = kMxcsrFlushToZero | kMxcsrDenormalsAreZero;
  return (_mm_getcsr() & both) == both;
}

}  // namespace multislice
