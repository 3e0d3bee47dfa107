// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The TCP store under hostile or careless peers: idle connections that never say hello, floods
// beyond the descriptor limit, and hellos or exchanges announcing absurd world sizes.
#include <accel/comm/store.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/store_log.hpp"

using namespace std::chrono_literals;
using accel::StoreClient;
using accel::StoreServer;
using accel::detail::Fd;

namespace {

using accel_test::text;
using Log = accel_test::StoreLog;

// A loopback connection whose connect() does not wait for the server to accept it, as a flood
// of clients (or a port scanner) opens them.
Fd connect_nonblocking(int port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a);
  REQUIRE((rc == 0 || errno == EINPROGRESS));
  return fd;
}

Fd connect_blocking(int port) { return accel::detail::connect_tcp("127.0.0.1", port, std::chrono::steady_clock::now() + 5s); }

void send_bytes(int fd, const std::vector<std::byte>& b) {
  int err = 0;
  REQUIRE(accel::detail::send_all(fd, b, std::chrono::steady_clock::now() + 5s, err) == accel::detail::IoStatus::ok);
}

// Everything the server sends until it closes the connection, or until `limit` passes.
struct Received {
  std::vector<std::byte> bytes;
  bool closed = false;  ///< the server closed the connection (EOF or reset) within the limit
};
Received read_until_closed(int fd, std::chrono::milliseconds limit) {
  Received r;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::byte buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, accel::detail::poll_ms(deadline)) <= 0) return r;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      r.bytes.insert(r.bytes.end(), buf, buf + n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    r.closed = true;
    return r;
  }
}

// Raises this process's soft limit on open files towards `want` (never above the hard limit) and
// puts the old one back at the end of the test.
struct NofileLimit {
  rlimit old{};
  rlim_t now = 0;
  explicit NofileLimit(rlim_t want) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
    rlimit raised = old;
    raised.rlim_cur = std::max(old.rlim_cur, std::min(want, old.rlim_max));
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &raised) == 0);
    now = raised.rlim_cur;
  }
  ~NofileLimit() { ::setrlimit(RLIMIT_NOFILE, &old); }
};

