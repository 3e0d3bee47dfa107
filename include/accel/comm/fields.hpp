// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file fields.hpp
/// @brief ACCEL_DEFINE_FIELDS: declares a struct's fields, so the collectives encode it field by
/// field in a compact binary form instead of through a JSON document.
///
/// In:  a struct and the members to send, in any order (the order is the wire order).
/// Out: gather_object / broadcast_object of that struct, of vectors, maps, optionals, pairs, tuples
///      and arrays of it, take the binary path: no JSON document is built on either side.
///
/// @code
///   struct Result { int id; double score; std::string text; std::vector<int> tokens; };
///   ACCEL_DEFINE_FIELDS(Result, id, score, text, tokens)   // at namespace scope, next to Result
///   auto all = accel::gather_object(state, my_results);     // std::vector<std::vector<Result>>
/// @endcode
///
/// What the binary form holds: arithmetic and enum values as their bytes, strings and vectors as a
/// u64 count then the items, optionals as a u8 flag then the value, maps as a count then key/value
/// pairs, trivially copyable structs as their bytes, and declared structs field by field. Each
/// payload carries a fingerprint of the type's shape, so ranks that pass different types get a
/// serialization_error naming both, not garbage. Like the raw path, it assumes every rank has the
/// same byte order and type sizes (one program on one kind of machine); specialise
/// accel::force_json_serialization<T> for CBOR instead.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Specialise to std::true_type to send a trivially copyable type through CBOR anyway
/// (e.g. when processes may differ in endianness or struct layout).
template <class T>
struct force_json_serialization : std::false_type {};

/// @brief Trivially copyable data sent as its bytes (pointers excluded: they mean nothing elsewhere).
template <class T>
concept raw_serializable = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T> && !std::is_member_pointer_v<T> &&
                           !force_json_serialization<T>::value;

/// @brief The tag ACCEL_DEFINE_FIELDS's function is found by (argument-dependent lookup on T).
template <class T>
struct fields_tag {};

/// @brief The declared fields of T: a tuple of member pointers and their names.
template <class... M>
struct field_list {
  std::tuple<M...> members;
  std::array<std::string_view, sizeof...(M)> names;
};

template <class... M>
constexpr field_list<M...> make_field_list(std::string_view names, M... members) {
  field_list<M...> out{{members...}, {}};
  std::size_t at = 0;
  for (auto& name : out.names) {  // split "a, b, c" as the macro stringified it
    while (at < names.size() && (names[at] == ' ' || names[at] == ',')) ++at;
    const std::size_t end = std::min(names.find(',', at), names.size());
    std::size_t last = end;
    while (last > at && names[last - 1] == ' ') --last;
    name = names.substr(at, last - at);
    at = end;
  }
  return out;
}

/// @brief Types whose fields ACCEL_DEFINE_FIELDS declared.
template <class T>
concept has_declared_fields = requires { accel_fields(fields_tag<T>{}); };

