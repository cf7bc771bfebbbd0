// bfloat16: the upper 16 bits of an IEEE f32. Conversions round to nearest
// even and keep NaN a NaN. Arithmetic is done by converting to f32.
#pragma once

#include <bit>
#include <cstdint>

namespace multislice {

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(FromFloat(f)) {}
  explicit operator float() const { return ToFloat(bits); }

  static uint16_t FromFloat(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  static float ToFloat(uint16_t b) {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
  }
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(bf16) == 2);

}  // namespace multislice
