// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file safetensors.hpp
/// @brief safetensors headers: strict parsing and validation from bytes or a file (data never read).
///
/// The rules are those of the reference Rust reader, applied strictly: an 8-byte little-endian
/// header length N ≤ 100,000,000 and ≤ file size − 8; a UTF-8 JSON object without duplicate keys;
/// per tensor a known dtype, a shape of non-negative integers and `data_offsets` [begin, end) with
/// end − begin = product(shape) × element size; offsets contiguous from 0, without gaps or
/// overlaps, covering exactly the data section (file size − 8 − N); an optional `__metadata__`
/// object of string values. Also: sharded `model.safetensors.index.json` and folder resolution.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/bytes.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/mapped_file.hpp>
#include <accel/runtime/parallel_for.hpp>
#include <accel/model/json.hpp>
#include <accel/model/detail/name_index.hpp>
#include <accel/model/dtype.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Largest header the format allows (decimal 100 MB, as the reference reader).
inline constexpr std::uint64_t safetensors_max_header_size = 100'000'000;

/// @brief One tensor of a safetensors file.
struct TensorEntry {
  /// Key in the header. A view: headers accel parses keep their names in
  /// SafetensorsHeader::names (shared by copies); whoever builds an entry by hand keeps its name.
  std::string_view name;
  DType dtype = DType::F32;          ///< element type
  std::vector<std::int64_t> shape;   ///< dimensions, row-major; empty for a scalar
  std::uint64_t begin = 0;           ///< first byte, relative to the data section
  std::uint64_t end = 0;             ///< one past the last byte, relative to the data section

  /// @brief Number of elements (1 for a scalar).
  [[nodiscard]] std::uint64_t numel() const noexcept { return shape_numel(shape); }
  /// @brief Bytes of data (end − begin).
  [[nodiscard]] std::uint64_t size_bytes() const noexcept { return end - begin; }
};

/// @brief A validated safetensors header.
struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;              ///< in file (offset) order
  std::map<std::string, std::string> metadata;   ///< `__metadata__`, empty when absent
  std::uint64_t header_size = 0;                 ///< N, the JSON length
  std::uint64_t data_offset = 0;                 ///< 8 + N: file offset of the data section
  std::uint64_t file_size = 0;                   ///< whole file, bytes
  std::shared_ptr<const std::string> names;      ///< the tensors' names, which TensorEntry::name views
  detail::NameIndex name_index;                  ///< tensor name → index in `tensors` (see find)

  /// @brief The entry called `name`, or nullptr.
  [[nodiscard]] const TensorEntry* find(std::string_view name) const {
    const auto id = name_index.find(name, detail::name_hash(name), [&](std::uint32_t i) { return std::string_view(tensors[i].name); });
    return id ? &tensors[*id] : nullptr;
  }
  /// @brief Absolute file offset of a tensor's first byte.
  [[nodiscard]] std::uint64_t file_offset(const TensorEntry& t) const noexcept { return data_offset + t.begin; }
};

