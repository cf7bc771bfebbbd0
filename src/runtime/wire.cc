#include "runtime/wire.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/bf16.h"

namespace multislice::runtime {
namespace {

constexpr uint32_t kExponentBits = 0x7f800000u;

// x, or a zero of x's sign when x is subnormal: decided on the bits, so that
// the result does not depend on the thread's DAZ mode.
float Flush(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return (u & kExponentBits) == 0 ? std::bit_cast<float>(u & 0x80000000u) : x;
}

bool NonFinite(float x) {
  return (std::bit_cast<uint32_t>(x) & kExponentBits) == kExponentBits;
}

size_t Int8Blocks(size_t n) { return (n + kInt8Block - 1) / kInt8Block; }

void QuantizeInt8(const float* in, size_t n, std::byte* wire) {
  const size_t blocks = Int8Blocks(n);
  std::byte* values = wire + blocks * sizeof(float);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kInt8Block;
    const size_t len = std::min(kInt8Block, n - begin);
    const float scale = Int8Scale(in + begin, len);
    std::memcpy(wire + b * sizeof(float), &scale, sizeof(float));
    int8_t q[kInt8Block] = {};
    if (scale > 0) {  // not 0, not NaN
      for (size_t i = 0; i < len; ++i) {
        const float t = Flush(in[begin + i]) / scale;
        // Round to nearest even: |t| <= 127.01, far below 2^22.
        float r = (t + 0x1.8p23f) - 0x1.8p23f;
        r = std::clamp(r, -127.0f, 127.0f);
        q[i] = static_cast<int8_t>(r);
      }
    }
    std::memcpy(values + begin, q, len);
  }
}

void DequantizeInt8(const std::byte* wire, size_t n, float* out) {
  const size_t blocks = Int8Blocks(n);
  const std::byte* values = wire + blocks * sizeof(float);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kInt8Block;
    const size_t len = std::min(kInt8Block, n - begin);
    float scale;
    std::memcpy(&scale, wire + b * sizeof(float), sizeof(float));
    int8_t q[kInt8Block];
    std::memcpy(q, values + begin, len);
    for (size_t i = 0; i < len; ++i) {
      out[begin + i] = static_cast<float>(q[i]) * scale;
    }
  }
}

}  // namespace

std::string_view Name(WireType type) {
  switch (type) {
    case WireType::kF32:
      return "f32";
    case WireType::kBF16:
      return "bf16";
    case WireType::kInt8:
      return "int8";
  }
  return "?";
}

Result<WireType> ParseWireType(std::string_view value, std::string_view field) {
  std::string lower(value);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (lower == "f32" || lower == "float32") return WireType::kF32;
  if (lower == "bf16" || lower == "bfloat16") return WireType::kBF16;
  if (lower == "int8") return WireType::kInt8;
  return InvalidArgument(std::string(field) + ": '" + std::string(value) +
                         "' is not a wire type; expected f32, bf16 or int8");
}

size_t WireBytes(WireType type, size_t n) {
  switch (type) {
    case WireType::kF32:
      return 4 * n;
    case WireType::kBF16:
      return 2 * n;
    case WireType::kInt8:
      return n + sizeof(float) * Int8Blocks(n);
  }
  return 0;
}

float Int8Scale(const float* block, size_t n) {
  float max_abs = 0;
  for (size_t i = 0; i < n; ++i) {
    if (NonFinite(block[i])) return std::numeric_limits<float>::quiet_NaN();
    max_abs = std::max(max_abs, std::fabs(Flush(block[i])));
  }
  if (max_abs == 0) return 0;
  float scale = std::max(max_abs / 127.0f, FLT_MIN);
  // Near FLT_MAX, 127 * scale may round past it; step down until the largest
  // value comes back finite (the value then clamps to 127, well inside the
  // bound).
  while (std::isinf(127.0f * scale)) scale = std::nextafter(scale, 0.0f);
  return scale;
}

void Quantize(WireType type, const float* in, size_t n, std::byte* wire) {
  switch (type) {
    case WireType::kF32:
      if (n > 0) std::memcpy(wire, in, 4 * n);
      return;
    case WireType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = bf16::FromFloat(Flush(in[i]));
        std::memcpy(wire + 2 * i, &b, 2);
      }
      return;
    case WireType::kInt8:
      QuantizeInt8(in, n, wire);
      return;
  }
}

void Dequantize(WireType type, const std::byte* wire, size_t n, float* out) {
  switch (type) {
    case WireType::kF32:
      if (n > 0) std::memcpy(out, wire, 4 * n);
      return;
    case WireType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, wire + 2 * i, 2);
        out[i] = bf16::ToFloat(b);
      }
      return;
    case WireType::kInt8:
      DequantizeInt8(wire, n, out);
      return;
  }
}

double Bf16WireError(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x) & 0x7fffffffu;
  const int exponent = static_cast<int>(u >> 23);
  if (exponent == 0xff) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return std::ldexp(1.0, -126);  // read as zero
  // (2 - 2^-8) 2^127, the midpoint between the largest bf16 and 2^128,
  // rounds up (the largest bf16 has an odd significand).
  if (u >= 0x7f7f8000u) return std::numeric_limits<double>::infinity();
  return std::ldexp(1.0, exponent - 127 - 8);
}

double Int8WireError(float scale) {
  if (!std::isfinite(scale)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(static_cast<double>(scale) * (0.5 + std::ldexp(1.0, -16)),
                  std::ldexp(1.0, -126));
}

double F32SumError(int terms, double sum_abs) {
  if (terms <= 1) return 0;
  const double ju = (terms - 1) * std::ldexp(1.0, -24);
  return ju / (1 - ju) * sum_abs + 2.0 * terms * std::ldexp(1.0, -126);
}

}  // namespace multislice::runtime
