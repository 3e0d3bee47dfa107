// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file socket.hpp
/// @brief POSIX TCP helpers: an owning descriptor, listen/connect by host name, deadline-bounded I/O.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/unique_fd.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Owns a socket; closes it on destruction.
using Fd = UniqueFd;

/// @brief "Connection refused (errno 111)", thread-safe (GNU strerror_r).
inline std::string os_error_text(int err) {
  char buf[256] = {};
  return concat(::strerror_r(err, buf, sizeof buf), " (errno ", err, ")");
}

inline void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
}

inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// @brief How long a store connection to a machine that vanished (power loss, network cut: no
/// FIN, no RST) may stay silent before it counts as closed: keepalive probes after 10 s idle, every
/// 5 s, 3 unanswered; data unacknowledged for as long fails the same way.
inline constexpr int keepalive_idle_s = 10, keepalive_interval_s = 5, keepalive_probes = 3;

/// @brief Makes a store connection notice a peer machine that vanished (see keepalive_idle_s):
/// a process that dies is noticed at once anyway (its kernel closes the connection).
inline void set_liveness_probes(int fd) {
  int on = 1, idle = keepalive_idle_s, interval = keepalive_interval_s, probes = keepalive_probes;
  unsigned user_timeout_ms = static_cast<unsigned>((keepalive_idle_s + keepalive_interval_s * keepalive_probes) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

/// @brief "host:port" for messages, bracketing IPv6 literals.
inline std::string host_port(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? concat('[', host, "]:", port) : concat(host, ':', port);
}

/// @brief The numeric address of a connected or bound socket's peer (`peer`) or own end.
inline std::string socket_address(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if ((peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len)) != 0)
    return "?";
  char host[NI_MAXHOST] = {}, serv[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return host_port(host, std::atoi(serv));
}

inline int socket_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

inline void resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string serv = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), serv.c_str(), &hints, &out.list);
  if (rc != 0)
    throw_error<comm_error>("cannot resolve store host '", host, "': ", ::gai_strerror(rc),
                            "; check MASTER_ADDR / ACCEL_STORE");
}

/// @brief For each address of host:port in turn: a new socket, and `use(fd, address)` (0 or an
/// errno); the first socket it succeeds with, or an empty Fd and the last errno in `err`.
template <class Use>
Fd first_working_socket(const std::string& host, int port, bool passive, int& err, Use&& use) {
  AddrInfo ai;
  resolve(host, port, passive, ai);
  err = 0;
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    err = fd ? use(fd.get(), *a) : errno;
    if (err == 0) return fd;
  }
  return Fd();
}

/// @brief A listening socket bound to exactly `host` (never the wildcard unless host is "" or "0.0.0.0");
/// an empty Fd and the errno in `err` when nothing could be bound.
inline Fd try_listen_tcp(const std::string& host, int port, int backlog, int& err) {
  return first_working_socket(host, port, true, err, [&](int fd, const addrinfo& a) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a.ai_addr, a.ai_addrlen) != 0 || ::listen(fd, backlog) != 0) return errno;
    set_nonblocking(fd, true);
    return 0;
  });
}

/// @brief try_listen_tcp at the first of `ports` not in use (each port but the last is skipped only
/// when in use: a foreign address fails at once).
/// @param ports at least one; 0 picks a free port (read it back with socket_port())
/// @throws comm_error naming the address and every port tried when nothing could be bound
inline Fd listen_tcp(const std::string& host, std::span<const int> ports, int backlog = 512) {
  int err = 0;
  for (const int port : ports) {
    if (Fd fd = try_listen_tcp(host, port, backlog, err)) return fd;
    if (err != EADDRINUSE) break;
  }
  std::string tried;
  for (const int port : ports) tried += (tried.empty() ? "" : ", ") + std::to_string(port);
  const bool several = ports.size() > 1;
  throw_error<comm_error>("cannot listen on ", several ? host + " at any of the ports " + tried : host_port(host, ports.front()), ": ",
                          os_error_text(err),
                          err != EADDRINUSE ? "; check the address belongs to this machine"
                          : several         ? "; other jobs or connections hold every one: set MASTER_PORT to a free port, or use accel launch"
                                            : "; another job uses this port: pick another MASTER_PORT, or use accel launch");
}
/// @brief listen_tcp at one port (0 picks a free one).
inline Fd listen_tcp(const std::string& host, int port, int backlog = 512) {
  const int ports[] = {port};
  return listen_tcp(host, std::span<const int>(ports), backlog);
}

