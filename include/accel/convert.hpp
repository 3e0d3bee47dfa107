// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file convert.hpp
/// @brief Floating dtype conversion on load (float32/float16/bfloat16 among each other): bit-exact
///        round-to-nearest-even, NaN (quietened, sign and top payload kept), ±Inf and subnormals
///        preserved; and the rule deciding a tensor's load dtype (integers never converted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "config.hpp"
#include "dtype.hpp"
#include "error.hpp"

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

/// @brief True when convert_elements supports `from` → `to` (identity, or both among F32/F16/BF16).
[[nodiscard]] constexpr bool conversion_supported(DType from, DType to) noexcept {
  auto f = [](DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; };
  return from == to || (f(from) && f(to));
}

/// @brief Converts `count` elements from `src` (dtype `from`) to `dst` (dtype `to`); identity copies.
/// @param src, dst may not overlap; need not be aligned
/// @throws accel::usage_error for an unsupported pair (see conversion_supported)
inline void convert_elements(DType from, DType to, const std::byte* src, std::byte* dst, std::uint64_t count) {
  if (from == to) {
    if (auto bytes = tensor_bytes(from, count); bytes && *bytes) std::memcpy(dst, src, *bytes);
    return;
  }
  if (!conversion_supported(from, to))
    detail::throw_error<usage_error>("cannot convert ", safetensors_name(from), " to ", safetensors_name(to),
                                     ": only float32, float16 and bfloat16 convert among each other; load this "
                                     "tensor in its stored dtype");
  auto load16 = [](const std::byte* p, std::uint64_t i) {
    std::uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    return v;
  };
  auto store16 = [](std::byte* p, std::uint64_t i, std::uint16_t v) { std::memcpy(p + 2 * i, &v, 2); };
  if (from == DType::F32) {
    for (std::uint64_t i = 0; i < count; ++i) {
      float v;
      std::memcpy(&v, src + 4 * i, 4);
      store16(dst, i, to == DType::F16 ? float_to_half(v) : float_to_bf16(v));
    }
  } else if (to == DType::F32) {
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::uint16_t b = load16(src, i);
      const float v = from == DType::F16 ? half_to_float(b) : bf16_to_float(b);
      std::memcpy(dst + 4 * i, &v, 4);
    }
  } else if (from == DType::F16) {  // F16 → BF16 (one rounding: F16 → F32 is exact)
    for (std::uint64_t i = 0; i < count; ++i) store16(dst, i, float_to_bf16(half_to_float(load16(src, i))));
  } else {  // BF16 → F16
    for (std::uint64_t i = 0; i < count; ++i) store16(dst, i, float_to_half(bf16_to_float(load16(src, i))));
  }
}

/// @brief The dtype a tensor is loaded in (a pure decision).
///
/// Integer and bool tensors keep their dtype; `keep_in_fp32` loads a floating tensor as float32;
/// otherwise a floating tensor takes `target` when given; without a target nothing changes.
/// @param stored the checkpoint dtype
/// @param target the requested dtype for floating tensors (nullopt: keep)
/// @param keep_in_fp32 the tensor matches a keep-in-fp32 override
/// @return the load dtype
/// @throws accel::usage_error when the change is not supported (e.g. F8 → F16), naming the tensor
[[nodiscard]] inline DType load_dtype(DType stored, std::optional<DType> target, bool keep_in_fp32,
                                      std::string_view tensor_name = {}) {
  if (!is_floating(stored)) return stored;
  DType out = keep_in_fp32 ? DType::F32 : target.value_or(stored);
  if (out == stored) return stored;
  if (!conversion_supported(stored, out))
    detail::throw_error<usage_error>("tensor '", tensor_name, "' is ", safetensors_name(stored), " and cannot be loaded as ",
                                     safetensors_name(out), ": only float32, float16 and bfloat16 convert among "
                                     "each other; drop the dtype option or exclude the tensor");
  return out;
}

ACCEL_NAMESPACE_END
