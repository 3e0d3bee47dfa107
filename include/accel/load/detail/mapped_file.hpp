// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file mapped_file.hpp
/// @brief POSIX file helpers for the loader: atomic file writes (temp file + fdatasync + rename),
///        and the memory map and positional reads of runtime/mapped_file.hpp.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
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
};

/// @brief The temporary name write_file_atomic uses for `path`: `<path>.tmp.<pid>`.
inline std::filesystem::path temporary_path(const std::filesystem::path& path) {
  return std::filesystem::path(path.string() + ".tmp." + std::to_string(::getpid()));
}

/// @brief True for a name write_file_atomic leaves behind when killed: `<anything>.tmp.<digits>`.
inline bool is_temporary_name(std::string_view name) noexcept {
  const auto at = name.rfind(".tmp.");
  if (at == std::string_view::npos || at + 5 == name.size()) return false;
  for (char c : name.substr(at + 5))
    if (c < '0' || c > '9') return false;
  return true;
}

/// @brief Writes `parts` (in order) to `path` atomically: a temp file in the same folder, flushed
///        to the disk (fdatasync), then renamed over `path`; on any failure the temp file is
///        removed, `path` is untouched, and the failing step and errno are returned.
[[nodiscard]] inline std::optional<WriteFailure> try_write_file_atomic(const std::filesystem::path& path,
                                                                       std::span<const std::span<const std::byte>> parts) {
  const auto tmp = temporary_path(path);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return WriteFailure{"create", errno};
  auto fail = [&](const char* step, int err) {
    fd.reset();
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
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
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename into place", errno);
  return std::nullopt;
}

/// @brief try_write_file_atomic, throwing.
/// @throws accel::config_error naming the file, the step and the system error (e.g. no space left)
inline void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> parts) {
  if (auto f = try_write_file_atomic(path, parts))
    throw_error<config_error>("cannot ", f->step, " '", f->step == std::string_view("create") ? temporary_path(path).string() : path.string(),
                              "': ", std::strerror(f->error),
                              f->out_of_space() ? "; free disk space or choose another offload folder"
                                                : "; check that the offload folder is writable");
}

/// @brief Flushes a folder's entries (renames, removals) to the disk; best effort.
inline void sync_directory(const std::filesystem::path& folder) noexcept {
  UniqueFd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() >= 0) (void)::fsync(fd.get());
}

}  // namespace detail
ACCEL_NAMESPACE_END
