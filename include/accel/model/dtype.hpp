// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file dtype.hpp
/// @brief Tensor element types: every safetensors dtype, its torch/safetensors/numpy names and sizes.
#pragma once

#include <array>
#include <cctype>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Element type of a tensor; one value per dtype of the safetensors format.
enum class DType : std::uint8_t {
  BOOL,
  U8,
  I8,
  I16,
  U16,
  I32,
  U32,
  I64,
  U64,
  F16,
  BF16,
  F32,
  F64,
  C64,
  F8_E4M3,      ///< torch float8_e4m3fn
  F8_E5M2,      ///< torch float8_e5m2
  F8_E4M3FNUZ,  ///< torch float8_e4m3fnuz
  F8_E5M2FNUZ,  ///< torch float8_e5m2fnuz
  F8_E8M0,      ///< torch float8_e8m0fnu
  F6_E2M3,      ///< 6-bit float (sub-byte; only whole-byte tensors are valid)
  F6_E3M2,      ///< 6-bit float (sub-byte)
  F4,           ///< 4-bit float e2m1 (sub-byte)
};

namespace detail {

struct DTypeInfo {
  DType dtype;
  std::string_view safetensors;
  std::string_view torch;
  unsigned bits;
  bool floating;  // torch.is_floating_point
  bool integral;  // integer, unsigned or bool: never converted by a target dtype
};

// One row per DType, in enum order (checked by a static_assert below).
inline constexpr std::array<DTypeInfo, 22> dtype_table{{
    {DType::BOOL, "BOOL", "bool", 8, false, true},
    {DType::U8, "U8", "uint8", 8, false, true},
    {DType::I8, "I8", "int8", 8, false, true},
    {DType::I16, "I16", "int16", 16, false, true},
    {DType::U16, "U16", "uint16", 16, false, true},
    {DType::I32, "I32", "int32", 32, false, true},
    {DType::U32, "U32", "uint32", 32, false, true},
    {DType::I64, "I64", "int64", 64, false, true},
    {DType::U64, "U64", "uint64", 64, false, true},
    {DType::F16, "F16", "float16", 16, true, false},
    {DType::BF16, "BF16", "bfloat16", 16, true, false},
    {DType::F32, "F32", "float32", 32, true, false},
    {DType::F64, "F64", "float64", 64, true, false},
    {DType::C64, "C64", "complex64", 64, false, false},
    {DType::F8_E4M3, "F8_E4M3", "float8_e4m3fn", 8, true, false},
    {DType::F8_E5M2, "F8_E5M2", "float8_e5m2", 8, true, false},
    {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", "float8_e4m3fnuz", 8, true, false},
    {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", "float8_e5m2fnuz", 8, true, false},
    {DType::F8_E8M0, "F8_E8M0", "float8_e8m0fnu", 8, true, false},
    {DType::F6_E2M3, "F6_E2M3", "float6_e2m3fn", 6, true, false},
    {DType::F6_E3M2, "F6_E3M2", "float6_e3m2fn", 6, true, false},
    {DType::F4, "F4", "float4_e2m1fn", 4, true, false},
}};

constexpr bool dtype_table_in_enum_order() {
  for (std::size_t i = 0; i < dtype_table.size(); ++i)
    if (static_cast<std::size_t>(dtype_table[i].dtype) != i) return false;
  return true;
}
static_assert(dtype_table_in_enum_order(), "dtype_table rows must follow the DType enum order");

constexpr const DTypeInfo& dtype_info(DType d) { return dtype_table[static_cast<std::size_t>(d)]; }

// Common torch aliases (`torch.half`, `torch.long`, ...) accepted on input only.
struct DTypeAlias {
  std::string_view name;
  DType dtype;
};
inline constexpr std::array<DTypeAlias, 9> dtype_aliases{{
    {"half", DType::F16},
    {"float", DType::F32},
    {"double", DType::F64},
    {"long", DType::I64},
    {"int", DType::I32},
    {"short", DType::I16},
    {"uint1", DType::BOOL},
    {"float8_e4m3", DType::F8_E4M3},
    {"float8_e8m0", DType::F8_E8M0},
}};

inline std::string accepted_dtype_names() {
  std::string out;
  for (const auto& row : dtype_table) {
    if (!out.empty()) out += ", ";
    out += row.torch;
    out += '/';
    out += row.safetensors;
  }
  return out;
}

}  // namespace detail

/// @brief Looks a dtype up by name without throwing.
/// @param name torch spelling (`float16`, `torch.bfloat16`, `int64`, `bool`, `float8_e4m3fn`, `half`)
///        or safetensors spelling (`F16`, `BF16`, `I64`, `BOOL`, `F8_E4M3`); torch names are
///        case-insensitive, safetensors names exact.
/// @return the dtype, or nullopt when the name is unknown
[[nodiscard]] inline std::optional<DType> try_dtype_from_string(std::string_view name) {
  for (const auto& row : detail::dtype_table)
    if (row.safetensors == name) return row.dtype;
  std::string lower;
  lower.reserve(name.size());
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view key = lower;
  if (key.starts_with("torch.")) key.remove_prefix(6);
  for (const auto& row : detail::dtype_table)
    if (row.torch == key) return row.dtype;
  for (const auto& alias : detail::dtype_aliases)
    if (alias.name == key) return alias.dtype;
  return std::nullopt;
}

/// @brief Parses a dtype name (torch or safetensors spelling).
/// @param name see try_dtype_from_string
/// @return the dtype
/// @throws accel::usage_error naming the string and listing the accepted names when unknown
[[nodiscard]] inline DType dtype_from_string(std::string_view name) {
  if (auto d = try_dtype_from_string(name)) return *d;
  detail::throw_error<usage_error>("unknown dtype '", name, "'; accepted names (torch/safetensors): ",
                                   detail::accepted_dtype_names());
}

/// @brief The safetensors header spelling (`F16`, `BF16`, `F8_E4M3`, ...).
[[nodiscard]] constexpr std::string_view safetensors_name(DType d) { return detail::dtype_info(d).safetensors; }

/// @brief The torch spelling without the `torch.` prefix (`float16`, `bfloat16`, `float8_e4m3fn`).
/// @note The sub-byte F6/F4 types have no torch dtype; their ml_dtypes names are returned.
[[nodiscard]] constexpr std::string_view torch_name(DType d) { return detail::dtype_info(d).torch; }

/// @brief The dtype name accelerate writes into an offload folder's index.json.
/// @note accelerate stores `str(tensor.dtype)` without `torch.`, so this is the torch name:
///       `bfloat16` stays "bfloat16" (its .dat file holds the raw 16-bit patterns).
[[nodiscard]] constexpr std::string_view numpy_name(DType d) { return detail::dtype_info(d).torch; }

/// @brief Bits per element (4 for F4, 6 for F6_*, 8 for BOOL and F8_*).
[[nodiscard]] constexpr unsigned bit_size(DType d) { return detail::dtype_info(d).bits; }

/// @brief True for the sub-byte types (F4, F6_E2M3, F6_E3M2).
[[nodiscard]] constexpr bool is_sub_byte(DType d) { return bit_size(d) % 8 != 0; }

/// @brief Bytes per element; bool counts as one byte (as safetensors stores it).
/// @throws accel::usage_error for the sub-byte types (use tensor_bytes for those)
[[nodiscard]] inline std::uint64_t element_size_bytes(DType d) {
  if (is_sub_byte(d))
    detail::throw_error<usage_error>("dtype ", safetensors_name(d), " has ", bit_size(d),
                                     " bits per element, not a whole number of bytes; use accel::tensor_bytes");
  return bit_size(d) / 8;
}

/// @brief True for floating dtypes (torch.is_floating_point: F16, BF16, F32, F64, F8_*, F6_*, F4).
[[nodiscard]] constexpr bool is_floating(DType d) { return detail::dtype_info(d).floating; }

/// @brief True for integer, unsigned and bool dtypes, which a target dtype never converts.
[[nodiscard]] constexpr bool is_integral(DType d) { return detail::dtype_info(d).integral; }

/// @brief Elements of a tensor of this shape (1 for a scalar, the empty shape).
[[nodiscard]] constexpr std::uint64_t shape_numel(std::span<const std::int64_t> shape) noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

/// @brief Bytes of `numel` elements of `d`, or nullopt when the bits are not a whole number of
///        bytes or the product overflows 64 bits.
[[nodiscard]] constexpr std::optional<std::uint64_t> tensor_bytes(DType d, std::uint64_t numel) {
  const std::uint64_t bits = bit_size(d);
  if (numel != 0 && numel > UINT64_MAX / bits) return std::nullopt;
  const std::uint64_t total = numel * bits;
  if (total % 8 != 0) return std::nullopt;
  return total / 8;
}

namespace detail {
/// @brief Whether `pattern` matches a prefix of `text` that `ends_ok(end)` accepts: `*` any run,
///        `.` any one character, everything else literal (the patterns transformers writes as
///        regular expressions). Greedy with one backtrack point, the last star: linear in practice.
template <class EndsOk>
[[nodiscard]] constexpr bool glob_prefix_matches(std::string_view pattern, std::string_view text, EndsOk&& ends_ok) noexcept {
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  for (;;) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
      continue;
    }
    if (p == pattern.size() && ends_ok(t)) return true;
    if (p < pattern.size() && t < text.size() && (pattern[p] == '.' || pattern[p] == text[t])) {
      ++p;
      ++t;
      continue;
    }
    if (star == std::string_view::npos || mark >= text.size()) return false;
    p = star + 1;
    t = ++mark;
  }
}
}  // namespace detail

