// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file memory.hpp
/// @brief Byte sizes ("20GiB", "5Gb"), per-device budgets (MaxMemory) and their defaults.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/model/json.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

#include <unistd.h>

ACCEL_NAMESPACE_BEGIN

namespace detail {
inline bool iends_with(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (std::size_t i = 0; i < suffix.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(s[s.size() - suffix.size() + i])) != suffix[i]) return false;
  return true;
}

// Parses a finite non-negative decimal number (what Python's float() accepts, minus nan/inf).
inline std::optional<double> parse_number(std::string_view s) {
  s = text::trim(s);
  if (s.empty()) return std::nullopt;
  for (char c : s)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return std::nullopt;
  std::string text(s);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  return v;
}

// "-1", "-2.5": a number but for its sign (said as such, not as "not a number").
inline bool negative_number(std::string_view s) {
  s = text::trim(s);
  return s.size() > 1 && s.front() == '-' && parse_number(s.substr(1));
}
inline constexpr std::string_view negative_size = " (a size cannot be negative; 0 gives nothing)";

[[noreturn]] inline void bad_size(std::string_view text, std::string_view why) {
  throw_error<config_error>("invalid memory size '", text::excerpt(text), "'", why,
                            "; use a byte count (68719476736) or a number with a unit: KiB/MiB/GiB/TiB (powers of 2), "
                            "KB/MB/GB/TB (powers of 10), a trailing lower-case b means bits (5Gb)");
}
}  // namespace detail

/// @brief Parses a memory size the way accelerate's convert_file_size_to_int does.
///
/// In: `"20GiB"` → 21474836480, `"1.5GB"` → 1500000000, `"5Gb"` → 625000000 (bits),
/// `"3.7MiB"` → 3879731 (truncated), `"1024"` or `"1e9"` → bytes (accelerate rejects a unit-less
/// string; accel takes it as bytes). Units are case-insensitive; a string ending in lower-case `b`
/// with a decimal unit (KB/MB/GB/TB) counts bits. Whitespace around the number is ignored.
/// @param text the size
/// @return bytes
/// @throws accel::config_error for a negative, non-finite or unitless-garbage value or an unknown
///         unit (`5B`, `5MBB`), naming the string and listing the units
[[nodiscard]] inline std::uint64_t parse_byte_size(std::string_view text) {
  struct Unit {
    std::string_view suffix;
    double factor;
    bool decimal;
  };
  static constexpr Unit units[] = {{"TIB", 1099511627776.0, false}, {"GIB", 1073741824.0, false},
                                   {"MIB", 1048576.0, false},       {"KIB", 1024.0, false},
                                   {"TB", 1e12, true},              {"GB", 1e9, true},
                                   {"MB", 1e6, true},               {"KB", 1e3, true}};
  const std::string_view s = text::trim(text);
  for (const auto& u : units) {
    if (!detail::iends_with(s, u.suffix)) continue;
    const auto digits = s.substr(0, s.size() - u.suffix.size());
    auto number = detail::parse_number(digits);
    if (!number && detail::negative_number(digits)) detail::bad_size(text, detail::negative_size);
    if (!number) detail::bad_size(text, " (the part before the unit is not a non-negative number)");
    const double bytes = *number * u.factor;
    if (bytes >= 18446744073709551615.0) detail::bad_size(text, " (larger than 2^64 bytes)");
    const auto n = static_cast<std::uint64_t>(bytes);  // truncation, as Python's int()
    return u.decimal && s.back() == 'b' ? n / 8 : n;
  }
  auto number = detail::parse_number(s);
  if (!number && detail::negative_number(s)) detail::bad_size(text, detail::negative_size);
  if (!number) detail::bad_size(text, s.empty() ? " (empty)" : " (unknown unit or not a number)");
  if (*number >= 18446744073709551615.0) detail::bad_size(text, " (larger than 2^64 bytes)");
  if (*number != std::floor(*number)) detail::bad_size(text, " (a byte count must be a whole number)");
  return static_cast<std::uint64_t>(*number);
}

/// @brief Per-device byte budgets: GPUs by index (ascending), then `cpu`, then `disk`.
///
/// A missing `cpu` means nothing is placed in CPU memory (overflow goes to disk, as accelerate);
/// a missing `disk` means disk is unbounded; `disk=0` forbids disk offload.
struct MaxMemory {
  std::map<int, std::uint64_t> gpus{};     ///< GPU index → bytes
  std::optional<std::uint64_t> cpu{};      ///< CPU RAM budget
  std::optional<std::uint64_t> disk{};     ///< disk budget; unset = unbounded

