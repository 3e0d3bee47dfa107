// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file error.hpp
/// @brief The exception hierarchy: one root (`accel::error`), one leaf per category.
///
/// Every message starts with a stable prefix `[accel.<category>]`, then says what is wrong, the
/// offending value, and how to fix it.
#pragma once

#include <charconv>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Root of everything accel throws; `catch (const accel::error&)` catches all of it.
class error : public std::runtime_error {
 public:
  /// @param category the `<category>` in the `[accel.<category>]` prefix
  /// @param what_arg the rest of the message
  error(std::string_view category, const std::string& what_arg)
      : std::runtime_error("[accel." + std::string(category) + "] " + what_arg), category_(category) {}
  /// @brief The category name, e.g. "config".
  [[nodiscard]] const std::string& category() const noexcept { return category_; }

 private:
  std::string category_;
};

#define ACCEL_DETAIL_DEFINE_ERROR(name, category_name)                                   \
  class name : public error {                                                            \
   public:                                                                               \
    explicit name(const std::string& what_arg) : error(category_name, what_arg) {}       \
                                                                                         \
   protected:                                                                            \
    name(std::string_view category, const std::string& what_arg) : error(category, what_arg) {} \
  };

/// Precondition violated by the caller (zero parts, rank out of range, root >= world size).
ACCEL_DETAIL_DEFINE_ERROR(usage_error, "usage")
/// Environment or arguments malformed or inconsistent (RANK=abc, LOCAL_RANK >= LOCAL_WORLD_SIZE).
ACCEL_DETAIL_DEFINE_ERROR(config_error, "config")
/// A feature is not compiled in, or a GPU was required and none is usable.
ACCEL_DETAIL_DEFINE_ERROR(unavailable_error, "unavailable")
/// Communication failed: a peer died, refused us, or broke the protocol.
ACCEL_DETAIL_DEFINE_ERROR(comm_error, "comm")
/// A value failed to encode or decode.
ACCEL_DETAIL_DEFINE_ERROR(serialization_error, "serialization")
/// A device map is infeasible under the given budgets.
ACCEL_DETAIL_DEFINE_ERROR(planning_error, "planning")
/// A checkpoint file is malformed, truncated or inconsistent.
ACCEL_DETAIL_DEFINE_ERROR(checkpoint_error, "checkpoint")
/// The launcher could not start a child or lost one.
ACCEL_DETAIL_DEFINE_ERROR(launch_error, "launch")
#undef ACCEL_DETAIL_DEFINE_ERROR

/// @brief A communication step did not finish within its timeout.
class timeout_error : public comm_error {
 public:
  explicit timeout_error(const std::string& what_arg) : comm_error("comm.timeout", what_arg) {}
};

/// @brief A CUDA runtime call failed; `code()` is the cudaError_t value (an int in every build).
class cuda_error : public error {
 public:
  cuda_error(int code, const std::string& what_arg) : error("cuda", what_arg), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

/// @brief An NCCL call or asynchronous NCCL error; `code()` is the ncclResult_t value.
class nccl_error : public error {
 public:
  nccl_error(int code, const std::string& what_arg) : error("nccl", what_arg), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

namespace detail {

/// @brief Text concat() appends as it is: strings, views, C strings and character arrays.
template <class T>
inline constexpr bool concat_text_v = std::is_convertible_v<const T&, std::string_view>;
/// @brief Characters concat() appends as one character each (as a stream prints them).
template <class T>
inline constexpr bool concat_char_v = std::is_same_v<T, char> || std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>;
/// @brief Integers concat() writes in decimal (as a stream prints them): not bool, not characters.
template <class T>
inline constexpr bool concat_integer_v = std::is_integral_v<T> && !std::is_same_v<T, bool> && !concat_char_v<T> &&
                                         !std::is_same_v<T, wchar_t> && !std::is_same_v<T, char8_t> && !std::is_same_v<T, char16_t> &&
                                         !std::is_same_v<T, char32_t>;

/// @brief Appends one argument of concat()'s fast path to `out`.
template <class T>
void concat_append(std::string& out, const T& v) {
  if constexpr (concat_char_v<T>) {
    out.push_back(static_cast<char>(v));
  } else if constexpr (concat_integer_v<T>) {
    char digits[24];  // a 64-bit integer's decimal digits and sign
    out.append(digits, std::to_chars(digits, digits + sizeof digits, v).ptr);
  } else if constexpr (std::is_pointer_v<T>) {
    if (v) out.append(v);  // a null C string adds nothing
  } else {
    out.append(std::string_view(v));
  }
}

/// @brief Streams every argument into one string (the library's tiny formatter). Strings,
/// characters and integers only (most labels and messages) are appended without a stream, which
/// costs a locale's set-up per call; anything else goes through std::ostringstream, as before.
template <class... Args>
[[nodiscard]] std::string concat(Args&&... args) {
  if constexpr (((concat_text_v<std::remove_cvref_t<Args>> || concat_char_v<std::remove_cvref_t<Args>> ||
                  concat_integer_v<std::remove_cvref_t<Args>>) && ...)) {
    std::string out;
    (concat_append(out, args), ...);
    return out;
  } else {
    std::ostringstream out;
    (out << ... << std::forward<Args>(args));
    return out.str();
  }
}

/// @brief `e`'s message without its "[accel.<category>] " prefix, to nest it in another message
///        (which has its own).
[[nodiscard]] inline std::string message_body(const error& e) {
  const std::string_view what = e.what();
  const std::string prefix = "[accel." + e.category() + "] ";
  return std::string(what.starts_with(prefix) ? what.substr(prefix.size()) : what);
}

/// @brief Every throw goes through here, so a no-exceptions mode can be added in one place.
template <class E, class... Args>
[[noreturn]] void throw_error(Args&&... args) {
  throw E(concat(std::forward<Args>(args)...));
}

}  // namespace detail

/// @brief Throws accel::usage_error naming the failed condition unless `cond` holds.
#define ACCEL_EXPECTS(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) ::accel::detail::throw_error<::accel::usage_error>(__VA_ARGS__, " (violated: " #cond ")"); \
  } while (false)

ACCEL_NAMESPACE_END
