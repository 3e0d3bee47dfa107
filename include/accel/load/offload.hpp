// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file offload.hpp
/// @brief Offload folders in accelerate's format: `index.json` mapping each tensor name to
///        `{"dtype": <numpy/torch name>, "shape": [...]}` and one raw C-order `<name>.dat` per
///        tensor (bfloat16 stored as its 16-bit patterns, 0-d tensors as one element with shape []).
///
/// Differences from accelerate, all compatible with its reader: files are written atomically
/// (temp + fdatasync + rename), entries carry an extra `accel_source` fingerprint so a stale entry
/// (same shape, different source) is detected and rewritten instead of trusted, and reading
/// memory-maps the `.dat` instead of copying it on every access. Entries written by transformers
/// (`safetensors_file` + `weight_name`) are read straight from the named shard. The loader writes
/// a folder through detail::OffloadFolderWriter (detail/offload_writer.hpp), which journals each
/// finished file so a killed or failed load leaves an index that vouches only for complete files.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/runtime/unique_fd.hpp>
#include <accel/model/dtype.hpp>
#include <accel/model/json.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/load/detail/mapped_file.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief One entry of an offload folder's index.json.
struct OffloadEntry {
  DType dtype = DType::F32;          ///< element type ("bfloat16" entries hold 16-bit patterns)
  std::vector<std::int64_t> shape;   ///< as recorded ([] for a scalar)
  std::string source;                ///< accel's `accel_source` fingerprint, "" when absent
  std::string safetensors_file;      ///< transformers-style entry: the shard holding the tensor
  std::string weight_name;           ///< transformers-style entry: the tensor's name in that shard

  /// @brief Elements (1 for a scalar).
  [[nodiscard]] std::uint64_t numel() const noexcept { return shape_numel(shape); }
  /// @brief Bytes of the `.dat` file.
  [[nodiscard]] std::uint64_t size_bytes() const { return tensor_bytes(dtype, numel()).value_or(0); }
};

/// @brief An offload index: tensor name → entry.
using OffloadIndex = std::map<std::string, OffloadEntry>;

/// @brief Longest tensor name an offload folder stores: `<name>.dat.tmp.<pid>` must fit a file
///        name (255 bytes on Linux file systems).
inline constexpr std::size_t offload_name_max = 255 - std::string_view(".dat.tmp.4194304").size();

/// @brief Why tensor `name` cannot be stored as `<name>.dat` in an offload folder, or nullopt
///        when it can: empty, ".", "..", a '/' (a sub-folder), a NUL byte (the file system would
///        cut the name there, so two tensors could share one file), or longer than offload_name_max.
[[nodiscard]] inline std::optional<std::string> offload_name_problem(std::string_view name) {
  if (name.empty()) return "it is empty";
  if (name == "." || name == "..") return "it is '.' or '..'";
  if (name.find('/') != std::string_view::npos) return "it contains '/'";
  if (name.find('\0') != std::string_view::npos) return "it contains a NUL byte";
  if (name.size() > offload_name_max)
    return detail::concat("it is ", name.size(), " bytes long, more than the ", offload_name_max, " a file name allows");
  return std::nullopt;
}

/// @brief The `.dat` file of tensor `name` (dots kept in the file name, as accelerate does).
/// @throws accel::usage_error when the name cannot be a flat file name (see offload_name_problem)
[[nodiscard]] inline std::filesystem::path offload_file(const std::filesystem::path& folder, std::string_view name) {
  if (auto why = offload_name_problem(name))
    detail::throw_error<usage_error>("tensor name '", text::printable(name), "' cannot be stored in an offload folder: ", *why,
                                     " (it must be a flat file name without '/' or NUL)");
  return folder / (std::string(name) + ".dat");
}

