// float -> bfloat16 / float16 bit conversions (round to nearest even), host only, matching
// PyTorch's c10::BFloat16 / c10::Half conversions, so the CPU path needs no torch headers.
#pragma once

#include <cstdint>
#include <cstring>

namespace fused::cpu::half {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

inline uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf (>= 65520)
  if (abs < 0x38800000u) {                                               // fp16 subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);           // < 2^-25 rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24 -> value = mant >> (shift - 0) scaled to 2^-24 units
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent (127 -> 15), round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebased = abs - (112u << 23);
  const uint32_t r = (rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | r);
}

}  // namespace fused::cpu::half
