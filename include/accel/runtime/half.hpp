// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file half.hpp
/// @brief 16-bit floats: bit-exact conversions to and from float32 (round to nearest even, NaN
///        quietened with sign and top payload kept, ±Inf and subnormals preserved), and the storage
///        types accel::half and accel::bfloat16 (a 16-bit pattern; arithmetic goes through float).
#pragma once

#include <cstdint>
#include <cstring>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN

/// @name Scalar conversions (bit patterns in, bit patterns out)
///@{

/// @brief Bits of a float.
[[nodiscard]] inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
/// @brief The float with these bits.
[[nodiscard]] inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// @brief IEEE binary16 → float32 (exact).
[[nodiscard]] inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));  // Inf, NaN payload kept
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    std::uint32_t exp = 113;  // normalise the subnormal: value = m * 2^-24
    while (!(m & 0x400u)) {
      m <<= 1;
      --exp;
    }
    return bits_float(sign | (exp << 23) | ((m & 0x3ffu) << 13));
  }
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

/// @brief float32 → IEEE binary16, round to nearest, ties to even; overflow → ±Inf.
[[nodiscard]] inline std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // quiet NaN
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf (and Inf)
  if (ax < 0x38800000u) {  // below 2^-14: a binary16 subnormal or zero
    if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to the even zero
    const std::uint32_t e = ax >> 23;
    const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal: correct
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = ax - (112u << 23);  // rebias 127 → 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

/// @brief bfloat16 → float32 (exact).
[[nodiscard]] inline float bf16_to_float(std::uint16_t b) noexcept { return bits_float(static_cast<std::uint32_t>(b) << 16); }

/// @brief float32 → bfloat16, round to nearest, ties to even; overflow → ±Inf; NaN stays NaN.
[[nodiscard]] inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
///@}

/// @brief IEEE binary16 storage (torch.float16, CUDA's __half): 16 bits, no arithmetic of its own.
struct half {
  std::uint16_t bits = 0;
  half() = default;
  /// @brief Rounds to nearest even.
  explicit half(float f) noexcept : bits(float_to_half(f)) {}
  /// @brief The value with these bits.
  [[nodiscard]] static half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
  /// @brief Exact.
  explicit operator float() const noexcept { return half_to_float(bits); }
  /// @brief Same bits (so NaN == NaN when the patterns match).
  friend bool operator==(half a, half b) noexcept { return a.bits == b.bits; }
};

/// @brief bfloat16 storage (torch.bfloat16, CUDA's __nv_bfloat16): the top 16 bits of a float32.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  /// @brief Rounds to nearest even.
  explicit bfloat16(float f) noexcept : bits(float_to_bf16(f)) {}
  /// @brief The value with these bits.
  [[nodiscard]] static bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  /// @brief Exact.
  explicit operator float() const noexcept { return bf16_to_float(bits); }
  /// @brief Same bits.
  friend bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2, "16-bit storage types must be 2 bytes");

ACCEL_NAMESPACE_END
