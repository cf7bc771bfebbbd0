#include "cli/platform.h"

#include <cstdlib>

#include "common/cpu_isa.h"
#include "compute/matmul.h"

namespace multislice::cli {
namespace {

std::string IsaText() {
  std::string text(IsaName(ActiveIsa()));
  if (ActiveIsa() != DetectedIsa()) {
    text += " (capped from " + std::string(IsaName(DetectedIsa())) + ")";
  }
  return text;
}

}  // namespace

std::string PlatformText(DType matmul_type) {
  return "CPU " + CpuModelName() + ", ISA " + IsaText() + ", matmul " +
         compute::MatmulRouteName(matmul_type);
}

nlohmann::json PlatformJson(DType matmul_type) {
  return {{"cpu", CpuModelName()},
          {"isa", std::string(IsaName(ActiveIsa()))},
          {"detected_isa", std::string(IsaName(DetectedIsa()))},
          {"matmul", compute::MatmulRouteName(matmul_type)},
          {"onednn_isa", compute::DnnlIsaName()}};
}

std::vector<std::string> PlatformNotes(DType matmul_type, bool dtype_explicit) {
  std::vector<std::string> notes;
  if (dtype_explicit && matmul_type == DType::kBF16 &&
      compute::ActiveBf16Route() == compute::Bf16Route::kViaF32) {
    notes.push_back(
        compute::NativeBf16Available()
            ? "note: dtype bfloat16: oneDNN's bf16 matmul kernels measured "
              "slower here than its float32 ones, so bfloat16 storage is "
              "computed by float32 kernels, no faster than float32"
            : "note: dtype bfloat16 on a CPU without bf16 matmul "
              "instructions (" +
                  std::string(IsaName(ActiveIsa())) +
                  "): bfloat16 storage computed by float32 kernels, no "
                  "faster than float32 here");
  }
  Result<std::optional<Isa>> cap = IsaCapFromEnvironment();
  if (cap.ok() && cap->has_value()) {
    const Isa level = **cap;
    if (level < DetectedIsa()) {
      notes.push_back("note: " + std::string(kMaxIsaVariable) + "=" +
                      std::getenv(kMaxIsaVariable) + " keeps the kernels at " +
                      std::string(IsaName(level)) + " on a CPU with " +
                      std::string(IsaName(DetectedIsa())) +
                      " (slower: for testing that level's code paths)");
    } else if (level > DetectedIsa()) {
      notes.push_back("note: " + std::string(kMaxIsaVariable) + "=" +
                      std::getenv(kMaxIsaVariable) + " is above this CPU's " +
                      std::string(IsaName(DetectedIsa())) + "; running " +
                      std::string(IsaName(DetectedIsa())));
    }
  }
  return notes;
}

Status CheckIsaCap() { return IsaCapFromEnvironment().status(); }

}  // namespace multislice::cli