namespace detail {

[[noreturn]] inline void safetensors_fail(std::string_view file, const std::string& what) {
  throw_error<checkpoint_error>("invalid safetensors file '", file, "': ", what,
                                "; the file is corrupt, truncated or not safetensors: re-download or re-save it");
}

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Checks the 8-byte length against the limits; returns N.
inline std::uint64_t check_header_length(std::uint64_t n, std::uint64_t file_size, std::string_view file) {
  if (file_size < 8)
    safetensors_fail(file, concat("file is ", file_size, " bytes, shorter than the 8-byte header length (rule: "
                                  "a safetensors file starts with a u64 header length)"));
  if (n > safetensors_max_header_size)
    safetensors_fail(file, concat("header length ", n, " exceeds the limit of ", safetensors_max_header_size,
                                  " bytes (rule: header <= 100,000,000 bytes)"));
  if (n > file_size - 8)
    safetensors_fail(file, concat("header length ", n, " exceeds the ", file_size - 8,
                                  " bytes after the length field (rule: header length <= file size - 8)"));
  return n;
}

// The dtype a safetensors header names ("F16", "BF16", ...), exactly as spelled there.
inline std::optional<DType> safetensors_dtype(std::string_view name) {
  for (const auto& row : detail::dtype_table)
    if (row.safetensors == name) return row.dtype;
  return std::nullopt;
}

// The checks of an entry's extent once dtype, shape and offsets are read: begin <= end, the shape's
// bytes fit 64 bits and equal end - begin. `bad` throws.
template <class Bad>
void check_tensor_extent(const TensorEntry& t, std::string_view dname, Bad&& bad) {
  if (t.end < t.begin) bad(concat("data_offsets [", t.begin, ", ", t.end, "] end before begin (rule: begin <= end)"));
  std::uint64_t numel = 1;
  for (auto d : t.shape) {
    const auto ud = static_cast<std::uint64_t>(d);
    if (ud != 0 && numel > std::numeric_limits<std::uint64_t>::max() / ud)
      bad(concat("shape ", shape_text(t.shape), " overflows 64 bits (rule: product(shape) * element size fits)"));
    numel *= ud;
  }
  auto bytes = tensor_bytes(t.dtype, numel);
  if (!bytes) {
    if (is_sub_byte(t.dtype) && numel <= std::numeric_limits<std::uint64_t>::max() / bit_size(t.dtype))
      bad(concat("shape ", shape_text(t.shape), " of ", dname, " is ", numel * bit_size(t.dtype),
                 " bits, not a whole number of bytes (rule: sub-byte tensors fill whole bytes)"));
    bad(concat("shape ", shape_text(t.shape), " of ", dname, " overflows 64 bits (rule: product(shape) * element size fits)"));
  }
  if (*bytes != t.end - t.begin)
    bad(concat("data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin, " bytes but shape ",
               shape_text(t.shape), " of ", dname, " needs ", *bytes,
               " (rule: end - begin == product(shape) * element size)"));
}

inline TensorEntry parse_tensor_entry(std::string_view name, const nlohmann::json& v, std::string_view file) {
  auto bad = [&](const std::string& what) { safetensors_fail(file, concat("tensor '", name, "': ", what)); };
  if (!v.is_object()) bad(concat("entry is ", v.type_name(), ", not an object with dtype, shape, data_offsets"));
  TensorEntry t;
  t.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) bad("missing or non-string 'dtype'");
  const auto& dname = dt->get_ref<const std::string&>();
  const auto dtype = safetensors_dtype(dname);
  if (!dtype) bad(concat("unknown dtype '", dname, "' (rule: dtype is one of BOOL, U8, I8, ..., F16, BF16, F32, F64, F8_*)"));
  t.dtype = *dtype;
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) bad("missing or non-array 'shape'");
  t.shape.reserve(sh->size());
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      bad(concat("shape entry ", json_excerpt(d), " is not a non-negative integer (rule: shape holds non-negative integers)"));
    t.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    bad("'data_offsets' must be two non-negative integers [begin, end]");
  t.begin = (*off)[0].get<std::uint64_t>();
  t.end = (*off)[1].get<std::uint64_t>();
  check_tensor_extent(t, dname, bad);
  return t;
}

// Copies the names the entries view (into the text being parsed) into one string the header
// owns, and points the entries at it: one allocation for all of them.
inline void own_names(SafetensorsHeader& h) {
  std::size_t total = 0;
  for (const auto& t : h.tensors) total += t.name.size();
  auto names = std::make_shared<std::string>();
  names->reserve(total);
  for (const auto& t : h.tensors) names->append(t.name);
  std::size_t at = 0;
  for (auto& t : h.tensors) {
    t.name = std::string_view(*names).substr(at, t.name.size());
    at += t.name.size();
  }
  h.names = std::move(names);
}

// A header in its common form (names and dtypes of plain ASCII, the three fields once each, string
// metadata), read without building a DOM: several times faster on the large headers of sharded
// checkpoints. nullopt as soon as the text leaves that form or an entry fails a check; the full
// parser then decides, so what is accepted and every error message stay exactly the same. A name
// given twice is not looked for here: parse_safetensors_header's name index finds it. The names
// view `text`.
inline std::optional<std::vector<TensorEntry>> parse_plain_header(std::string_view text, std::map<std::string, std::string>& metadata) {
  PlainJsonCursor c(text);
  std::vector<TensorEntry> tensors;
  tensors.reserve(text.size() / 64 + 1);  // an entry takes some 70 bytes or more of JSON
  std::vector<std::uint64_t> shape, offsets;
  bool seen_metadata = false;
  const auto give_up = [](const std::string&) { throw std::invalid_argument("fails a check"); };
  const auto member = [&](std::string_view key) {
    if (key == "__metadata__") {
      if (std::exchange(seen_metadata, true)) return false;
      return c.null() || c.object([&](std::string_view k) {
        const auto v = c.string();
        return v && metadata.emplace(k, *v).second;
      });
    }
    std::optional<std::string_view> dname;
    bool have_shape = false, have_offsets = false;
    const bool read = c.object([&](std::string_view field) {
      if (field == "dtype" && !dname) return (dname = c.string()).has_value();
      if (field == "shape" && !have_shape) return have_shape = c.unsigned_array(shape);
      if (field == "data_offsets" && !have_offsets) return have_offsets = c.unsigned_array(offsets);
      return false;
    });
    if (!read || !dname || !have_shape || !have_offsets || offsets.size() != 2) return false;
    const auto dtype = safetensors_dtype(*dname);
    if (!dtype) return false;
    TensorEntry t;
    t.name = key;
    t.dtype = *dtype;
    t.shape.reserve(shape.size());
    for (const auto d : shape) {
      if (d > static_cast<std::uint64_t>(INT64_MAX)) return false;
      t.shape.push_back(static_cast<std::int64_t>(d));
    }
    t.begin = offsets[0], t.end = offsets[1];
    try {
      check_tensor_extent(t, *dname, give_up);
    } catch (const std::invalid_argument&) {
      return false;
    }
    tensors.push_back(std::move(t));
    return true;
  };
  if (!c.object(member) || !c.at_end()) return std::nullopt;
  return tensors;
}

