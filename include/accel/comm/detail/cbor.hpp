// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file cbor.hpp
/// @brief accel's own CBOR writer and reader for payloads converted by nlohmann/json.
///
/// The bytes are exactly what `nlohmann::json::to_cbor` writes, and the reader reads what
/// `nlohmann::json::from_cbor` reads (without tags), but faster and with less memory:
/// - a vector is written one item at a time (a small JSON value per item, never one for the whole
///   vector), appending straight into the payload;
/// - a vector is read into one JSON value that is reused from item to item (same keys, same string
///   capacity: no allocation once the shape repeats), each finished item handed to a callback
///   (`from_json` into the destination);
/// - containers nested deeper than `cbor_max_depth` are an error, not a deeper recursion.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Containers nested deeper than this in a CBOR payload are refused (nlohmann's reader
/// recurses once per level).
inline constexpr std::size_t cbor_max_depth = 512;

/// @brief Writes CBOR at the end of a byte vector, byte for byte what `nlohmann::json::to_cbor`
/// writes: integers and lengths in their shortest form, floats as single precision when that is
/// exact (NaN and infinities as half precision), binary subtypes as tags (never immediate), object
/// keys in the object's order. Room is made in doubling steps and the vector is cut back to what
/// was written when the writer goes away, so an append is one bounds check and a copy.
class CborWriter {
 public:
  explicit CborWriter(std::vector<std::byte>& out) : out_(out), used_(out.size()) {}
  ~CborWriter() { out_.resize(used_); }
  CborWriter(const CborWriter&) = delete;
  CborWriter& operator=(const CborWriter&) = delete;

  /// @brief An initial byte of major type `major` with argument `n`.
  void head(std::uint8_t major, std::uint64_t n) {
    const auto tag = static_cast<std::uint8_t>(major << 5);
    if (n < 24) return byte(static_cast<std::uint8_t>(tag | n));
    const int bytes = n <= 0xff ? 1 : n <= 0xffff ? 2 : n <= 0xffffffff ? 4 : 8;
    std::uint8_t h[9];
    h[0] = static_cast<std::uint8_t>(tag | (bytes == 1 ? 24 : bytes == 2 ? 25 : bytes == 4 ? 26 : 27));
    for (int i = 0; i < bytes; ++i) h[bytes - i] = static_cast<std::uint8_t>(n >> (8 * i));
    raw(h, static_cast<std::size_t>(1 + bytes));
  }

  /// @brief The CBOR of `j`.
  void value(const nlohmann::json& j) {
    using json = nlohmann::json;
    using V = json::value_t;
    switch (j.type()) {
      case V::null: return byte(0xf6);
      case V::boolean: return byte(*j.get_ptr<const json::boolean_t*>() ? 0xf5 : 0xf4);
      case V::number_unsigned: return head(0, *j.get_ptr<const json::number_unsigned_t*>());
      case V::number_integer: {
        const std::int64_t v = *j.get_ptr<const json::number_integer_t*>();
        return v >= 0 ? head(0, static_cast<std::uint64_t>(v)) : head(1, static_cast<std::uint64_t>(-1 - v));
      }
      case V::number_float: {
        const double d = *j.get_ptr<const json::number_float_t*>();
        if (std::isnan(d)) return raw("\xf9\x7e\x00", 3);
        if (std::isinf(d)) return raw(d > 0 ? "\xf9\x7c\x00" : "\xf9\xfc\x00", 3);
        if (d >= static_cast<double>(std::numeric_limits<float>::lowest()) && d <= static_cast<double>(std::numeric_limits<float>::max()) &&
            static_cast<double>(static_cast<float>(d)) == d)
          return big_endian(0xfa, static_cast<float>(d));
        return big_endian(0xfb, d);
      }
      case V::string: {
        const auto& str = j.get_ref<const std::string&>();
        head(3, str.size());
        return raw(str.data(), str.size());
      }
      case V::binary: {
        const auto& bin = j.get_binary();
        if (bin.has_subtype() && bin.subtype() < 24) byte(0xd8), byte(static_cast<std::uint8_t>(bin.subtype()));
        else if (bin.has_subtype()) head(6, bin.subtype());
        head(2, bin.size());
        return raw(bin.data(), bin.size());
      }
      case V::array: {
        const auto& arr = j.get_ref<const json::array_t&>();
        head(4, arr.size());
        for (const auto& item : arr) value(item);
        return;
      }
      case V::object: {
        const auto& obj = j.get_ref<const json::object_t&>();
        head(5, obj.size());
        for (const auto& [key, item] : obj) {
          head(3, key.size());
          raw(key.data(), key.size());
          value(item);
        }
        return;
      }
      case V::discarded: return;
    }
  }

