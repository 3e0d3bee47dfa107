// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file json.hpp
/// @brief Reading the JSON files of checkpoints and plans: whole-file reads, and parsing that
///        rejects duplicate object keys (nlohmann keeps the last silently).
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/mapped_file.hpp>
#include <accel/runtime/unique_fd.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief The deepest nesting parse_json_strict accepts. Checkpoint headers, indexes, skeletons,
///        device maps and budgets nest a few levels; a limit keeps hostile files from exhausting
///        the stack of anything that walks the value recursively.
inline constexpr std::size_t json_max_depth = 256;

/// @brief Outcome of parse_json_strict: the value, or what went wrong.
struct StrictJsonResult {
  nlohmann::json value;
  std::string error;  ///< empty on success; else nlohmann's message or "duplicate key 'k'"
};

namespace detail {

// SAX handler: builds the DOM like nlohmann's own parser and remembers the first duplicate key.
// (nlohmann's callback parser can do this too, but is about 20x slower.)
class StrictJsonSax : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
  using base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
  struct Level {
    std::vector<std::string> few;         // linear scan while small
    std::unordered_set<std::string> many;  // then a hash set
  };

 public:
  explicit StrictJsonSax(nlohmann::json& result) : base(result, true) {}
  bool start_object(std::size_t n) {
    if (!enter()) return false;
    if (depth_ == open_.size()) open_.emplace_back();
    auto& level = open_[depth_++];
    level.few.clear();
    level.many.clear();
    return base::start_object(n);
  }
  bool end_object() {
    --depth_;
    --nesting_;
    return base::end_object();
  }
  bool start_array(std::size_t n) { return enter() && base::start_array(n); }
  bool end_array() {
    --nesting_;
    return base::end_array();
  }
  bool key(string_t& k) {
    if (!duplicate_ && depth_ > 0) {
      auto& level = open_[depth_ - 1];
      bool seen = false;
      if (level.many.empty()) {
        for (const auto& x : level.few) seen = seen || x == k;
        if (!seen) {
          level.few.push_back(k);
          if (level.few.size() > 16) {
            level.many.insert(level.few.begin(), level.few.end());
            level.few.clear();
          }
        }
      } else {
        seen = !level.many.insert(k).second;
      }
      if (seen) duplicate_ = k;
    }
    return base::key(k);
  }
  [[nodiscard]] const std::optional<std::string>& duplicate() const noexcept { return duplicate_; }
  /// @brief True when parsing stopped at a value nested deeper than json_max_depth.
  [[nodiscard]] bool too_deep() const noexcept { return too_deep_; }

 private:
  // Returning false stops nlohmann's (iterative) parser before it builds anything deeper.
  bool enter() {
    too_deep_ = ++nesting_ > json_max_depth;
    return !too_deep_;
  }
  std::vector<Level> open_;
  std::size_t depth_ = 0;    // open objects (their key sets)
  std::size_t nesting_ = 0;  // open objects and arrays
  bool too_deep_ = false;
  std::optional<std::string> duplicate_;
};

}  // namespace detail

/// @brief Parses `text` as JSON, rejecting invalid UTF-8, trailing garbage, duplicate keys in any
///        object, and nesting deeper than json_max_depth (an error, never a deep recursion).
inline StrictJsonResult parse_json_strict(std::string_view text) {
  StrictJsonResult out;
  try {
    detail::StrictJsonSax sax(out.value);
    nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
    if (sax.too_deep()) {
      out.error = detail::concat("nested deeper than ", json_max_depth, " levels");
      out.value = nullptr;
    } else if (sax.duplicate()) {
      out.error = "duplicate key '" + *sax.duplicate() + "'";
    }
  } catch (const nlohmann::json::exception& e) {
    out.error = e.what();
    out.value = nullptr;
  }
  return out;
}