// The header read through the strict JSON parser: every form the format allows, and the errors.
inline void parse_json_header(std::string_view text, std::string_view file_label, SafetensorsHeader& h) {
  auto parsed = parse_json_strict(text);
  if (!parsed.error.empty())
    safetensors_fail(file_label, "header is not valid JSON: " + parsed.error + " (rule: the header is a UTF-8 JSON object)");
  if (!parsed.value.is_object())
    safetensors_fail(file_label, concat("header is a JSON ", parsed.value.type_name(), ", not an object (rule: the header is a JSON object)"));
  h.tensors.reserve(parsed.value.size());
  for (const auto& [key, value] : parsed.value.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object())
        safetensors_fail(file_label, "'__metadata__' is not an object (rule: __metadata__ maps strings to strings)");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          safetensors_fail(file_label, concat("'__metadata__' value for '", mk, "' is ", mv.type_name(),
                                              ", not a string (rule: __metadata__ maps strings to strings)"));
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_tensor_entry(key, value, file_label));
  }
  own_names(h);  // the keys die with `parsed`
}

// parse_safetensors_header, also giving each tensor's name_hash (in `tensors` order) when `hashes`
// is set: a checkpoint's table of all names reuses them.
inline SafetensorsHeader parse_header(std::span<const std::byte> bytes, std::uint64_t file_size, std::string_view file_label,
                                      std::vector<std::uint64_t>* hashes) {
  if (file_size < 8) detail::check_header_length(0, file_size, file_label);
  if (bytes.size() < 8)
    detail::safetensors_fail(file_label, detail::concat("only ", bytes.size(), " bytes were provided, fewer than the 8-byte length"));
  const std::uint64_t n = detail::check_header_length(load_le<std::uint64_t>(bytes.data()), file_size, file_label);
  if (bytes.size() - 8 < n)
    detail::safetensors_fail(file_label, detail::concat("only ", bytes.size() - 8, " of the ", n,
                                                        " header bytes were provided"));
  SafetensorsHeader h;
  h.header_size = n;
  h.data_offset = 8 + n;
  h.file_size = file_size;
  std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), static_cast<std::size_t>(n));
  // Ties (empty tensors at one offset) in name order, whichever parser read them; then the names'
  // index, which finds a key given twice (the fast parser does not look for one: the strict parser
  // then rejects the header, with its message).
  const auto index = [&] {
    std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end != b.end ? a.end < b.end : a.name < b.name;
    });
    h.name_index = {};
    h.name_index.reserve(h.tensors.size());
    if (hashes) hashes->resize(h.tensors.size());
    const auto name_of = [&](std::uint32_t i) { return std::string_view(h.tensors[i].name); };
    for (std::size_t i = 0; i < h.tensors.size(); ++i) {
      const auto hash = detail::name_hash(h.tensors[i].name);
      if (hashes) (*hashes)[i] = hash;
      if (h.name_index.insert(hash, static_cast<std::uint32_t>(i), name_of)) return false;
    }
    return true;
  };
  auto plain = detail::parse_plain_header(text, h.metadata);
  if (plain) {
    h.tensors = std::move(*plain);
    detail::own_names(h);
  }
  if (!plain || !index()) {
    h.tensors.clear();
    h.metadata.clear();
    detail::parse_json_header(text, file_label, h);
    if (!index()) detail::safetensors_fail(file_label, "a tensor name is given twice (rule: names are unique)");
  }
  std::uint64_t expected = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != expected)
      detail::safetensors_fail(file_label,
                               detail::concat("tensor '", t.name, "': data_offsets [", t.begin, ", ", t.end, "] ",
                                              t.begin < expected ? "overlap" : "leave a gap after", " the previous tensor ending at ",
                                              expected, " (rule: offsets are contiguous from 0, no gaps or overlaps)"));
    expected = t.end;
  }
  const std::uint64_t data_size = file_size - 8 - n;
  if (expected != data_size)
    detail::safetensors_fail(file_label, detail::concat("tensors cover ", expected, " data bytes but the data section is ",
                                                        data_size, " bytes (", expected < data_size ? "trailing bytes" : "truncated data",
                                                        "; rule: offsets cover exactly file size - 8 - header length)"));
  return h;
}
}  // namespace detail

/// @brief Parses and validates a safetensors header held in memory.
/// @param bytes the file's bytes from offset 0; must hold at least the 8-byte length and the
///        header (the data section may follow or be absent)
/// @param file_size the whole file's size in bytes (for the coverage rule)
/// @param file_label the name used in error messages (usually the path)
/// @return the header, tensors in offset order
/// @throws accel::checkpoint_error naming the file, the tensor and the violated rule
[[nodiscard]] inline SafetensorsHeader parse_safetensors_header(std::span<const std::byte> bytes,
                                                               std::uint64_t file_size,
                                                               std::string_view file_label) {
  return detail::parse_header(bytes, file_size, file_label, nullptr);
}

