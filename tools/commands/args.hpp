// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file args.hpp
/// @brief A tiny argument parser shared by the accel subcommands.
///
/// Accepts `--opt value`, `--opt=value`, underscores or hyphens (`--max_memory` = `--max-memory`),
/// repeatable options, flags, `--help`/`-h`, and `--` to end options. Anything unknown is an
/// accel::usage_error naming it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/error.hpp>

namespace accel_cli {

/// @brief One option a subcommand understands.
struct OptionSpec {
  std::string_view name;     ///< long name without dashes, hyphen spelling (`max-memory`)
  bool takes_value = false;  ///< `--name VALUE`; false for flags
  bool repeated = false;     ///< may be given several times (values collected in order)
  std::string_view metavar;  ///< shown in help (`PATH`); ignored for flags
  std::string_view help;     ///< one-line description
};

/// @brief The result of parse_args.
class ParsedArgs {
 public:
  /// @brief True when `--help` or `-h` was given (the caller prints help and exits 0).
  [[nodiscard]] bool help() const noexcept { return help_; }
  /// @brief True when the option (flag or valued) was given at least once.
  [[nodiscard]] bool has(std::string_view name) const { return values_.find(std::string(name)) != values_.end(); }
  /// @brief The last value of a valued option, or nullopt when absent.
  [[nodiscard]] std::optional<std::string> value(std::string_view name) const {
    auto it = values_.find(std::string(name));
    if (it == values_.end() || it->second.empty()) return std::nullopt;
    return it->second.back();
  }
  /// @brief Every value of a (repeated) option in command-line order; empty when absent.
  [[nodiscard]] std::vector<std::string> values(std::string_view name) const {
    auto it = values_.find(std::string(name));
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  /// @brief Positional arguments in order (only when parse_args allowed them).
  [[nodiscard]] const std::vector<std::string>& positional() const noexcept { return positional_; }

 private:
  friend ParsedArgs parse_args(std::span<char*>, std::span<const OptionSpec>, bool);
  bool help_ = false;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

namespace detail {
inline std::string normalize_option_name(std::string_view raw) {
  std::string name(raw);
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}
}  // namespace detail

/// @brief Parses a subcommand's arguments.
/// @param args argv of the subcommand (args[0] is the subcommand name and is skipped)
/// @param specs the options it understands
/// @param allow_positional whether bare words are collected (else they are an error)
/// @return the parsed options
/// @throws accel::usage_error for an unknown option, a missing value, a value given to a flag, an
///         option given twice that is not repeatable, or an unexpected positional argument
inline ParsedArgs parse_args(std::span<char*> args, std::span<const OptionSpec> specs,
                             bool allow_positional = false) {
  ParsedArgs out;
  const std::string command = args.empty() ? std::string("accel") : std::string(args[0]);
  bool options_done = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string_view word = args[i];
    if (options_done || !word.starts_with("-") || word == "-") {
      if (!allow_positional)
        accel::detail::throw_error<accel::usage_error>(command, ": unexpected argument '", word, "'; see `accel ",
                                                       command, " --help`");
      out.positional_.emplace_back(word);
      continue;
    }
    if (word == "--") {
      options_done = true;
      continue;
    }
    if (word == "--help" || word == "-h") {
      out.help_ = true;
      continue;
    }
    if (!word.starts_with("--"))
      accel::detail::throw_error<accel::usage_error>(command, ": unknown option '", word,
                                                     "' (options are spelled --name); see `accel ", command,
                                                     " --help`");
    std::string_view body = word.substr(2);
    std::optional<std::string> inline_value;
    if (auto eq = body.find('='); eq != std::string_view::npos) {
      inline_value = std::string(body.substr(eq + 1));
      body = body.substr(0, eq);
    }
    const std::string name = detail::normalize_option_name(body);
    auto spec = std::find_if(specs.begin(), specs.end(), [&](const OptionSpec& s) { return s.name == name; });
    if (spec == specs.end())
      accel::detail::throw_error<accel::usage_error>(command, ": unknown option '--", body, "'; see `accel ",
                                                     command, " --help`");
    auto& slot = out.values_[name];
    if (!spec->repeated && !slot.empty())
      accel::detail::throw_error<accel::usage_error>(command, ": option '--", name,
                                                     "' given more than once; give it once");
    if (!spec->takes_value) {
      if (inline_value)
        accel::detail::throw_error<accel::usage_error>(command, ": option '--", name, "' is a flag and takes no value (got '",
                                                       *inline_value, "')");
      slot.emplace_back();
      continue;
    }
    if (inline_value) {
      slot.push_back(*inline_value);
      continue;
    }
    if (i + 1 >= args.size())
      accel::detail::throw_error<accel::usage_error>(command, ": option '--", name, "' needs a value (",
                                                     spec->metavar.empty() ? std::string_view("VALUE") : spec->metavar,
                                                     ")");
    slot.emplace_back(args[++i]);
  }
  return out;
}

/// @brief Formats `usage` followed by one line per option, for `--help`.
inline std::string format_help(std::string_view usage, std::span<const OptionSpec> specs) {
  std::string out(usage);
  out += "\n\noptions:\n";
  std::vector<std::string> lefts;
  std::size_t width = 0;
  for (const auto& s : specs) {
    std::string left = "  --" + std::string(s.name);
    if (s.takes_value) left += " " + std::string(s.metavar.empty() ? std::string_view("VALUE") : s.metavar);
    width = std::max(width, left.size());
    lefts.push_back(std::move(left));
  }
  lefts.emplace_back("  --help");
  width = std::max(width, lefts.back().size());
  for (std::size_t i = 0; i <= specs.size(); ++i) {
    std::string line = lefts[i];
    line.resize(width + 2, ' ');
    line += i < specs.size() ? std::string(specs[i].help) : std::string("print this help and exit");
    if (i < specs.size() && specs[i].repeated) line += " (repeatable)";
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace accel_cli
