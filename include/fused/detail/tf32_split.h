// fp32 -> TF32 rounding and the 3xTF32 operand splits, usable on host and device.
//
// TF32 keeps fp32's sign and 8-bit exponent and 10 of its 23 mantissa bits; a tensor-core TF32
// product reads only those bits. 3xTF32 recovers fp32 accuracy from TF32 products: each operand
// a = big + small (+ a remainder below 2^-21 |a|), both TF32, and
//   a * b  ~=  small_a * big_b + big_a * small_b + big_a * big_b
// (small * small is dropped). Each TF32 * TF32 product is exact in fp32 (11 x 11 significant bits).
//
// Two splits, both done with integer operations (the same bits on host and device, so a host
// reference reproduces a kernel's operands exactly):
//
//   split_nearest      big = a rounded to nearest TF32 (ties to even), small = (a - big) rounded to
//                      nearest. The most accurate: a - big - small <= 2^-22 |a|. But small may
//                      have the opposite sign of big, so an infinite operand meets products of
//                      both signs (inf * small_b and inf * big_b) and gives NaN where fp32 gives
//                      +-inf: use it only where the inputs are finite.
//   split_toward_zero  big = a truncated to TF32, small = (a - big) rounded to nearest: small has
//                      a's sign (what CUTLASS's sm80 3xTF32 does). a - big - small <= 2^-21 |a|.
//                      With the special cases below, the three products of a * b give fp32's
//                      a * b for every pair of inf, NaN, zero and finite operands.
//
// Special cases (both splits):
//   - inf splits into (inf, inf) (toward zero) or (inf, 0) (nearest); NaN into (NaN, quiet NaN)
//     (toward zero) or (NaN, 0) (nearest);
//     zero into (0, 0) (inf * 0 is NaN in fp32 too);
//   - toward zero: a finite nonzero a that TF32 holds exactly (a - big = 0) gets the small part
//     +-2^(exponent(a) - 30) instead of 0, so that inf * small_a is inf and not NaN; it changes a
//     product by at most 2^-30 of it (1/64 of fp32's rounding). Below |a| ~ 2^-96 that small part
//     is a TF32 subnormal (hardware that flushes subnormals would make it 0 again), below ~2^-106
//     it is 0;
//   - nearest: finite values that round past TF32's largest value keep the truncated value
//     instead of becoming inf;
//   - subnormals are split on TF32's subnormal grid (spacing 2^-136): below |a| ~ 2^-114 the
//     split keeps fewer than 22 bits.
#pragma once

#include <cstdint>

#include "fused/detail/half_bits.h"
#include "fused/types.h"

