// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file serialize.hpp
/// @brief Value ↔ bytes for the collectives: a raw fast path for plain data, CBOR (via nlohmann/json) for the rest.
///
/// In:  any T that is trivially copyable, a std::string, a std::vector of those; a struct declared
///      with ACCEL_DEFINE_FIELDS and standard containers of such (fields.hpp); or anything
///      nlohmann/json converts (ADL to_json/from_json, NLOHMANN_DEFINE_TYPE_*).
/// Out: a self-describing byte string (1 format byte, then the payload); decoding checks the format
///      and sizes and never runs code chosen by the sender (unlike pickle). The order of preference:
///      raw bytes, the binary field encoding, CBOR.
///
/// @code
///   struct Result { int id; std::string text; };
///   NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Result, id, text)
///   auto bytes = accel::to_bytes(std::vector<Result>{{1, "hi"}});
///   auto back  = accel::from_bytes<std::vector<Result>>(bytes);
/// @endcode
#pragma once

#include <cxxabi.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/fields.hpp>
#include <accel/comm/detail/cbor.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Types nlohmann/json can convert both ways.
template <class T>
concept json_serializable = requires(const T& v, const nlohmann::json& j) {
  nlohmann::json(v);
  j.get<T>();
};

namespace detail {

/// @brief The first byte of every payload.
enum class PayloadFormat : std::uint8_t { raw = 1, string = 2, raw_vector = 3, string_vector = 4, cbor = 5, binary = 6 };

/// @brief Raw payloads: format byte, element kind (byte 1), item size (u64 at 8), item count (u64
/// at 16), type fingerprint (u64 at 24), data at 32.
inline constexpr std::size_t raw_header_bytes = 32;

/// @brief What kind of plain data a raw payload holds, so a mismatch can say what the sender had.
enum class ElementKind : std::uint8_t { other = 0, signed_integer, unsigned_integer, floating_point, boolean, character, enumeration };

template <class T>
constexpr ElementKind element_kind() {
  if constexpr (std::is_same_v<T, bool>) return ElementKind::boolean;
  else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, char8_t> || std::is_same_v<T, char16_t> ||
                     std::is_same_v<T, char32_t> || std::is_same_v<T, wchar_t>)
    return ElementKind::character;
  else if constexpr (std::is_floating_point_v<T>) return ElementKind::floating_point;
  else if constexpr (std::is_integral_v<T>) return std::is_signed_v<T> ? ElementKind::signed_integer : ElementKind::unsigned_integer;
  else if constexpr (std::is_enum_v<T>) return ElementKind::enumeration;
  else return ElementKind::other;
}

inline const char* element_kind_name(std::uint8_t kind) {
  switch (static_cast<ElementKind>(kind)) {
    case ElementKind::signed_integer: return "signed-integer";
    case ElementKind::unsigned_integer: return "unsigned-integer";
    case ElementKind::floating_point: return "floating-point";
    case ElementKind::boolean: return "bool";
    case ElementKind::character: return "character";
    case ElementKind::enumeration: return "enum";
    case ElementKind::other: return "plain-data";
  }
  return "unknown-kind";
}

/// @brief Identifies a plain-data type across ranks, computed once per type: kind and size for
/// arithmetic types (so `long` and `long long` agree), the field shape for structs declared with
/// ACCEL_DEFINE_FIELDS, else FNV-1a of the mangled type name (the same on every rank built with an
/// Itanium-ABI compiler).
template <class T>
std::uint64_t raw_type_fingerprint() {
  static const std::uint64_t h = [] {
    if constexpr (std::is_arithmetic_v<T>)
      return (std::uint64_t{static_cast<std::uint8_t>(element_kind<T>())} << 32) | sizeof(T);
    else if constexpr (has_declared_fields<T>)
      return binary::fingerprint<T>();
    else
      return text::fnv1a(typeid(T).name());
  }();
  return h;
}


template <class T>
std::string type_name() {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> p(abi::__cxa_demangle(typeid(T).name(), nullptr, nullptr, &status), std::free);
  return status == 0 && p ? std::string(p.get()) : std::string(typeid(T).name());
}

// Appends to a caller's buffer (reused between collectives, so large payloads do not fault in
// fresh pages every time).
class ByteSink {
 public:
  // Appends after what `out` holds already (a collective's own prefix), at `start_`.
  ByteSink(std::vector<std::byte>& out, PayloadFormat f, std::size_t reserve = 0) : out_(out), start_(out.size()) {
    out_.reserve(start_ + reserve + raw_header_bytes);
    out_.push_back(static_cast<std::byte>(f));
  }
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void u64(std::uint64_t v) { raw(&v, sizeof v); }