  /// @brief True when no device has a budget.
  [[nodiscard]] bool empty() const noexcept { return gpus.empty() && !cpu && !disk; }
  /// @brief Every budget multiplied by `factor` (rounded down), as transformers' quantizers adjust
  ///        max_memory (bitsandbytes keeps 10% back for buffers made while loading).
  [[nodiscard]] MaxMemory scaled(double factor) const {
    auto scale = [&](std::uint64_t v) { return static_cast<std::uint64_t>(static_cast<double>(v) * factor); };
    MaxMemory out = *this;
    for (auto& [i, v] : out.gpus) v = scale(v);
    if (out.cpu) out.cpu = scale(*out.cpu);
    if (out.disk) out.disk = scale(*out.disk);
    return out;
  }
  /// @brief `0=20.00 GiB, cpu=64.00 GiB` for messages.
  [[nodiscard]] std::string to_string() const {
    std::string out;
    auto add = [&](const std::string& k, std::uint64_t v) {
      if (!out.empty()) out += ", ";
      out += k + "=" + text::format_bytes(v);
    };
    for (const auto& [i, v] : gpus) add(std::to_string(i), v);
    if (cpu) add("cpu", *cpu);
    if (disk) add("disk", *disk);
    return out;
  }
};

namespace detail {
inline void set_budget(MaxMemory& m, std::string_view key_raw, std::uint64_t bytes, std::string_view source) {
  const std::string_view key = text::trim(key_raw);
  auto dup = [&](std::string_view k) {
    throw_error<config_error>("max_memory key '", k, "' is given twice in '", text::excerpt(source), "'; give each device once");
  };
  if (key == "cpu") {
    if (m.cpu) dup(key);
    m.cpu = bytes;
    return;
  }
  if (key == "disk") {
    if (m.disk) dup(key);
    m.disk = bytes;
    return;
  }
  bool digits = !key.empty() && key.size() < 6;
  for (char c : key) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (!digits)
    throw_error<config_error>("unknown max_memory key '", text::excerpt(key), "' in '", text::excerpt(source),
                              "'; keys are GPU indices (0, 1, ...), 'cpu' or 'disk' (not 'cuda:0' or 'gpu0')");
  const int index = *text::parse_integer<int>(key);
  if (m.gpus.count(index)) dup(key);
  m.gpus.emplace(index, bytes);
}
}  // namespace detail

