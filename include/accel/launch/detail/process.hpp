// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file process.hpp
/// @brief POSIX process plumbing for accel launch: spawning with a parent-death signal, process
/// groups, pidfds, pipes, blocked signals read through signalfd, wait statuses, free ports, random tokens.
///
/// Linux only (prctl, signalfd, pidfd, epoll, pipe2, getrandom). Nothing here is public API.
#pragma once

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <accel/runtime/config.hpp>
#include <accel/runtime/unique_fd.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
// A namespace of its own: names like write_all or errno_text also exist in other detail headers.
namespace detail::proc {
using detail::UniqueFd;

/// @brief "SIGKILL" for 9, "signal 42" for names we do not know.
inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return concat("signal ", sig);
  }
}

/// @brief The shell's convention for a wait status: the exit code, or 128 + the signal number.
inline int exit_code_of(int wait_status) noexcept {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

/// @brief True when the status says "exited with code 0".
inline bool succeeded(int wait_status) noexcept { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

/// @brief "exited with code 3", "was killed by signal 11 (SIGSEGV)" (+ ", core dumped").
inline std::string describe_wait_status(int wait_status) {
  if (WIFEXITED(wait_status)) return concat("exited with code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return concat("was killed by signal ", sig, " (", signal_name(sig), ")", WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return concat("ended with wait status ", wait_status);
}

/// @brief strerror for one errno value, thread-safe.
inline std::string errno_text(int err) {
  std::array<char, 256> buf{};
  // GNU strerror_r returns the message pointer, which may or may not be buf.
  return ::strerror_r(err, buf.data(), buf.size());
}

/// @brief A close-on-exec pipe: `read_end`, `write_end`.
struct Pipe {
  UniqueFd read_end, write_end;
};

/// @throws launch_error when the system is out of descriptors.
inline Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw_error<launch_error>("cannot create a pipe (", errno_text(errno), "); raise the open-file limit (ulimit -n)");
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

/// @brief Writes all of `data`, retrying on EINTR; false when the descriptor refuses (EPIPE...).
inline bool write_all(int fd, std::string_view data) noexcept {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

/// @brief Resolves a program like execvp does: names with a '/' as given, others along PATH.
/// @return the path to execute, or "" when no executable file is found
inline std::string find_program(const std::string& name, std::string_view path_var) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  std::size_t pos = 0;
  while (pos <= path_var.size()) {
    const auto colon = path_var.find(':', pos);
    std::string dir(path_var.substr(pos, colon == std::string_view::npos ? std::string_view::npos : colon - pos));
    pos = colon == std::string_view::npos ? path_var.size() + 1 : colon + 1;
    if (dir.empty()) dir = ".";  // an empty PATH entry means the current directory
    std::string candidate = dir + "/" + name;
    if (executable(candidate)) return candidate;
  }
  return "";
}

/// @brief Why find_program found nothing to run for `name`: what is at its path (or the first
///        PATH entry holding that name) when something is, "" when nothing is.
inline std::string unrunnable_reason(const std::string& name, std::string_view path_var) {
  auto why = [](const std::string& p) -> std::string {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return "";
    if (S_ISDIR(st.st_mode)) return "'" + p + "' is a folder";
    if (!S_ISREG(st.st_mode)) return "'" + p + "' is not a regular file";
    return "'" + p + "' is not executable by you (chmod +x it, or run it through its interpreter)";
  };
  if (name.empty() || name.find('/') != std::string::npos) return why(name);
  for (std::size_t pos = 0; pos <= path_var.size();) {
    const auto colon = path_var.find(':', pos);
    std::string dir(path_var.substr(pos, colon == std::string_view::npos ? std::string_view::npos : colon - pos));
    pos = colon == std::string_view::npos ? path_var.size() + 1 : colon + 1;
    if (auto reason = why((dir.empty() ? "." : dir) + "/" + name); !reason.empty()) return reason;
  }
  return "";
}

/// @brief A pidfd for `pid` (Linux 5.3+; always close-on-exec): readable once the process has
/// ended and can be reaped. Empty when the kernel has none or the process is gone.
inline UniqueFd open_pidfd(pid_t pid) noexcept {
#ifdef SYS_pidfd_open
  return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#else
  (void)pid;
  return UniqueFd();
#endif
}

/// @brief What one child needs: program, arguments, environment, standard descriptors.
struct SpawnRequest {
  std::string path;               ///< resolved executable (see find_program)
  std::vector<std::string> argv;  ///< argv[0] included
  std::vector<std::string> env;   ///< "NAME=value" entries, the complete environment
  int stdin_fd = -1;              ///< descriptor to become the child's stdin; -1 keeps the launcher's
  int stdout_fd = -1;             ///< ... stdout; -1 keeps the launcher's
  int stderr_fd = -1;             ///< ... stderr; -1 keeps the launcher's
  sigset_t child_mask{};          ///< signal mask the program starts with (the launcher's original one)
  std::vector<int> reset_signals; ///< signals whose disposition goes back to SIG_DFL before exec
  int exit_watch = -1;            ///< epoll set that gets the child's pidfd (EPOLLIN | EPOLLONESHOT,
                                  ///< data.u64 = pid) before the program starts; -1 for none
  std::optional<rlimit> open_files{};  ///< RLIMIT_NOFILE the program starts with (the launcher's own
                                       ///< before it raised it); unset: inherited
};

/// @brief A started child: its pid, which is also its process-group id, and its pidfd, registered
/// in the request's `exit_watch` (empty without kernel support, or when registering failed).
struct Spawned {
  pid_t pid = -1;
  UniqueFd pidfd;
};

/// @brief Starts a child with fork + execve, in its own process group, with SIGKILL as its
/// parent-death signal, so no child outlives the launcher even when the launcher is SIGKILLed.
///
/// posix_spawn cannot run prctl(PR_SET_PDEATHSIG) in the child, so this forks; between fork and
/// execve the child only makes async-signal-safe calls on data prepared before the fork, which keeps
/// it correct when the launcher has other threads (a store server). The death signal fires when the
/// *thread* that forked exits: call this from the thread that supervises the children.
/// @return the child's pid and pidfd
/// @throws launch_error when fork fails or the program cannot be executed (errno text included)
inline Spawned spawn_child(const SpawnRequest& r) {
  std::vector<char*> argv;
  for (const auto& a : r.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : r.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  Pipe exec_report = make_pipe();  // stays empty when execve succeeds (close-on-exec)
  const pid_t launcher = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) throw_error<launch_error>("cannot start '", r.path, "': fork failed (", errno_text(errno), ")");
  if (pid == 0) {
    // Child: async-signal-safe calls only from here to execve.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl took effect
    for (int sig : r.reset_signals) ::sigaction(sig, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &r.child_mask, nullptr);
    if (r.open_files) ::setrlimit(RLIMIT_NOFILE, &*r.open_files);
    if ((r.stdin_fd >= 0 && ::dup2(r.stdin_fd, 0) < 0) || (r.stdout_fd >= 0 && ::dup2(r.stdout_fd, 1) < 0) ||
        (r.stderr_fd >= 0 && ::dup2(r.stderr_fd, 2) < 0)) {
      const int err = errno;
      (void)!::write(exec_report.write_end.get(), &err, sizeof err);
      ::_exit(127);
    }
    ::execve(r.path.c_str(), argv.data(), envp.data());
    const int err = errno;
    (void)!::write(exec_report.write_end.get(), &err, sizeof err);
    ::_exit(127);
  }
  // Parent: set the group here too, so signals sent right after we return reach it (no race).
  ::setpgid(pid, pid);
  // The pidfd joins the exit watch before the program can run (the child is still on its way to
  // execve), so the watch sees this child's end after the end of every child watched before it.
  Spawned started{pid, open_pidfd(pid)};
  if (started.pidfd && r.exit_watch >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u64 = static_cast<std::uint64_t>(pid);
    if (::epoll_ctl(r.exit_watch, EPOLL_CTL_ADD, started.pidfd.get(), &ev) != 0) started.pidfd.reset();
  }
  exec_report.write_end.reset();
  int err = 0;
  ssize_t n = 0;
  do n = ::read(exec_report.read_end.get(), &err, sizeof err);
  while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof err)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw_error<launch_error>("cannot start '", r.path, "': ", errno_text(err),
                              err == ENOEXEC ? " (not an executable format; add a #! line or run it through its interpreter)"
                              : err == EACCES ? " (check the file's execute permission)"
                                              : "");
  }
  return started;
}

/// @brief Blocks the signals the launcher handles and reads them through a signalfd; restores the
/// mask and SIGPIPE's disposition on destruction. Create it before starting any thread, so threads
/// inherit the blocked mask and signals land in the descriptor, not in a thread's default action.
class BlockedSignals {
 public:
  /// @throws launch_error when the signalfd cannot be created
  explicit BlockedSignals(std::vector<int> signals) : signals_(std::move(signals)) {
    sigset_t set;
    sigemptyset(&set);
    for (int s : signals_) sigaddset(&set, s);
    if (::pthread_sigmask(SIG_BLOCK, &set, &original_) != 0) throw_error<launch_error>("cannot block signals");
    fd_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!fd_) {
      const int err = errno;
      ::pthread_sigmask(SIG_SETMASK, &original_, nullptr);
      throw_error<launch_error>("cannot create a signalfd (", errno_text(err), ")");
    }
    // A closed console must not kill the launcher while children still run.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  BlockedSignals(const BlockedSignals&) = delete;
  BlockedSignals& operator=(const BlockedSignals&) = delete;
  ~BlockedSignals() {
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    fd_.reset();
    // Drop what is still pending so unblocking does not deliver a stale SIGCHLD or SIGINT.
    sigset_t set;
    sigemptyset(&set);
    for (int s : signals_) sigaddset(&set, s);
    const timespec zero{0, 0};
    while (::sigtimedwait(&set, nullptr, &zero) > 0) {
    }
    ::pthread_sigmask(SIG_SETMASK, &original_, nullptr);
  }
  /// @brief Readable when a blocked signal is pending.
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  /// @brief The mask to give children (the one in force before blocking).
  [[nodiscard]] const sigset_t& original_mask() const noexcept { return original_; }
  /// @brief Signals children must see with their default disposition (ours plus SIGPIPE).
  [[nodiscard]] std::vector<int> reset_list() const {
    auto v = signals_;
    v.push_back(SIGPIPE);
    return v;
  }
  /// @brief Reads one pending signal; 0 when none.
  /// @param sender when not null, receives the pid the signal names (for SIGCHLD, the child)
  int next(pid_t* sender = nullptr) noexcept {
    signalfd_siginfo info{};
    const ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n != static_cast<ssize_t>(sizeof info)) return 0;
    if (sender) *sender = static_cast<pid_t>(info.ssi_pid);
    return static_cast<int>(info.ssi_signo);
  }

 private:
  std::vector<int> signals_;
  sigset_t original_{};
  struct sigaction old_pipe_ {};
  UniqueFd fd_;
};

/// @brief A TCP port free on this host right now: binds port 0 on 127.0.0.1 and reads it back.
/// @throws launch_error when no socket can be bound
inline int pick_free_port() {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throw_error<launch_error>("cannot create a socket to pick MASTER_PORT (", errno_text(errno), ")");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw_error<launch_error>("cannot pick a free port for MASTER_PORT (", errno_text(errno),
                              "); pass one with --main_process_port");
  return ntohs(addr.sin_port);
}

/// @brief `bytes` random bytes from the kernel as lower-case hex (2*bytes characters).
/// @throws launch_error when the kernel has no randomness to give
inline std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_error<launch_error>("cannot draw a random job token (", errno_text(errno), ")");
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : buf) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace detail::proc
ACCEL_NAMESPACE_END
