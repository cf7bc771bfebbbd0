// Linked into every test binary whose tests CTest runs again under
// MULTISLICE_MAX_ISA (multislice_test's EVERY_ISA): when the cap is at or
// above this CPU's own level, the capped run is the plain run again (the
// same kernels, the same oneDNN paths), so every test of it is skipped with
// one line saying why. On an AVX2-only CPU the "@avx2" copies then cost
// nothing, while an AVX-512 machine still runs them in full.
#include <gtest/gtest.h>

#include "common/cpu_isa.h"

namespace multislice {
namespace {

class CapAboveThisCpu : public ::testing::Environment {
 public:
  void SetUp() override {
    Result<std::optional<Isa>> cap = IsaCapFromEnvironment();
    if (!cap.ok() || !cap->has_value()) return;
    const Isa native = DetectedIsa();
    if (native > **cap) return;
    GTEST_SKIP() << kMaxIsaVariable << "=" << IsaName(**cap)
                 << " does not lower this CPU's level (" << IsaName(native)
                 << "): the run without the cap covers these tests";
  }
};

[[maybe_unused]] ::testing::Environment* const kCapAboveThisCpu =
    ::testing::AddGlobalTestEnvironment(new CapAboveThisCpu);

}  // namespace
}  // namespace multislice