namespace fused::tf32 {

// The 13 mantissa bits a TF32 value does not have.
constexpr uint32_t kDroppedBits = 13;
constexpr uint32_t kDroppedMask = (1u << kDroppedBits) - 1u;  // 0x1fff
constexpr uint32_t kExponentMask = 0x7f800000u;
constexpr uint32_t kSignMask = 0x80000000u;

FUSED_HD bool representable(float a) { return (half_bits::float_bits(a) & kDroppedMask) == 0; }
FUSED_HD bool finite(float a) { return (half_bits::float_bits(a) & kExponentMask) != kExponentMask; }

// a truncated to TF32 (toward zero); inf and NaN unchanged apart from NaN's dropped payload bits.
FUSED_HD float truncate(float a) {
  const uint32_t u = half_bits::float_bits(a);
  if (!finite(a)) return a;
  return half_bits::bits_float(u & ~kDroppedMask);
}

// a rounded to the nearest TF32 value (ties to even); inf and NaN unchanged; a finite value past
// TF32's largest one is truncated instead of becoming inf.
FUSED_HD float round_nearest(float a) {
  const uint32_t u = half_bits::float_bits(a);
  if (!finite(a)) return a;
  const uint32_t lsb = (u >> kDroppedBits) & 1u;
  const uint32_t rounded = (u + (kDroppedMask >> 1) + lsb) & ~kDroppedMask;
  if ((rounded & kExponentMask) == kExponentMask) return truncate(a);
  return half_bits::bits_float(rounded);
}

struct Split {
  float big;
  float small;
};

FUSED_HD Split split_nearest(float a) {
  if (!finite(a)) return {a, 0.0f};
  const float big = round_nearest(a);
  // a - big is exact in fp32: big is a's rounding at a coarser precision, within one TF32 ulp.
  return {big, round_nearest(a - big)};
}

// Exponent offset of the small part of a value TF32 holds exactly (split_toward_zero).
constexpr int kExactSmallExponent = 30;

// A quiet NaN whose TF32 bits are NaN too (a NaN with payload bits only below TF32's would read as
// inf on TF32 tensor cores).
constexpr uint32_t kQuietNaNBits = 0x7fc00000u;

FUSED_HD Split split_toward_zero(float a) {
  const uint32_t u = half_bits::float_bits(a);
  if (!finite(a))  // inf: (inf, inf); NaN: (NaN, NaN), so that a NaN stays NaN whatever its big part reads as
    return {a, (u & ~(kSignMask | kExponentMask)) == 0 ? a : half_bits::bits_float(kQuietNaNBits)};
  const float big = truncate(a);
  const float small = round_nearest(a - big);  // a - big has a's sign, so has its rounding
  if (small != 0.0f || a == 0.0f) return {big, small};
  // TF32 holds a exactly: a power of two 2^30 below a's leading bit, with a's sign.
  const int32_t exponent = static_cast<int32_t>((u & kExponentMask) >> 23) - kExactSmallExponent;
  const uint32_t sign = u & kSignMask;
  if (exponent >= 1) return {big, half_bits::bits_float(sign | (static_cast<uint32_t>(exponent) << 23))};
  // Subnormal: 2^-149 * 2^shift. TF32 keeps the subnormal bits from 2^-136 up (shift >= 13).
  const int32_t shift = 22 + exponent;
  return {big, shift >= 13 ? half_bits::bits_float(sign | (1u << shift)) : 0.0f};
}

// split_toward_zero(a).small, the same bits for every input, with selects instead of branches:
// what a kernel computes for every element of its operand tiles (a few integer operations each).
FUSED_HD float small_toward_zero(float a) {
  const uint32_t u = half_bits::float_bits(a);
  const uint32_t sign = u & kSignMask;
  const uint32_t exponent_field = (u & kExponentMask) >> 23;
  // Finite a: a - big is exact, has a's sign (or is +0) and lies far below TF32's largest value,
  // so round_nearest reduces to its integer rounding.
  const uint32_t d = half_bits::float_bits(a - half_bits::bits_float(u & ~kDroppedMask));
  const uint32_t rounded = (d + (kDroppedMask >> 1) + ((d >> kDroppedBits) & 1u)) & ~kDroppedMask;
  // TF32 holds a exactly: +-2^(exponent(a) - 30), on the subnormal grid below 2^-126 (see above).
  const int32_t exponent = static_cast<int32_t>(exponent_field) - kExactSmallExponent;
  const int32_t shift = 22 + exponent;
  const uint32_t shift_clamped = static_cast<uint32_t>(shift < 0 ? 0 : (shift > 31 ? 31 : shift));
  const uint32_t exact_small = exponent >= 1 ? (sign | (static_cast<uint32_t>(exponent) << 23))
                                             : (shift >= 13 ? (sign | (1u << shift_clamped)) : 0u);
  const bool a_zero = (u & ~kSignMask) == 0;
  const bool rounded_zero = (rounded & ~kSignMask) == 0;
  uint32_t small = rounded_zero && !a_zero ? exact_small : rounded;
  if (exponent_field == 0xffu) small = (u & ~(kSignMask | kExponentMask)) == 0 ? u : kQuietNaNBits;
  return half_bits::bits_float(small);
}

// For kernels that may rewrite their raw tile: big = a rounded to nearest TF32 (ties to even) and
// small = a - big exactly (fp32 holds it: at most 13 significant bits; TF32 tensor cores then read
// its top 11). a == big + small bit for bit, so the split can be undone. Finite a below 2^127 only
// (at |a| >= 2^127 the rounding may reach inf); other values are the caller's to route elsewhere.
// |small| <= 2^-12 |a| against 2^-11 |a| for the truncating splits: the dropped small * small term
// and the tensor cores' truncation of small stay 4x smaller.
FUSED_HD Split split_nearest_exact(float a) {
  const uint32_t u = half_bits::float_bits(a);
  const float big = half_bits::bits_float((u + (kDroppedMask >> 1) + ((u >> kDroppedBits) & 1u)) & ~kDroppedMask);
  return {big, a - big};
}

// The sm90 3xTF32 kernel's fast splits, for finite |a| < 2^127 (the kernel sends tiles holding other
// words to the exact split above). Rounding to nearest with ties away from zero is two integer
// operations, against five for ties to even; the bounds are the same (ties are 2^-13 of the words).
FUSED_HD uint32_t round_nearest_away_bits(uint32_t u) { return (u + (1u << (kDroppedBits - 1))) & ~kDroppedMask; }

// For an operand the kernel holds in registers: big = a rounded to nearest TF32 and small = (a - big)
// rounded likewise (a - big is exact), both ties away from zero. Like split_nearest,
// |a - big - small| <= 2^-22 |a|; both parts are TF32, so the tensor cores read them as they are.
FUSED_HD Split split_nearest_fast(float a) {
  const float big = half_bits::bits_float(round_nearest_away_bits(half_bits::float_bits(a)));
  return {big, half_bits::bits_float(round_nearest_away_bits(half_bits::float_bits(a - big)))};
}

// For an operand the tensor cores read as raw fp32 words from shared memory, truncated, so its big
// part is truncate(a) for free: small = (a - truncate(a)) rounded to nearest TF32, ties away from
// zero. Like split_toward_zero, |a - truncate(a) - small| <= 2^-21 |a| and small has a's sign; a value
// TF32 holds exactly gets 0 (split_toward_zero's tiny small part only matters against inf).
FUSED_HD float small_of_truncated_fast(float a) {
  const uint32_t u = half_bits::float_bits(a);
  return half_bits::bits_float(round_nearest_away_bits(half_bits::float_bits(a - half_bits::bits_float(u & ~kDroppedMask))));
}

}  // namespace fused::tf32
