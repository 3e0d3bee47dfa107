// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file fork_guard.hpp
/// @brief Store sockets that do not live on in a child made by fork() without exec.
///
/// A rank's store connection is its membership: the store tells the others the rank is gone when
/// the connection closes. A child forked without exec (a worker pool, a daemon, Python's
/// multiprocessing) would hold a copy of the socket, so the connection would stay open after the
/// rank died, for as long as the child lives, and nobody would be told. The same goes for the
/// server side when rank 0 hosts the store: a child holding the accepted sockets keeps every other
/// rank's connection open after rank 0 died. Close-on-exec does not help without an exec, and
/// Linux has no close-on-fork flag, so a pthread_atfork child handler replaces every registered
/// descriptor in the child with /dev/null (keeping the number, so the child's copy of the object
/// that owns it closes /dev/null, never a file the child opened since). The child says no goodbye:
/// the socket is simply not the child's.
///
/// Only fork() runs the handlers (posix_spawn and vfork children exec at once; the sockets are
/// close-on-exec). A fork in the instant between a socket's creation and its registration is not
/// covered. Nothing here is public API.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/unique_fd.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief The registry of descriptors that must not survive fork() in the child.
class ForkGuard {
 public:
  /// @brief Registers `fd` (installs the fork handlers on first use).
  static void add(int fd) {
    if (fd < 0) return;
    State& s = state();
    std::call_once(s.installed, [] { ::pthread_atfork(&prepare, &parent, &child); });
    const std::lock_guard lock(s.mutex);
    s.fds.push_back(fd);
  }
  /// @brief Unregisters `fd` and closes it, in one step no fork can come between (a child must
  /// neither keep a socket the parent closed nor lose a descriptor that reused its number).
  static void close(int fd) noexcept {
    if (fd < 0) return;
    State& s = state();
    const std::lock_guard lock(s.mutex);
    if (auto it = std::find(s.fds.begin(), s.fds.end(), fd); it != s.fds.end()) {
      *it = s.fds.back();
      s.fds.pop_back();
    }
    ::close(fd);
  }
  /// @brief Whether `fd` is registered (tests).
  static bool guarded(int fd) {
    State& s = state();
    const std::lock_guard lock(s.mutex);
    return std::find(s.fds.begin(), s.fds.end(), fd) != s.fds.end();
  }

 private:
  struct State {
    std::once_flag installed;
    std::mutex mutex;
    std::vector<int> fds;
  };
  static State& state() {
    static State* s = new State;  // never destroyed: a fork during static destruction still finds it
    return *s;
  }
  // Held across fork(), so the child's copy of the list is complete and its mutex is ours to unlock.
  static void prepare() noexcept { state().mutex.lock(); }
  static void parent() noexcept { state().mutex.unlock(); }
  // The child: async-signal-safe calls only (the parent may have had other threads).
  static void child() noexcept {
    State& s = state();
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd : s.fds) {
      if (null >= 0) ::dup3(null, fd, O_CLOEXEC);
      else ::close(fd);
    }
    if (null >= 0) ::close(null);
    s.fds.clear();
    s.mutex.unlock();
  }
};

/// @brief UniqueFd for a store socket: registered with ForkGuard while it owns a descriptor.
class ForkGuardedFd {
 public:
  ForkGuardedFd() noexcept = default;
  /// @brief Takes `fd` over and registers it.
  explicit ForkGuardedFd(UniqueFd fd) : fd_(fd.get()) {
    ForkGuard::add(fd_);
    (void)fd.release();
  }
  ForkGuardedFd(ForkGuardedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ForkGuardedFd& operator=(ForkGuardedFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ForkGuardedFd(const ForkGuardedFd&) = delete;
  ForkGuardedFd& operator=(const ForkGuardedFd&) = delete;
  ~ForkGuardedFd() { reset(); }
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  /// @brief Unregisters and closes the descriptor.
  void reset() noexcept { ForkGuard::close(std::exchange(fd_, -1)); }

 private:
  int fd_ = -1;
};

}  // namespace detail
ACCEL_NAMESPACE_END
