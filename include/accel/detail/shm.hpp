// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file shm.hpp
/// @brief POSIX shared-memory segments written and read with pwrite/pread (no mappings to manage).
///
/// The CPU backend puts large payloads of processes on one machine here: the owner writes once,
/// every peer reads once, so a payload crosses memory twice instead of through TCP and the store.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>

#include "../config.hpp"
#include "../error.hpp"
#include "socket.hpp"

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief An identity shared by processes on one running machine: host name + kernel boot id.
inline std::string machine_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return std::string(host) + "/" + boot;
}

/// @brief A shared-memory segment this process owns; unlinked on destruction.
class ShmSegment {
 public:
  ShmSegment() = default;
  explicit ShmSegment(std::string name) : name_(std::move(name)) {}
  ShmSegment(ShmSegment&& o) noexcept : name_(std::move(o.name_)), fd_(std::move(o.fd_)), capacity_(o.capacity_) { o.name_.clear(); }
  ShmSegment& operator=(ShmSegment&&) = delete;
  ~ShmSegment() {
    if (fd_) ::shm_unlink(name_.c_str());
  }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// @brief Writes `data` at offset 0, growing the segment as needed.
  /// @return false when shared memory is unavailable or full (the caller falls back to TCP)
  bool write(std::span<const std::byte> data) noexcept {
    if (!fd_) {
      fd_.reset(::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
      if (!fd_) return false;
    }
    if (data.size() > capacity_) {
      // posix_fallocate reserves the pages now, so a full /dev/shm is an error here, not a SIGBUS later.
      const auto want = static_cast<off_t>(data.size());
      if (::ftruncate(fd_.get(), want) != 0 || ::posix_fallocate(fd_.get(), 0, want) != 0) return false;
      capacity_ = data.size();
    }
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pwrite(fd_.get(), data.data() + done, data.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

 private:
  std::string name_;
  Fd fd_;
  std::size_t capacity_ = 0;
};

/// @brief Reads `out.size()` bytes from another process's segment.
/// @throws comm_error naming the segment and rank when it is missing or short
inline void read_shm(const std::string& name, std::span<std::byte> out, int owner_rank) {
  Fd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0));
  if (!fd)
    throw_error<comm_error>("cannot open rank ", owner_rank, "'s shared-memory segment ", name, ": ", os_error_text(errno),
                            "; set ACCEL_CPU_SHM=0 to send payloads over TCP instead");
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw_error<comm_error>("rank ", owner_rank, "'s shared-memory segment ", name, " holds ", done, " bytes, ", out.size(),
                              " expected");
    done += static_cast<std::size_t>(n);
  }
}

/// @brief Maps `size` bytes of a segment read-only (pages pre-faulted in one call); the mapping
/// lives as long as the returned pointer, which points at the first byte.
/// @throws comm_error naming the segment and rank when it is missing or shorter than `size`
inline std::shared_ptr<const void> map_shm(const std::string& name, std::size_t size, int owner_rank) {
  Fd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0));
  if (!fd)
    throw_error<comm_error>("cannot open rank ", owner_rank, "'s shared-memory segment ", name, ": ", os_error_text(errno),
                            "; set ACCEL_CPU_SHM=0 to send payloads over TCP instead");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) < size)
    throw_error<comm_error>("rank ", owner_rank, "'s shared-memory segment ", name, " holds ", st.st_size, " bytes, ", size, " expected");
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) throw_error<comm_error>("cannot map rank ", owner_rank, "'s shared-memory segment ", name, ": ", os_error_text(errno));
  return std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
}

/// @brief A name unique to this process and call: "/accel.<pid>.<counter>".
inline std::string unique_shm_prefix() {
  static std::atomic<unsigned> counter{0};
  return concat("/accel.", ::getpid(), ".", counter++);
}

}  // namespace detail
ACCEL_NAMESPACE_END
