// For tests that run every version of a kernel: the ISA levels this process
// may use, a scope that caps the project's kernels at one of them, and a
// fixture that runs a test once per level.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "common/cpu_isa.h"

namespace multislice {

// The levels that have their own kernel versions (baseline, avx2, avx512,
// and avx512_bf16 for its conversions), up to ActiveIsa() as the process
// started: under MULTISLICE_MAX_ISA=avx2 only baseline and avx2.
inline std::vector<Isa> RunnableIsaLevels() {
  static const Isa top = ActiveIsa();
  std::vector<Isa> levels;
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (isa <= top) levels.push_back(isa);
  }
  return levels;
}

// Caps the kernels at `isa` for its lifetime, then restores the
// environment's cap.
class ScopedIsaCap {
 public:
  explicit ScopedIsaCap(Isa isa) { SetIsaCap(isa); }
  ~ScopedIsaCap() { SetIsaCap(std::nullopt); }
  ScopedIsaCap(const ScopedIsaCap&) = delete;
  ScopedIsaCap& operator=(const ScopedIsaCap&) = delete;
};

// For INSTANTIATE_TEST_SUITE_P's name generator.
inline std::string IsaTestName(Isa isa) { return std::string(IsaName(isa)); }

// A fixture whose tests run once per level of RunnableIsaLevels(), with the
// kernels capped at it: `using FooTest = IsaLevelTest;`, TEST_P(FooTest, ...)
// and MS_INSTANTIATE_ISA_LEVELS(FooTest).
class IsaLevelTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override { SetIsaCap(GetParam()); }
  void TearDown() override { SetIsaCap(std::nullopt); }
};

#define MS_INSTANTIATE_ISA_LEVELS(suite)                                     \
  INSTANTIATE_TEST_SUITE_P(                                                  \
      Levels, suite, ::testing::ValuesIn(::multislice::RunnableIsaLevels()), \
      [](const auto& info) { return ::multislice::IsaTestName(info.param); })

}  // namespace multislice