// The member-pointer list of ACCEL_DEFINE_FIELDS (up to 32 fields).
#define ACCEL_DETAIL_EXPAND(x) x
#define ACCEL_DETAIL_F1(T, a) &T::a
#define ACCEL_DETAIL_F2(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F1(T, __VA_ARGS__))
#define ACCEL_DETAIL_F3(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F2(T, __VA_ARGS__))
#define ACCEL_DETAIL_F4(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F3(T, __VA_ARGS__))
#define ACCEL_DETAIL_F5(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F4(T, __VA_ARGS__))
#define ACCEL_DETAIL_F6(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F5(T, __VA_ARGS__))
#define ACCEL_DETAIL_F7(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F6(T, __VA_ARGS__))
#define ACCEL_DETAIL_F8(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F7(T, __VA_ARGS__))
#define ACCEL_DETAIL_F9(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F8(T, __VA_ARGS__))
#define ACCEL_DETAIL_F10(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F9(T, __VA_ARGS__))
#define ACCEL_DETAIL_F11(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F10(T, __VA_ARGS__))
#define ACCEL_DETAIL_F12(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F11(T, __VA_ARGS__))
#define ACCEL_DETAIL_F13(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F12(T, __VA_ARGS__))
#define ACCEL_DETAIL_F14(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F13(T, __VA_ARGS__))
#define ACCEL_DETAIL_F15(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F14(T, __VA_ARGS__))
#define ACCEL_DETAIL_F16(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F15(T, __VA_ARGS__))
#define ACCEL_DETAIL_F17(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F16(T, __VA_ARGS__))
#define ACCEL_DETAIL_F18(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F17(T, __VA_ARGS__))
#define ACCEL_DETAIL_F19(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F18(T, __VA_ARGS__))
#define ACCEL_DETAIL_F20(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F19(T, __VA_ARGS__))
#define ACCEL_DETAIL_F21(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F20(T, __VA_ARGS__))
#define ACCEL_DETAIL_F22(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F21(T, __VA_ARGS__))
#define ACCEL_DETAIL_F23(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F22(T, __VA_ARGS__))
#define ACCEL_DETAIL_F24(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F23(T, __VA_ARGS__))
#define ACCEL_DETAIL_F25(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F24(T, __VA_ARGS__))
#define ACCEL_DETAIL_F26(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F25(T, __VA_ARGS__))
#define ACCEL_DETAIL_F27(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F26(T, __VA_ARGS__))
#define ACCEL_DETAIL_F28(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F27(T, __VA_ARGS__))
#define ACCEL_DETAIL_F29(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F28(T, __VA_ARGS__))
#define ACCEL_DETAIL_F30(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F29(T, __VA_ARGS__))
#define ACCEL_DETAIL_F31(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F30(T, __VA_ARGS__))
#define ACCEL_DETAIL_F32(T, a, ...) &T::a, ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_F31(T, __VA_ARGS__))
#define ACCEL_DETAIL_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22,   \
                          _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, NAME, ...)                                          \
  NAME
#define ACCEL_DETAIL_MEMBERS(T, ...)                                                                                           \
  ACCEL_DETAIL_EXPAND(ACCEL_DETAIL_PICK(__VA_ARGS__, ACCEL_DETAIL_F32, ACCEL_DETAIL_F31, ACCEL_DETAIL_F30, ACCEL_DETAIL_F29,    \
                                        ACCEL_DETAIL_F28, ACCEL_DETAIL_F27, ACCEL_DETAIL_F26, ACCEL_DETAIL_F25, ACCEL_DETAIL_F24, \
                                        ACCEL_DETAIL_F23, ACCEL_DETAIL_F22, ACCEL_DETAIL_F21, ACCEL_DETAIL_F20, ACCEL_DETAIL_F19, \
                                        ACCEL_DETAIL_F18, ACCEL_DETAIL_F17, ACCEL_DETAIL_F16, ACCEL_DETAIL_F15, ACCEL_DETAIL_F14, \
                                        ACCEL_DETAIL_F13, ACCEL_DETAIL_F12, ACCEL_DETAIL_F11, ACCEL_DETAIL_F10, ACCEL_DETAIL_F9,  \
                                        ACCEL_DETAIL_F8, ACCEL_DETAIL_F7, ACCEL_DETAIL_F6, ACCEL_DETAIL_F5, ACCEL_DETAIL_F4,      \
                                        ACCEL_DETAIL_F3, ACCEL_DETAIL_F2, ACCEL_DETAIL_F1)(T, __VA_ARGS__))

