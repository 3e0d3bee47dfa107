// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file store.hpp
/// @brief The job's TCP key-value store: a server on its own thread, a blocking client, and
/// connect_job_store() which finds (or, on rank 0, hosts) the store from the launcher environment.
///
/// @code
///   accel::StoreServer server("127.0.0.1", 0, token);           // port 0: pick a free one
///   accel::StoreClient client("127.0.0.1", server.port(), token, std::chrono::seconds(30));
///   client.set("answer", std::string_view("42"));
///   auto v = client.get_string("answer");                      // waits until set, or times out
/// @endcode
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <accel/runtime/bytes.hpp>
#include <accel/runtime/config.hpp>
#include <accel/comm/detail/fork_guard.hpp>
#include <accel/comm/detail/socket.hpp>
#include <accel/comm/store_core.hpp>
#include <accel/comm/wire.hpp>
#include <accel/runtime/distributed_state.hpp>
#include <accel/runtime/env.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/blobs.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {
/// @brief A number drawn once per process (never 0) that every store hello of the process carries:
/// the store accepts further connections for a rank from the process that holds it and refuses
/// another process claiming the same rank (two jobs at one address, or a duplicated RANK).
inline std::uint64_t process_number() {
  static const std::uint64_t number = [] {
    std::random_device device;
    const std::uint64_t n = (std::uint64_t{device()} << 32) ^ device();
    return n != 0 ? n : 1;
  }();
  return number;
}
}  // namespace detail

/// @brief Settings of a StoreServer.
struct StoreServerOptions {
  int world_size = 0;                                  ///< expected ranks (0 = learn from the first client)
  std::size_t max_frame_bytes = std::size_t{1} << 30;  ///< largest request accepted after the handshake
  /// Server-side events (refused clients, ranks that died); default: one line on stderr.
  std::function<void(const std::string&)> log = [](const std::string& m) {
    std::fprintf(stderr, "[accel.comm] store: %s\n", m.c_str());
  };
  /// On destruction, keep serving until every client disconnected or this long passed (rank 0 hosting).
  std::chrono::milliseconds linger{0};
  /// Largest frame accepted before the handshake (a hello is a few dozen bytes plus the token).
  std::size_t max_handshake_bytes = 4096;
  /// A connection that has not said hello this long after connecting is closed (ranks say it at once).
  std::chrono::milliseconds handshake_timeout{5000};
  /// Most connections without a hello kept open at once; past it the oldest are closed.
  std::size_t max_pending_connections = 1024;
  /// Largest world size a hello or exchange may name while the job's world size is unknown.
  int max_world_size = 1 << 20;
  std::string job_id;  ///< the job served (LaunchEnv::job_id), named when another job's process is refused
  /// Every rank must connect within this long of the first connection, or the collectives that
  /// wait for it fail naming it (LaunchEnv::join_timeout, ACCEL_JOIN_TIMEOUT_S); 0: no deadline.
  std::chrono::milliseconds join_timeout{0};
  /// Told, on the server's thread, of every rank that leaves (see RankGone), in the order seen.
  std::function<void(const RankDeparture&)> on_rank_gone;
};

