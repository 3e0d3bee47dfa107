// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file args.hpp
/// @brief The argument parser every accel subcommand uses.
///
/// Accepts `--opt value`, `--opt=value`, underscores or hyphens (`--max_memory` = `--max-memory`),
/// flags, repeatable options, integer and seconds options checked where they appear, `--help`/`-h`,
/// and `--` to end the options. What follows the options is set per command: nothing, a list of
/// words, or (accel launch) a program with its arguments. Anything else is an accel::usage_error
/// naming the offending word.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

namespace accel_cli {

/// @brief What an option takes.
enum class OptionKind : unsigned char {
  flag,             ///< no value: `--json`
  text,             ///< any value: `--checkpoint PATH`
  integer,          ///< a decimal integer within [OptionSpec::min, OptionSpec::max]
  seconds,          ///< a positive number of seconds: `--timeout 12.5`
  seconds_or_zero,  ///< a non-negative number of seconds: `--grace 0`
};

/// @brief One option a subcommand understands.
struct OptionSpec {
  std::string_view name = {};             ///< long name without dashes, hyphen spelling (`max-memory`)
  OptionKind kind = OptionKind::flag;     ///< what it takes; integer and seconds values are checked as they are read
  std::string_view metavar = {};          ///< the value's name in help and messages (`PATH`); unused for flags
  std::string_view help = {};             ///< one-line description
  bool repeated = false;                  ///< may be given several times (values collected in order)
  long long min = 0;                      ///< integer: smallest accepted value (0 or 1)
  long long max = 0;                      ///< integer: largest accepted value
  std::string_view refused = {};          ///< set: a known option accel refuses, with this reason (not in help)
};

/// @brief What may follow the options.
enum class Operands : unsigned char {
  none,     ///< nothing: a bare word is an error
  list,     ///< bare words anywhere among the options, and every word after `--`, collected in order
  program,  ///< a program: it starts at the first bare word or after `--`, and it and every word
            ///< after it are collected unchanged, options of the program included
};

/// @brief How a command words its parse errors and treats an option given twice.
enum class Style : unsigned char {
  /// plan, load, estimate-memory, env, version: an option given twice is an error unless
  /// repeatable; messages start with the command (`plan: option '--dtype' needs a value (DTYPE)`).
  accel,
  /// launch, like accelerate launch: an option given again replaces the earlier value; messages
  /// name the option as typed (`--num_processes needs a value; see accel launch --help`).
  launcher,
};

/// @brief Everything parse_args needs to know about one subcommand's command line.
struct CommandSyntax {
  std::span<const OptionSpec> options;    ///< the options it understands
  Operands operands = Operands::none;     ///< what may follow them
  Style style = Style::accel;             ///< its messages and repeated options
};

/// @brief `value` as an integer within [min, max] (min is 0 or 1).
/// @throws accel::usage_error naming `option` as given and the value: `--num_processes 'x' is not a
///         positive integer`, `--main_process_port '70000' is not a non-negative integer up to 65535`
inline int parse_int_option(std::string_view option, std::string_view value, long long min, long long max) {
  const auto v = accel::text::parse_integer<int>(value);
  if (!v || *v < min || *v > max)
    throw accel::usage_error(std::string(option) + " '" + std::string(value) + "' is not " +
                             (min == 0 ? "a non-negative integer" : "a positive integer") +
                             (max < 999'999'999 ? " up to " + std::to_string(max) : std::string()));
  return *v;
}

/// @brief `value` as a number of seconds: decimal, at most 1e7, above 0 (or at least 0 with
///        `allow_zero`); no hexadecimal, infinity or NaN.
/// @throws accel::usage_error naming `option` and the value: `--timeout '0' is not a positive
///         number of seconds (e.g. --timeout 30)`
inline double parse_seconds_option(std::string_view option, std::string_view value, bool allow_zero) {
  const std::string text(value);
  char* end = nullptr;
  const double s = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  const bool ok = !text.empty() && end == text.c_str() + text.size() && (allow_zero ? s >= 0 : s > 0) && s <= 1e7 &&
                  text.find_first_of("xXpPnN") == std::string::npos;  // no hex floats, inf, nan
  if (!ok)
    throw accel::usage_error(std::string(option) + " '" + text + "' is not " + (allow_zero ? "a non-negative" : "a positive") +
                             " number of seconds (e.g. " + std::string(option) + " 30)");
  return s;
}

/// @brief The result of parse_args. Options are named by their OptionSpec::name.
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
  /// @brief Every value of an option in command-line order; empty when absent.
  [[nodiscard]] std::vector<std::string> values(std::string_view name) const {
    auto it = values_.find(std::string(name));
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  /// @brief The last value of an OptionKind::integer option (already checked), or nullopt when absent.
  [[nodiscard]] std::optional<int> integer(std::string_view name) const {
    const auto v = value(name);
    return v ? accel::text::parse_integer<int>(*v) : std::nullopt;
  }
  /// @brief The last value of a seconds option (already checked), or nullopt when absent.
  [[nodiscard]] std::optional<double> seconds(std::string_view name) const {
    const auto v = value(name);
    return v ? std::optional<double>(parse_seconds_option(spelling(name), *v, true)) : std::nullopt;
  }
  /// @brief The option as typed at its last occurrence (`--num_processes`), or `--name` when absent;
  ///        for messages about its value.
  [[nodiscard]] std::string spelling(std::string_view name) const {
    auto it = spelled_.find(std::string(name));
    return it == spelled_.end() ? "--" + std::string(name) : it->second;
  }
  /// @brief The words after the options: Operands::list's words, or Operands::program's program
  ///        and its arguments, in order.
  [[nodiscard]] const std::vector<std::string>& positional() const noexcept { return positional_; }

 private:
  friend ParsedArgs parse_args(std::span<const std::string_view>, const CommandSyntax&);
  bool help_ = false;
  std::map<std::string, std::vector<std::string>> values_;
  std::map<std::string, std::string> spelled_;
  std::vector<std::string> positional_;
};

/// @brief Parses a subcommand's arguments.
/// @param args the subcommand's words (args[0] is its name: it names the command in messages)
/// @param syntax its options, what may follow them, and its style
/// @return the parsed options
/// @throws accel::usage_error for an unknown or refused option, a missing value, a value given to a
///         flag, an integer or seconds value out of range, an option given twice that is not
///         repeatable (Style::accel), or a word where none is expected
inline ParsedArgs parse_args(std::span<const std::string_view> args, const CommandSyntax& syntax) {
  ParsedArgs out;
  const std::string command = args.empty() ? std::string("accel") : std::string(args[0]);
  const bool launcher = syntax.style == Style::launcher;
  // Each parse error in both wordings, side by side.
  auto fail = [&](const std::string& accel_words, const std::string& launcher_words) {
    throw accel::usage_error(launcher ? launcher_words : command + ": " + accel_words);
  };
  const std::string see_accel = "; see `accel " + command + " --help`";
  const std::string see_launcher = "; see accel " + command + " --help";
  std::size_t i = args.empty() ? 0 : 1;
  for (; i < args.size(); ++i) {
    const std::string word(args[i]);
    if (word == "--") {
      ++i;
      break;
    }
    if (!word.starts_with("-") || word == "-") {
      if (syntax.operands == Operands::program) break;
      if (syntax.operands == Operands::none)
        fail("unexpected argument '" + word + "'" + see_accel, "unexpected argument '" + word + "'" + see_launcher);
      out.positional_.push_back(word);
      continue;
    }
    if (word == "--help" || word == "-h") {
      out.help_ = true;
      continue;
    }
    if (!word.starts_with("--"))
      fail("unknown option '" + word + "' (options are spelled --name)" + see_accel,
           "unknown option '" + word + "'" + see_launcher);
    const auto eq = word.find('=');
    const std::string spelled = word.substr(0, eq);
    std::string name = spelled.substr(2);
    std::replace(name.begin(), name.end(), '_', '-');
    const auto spec = std::find_if(syntax.options.begin(), syntax.options.end(),
                                   [&](const OptionSpec& s) { return s.name == name; });
    if (spec == syntax.options.end())
      fail("unknown option '" + spelled + "'" + see_accel, "unknown option '" + spelled + "'" + see_launcher);
    if (!spec->refused.empty()) {
      const std::string why = "unknown option '" + spelled + "': " + std::string(spec->refused);
      fail(why, why);
    }
    auto& slot = out.values_[name];
    if (!launcher && !spec->repeated && !slot.empty())
      throw accel::usage_error(command + ": option '--" + name + "' given more than once; give it once");
    out.spelled_[name] = spelled;
    if (spec->kind == OptionKind::flag) {
      if (eq != std::string::npos)
        fail("option '--" + name + "' is a flag and takes no value (got '" + word.substr(eq + 1) + "')",
             spelled + " takes no value (got '" + word + "')");
      slot.emplace_back();
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = word.substr(eq + 1);
    } else {
      if (i + 1 >= args.size() || args[i + 1] == "--") {
        const std::string metavar(spec->metavar.empty() ? std::string_view("VALUE") : spec->metavar);
        fail("option '--" + name + "' needs a value (" + metavar + ")", spelled + " needs a value" + see_launcher);
      }
      value = std::string(args[++i]);
    }
    if (spec->kind == OptionKind::integer) parse_int_option(spelled, value, spec->min, spec->max);
    if (spec->kind == OptionKind::seconds) parse_seconds_option(spelled, value, false);
    if (spec->kind == OptionKind::seconds_or_zero) parse_seconds_option(spelled, value, true);
    slot.push_back(std::move(value));
  }
  for (; i < args.size(); ++i) {
    if (syntax.operands == Operands::none)
      fail("unexpected argument '" + std::string(args[i]) + "'" + see_accel,
           "unexpected argument '" + std::string(args[i]) + "'" + see_launcher);
    out.positional_.emplace_back(args[i]);
  }
  return out;
}

/// @brief parse_args over `argv`-style words.
inline ParsedArgs parse_args(std::span<char* const> args, const CommandSyntax& syntax) {
  const std::vector<std::string_view> words(args.begin(), args.end());
  return parse_args(std::span<const std::string_view>(words), syntax);
}

/// @brief Formats `usage` followed by one line per option (refused ones left out), for `--help`.
inline std::string format_help(std::string_view usage, std::span<const OptionSpec> specs) {
  std::string out(usage);
  out += "\n\noptions:\n";
  std::vector<const OptionSpec*> shown;
  for (const auto& s : specs)
    if (s.refused.empty()) shown.push_back(&s);
  std::vector<std::string> lefts;
  std::size_t width = 0;
  for (const OptionSpec* s : shown) {
    std::string left = "  --" + std::string(s->name);
    if (s->kind != OptionKind::flag) left += " " + std::string(s->metavar.empty() ? std::string_view("VALUE") : s->metavar);
    width = std::max(width, left.size());
    lefts.push_back(std::move(left));
  }
  lefts.emplace_back("  --help");
  width = std::max(width, lefts.back().size());
  for (std::size_t i = 0; i <= shown.size(); ++i) {
    std::string line = lefts[i];
    line.resize(width + 2, ' ');
    line += i < shown.size() ? std::string(shown[i]->help) : std::string("print this help and exit");
    if (i < shown.size() && shown[i]->repeated) line += " (repeatable)";
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace accel_cli