/// @brief Declares the members of `Type` that the collectives send (1 to 32, public, in wire order).
/// Place it at namespace scope in Type's namespace (like NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE, which
/// it does not replace: a type may have both).
#define ACCEL_DEFINE_FIELDS(Type, ...)                                                                                          \
  [[maybe_unused]] inline constexpr auto accel_fields(::accel::fields_tag<Type>) {                                               \
    return ::accel::make_field_list(#__VA_ARGS__, ACCEL_DETAIL_MEMBERS(Type, __VA_ARGS__));                                       \
  }

namespace detail {

inline std::string from_rank(int rank) { return rank >= 0 ? concat(" from rank ", rank) : std::string(); }

/// @brief Reads an encoded value front to back; every length is checked against what is left, and
/// every failure is a serialization_error naming the sending rank and the type being decoded.
class ByteSource {
 public:
  ByteSource(std::span<const std::byte> b, int rank, const std::string& type) : b_(b), rank_(rank), type_(type) {}
  /// @throws serialization_error: "value from rank R is not a valid T: <what>"
  template <class... A>
  [[noreturn]] void fail(A&&... what) const {
    throw_error<serialization_error>("value", from_rank(rank_), " is not a valid ", type_, ": ", std::forward<A>(what)...);
  }
  std::span<const std::byte> take(std::size_t n) {
    if (n > b_.size() - pos_)
      throw_error<serialization_error>("value", from_rank(rank_), " is truncated: ", type_, " needs ", n, " more bytes at offset ",
                                       pos_, " of ", b_.size());
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    std::memcpy(&v, take(sizeof v).data(), sizeof v);
    return v;
  }
  [[nodiscard]] std::size_t remaining() const noexcept { return b_.size() - pos_; }
  // A count of items of at least `item_bytes` each cannot exceed what is left (guards huge
  // allocations); items that may encode to nothing are capped at 2^20.
  std::size_t count(std::size_t item_bytes) {
    const std::uint64_t n = u64();
    if (item_bytes == 0 ? n > (std::uint64_t{1} << 20) : n > (b_.size() - pos_) / item_bytes)
      throw_error<serialization_error>("value", from_rank(rank_), " announces ", n, " items of ", type_, " but only ",
                                       b_.size() - pos_, " bytes follow");
    return static_cast<std::size_t>(n);
  }
  void end() const {
    if (pos_ != b_.size())
      throw_error<serialization_error>("value", from_rank(rank_), " has ", b_.size() - pos_, " unexpected trailing bytes after a ", type_);
  }

 private:
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
  int rank_;
  const std::string& type_;
};

}  // namespace detail

namespace detail::binary {

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_array : std::false_type {};
template <class T, std::size_t N>
struct is_array<std::array<T, N>> : std::true_type {};
template <class T>
struct is_tuple_like : std::false_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class... A>
struct is_tuple_like<std::tuple<A...>> : std::true_type {};
template <class T>
struct is_map : std::false_type {};
template <class K, class V, class C, class A>
struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class K, class V, class H, class E, class A>
struct is_map<std::unordered_map<K, V, H, E, A>> : std::true_type {};

template <class T>
constexpr bool codable();

template <class Tuple, std::size_t... I>
constexpr bool all_codable(std::index_sequence<I...>) {
  return (codable<std::remove_cvref_t<std::tuple_element_t<I, Tuple>>>() && ...);
}
template <class T, class L>
struct fields_codable;
template <class T, class... M>
struct fields_codable<T, field_list<M...>> {
  static constexpr bool value = (codable<std::remove_cvref_t<decltype(std::declval<T&>().*std::declval<M>())>>() && ...);
};

/// @brief Whether T has a binary form (see the file comment).
template <class T>
constexpr bool codable() {
  if constexpr (force_json_serialization<T>::value) return false;
  else if constexpr (std::is_same_v<T, bool> || std::is_arithmetic_v<T> || std::is_enum_v<T>) return true;
  else if constexpr (std::is_same_v<T, std::string>) return true;
  else if constexpr (is_vector<T>::value) return !std::is_same_v<typename T::value_type, bool> && codable<typename T::value_type>();
  else if constexpr (is_optional<T>::value || is_array<T>::value) return codable<typename T::value_type>();
  else if constexpr (is_map<T>::value) return codable<typename T::key_type>() && codable<typename T::mapped_type>();
  else if constexpr (is_tuple_like<T>::value) return all_codable<T>(std::make_index_sequence<std::tuple_size_v<T>>{});
  else if constexpr (has_declared_fields<T>) {
    constexpr bool ok = fields_codable<T, decltype(accel_fields(fields_tag<T>{}))>::value;
    static_assert(ok, "ACCEL_DEFINE_FIELDS: a declared member of this type has no binary form (arithmetic, enum, std::string, "
                      "std::vector/array/optional/pair/tuple/map of those, trivially copyable or declared structs)");
    return ok;
  } else if constexpr (raw_serializable<T>) return true;
  else return false;
}

/// @brief Fewest bytes a T can encode to (bounds every announced count before allocating).
template <class T>
constexpr std::size_t min_size() {
  if constexpr (std::is_same_v<T, std::string> || is_vector<T>::value || is_map<T>::value) return 8;
  else if constexpr (is_optional<T>::value) return 1;
  else if constexpr (is_array<T>::value) return std::tuple_size_v<T> * min_size<typename T::value_type>();
  else if constexpr (is_tuple_like<T>::value)
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (std::size_t{0} + ... + min_size<std::remove_cvref_t<std::tuple_element_t<I, T>>>());
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  else if constexpr (has_declared_fields<T>)
    return std::apply([](auto... m) { return (std::size_t{0} + ... + min_size<std::remove_cvref_t<decltype(std::declval<T&>().*m)>>()); },
                      accel_fields(fields_tag<T>{}).members);
  else return sizeof(T);
}

// Items of a vector that go as one block of bytes.
template <class T>
constexpr bool block_copyable() {
  return (std::is_arithmetic_v<T> || std::is_enum_v<T> || (raw_serializable<T> && !has_declared_fields<T>)) &&
         !std::is_same_v<T, bool>;
}

/// @brief The type's shape as text: what both sides compare (as a hash) before decoding.
template <class T>
std::string shape() {
  if constexpr (std::is_same_v<T, bool>) return "b";
  else if constexpr (std::is_enum_v<T>) return "e" + std::to_string(sizeof(T));
  else if constexpr (std::is_floating_point_v<T>) return "f" + std::to_string(sizeof(T));
  else if constexpr (std::is_integral_v<T>) return (std::is_signed_v<T> ? "i" : "u") + std::to_string(sizeof(T));
  else if constexpr (std::is_same_v<T, std::string>) return "s";
  else if constexpr (is_vector<T>::value) return "v(" + shape<typename T::value_type>() + ")";
  else if constexpr (is_optional<T>::value) return "o(" + shape<typename T::value_type>() + ")";
  else if constexpr (is_array<T>::value) return "a" + std::to_string(std::tuple_size_v<T>) + "(" + shape<typename T::value_type>() + ")";
  else if constexpr (is_map<T>::value) return "m(" + shape<typename T::key_type>() + "," + shape<typename T::mapped_type>() + ")";
  else if constexpr (is_tuple_like<T>::value)
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      std::string s = "t(";
      ((s += (I ? "," : "") + shape<std::remove_cvref_t<std::tuple_element_t<I, T>>>()), ...);
      return s + ")";
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  else if constexpr (has_declared_fields<T>) {
    const auto f = accel_fields(fields_tag<T>{});
    std::string s = "{";
    std::size_t i = 0;
    std::apply([&](auto... m) { ((s += (i ? "," : "") + std::string(f.names[i]) + ":" + shape<std::remove_cvref_t<decltype(std::declval<T&>().*m)>>(), ++i), ...); },
               f.members);
    return s + "}";
  } else return "r" + std::to_string(sizeof(T));
}

/// @brief FNV-1a of shape<T>(), computed once per type.
template <class T>
std::uint64_t fingerprint() {
  static const std::uint64_t h = text::fnv1a(shape<T>());
  return h;
}

/// @brief Exact encoded size of a value (the writer sizes its buffer once).
template <class T>
std::size_t encoded_size(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) return 8 + v.size();
  else if constexpr (is_vector<T>::value) {
    using V = typename T::value_type;
    if constexpr (block_copyable<V>()) return 8 + v.size() * sizeof(V);
    else {
      std::size_t n = 8;
      for (const auto& x : v) n += encoded_size(x);
      return n;
    }
  } else if constexpr (is_optional<T>::value) return 1 + (v ? encoded_size(*v) : 0);
  else if constexpr (is_array<T>::value) {
    std::size_t n = 0;
    for (const auto& x : v) n += encoded_size(x);
    return n;
  } else if constexpr (is_map<T>::value) {
    std::size_t n = 8;
    for (const auto& [k, x] : v) n += encoded_size(k) + encoded_size(x);
    return n;
  } else if constexpr (is_tuple_like<T>::value) {
    return std::apply([](const auto&... x) { return (std::size_t{0} + ... + encoded_size(x)); }, v);
  } else if constexpr (has_declared_fields<T>) {
    return std::apply([&](auto... m) { return (std::size_t{0} + ... + encoded_size(v.*m)); }, accel_fields(fields_tag<T>{}).members);
  } else return sizeof(T);
}

/// @brief Writes into a buffer already sized by encoded_size().
class Writer {
 public:
  explicit Writer(std::byte* at) : at_(at) {}
  void raw(const void* p, std::size_t n) {
    if (n) std::memcpy(at_, p, n);
    at_ += n;
  }
  void count(std::size_t n) {
    const auto v = static_cast<std::uint64_t>(n);
    raw(&v, 8);
  }
  template <class T>
  void put(const T& v) {
    if constexpr (std::is_same_v<T, std::string>) {
      count(v.size());
      raw(v.data(), v.size());
    } else if constexpr (is_vector<T>::value) {
      count(v.size());
      if constexpr (block_copyable<typename T::value_type>()) raw(v.data(), v.size() * sizeof(typename T::value_type));
      else
        for (const auto& x : v) put(x);
    } else if constexpr (is_optional<T>::value) {
      const std::uint8_t flag = v ? 1 : 0;
      raw(&flag, 1);
      if (v) put(*v);
    } else if constexpr (is_array<T>::value) {
      for (const auto& x : v) put(x);
    } else if constexpr (is_map<T>::value) {
      count(v.size());
      for (const auto& [k, x] : v) put(k), put(x);
    } else if constexpr (is_tuple_like<T>::value) {
      std::apply([&](const auto&... x) { (put(x), ...); }, v);
    } else if constexpr (has_declared_fields<T>) {
      std::apply([&](auto... m) { (put(v.*m), ...); }, accel_fields(fields_tag<T>{}).members);
    } else if constexpr (std::is_same_v<T, bool>) {
      const std::uint8_t b = v ? 1 : 0;
      raw(&b, 1);
    } else {
      raw(&v, sizeof(T));
    }
  }

 private:
  std::byte* at_;
};

/// @brief Reads what Writer wrote into `v`, checking every length against what is left.
/// @throws serialization_error naming the rank and type
template <class T>
void get(ByteSource& src, T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    const std::size_t n = src.count(1);
    v.assign(reinterpret_cast<const char*>(src.take(n).data()), n);
  } else if constexpr (is_vector<T>::value) {
    using V = typename T::value_type;
    const std::size_t n = src.count(min_size<V>());
    if constexpr (block_copyable<V>()) {
      const std::byte* p = src.take(n * sizeof(V)).data();
      v.resize(n);
      if (n) std::memcpy(static_cast<void*>(v.data()), p, n * sizeof(V));
    } else {
      // Items already there are decoded into in place, keeping their strings' and vectors' memory.
      if (v.capacity() < n) v.reserve(n);
      if (v.size() > n) v.resize(n);
      for (std::size_t i = 0; i < v.size(); ++i) get(src, v[i]);
      while (v.size() < n) get(src, v.emplace_back());
    }
  } else if constexpr (is_optional<T>::value) {
    const auto flag = static_cast<std::uint8_t>(src.take(1)[0]);
    if (flag > 1) src.fail("optional flag ", int(flag), " is neither 0 nor 1");
    if (flag) get(src, v.emplace());
    else v.reset();
  } else if constexpr (is_array<T>::value) {
    for (auto& x : v) get(src, x);
  } else if constexpr (is_map<T>::value) {
    const std::size_t n = src.count(min_size<typename T::key_type>() + min_size<typename T::mapped_type>());
    v.clear();
    for (std::size_t i = 0; i < n; ++i) {
      typename T::key_type k{};
      get(src, k);
      typename T::mapped_type x{};
      get(src, x);
      v.insert_or_assign(std::move(k), std::move(x));
    }
  } else if constexpr (is_tuple_like<T>::value) {
    std::apply([&](auto&... x) { (get(src, x), ...); }, v);
  } else if constexpr (has_declared_fields<T>) {
    std::apply([&](auto... m) { (get(src, v.*m), ...); }, accel_fields(fields_tag<T>{}).members);
  } else if constexpr (std::is_same_v<T, bool>) {
    const auto b = static_cast<std::uint8_t>(src.take(1)[0]);
    if (b > 1) src.fail("bool byte ", int(b), " is neither 0 nor 1");
    v = b != 0;
  } else {
    std::memcpy(static_cast<void*>(&v), src.take(sizeof(T)).data(), sizeof(T));
  }
}

}  // namespace detail::binary

ACCEL_NAMESPACE_END
