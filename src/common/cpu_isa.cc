// Detection through GCC's __builtin_cpu_supports (cpuid, with the OS's
// register-state check for AVX and AVX-512), the cap from the environment,
// and the active level cached in one atomic so that a kernel's dispatch is a
// relaxed load.
#include "common/cpu_isa.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace multislice {
namespace {

struct Spelling {
  std::string_view name;
  Isa isa;
};

constexpr Spelling kSpellings[] = {
    {"baseline", Isa::kBaseline},
    {"x86-64", Isa::kBaseline},
    {"sse2", Isa::kBaseline},
    {"avx2", Isa::kAvx2},
    {"x86-64-v3", Isa::kAvx2},
    {"avx512", Isa::kAvx512},
    {"x86-64-v4", Isa::kAvx512},
    {"avx512_core", Isa::kAvx512},
    {"avx512_bf16", Isa::kAvx512Bf16},
    {"avx512bf16", Isa::kAvx512Bf16},
    {"amx", Isa::kAmx},
    {"amx_bf16", Isa::kAmx},
};

Isa Detect() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("x86-64-v3")) return Isa::kBaseline;
  if (!__builtin_cpu_supports("x86-64-v4")) return Isa::kAvx2;
  if (!__builtin_cpu_supports("avx512bf16")) return Isa::kAvx512;
  if (!__builtin_cpu_supports("amx-bf16") ||
      !__builtin_cpu_supports("amx-tile")) {
    return Isa::kAvx512Bf16;
  }
  return Isa::kAmx;
}

// -1: not computed yet; otherwise the active level.
std::atomic<int> g_active{-1};
// -1: no programmatic cap (the environment's applies).
std::atomic<int> g_cap_override{-1};

Isa Compute() {
  Isa cap = Isa::kAmx;
  const int override_cap = g_cap_override.load(std::memory_order_relaxed);
  if (override_cap >= 0) {
    cap = static_cast<Isa>(override_cap);
  } else if (auto env = IsaCapFromEnvironment(); env.ok() && env->has_value()) {
    cap = **env;
  }
  return std::min(DetectedIsa(), cap);
}

}  // namespace

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kBaseline:
      return "baseline";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512_bf16";
    case Isa::kAmx:
      return "amx";
  }
  return "unknown";
}

Result<Isa> ParseIsa(std::string_view value, std::string_view field) {
  std::string lower(value);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const Spelling& s : kSpellings) {
    if (lower == s.name) return s.isa;
  }
  return InvalidArgument(std::string(field) + ": '" + std::string(value) +
                         "' is not an ISA level; expected one of baseline, "
                         "avx2, avx512, avx512_bf16, amx");
}

Isa DetectedIsa() {
  static const Isa detected = Detect();
  return detected;
}

Result<std::optional<Isa>> IsaCapFromEnvironment() {
  const char* value = std::getenv(kMaxIsaVariable);
  if (value == nullptr || *value == '\0') return std::optional<Isa>();
  ASSIGN_OR_RETURN(Isa isa, ParseIsa(value, kMaxIsaVariable));
  return std::optional<Isa>(isa);
}

Isa ActiveIsa() {
  int active = g_active.load(std::memory_order_relaxed);
  if (active < 0) {
    active = static_cast<int>(Compute());
    g_active.store(active, std::memory_order_relaxed);
  }
  return static_cast<Isa>(active);
}

void SetIsaCap(std::optional<Isa> cap) {
  g_cap_override.store(cap ? static_cast<int>(*cap) : -1,
                       std::memory_order_relaxed);
  g_active.store(static_cast<int>(Compute()), std::memory_order_relaxed);
}

std::string CpuModelName() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        model = line.substr(std::min(line.size(), colon + 2));
      }
      break;
    }
  }
  return model;
}

std::string DescribeCpu() {
  const std::string model = CpuModelName();
  std::string isa(IsaName(ActiveIsa()));
  if (ActiveIsa() != DetectedIsa()) {
    isa += " (capped from " + std::string(IsaName(DetectedIsa())) + ")";
  }
  return model + ", " + isa;
}

}  // namespace multislice
