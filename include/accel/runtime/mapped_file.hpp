// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file mapped_file.hpp
/// @brief POSIX file reading for the layers that read checkpoints (model, load): a read-only
///        memory map (RAII) and positional reads that retry short reads and report a file that
///        shrank.
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
#include <string_view>
#include <utility>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/unique_fd.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {
/// @brief What a file that is not a regular file is, for messages ("a FIFO (named pipe)").
inline const char* file_kind(mode_t mode) noexcept {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// @brief Opens an existing file for reading, refusing anything but a regular file. The open does
///        not block (a FIFO would wait for a writer forever), and fstat of the open descriptor
///        decides (a device such as /dev/zero would be read until memory runs out; a folder has no
///        bytes), so a link swapped between the check and the read changes nothing.
/// @param what what the file is, for messages ("model config", "safetensors file")
/// @param st filled with the file's fstat
/// @throws accel::checkpoint_error naming `what`, the path and why ("it is a FIFO (named pipe), not
///         a regular file"; a missing file, a dangling link or no permission with the system's words)
inline UniqueFd open_regular_file(const std::filesystem::path& path, std::string_view what, struct stat& st) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    const int open_error = errno;
    if (::stat(path.c_str(), &st) != 0)  // missing, a dangling link, a loop
      throw_error<checkpoint_error>("cannot read ", what, " '", path.string(), "': ", std::strerror(errno), "; check the path");
    throw_error<checkpoint_error>("cannot open ", what, " '", path.string(), "': ", std::strerror(open_error),
                                  "; check the path and its permissions");
  }
  if (::fstat(fd.get(), &st) != 0)
    throw_error<checkpoint_error>("cannot read ", what, " '", path.string(), "': ", std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw_error<checkpoint_error>("cannot read ", what, " '", path.string(), "': it is ", file_kind(st.st_mode),
                                  ", not a file; check the path");
  return fd;
}
}  // namespace detail

/// @brief The current size of an open file, or -1 when fstat fails.
inline std::int64_t current_file_size(int fd) noexcept {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<std::int64_t>(st.st_size) : -1;
}

/// @brief Reads up to `out.size()` bytes at `offset`, retrying short reads and EINTR.
/// @return the bytes read: all of them, or fewer where the file ended (`error` 0) or a read
///         failed (`error` its errno)
inline std::size_t pread_full(int fd, std::span<std::byte> out, std::uint64_t offset, int& error) noexcept {
  std::size_t done = 0;
  error = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = errno;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

/// @brief Reads exactly `out.size()` bytes at `offset`, retrying short reads and EINTR.
/// @param expected_size the file's size when its header was checked (for the message when it shrank)
/// @throws accel::checkpoint_error when the file ends early (naming the file, the size it had and
///         the size it has now) or the read fails
inline void pread_exact(int fd, std::span<std::byte> out, std::uint64_t offset, const std::filesystem::path& label,
                        std::uint64_t expected_size) {
  int error = 0;
  const std::size_t done = pread_full(fd, out, offset, error);
  if (done < out.size()) {
    if (error)
      detail::throw_error<checkpoint_error>("cannot read '", label.string(), "' at offset ", offset + done, ": ", std::strerror(error));
    detail::throw_error<checkpoint_error>("'", label.string(), "' shrank while it was being read: it was ", expected_size,
                                          " bytes when its header was checked and is now ", current_file_size(fd),
                                          " bytes (it ended at offset ", offset + done, "); something truncated or rewrote it: "
                                          "load again once the file is complete");
  }
}

/// @brief A whole file mapped read-only (MAP_SHARED: pages come from the page cache, no copy).
class MappedFile {
 public:
  MappedFile() = default;
  /// @throws accel::checkpoint_error naming the file and the system error, or saying that it is
  ///         not a regular file (a FIFO, a device, a folder: see detail::open_regular_file)
  /// @param what what the file is, for messages ("checkpoint index")
  explicit MappedFile(const std::filesystem::path& path, std::string_view what = "file") : path_(path) {
    struct stat st {};
    fd_ = detail::open_regular_file(path, what, st);
    size_ = static_cast<std::uint64_t>(st.st_size);
    mtime_ns_ = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
    dev_ = static_cast<std::uint64_t>(st.st_dev);
    ino_ = static_cast<std::uint64_t>(st.st_ino);
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_.get(), 0);
    if (p == MAP_FAILED)
      detail::throw_error<checkpoint_error>("cannot map '", path.string(), "' (", size_, " bytes): ", std::strerror(errno));
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
    std::swap(dev_, o.dev_);
    std::swap(ino_, o.ino_);
  }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, static_cast<std::size_t>(size_)}; }
  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint64_t mtime_ns() const noexcept { return mtime_ns_; }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// @brief Reads exactly `out.size()` bytes at `offset` with pread (see pread_exact).
  void read_exact(std::span<std::byte> out, std::uint64_t offset) const { pread_exact(fd_.get(), out, offset, path_, size_); }
  /// @brief The file's identity: device and inode numbers (a replaced file has a new inode).
  [[nodiscard]] std::uint64_t device_id() const noexcept { return dev_; }
  [[nodiscard]] std::uint64_t inode() const noexcept { return ino_; }
  /// @brief Tells the kernel the range will be read sequentially soon (readahead).
  void advise_sequential(std::uint64_t offset, std::uint64_t length) const noexcept {
    if (!data_ || length == 0) return;
    const std::uint64_t page = 4096, start = offset & ~(page - 1);
    (void)::madvise(const_cast<std::byte*>(data_) + start, length + (offset - start), MADV_SEQUENTIAL);
    (void)::madvise(const_cast<std::byte*>(data_) + start, length + (offset - start), MADV_WILLNEED);
  }

 private:
  std::filesystem::path path_;
  detail::UniqueFd fd_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t mtime_ns_ = 0;
  std::uint64_t dev_ = 0;
  std::uint64_t ino_ = 0;
};

ACCEL_NAMESPACE_END