 private:
  std::vector<std::byte>& out_;
  std::size_t start_;
};

// Writes the raw header for `count` items of V (after the format byte).
template <class V>
void put_raw_header(ByteSink& s, std::uint64_t count) {
  const unsigned char kind_and_padding[7] = {static_cast<unsigned char>(element_kind<V>())};
  s.raw(kind_and_padding, sizeof kind_and_padding);
  s.u64(sizeof(V));
  s.u64(count);
  s.u64(raw_type_fingerprint<V>());  // ends the header at raw_header_bytes: data stays 32-byte aligned
}

// Reads a raw header and checks it against V (size, kind, fingerprint); returns the item count.
// The error names the sender's item size and kind and the receiver's type.
template <class V>
std::uint64_t check_raw_header(ByteSource& src, int source_rank, const std::string& type) {
  const auto kind = static_cast<std::uint8_t>(src.take(7)[0]);
  const auto size = src.u64();
  const auto count = src.u64();
  const auto fingerprint = src.u64();
  if (size != sizeof(V) || kind != static_cast<std::uint8_t>(element_kind<V>()))
    throw_error<serialization_error>("value", from_rank(source_rank), " holds ", size, "-byte ", element_kind_name(kind),
                                     " items but ", type, " has ", sizeof(V), "-byte ",
                                     element_kind_name(static_cast<std::uint8_t>(element_kind<V>())),
                                     " items (do all ranks pass the same type?)");
  if (fingerprint != raw_type_fingerprint<V>())
    throw_error<serialization_error>("value", from_rank(source_rank), " holds ", size, "-byte ", element_kind_name(kind),
                                     " items of another type than the items of ", type,
                                     " (type fingerprints differ; do all ranks pass the same type?)");
  return count;
}


/// @brief Bytes from which a fresh result buffer is backed by transparent huge pages where the
/// system allows it (THP "madvise" mode): filling 16 MiB of new memory then takes 8 page faults
/// instead of 4096, which is most of the cost of returning large values. ACCEL_HUGEPAGES=0 turns
/// the hint off.
inline constexpr std::size_t huge_page_hint_bytes = std::size_t{4} << 20;

/// @brief Hints that the 2 MiB-aligned interior of fresh, untouched memory [p, p+n) be backed by
/// huge pages (a no-op below huge_page_hint_bytes, where THP is off, or on error).
inline void advise_huge_pages(void* p, std::size_t n) noexcept {
#ifdef MADV_HUGEPAGE
  static const bool enabled = [] {
    const char* v = std::getenv("ACCEL_HUGEPAGES");
    return !(v && (std::string_view(v) == "0" || std::string_view(v) == "off" || std::string_view(v) == "false"));
  }();
  if (!enabled || n < huge_page_hint_bytes || !p) return;
  constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
  const auto first = (reinterpret_cast<std::uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const auto last = (reinterpret_cast<std::uintptr_t>(p) + n) & ~(huge - 1);
  if (last > first) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)p, (void)n;
#endif
}

template <class T>
constexpr PayloadFormat format_of() {
  if constexpr (raw_serializable<T>) return PayloadFormat::raw;
  else if constexpr (std::is_same_v<T, std::string>) return PayloadFormat::string;
  else if constexpr (binary::is_vector<T>::value) {
    using V = typename T::value_type;
    if constexpr (std::is_same_v<V, bool>) return PayloadFormat::cbor;  // bit-packed: no contiguous items
    else if constexpr (raw_serializable<V>) return PayloadFormat::raw_vector;
    else if constexpr (std::is_same_v<V, std::string>) return PayloadFormat::string_vector;
    else if constexpr (binary::codable<T>()) return PayloadFormat::binary;
    else return PayloadFormat::cbor;
  } else if constexpr (binary::codable<T>()) {
    return PayloadFormat::binary;
  } else {
    return PayloadFormat::cbor;
  }
}

}  // namespace detail

