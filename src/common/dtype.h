// Element types shared by the kernels (compute/) and the transports
// (runtime/comm/), and their names: every output spells them as MaxText, JAX
// and numpy do ("float32", "bfloat16"); every input also takes the short
// forms ("f32", "bf16") and nccl-tests' "float".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace multislice {

enum class DType { kF32, kBF16 };

inline size_t SizeOf(DType t) { return t == DType::kF32 ? 4 : 2; }

// "float32" or "bfloat16".
inline std::string_view Name(DType t) {
  return t == DType::kF32 ? "float32" : "bfloat16";
}

// bfloat16/bf16 or float32/f32/float (any case). kInvalidArgument naming
// `field`, the value and the spellings otherwise.
inline Result<DType> ParseDType(std::string_view value,
                                std::string_view field) {
  std::string lower(value);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (lower == "bfloat16" || lower == "bf16") return DType::kBF16;
  if (lower == "float32" || lower == "f32" || lower == "float") {
    return DType::kF32;
  }
  return InvalidArgument(std::string(field) + ": '" + std::string(value) +
                         "' is not a dtype; expected bfloat16 (bf16) or "
                         "float32 (f32)");
}

}  // namespace multislice
