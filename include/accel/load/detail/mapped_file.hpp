// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file mapped_file.hpp
/// @brief POSIX file helpers for the loader: atomic file writes (temp file + fdatasync + rename)
///        relative to the folder's descriptor, following no link, within the file-size limit; and
///        the memory map and positional reads of runtime/mapped_file.hpp.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <accel/runtime/config.hpp>
#include <accel/runtime/mapped_file.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/unique_fd.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Why an atomic write failed: the step ("create", "write", "flush", "rename into place")
///        and the errno.
struct WriteFailure {
  const char* step = "";
  int error = 0;
  /// @brief True for a full disk or quota, or a file-size limit (RLIMIT_FSIZE): more space fixes it.
  [[nodiscard]] bool out_of_space() const noexcept { return error == ENOSPC || error == EFBIG || error == EDQUOT; }
  /// @brief What to do about it, for the end of a message.
  [[nodiscard]] const char* advice() const noexcept {
    return out_of_space() ? "; free disk space (or raise the file-size limit) or choose another offload folder"
                          : "; check that the offload folder is writable";
  }
};

/// @brief The temporary name write_file_atomic uses for `name`: `<name>.tmp.<pid>`.
inline std::string temporary_name(std::string_view name) { return std::string(name) + ".tmp." + std::to_string(::getpid()); }

/// @brief The temporary path write_file_atomic uses for `path`: `<path>.tmp.<pid>`.
inline std::filesystem::path temporary_path(const std::filesystem::path& path) {
  return path.parent_path() / temporary_name(path.filename().string());
}

/// @brief True for a name write_file_atomic leaves behind when killed: `<anything>.tmp.<digits>`.
inline bool is_temporary_name(std::string_view name) noexcept {
  const auto at = name.rfind(".tmp.");
  if (at == std::string_view::npos || at + 5 == name.size()) return false;
  for (char c : name.substr(at + 5))
    if (c < '0' || c > '9') return false;
  return true;
}

/// @brief The soft file-size limit (RLIMIT_FSIZE, `ulimit -f`), or nullopt when there is none. A
///        write past it raises SIGXFSZ, whose default action kills the process, so writers check
///        sizes against it first and report EFBIG instead.
inline std::optional<std::uint64_t> file_size_limit() noexcept {
  struct rlimit r {};
  if (::getrlimit(RLIMIT_FSIZE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<std::uint64_t>(r.rlim_cur);
}

/// @brief Writes `parts` (in order) to the file `name` of the folder open as `dir`, atomically: a
///        temporary in the same folder, flushed to the disk (fdatasync), then renamed over `name`;
///        on any failure the temporary is removed, `name` is untouched, and the failing step and
///        errno are returned.
///
/// Every step is relative to the folder's descriptor and follows no link: the temporary is created
/// with O_EXCL | O_NOFOLLOW (an entry already holding its name, say a link planted by another user
/// of the folder, is removed, never written through: unlinking a link removes the link, not its
/// target), and the rename replaces the entry `name` itself, whatever it was. So the bytes land in
/// this folder and nowhere else. A file larger than the file-size limit is refused before any byte
/// is written (EFBIG, "write").
[[nodiscard]] inline std::optional<WriteFailure> try_write_file_at(int dir, const std::string& name,
                                                                   std::span<const std::span<const std::byte>> parts) {
  std::uint64_t total = 0;
  for (auto part : parts) total += part.size();
  if (const auto limit = file_size_limit(); limit && total > *limit) return WriteFailure{"write", EFBIG};
  const std::string tmp = temporary_name(name);
  constexpr int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  UniqueFd fd(::openat(dir, tmp.c_str(), flags, 0644));
  int open_error = fd.get() < 0 ? errno : 0;
  if (open_error == EEXIST && ::unlinkat(dir, tmp.c_str(), 0) == 0) {
    fd = UniqueFd(::openat(dir, tmp.c_str(), flags, 0644));
    open_error = fd.get() < 0 ? errno : 0;
  }
  if (fd.get() < 0) return WriteFailure{"create", open_error};
  auto fail = [&](const char* step, int err) {
    fd.reset();
    (void)::unlinkat(dir, tmp.c_str(), 0);
    return WriteFailure{step, err};
  };
  for (auto part : parts) {
    std::size_t done = 0;
    while (done < part.size()) {
      const ssize_t n = ::write(fd.get(), part.data() + done, part.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail("write", n < 0 ? errno : ENOSPC);
      done += static_cast<std::size_t>(n);
    }
  }
  if (::fdatasync(fd.get()) != 0) return fail("flush", errno);
  if (::renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) return fail("rename into place", errno);
  return std::nullopt;
}

/// @brief Opens a folder to create files in it with try_write_file_at (the folder itself may be
///        a link: the caller named it).
inline UniqueFd open_folder(const std::filesystem::path& folder) noexcept {
  return UniqueFd(::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
}

/// @brief try_write_file_at for `path`: the file `path.filename()` of the folder `path.parent_path()`.
[[nodiscard]] inline std::optional<WriteFailure> try_write_file_atomic(const std::filesystem::path& path,
                                                                       std::span<const std::span<const std::byte>> parts) {
  const UniqueFd dir = open_folder(path.parent_path());
  if (dir.get() < 0) return WriteFailure{"open the folder of", errno};
  return try_write_file_at(dir.get(), path.filename().string(), parts);
}

/// @brief try_write_file_atomic, throwing.
/// @throws accel::config_error naming the file, the step and the system error (e.g. no space left)
inline void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> parts) {
  if (auto f = try_write_file_atomic(path, parts))
    throw_error<config_error>("cannot ", f->step, " '", f->step == std::string_view("create") ? temporary_path(path).string() : path.string(),
                              "': ", std::strerror(f->error), f->advice());
}

/// @brief Flushes a folder's entries (renames, removals) to the disk; best effort.
inline void sync_directory(const std::filesystem::path& folder) noexcept {
  UniqueFd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() >= 0) (void)::fsync(fd.get());
}

}  // namespace detail
ACCEL_NAMESPACE_END