namespace detail {
// read_safetensors_header, also giving the names' hashes (see parse_header).
inline SafetensorsHeader read_header(const std::filesystem::path& path, std::vector<std::uint64_t>* hashes) {
  const std::string label = path.string();
  // Opened without blocking and checked to be a file (detail::open_regular_file); read with pread
  // into memory not cleared first (the header overwrites it all).
  struct stat st {};
  const UniqueFd fd = open_regular_file(path, "safetensors file", st);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) check_header_length(0, size, label);
  std::byte length[8];
  int error = 0;
  if (pread_full(fd.get(), length, 0, error) != 8)
    throw_error<checkpoint_error>("cannot read the header length of '", label, "' (short read); the file is unreadable");
  const std::uint64_t n = check_header_length(load_le<std::uint64_t>(length), size, label);
  const std::unique_ptr<std::byte[]> owner(new std::byte[static_cast<std::size_t>(8 + n)]);
  const std::span<std::byte> buf(owner.get(), static_cast<std::size_t>(8 + n));
  std::memcpy(buf.data(), length, 8);
  if (pread_full(fd.get(), buf.subspan(8), 8, error) != n)
    throw_error<checkpoint_error>("cannot read the ", n, "-byte header of '", label,
                                  "' (short read); the file changed while reading or is unreadable");
  return parse_header(buf, size, label, hashes);
}
}  // namespace detail

/// @brief Reads and validates the header of a safetensors file: only the 8-byte length and the
///        JSON header are read, never the tensor data.
/// @param path the .safetensors file
/// @return the header
/// @throws accel::checkpoint_error when the file cannot be read or breaks a format rule
[[nodiscard]] inline SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  return detail::read_header(path, nullptr);
}

/// @name Sharded checkpoints and folders
///@{

/// @brief Where one tensor of a Checkpoint lives.
struct TensorLocation {
  std::size_t shard = 0;  ///< index into Checkpoint::shard_files / headers
  std::size_t entry = 0;  ///< index into that header's `tensors`
};

/// @brief A parsed `model.safetensors.index.json`.
struct SafetensorsIndex {
  std::filesystem::path index_file;                          ///< the index itself
  std::vector<std::string> shard_names;                      ///< distinct shard file names, sorted
  std::map<std::string, std::size_t> weight_map;             ///< tensor → index into shard_names
  std::optional<std::uint64_t> total_size;                   ///< metadata.total_size when present
};

namespace detail {
// A shard name that is not a file name relative to the index's folder (empty, absolute, `..`).
inline bool unsafe_shard_name(std::string_view name) {
  const std::filesystem::path p(name);
  bool unsafe = name.empty() || p.is_absolute();
  for (const auto& part : p) unsafe = unsafe || part == "..";
  return unsafe;
}

// An index's `metadata` in its common form (null, or each key once with a string or unsigned value,
// `total_size` an unsigned integer), at the cursor; false otherwise.
inline bool plain_index_metadata(PlainJsonCursor& c, std::optional<std::uint64_t>& total_size) {
  std::unordered_set<std::string_view> keys;
  return c.null() || c.object([&](std::string_view k) {
    if (!keys.insert(k).second) return false;
    if (k == "total_size") return (total_size = c.unsigned_integer()).has_value();
    return c.string().has_value() || c.unsigned_integer().has_value();
  });
}

// What resolving a sharded checkpoint needs of its index, read in one pass without a string per
// tensor: the distinct shard names (sorted) and the fingerprint of the (tensor, shard) pairs that
// the shards' headers must reproduce.
struct IndexSummary {
  std::vector<std::string> shard_names;
  PairPrint pairs;
};

// The index in its common form as parse_plain_index reads it; false otherwise, and
// parse_safetensors_index then decides. A key given twice is not looked for: the shards' headers
// hold each name once, so such an index cannot reproduce their pairs.
inline bool summarize_plain_index(std::string_view text, IndexSummary& out) {
  PlainJsonCursor c(text);
  bool seen_metadata = false, seen_map = false;
  std::optional<std::uint64_t> total_size;  // checked as parse_plain_index checks it, not kept
  // The shard of the previous entry (most entries repeat it), else a lookup among those seen.
  std::vector<std::pair<std::string_view, std::uint64_t>> shards;
  NameIndex shard_ids;
  std::size_t last = SIZE_MAX;
  const bool read = c.object([&](std::string_view key) {
    if (key == "metadata" && !std::exchange(seen_metadata, true)) return plain_index_metadata(c, total_size);
    if (key == "weight_map" && !std::exchange(seen_map, true))
      return c.object([&](std::string_view tensor) {
        const auto shard = c.string();
        if (!shard) return false;
        if (last == SIZE_MAX || shards[last].first != *shard) {
          const auto hash = name_hash(*shard);
          const auto id = static_cast<std::uint32_t>(shards.size());
          const auto known = shard_ids.insert(hash, id, [&](std::uint32_t i) { return i == id ? *shard : shards[i].first; });
          if (!known) shards.emplace_back(*shard, hash);
          last = known.value_or(id);
        }
        out.pairs.add(name_hash(tensor), shards[last].second);
        return true;
      });
    return false;
  });
  if (!read || !seen_map || out.pairs.count == 0 || !c.at_end()) return false;
  for (const auto& shard : shards) out.shard_names.emplace_back(shard.first);
  std::sort(out.shard_names.begin(), out.shard_names.end());
  return true;
}

// An index in its common form (plain ASCII names, metadata of strings and unsigned integers, a
// non-empty weight map, each key once) read without building a DOM; false as soon as the text
// leaves that form, and the strict parser then decides. `entries` come out in tensor-name order.
inline bool parse_plain_index(std::string_view text, std::optional<std::uint64_t>& total_size,
                              std::vector<std::pair<std::string_view, std::string_view>>& entries) {
  PlainJsonCursor c(text);
  bool seen_metadata = false, seen_map = false;
  const bool read = c.object([&](std::string_view key) {
    if (key == "metadata" && !std::exchange(seen_metadata, true)) return plain_index_metadata(c, total_size);
    if (key == "weight_map" && !std::exchange(seen_map, true))
      return c.object([&](std::string_view tensor) {
        const auto shard = c.string();
        if (shard) entries.emplace_back(tensor, *shard);
        return shard.has_value();
      });
    return false;
  });
  if (!read || !seen_map || entries.empty() || !c.at_end()) return false;
  std::sort(entries.begin(), entries.end());
  return std::adjacent_find(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first == b.first; }) ==
         entries.end();
}
}  // namespace detail

