// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file convert.hpp
/// @brief Floating dtype conversion on load (float32/float16/bfloat16 among each other): bit-exact
///        round-to-nearest-even, NaN (quietened, sign and top payload kept), ±Inf and subnormals
///        preserved; and the rule deciding a tensor's load dtype (integers never converted).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include <accel/runtime/config.hpp>
#include <accel/model/dtype.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/half.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief True when convert_elements supports `from` → `to` (identity, or both among F32/F16/BF16).
[[nodiscard]] constexpr bool conversion_supported(DType from, DType to) noexcept { return converts_between(from, to); }

namespace detail {
// Every 16-bit source has only 65536 values: bulk conversions from F16/BF16 are table lookups
// (512 KiB, built once on first use), which removes the per-element branches of the scalar forms.
struct HalfTables {
  std::array<float, 65536> half_to_f32;
  std::array<std::uint16_t, 65536> half_to_bf16, bf16_to_half;
};
inline const HalfTables& half_tables() {
  static const std::unique_ptr<HalfTables> tables = [] {
    auto t = std::make_unique<HalfTables>();
    for (std::uint32_t i = 0; i < 65536; ++i) {
      const auto b = static_cast<std::uint16_t>(i);
      t->half_to_f32[i] = half_to_float(b);
      t->half_to_bf16[i] = float_to_bf16(half_to_float(b));
      t->bf16_to_half[i] = float_to_half(bf16_to_float(b));
    }
    return t;
  }();
  return *tables;
}
}  // namespace detail

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
  auto load32 = [](const std::byte* p, std::uint64_t i) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  };
  auto store32 = [](std::byte* p, std::uint64_t i, float v) { std::memcpy(p + 4 * i, &v, 4); };
  if (from == DType::F32 && to == DType::F16) {
    for (std::uint64_t i = 0; i < count; ++i) store16(dst, i, float_to_half(load32(src, i)));
  } else if (from == DType::F32) {
    for (std::uint64_t i = 0; i < count; ++i) store16(dst, i, float_to_bf16(load32(src, i)));
  } else if (from == DType::F16 && to == DType::F32) {
    const auto& table = detail::half_tables().half_to_f32;
    for (std::uint64_t i = 0; i < count; ++i) store32(dst, i, table[load16(src, i)]);
  } else if (to == DType::F32) {
    for (std::uint64_t i = 0; i < count; ++i) store32(dst, i, bf16_to_float(load16(src, i)));
  } else {  // F16 <-> BF16: one rounding (F16 -> F32 is exact, and so is BF16 -> F32)
    const auto& table = from == DType::F16 ? detail::half_tables().half_to_bf16 : detail::half_tables().bf16_to_half;
    for (std::uint64_t i = 0; i < count; ++i) store16(dst, i, table[load16(src, i)]);
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
