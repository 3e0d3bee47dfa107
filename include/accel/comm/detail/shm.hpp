// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file shm.hpp
/// @brief POSIX shared-memory segments, kept mapped by their owner and by the peers that read them.
///
/// The CPU backend puts large payloads of processes on one machine here: the owner writes once
/// into its mapping, every peer decodes straight from its own mapping of the segment, so a
/// payload is copied once on each side instead of travelling through TCP and the store.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/comm/detail/socket.hpp>

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

/// @brief A shared mapping of a shared-memory object, unmapped when its last holder lets go (views
/// handed out in Blobs keep it alive across a remap).
using ShmMapping = std::shared_ptr<std::byte>;

/// @brief Maps `size` bytes of `fd` (pages pre-faulted in one call); null on failure (errno set).
inline ShmMapping map_shared(int fd, std::size_t size, bool writable) noexcept {
  void* p = ::mmap(nullptr, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  try {
    return ShmMapping(static_cast<std::byte*>(p), [size](std::byte* q) { ::munmap(q, size); });
  } catch (...) {  // the control block could not be allocated
    ::munmap(p, size);
    return nullptr;
  }
}

/// @brief A shared-memory segment this process owns and keeps mapped; unlinked on destruction.
///
/// It only grows (peers' mappings of it never lose pages) and is written in place, so a round
/// costs one copy of the payload and no page faults once the segment has reached its size.
class ShmSegment {
 public:
  ShmSegment() = default;
  explicit ShmSegment(std::string name) : name_(std::move(name)) {}
  ShmSegment(ShmSegment&& o) noexcept
      : name_(std::move(o.name_)), fd_(std::move(o.fd_)), map_(std::move(o.map_)), capacity_(std::exchange(o.capacity_, 0)) {
    o.name_.clear();
  }
  ShmSegment& operator=(ShmSegment&&) = delete;
  ~ShmSegment() {
    if (fd_) ::shm_unlink(name_.c_str());
  }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// @brief The mapping (null before the first write()).
  [[nodiscard]] const ShmMapping& mapping() const noexcept { return map_; }

  /// @brief Writes `head` then `body` at offset 0, growing the segment as needed.
  /// @return false when shared memory is unavailable or full (the caller falls back to TCP)
  bool write(std::span<const std::byte> head, std::span<const std::byte> body) noexcept {
    if (!reserve(head.size() + body.size())) return false;
    if (!head.empty()) std::memcpy(map_.get(), head.data(), head.size());
    if (!body.empty()) std::memcpy(map_.get() + head.size(), body.data(), body.size());
    return true;
  }

  /// @brief Creates the segment (zero-filled) or grows it to hold at least `size` bytes, keeping
  /// what it holds; the mapping may move.
  /// @return false when shared memory is unavailable or full
  bool reserve(std::size_t size) noexcept {
    if (!fd_) {
      fd_.reset(::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
      if (!fd_) return false;
    }
    if (size > capacity_) {
      // Grow by half at least, in 64 KiB steps, so payloads that creep upwards do not remap
      // every round. posix_fallocate reserves the pages now, so a full /dev/shm is an error
      // here, not a SIGBUS later.
      const std::size_t grown = std::max(size, capacity_ + capacity_ / 2);
      const std::size_t want = (grown + 0xFFFFu) & ~std::size_t{0xFFFFu};
      if (::ftruncate(fd_.get(), static_cast<off_t>(want)) != 0 || ::posix_fallocate(fd_.get(), 0, static_cast<off_t>(want)) != 0)
        return false;
      ShmMapping m = map_shared(fd_.get(), want, true);
      if (!m) return false;
      map_ = std::move(m);
      capacity_ = want;
    }
    return true;
  }
  /// @brief Bytes the segment holds (0 before the first write() or reserve()).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::string name_;
  Fd fd_;
  ShmMapping map_;
  std::size_t capacity_ = 0;
};

/// @brief The peers' segments this process has mapped, kept between rounds (a segment is
/// remapped only when it has grown past the mapped size).
class ShmPeerMappings {
 public:
  /// @brief The first `size` bytes of rank `owner_rank`'s segment `name`.
  /// @throws comm_error naming the segment and rank when it is missing, shorter than `size` or cannot be mapped
  std::pair<std::span<const std::byte>, ShmMapping> view(const std::string& name, std::size_t size, int owner_rank) {
    Entry& e = maps_[name];
    if (!e.map || e.size < size) {
      Fd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0));
      if (!fd)
        throw_error<comm_error>("cannot open rank ", owner_rank, "'s shared-memory segment ", name, ": ", os_error_text(errno),
                                "; set ACCEL_CPU_SHM=0 to send payloads over TCP instead");
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) < size)
        throw_error<comm_error>("rank ", owner_rank, "'s shared-memory segment ", name, " holds ", st.st_size, " bytes, ", size,
                                " expected");
      ShmMapping m = map_shared(fd.get(), static_cast<std::size_t>(st.st_size), false);
      if (!m) throw_error<comm_error>("cannot map rank ", owner_rank, "'s shared-memory segment ", name, ": ", os_error_text(errno));
      e.map = std::move(m);
      e.size = static_cast<std::size_t>(st.st_size);
    }
    return {std::span<const std::byte>(e.map.get(), size), e.map};
  }

 private:
  struct Entry {
    ShmMapping map;
    std::size_t size = 0;
  };
  std::map<std::string, Entry> maps_;
};

/// @brief This process's PID namespace (its inode; 0 when /proc does not tell): segment names carry
/// it, so a sweep never mistakes a live process of another container sharing /dev/shm for a dead one.
inline unsigned long pid_namespace_id() noexcept {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long>(st.st_ino) : 0;
}

/// @brief A name unique to this process and call: "/accel.<pid namespace>.<pid>.<counter>".
inline std::string unique_shm_prefix() {
  static std::atomic<unsigned> counter{0};
  return concat("/accel.", pid_namespace_id(), ".", ::getpid(), ".", counter++);
}

/// @brief Unlinks the segments in `dir` that processes of this user and PID namespace left behind
/// when they were killed before they could unlink them (their pid no longer exists). Peers that
/// still map such a segment keep their mapping. Rank 0 of every CPU communicator whose ranks share
/// a machine calls it when the communicator starts.
/// @return how many segments were removed
inline std::size_t remove_stale_shm_segments(const char* dir = "/dev/shm") noexcept {
  const unsigned long ns = pid_namespace_id();
  if (ns == 0) return 0;
  DIR* d = ::opendir(dir);
  if (!d) return 0;
  const std::string mine = concat("accel.", ns, ".");
  std::size_t removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.substr(0, mine.size()) != mine) continue;
    long long pid = 0;
    std::size_t i = mine.size();
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && pid < (1LL << 31); ++i) pid = pid * 10 + (name[i] - '0');
    if (i == mine.size() || i == name.size() || name[i] != '.' || pid <= 0 || pid >= (1LL << 31)) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (EPERM: alive, another user's)
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != ::geteuid()) continue;
    if (::shm_unlink(concat("/", name).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace detail
ACCEL_NAMESPACE_END
