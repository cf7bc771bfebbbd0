// Compiles a kernel once per x86-64 level and runs the version of
// ActiveIsa() (cpu_isa.h). Include only from the .cc file that defines the
// kernel.
//
// A kernel is a type in an anonymous namespace with an always-inline call
// operator whose first parameter is the level's tag:
//
//   struct AddKernel {
//     MS_KERNEL void operator()(auto /*isa*/, float* y, const float* x,
//                               int64_t n) const { ... }
//   };
//   void Add(float* y, const float* x, int64_t n) {
//     isa::Dispatch<AddKernel>(y, x, n);
//   }
//
// Dispatch instantiates three functions, with GCC's target attribute for
// x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the baseline, each with the
// kernel's body inlined, so code on GCC's vector types (and loops GCC
// vectorises) becomes 512-, 256- or 128-bit code. A kernel that needs an
// instruction of one level only (an intrinsic) branches on the tag with
// `if constexpr (isa::kLevel<decltype(tag)> >= Isa::kAvx512)` and calls a
// function defined with that target (an intrinsic cannot be inlined into the
// kernel's own body, which has no target).
//
// The build must not add -march for a level above the baseline (the root
// CMakeLists.txt pins -march=x86-64): GCC refuses to inline a body compiled
// for more than the level of its caller.
#pragma once

#include "common/cpu_isa.h"

#define MS_KERNEL [[gnu::always_inline]] inline
#define MS_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define MS_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))

namespace multislice::isa {

template <Isa kIsa>
struct Tag {
  static constexpr Isa value = kIsa;
};

template <typename T>
inline constexpr Isa kLevel = T::value;

template <typename Kernel, typename... Args>
MS_TARGET_AVX512 auto RunAvx512(Args... args) {
  return Kernel{}(Tag<Isa::kAvx512>{}, args...);
}

template <typename Kernel, typename... Args>
MS_TARGET_AVX2 auto RunAvx2(Args... args) {
  return Kernel{}(Tag<Isa::kAvx2>{}, args...);
}

template <typename Kernel, typename... Args>
auto RunBaseline(Args... args) {
  return Kernel{}(Tag<Isa::kBaseline>{}, args...);
}

// Runs Kernel at ActiveIsa()'s level (AVX512_BF16 and AMX run the AVX-512
// version).
template <typename Kernel, typename... Args>
auto Dispatch(Args... args) {
  const Isa isa = ActiveIsa();
  if (isa >= Isa::kAvx512) return RunAvx512<Kernel>(args...);
  if (isa == Isa::kAvx2) return RunAvx2<Kernel>(args...);
  return RunBaseline<Kernel>(args...);
}

}  // namespace multislice::isa