/// @brief Parses budgets from `0=20GiB,1=20GiB,cpu=64GiB` or a JSON object
///        `{"0": "20GiB", "cpu": 68719476736}` (values: size strings or byte counts).
/// @throws accel::config_error naming the bad key or value
[[nodiscard]] inline MaxMemory parse_max_memory(std::string_view text) {
  MaxMemory m;
  const std::string_view s = text::trim(text);
  if (s.empty()) detail::throw_error<config_error>("empty max_memory; give budgets like '0=20GiB,cpu=64GiB'");
  if (s.front() == '{') {
    auto parsed = parse_json_strict(s);
    if (!parsed.error.empty())
      detail::throw_error<config_error>("max_memory '", text::excerpt(text), "' is not valid JSON: ", parsed.error);
    if (!parsed.value.is_object()) detail::throw_error<config_error>("max_memory '", text::excerpt(text), "' is not a JSON object");
    for (const auto& [k, v] : parsed.value.items()) {
      std::uint64_t bytes = 0;
      if (v.is_string()) bytes = parse_byte_size(v.get<std::string>());
      else if (v.is_number_unsigned()) bytes = v.get<std::uint64_t>();
      else  // floats too: 1.5 bytes means nothing, and 1e30 or 2^64 does not fit in a byte count
        detail::throw_error<config_error>("max_memory value for '", text::excerpt(k), "' is ", json_excerpt(v),
                                          "; use a whole byte count below 2^64 or a size string like \"20GiB\"");
      detail::set_budget(m, k, bytes, text);
    }
  } else {
    std::size_t start = 0;
    while (start <= s.size()) {
      auto comma = s.find(',', start);
      auto item = text::trim(s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
      if (!item.empty()) {
        auto eq = item.find('=');
        if (eq == std::string_view::npos)
          detail::throw_error<config_error>("max_memory entry '", text::excerpt(item),
                                            "' has no '='; write KEY=SIZE such as 0=20GiB or cpu=64GiB");
        detail::set_budget(m, item.substr(0, eq), parse_byte_size(item.substr(eq + 1)), text);
      }
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
  }
  if (m.empty()) detail::throw_error<config_error>("max_memory '", text::excerpt(text), "' names no device; give budgets like '0=20GiB,cpu=64GiB'");
  return m;
}

/// @brief What the default budgets need to know about one GPU (plain data, from any device query).
struct DeviceBudgetInfo {
  int index = 0;             ///< device index as the process sees it
  std::uint64_t total = 0;   ///< total memory, bytes
  std::uint64_t free = 0;    ///< currently free memory, bytes
};

/// @brief How much of each device the default budgets hold back for activations, KV cache and
///        the CUDA context.
struct BudgetReserve {
  double gpu_fraction = 0.10;                    ///< share of each GPU's *total* memory held back
  std::uint64_t gpu_min = 1ull << 30;            ///< at least this much per GPU (1 GiB)
  double cpu_fraction = 0.10;                    ///< share of available RAM held back
};

/// @brief Default budgets: each GPU's free memory minus max(gpu_min, gpu_fraction × total); CPU =
///        available RAM minus cpu_fraction of it; disk unbounded (no key).
/// @param gpus the visible GPUs (empty on a CPU-only machine)
/// @param available_ram bytes of RAM available (see read_available_ram)
/// @param reserve what to hold back
[[nodiscard]] inline MaxMemory default_max_memory(std::span<const DeviceBudgetInfo> gpus, std::uint64_t available_ram,
                                                  const BudgetReserve& reserve = {}) {
  MaxMemory m;
  for (const auto& g : gpus) {
    const auto held = std::max<std::uint64_t>(reserve.gpu_min, static_cast<std::uint64_t>(reserve.gpu_fraction * static_cast<double>(g.total)));
    m.gpus[g.index] = g.free > held ? g.free - held : 0;
  }
  m.cpu = available_ram - static_cast<std::uint64_t>(reserve.cpu_fraction * static_cast<double>(available_ram));
  return m;
}

/// @brief Checks budgets meant for one process's group of GPUs (DistributedState::devices()): GPU
///        key i is the group's i-th GPU, so every key must be below the group's size (pure function).
/// @param group_size GPUs in the group (0 when the process runs on the CPU)
/// @param group the group's GPUs for the message, e.g. `cuda:2,cuda:3 (physical GPUs 6,7)`
/// @throws accel::usage_error naming the first key past the group, the group's size and its GPUs
inline void require_group_budgets(const MaxMemory& budgets, std::size_t group_size, std::string_view group) {
  for (const auto& [gpu, bytes] : budgets.gpus) {
    if (gpu >= 0 && static_cast<std::size_t>(gpu) < group_size) continue;
    if (group_size == 0)
      detail::throw_error<usage_error>("max_memory gives GPU ", gpu, " a budget (", text::format_bytes(bytes),
                                       ") but this process's group has no GPU (it runs on the CPU); budget only cpu and disk");
    detail::throw_error<usage_error>(
        "max_memory gives GPU ", gpu, " a budget (", text::format_bytes(bytes), ") but this process's group has ",
        text::plural(static_cast<long long>(group_size), "GPU"), ": ", group, "; GPU keys index the group: 0",
        group_size > 1 ? detail::concat(" to ", group_size - 1) : std::string(), ", 0 being its first GPU");
  }
}

/// @brief `MemAvailable` from /proc/meminfo-formatted text (values in kB), in bytes.
[[nodiscard]] inline std::optional<std::uint64_t> parse_meminfo_available(std::string_view meminfo) {
  std::istringstream in{std::string(meminfo)};
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream fields(line.substr(13));
    std::uint64_t kb = 0;
    if (fields >> kb) return kb * 1024u;
  }
  return std::nullopt;
}

/// @brief The machine's available RAM: /proc/meminfo `MemAvailable`, else free physical pages.
/// @return bytes, or nullopt when neither source answers
[[nodiscard]] inline std::optional<std::uint64_t> read_available_ram() {
  std::ifstream in("/proc/meminfo");
  if (in) {
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (auto v = parse_meminfo_available(text)) return v;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && size > 0) return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(size);
  return std::nullopt;
}

ACCEL_NAMESPACE_END