namespace detail {

// One index.json entry; `fail` throws.
template <class Fail>
OffloadEntry parse_offload_entry(const std::string& name, const nlohmann::json& v, Fail&& fail) {
  const auto who = [&] { return concat("entry '", text::printable(name), "'"); };
  if (!v.is_object()) fail(concat(who(), " is not an object"));
  OffloadEntry e;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) fail(concat(who(), " has no string 'dtype'"));
  auto d = try_dtype_from_string(dt->get_ref<const std::string&>());
  if (!d) fail(concat(who(), " has unknown dtype ", json_excerpt(*dt)));
  e.dtype = *d;
  if (auto sf = v.find("safetensors_file"); sf != v.end() && sf->is_string()) {
    e.safetensors_file = sf->get<std::string>();
    auto wn = v.find("weight_name");
    e.weight_name = wn != v.end() && wn->is_string() ? wn->get<std::string>() : name;
  } else {
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) fail(concat(who(), " has no 'shape' list"));
    std::uint64_t numel = 1;
    for (const auto& x : *sh) {
      if (!x.is_number_unsigned() || x.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
        fail(concat(who(), " has shape element ", json_excerpt(x), ", not a non-negative integer"));
      const auto dim = x.get<std::uint64_t>();
      if (dim != 0 && numel > UINT64_MAX / dim) fail(concat(who(), " has a shape whose element count overflows 64 bits"));
      numel *= dim;
      e.shape.push_back(static_cast<std::int64_t>(dim));
    }
    if (!tensor_bytes(e.dtype, numel)) fail(concat(who(), " has a shape whose byte size overflows 64 bits"));
  }
  if (auto src = v.find("accel_source"); src != v.end() && src->is_string()) e.source = src->get<std::string>();
  return e;
}

}  // namespace detail

/// @brief What clean_offload_folder removed from a folder.
struct FolderCleanup {
  std::size_t temporaries = 0;      ///< files `*.tmp.<pid>` an interrupted writer left
  std::vector<std::string> links;   ///< symbolic links in the writer's names, as "name -> target"
  /// @brief A warning naming the links removed (at most three), or "" when none was.
  [[nodiscard]] std::string links_warning(const std::filesystem::path& folder) const {
    if (links.empty()) return {};
    std::string list;
    for (std::size_t i = 0; i < links.size() && i < 3; ++i) list += (i ? ", " : "") + links[i];
    if (links.size() > 3) list += detail::concat(" and ", links.size() - 3, " more");
    return detail::concat("removed ", text::plural(static_cast<long long>(links.size()), "symbolic link"), " from folder '",
                          folder.string(), "' (", list, "): accel never creates links there and does not write through them; "
                          "someone else can write to this folder, so keep it private");
  }
};

namespace detail {
/// @brief The journal beside index.json (accelerate reads only index.json and the `.dat` files).
inline constexpr std::string_view offload_journal_name = "index.json.journal";

/// @brief True for the names an offload writer creates in its folder: index.json, its journal,
///        `*.dat` and temporaries.
inline bool offload_folder_name(std::string_view name) noexcept {
  return name == "index.json" || name == offload_journal_name || is_temporary_name(name) ||
         (name.size() > 4 && name.substr(name.size() - 4) == ".dat");
}

// clean_offload_folder of the folder open as `dir`.
inline FolderCleanup clean_offload_folder(int dir, const std::filesystem::path& folder) {
  FolderCleanup out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    if (!offload_folder_name(name)) continue;
    struct stat st {};
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool link = S_ISLNK(st.st_mode);
    if (!link && !(is_temporary_name(name) && S_ISREG(st.st_mode))) continue;
    std::string target(4096, '\0');
    const ssize_t n = link ? ::readlinkat(dir, name.c_str(), target.data(), target.size()) : -1;
    target.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    if (::unlinkat(dir, name.c_str(), 0) != 0)
      throw_error<config_error>("cannot remove '", text::printable(name), "' from folder '", folder.string(), "': ", std::strerror(errno),
                                "; remove it by hand (accel never creates ", link ? "links" : "it", " there)");
    if (link)
      out.links.push_back(concat(text::printable(name), " -> ", text::printable(target)));
    else
      ++out.temporaries;
  }
  if (ec) throw_error<config_error>("cannot list folder '", folder.string(), "': ", ec.message());
  return out;
}
}  // namespace detail

/// @brief Removes from an offload (or dump) folder what a writer must not find among its own names
///        (index.json, its journal, `*.dat`, temporaries): every temporary an interrupted writer
///        left (`*.tmp.<pid>`, a file or a link) and every symbolic link. Links are removed, never
///        followed: a link planted by another user of the folder would otherwise send a write or
///        an append outside it. The load layer calls it before writing into a folder.
/// @throws accel::config_error when the folder cannot be opened, listed or an entry removed
[[nodiscard]] inline FolderCleanup clean_offload_folder(const std::filesystem::path& folder) {
  const detail::UniqueFd dir = detail::open_folder(folder);
  if (dir.get() < 0)
    detail::throw_error<config_error>("cannot open folder '", folder.string(), "': ", std::strerror(errno),
                                      "; check that it exists and is writable");
  return detail::clean_offload_folder(dir.get(), folder);
}