 private:
  std::byte* room(std::size_t n) {
    if (out_.size() - used_ < n) out_.resize(std::max(out_.size() * 2, used_ + n + 256));
    return out_.data() + used_;
  }
  void byte(std::uint8_t b) {
    *room(1) = static_cast<std::byte>(b);
    ++used_;
  }
  void raw(const void* p, std::size_t n) {
    if (n) std::memcpy(room(n), p, n);
    used_ += n;
  }
  template <class F>
  void big_endian(std::uint8_t prefix, F v) {
    std::uint8_t b[sizeof v], be[1 + sizeof v];
    std::memcpy(b, &v, sizeof v);
    be[0] = prefix;
    for (std::size_t i = 0; i < sizeof v; ++i) be[1 + i] = b[sizeof v - 1 - i];
    raw(be, sizeof be);
  }

  std::vector<std::byte>& out_;
  std::size_t used_;
};

/// @brief Appends the CBOR of `j` (see CborWriter).
inline void put_cbor(std::vector<std::byte>& out, const nlohmann::json& j) { CborWriter(out).value(j); }

/// @brief Empties the containers in `j` from the innermost out (to `levels` deep; what lies deeper
/// is left to nlohmann), so that destroying it frees each node and nothing else: nlohmann destroys
/// a container by first moving its children into a heap-allocated stack (it avoids recursion that
/// way), which for the small value of one item is an allocation or two more than the item's own.
inline void empty_json_containers(nlohmann::json& j, int levels = 16) {
  if (levels == 0) return;
  if (j.is_array()) {
    auto& arr = j.get_ref<nlohmann::json::array_t&>();
    for (auto& item : arr) empty_json_containers(item, levels - 1);
    arr.clear();
  } else if (j.is_object()) {
    auto& obj = j.get_ref<nlohmann::json::object_t&>();
    for (auto& [key, item] : obj) empty_json_containers(item, levels - 1);
    obj.clear();
  }
}

/// @brief Appends the CBOR of `items` as one array, converting one item at a time.
template <class Vector>
void put_cbor_items(std::vector<std::byte>& out, const Vector& items) {
  CborWriter w(out);
  w.head(4, items.size());
  for (const auto& item : items) {
    nlohmann::json j(item);
    w.value(j);
    empty_json_containers(j);
  }
}

/// @brief Reads CBOR as nlohmann::json::from_cbor does (no tags), into JSON values: a whole value,
/// or an array's items one at a time, handed to `done(const nlohmann::json&)` as one value reused
/// from item to item. What matches the last item (an object's keys in order, an array's slots, a
/// string's capacity) is kept and overwritten, what does not is dropped, so the value handed over
/// is always exactly the item, equal to what from_cbor builds for it. Strings are copied straight
/// from the input. Every length is checked against the bytes left; containers nested deeper than
/// `cbor_max_depth` are an error; errors are std::runtime_error naming the byte offset.
class CborReader {
 public:
  using json = nlohmann::json;

  CborReader(const std::uint8_t* first, const std::uint8_t* last) : at_(first), first_(first), last_(last) {}

  /// @brief The whole input as one value.
  json whole() {
    json out;
    value(out, 0);
    expect_end();
    return out;
  }