/// @brief Encodes a value in two pieces, for sending without a first copy: appends the encoding's
/// head to `head` and returns the body, a view of the value's own memory (empty when everything is
/// in `head`). Plain data, strings and vectors of plain data keep their bytes in the value; the
/// encoding is `head` (as appended) followed by the body.
/// @param rank the producing rank, only for the error message (-1: unknown)
/// @throws serialization_error naming the type (and rank) when to_json throws
template <class T>
std::span<const std::byte> encode_payload(std::vector<std::byte>& head, const T& value, int rank = -1) {
  using detail::PayloadFormat;
  constexpr PayloadFormat f = detail::format_of<T>();
  static_assert(f != PayloadFormat::cbor || json_serializable<T>,
                "accel::to_bytes: T is neither trivially copyable, a string, a container of those, a struct declared "
                "with ACCEL_DEFINE_FIELDS(T, members...), nor convertible with nlohmann/json (to_json/from_json or "
                "NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(T, members...))");
  if constexpr (f == PayloadFormat::raw) {
    detail::ByteSink s(head, f);
    detail::put_raw_header<T>(s, 1);
    return std::as_bytes(std::span<const T>(&value, 1));
  } else if constexpr (f == PayloadFormat::string) {
    detail::ByteSink s(head, f);
    return std::as_bytes(std::span<const char>(value.data(), value.size()));
  } else if constexpr (f == PayloadFormat::raw_vector) {
    using V = typename T::value_type;
    detail::ByteSink s(head, f);
    detail::put_raw_header<V>(s, value.size());
    return std::as_bytes(std::span<const V>(value.data(), value.size()));
  } else if constexpr (f == PayloadFormat::string_vector) {
    std::size_t total = 0;
    for (const auto& str : value) total += str.size() + 8;
    detail::ByteSink s(head, f, total + 8);
    s.u64(value.size());
    for (const auto& str : value) s.u64(str.size());
    for (const auto& str : value) s.raw(str.data(), str.size());
    return {};
  } else if constexpr (f == PayloadFormat::binary) {
    // Format byte, 7 zero bytes, the type's fingerprint (u64), then the fields.
    const std::size_t at = head.size();
    head.resize(at + 16 + detail::binary::encoded_size(value));
    head[at] = static_cast<std::byte>(f);
    const std::uint64_t fp = detail::binary::fingerprint<T>();
    std::memcpy(head.data() + at + 8, &fp, 8);
    detail::binary::Writer(head.data() + at + 16).put(value);
    return {};
  } else {
    try {
      const std::size_t at = head.size();
      head.push_back(static_cast<std::byte>(f));
      try {
        if constexpr (detail::binary::is_vector<T>::value) detail::put_cbor_items(head, value);  // no JSON value for the whole vector
        else detail::put_cbor(head, nlohmann::json(value));
      } catch (...) {
        head.resize(at);
        throw;
      }
      return {};
    } catch (const std::exception& e) {
      detail::throw_error<serialization_error>("cannot encode a ", detail::type_name<T>(), rank >= 0 ? detail::concat(" on rank ", rank) : "",
                                               ": ", e.what());
    }
  }
}

/// @brief Encodes a value into `out` (replacing its content, keeping its capacity): raw bytes for
/// plain data, strings and vectors of them; CBOR otherwise.
/// @param rank the producing rank, only for the error message (-1: unknown)
/// @throws serialization_error naming the type (and rank) when to_json throws
template <class T>
void to_bytes_into(std::vector<std::byte>& out, const T& value, int rank = -1) {
  out.clear();
  const auto body = encode_payload(out, value, rank);
  out.insert(out.end(), body.begin(), body.end());
}

/// @brief Encodes a value (see to_bytes_into).
/// @throws serialization_error naming the type (and rank) when to_json throws
template <class T>
std::vector<std::byte> to_bytes(const T& value, int rank = -1) {
  std::vector<std::byte> out;
  to_bytes_into(out, value, rank);
  return out;
}

namespace detail {

// Checks the format byte against T's; returns T's name (computed once per type) for messages.
template <class T>
const std::string& check_format(std::span<const std::byte> bytes, int source_rank) {
  static const std::string type = type_name<T>();
  constexpr PayloadFormat f = format_of<T>();
  if (bytes.empty()) throw_error<serialization_error>("empty value", from_rank(source_rank), " cannot be a ", type);
  const auto got = static_cast<PayloadFormat>(bytes[0]);
  if (got != f)
    throw_error<serialization_error>("value", from_rank(source_rank), " has format ", static_cast<int>(got), " but a ", type,
                                     " needs format ", static_cast<int>(f), " (do all ranks pass the same type to the collective?)");
  return type;
}

// Runs `decode`, naming the source rank and T in a serialization_error when it throws (nlohmann's
// parse and type errors, or a user's from_json).
template <class T, class F>
decltype(auto) naming_cbor_errors(int source_rank, F&& decode) {
  try {
    return decode();
  } catch (const std::exception& e) {
    throw_error<serialization_error>("value", from_rank(source_rank), " is not a valid ", type_name<T>(), ": ", e.what());
  }
}

// A T from CBOR (the bytes after the format byte) into `out`: a vector one item at a time,
// anything else through one JSON value (both read by detail/cbor.hpp).
template <class T>
void decode_cbor_into(std::span<const std::byte> rest, T& out, int source_rank) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(rest.data());
  naming_cbor_errors<T>(source_rank, [&] {
    if constexpr (binary::is_vector<T>::value) {
      using V = typename T::value_type;
      std::size_t n = 0;
      read_cbor_items(p, p + rest.size(), [&](const nlohmann::json& item) {
        if (n < out.size()) out[n] = item.template get<V>();
        else out.push_back(item.template get<V>());
        ++n;
      });
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(n), out.end());
    } else {
      out = read_cbor(p, p + rest.size()).template get<T>();
    }
  });
}