/// @brief Parses index.json text.
/// @throws accel::checkpoint_error for invalid JSON (including duplicate keys and nesting deeper
///         than json_max_depth), an entry that is not an object, an unknown dtype or a shape that
///         is not a list of non-negative integers (naming the entry)
[[nodiscard]] inline OffloadIndex parse_offload_index(std::string_view text, std::string_view label) {
  auto fail = [&](const std::string& what) {
    detail::throw_error<checkpoint_error>("invalid offload index '", label, "': ", what,
                                          "; delete the offload folder so it is rebuilt");
  };
  auto parsed = parse_json_strict(text);
  if (!parsed.error.empty()) fail("not valid JSON: " + parsed.error);
  const auto& j = parsed.value;
  if (!j.is_object()) fail(detail::concat("a JSON ", j.type_name(), ", not an object"));
  OffloadIndex out;
  for (const auto& [name, v] : j.items()) out.emplace(name, detail::parse_offload_entry(name, v, fail));
  return out;
}

/// @brief Reads `<folder>/index.json`; an absent file is an empty index.
/// @throws accel::checkpoint_error as parse_offload_index, or when the file cannot be read
[[nodiscard]] inline OffloadIndex read_offload_index(const std::filesystem::path& folder) {
  const auto path = folder / "index.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  return parse_offload_index(read_text_file(path, "offload index"), path.string());
}

namespace detail {
// The index as a JSON object, entries in name order, accelerate's keys first.
inline nlohmann::ordered_json offload_index_object(const OffloadIndex& index) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, e] : index) {
    nlohmann::ordered_json v;
    if (!e.safetensors_file.empty()) {
      v["safetensors_file"] = e.safetensors_file;
      v["weight_name"] = e.weight_name;
      v["dtype"] = std::string(torch_name(e.dtype));
    } else {
      v["dtype"] = std::string(numpy_name(e.dtype));
      v["shape"] = e.shape;
    }
    if (!e.source.empty()) v["accel_source"] = e.source;
    j[name] = std::move(v);
  }
  return j;
}
}  // namespace detail

/// @brief The index as accelerate writes it (2-space indent).
[[nodiscard]] inline std::string offload_index_json(const OffloadIndex& index) {
  return detail::offload_index_object(index).dump(2);
}

namespace detail {
// Replaces index.json of `folder` (open as `dir`, see try_write_file_at) with exactly `index`,
// atomically (no merge: the caller holds the whole index).
inline void write_whole_offload_index(int dir, const std::filesystem::path& folder, const OffloadIndex& index) {
  const std::string text = offload_index_json(index);
  const std::span<const std::byte> part(reinterpret_cast<const std::byte*>(text.data()), text.size());
  if (auto f = try_write_file_at(dir, "index.json", std::span<const std::span<const std::byte>>(&part, 1)))
    throw_error<config_error>("cannot ", f->step, " the index of offload folder '", folder.string(), "': ", std::strerror(f->error),
                              f->advice());
}
inline void write_whole_offload_index(const std::filesystem::path& folder, const OffloadIndex& index) {
  const UniqueFd dir = open_folder(folder);
  if (dir.get() < 0)
    throw_error<config_error>("cannot open offload folder '", folder.string(), "': ", std::strerror(errno),
                              "; check that it exists and is writable");
  write_whole_offload_index(dir.get(), folder, index);
}
}  // namespace detail

/// @brief Merges `entries` into `<folder>/index.json` (existing keys kept, given keys replaced, as
///        accelerate does) and writes it atomically.
/// @throws accel::checkpoint_error when the existing index is invalid; accel::config_error when
///         the write fails
inline void write_offload_index(const std::filesystem::path& folder, const OffloadIndex& entries) {
  OffloadIndex merged = read_offload_index(folder);
  for (const auto& [name, e] : entries) merged[name] = e;
  detail::write_whole_offload_index(folder, merged);
}

/// @brief Writes one tensor's `.dat` atomically and records it in `index` (call
///        write_offload_index afterwards to persist the index).
/// @param folder created when missing
/// @param data exactly product(shape) × element size bytes
/// @param source fingerprint of where the bytes came from (stale detection); may be empty
/// @throws accel::usage_error when data has the wrong size or the name cannot be a file name;
///         accel::config_error when the folder cannot be created or the write fails
inline void offload_weight(const std::filesystem::path& folder, const std::string& name, DType dtype,
                           const std::vector<std::int64_t>& shape, std::span<const std::byte> data, OffloadIndex& index,
                           std::string source = {}) {
  OffloadEntry e{dtype, shape, std::move(source), {}, {}};
  ACCEL_EXPECTS(data.size() == e.size_bytes(), "offload_weight('", name, "'): ", data.size(), " bytes given, shape needs ",
                e.size_bytes());
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec)
    detail::throw_error<config_error>("cannot create offload folder '", folder.string(), "': ", ec.message(),
                                      "; choose a writable offload folder");
  detail::write_file_atomic(offload_file(folder, name), std::span<const std::span<const std::byte>>(&data, 1));
  index[name] = std::move(e);
}

