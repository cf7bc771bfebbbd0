// Element types shared by the kernels (compute/) and the transports
// (runtime/comm/).
#pragma once

#include <cstddef>
#include <string_view>

namespace multislice {

enum class DType { kF32, kBF16 };

inline size_t SizeOf(DType t) { return t == DType::kF32 ? 4 : 2; }

// The names nccl-tests and numpy print: "float", "bfloat16".
inline std::string_view Name(DType t) {
  return t == DType::kF32 ? "float" : "bfloat16";
}

}  // namespace multislice
