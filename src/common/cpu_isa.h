// The x86-64 instruction-set levels multislice's kernels are built for, the
// level this CPU has, and the cap a user or a test puts on it.
//
// Every hand-vectorised kernel is compiled once per level (isa_dispatch.h)
// and runs, at each call, the version of ActiveIsa(): the highest level the
// CPU has, lowered by the environment variable MULTISLICE_MAX_ISA (or by
// SetIsaCap). The compute backend passes the same cap on to oneDNN as its
// own ISA limit, so a capped run behaves as the run on a CPU with only that
// level does: `MULTISLICE_MAX_ISA=avx2` on an AVX-512 machine takes the AVX2
// code paths and the AVX2 matmul kernels, bf16 included.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace multislice {

// Ordered: each level includes the ones below it.
enum class Isa : int {
  kBaseline = 0,    // x86-64 (SSE2): every 64-bit x86 CPU
  kAvx2 = 1,        // x86-64-v3: AVX2, FMA, F16C, BMI1/2 (Haswell, Zen 1-3)
  kAvx512 = 2,      // x86-64-v4: AVX-512 F/BW/CD/DQ/VL (Skylake-SP)
  kAvx512Bf16 = 3,  // x86-64-v4 and AVX512_BF16 (Cooper Lake, Zen 4, Zen 5)
  kAmx = 4,         // and AMX-BF16 tiles (Sapphire Rapids and later)
};

// The environment variable that caps the level.
inline constexpr const char* kMaxIsaVariable = "MULTISLICE_MAX_ISA";

// "baseline", "avx2", "avx512", "avx512_bf16", "amx": the values
// MULTISLICE_MAX_ISA takes and the names every report prints.
std::string_view IsaName(Isa isa);

// One of IsaName's values (any case), or an alias: "x86-64", "sse2",
// "x86-64-v3", "x86-64-v4", "avx512_core", "avx512bf16", "amx_bf16".
// kInvalidArgument naming `field`, the value and the expected ones otherwise.
Result<Isa> ParseIsa(std::string_view value, std::string_view field);

// The highest level this CPU (and the OS, for the AVX-512 register state)
// supports. Read once.
Isa DetectedIsa();

// MULTISLICE_MAX_ISA parsed: nullopt when unset or empty. Commands call this
// first so that a bad value ends them with one line and exit code 2.
Result<std::optional<Isa>> IsaCapFromEnvironment();

// min(DetectedIsa(), the cap): the level every kernel runs at. A cap set by
// SetIsaCap wins over the environment; an unparsable environment value is
// ignored here (commands reject it through IsaCapFromEnvironment).
Isa ActiveIsa();

// Caps the level of the project's own kernels from now on (nullopt: back to
// the environment's cap). For tests and benchmarks that run each version of
// a kernel in one process; oneDNN's limit is fixed at its first use and does
// not follow (run the process under MULTISLICE_MAX_ISA for that).
void SetIsaCap(std::optional<Isa> cap);

// The CPU's model name from /proc/cpuinfo, e.g. "AMD EPYC 7B13"; "unknown
// CPU" where there is none.
std::string CpuModelName();

// A human-readable line of the CPU: its model name and ISA, e.g.
// "Intel(R) Xeon(R) Platinum 8481C, avx512_bf16 (capped from amx)".
std::string DescribeCpu();

}  // namespace multislice