/// @brief Parses the text of a sharded-checkpoint index.
/// @param json_text the file's content
/// @param label name used in messages
/// @return the index (shard existence is not checked here)
/// @throws accel::checkpoint_error for invalid JSON, a missing, non-object or empty `weight_map`, a non-string
///         or unsafe shard name (absolute, `..`), or a non-integer `metadata.total_size`
[[nodiscard]] inline SafetensorsIndex parse_safetensors_index(std::string_view json_text, std::string_view label) {
  auto fail = [&](const std::string& what) {
    detail::throw_error<checkpoint_error>("invalid checkpoint index '", label, "': ", what,
                                          "; expected {\"metadata\": {\"total_size\": N}, \"weight_map\": {tensor: shard file}}");
  };
  SafetensorsIndex idx;
  // tensor -> shard file, in tensor-name order; views into the text or into `parsed`
  std::vector<std::pair<std::string_view, std::string_view>> entries;
  nlohmann::json parsed;
  if (!detail::parse_plain_index(json_text, idx.total_size, entries)) {
    idx.total_size.reset();
    entries.clear();
    auto strict = parse_json_strict(json_text);
    if (!strict.error.empty()) fail("not valid JSON: " + strict.error);
    parsed = std::move(strict.value);
    const auto& j = parsed;
    if (!j.is_object()) fail(detail::concat("top level is a JSON ", j.type_name(), ", not an object"));
    if (auto md = j.find("metadata"); md != j.end() && !md->is_null()) {
      if (!md->is_object()) fail("'metadata' is not an object");
      if (auto ts = md->find("total_size"); ts != md->end()) {
        // transformers writes an int; some tools write a float with no fraction.
        if (auto n = json_whole_number(*ts)) idx.total_size = *n;
        else fail(detail::concat("'metadata.total_size' is ", json_excerpt(*ts), ", not a non-negative integer"));
      }
    }
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) fail("missing or non-object 'weight_map'");
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string()) fail(detail::concat("weight_map entry '", tensor, "' is ", shard.type_name(), ", not a shard file name"));
      entries.emplace_back(tensor, shard.get_ref<const std::string&>());
    }
  }
  if (entries.empty()) fail("'weight_map' is empty, so the index lists no tensor and no shard");
  std::map<std::string, std::size_t, std::less<>> shard_ids;
  for (const auto& [tensor, name] : entries) {
    if (!shard_ids.emplace(name, 0).second) continue;  // each shard name is checked once
    if (detail::unsafe_shard_name(name))
      fail(detail::concat("weight_map entry '", tensor, "' names shard '", name,
                          "', which is not a file name relative to the index's folder"));
  }
  for (auto& [name, id] : shard_ids) {
    id = idx.shard_names.size();
    idx.shard_names.push_back(name);
  }
  for (const auto& [tensor, name] : entries)  // in key order already: each goes at the end
    idx.weight_map.emplace_hint(idx.weight_map.end(), tensor, shard_ids.find(name)->second);
  return idx;
}

