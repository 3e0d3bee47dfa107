// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file config_expression.hpp
/// @brief The architecture catalog's expressions over config.json (`head_dim ?? hidden_size // n`).
///
/// Grammar (the same as tests/compat/catalog_expr.py, which the generator checks them with):
///   expr := alt ('??' alt)* ; alt := term (('+'|'-') term)* ; term := unary (('*'|'//') unary)*
///   unary := '-' unary | '(' expr ')' | number | dotted name
/// A name is looked up through the attribute map (top-level part only), then in config.json, then
/// in the catalog's defaults; absent, null or non-numeric means "missing". Arithmetic on a missing
/// value (or a division by zero) is missing; `a ?? b` is b when a is missing.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

struct ConfigScope {
  const nlohmann::json* config = nullptr;    // config.json (an object)
  const nlohmann::json* defaults = nullptr;  // {"key": default} (flat keys, may be dotted)
  const std::map<std::string, std::string, std::less<>>* attribute_map = nullptr;
};

inline std::optional<double> json_number(const nlohmann::json* v) {
  if (v == nullptr || !v->is_number()) return std::nullopt;  // booleans are not numbers in nlohmann
  return v->get<double>();
}

// The value of a dotted name, or nullopt when missing.
inline std::optional<double> config_lookup(std::string_view name, const ConfigScope& scope) {
  const auto dot = name.find('.');
  std::string key(name.substr(0, dot));
  if (scope.attribute_map) {
    if (auto it = scope.attribute_map->find(key); it != scope.attribute_map->end()) key = it->second;
  }
  if (dot != std::string_view::npos) key += std::string(name.substr(dot));
  if (scope.config && scope.config->is_object()) {
    const nlohmann::json* v = scope.config;
    std::size_t start = 0;
    while (v && start <= key.size()) {
      const auto end = key.find('.', start);
      const auto part = key.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!v->is_object()) {
        v = nullptr;
        break;
      }
      auto it = v->find(part);
      v = it == v->end() ? nullptr : &*it;
      if (end == std::string::npos) break;
      start = end + 1;
    }
    if (v && !v->is_null()) return json_number(v);
  }
  if (scope.defaults && scope.defaults->is_object()) {
    if (auto it = scope.defaults->find(key); it != scope.defaults->end()) return json_number(&*it);
  }
  return std::nullopt;
}

class ConfigExpression {
 public:
  ConfigExpression(std::string_view text, const ConfigScope& scope) : text_(text), scope_(scope) {}

  // Throws usage_error for a malformed expression (a catalog defect, never a user's).
  std::optional<double> evaluate() {
    auto v = expr();
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw_error<usage_error>("catalog expression '", text_, "': ", what, " at offset ", pos_);
  }
  void skip_space() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  bool accept(std::string_view op) {
    skip_space();
    if (text_.substr(pos_, op.size()) != op) return false;
    pos_ += op.size();
    return true;
  }
  std::optional<double> expr() {
    auto v = alt();
    while (accept("??")) {
      auto r = alt();
      if (!v) v = r;
    }
    return v;
  }
  std::optional<double> alt() {
    auto v = term();
    for (;;) {
      const bool plus = accept("+");
      if (!plus && !accept("-")) return v;
      auto r = term();
      v = v && r ? std::optional<double>(plus ? *v + *r : *v - *r) : std::nullopt;
    }
  }
  std::optional<double> term() {
    auto v = unary();
    for (;;) {
      const bool floor_div = accept("//");
      if (!floor_div && !accept("*")) return v;
      auto r = unary();
      if (!v || !r || (floor_div && *r == 0)) {  // x // 0: the config is unusable, not the expression
        v = std::nullopt;
      } else if (floor_div) {
        v = std::floor(*v / *r);
      } else {
        v = *v * *r;
      }
    }
  }
  std::optional<double> unary() {
    if (accept("-")) {
      auto v = unary();
      return v ? std::optional<double>(-*v) : std::nullopt;
    }
    if (accept("(")) {
      auto v = expr();
      if (!accept(")")) fail("missing ')'");
      return v;
    }
    skip_space();
    const std::size_t start = pos_;
    auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
    auto is_name = [&](char c) { return c == '_' || c == '.' || is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
    if (pos_ < text_.size() && is_digit(text_[pos_])) {
      while (pos_ < text_.size() && (is_digit(text_[pos_]) || text_[pos_] == '.')) ++pos_;
      double value = 0;
      const auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, value);
      if (ec != std::errc() || end != text_.data() + pos_) fail("bad number");
      return value;
    }
    while (pos_ < text_.size() && is_name(text_[pos_])) ++pos_;
    if (pos_ == start) fail("expected a number, a name or '('");
    return config_lookup(text_.substr(start, pos_ - start), scope_);
  }

  std::string_view text_;
  ConfigScope scope_;
  std::size_t pos_ = 0;
};

}  // namespace detail
ACCEL_NAMESPACE_END
