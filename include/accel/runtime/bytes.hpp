// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file bytes.hpp
/// @brief Little-endian integer codecs, the one byte order of every accel format (store frames,
///        collective payloads, safetensors headers), independent of the host's order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Writes `v` to `out[0, sizeof v)`, least significant byte first.
template <class U>
constexpr void store_le(std::byte* out, U v) noexcept {
  static_assert(std::is_unsigned_v<U>);
  for (std::size_t i = 0; i < sizeof(U); ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFu);
}

/// @brief Reads a `U` stored least significant byte first at `in[0, sizeof(U))`.
template <class U>
[[nodiscard]] constexpr U load_le(const std::byte* in) noexcept {
  static_assert(std::is_unsigned_v<U>);
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(in[i]) << (8 * i));
  return v;
}

/// @brief Appends `v` to `out`, least significant byte first.
template <class U>
void append_le(std::vector<std::byte>& out, U v) {
  const auto at = out.size();
  out.resize(at + sizeof(U));
  store_le(out.data() + at, v);
}

ACCEL_NAMESPACE_END