namespace detail {
inline void check_shards_exist(const std::filesystem::path& index, const std::vector<std::string>& shard_names) {
  const auto dir = index.parent_path();
  for (const auto& shard : shard_names) {
    struct stat st {};
    if (::stat((dir / shard).c_str(), &st) != 0)
      throw_error<checkpoint_error>("checkpoint index '", index.string(), "' names shard '", shard, "', which does not exist in '",
                                    dir.string(), "'; the download is incomplete or the index is stale");
    if (!S_ISREG(st.st_mode))
      throw_error<checkpoint_error>("checkpoint index '", index.string(), "' names shard '", shard, "', which is ",
                                    file_kind(st.st_mode), " in '", dir.string(), "', not a file; replace it with the shard");
  }
}
}  // namespace detail

/// @brief Reads a sharded-checkpoint index and checks that every shard it names exists.
/// @throws accel::checkpoint_error as parse_safetensors_index, or naming a missing shard
[[nodiscard]] inline SafetensorsIndex read_safetensors_index(const std::filesystem::path& path) {
  auto idx = parse_safetensors_index(read_text_file(path, "checkpoint index"), path.string());
  idx.index_file = path;
  detail::check_shards_exist(path, idx.shard_names);
  return idx;
}

/// @brief Every tensor of a checkpoint (one file, an index with its shards, or a folder) and
///        where it lives; built from headers only.
struct Checkpoint {
  std::filesystem::path directory;                    ///< folder holding the files
  std::optional<std::filesystem::path> index_file;    ///< the index, when sharded
  std::optional<std::filesystem::path> config_file;   ///< `config.json` next to the files, if any
  std::vector<std::filesystem::path> shard_files;     ///< sorted by file name
  std::vector<SafetensorsHeader> headers;             ///< parallel to shard_files
  std::vector<std::string_view> tensor_names;         ///< shard order, then offset order (views of the headers' names)
  std::vector<TensorLocation> locations;              ///< parallel to tensor_names
  detail::NameIndex name_index;                       ///< tensor name → position in tensor_names (see find)

  /// @brief Location of `name`, or nullptr when the checkpoint lacks it.
  [[nodiscard]] const TensorLocation* find(std::string_view name) const {
    const auto id = name_index.find(name, detail::name_hash(name), [&](std::uint32_t i) { return tensor_names[i]; });
    return id ? &locations[*id] : nullptr;
  }
  /// @brief Calls f(n, entry) for every tensor in Checkpoint::tensor_names order (n is its
  ///        position there), without a name lookup.
  template <class F>
  void for_each_entry(F&& f) const {
    std::size_t n = 0;
    for (const auto& h : headers)
      for (const auto& e : h.tensors) f(n++, e);
  }
  /// @brief What tensor_names (and every entry's name) view: each header's name storage, for a
  ///        table of names that must outlive this checkpoint (NameTable::storage).
  [[nodiscard]] std::vector<std::shared_ptr<const void>> name_storage() const {
    std::vector<std::shared_ptr<const void>> out;
    for (const auto& h : headers) out.push_back(h.names);
    return out;
  }
  /// @brief The header entry at a location.
  [[nodiscard]] const TensorEntry& entry(const TensorLocation& loc) const { return headers[loc.shard].tensors[loc.entry]; }
  /// @brief Sum of every tensor's bytes.
  [[nodiscard]] std::uint64_t total_bytes() const noexcept {
    std::uint64_t total = 0;
    for (const auto& h : headers)
      for (const auto& t : h.tensors) total += t.size_bytes();
    return total;
  }
};