/// @brief The store server: listens on one address, serves any number of clients from one thread.
///
/// Binds only to `bind_host` (use "127.0.0.1" for a single-machine job). Survives any byte sequence
/// from any client: malformed, oversized or unauthenticated frames get an error reply and the
/// connection is closed; nothing else is affected. Connections that never say hello are closed
/// after `handshake_timeout`, at most `max_pending_connections` of them are kept, and running out
/// of file descriptors turns new connections away instead of busy-looping.
class StoreServer {
 public:
  /// @param bind_host address to listen on (a name or a numeric address)
  /// @param port port to listen on; 0 picks a free port (read it with port())
  /// @param job_token secret every client must present (the launcher's ACCEL_JOB_TOKEN)
  /// @throws comm_error naming the address when it cannot listen (port in use, foreign address)
  StoreServer(std::string bind_host, std::uint16_t port, std::string job_token, StoreServerOptions options = {})
      : StoreServer(std::move(bind_host), std::vector<int>{port}, std::move(job_token), std::move(options)) {}
  /// @brief Listens at the first of `ports` not in use (a job's derived ports, see job_port).
  /// @throws comm_error naming the address and every port when all are in use
  StoreServer(std::string bind_host, const std::vector<int>& ports, std::string job_token, StoreServerOptions options = {})
      : host_(std::move(bind_host)), options_(std::move(options)),
        core_(detail::StoreCoreOptions{.job_token = std::move(job_token),
                                       .max_frame_bytes = options_.max_frame_bytes,
                                       .max_handshake_bytes = options_.max_handshake_bytes,
                                       .world_size = options_.world_size,
                                       .log = options_.log,
                                       .handshake_timeout = options_.handshake_timeout,
                                       .max_world_size = options_.max_world_size,
                                       .job_id = options_.job_id,
                                       .join_timeout = options_.join_timeout,
                                       .on_rank_gone = options_.on_rank_gone}) {
    listener_ = detail::ForkGuardedFd(detail::listen_tcp(host_, std::span<const int>(ports)));
    port_ = static_cast<std::uint16_t>(detail::socket_port(listener_.get()));
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) detail::throw_error<comm_error>("store: pipe failed: ", detail::os_error_text(errno));
    wake_read_.reset(p[0]), wake_write_.reset(p[1]);
    reserve_.reset(open_reserve());
    thread_ = std::thread([this] { loop(); });
  }
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  /// @brief Stops serving (after the linger time, if any) and closes every connection.
  ~StoreServer() { stop(); }

  /// @brief The port it listens on.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  /// @brief The address it was bound to.
  [[nodiscard]] const std::string& host() const noexcept { return host_; }
  /// @brief "host:port", the form ACCEL_STORE takes.
  [[nodiscard]] std::string address() const { return detail::host_port(host_, port_); }

  /// @brief Stops the server thread; idempotent.
  void stop() noexcept {
    if (!thread_.joinable()) return;
    stopping_ = true;
    const char c = 1;
    [[maybe_unused]] auto n = ::write(wake_write_.get(), &c, 1);
    thread_.join();
  }

 private:
  using Clock = detail::StoreClock;
  using ConnId = detail::StoreCore::ConnId;

  // Catches everything: whatever a client sends, or a bug here, surfaces as a logged error and the
  // store keeps serving; nothing reaches std::terminate through this thread.
  void loop() noexcept {
    std::vector<std::byte> buf(256 * 1024);
    std::optional<Clock::time_point> stop_at;
    std::vector<pollfd> pfds;
    std::vector<ConnId> ids, dead;
    for (;;) {
      try {
        if (stopping_ && !stop_at) stop_at = Clock::now() + options_.linger;
        if (stop_at && (fds_.empty() || Clock::now() >= *stop_at)) break;
        pfds.clear(), ids.clear(), dead.clear();
        const bool listening = !stop_at && !(listen_paused_until_ && Clock::now() < *listen_paused_until_);
        pfds.push_back({wake_read_.get(), POLLIN, 0});
        pfds.push_back({listener_.get(), static_cast<short>(listening ? POLLIN : 0), 0});
        for (auto& [id, fd] : fds_) {
          auto& c = core_.connections().at(id);
          short ev = c.close_after_flush ? 0 : POLLIN;
          if (!c.out.empty()) ev = static_cast<short>(ev | POLLOUT);
          pfds.push_back({fd.get(), ev, 0});
          ids.push_back(id);
        }
        auto deadline = core_.next_deadline();
        auto earliest = [&](Clock::time_point t) { deadline = deadline ? std::min(*deadline, t) : t; };
        if (stop_at) earliest(*stop_at);
        if (!listening && !stop_at) earliest(*listen_paused_until_);
        const int timeout = deadline ? detail::poll_ms(*deadline) : -1;
        if (::poll(pfds.data(), pfds.size(), timeout) < 0) {
          // ENOMEM, or EINVAL after the process lowered its descriptor limit: wait, do not exit.
          const int err = errno;
          if (err != EINTR) {
            if (auto more = poll_log_.admit(Clock::now())) report(detail::concat("poll failed: ", detail::os_error_text(err), *more));
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
          continue;
        }
        const auto now = Clock::now();
        if (pfds[0].revents & POLLIN) {
          char drain[64];
          while (::read(wake_read_.get(), drain, sizeof drain) > 0) {
          }
        }
        for (std::size_t i = 2; i < pfds.size(); ++i) {
          if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          const auto id = ids[i - 2];
          for (;;) {
            const ssize_t n = ::recv(pfds[i].fd, buf.data(), buf.size(), 0);
            if (n > 0) {
              core_.receive(id, std::span<const std::byte>(buf.data(), static_cast<std::size_t>(n)), now);
              if (static_cast<std::size_t>(n) < buf.size()) break;
              continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            dead.push_back(id);  // orderly close (0) or reset
            break;
          }
        }
        // After the reads: a connection accepted in an earlier round has had its hello read by
        // now if it sent one, so only those may be dropped to make room for new ones.
        if (listening && (pfds[1].revents & POLLIN)) accept_ready(now);
        core_.tick(now);
        core_.resume(now);
        flush(dead);
        while (!dead.empty()) {
          for (auto id : dead) {
            fds_.erase(id);
            core_.closed(id, Clock::now());
          }
          dead.clear();
          core_.resume(Clock::now());
          flush(dead);
        }
      } catch (const std::exception& e) {
        report(detail::concat("internal error in the store loop (please report it): ", e.what()));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // an error that repeats must not spin
      } catch (...) {
        report("internal error in the store loop (please report it): an unknown exception");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  // Accepts what the listener holds. Idle connections are limited two ways: at most
  // max_pending_connections without a hello, and whatever the descriptor limit allows. At either
  // limit the OLDEST connection without a hello is closed rather than the new one refused: a rank
  // says hello within a round trip of connecting, so the longest-idle connections are the least
  // likely to be ranks, while refusing new ones would let an idle flood lock every later rank out.
  void accept_ready(Clock::time_point now) {
    const ConnId first_this_round = next_id_;
    const std::size_t cap = std::max<std::size_t>(1, options_.max_pending_connections);
    for (;;) {
      if (core_.pending() >= cap &&
          !drop_oldest_pending(first_this_round, now,
                               detail::concat("the store keeps at most ", cap, " connections without a hello; the oldest are closed")))
        return;  // every one came in this round: read their hellos first
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        detail::set_nodelay(fd);
        detail::set_liveness_probes(fd);
        const auto id = next_id_++;
        fds_.emplace(id, detail::ForkGuardedFd(detail::Fd(fd)));
        core_.open(id, detail::socket_address(fd, true), now);
        continue;
      }
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err != EMFILE && err != ENFILE) {
        // ENOBUFS, ENOMEM and the like: the kernel is short of memory; the listener waits a moment.
        if (auto more = accept_log_.admit(now)) report(detail::concat("cannot accept connections: ", detail::os_error_text(err), *more));
        listen_paused_until_ = now + std::chrono::milliseconds(100);
        return;
      }
      if (auto more = fd_log_.admit(now)) report(out_of_files(err) + *more);
      if (drop_oldest_pending(first_this_round, now, "the store is out of file descriptors; connections without a hello are closed, oldest first"))
        continue;
      if (core_.pending() > 0) return;  // all from this round: read their hellos first
      // Every descriptor serves a rank: turn the newcomer away at once with a reason, through the
      // reserve descriptor, so it neither hangs in the backlog nor keeps the listener ready (a
      // ready listener that cannot be drained is what made the loop spin).
      if (!turn_away_one(err)) {
        listen_paused_until_ = now + std::chrono::milliseconds(100);
        return;
      }
    }
  }

  // Closes the longest-idle connection without a hello, if it was accepted before this round.
  bool drop_oldest_pending(ConnId first_this_round, Clock::time_point now, const std::string& why) {
    const auto oldest = core_.oldest_pending();
    if (!oldest || *oldest >= first_this_round) return false;
    auto it = fds_.find(*oldest);
    if (it != fds_.end()) {
      const auto frame = detail::encode_failure(detail::FailureKind::refused, why);
      [[maybe_unused]] auto n = ::send(it->second.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (auto more = drop_log_.admit(now)) report(detail::concat("closed ", core_.connections().at(*oldest).peer, ": ", why, *more));
      fds_.erase(it);
    }
    core_.closed(*oldest, now);
    return true;
  }

  // Frees the reserve descriptor, accepts one connection with it, tells it why and closes it.
  bool turn_away_one(int err) {
    if (!reserve_) reserve_.reset(open_reserve());
    if (!reserve_) return false;
    reserve_.reset();
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      const auto frame = detail::encode_failure(detail::FailureKind::refused, out_of_files(err));
      [[maybe_unused]] auto n = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
    }
    reserve_.reset(open_reserve());
    return fd >= 0;
  }

  static int open_reserve() noexcept { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

  static std::string out_of_files(int err) {
    if (err == ENFILE)
      return detail::concat("cannot accept more connections: ", detail::os_error_text(err),
                            "; the system-wide limit on open files is reached (fs.file-max)");
    rlimit l{};
    ::getrlimit(RLIMIT_NOFILE, &l);
    return detail::concat("cannot accept more connections: ", detail::os_error_text(err),
                          "; the store's process is at its limit on open files (RLIMIT_NOFILE ", l.rlim_cur,
                          "); raise it with `ulimit -n` before starting the job");
  }

  void report(const std::string& msg) noexcept {
    try {
      if (options_.log) options_.log(msg);
    } catch (...) {  // a failing log must not take the store down
    }
  }

  // Writes as much pending output as the sockets take; refused connections close once flushed.
  void flush(std::vector<ConnId>& dead) {
    for (auto& [id, fd] : fds_) {
      if (std::find(dead.begin(), dead.end(), id) != dead.end()) continue;
      auto& c = core_.connections().at(id);
      if (c.drop) {
        dead.push_back(id);
        continue;
      }
      bool broken = false;
      while (!c.out.empty()) {
        const auto& chunk = *c.out.front();
        const ssize_t n = ::send(fd.get(), chunk.data() + c.out_offset, chunk.size() - c.out_offset, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EINTR) continue;
          broken = errno != EAGAIN && errno != EWOULDBLOCK;
          break;
        }
        c.out_offset += static_cast<std::size_t>(n);
        if (c.out_offset == chunk.size()) c.out.pop_front(), c.out_offset = 0;
      }
      if (broken || (c.close_after_flush && c.out.empty())) {
        if (!broken) ::shutdown(fd.get(), SHUT_WR);
        dead.push_back(id);
      }
    }
  }

  std::string host_;
  StoreServerOptions options_;
  detail::StoreCore core_;
  // Sockets are fork-guarded: a child forked by the hosting rank must not keep them open after it.
  detail::ForkGuardedFd listener_;
  detail::Fd wake_read_, wake_write_;
  detail::Fd reserve_;  ///< held open so that, out of descriptors, one can still be freed to turn a client away
  // Touched only by the server thread:
  std::map<ConnId, detail::ForkGuardedFd> fds_;
  ConnId next_id_ = 1;
  std::optional<Clock::time_point> listen_paused_until_;
  detail::LogThrottle fd_log_, drop_log_, accept_log_, poll_log_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

/// @brief A blocking connection to a StoreServer. Thread-safe (one request at a time).
///
/// Every waiting call is bounded: the server answers "timed out" at the request's deadline, naming
/// the keys or ranks that did not arrive; a vanished server or peer is reported at once.
class StoreClient {
 public:
  /// @param host store host; @param port store port
  /// @param job_token the job's token (ACCEL_JOB_TOKEN)
  /// @param timeout default bound on connecting and on every wait
  /// @param rank this process's rank (registered so its death is reported), -1 for none
  /// @param world_size the job's world size, 0 if unknown
  /// @param job_id this process's job (LaunchEnv::job_id), named by a store of another job that refuses it
  /// @param connect_timeout bound on reaching the store and its answer to the hello (default: `timeout`)
  /// @throws timeout_error when the store is not reachable within the timeout
  /// @throws comm_error when the store refuses the connection (wrong token, other job, other version)
  StoreClient(std::string host, int port, std::string job_token, std::chrono::milliseconds timeout = std::chrono::seconds(300),
              int rank = -1, int world_size = 0, const std::string& job_id = {},
              std::optional<std::chrono::milliseconds> connect_timeout = std::nullopt)
      : host_(std::move(host)), port_(port), timeout_(timeout), rank_(rank), job_token_(job_token), world_size_(world_size), job_id_(job_id) {
    const auto reach_by = Clock::now() + connect_timeout.value_or(timeout_);
    fd_ = detail::ForkGuardedFd(detail::connect_tcp(host_, port_, reach_by));
    const auto reply = round_trip(detail::encode_hello(job_token, rank, world_size, job_id, false, detail::process_number()), reach_by, "handshake");
    expect(reply, detail::Msg::ok, "handshake");
  }
  /// @brief Looks for the job's store at each of `ports` in turn (a job's derived ports, see
  /// job_port) until one accepts this job's hello. A port where nothing listens, or another job's
  /// store (which refuses this job's token) listens, or something that does not answer the hello
  /// within probe_answer_timeout, is passed over, and tried again in the next round.
  /// @throws timeout_error naming every port and what answered there when none accepted in time
  /// @throws comm_error when the job's own store refuses this process
  StoreClient(std::string host, const std::vector<int>& ports, std::string job_token, std::chrono::milliseconds timeout,
              int rank, int world_size, const std::string& job_id, std::chrono::milliseconds connect_timeout)
      : host_(std::move(host)), port_(ports.at(0)), timeout_(timeout), rank_(rank), job_token_(job_token), world_size_(world_size),
        job_id_(job_id) {
    const auto reach_by = Clock::now() + connect_timeout;
    const auto hello = detail::encode_hello(job_token, rank, world_size, job_id, /*probing=*/true, detail::process_number());
    std::vector<std::string> seen(ports.size());  // what answered at each port, for the timeout message
    for (auto pause = std::chrono::milliseconds(1);; pause = detail::next_pause(pause)) {
      for (std::size_t i = 0; i < ports.size(); ++i) {
        port_ = ports[i];
        int err = 0;
        auto fd = detail::try_connect_tcp(host_, port_, std::min(reach_by, Clock::now() + probe_answer_timeout), err);
        if (!fd) {
          seen[i] = detail::os_error_text(err);
          continue;
        }
        fd_ = detail::ForkGuardedFd(std::move(fd));
        std::vector<std::byte> reply;
        try {
          reply = round_trip(hello, std::min(reach_by, Clock::now() + probe_answer_timeout), "handshake", max_hello_reply_bytes);
        } catch (const comm_error& e) {  // timeout_error included: fd_ is closed, try the next port
          seen[i] = e.what();
          continue;
        }
        // Only this job's store accepts the hello, or refuses it for a reason of the job's own.
        if (static_cast<detail::Msg>(reply[0]) == detail::Msg::ok || is_failure(reply, detail::FailureKind::refused)) {
          expect(reply, detail::Msg::ok, "handshake");
          return;
        }
        fd_.reset();
        seen[i] = is_failure(reply, detail::FailureKind::other_job) ? "another job's store: " + failure_text(reply)
                                                                     : std::string("something that is not an accel store answered");
      }
      if (Clock::now() + pause >= reach_by) {
        std::string tried;
        for (std::size_t i = 0; i < ports.size(); ++i) tried += detail::concat(i ? "; " : "", ports[i], ": ", seen[i]);
        detail::throw_error<timeout_error>("could not find this job's store at ", host_, " on any of its ports (", tried,
                                           "); is the process that hosts it (rank 0) running and reachable?");
      }
      std::this_thread::sleep_for(pause);
    }
  }
  /// @brief How long a probing client waits for the hello's answer before passing a port over (a
  /// store answers within a round trip; something else may never answer).
  static constexpr std::chrono::milliseconds probe_answer_timeout{5000};
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;
  /// @brief Says goodbye (so the server knows this rank exited rather than died) and closes.
  ~StoreClient() {
    std::lock_guard lock(mutex_);
    if (!fd_ || ::getpid() != pid_) return;  // a forked child's copy: the rank's goodbye is not its to say
    int err = 0;
    const auto bye = detail::WireWriter(detail::Msg::bye).finish();
    detail::send_all(fd_.get(), bye, Clock::now() + std::chrono::milliseconds(200), err);
    fd_.reset();  // before owner_ (a hosted server waits for its clients, this one included)
  }

  /// @brief Sets `key` to `value`, waking anyone waiting for it.
  void set(const std::string& key, std::span<const std::byte> value) {
    expect(request(detail::WireWriter(detail::Msg::set).str(key).bytes(value).finish(), timeout_, "set '" + key + "'"),
           detail::Msg::ok, "set");
  }
  /// @brief Sets `key` to a text value.
  void set(const std::string& key, std::string_view value) { set(key, as_bytes(value)); }

  /// @brief The value of `key`, waiting until some process sets it.
  /// @throws timeout_error naming the key and the ranks connected when it is not set in time
  /// @throws comm_error when a rank died while waiting, or the store is gone
  /// @note blocks up to `timeout` (default: the client's)
  std::vector<std::byte> get(const std::string& key, std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    const auto t = timeout.value_or(timeout_);
    auto reply = request(detail::WireWriter(detail::Msg::get).str(key).u64(ms(t)).finish(), t, "get '" + key + "'");
    expect(reply, detail::Msg::value, "get");
    detail::WireReader r(std::span<const std::byte>(reply).subspan(1));
    return detail::to_vector(r.bytes());
  }
  /// @brief get() as text.
  std::string get_string(const std::string& key, std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    const auto v = get(key, timeout);
    return std::string(reinterpret_cast<const char*>(v.data()), v.size());
  }
  /// @brief Adds `delta` to the integer at `key` (created at 0) and returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    auto reply = request(detail::WireWriter(detail::Msg::add).str(key).i64(delta).finish(), timeout_, "add '" + key + "'");
    expect(reply, detail::Msg::integer, "add");
    detail::WireReader r(std::span<const std::byte>(reply).subspan(1));
    return r.i64();
  }
  /// @brief Waits until every key exists.
  /// @throws timeout_error naming the missing keys; comm_error when a rank died meanwhile
  void wait(const std::vector<std::string>& keys, std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    const auto t = timeout.value_or(timeout_);
    detail::WireWriter w(detail::Msg::wait);
    w.u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    expect(request(w.u64(ms(t)).finish(), t, "wait"), detail::Msg::ok, "wait");
  }
  /// @brief Deletes `key`; true when it existed.
  bool remove(const std::string& key) {
    auto reply = request(detail::WireWriter(detail::Msg::remove).str(key).finish(), timeout_, "delete '" + key + "'");
    expect(reply, detail::Msg::integer, "delete");
    detail::WireReader r(std::span<const std::byte>(reply).subspan(1));
    return r.i64() != 0;
  }
  /// @brief Sets `key` to `desired` if it holds `expected` (or is missing and `expected` is empty).
  /// @return the key's value afterwards (`expected` when the key is missing and `expected` is not empty)
  std::vector<std::byte> compare_set(const std::string& key, std::span<const std::byte> expected, std::span<const std::byte> desired) {
    auto reply = request(detail::WireWriter(detail::Msg::compare_set).str(key).bytes(expected).bytes(desired).finish(), timeout_,
                         "compare_set '" + key + "'");
    expect(reply, detail::Msg::value, "compare_set");
    detail::WireReader r(std::span<const std::byte>(reply).subspan(1));
    return detail::to_vector(r.bytes());
  }

  /// @brief The collective exchange: every rank of `world` sends one value under `key`; each
  /// receives all values in rank order once the last arrives.
  /// @param label what the collective is ("gather_object #3"), used in error messages
  /// @param members a group's exchange (split()): the job rank of each of its `world` ranks, so
  ///        the store watches (and names) the right processes; empty: rank r is job rank r
  /// @throws timeout_error naming the ranks that have not arrived
  /// @throws comm_error when a missing rank died or exited, or ranks disagree on the world size
  /// @note collective over the ranks of `world`
  Blobs exchange(const std::string& key, int rank, int world, std::span<const std::byte> value, std::string_view label,
                 std::optional<std::chrono::milliseconds> timeout = std::nullopt, std::span<const int> members = {}) {
    const auto t = timeout.value_or(timeout_);
    detail::WireWriter w(detail::Msg::exchange);
    w.str(key).i32(rank).i32(world).u64(ms(t)).str(label).bytes(value);
    if (!members.empty()) {  // only then: a world exchange stays what stores without groups accept
      ACCEL_EXPECTS(members.size() == static_cast<std::size_t>(world), "store exchange ", label, ": ", members.size(),
                    " members for ", world, " ranks");
      w.u32(static_cast<std::uint32_t>(members.size()));
      for (const int m : members) w.i32(m);
    }
    auto reply = request(w.finish(), t, std::string(label));
    expect(reply, detail::Msg::list, "exchange");
    detail::WireReader r(std::span<const std::byte>(reply).subspan(1));
    const std::uint32_t n = r.u32();
    if (n != static_cast<std::uint32_t>(world))
      detail::throw_error<comm_error>("store returned ", n, " values for ", label, " among ", world, " ranks");
    Blobs out;
    out.offset.reserve(n), out.length.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      const auto part = r.bytes();
      out.offset.push_back(static_cast<std::size_t>(part.data() - reply.data()));
      out.length.push_back(part.size());
    }
    out.buffer = std::move(reply);  // the parts point into the reply body: no copy
    return out;
  }

  /// @brief Another connection to the same store as the same rank. Requests on different
  /// connections never wait for each other (a request holds its connection until answered); the
  /// store counts a rank gone when its last connection closes.
  /// @throws as the constructor
  [[nodiscard]] std::shared_ptr<StoreClient> connect_again() const {
    return std::make_shared<StoreClient>(host_, port_, job_token_, timeout_, rank_, world_size_, job_id_);
  }

  /// @brief Ends, from another thread, the request this connection waits on (and every later
  /// one): it throws comm_error at once. The connection is closed for good; the store forgets the
  /// request when the process's last connection closes, or never if the process lives on (use
  /// it for exchanges nobody else will join).
  void interrupt() noexcept {
    std::lock_guard lock(interrupt_mutex_);
    interrupted_ = true;
    if (active_fd_ >= 0) ::shutdown(active_fd_, SHUT_RDWR);
  }

  /// @brief The default timeout.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// @brief The rank registered in the handshake (-1 for none).
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// @brief "host:port" of the store.
  [[nodiscard]] std::string address() const { return detail::host_port(host_, port_); }
  /// @brief Keeps `owner` alive as long as this client (rank 0 holds the server it hosts this way).
  void keep_alive(std::shared_ptr<void> owner) { owner_ = std::move(owner); }
  /// @brief Who hosts the store ("rank 0", "accel launch"), named when the connection is lost.
  void set_host_description(std::string who) { host_description_ = std::move(who); }

 private:
  using Clock = detail::StoreClock;
  static std::uint64_t ms(std::chrono::milliseconds t) { return static_cast<std::uint64_t>(std::max<std::int64_t>(0, t.count())); }
  static std::span<const std::byte> as_bytes(std::string_view s) { return std::as_bytes(std::span<const char>(s.data(), s.size())); }

  // The server answers at the request's own deadline; the extra grace only guards against a store
  // that stopped answering without closing the connection.
  std::vector<std::byte> request(const std::vector<std::byte>& frame, std::chrono::milliseconds timeout, const std::string& what) {
    std::lock_guard lock(mutex_);
    return round_trip(frame, Clock::now() + timeout + std::chrono::seconds(10), what);
  }

  std::vector<std::byte> round_trip(const std::vector<std::byte>& frame, Clock::time_point deadline, const std::string& what,
                                    std::size_t max_reply_bytes = std::numeric_limits<std::uint32_t>::max()) {
    if (::getpid() != pid_)
      detail::throw_error<comm_error>("this process (pid ", ::getpid(), ") is a copy of rank ", rank_, " made by fork() without exec; ",
                                      "the job's store connection belongs to rank ", rank_, "'s own process (pid ", pid_,
                                      ") alone: run collectives there, or exec a program that joins the job itself");
    if (!fd_) detail::throw_error<comm_error>("the connection to the store at ", address(), " is closed after an earlier failure");
    {
      std::lock_guard lock(interrupt_mutex_);
      if (interrupted_) detail::throw_error<comm_error>(what, " was interrupted: this connection to the store was closed");
      active_fd_ = fd_.get();
    }
    struct Inactive {  // every path out of here, before fd_ may be closed (close_fd())
      StoreClient& c;
      ~Inactive() {
        std::lock_guard lock(c.interrupt_mutex_);
        c.active_fd_ = -1;
      }
    } inactive{*this};
    int err = 0;
    auto st = detail::send_all(fd_.get(), frame, deadline, err);
    std::byte head[4];
    if (st == detail::IoStatus::ok) st = detail::recv_all(fd_.get(), head, deadline, err);
    std::vector<std::byte> body;
    if (st == detail::IoStatus::ok) {
      const auto len = load_le<std::uint32_t>(head);
      if (len == 0) lost(what, "an empty reply");
      if (len > max_reply_bytes) lost(what, detail::concat("a reply of ", len, " bytes, more than a store sends"));
      body.resize(len);
      st = detail::recv_all(fd_.get(), body, deadline, err);
    }
    if (st == detail::IoStatus::timeout) {
      close_fd();
      detail::throw_error<timeout_error>("the store at ", address(), " did not answer ", what, " in time");
    }
    if (st == detail::IoStatus::closed) lost(what, err ? detail::os_error_text(err) : "connection closed");
    return body;
  }

  [[noreturn]] void lost(const std::string& what, const std::string& why) {
    close_fd();
    {
      std::lock_guard lock(interrupt_mutex_);
      if (interrupted_) detail::throw_error<comm_error>(what, " was interrupted: this connection to the store was closed");
    }
    detail::throw_error<comm_error>("lost the connection to the store at ", address(), " during ", what, " (", why, "); ",
                                    host_description_.empty() ? std::string("the process hosting it (accel launch, or rank 0)")
                                                              : host_description_ + ", which hosts it,",
                                    " exited or crashed");
  }

  // Closes the connection once interrupt() can no longer reach its descriptor.
  void close_fd() noexcept {
    {
      std::lock_guard lock(interrupt_mutex_);
      active_fd_ = -1;
    }
    fd_.reset();
  }

  // Turns a failure reply into the matching exception; checks the reply type otherwise.
  static bool is_failure(const std::vector<std::byte>& reply, detail::FailureKind kind) {
    return reply.size() >= 2 && static_cast<detail::Msg>(reply[0]) == detail::Msg::failure && static_cast<detail::FailureKind>(reply[1]) == kind;
  }
  static std::string failure_text(const std::vector<std::byte>& reply) {
    try {
      detail::WireReader r(std::span<const std::byte>(reply).subspan(2));
      return r.str();
    } catch (const comm_error&) {
      return "(an unreadable reason)";
    }
  }
  /// Largest answer to a hello (a failure names two job ids): more is not from an accel store.
  static constexpr std::size_t max_hello_reply_bytes = 64 * 1024;

  void expect(const std::vector<std::byte>& reply, detail::Msg type, const char* what) {
    const auto got = static_cast<detail::Msg>(reply.at(0));
    if (got == type) return;
    if (got != detail::Msg::failure) detail::throw_error<comm_error>("the store sent reply type ", static_cast<int>(got), " to ", what);
    detail::WireReader r(std::span<const std::byte>(reply).subspan(1));
    const auto kind = static_cast<detail::FailureKind>(r.u8());
    const std::string msg = r.str();
    switch (kind) {
      case detail::FailureKind::timeout: detail::throw_error<timeout_error>(msg);
      case detail::FailureKind::refused:
      case detail::FailureKind::other_job:
        close_fd();
        detail::throw_error<comm_error>("the store at ", address(), " refused this process: ", msg);
      case detail::FailureKind::protocol:
        close_fd();
        detail::throw_error<comm_error>("the store at ", address(), " rejected a request: ", msg);
      default: detail::throw_error<comm_error>(msg);
    }
  }

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  int rank_;
  std::string job_token_;  ///< for connect_again()
  int world_size_ = 0;
  std::string job_id_;
  std::mutex mutex_;
  detail::ForkGuardedFd fd_;  ///< closed in children forked without exec: it is the rank's membership
  std::mutex interrupt_mutex_;  ///< guards active_fd_, interrupted_ (interrupt() runs while mutex_ is held)
  int active_fd_ = -1;          ///< fd_ while a request waits on it, else -1
  bool interrupted_ = false;
  pid_t pid_ = ::getpid();
  std::shared_ptr<void> owner_;
  std::string host_description_;
};

/// @brief Parses "host:port" or "[v6]:port".
/// @throws config_error naming the value when it is malformed
inline std::pair<std::string, int> parse_store_address(const std::string& text, const char* var = "ACCEL_STORE") {
  if (auto host_port = split_host_port(text)) return *host_port;
  detail::throw_error<config_error>(var, "='", text, "' is not host:port (port 1-65535)");
}

/// @brief Where the job's store lives and whether this process must host it (pure decision).
struct StorePlan {
  std::string host;
  int port = 0;
  bool host_here = false;  ///< this process (rank 0) starts the StoreServer
  /// Where MASTER_PORT is unset and the port derives from the job id: every port the store may be
  /// at (`port` first). Rank 0 hosts it at the first it can bind, the others look at each in turn.
  std::vector<int> derived_ports;
};

/// @brief Decides where the store is: ACCEL_STORE (accel launch hosts it) if set; otherwise rank 0
/// hosts it at MASTER_ADDR:MASTER_PORT, or MASTER_PORT+1 under torchrun's agent store (which
/// already occupies MASTER_PORT with torch's own TCPStore). Without MASTER_PORT, the ports are
/// derived from the job id (job_port), so concurrent jobs on one machine get stores of their own.
/// @throws config_error when no address is known (several machines and no MASTER_ADDR)
inline StorePlan plan_job_store(const LaunchEnv& env) {
  if (env.store_address) {
    auto [h, p] = parse_store_address(*env.store_address);
    return {h, p, false, {}};
  }
  if (env.master_addr.empty())
    detail::throw_error<config_error>("MASTER_ADDR is unset in a job on ", env.num_machines,
                                      " machines; set MASTER_ADDR to rank 0's host (or start the job with accel launch)");
  const int port = env.master_port + (env.torchelastic_agent_store ? 1 : 0);
  if (port <= 0 || port > 65535) detail::throw_error<config_error>("MASTER_PORT=", env.master_port, " gives store port ", port, ", outside 1-65535");
  StorePlan plan{env.master_addr, port, env.rank == 0, {}};
  if (env.master_port_derived && !env.torchelastic_agent_store)
    for (int i = 0; i < job_port_count; ++i) plan.derived_ports.push_back(job_port(env.job_id, i));
  return plan;
}

/// @brief Connects to the job's store (see plan_job_store), hosting it first on rank 0 when no
/// launcher does. Rank 0's server lives as long as the returned client, and on shutdown waits
/// (at most the timeout) for the other ranks to disconnect. The connection is the rank's
/// membership: the store tells the others when it closes (with or without a goodbye), and
/// declares ranks that do not connect within env.join_timeout never joined.
/// @throws comm_error / timeout_error when the store cannot be reached within the join timeout
///         (and the timeout), or refuses this process
inline std::shared_ptr<StoreClient> connect_job_store(const LaunchEnv& env) {
  const StorePlan plan = plan_job_store(env);
  std::shared_ptr<StoreServer> server;
  if (plan.host_here) {
    StoreServerOptions o;
    o.world_size = env.world_size;
    o.linger = env.timeout;
    o.job_id = env.job_id;
    o.join_timeout = env.join_timeout;
    // Said once per job: the rank hosting the store is the one whose address is shared.
    if (!env.rendezvous_warning.empty() && o.log) o.log("warning: " + env.rendezvous_warning);
    server = plan.derived_ports.empty() ? std::make_shared<StoreServer>(plan.host, static_cast<std::uint16_t>(plan.port), env.job_token, std::move(o))
                                        : std::make_shared<StoreServer>(plan.host, plan.derived_ports, env.job_token, std::move(o));
  }
  const auto reach_within = env.join_timeout.count() > 0 ? std::min(env.join_timeout, env.timeout) : env.timeout;
  std::shared_ptr<StoreClient> client;
  try {
    if (server || plan.derived_ports.empty())
      client = std::make_shared<StoreClient>(plan.host, server ? server->port() : plan.port, env.job_token, env.timeout, env.rank,
                                             env.world_size, env.job_id, reach_within);
    else
      client = std::make_shared<StoreClient>(plan.host, plan.derived_ports, env.job_token, env.timeout, env.rank, env.world_size,
                                             env.job_id, reach_within);
  } catch (const timeout_error& e) {
    if (plan.host_here) throw;
    const std::string why = detail::message_body(e);  // the new message has its own prefix
    detail::throw_error<timeout_error>(
        "rank ", env.rank, " could not join the job within ", text::format_ms(static_cast<std::uint64_t>(reach_within.count())),
        " (ACCEL_JOIN_TIMEOUT_S): ", env.store_address ? "the store accel launch hosts" : "rank 0, which hosts the store,",
        " did not answer; rank 0 did not start, or exited before creating its DistributedState (", why, ")");
  }
  client->set_host_description(env.store_address ? "accel launch" : "rank 0");
  if (server) client->keep_alive(std::move(server));
  return client;
}

namespace detail {
/// @brief The job's store connection of this process, shared by every DistributedState alive in it:
/// a second state (a helper's, say) neither hosts a second store on rank 0 nor, when it is
/// destroyed, says goodbye for a process that is still running.
inline std::shared_ptr<StoreClient> join_job_store(const LaunchEnv& env) {
  static std::mutex mutex;
  static std::weak_ptr<StoreClient> current;
  static std::string current_key;
  const std::string key = concat(env.job_id, '|', env.rank, '|', env.world_size, '|', env.store_address.value_or(""), '|',
                                 env.master_addr, ':', env.master_port);
  std::lock_guard lock(mutex);
  if (auto client = current.lock(); client && key == current_key) return client;
  auto client = connect_job_store(env);
  current = client, current_key = key;
  return client;
}

/// @brief Makes every DistributedState of a program that includes this header join its job's store
/// when created (runtime/distributed_state.hpp's seam), before any DistributedState defined after
/// this include is constructed.
inline const bool job_joiner_installed = (job_joiner() = &join_job_store, true);
}  // namespace detail

ACCEL_NAMESPACE_END