inline int poll_ms(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left + 1, 1 << 30));
}

/// @brief One connect() that gives up at `deadline`; 0 or the errno. A listener whose accept queue is
/// full drops the SYN, and a blocking connect() would retry it for minutes past any deadline.
inline int connect_until(int fd, const sockaddr* addr, socklen_t len, std::chrono::steady_clock::time_point deadline) {
  set_nonblocking(fd, true);
  if (::connect(fd, addr, len) != 0) {
    if (errno != EINPROGRESS) return errno;
    for (;;) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, poll_ms(deadline));
      if (r > 0) break;
      if (r == 0) return ETIMEDOUT;
      if (errno != EINTR) return errno;
    }
    int err = 0;
    socklen_t err_len = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) return errno;
    if (err != 0) return err;
  }
  set_nonblocking(fd, false);
  return 0;
}

/// @brief One attempt to connect to host:port (each of its addresses), giving up at `deadline`; an
/// empty Fd and the errno in `err` when it fails.
/// @throws comm_error when the host cannot be resolved
inline Fd try_connect_tcp(const std::string& host, int port, std::chrono::steady_clock::time_point deadline, int& err) {
  return first_working_socket(host, port, false, err, [&](int fd, const addrinfo& a) {
    const int rc = connect_until(fd, a.ai_addr, a.ai_addrlen, deadline);
    if (rc == 0) set_nodelay(fd), set_liveness_probes(fd);
    return rc;
  });
}

/// @brief The pause before the next round of connection attempts: 1 ms doubling to 100 ms.
inline std::chrono::milliseconds next_pause(std::chrono::milliseconds pause) {
  return std::min(pause * 2, std::chrono::milliseconds(100));
}

/// @brief Connects to host:port, retrying refused connections until `deadline` (the server may start later).
/// @throws timeout_error when the deadline passes, comm_error when the host cannot be resolved
inline Fd connect_tcp(const std::string& host, int port, std::chrono::steady_clock::time_point deadline) {
  int last = 0;
  for (auto pause = std::chrono::milliseconds(1);; pause = next_pause(pause)) {
    if (Fd fd = try_connect_tcp(host, port, deadline, last)) return fd;
    if (std::chrono::steady_clock::now() + pause >= deadline)
      throw_error<timeout_error>("could not connect to the store at ", host_port(host, port), ": ", os_error_text(last),
                                 "; is the process that hosts it (accel launch, or rank 0) running and reachable?");
    std::this_thread::sleep_for(pause);
  }
}

/// @brief Result of a bounded I/O step.
enum class IoStatus { ok, closed, timeout };

/// @brief Writes every byte (blocking socket), waiting at most until `deadline`.
inline IoStatus send_all(int fd, std::span<const std::byte> data, std::chrono::steady_clock::time_point deadline, int& err) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, poll_ms(deadline));
      if (r == 0) return IoStatus::timeout;
      if (r < 0 && errno != EINTR) return err = errno, IoStatus::closed;
      continue;
    }
    err = errno;
    return IoStatus::closed;
  }
  return IoStatus::ok;
}

/// @brief Reads exactly data.size() bytes, waiting at most until `deadline`.
inline IoStatus recv_all(int fd, std::span<std::byte> data, std::chrono::steady_clock::time_point deadline, int& err) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::recv(fd, data.data() + done, data.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return err = 0, IoStatus::closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, poll_ms(deadline));
      if (r == 0) return IoStatus::timeout;
      if (r < 0 && errno != EINTR) return err = errno, IoStatus::closed;
      continue;
    }
    err = errno;
    return IoStatus::closed;
  }
  return IoStatus::ok;
}

}  // namespace detail
ACCEL_NAMESPACE_END