namespace detail {

// Every shard's header and its names' hashes, read on a few threads when there are many, and
// `beside()` (when given) on one of them as the first task (a failure of `beside` is rethrown); a
// shard that cannot be read leaves its error in `failed`.
template <class Beside>
std::vector<SafetensorsHeader> read_shard_headers(const std::vector<std::filesystem::path>& files, std::vector<std::vector<std::uint64_t>>& hashes,
                                                  std::vector<std::exception_ptr>& failed, Beside&& beside) {
  std::vector<SafetensorsHeader> headers(files.size());
  hashes.assign(files.size(), {});
  failed.assign(files.size(), nullptr);
  const unsigned threads = files.size() >= 8 ? copy_threads(0, files.size() + 1) : 1;
  parallel_for(
      files.size() + 1, threads,
      [&](std::size_t task, unsigned) -> std::uint64_t {
        if (task == 0) {
          beside();
          return 0;
        }
        try {
          headers[task - 1] = read_header(files[task - 1], &hashes[task - 1]);
        } catch (...) {
          failed[task - 1] = std::current_exception();
        }
        return 0;
      },
      [](std::uint64_t) {});
  return headers;
}
// As above without a task beside; the first failing shard in order throws, as a loop would.
inline std::vector<SafetensorsHeader> read_shard_headers(const std::vector<std::filesystem::path>& files,
                                                         std::vector<std::vector<std::uint64_t>>& hashes) {
  std::vector<std::exception_ptr> failed;
  auto headers = read_shard_headers(files, hashes, failed, [] {});
  for (const auto& f : failed)
    if (f) std::rethrow_exception(f);
  return headers;
}

// Room for every tensor of `headers` at once (the tables then never grow while shards are added).
inline void reserve_tensors(Checkpoint& c, const std::vector<SafetensorsHeader>& headers) {
  std::size_t n = 0;
  for (const auto& h : headers) n += h.tensors.size();
  c.headers.reserve(headers.size());
  c.shard_files.reserve(headers.size());
  c.tensor_names.reserve(n);
  c.locations.reserve(n);
  c.name_index.reserve(n);
}

// Adds one shard's header, its names' hashes beside it, to the checkpoint (after reserve_tensors); `pairs` gathers its
// (tensor, shard) pairs under the shard's name `shard_hash` for the comparison with an index.
inline void add_shard(Checkpoint& c, const std::filesystem::path& file, SafetensorsHeader header, const std::vector<std::uint64_t>& hashes,
                      PairPrint* pairs = nullptr, std::uint64_t shard_hash = 0) {
  c.headers.push_back(std::move(header));
  c.shard_files.push_back(file);
  const std::size_t shard = c.shard_files.size() - 1;
  const auto& h = c.headers.back();
  const auto name_of = [&](std::uint32_t i) { return c.tensor_names[i]; };
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const auto& name = h.tensors[i].name;
    const auto hash = hashes[i];
    const auto id = static_cast<std::uint32_t>(c.tensor_names.size());
    c.tensor_names.push_back(name);
    if (const auto other = c.name_index.insert(hash, id, name_of))
      throw_error<checkpoint_error>("tensor '", name, "' is stored twice, in '", c.shard_files[c.locations[*other].shard].string(),
                                    "' and '", file.string(), "'; remove the duplicate file or load one file");
    c.locations.push_back({shard, i});
    if (pairs) pairs->add(hash, shard_hash);
  }
}
// The exact comparison of an index with the headers of its shards (already added to `c`).
inline void check_index_matches(const Checkpoint& c, const SafetensorsIndex& idx) {
  const std::string index = c.index_file ? c.index_file->string() : std::string();
  for (const auto& [tensor, shard] : idx.weight_map) {
    const auto* loc = c.find(tensor);
    if (!loc || loc->shard != shard)
      throw_error<checkpoint_error>("checkpoint index '", index, "' places tensor '", tensor, "' in '", idx.shard_names[shard],
                                    "', which does not hold it",
                                    loc ? concat(" (it is in '", c.shard_files[loc->shard].filename().string(), "')") : std::string(),
                                    "; the index is stale: re-download the checkpoint");
  }
  if (idx.weight_map.size() != c.locations.size())
    for (const auto& name : c.tensor_names)
      if (!idx.weight_map.count(std::string(name)))
        throw_error<checkpoint_error>("shard '", c.shard_files[c.find(name)->shard].filename().string(), "' holds tensor '", name,
                                      "', which checkpoint index '", index, "' does not list; the index is stale: re-download the checkpoint");
}
}  // namespace detail