// A StoreServer in a forked child whose limit on open files is `nofile`, so running out of
// descriptors hits the server and not the test. The child sends its port, then answers commands:
// 'c' measures the CPU time the child uses over one second and counts the server's log lines about
// the descriptor limit; EOF on the command pipe ends it.
class ServerProcess {
 public:
  ServerProcess(rlim_t nofile, accel::StoreServerOptions options) {
    int cmd[2], rep[2];
    REQUIRE(::pipe2(cmd, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(rep, O_CLOEXEC) == 0);
    pid_ = ::fork();  // the test process has no other threads here, so the child may do anything
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(cmd[1]), ::close(rep[0]);
      ::_exit(child(nofile, std::move(options), cmd[0], rep[1]));
    }
    ::close(cmd[0]), ::close(rep[1]);
    cmd_.reset(cmd[1]), rep_.reset(rep[0]);
    port_ = static_cast<int>(read_i64());
    REQUIRE(port_ > 0);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() {
    cmd_.reset();
    for (int i = 0; i < 500; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(10ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  [[nodiscard]] int port() const noexcept { return port_; }

  struct Sample {
    double cpu_seconds = 0;  ///< CPU the child used during one second of wall time
    std::int64_t limit_logs = 0;
  };
  Sample sample() {
    const char c = 'c';
    REQUIRE(::write(cmd_.get(), &c, 1) == 1);
    Sample s;
    s.cpu_seconds = static_cast<double>(read_i64()) / 1e6;
    s.limit_logs = read_i64();
    return s;
  }

 private:
  static std::int64_t cpu_us() {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<std::int64_t>(t.tv_sec) * 1'000'000 + t.tv_nsec / 1000;
  }
  static void write_i64(int fd, std::int64_t v) { [[maybe_unused]] auto n = ::write(fd, &v, sizeof v); }

  static int child(rlim_t nofile, accel::StoreServerOptions options, int cmd, int rep) {
    try {
      rlimit l{};
      ::getrlimit(RLIMIT_NOFILE, &l);
      l.rlim_cur = nofile;
      if (::setrlimit(RLIMIT_NOFILE, &l) != 0) return write_i64(rep, -1), 1;
      std::atomic<std::int64_t> limit_logs{0};
      options.log = [&limit_logs](const std::string& m) {
        if (m.find("RLIMIT_NOFILE") != std::string::npos) ++limit_logs;
        std::fprintf(stderr, "[store child] %s\n", m.c_str());
      };
      StoreServer server("127.0.0.1", 0, "tok", std::move(options));
      write_i64(rep, server.port());
      char c = 0;
      while (::read(cmd, &c, 1) == 1) {
        // Only the server thread works meanwhile (this one sleeps), so the process's CPU time
        // over the second is the server loop's.
        const auto before = cpu_us();
        std::this_thread::sleep_for(1s);
        write_i64(rep, cpu_us() - before);
        write_i64(rep, limit_logs.load());
      }
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[store child] %s\n", e.what());
      write_i64(rep, -1);
      return 1;
    }
  }

  std::int64_t read_i64() {
    std::int64_t v = -1;
    pollfd p{rep_.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 30'000) == 1);
    REQUIRE(::read(rep_.get(), &v, sizeof v) == static_cast<ssize_t>(sizeof v));
    return v;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  Fd cmd_, rep_;
};

}  // namespace

TEST_CASE("store flood: a connection that never says hello is closed after the handshake deadline", "[store][flood]") {
  Log log;
  auto o = log.options();
  o.handshake_timeout = 300ms;
  StoreServer server("127.0.0.1", 0, "tok", o);
  auto idle = connect_blocking(server.port());
  // A rank that did say hello may stay idle far longer than the deadline.
  StoreClient rank("127.0.0.1", server.port(), "tok", 5s);
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = read_until_closed(idle.get(), 10s);
  REQUIRE(got.closed);
  REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
  REQUIRE_THAT(text(got.bytes), accel_test::contains("no hello within 300 ms of connecting"));
  REQUIRE(log.has("no hello within 300 ms of connecting"));
  std::this_thread::sleep_for(400ms);
  rank.set("k", std::string_view("v"));
  REQUIRE(rank.get_string("k") == "v");
}

TEST_CASE("store flood: past the cap on connections without a hello, the oldest ones are dropped", "[store][flood]") {
  Log log;
  auto o = log.options();
  o.max_pending_connections = 8;
  o.handshake_timeout = 60s;  // far away: only the cap can close the idle ones
  StoreServer server("127.0.0.1", 0, "tok", o);
  std::vector<Fd> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(connect_blocking(server.port()));
  const auto oldest = read_until_closed(idle.front().get(), 10s);
  REQUIRE(oldest.closed);
  REQUIRE_THAT(text(oldest.bytes), accel_test::contains("connections without a hello"));
  // A real client still gets in at once and works.
  StoreClient c("127.0.0.1", server.port(), "tok", 10s);
  c.set("k", std::string_view("v"));
  REQUIRE(c.get_string("k") == "v");
  // The newest idle connection was not the one sacrificed.
  REQUIRE_FALSE(read_until_closed(idle.back().get(), 100ms).closed);
}

TEST_CASE("store flood: 2000 idle connections beyond the descriptor limit do not lock out a real client", "[store][flood]") {
  constexpr rlim_t server_files = 256;
  NofileLimit mine(2000 + 300);
  const int flood = static_cast<int>(std::min<rlim_t>(2000, mine.now - 100));
  REQUIRE(static_cast<rlim_t>(flood) > 2 * server_files);
  accel::StoreServerOptions o;
  o.handshake_timeout = 60s;  // far away: the store must cope with the flood itself
  ServerProcess server(server_files, o);
  std::vector<Fd> idle;
  for (int i = 0; i < flood; ++i) idle.push_back(connect_nonblocking(server.port()));
  std::this_thread::sleep_for(200ms);
  // Bounded by the client's timeout: on failure it throws instead of hanging.
  StoreClient c("127.0.0.1", server.port(), "tok", 10s);
  c.set("k", std::string_view("v"));
  REQUIRE(c.get_string("k") == "v");
  StoreClient d("127.0.0.1", server.port(), "tok", 10s);
  REQUIRE(d.get_string("k") == "v");
}

TEST_CASE("store flood: out of descriptors, the store loop sleeps instead of spinning and says so once", "[store][flood]") {
  // 64 descriptors: ranks fill them with authenticated connections, so there is no idle one to
  // drop and accept() keeps failing with EMFILE while more clients queue up.
  ServerProcess server(64, {});
  std::vector<std::unique_ptr<StoreClient>> ranks;
  for (int i = 0; i < 3; ++i) ranks.push_back(std::make_unique<StoreClient>("127.0.0.1", server.port(), "tok", 10s));
  std::vector<Fd> hold;
  for (int i = 0; i < 100; ++i) {
    hold.push_back(connect_blocking(server.port()));
    send_bytes(hold.back().get(), accel::detail::encode_hello("tok", -1, 0));
  }
  for (int i = 0; i < 100; ++i) hold.push_back(connect_nonblocking(server.port()));
  std::this_thread::sleep_for(300ms);
  const auto s = server.sample();
  CHECK(s.cpu_seconds >= 0);
  REQUIRE(s.cpu_seconds < 0.25);
  REQUIRE(s.limit_logs == 1);
  // The ranks already connected keep working.
  ranks[0]->set("k", std::string_view("v"));
  REQUIRE(ranks[2]->get_string("k") == "v");
}

TEST_CASE("store flood: a hello or exchange with an absurd world size is refused and the store keeps serving", "[store][flood]") {
  Log log;
  SECTION("a job of unknown size") {
    StoreServer server("127.0.0.1", 0, "tok", log.options(0));
    auto fd = connect_blocking(server.port());
    send_bytes(fd.get(), accel::detail::encode_hello("tok", -1, INT_MAX));
    const auto got = read_until_closed(fd.get(), 10s);
    REQUIRE(got.closed);
    REQUIRE_THAT(text(got.bytes), accel_test::contains("world size 2147483647 exceeds the store's limit of 1048576 ranks"));
    auto fd2 = connect_blocking(server.port());
    send_bytes(fd2.get(), accel::detail::encode_hello("tok", INT_MAX - 1, 0));
    REQUIRE_THAT(text(read_until_closed(fd2.get(), 10s).bytes), accel_test::contains("rank 2147483646 exceeds the store's limit"));
    // An authenticated client asking for an exchange among 2^31-1 ranks gets an error, not the
    // server's memory.
    StoreClient c("127.0.0.1", server.port(), "tok", 5s);
    REQUIRE_THROWS_WITH(c.exchange("x", 0, INT_MAX, {}, "huge #1"),
                        accel_test::contains("huge #1 with world size 2147483647, over the store's limit of 1048576 ranks"));
    c.set("k", std::string_view("v"));
    REQUIRE(c.get_string("k") == "v");
  }
  SECTION("a job of 4 ranks") {
    StoreServer server("127.0.0.1", 0, "tok", log.options(4));
    auto fd = connect_blocking(server.port());
    send_bytes(fd.get(), accel::detail::encode_hello("tok", -1, INT_MAX));
    REQUIRE_THAT(text(read_until_closed(fd.get(), 10s).bytes),
                 accel_test::contains("world size 2147483647 does not match the job's world size 4"));
    auto fd2 = connect_blocking(server.port());
    send_bytes(fd2.get(), accel::detail::encode_hello("tok", 7, 0));
    REQUIRE_THAT(text(read_until_closed(fd2.get(), 10s).bytes), accel_test::contains("rank 7 is outside the job's world size 4"));
    StoreClient c("127.0.0.1", server.port(), "tok", 5s, 0, 4);
    REQUIRE_THROWS_WITH(c.exchange("x", 0, 1000, {}, "wide #1"),
                        accel_test::contains("wide #1 with world size 1000, but the job's world size is 4"));
    REQUIRE_THROWS_WITH(c.exchange("y", 0, INT_MAX, {}, "huge #2"), accel_test::contains("the job's world size is 4"));
    c.set("k", std::string_view("v"));
    REQUIRE(c.get_string("k") == "v");
  }
  REQUIRE(log.has("refused 127.0.0.1:"));
}
