// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file mapped_file.hpp
/// @brief POSIX file helpers for the loader: a read-only memory map (RAII), positional reads that
///        retry short reads, and atomic file writes (temp file + fsync + rename).
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
#include <span>
#include <string>
#include <utility>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/unique_fd.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Reads exactly `out.size()` bytes at `offset`, retrying short reads and EINTR.
/// @throws accel::checkpoint_error when the file ends early or the read fails
inline void pread_exact(int fd, std::span<std::byte> out, std::uint64_t offset, const std::filesystem::path& label) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw_error<checkpoint_error>("cannot read '", label.string(), "' at offset ", offset + done, ": ", std::strerror(errno));
    if (n == 0)
      throw_error<checkpoint_error>("'", label.string(), "' ended at offset ", offset + done, " while reading ", out.size(),
                                    " bytes at ", offset, "; the file was truncated after its header was checked");
    done += static_cast<std::size_t>(n);
  }
}

/// @brief A whole file mapped read-only (MAP_SHARED: pages come from the page cache, no copy).
class MappedFile {
 public:
  MappedFile() = default;
  /// @throws accel::checkpoint_error naming the file and the system error
  explicit MappedFile(const std::filesystem::path& path) : path_(path) {
    fd_ = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd_.get() < 0)
      throw_error<checkpoint_error>("cannot open '", path.string(), "': ", std::strerror(errno), "; check the path and permissions");
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0)
      throw_error<checkpoint_error>("cannot stat '", path.string(), "': ", std::strerror(errno));
    size_ = static_cast<std::uint64_t>(st.st_size);
    mtime_ns_ = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_.get(), 0);
    if (p == MAP_FAILED)
      throw_error<checkpoint_error>("cannot map '", path.string(), "' (", size_, " bytes): ", std::strerror(errno));
    data_ = static_cast<const std::byte*>(p);
  }
  MappedFile(MappedFile&& o) noexcept { swap(o); }
  MappedFile& operator=(MappedFile&& o) noexcept {
    MappedFile(std::move(o)).swap(*this);
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  void swap(MappedFile& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(fd_, o.fd_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(mtime_ns_, o.mtime_ns_);
  }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, static_cast<std::size_t>(size_)}; }
  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint64_t mtime_ns() const noexcept { return mtime_ns_; }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// @brief Reads exactly `out.size()` bytes at `offset` with pread (see pread_exact).
  void read_exact(std::span<std::byte> out, std::uint64_t offset) const { pread_exact(fd_.get(), out, offset, path_); }
  /// @brief Tells the kernel the range will be read sequentially soon (readahead).
  void advise_sequential(std::uint64_t offset, std::uint64_t length) const noexcept {
    if (!data_ || length == 0) return;
    const std::uint64_t page = 4096, start = offset & ~(page - 1);
    (void)::madvise(const_cast<std::byte*>(data_) + start, length + (offset - start), MADV_SEQUENTIAL);
    (void)::madvise(const_cast<std::byte*>(data_) + start, length + (offset - start), MADV_WILLNEED);
  }

 private:
  std::filesystem::path path_;
  UniqueFd fd_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t mtime_ns_ = 0;
};

/// @brief Writes `parts` (in order) to `path` atomically: a temp file in the same folder, fsync,
///        then rename over `path`; on any failure the temp file is removed and `path` is untouched.
/// @throws accel::checkpoint_error naming the file and the system error (e.g. no space left)
inline void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const std::byte>> parts) {
  const auto tmp = std::filesystem::path(path.string() + ".tmp." + std::to_string(::getpid()));
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0)
    throw_error<checkpoint_error>("cannot create '", tmp.string(), "': ", std::strerror(errno),
                                  "; check that the offload folder is writable");
  auto fail = [&](const char* what, int err) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw_error<checkpoint_error>("cannot ", what, " '", path.string(), "': ", std::strerror(err),
                                  "; free disk space or choose another offload folder");
  };
  for (auto part : parts) {
    std::size_t done = 0;
    while (done < part.size()) {
      const ssize_t n = ::write(fd.get(), part.data() + done, part.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write", n < 0 ? errno : ENOSPC);
      done += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd.get()) != 0) fail("flush", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename into place", errno);
}

}  // namespace detail
ACCEL_NAMESPACE_END