  /// @brief The whole input as an array, item by item; returns the number of items.
  template <class Done>
  std::size_t items(Done&& done) {
    const std::uint8_t head = byte();
    if (head >> 5 != 4) fail("a single value, not an array, where a vector's items belong");
    json item;
    std::size_t n = 0;
    for_each_in(head, [&] {
      value(item, 1);
      done(static_cast<const json&>(item));
      ++n;
    });
    expect_end();
    return n;
  }

 private:
  void expect_end() const {
    if (at_ != last_) fail(concat(last_ - at_, last_ - at_ == 1 ? " byte" : " bytes", " after the end of the value"));
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw_error<std::runtime_error>("CBOR: ", what, " (at byte ", at_ - first_, ")");
  }
  static std::string hex(std::uint8_t b) {
    constexpr char digits[] = "0123456789abcdef";
    return {digits[b >> 4], digits[b & 15]};
  }
  std::uint8_t byte() {
    if (at_ == last_) fail("input ends in the middle of a value");
    return *at_++;
  }
  const std::uint8_t* take(std::uint64_t n) {
    if (n > static_cast<std::uint64_t>(last_ - at_)) fail(concat("a length of ", n, " bytes, but ", last_ - at_, " are left"));
    const std::uint8_t* p = at_;
    at_ += n;
    return p;
  }
  // The argument of an initial byte: its low five bits, or the 1, 2, 4 or 8 big-endian bytes after it.
  std::uint64_t argument(std::uint8_t head) {
    const std::uint8_t info = head & 31;
    if (info < 24) return info;
    if (info > 27) fail(concat("initial byte 0x", hex(head), " has no definite argument"));
    const int bytes = 1 << (info - 24);
    const std::uint8_t* p = take(static_cast<std::uint64_t>(bytes));
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = v << 8 | p[i];
    return v;
  }
  // Calls `each()` once per item of the array or map (pairs) that `head` opens.
  template <class Each>
  void for_each_in(std::uint8_t head, Each&& each) {
    if ((head & 31) == 31) {
      while (true) {
        if (at_ == last_) fail("input ends inside an indefinite-length container");
        if (*at_ == 0xff) break;
        each();
      }
      ++at_;
    } else {
      for (std::uint64_t n = argument(head); n > 0; --n) each();
    }
  }
  // A text or byte string's bytes (definite, or indefinite as definite chunks of the same major type).
  std::string_view chunks(std::uint8_t head) {
    const int major = head >> 5;
    if ((head & 31) != 31) {
      const std::uint64_t n = argument(head);
      return {reinterpret_cast<const char*>(take(n)), static_cast<std::size_t>(n)};
    }
    scratch_.clear();
    while (true) {
      const std::uint8_t h = byte();
      if (h == 0xff) break;
      if (h >> 5 != major || (h & 31) == 31) fail("an indefinite-length string holds a chunk of another type");
      const std::uint64_t n = argument(h);
      scratch_.append(reinterpret_cast<const char*>(take(n)), static_cast<std::size_t>(n));
    }
    return scratch_;
  }
  static double half_float(unsigned half) {  // as nlohmann reads IEEE half precision
    const int exp = static_cast<int>((half >> 10) & 0x1f);
    const unsigned mant = half & 0x3ff;
    const double v = exp == 0    ? std::ldexp(mant, -24)
                     : exp == 31 ? (mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN())
                                 : std::ldexp(mant + 1024, exp - 25);
    return (half & 0x8000) ? -v : v;
  }

  // A scalar into a slot: in place when the slot already holds exactly that type (get_ptr alone
  // would hand an unsigned slot's storage to a signed value: is_number_integer covers both).
  template <class T>
  static void scalar(json& slot, T v) {
    constexpr json::value_t type = std::is_same_v<T, json::boolean_t>           ? json::value_t::boolean
                                   : std::is_same_v<T, json::number_integer_t>  ? json::value_t::number_integer
                                   : std::is_same_v<T, json::number_unsigned_t> ? json::value_t::number_unsigned
                                                                                : json::value_t::number_float;
    if (slot.type() == type) *slot.template get_ptr<T*>() = v;
    else slot = v;
  }