/// @brief Resolves a checkpoint path and reads every shard's header.
/// @param path a `.safetensors` file; a `*.index.json`; or a folder holding exactly one
///        `*.safetensors.index.json` (used when present) or else one or more `*.safetensors` files
/// @return the tensors and where each lives
/// @throws accel::checkpoint_error when the path does not exist, a folder holds no safetensors file
///         or several indexes, a header is invalid, a tensor is stored twice, or the index
///         disagrees with the shards (a listed tensor missing, or a stored one unlisted: stale index)
[[nodiscard]] inline Checkpoint resolve_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (ec)  // a symbolic link loop (ELOOP), a component that is not a folder, no permission
      detail::throw_error<checkpoint_error>("checkpoint path '", path.string(), "' cannot be resolved: ", ec.message(),
                                            ec == std::errc::too_many_symbolic_link_levels ? " (a symbolic link loop)" : "",
                                            "; fix the link or pass the real path");
    detail::throw_error<checkpoint_error>("checkpoint path '", path.string(), "' does not exist; pass a .safetensors file, "
                                          "a model.safetensors.index.json or a folder holding them");
  }
  Checkpoint c;
  fs::path index;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    c.directory = path;
    std::vector<fs::path> indexes;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const auto name = e.path().filename().string();
      const bool wanted = name.ends_with(".safetensors.index.json") || name.ends_with(".safetensors");
      std::error_code fec;
      const bool regular = e.is_regular_file(fec);
      if (fec && wanted)
        detail::throw_error<checkpoint_error>("checkpoint file '", e.path().string(), "' cannot be resolved: ", fec.message(),
                                              fec == std::errc::too_many_symbolic_link_levels ? " (a symbolic link loop)" : "",
                                              "; fix or remove the link");
      if (!regular && wanted) {  // a FIFO, a device or a folder named like a checkpoint file: say what it is
        struct stat st {};
        if (::stat(e.path().c_str(), &st) == 0)
          detail::throw_error<checkpoint_error>("checkpoint file '", e.path().string(), "' is ", detail::file_kind(st.st_mode),
                                                ", not a file; remove it or pass the checkpoint's files");
      }
      if (!regular) continue;
      if (name.ends_with(".safetensors.index.json")) indexes.push_back(e.path());
      else if (name.ends_with(".safetensors")) files.push_back(e.path());
    }
    if (ec) detail::throw_error<checkpoint_error>("cannot list folder '", path.string(), "': ", ec.message());
    std::sort(indexes.begin(), indexes.end());
    std::sort(files.begin(), files.end());
    if (indexes.size() > 1) {
      std::string names;
      for (const auto& i : indexes) names += (names.empty() ? "" : ", ") + i.filename().string();
      detail::throw_error<checkpoint_error>("folder '", path.string(), "' holds ", indexes.size(), " checkpoint indexes (",
                                            names, "); pass the one to use");
    }
    if (indexes.size() == 1) index = indexes.front();
    else if (files.empty())
      detail::throw_error<checkpoint_error>("folder '", path.string(), "' holds no .safetensors file and no "
                                            "model.safetensors.index.json; convert the checkpoint to safetensors");
  } else if (path.filename().string().ends_with(".json")) {
    index = path;
    c.directory = path.parent_path();
  } else {
    files.push_back(path);
    c.directory = path.parent_path();
  }
  if (!index.empty()) {
    // The common index (plain ASCII, each field in its usual form) is only summarized: its shards' headers must give the
    // same (tensor, shard) pairs, which a fingerprint compares; when they do not, or for any other
    // index, the index is read whole and compared name by name, which says what differs.
    const MappedFile mapped(index, "checkpoint index");  // megabytes for large models: mapped, not copied
    const std::string_view text(reinterpret_cast<const char*>(mapped.data()), static_cast<std::size_t>(mapped.size()));
    detail::IndexSummary summary;
    std::optional<SafetensorsIndex> full;
    // In a folder the index almost always lists the folder's .safetensors files: their headers
    // are read while the index is summarized, and those it lists are used (the first listed shard
    // in order that could not be read throws, as reading them afterwards would); when it lists a
    // file outside them, they are set aside and the listed shards read.
    bool summarized = false;
    std::vector<SafetensorsHeader> early;  // parallel to the index's shard names once matched
    std::vector<std::vector<std::uint64_t>> hashes;
    if (files.size() >= 8) {
      std::vector<std::exception_ptr> failed;
      std::vector<std::vector<std::uint64_t>> read_hashes;
      auto read = detail::read_shard_headers(files, read_hashes, failed, [&] { summarized = detail::summarize_plain_index(text, summary); });
      std::vector<std::size_t> at;  // listed shard -> position in `files` (both sorted)
      for (std::size_t i = 0, j = 0; summarized && i < summary.shard_names.size(); ++i) {
        const auto shard = c.directory / summary.shard_names[i];
        while (j < files.size() && files[j] < shard) ++j;
        if (j == files.size() || files[j] != shard || detail::unsafe_shard_name(summary.shard_names[i])) break;
        at.push_back(j);
      }
      if (summarized && at.size() == summary.shard_names.size()) {
        for (const auto j : at)
          if (failed[j]) std::rethrow_exception(failed[j]);
        for (const auto j : at) {
          early.push_back(std::move(read[j]));
          hashes.push_back(std::move(read_hashes[j]));
        }
      }
    } else {
      summarized = detail::summarize_plain_index(text, summary);
    }
    if (!summarized) full = parse_safetensors_index(text, index.string());
    else
      for (const auto& shard : summary.shard_names)
        if (detail::unsafe_shard_name(shard)) (void)parse_safetensors_index(text, index.string());  // throws, naming it
    const auto& shard_names = full ? full->shard_names : summary.shard_names;
    if (early.empty()) detail::check_shards_exist(index, shard_names);  // the early read found each one in the folder
    c.index_file = index;
    detail::PairPrint pairs;
    std::vector<fs::path> listed;  // the index's shards (the folder may hold other files)
    for (const auto& shard : shard_names) listed.push_back(c.directory / shard);
    auto headers = early.empty() ? detail::read_shard_headers(listed, hashes) : std::move(early);
    detail::reserve_tensors(c, headers);
    for (std::size_t i = 0; i < listed.size(); ++i)
      detail::add_shard(c, listed[i], std::move(headers[i]), hashes[i], &pairs, detail::name_hash(shard_names[i]));
    if (!full && pairs != summary.pairs) full = parse_safetensors_index(text, index.string());
    if (full) detail::check_index_matches(c, *full);
  } else {
    std::vector<std::vector<std::uint64_t>> hashes;
    auto headers = detail::read_shard_headers(files, hashes);
    detail::reserve_tensors(c, headers);
    for (std::size_t i = 0; i < files.size(); ++i) detail::add_shard(c, files[i], std::move(headers[i]), hashes[i]);
  }
  // Anything named config.json counts (a FIFO, a folder, a link to a device or to nothing): reading
  // it then says what is wrong instead of planning as if the model had no config.
  if (fs::path cfg = c.directory / "config.json"; fs::exists(fs::symlink_status(cfg, ec))) c.config_file = cfg;
  return c;
}
///@}

ACCEL_NAMESPACE_END