/// @brief True when `index` holds `name` with this dtype, shape and source fingerprint and its
///        `.dat` file has the right size: the entry can be reused instead of rewritten.
/// @note An entry without a fingerprint (written by another tool) is never reused when a source is given.
[[nodiscard]] inline bool offload_entry_reusable(const std::filesystem::path& folder, const OffloadIndex& index,
                                                 const std::string& name, DType dtype,
                                                 const std::vector<std::int64_t>& shape, const std::string& source) {
  auto it = index.find(name);
  if (it == index.end() || !it->second.safetensors_file.empty()) return false;
  const auto& e = it->second;
  if (e.dtype != dtype || e.shape != shape || e.source != source) return false;
  std::error_code ec;
  const auto size = std::filesystem::file_size(offload_file(folder, name), ec);
  return !ec && size == e.size_bytes();
}

/// @brief Read access to an offload folder: `.dat` files (and transformers-style shard entries)
///        are memory-mapped on first use and kept mapped; views stay valid while the folder lives.
class OffloadFolder {
 public:
  /// @brief Opens a folder and reads its index.
  /// @throws accel::checkpoint_error when index.json is invalid
  explicit OffloadFolder(std::filesystem::path folder) : folder_(std::move(folder)), index_(read_offload_index(folder_)) {}
  /// @brief Opens a folder whose index the caller already holds (read once, then kept up to date).
  OffloadFolder(std::filesystem::path folder, OffloadIndex index) : folder_(std::move(folder)), index_(std::move(index)) {}

  /// @brief The index: tensor name → entry.
  [[nodiscard]] const OffloadIndex& index() const noexcept { return index_; }
  /// @brief The folder.
  [[nodiscard]] const std::filesystem::path& folder() const noexcept { return folder_; }

  /// @brief The bytes of tensor `name` (raw, in the entry's dtype).
  /// @throws accel::checkpoint_error when the name is not in the index, the file is missing, or
  ///         its size disagrees with the entry
  [[nodiscard]] std::span<const std::byte> view(const std::string& name) {
    std::lock_guard lock(mutex_);
    if (auto it = views_.find(name); it != views_.end()) return it->second;
    auto e = index_.find(name);
    if (e == index_.end())
      detail::throw_error<checkpoint_error>("offload folder '", folder_.string(), "' has no tensor '", name,
                                            "' in its index.json; delete the folder so it is rebuilt");
    std::span<const std::byte> bytes;
    if (!e->second.safetensors_file.empty()) {
      std::filesystem::path shard = e->second.safetensors_file;
      if (shard.is_relative()) shard = folder_ / shard;
      auto header = read_safetensors_header(shard);
      const auto* t = header.find(e->second.weight_name);
      if (!t)
        detail::throw_error<checkpoint_error>("offload entry '", name, "' points at tensor '", e->second.weight_name,
                                              "' of '", shard.string(), "', which does not hold it");
      auto& map = maps_.emplace_back(std::make_unique<MappedFile>(shard));
      bytes = map->bytes().subspan(header.file_offset(*t), t->size_bytes());
    } else {
      const auto path = offload_file(folder_, name);
      auto map = std::make_unique<MappedFile>(path);
      if (map->size() != e->second.size_bytes())
        detail::throw_error<checkpoint_error>("offload file '", path.string(), "' is ", map->size(), " bytes but index.json says ",
                                              numpy_name(e->second.dtype), " ", detail::shape_text(e->second.shape), " = ",
                                              e->second.size_bytes(), " bytes; delete the offload folder so it is rebuilt");
      bytes = map->bytes();
      maps_.push_back(std::move(map));
    }
    views_.emplace(name, bytes);
    return bytes;
  }

 private:
  std::filesystem::path folder_;
  OffloadIndex index_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<MappedFile>> maps_;
  std::map<std::string, std::span<const std::byte>> views_;
};

ACCEL_NAMESPACE_END
