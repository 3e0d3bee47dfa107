// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file adoption.hpp
/// @brief The launcher as a child subreaper: processes the ranks start and leave behind (daemons
/// that left the rank's process group with setsid, children that outlive their rank) are
/// reparented to the launcher instead of init, so it can find them, end them and reap them.
///
/// Linux only (PR_SET_CHILD_SUBREAPER, /proc). Nothing here is public API.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/unique_fd.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail::proc {

/// @brief One line of the process table, as /proc/<pid>/stat gives it.
struct ProcessEntry {
  pid_t pid = 0;
  char state = '?';  ///< 'Z' for a zombie waiting to be reaped
  pid_t pgid = 0;
  std::string name;  ///< the command name (at most 15 characters, as the kernel keeps it)
};

/// @brief Parses "pid (name) state ppid pgrp ..." (the name may hold spaces and parentheses).
/// @return false when the text does not have that shape
inline bool parse_proc_stat(std::string_view text, ProcessEntry& out, pid_t& ppid) {
  const auto open = text.find('(');
  const auto close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return false;
  const std::string rest(text.substr(close + 1));
  int pid = 0, parent = 0, group = 0;
  char state = 0;
  if (std::sscanf(std::string(text.substr(0, open)).c_str(), "%d", &pid) != 1 ||
      std::sscanf(rest.c_str(), " %c %d %d", &state, &parent, &group) != 3)
    return false;
  out.pid = pid;
  out.state = state;
  out.pgid = group;
  out.name = std::string(text.substr(open + 1, close - open - 1));
  ppid = parent;
  return true;
}

/// @brief The processes whose parent is `parent` right now, zombies included (one pass over /proc).
inline std::vector<ProcessEntry> children_of(pid_t parent) {
  std::vector<ProcessEntry> found;
  DIR* dir = ::opendir("/proc");
  if (!dir) return found;
  char buf[512];  // pid, a name of at most 15 characters and the next three fields fit easily
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    const UniqueFd fd(::openat(::dirfd(dir), (std::string(e->d_name) + "/stat").c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) continue;  // it ended meanwhile
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    ProcessEntry entry;
    pid_t ppid = 0;
    if (n > 0 && parse_proc_stat(std::string_view(buf, static_cast<std::size_t>(n)), entry, ppid) && ppid == parent)
      found.push_back(std::move(entry));
  }
  ::closedir(dir);
  return found;
}

/// @brief Makes this process a child subreaper while the object lives (orphaned descendants are
/// reparented to it rather than to init), then restores the previous setting.
class ChildSubreaper {
 public:
  ChildSubreaper() noexcept {
    int was = 0;
    if (::prctl(PR_GET_CHILD_SUBREAPER, &was) == 0) was_ = was != 0;
    if (!was_) set_ = ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
  }
  ChildSubreaper(const ChildSubreaper&) = delete;
  ChildSubreaper& operator=(const ChildSubreaper&) = delete;
  ~ChildSubreaper() {
    if (set_) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }

 private:
  bool was_ = false;
  bool set_ = false;
};

}  // namespace detail::proc
ACCEL_NAMESPACE_END
