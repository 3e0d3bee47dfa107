// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file text.hpp
/// @brief The text helpers every layer shares: strict integer parsing, joining, trimming, and the
///        number formats of messages ("1.50 GiB", "3.4 ms", "2 GPUs").
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace text {

/// @brief FNV-1a of the bytes of `s`: a stable 64-bit fingerprint (the same on every machine and
///        build), for type shapes and job identities; not for security.
[[nodiscard]] constexpr std::uint64_t fnv1a(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

/// @brief splitmix64's finaliser: every output bit depends on every input bit.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t h) noexcept {
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

/// @brief `s` without leading and trailing white space.
[[nodiscard]] constexpr std::string_view trim(std::string_view s) noexcept {
  constexpr std::string_view space = " \t\n\r\f\v";
  const auto b = s.find_first_not_of(space);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

/// @brief The whole of `s` as a decimal integer of type `Int`, or nullopt.
///
/// In: `"42"` → 42; `"-3"` → -3 for signed types, nullopt for unsigned ones; `""`, `" 1"`, `"+1"`,
/// `"1x"`, `"0x10"` and anything outside `Int`'s range → nullopt. No locale, no white space.
template <class Int>
[[nodiscard]] std::optional<Int> parse_integer(std::string_view s) noexcept {
  static_assert(std::is_integral_v<Int> && !std::is_same_v<Int, bool>);
  if (s.empty() || s.front() == '+') return std::nullopt;
  if constexpr (std::is_unsigned_v<Int>)
    if (s.front() == '-') return std::nullopt;
  Int v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// @brief `s` for a message: whole when short, else its first `limit` characters, "...", and its
///        length, so a hostile input cannot flood the terminal.
[[nodiscard]] inline std::string excerpt(std::string_view s, std::size_t limit = 80) {
  if (s.size() <= limit) return std::string(s);
  return detail::concat(s.substr(0, limit), "... (", s.size(), " characters)");
}

/// @brief A name read from a file, for a message: control bytes (NUL, which would cut the message
///        short; ESC, which would drive the terminal; newlines, which would forge lines) as \xNN,
///        the whole shortened as excerpt does. Tensor, module and field names from checkpoints go
///        through it in every message.
[[nodiscard]] inline std::string printable(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, std::min<std::size_t>(name.size(), 200))) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    static constexpr char hex[] = "0123456789abcdef";
    out += "\\x";
    out += hex[u >> 4];
    out += hex[u & 15];
  }
  return excerpt(out) + (name.size() > 200 ? detail::concat("... (", name.size(), " bytes)") : std::string());
}

/// @brief The elements of `items` written as `concat` writes them, separated by `sep`.
///
/// In: `{1, 2, 3}` → `"1, 2, 3"`; `join(ids, ",")` → `"0,2"`.
template <class Range>
[[nodiscard]] std::string join(const Range& items, std::string_view sep = ", ") {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += sep;
    first = false;
    out += detail::concat(item);
  }
  return out;
}

/// @brief `'a', 'b', 'c'` — the first `limit` names quoted (printable: control bytes escaped), then
///        "and N more".
template <class Range>
[[nodiscard]] std::string quoted_list(const Range& names, std::size_t limit = 8) {
  std::string out;
  std::size_t n = 0;
  for (const auto& name : names) {
    if (n < limit) out += detail::concat(n ? ", '" : "'", printable(detail::concat(name)), "'");
    ++n;
  }
  if (n > limit) out += detail::concat(" and ", n - limit, " more");
  return out;
}

/// @brief Levenshtein distance (insertions, deletions, substitutions), for "did you mean" hints.
[[nodiscard]] inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// @brief `"1 GPU"`, `"2 GPUs"`, `"3 processes"`.
[[nodiscard]] inline std::string plural(long long n, std::string_view word) {
  return detail::concat(n, " ", word, n == 1 ? "" : word.ends_with("s") ? "es" : "s");
}

/// @brief `v` with exactly `digits` decimals: fixed(1.25, 1) → "1.2" (printf rounding).
[[nodiscard]] inline std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

/// @brief "1.25 s", "3.4 ms", "12.0 us".
[[nodiscard]] inline std::string format_seconds(double s) {
  if (s >= 1.0) return fixed(s, 2) + " s";
  if (s >= 1e-3) return fixed(s * 1e3, 1) + " ms";
  return fixed(s * 1e6, 1) + " us";
}

/// @brief A millisecond count for messages: "300 s" when whole seconds, else "250 ms".
[[nodiscard]] inline std::string format_ms(std::uint64_t ms) {
  return ms % 1000 == 0 ? detail::concat(ms / 1000, " s") : detail::concat(ms, " ms");
}

/// @brief How bytes are written for people.
enum class ByteStyle {
  fixed2,      ///< two decimals above 1 KiB: "20.00 GiB", "512 B" (budgets, plans)
  significant3 ///< three significant digits: "1.50 GiB", "12.0 MiB", "512 B" (progress, rates)
};

/// @brief Bytes in binary units (B, KiB, MiB, GiB, TiB, PiB); any arithmetic type (counts, rates).
template <class Number>
  requires std::is_arithmetic_v<Number>
[[nodiscard]] std::string format_bytes(Number count, ByteStyle style = ByteStyle::fixed2) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  auto bytes = static_cast<double>(count);
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  if (u == 0) return fixed(bytes, 0) + " B";
  const int digits = style == ByteStyle::fixed2 ? 2 : bytes < 10 ? 2 : bytes < 100 ? 1 : 0;
  return fixed(bytes, digits) + " " + units[u];
}

}  // namespace text
ACCEL_NAMESPACE_END