/// @name The load dtype: one decision for the planner (sizes) and the loader (conversion)
///@{
/// @brief Whether a keep-in-fp32 pattern matches a tensor name, as transformers matches its
///        `_keep_in_fp32_modules` (a regex search of the name): the pattern may match anywhere in
///        the name; `*` matches any run of characters and `.` any one character.
/// @note So `wo` matches `decoder.block.0.layer.2.DenseReluDense.wo.weight`, and `lm_head` matches
///       `lm_head.weight`. The planner, the loader and `accel load`/`accel plan` all use this.
[[nodiscard]] constexpr bool keep_in_fp32_matches(std::string_view pattern, std::string_view name) noexcept {
  if (pattern.empty()) return true;
  for (std::size_t start = 0; start <= name.size(); ++start)  // unanchored at both ends: the rest of the name is free
    if (detail::glob_prefix_matches(pattern, name.substr(start), [](std::size_t) { return true; })) return true;
  return false;
}

/// @brief True when the loader converts `from` to `to`: the same dtype, or both among float32,
///        float16 and bfloat16 (float8, float4, float64 and integers are loaded only as stored).
[[nodiscard]] constexpr bool converts_between(DType from, DType to) noexcept {
  constexpr auto common = [](DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; };
  return from == to || (common(from) && common(to));
}

/// @brief What decides the dtype tensors are loaded in.
struct LoadDTypeRule {
  /// The dtype floating tensors are loaded in (transformers' `dtype=`, already resolved from
  /// `auto`); unset: each keeps its stored dtype.
  std::optional<DType> target{};
  /// Patterns (keep_in_fp32_matches) of tensors loaded as float32 whatever the target (a view:
  /// the rule is a short-lived argument).
  std::span<const std::string> keep_in_fp32{};
};

/// @brief The dtype a checkpoint tensor is loaded in: integer, bool and other non-floating tensors
///        keep their stored dtype; a floating tensor matching a keep-in-fp32 pattern is float32;
///        any other floating tensor takes the target (up or down), or keeps its dtype without one.
/// @note The planner sizes every tensor with this and the loader converts with it, so a plan and
///       the load it describes agree by construction.
[[nodiscard]] inline DType tensor_load_dtype(DType stored, std::string_view name, const LoadDTypeRule& rule) {
  if (!detail::dtype_info(stored).floating) return stored;
  for (const auto& k : rule.keep_in_fp32)
    if (keep_in_fp32_matches(k, name)) return DType::F32;
  return rule.target.value_or(stored);
}
///@}

ACCEL_NAMESPACE_END
