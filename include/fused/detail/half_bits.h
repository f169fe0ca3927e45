// bfloat16 / float16 <-> float bit conversions (round to nearest even), usable on host and device,
// matching PyTorch's c10::BFloat16 / c10::Half. The CPU path and the BN-parameter loads of the
// kernels use them, so neither needs torch or cuda_fp16.h.
#pragma once

#include <cstdint>
#include <cstring>

#include "fused/types.h"

namespace fused::half_bits {

FUSED_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

FUSED_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

FUSED_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

FUSED_HD float bf16_bits_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

FUSED_HD uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf (>= 65520)
  if (abs < 0x38800000u) {                                               // fp16 subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);           // <= 2^-25 rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // value / 2^-24 = mant >> shift
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

FUSED_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {                                                           // zero / subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Element i of a vector of type t, as float.
FUSED_HD float load(const void* p, ElementType t, int64_t i) {
  switch (t) {
    case ElementType::kBFloat16: return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case ElementType::kFloat16: return fp16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case ElementType::kFloat64: return static_cast<float>(static_cast<const double*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

FUSED_HD void store(void* p, ElementType t, int64_t i, float v) {
  switch (t) {
    case ElementType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(v); break;
    case ElementType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_fp16_bits(v); break;
    case ElementType::kFloat64: static_cast<double*>(p)[i] = v; break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// The same in double: exact for every type, so float64 data (CPU gradient checks) keeps its bits.
// A double rounded to bf16/fp16 goes through float first (two roundings; only results, never
// float64 inputs, are stored that way).
FUSED_HD double load_double(const void* p, ElementType t, int64_t i) {
  return t == ElementType::kFloat64 ? static_cast<const double*>(p)[i] : static_cast<double>(load(p, t, i));
}

FUSED_HD void store_double(void* p, ElementType t, int64_t i, double v) {
  if (t == ElementType::kFloat64) {
    static_cast<double*>(p)[i] = v;
  } else {
    store(p, t, i, static_cast<float>(v));
  }
}

}  // namespace fused::half_bits