// A T from CBOR; T need not be default-constructible unless it is a vector.
template <class T>
T decode_cbor(std::span<const std::byte> rest, int source_rank) {
  if constexpr (binary::is_vector<T>::value) {
    T out;
    decode_cbor_into(rest, out, source_rank);
    return out;
  } else {
    const auto* p = reinterpret_cast<const std::uint8_t*>(rest.data());
    return naming_cbor_errors<T>(source_rank, [&] { return read_cbor(p, p + rest.size()).template get<T>(); });
  }
}

// The binary format's header: padding, then the fingerprint of T's shape.
template <class T>
void check_binary_header(ByteSource& src, int source_rank, const std::string& type) {
  src.take(7);
  if (src.u64() != binary::fingerprint<T>())
    throw_error<serialization_error>("value", from_rank(source_rank), " was encoded from a type of another shape than ", type,
                                     " (do all ranks pass the same type, built from the same sources?)");
}

// A raw vector's header, and its item count checked against the bytes that follow.
template <class V>
std::size_t raw_vector_count(ByteSource& src, int source_rank, const std::string& type) {
  const std::uint64_t n = check_raw_header<V>(src, source_rank, type);
  if (n != src.remaining() / sizeof(V) || src.remaining() % sizeof(V) != 0)
    throw_error<serialization_error>("value", from_rank(source_rank), " announces ", n, " items of ", type, " but ",
                                     src.remaining(), " bytes follow");
  return static_cast<std::size_t>(n);
}

// The strings of a string-vector payload (lengths first, then the bytes) assigned to dst[0..n).
inline void get_strings(ByteSource& src, std::span<const std::byte> lens, std::string* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t l = 0;
    std::memcpy(&l, lens.data() + i * 8, 8);
    auto b = src.take(static_cast<std::size_t>(l));
    dst[i].assign(reinterpret_cast<const char*>(b.data()), b.size());
  }
}

}  // namespace detail

/// @brief Decodes what to_bytes<T> produced into `out`, reusing the memory it holds: a vector's
/// capacity, and for vectors of strings or of declared structs each item's strings and vectors
/// (decoding the same shape of value again allocates nothing). Checks the format byte, sizes and
/// counts; never runs sender-chosen code. On an error `out` holds some valid but unspecified value.
/// @param source_rank the rank that produced the bytes, for the error message
/// @throws serialization_error naming the rank and type when the bytes are not a valid T
template <class T>
void from_bytes_into(std::span<const std::byte> bytes, T& out, int source_rank = -1) {
  using detail::PayloadFormat;
  constexpr PayloadFormat f = detail::format_of<T>();
  const std::string& type = detail::check_format<T>(bytes, source_rank);
  detail::ByteSource src(bytes.subspan(1), source_rank, type);
  if constexpr (f == PayloadFormat::raw) {
    if (detail::check_raw_header<T>(src, source_rank, type) != 1)
      detail::throw_error<serialization_error>("value", detail::from_rank(source_rank), " is not one ", type);
    std::memcpy(static_cast<void*>(&out), src.take(sizeof(T)).data(), sizeof(T));
    src.end();
  } else if constexpr (f == PayloadFormat::string) {
    const auto rest = bytes.subspan(1);
    if (out.capacity() < rest.size()) {
      out = std::string();
      out.reserve(rest.size());
      detail::advise_huge_pages(out.data(), rest.size());
    }
    out.assign(reinterpret_cast<const char*>(rest.data()), rest.size());
  } else if constexpr (f == PayloadFormat::raw_vector) {
    using V = typename T::value_type;
    const std::size_t n = detail::raw_vector_count<V>(src, source_rank, type);
    const auto data = src.take(n * sizeof(V));
    // Into a vector without the room: aligned data (shared memory is page-aligned) is copied
    // once, straight into fresh memory; otherwise the items are zero-constructed and then filled.
    if (out.capacity() < n) {
      out = T();
      if (reinterpret_cast<std::uintptr_t>(data.data()) % alignof(V) == 0) {
        const auto* first = reinterpret_cast<const V*>(data.data());
        out.reserve(n);
        detail::advise_huge_pages(out.data(), n * sizeof(V));
        out.insert(out.end(), first, first + n);
        return;
      }
    }
    out.resize(n);
    if (n) std::memcpy(static_cast<void*>(out.data()), data.data(), n * sizeof(V));
  } else if constexpr (f == PayloadFormat::string_vector) {
    const std::size_t n = src.count(8);
    const auto lens = src.take(n * 8);
    out.resize(n);
    detail::get_strings(src, lens, out.data(), n);
    src.end();
  } else if constexpr (f == PayloadFormat::binary) {
    detail::check_binary_header<T>(src, source_rank, type);
    detail::binary::get(src, out);
    src.end();
  } else {
    detail::decode_cbor_into(bytes.subspan(1), out, source_rank);
  }
}