namespace detail {

/// @brief A cursor over JSON text for fast paths that read one fixed, common shape (a checkpoint
/// header, an index) without building a DOM. It understands only the plain subset: strings of
/// printable ASCII without escapes, unsigned integers without sign, fraction or exponent. Anything
/// else makes the fast path give up (nullopt / false) and the caller parses with
/// parse_json_strict, which accepts or rejects and words the error exactly as before.
class PlainJsonCursor {
 public:
  explicit PlainJsonCursor(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  /// @brief Skips whitespace, then consumes `c` if it comes next.
  bool eat(char c) noexcept {
    skip_ws();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  /// @brief Skips whitespace; true when the whole text has been read.
  bool at_end() noexcept {
    skip_ws();
    return p_ == end_;
  }
  /// @brief A string of printable ASCII without escapes, as a view into the text.
  std::optional<std::string_view> string() noexcept {
    if (!eat('"')) return std::nullopt;
    const char* start = p_;
    const auto* quote = static_cast<const char*>(std::memchr(p_, '"', static_cast<std::size_t>(end_ - p_)));
    if (!quote || !printable_ascii(start, quote)) return std::nullopt;
    p_ = quote + 1;
    return std::string_view(start, static_cast<std::size_t>(quote - start));
  }
  /// @brief An unsigned integer as JSON writes it (no leading zeros), up to 2^64 - 1.
  std::optional<std::uint64_t> unsigned_integer() noexcept {
    skip_ws();
    const char* p = p_;
    const auto digit = [](char c) { return static_cast<unsigned char>(c - '0') <= 9; };
    if (p == end_ || !digit(*p)) return std::nullopt;
    std::uint64_t v = 0;
    // Nineteen digits cannot overflow 64 bits: only those after them are checked.
    for (const char* unchecked = end_ - p > 19 ? p + 19 : end_; p != unchecked && digit(*p); ++p)
      v = v * 10 + static_cast<std::uint64_t>(*p - '0');
    for (; p != end_ && digit(*p); ++p) {
      const auto d = static_cast<std::uint64_t>(*p - '0');
      if (v > (UINT64_MAX - d) / 10) return std::nullopt;
      v = v * 10 + d;
    }
    if ((*p_ == '0' && p - p_ > 1) || (p != end_ && (*p == '.' || *p == 'e' || *p == 'E'))) return std::nullopt;
    p_ = p;
    return v;
  }
  /// @brief Consumes the literal `null` if it comes next.
  bool null() noexcept {
    skip_ws();
    if (end_ - p_ < 4 || std::string_view(p_, 4) != "null") return false;
    p_ += 4;
    return true;
  }
  /// @brief Reads `[n, n, ...]` of unsigned integers into `out`.
  bool unsigned_array(std::vector<std::uint64_t>& out) {
    out.clear();
    if (!eat('[')) return false;
    if (eat(']')) return true;
    do {
      const auto v = unsigned_integer();
      if (!v) return false;
      out.push_back(*v);
    } while (eat(','));
    return eat(']');
  }
  /// @brief Reads the members of an object, calling member(key) with the cursor at each value; false
  /// when the text is not an object or member returns false.
  template <class F>
  bool object(F&& member) {
    if (!eat('{')) return false;
    if (eat('}')) return true;
    do {
      const auto key = string();
      if (!key || !eat(':') || !member(*key)) return false;
    } while (eat(','));
    return eat('}');
  }

 private:
  // True when [p, end) holds only printable ASCII (0x20-0x7e) other than a backslash. Eight bytes
  // at a time: a byte below 0x20 borrows into its lane's high bit when 0x20 is taken from each,
  // one of 0x7f or above has or gets it when 1 is added, and a backslash becomes a zero that
  // borrows once xor-ed with 0x5c; printable bytes never do. A flagged word (and the tail) is
  // checked byte by byte.
  static bool printable_ascii(const char* p, const char* end) noexcept {
    constexpr std::uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (; end - p >= 8; p += 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      if (((w - ones * 0x20) | (w + ones) | w | ((w ^ (ones * 0x5c)) - ones)) & highs) break;
    }
    for (; p != end; ++p) {
      const auto c = static_cast<unsigned char>(*p);
      if (c < 0x20 || c > 0x7e || c == '\\') return false;
    }
    return true;
  }
  void skip_ws() noexcept {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  const char* p_;
  const char* end_;
};

}  // namespace detail

/// @brief A JSON value for an error message, at most about `limit` characters: scalars as JSON,
///        containers shortened with "..." (nested ones past a few levels as `[...]` / `{...}`).
inline std::string json_excerpt(const nlohmann::json& value, std::size_t limit = 80) {
  std::string out;
  // Depth-capped, so a value from any source prints in bounded time and stack.
  auto put = [&](auto&& self, const nlohmann::json& v, int depth) -> void {
    if (out.size() > limit) return;
    if (v.is_array() || v.is_object()) {
      const bool array = v.is_array();
      if (depth >= 3 && !v.empty()) {
        out += array ? "[...]" : "{...}";
        return;
      }
      out += array ? '[' : '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (out.size() > limit) break;
        if (!first) out += ", ";
        first = false;
        if (!array) out += nlohmann::json(it.key()).dump() + ": ";
        self(self, *it, depth + 1);
      }
      out += array ? ']' : '}';
      return;
    }
    out += v.dump();
  };
  put(put, value, 0);
  if (out.size() > limit) out = out.substr(0, limit) + "...";
  return out;
}

/// @brief A JSON number as a whole count of bytes or elements: an unsigned integer, or a float
///        with no fraction below 2^64 (some tools write `1e9`); nullopt for anything else
///        (negative, fractional, too large, not a number), never an out-of-range cast.
inline std::optional<std::uint64_t> json_whole_number(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (!v.is_number_float()) return std::nullopt;
  const double d = v.get<double>();
  if (!(d >= 0.0 && d < 18446744073709551616.0) || d != static_cast<double>(static_cast<std::uint64_t>(d)))
    return std::nullopt;
  return static_cast<std::uint64_t>(d);
}

/// @brief The largest file read_text_file reads: far above any real index, config or device map
///        (DeepSeek-V3's index of 92k tensors is 9 MB), far below what fits in memory.
inline constexpr std::uint64_t text_file_max_bytes = std::uint64_t{1} << 30;

/// @brief Reads a whole regular file as text.
/// @param what what the file is, for messages ("checkpoint index", "model skeleton")
/// @throws accel::checkpoint_error naming the file and why when it cannot be opened or read, is
///         not a regular file (a FIFO would block, a device such as /dev/zero never ends, see
///         detail::open_regular_file), or is larger than text_file_max_bytes
inline std::string read_text_file(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  const detail::UniqueFd fd = detail::open_regular_file(path, what, st);
  const auto too_large = [&](std::uint64_t bytes) {
    detail::throw_error<checkpoint_error>("cannot read ", what, " '", path.string(), "': it is ", bytes, " bytes, more than the ",
                                          text_file_max_bytes, " accel reads as text; check the path");
  };
  if (static_cast<std::uint64_t>(st.st_size) > text_file_max_bytes) too_large(static_cast<std::uint64_t>(st.st_size));
  // In one block as large as the file says it is, plus one byte to see its end (fresh memory is
  // slow to touch, so no doubling); a file that grows while read (or a /proc file, which says 0)
  // grows the buffer until its end, within the cap.
  std::string text(static_cast<std::size_t>(st.st_size) + 1, '\0');
  std::size_t got = 0;
  for (;;) {
    int error = 0;
    got += pread_full(fd.get(), std::span(reinterpret_cast<std::byte*>(text.data()) + got, text.size() - got), got, error);
    if (error) detail::throw_error<checkpoint_error>("cannot read ", what, " '", path.string(), "': ", std::strerror(error));
    if (got < text.size()) break;
    if (text.size() > text_file_max_bytes) too_large(text.size());
    text.resize(std::max<std::size_t>(text.size() * 2, 64 * 1024));
  }
  text.resize(got);
  return text;
}

ACCEL_NAMESPACE_END