  void value(json& slot, std::size_t depth) {
    const std::uint8_t head = byte();
    switch (head >> 5) {
      case 0: return scalar<json::number_unsigned_t>(slot, argument(head));
      case 1: return scalar<json::number_integer_t>(slot, static_cast<json::number_integer_t>(-1) - static_cast<json::number_integer_t>(argument(head)));
      case 2: {
        const std::string_view b = chunks(head);
        slot = json::binary(std::vector<std::uint8_t>(b.begin(), b.end()));
        return;
      }
      case 3: {
        const std::string_view s = chunks(head);
        if (slot.is_string()) slot.template get_ref<std::string&>().assign(s);
        else slot = std::string(s);
        return;
      }
      case 4: {
        if (depth >= cbor_max_depth) fail(concat("containers nested more than ", cbor_max_depth, " deep"));
        if (!slot.is_array()) slot = json::array();
        auto& arr = slot.template get_ref<json::array_t&>();
        std::size_t used = 0;
        for_each_in(head, [&] {
          if (used == arr.size()) arr.emplace_back();
          value(arr[used++], depth + 1);
        });
        arr.resize(used);
        return;
      }
      case 5: {
        if (depth >= cbor_max_depth) fail(concat("containers nested more than ", cbor_max_depth, " deep"));
        if (!slot.is_object()) slot = json::object();
        auto& obj = slot.template get_ref<json::object_t&>();
        auto next = obj.begin();  // keys arrive sorted, as the last item's: reuse while they match
        for_each_in(head, [&] {
          const std::uint8_t k = byte();
          if (k >> 5 != 3) fail("a map key that is not a text string");
          const std::string_view key = chunks(k);
          json* target;
          if (next != obj.end() && next->first == key) {
            target = &next->second;
            ++next;
          } else {  // another shape: the rest of the old object goes; keys insert or overwrite
            obj.erase(next, obj.end());
            next = obj.end();
            target = &obj[std::string(key)];
          }
          value(*target, depth + 1);
        });
        obj.erase(next, obj.end());
        return;
      }
      case 6: fail("CBOR tags are not supported");
      default: break;
    }
    switch (head) {
      case 0xf4: return scalar<json::boolean_t>(slot, false);
      case 0xf5: return scalar<json::boolean_t>(slot, true);
      case 0xf6: slot = nullptr; return;
      case 0xf9: {
        const std::uint8_t* p = take(2);
        return scalar<json::number_float_t>(slot, half_float(static_cast<unsigned>(p[0]) << 8 | p[1]));
      }
      case 0xfa: {
        const auto bits = static_cast<std::uint32_t>(argument(head));
        float f;
        std::memcpy(&f, &bits, 4);
        return scalar<json::number_float_t>(slot, static_cast<double>(f));
      }
      case 0xfb: {
        const std::uint64_t bits = argument(head);
        double d;
        std::memcpy(&d, &bits, 8);
        return scalar<json::number_float_t>(slot, d);
      }
      default: fail(concat("initial byte 0x", hex(head), " is not a value nlohmann/json reads"));
    }
  }

  const std::uint8_t* at_;
  const std::uint8_t* first_;
  const std::uint8_t* last_;
  std::string scratch_;
};

/// @brief Reads a CBOR array's items into `done(const nlohmann::json&)` (see CborReader); returns
/// how many there were. Throws what the reader or `done` throws.
template <class Done>
std::size_t read_cbor_items(const std::uint8_t* first, const std::uint8_t* last, Done&& done) {
  return CborReader(first, last).items(std::forward<Done>(done));
}

/// @brief Reads one CBOR value (see CborReader).
inline nlohmann::json read_cbor(const std::uint8_t* first, const std::uint8_t* last) { return CborReader(first, last).whole(); }

}  // namespace detail
ACCEL_NAMESPACE_END
