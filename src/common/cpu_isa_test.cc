#include "common/cpu_isa.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>

#include "common/isa_dispatch.h"

namespace multislice {
namespace {

TEST(CpuIsaTest, ParsesNamesAndAliases) {
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16,
                  Isa::kAmx}) {
    auto parsed = ParseIsa(IsaName(isa), "x");
    ASSERT_TRUE(parsed.ok()) << IsaName(isa);
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(*ParseIsa("AVX2", "x"), Isa::kAvx2);
  EXPECT_EQ(*ParseIsa("x86-64", "x"), Isa::kBaseline);
  EXPECT_EQ(*ParseIsa("x86-64-v3", "x"), Isa::kAvx2);
  EXPECT_EQ(*ParseIsa("x86-64-v4", "x"), Isa::kAvx512);
  EXPECT_EQ(*ParseIsa("avx512_core", "x"), Isa::kAvx512);
}

TEST(CpuIsaTest, BadValueNamesFieldValueAndChoices) {
  auto parsed = ParseIsa("avx3", "MULTISLICE_MAX_ISA");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(),
            "MULTISLICE_MAX_ISA: 'avx3' is not an ISA level; expected one of "
            "baseline, avx2, avx512, avx512_bf16, amx");
}

TEST(CpuIsaTest, EnvironmentCapLowersTheActiveLevel) {
  const char* saved = getenv(kMaxIsaVariable);
  const std::string restore = saved != nullptr ? saved : "";
  setenv(kMaxIsaVariable, "baseline", 1);
  SetIsaCap(std::nullopt);  // recompute from the environment
  EXPECT_EQ(ActiveIsa(), Isa::kBaseline);
  auto cap = IsaCapFromEnvironment();
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ(*cap, std::optional<Isa>(Isa::kBaseline));

  setenv(kMaxIsaVariable, "nonsense", 1);
  EXPECT_FALSE(IsaCapFromEnvironment().ok());
  SetIsaCap(std::nullopt);
  EXPECT_EQ(ActiveIsa(), DetectedIsa());  // ignored here, rejected by commands

  unsetenv(kMaxIsaVariable);
  EXPECT_EQ(*IsaCapFromEnvironment(), std::nullopt);
  if (!restore.empty()) setenv(kMaxIsaVariable, restore.c_str(), 1);
  SetIsaCap(std::nullopt);
}

TEST(CpuIsaTest, ProgrammaticCapNeverRaisesAboveTheCpu) {
  for (Isa cap : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    SetIsaCap(cap);
    EXPECT_EQ(ActiveIsa(), std::min(cap, DetectedIsa()));
  }
  SetIsaCap(std::nullopt);
}

// Reports the level it was compiled for and the vector width GCC gave it.
struct LevelKernel {
  MS_KERNEL int operator()(auto tag) const {
    return static_cast<int>(isa::kLevel<decltype(tag)>);
  }
};

TEST(CpuIsaTest, DispatchRunsTheVersionOfTheActiveLevel) {
  for (Isa cap : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (cap > DetectedIsa()) continue;
    SetIsaCap(cap);
    const Isa expected = std::min(cap, Isa::kAvx512);
    EXPECT_EQ(isa::Dispatch<LevelKernel>(), static_cast<int>(expected))
        << IsaName(cap);
  }
  SetIsaCap(std::nullopt);
}

TEST(CpuIsaTest, DescribeCpuNamesTheLevel) {
  SetIsaCap(Isa::kBaseline);
  const std::string line = DescribeCpu();
  EXPECT_NE(line.find("baseline"), std::string::npos) << line;
  SetIsaCap(std::nullopt);
}

}  // namespace
}  // namespace multislice