/// @brief Decodes what to_bytes<T> produced (see from_bytes_into).
/// @param source_rank the rank that produced the bytes, for the error message
/// @throws serialization_error naming the rank and type when the bytes are not a valid T
template <class T>
T from_bytes(std::span<const std::byte> bytes, int source_rank = -1) {
  if constexpr (detail::format_of<T>() == detail::PayloadFormat::cbor) {  // T need not be default-constructible
    detail::check_format<T>(bytes, source_rank);
    return detail::decode_cbor<T>(bytes.subspan(1), source_rank);
  } else {
    T out{};
    from_bytes_into(bytes, out, source_rank);
    return out;
  }
}

namespace detail {

/// @brief What to_bytes<std::vector<V>> produced, opened to be decoded straight into storage the
/// caller sizes: count() first (checked against the bytes), then into(dst) with dst.size() ==
/// count(), items decoded in place (reusing their strings' and vectors' memory). CBOR payloads
/// are decoded on opening and moved out. Checks and messages are from_bytes_into's.
template <class Vec>
class VectorItems {
 public:
  using V = typename Vec::value_type;
  static constexpr PayloadFormat format = format_of<Vec>();

  VectorItems(std::span<const std::byte> bytes, int source_rank)
      : type_(check_format<Vec>(bytes, source_rank)), src_(bytes.subspan(1), source_rank, type_) {
    if constexpr (format == PayloadFormat::raw_vector) {
      count_ = raw_vector_count<V>(src_, source_rank, type_);
    } else if constexpr (format == PayloadFormat::string_vector) {
      count_ = src_.count(8);
      lens_ = src_.take(count_ * 8);
    } else if constexpr (format == PayloadFormat::binary) {
      check_binary_header<Vec>(src_, source_rank, type_);
      count_ = src_.count(binary::min_size<V>());
    } else {
      decode_cbor_into(bytes.subspan(1), cbor_, source_rank);
      count_ = cbor_.size();
    }
  }

  [[nodiscard]] std::size_t count() const noexcept { return count_; }

  void into(std::span<V> dst) {
    if constexpr (format == PayloadFormat::raw_vector) {
      if (count_) std::memcpy(static_cast<void*>(dst.data()), src_.take(count_ * sizeof(V)).data(), count_ * sizeof(V));
    } else if constexpr (format == PayloadFormat::string_vector) {
      get_strings(src_, lens_, dst.data(), count_);
      src_.end();
    } else if constexpr (format == PayloadFormat::binary) {
      if constexpr (binary::block_copyable<V>()) {  // as binary::get reads a vector of them: one block
        if (count_) std::memcpy(static_cast<void*>(dst.data()), src_.take(count_ * sizeof(V)).data(), count_ * sizeof(V));
      } else {
        for (auto& item : dst) binary::get(src_, item);
      }
      src_.end();
    } else {
      std::move(cbor_.begin(), cbor_.end(), dst.begin());
    }
  }
  /// @brief The items appended to `out` (for item types that are not default-constructible).
  void append_to(Vec& out) {
    static_assert(format == PayloadFormat::cbor, "other formats decode into sized storage");
    std::move(cbor_.begin(), cbor_.end(), std::back_inserter(out));
  }

 private:
  const std::string& type_;
  ByteSource src_;
  std::size_t count_ = 0;
  std::span<const std::byte> lens_{};
  Vec cbor_{};
};

}  // namespace detail

ACCEL_NAMESPACE_END
