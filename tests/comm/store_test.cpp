// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The TCP store: protocol, security, limits, timeouts, dead clients, the collective exchange.
#include <accel/comm/store.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/store_log.hpp"

using namespace std::chrono_literals;
using accel::StoreClient;
using accel::StoreServer;

namespace {

std::vector<std::byte> bytes(std::string_view s) {
  auto b = std::as_bytes(std::span<const char>(s.data(), s.size()));
  return {b.begin(), b.end()};
}
using accel_test::text;
using Log = accel_test::StoreLog;

// A raw TCP connection that speaks bytes, not the protocol.
accel::detail::Fd raw_connect(int port) {
  return accel::detail::connect_tcp("127.0.0.1", port, std::chrono::steady_clock::now() + 5s);
}
std::vector<std::byte> raw_reply(int fd) {
  std::vector<std::byte> all;
  std::byte buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.insert(all.end(), buf, buf + n);
  }
  return all;
}
void raw_send(int fd, const std::vector<std::byte>& b) {
  int err = 0;
  accel::detail::send_all(fd, b, std::chrono::steady_clock::now() + 5s, err);
}

}  // namespace

TEST_CASE("store: set, get, add, delete and compare_set behave like a key-value store", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options());
  REQUIRE(server.port() > 0);
  StoreClient c("127.0.0.1", server.port(), "tok", 5s);
  c.set("a", std::string_view("one"));
  REQUIRE(c.get_string("a") == "one");
  c.set("a", std::string_view("two"));
  REQUIRE(c.get_string("a") == "two");
  REQUIRE(c.add("n", 5) == 5);
  REQUIRE(c.add("n", -2) == 3);
  REQUIRE(c.get_string("n") == "3");
  REQUIRE(c.remove("n"));
  REQUIRE_FALSE(c.remove("n"));
  // compare_set: missing + empty expected sets; a wrong expectation returns the current value.
  REQUIRE(text(c.compare_set("k", {}, bytes("x"))) == "x");
  REQUIRE(text(c.compare_set("k", bytes("nope"), bytes("y"))) == "x");
  REQUIRE(text(c.compare_set("k", bytes("x"), bytes("y"))) == "y");
  REQUIRE(text(c.compare_set("missing", bytes("e"), bytes("d"))) == "e");
  REQUIRE_THROWS_WITH(c.add("k", 1), accel_test::contains("does not hold an integer"));
  // Binary values with NUL bytes survive.
  const std::vector<std::byte> bin = {std::byte{0}, std::byte{255}, std::byte{0}};
  c.set("bin", bin);
  REQUIRE(c.get("bin") == bin);
}

TEST_CASE("store: get waits until another client sets the key", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options());
  StoreClient waiter("127.0.0.1", server.port(), "tok", 10s);
  auto got = std::async(std::launch::async, [&] { return waiter.get_string("late"); });
  std::this_thread::sleep_for(50ms);
  StoreClient setter("127.0.0.1", server.port(), "tok", 10s);
  setter.set("late", std::string_view("here"));
  REQUIRE(got.get() == "here");
  auto both = std::async(std::launch::async, [&] { waiter.wait({"w1", "w2"}); return true; });
  setter.set("w1", std::string_view("1"));
  setter.set("w2", std::string_view("2"));
  REQUIRE(both.get());
}

TEST_CASE("store: a wait that times out names the key and the ranks that are not connected", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options(3));
  StoreClient c("127.0.0.1", server.port(), "tok", 5s, 0, 3);
  REQUIRE_THROWS_AS(c.get("never", 100ms), accel::timeout_error);
  REQUIRE_THROWS_WITH(c.get("never", 100ms),
                      accel_test::contains("timed out after 100 ms waiting for store key(s) 'never'; ranks connected: 0 of "
                                           "world size 3; rank 1 never connected; rank 2 never connected"));
  c.set("have", std::string_view("1"));
  REQUIRE_THROWS_WITH(c.wait({"have", "missing"}, 50ms), accel_test::contains("'missing'"));
  // The connection stays usable after a timeout.
  REQUIRE(c.get_string("have") == "1");
}

TEST_CASE("store: a wrong job token is refused with a clear error on both sides", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "right", log.options());
  REQUIRE_THROWS_AS(StoreClient("127.0.0.1", server.port(), "wrong", 5s), accel::comm_error);
  REQUIRE_THROWS_WITH(StoreClient("127.0.0.1", server.port(), "wrong", 5s),
                      accel_test::contains("refused this process: wrong job token"));
  REQUIRE_THROWS_WITH(StoreClient("127.0.0.1", server.port(), "", 5s), accel_test::contains("wrong job token"));
  for (int i = 0; i < 100 && !log.has("wrong job token"); ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(log.has("refused 127.0.0.1:"));
  REQUIRE(log.has("wrong job token"));
  // The server keeps serving good clients.
  StoreClient ok("127.0.0.1", server.port(), "right", 5s);
  ok.set("x", std::string_view("1"));
  REQUIRE(ok.get_string("x") == "1");
}

TEST_CASE("store: a process of another job is refused with both job ids, in constant time", "[store]") {
  Log log;
  auto o = log.options();
  o.job_id = "openmpi:1682178049";
  StoreServer server("127.0.0.1", 0, "openmpi:1682178049/9204d33e21c1a35d-e698b64070d9d2f7", o);
  SECTION("another job's process names both jobs, on both sides") {
    REQUIRE_THROWS_WITH(StoreClient("127.0.0.1", server.port(), "openmpi:1681195009/39551f887e70fa54-578687d42be2435d", 5s, 1, 2,
                                    "openmpi:1681195009"),
                        accel_test::contains("refused this process: wrong job token: this store serves job openmpi:1682178049 but "
                                             "this process belongs to job openmpi:1681195009; two jobs chose the same store "
                                             "address (give each its own MASTER_PORT)"));
    for (int i = 0; i < 100 && !log.has("openmpi:1681195009"); ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(log.has("this store serves job openmpi:1682178049 but this process belongs to job openmpi:1681195009"));
  }
  SECTION("the same job id with another token: the job's processes disagree, or two jobs share the id") {
    REQUIRE_THROWS_WITH(StoreClient("127.0.0.1", server.port(), "openmpi:1682178049/other-key", 5s, 1, 2, "openmpi:1682178049"),
                        accel_test::contains("wrong job token for job openmpi:1682178049: the tokens differ (ACCEL_JOB_TOKEN "
                                             "differs between the job's processes, or two jobs share this id)"));
  }
  SECTION("a client that names no job gets the plain refusal") {
    REQUIRE_THROWS_WITH(StoreClient("127.0.0.1", server.port(), "x", 5s),
                        accel_test::contains("wrong job token: this store serves another job, or ACCEL_JOB_TOKEN differs"));
  }
  SECTION("a job id does not stand in for the token") {
    REQUIRE_THROWS_AS(StoreClient("127.0.0.1", server.port(), "openmpi:1682178049", 5s, 1, 2, "openmpi:1682178049"), accel::comm_error);
  }
  StoreClient ok("127.0.0.1", server.port(), "openmpi:1682178049/9204d33e21c1a35d-e698b64070d9d2f7", 5s, 0, 2, "openmpi:1682178049");
  ok.set("x", std::string_view("1"));
  REQUIRE(ok.get_string("x") == "1");
}

TEST_CASE("store: a hello without the job id field (an older client) is still read", "[store]") {
  const auto old = accel::detail::WireWriter(accel::detail::Msg::hello)
                       .u32(accel::detail::store_magic).u32(accel::detail::store_protocol_version).str("tok").i32(1).i32(2).finish();
  const auto q = accel::detail::parse_request(std::span<const std::byte>(old).subspan(accel::detail::frame_header_bytes));
  REQUIRE((q.token == "tok" && q.rank == 1 && q.world == 2 && q.job_id.empty()));
  const auto now = accel::detail::encode_hello("tok", 1, 2, "slurm:77.0");
  REQUIRE(accel::detail::parse_request(std::span<const std::byte>(now).subspan(accel::detail::frame_header_bytes)).job_id == "slurm:77.0");
}

TEST_CASE("store: garbage, oversized and truncated frames are rejected without affecting other clients", "[store]") {
  Log log;
  accel::StoreServerOptions o = log.options();
  o.max_frame_bytes = 1024;
  StoreServer server("127.0.0.1", 0, "tok", o);
  StoreClient good("127.0.0.1", server.port(), "tok", 5s);
  good.set("k", std::string_view("v"));

  SECTION("a frame announcing 4 GiB before the handshake gets an error reply and is closed") {
    auto fd = raw_connect(server.port());
    raw_send(fd.get(), {std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0xff}});
    const auto reply = raw_reply(fd.get());
    REQUIRE(text(reply).find("exceeds the limit of 4096 bytes") != std::string::npos);
  }
  SECTION("random bytes get a protocol error") {
    auto fd = raw_connect(server.port());
    raw_send(fd.get(), bytes(std::string("\x05\x00\x00\x00\x63garbage-after", 18)));
    const auto reply = raw_reply(fd.get());
    REQUIRE(text(reply).find("unknown store request type 99") != std::string::npos);
  }
  SECTION("a request before the handshake is refused") {
    auto fd = raw_connect(server.port());
    raw_send(fd.get(), accel::detail::WireWriter(accel::detail::Msg::get).str("k").u64(10).finish());
    REQUIRE(text(raw_reply(fd.get())).find("the first store message must be a hello") != std::string::npos);
  }
  SECTION("an authenticated client sending a frame over the limit is cut off with a message") {
    StoreClient big("127.0.0.1", server.port(), "tok", 5s);
    std::vector<std::byte> value(2000);
    REQUIRE_THROWS_WITH(big.set("big", value), accel_test::contains("exceeds the limit of 1024 bytes"));
  }
  SECTION("a truncated frame followed by a hang-up is simply dropped") {
    auto fd = raw_connect(server.port());
    raw_send(fd.get(), {std::byte{100}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{1}});
    fd.reset();
  }
  SECTION("a wrong magic number is refused") {
    auto fd = raw_connect(server.port());
    raw_send(fd.get(), accel::detail::WireWriter(accel::detail::Msg::hello).u32(7).u32(1).str("tok").i32(-1).i32(0).finish());
    REQUIRE(text(raw_reply(fd.get())).find("bad magic number") != std::string::npos);
  }
  REQUIRE(good.get_string("k") == "v");
  StoreClient again("127.0.0.1", server.port(), "tok", 5s);
  REQUIRE(again.get_string("k") == "v");
}

TEST_CASE("store: a client that dies is noticed at once by waiters, not after the timeout", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options(2));
  StoreClient r0("127.0.0.1", server.port(), "tok", 60s, 0, 2);
  // Rank 1 connects with a raw socket and vanishes without a goodbye (what a crash looks like).
  auto fd = raw_connect(server.port());
  raw_send(fd.get(), accel::detail::encode_hello("tok", 1, 2));
  {
    std::byte head[5];
    REQUIRE(::recv(fd.get(), head, 5, MSG_WAITALL) == 5);
  }
  auto waiting = std::async(std::launch::async, [&] { return r0.get_string("from-rank-1"); });
  std::this_thread::sleep_for(50ms);
  const auto t0 = std::chrono::steady_clock::now();
  fd.reset();
  REQUIRE_THROWS_WITH(waiting.get(), accel_test::contains("rank 1 lost its connection to the store without saying goodbye (the "
                                                          "process crashed, was killed, or ended without destroying its "
                                                          "DistributedState) while this process waited for store key 'from-rank-1'"));
  REQUIRE(std::chrono::steady_clock::now() - t0 < 30s);
  // Later waits fail at once too; keys already present are still served.
  REQUIRE_THROWS_WITH(r0.get("other"), accel_test::contains("rank 1 lost its connection to the store without saying goodbye"));
  r0.set("present", std::string_view("yes"));
  REQUIRE(r0.get_string("present") == "yes");
}

TEST_CASE("store: connections probe a silent peer, so a machine that vanished counts as gone", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options());
  auto fd = raw_connect(server.port());
  int on = 0, idle = 0, probes = 0;
  unsigned user_timeout = 0;
  socklen_t n = sizeof on;
  REQUIRE(::getsockopt(fd.get(), SOL_SOCKET, SO_KEEPALIVE, &on, &n) == 0);
  n = sizeof idle;
  REQUIRE(::getsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, &n) == 0);
  n = sizeof probes;
  REQUIRE(::getsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPCNT, &probes, &n) == 0);
  n = sizeof user_timeout;
  REQUIRE(::getsockopt(fd.get(), IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, &n) == 0);
  CHECK(on == 1);
  CHECK(idle == 10);
  CHECK(probes == 3);
  CHECK(user_timeout == 25'000u);
}

TEST_CASE("store: every DistributedState of a process joins the job through one shared connection", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "0123456789abcdef", log.options(2));
  // This process as rank 1 of an accel launch job whose store the test hosts.
  const std::pair<const char*, std::string> vars[] = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"ACCEL_LAUNCHED", "1"},
      {"ACCEL_STORE", server.address()}, {"ACCEL_JOB_TOKEN", "0123456789abcdef"}, {"ACCEL_USE_CPU", "1"}};
  for (const auto& [k, v] : vars) REQUIRE(::setenv(k, v.c_str(), 1) == 0);
  struct Restore {
    const std::pair<const char*, std::string>* begin;
    const std::pair<const char*, std::string>* end;
    ~Restore() {
      for (auto p = begin; p != end; ++p) ::unsetenv(p->first);
    }
  } restore{std::begin(vars), std::end(vars)};
  {
    accel::DistributedState a;
    REQUIRE(a.job_store() != nullptr);
    {
      accel::DistributedState b;
      REQUIRE(b.job_store() == a.job_store());
    }
    // b is gone but a still holds the membership: rank 1 has not said goodbye.
    StoreClient r0("127.0.0.1", server.port(), "0123456789abcdef", 5s, 0, 2);
    auto f = std::async(std::launch::async, [&] { return a.job_store()->exchange("shared", 1, 2, {}, "barrier #1"); });
    REQUIRE(r0.exchange("shared", 0, 2, {}, "barrier #1").size() == 2);
    REQUIRE(f.get().size() == 2);
  }
  accel::DistributedState c;
  REQUIRE(c.job_store() != nullptr);
  accel::DistributedState detached(accel::StateOptions{.join_job = false});
  REQUIRE(detached.job_store() == nullptr);
}

TEST_CASE("store: exchange returns every rank's value in rank order", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options());
  for (int world : {1, 2, 3, 5}) {
    std::vector<std::unique_ptr<StoreClient>> clients;
    for (int r = 0; r < world; ++r) clients.push_back(std::make_unique<StoreClient>("127.0.0.1", server.port(), "tok", 10s, r, 0));
    std::vector<std::future<accel::Blobs>> futures;
    for (int r = world - 1; r >= 0; --r)
      futures.push_back(std::async(std::launch::async, [&, r] {
        return clients[static_cast<std::size_t>(r)]->exchange("x" + std::to_string(world), r, world,
                                                              bytes(std::string(static_cast<std::size_t>(r), 'a')), "test #1");
      }));
    for (auto& f : futures) {
      auto blobs = f.get();
      REQUIRE(blobs.size() == static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r) REQUIRE(text(blobs[static_cast<std::size_t>(r)]) == std::string(static_cast<std::size_t>(r), 'a'));
    }
  }
}

TEST_CASE("store: an exchange that times out names the ranks that have not arrived", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options(3));
  StoreClient r0("127.0.0.1", server.port(), "tok", 5s, 0, 3);
  StoreClient r1("127.0.0.1", server.port(), "tok", 5s, 1, 3);
  auto a = std::async(std::launch::async, [&] { return r1.exchange("k", 1, 3, {}, "barrier #7", 10s); });
  REQUIRE_THROWS_AS(r0.exchange("k", 0, 3, {}, "barrier #7", 150ms), accel::timeout_error);
  REQUIRE_THROWS_WITH(a.get(), accel_test::contains("timed out after 150 ms in barrier #7: rank 2 (never connected) has not arrived"));
}

TEST_CASE("store: an exchange fails at once when a missing rank exits or dies", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options(2));
  StoreClient r0("127.0.0.1", server.port(), "tok", 60s, 0, 2);
  SECTION("exited cleanly: the message points at a collective called on only some ranks") {
    { StoreClient r1("127.0.0.1", server.port(), "tok", 60s, 1, 2); }
    REQUIRE_THROWS_WITH(r0.exchange("k", 0, 2, {}, "gather_object #3"),
                        accel_test::contains("rank 1 exited without joining gather_object #3 (was the collective called on "
                                             "only some ranks"));
  }
  SECTION("died while the exchange waited") {
    auto fd = raw_connect(server.port());
    raw_send(fd.get(), accel::detail::encode_hello("tok", 1, 2));
    std::byte head[5];
    REQUIRE(::recv(fd.get(), head, 5, MSG_WAITALL) == 5);
    auto f = std::async(std::launch::async, [&] { return r0.exchange("k2", 0, 2, {}, "gather_object #4"); });
    std::this_thread::sleep_for(50ms);
    fd.reset();
    REQUIRE_THROWS_WITH(f.get(), accel_test::contains("rank 1 lost its connection to the store without saying goodbye (the process "
                                                      "crashed, was killed, or ended without destroying its DistributedState), so "
                                                      "it cannot join gather_object #4"));
  }
}

TEST_CASE("store: two ranks claiming the same rank in one exchange is reported", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options());
  StoreClient a("127.0.0.1", server.port(), "tok", 5s);
  StoreClient b("127.0.0.1", server.port(), "tok", 5s);
  auto f = std::async(std::launch::async, [&] { return a.exchange("d", 0, 2, {}, "barrier #1"); });
  std::this_thread::sleep_for(50ms);
  REQUIRE_THROWS_WITH(b.exchange("d", 0, 2, {}, "barrier #1"), accel_test::contains("joined barrier #1 twice"));
  REQUIRE_THROWS_WITH(f.get(), accel_test::contains("joined barrier #1 twice"));
}

TEST_CASE("store: the server binds only the address it is given", "[store]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options());
  // Every 127/8 address is loopback on Linux, but a socket bound to 127.0.0.1 does not answer on 127.0.0.2.
  REQUIRE_THROWS_AS(accel::detail::connect_tcp("127.0.0.2", server.port(), std::chrono::steady_clock::now() + 100ms),
                    accel::timeout_error);
  REQUIRE_NOTHROW(accel::detail::connect_tcp("127.0.0.1", server.port(), std::chrono::steady_clock::now() + 1s));
  // A second server on the same address and port fails with a message naming it.
  REQUIRE_THROWS_WITH(StoreServer("127.0.0.1", server.port(), "tok", log.options()),
                      accel_test::contains("cannot listen on 127.0.0.1:" + std::to_string(server.port())));
  REQUIRE_THROWS_WITH(StoreServer("127.0.0.1", server.port(), "tok", log.options()), accel_test::contains("Address already in use"));
}

TEST_CASE("store: connecting to a port nobody serves times out with the address", "[store]") {
  Log log;
  int port = 0;
  {
    StoreServer probe("127.0.0.1", 0, "tok", log.options());
    port = probe.port();
  }
  REQUIRE_THROWS_AS(StoreClient("127.0.0.1", port, "tok", 200ms), accel::timeout_error);
  REQUIRE_THROWS_WITH(StoreClient("127.0.0.1", port, "tok", 200ms),
                      accel_test::contains("could not connect to the store at 127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("store: a client notices at once when the store goes away", "[store]") {
  Log log;
  auto server = std::make_unique<StoreServer>("127.0.0.1", 0, "tok", log.options());
  StoreClient c("127.0.0.1", server->port(), "tok", 60s);
  auto f = std::async(std::launch::async, [&] { return c.get("never"); });
  std::this_thread::sleep_for(50ms);
  server.reset();
  REQUIRE_THROWS_WITH(f.get(), accel_test::contains("lost the connection to the store at 127.0.0.1:"));
}

namespace {
/// Forks a child that runs `body` and then sleeps `linger` (holding what it inherited) before it
/// _exits with body's result; returns its pid.
template <class Body>
pid_t fork_child(Body body, std::chrono::milliseconds linger) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int code = body();
    std::this_thread::sleep_for(linger);
    std::_Exit(code);
  }
  REQUIRE(pid > 0);
  return pid;
}
int wait_exit_code(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
}  // namespace

TEST_CASE("store: a child forked without exec cannot use its parent's store connection, and says so", "[store][fork]") {
  Log log;
  StoreServer server("127.0.0.1", 0, "tok", log.options());
  StoreClient c("127.0.0.1", server.port(), "tok", 60s, 0, 1);
  c.set("before", std::string_view("1"));
  const pid_t child = fork_child(
      [&] {
        try {
          c.set("from child", std::string_view("1"));
          return 1;
        } catch (const accel::comm_error& e) {
          return std::string_view(e.what()).find("is a copy of rank 0 made by fork() without exec") != std::string_view::npos ? 0 : 2;
        }
      },
      0ms);
  REQUIRE(wait_exit_code(child) == 0);
  // The child's exit did not touch the parent's connection.
  REQUIRE(c.get_string("before") == "1");
  c.set("after", std::string_view("1"));
  REQUIRE(!log.has("rank 0"));  // the store saw no departure of rank 0
}

TEST_CASE("store: a child forked without exec keeps neither the server's sockets nor a rank's connection open", "[store][fork]") {
  SECTION("the server's: its clients notice at once that the hosting process stopped serving") {
    auto server = std::make_unique<StoreServer>("127.0.0.1", 0, "tok");
    StoreClient c("127.0.0.1", server->port(), "tok", 60s);
    auto f = std::async(std::launch::async, [&] { return c.get("never", 1s); });
    std::this_thread::sleep_for(50ms);
    const pid_t child = fork_child([] { return 0; }, 20s);
    server.reset();
    const auto sure = [&] {
      ::kill(child, SIGKILL);
      wait_exit_code(child);
    };
    try {
      f.get();
      sure();
      FAIL("get returned a value");
    } catch (const accel::timeout_error& e) {
      sure();
      FAIL("timed out instead of noticing the store had gone: " << e.what());
    } catch (const accel::comm_error& e) {
      sure();
      REQUIRE_THAT(e.what(), accel_test::contains("lost the connection to the store at 127.0.0.1:"));
    }
  }
  SECTION("a rank's: the store sees the rank leave when its own process closes the connection") {
    Log log;
    StoreServer server("127.0.0.1", 0, "tok", log.options());
    StoreClient waiter("127.0.0.1", server.port(), "tok", 60s, 0, 2);
    auto rank1 = std::make_unique<StoreClient>("127.0.0.1", server.port(), "tok", 60s, 1, 2);
    const auto mine = bytes("0");
    auto f = std::async(std::launch::async, [&] { return waiter.exchange("k", 0, 2, mine, "test exchange", 5s); });
    std::this_thread::sleep_for(50ms);
    const pid_t child = fork_child([] { return 0; }, 20s);
    rank1.reset();  // closes its connection: the store must see it now, not when the child ends
    bool failed_at_once = false;
    try {
      f.get();
    } catch (const accel::timeout_error&) {
    } catch (const accel::comm_error& e) {
      failed_at_once = std::string_view(e.what()).find("rank 1") != std::string_view::npos;
    }
    ::kill(child, SIGKILL);
    wait_exit_code(child);
    REQUIRE(failed_at_once);
  }
}

TEST_CASE("store: plan_job_store follows accel launch, torchrun and its agent store", "[store]") {
  accel::LaunchEnv env;
  env.rank = 1, env.world_size = 2, env.master_addr = "10.0.0.1", env.master_port = 29500;
  auto p = accel::plan_job_store(env);
  REQUIRE((p.host == "10.0.0.1" && p.port == 29500 && !p.host_here));
  env.rank = 0;
  REQUIRE(accel::plan_job_store(env).host_here);
  env.torchelastic_agent_store = true;
  REQUIRE(accel::plan_job_store(env).port == 29501);
  env.store_address = "127.0.0.1:4000";
  p = accel::plan_job_store(env);
  REQUIRE((p.host == "127.0.0.1" && p.port == 4000 && !p.host_here));
  env.store_address = "[::1]:4001";
  p = accel::plan_job_store(env);
  REQUIRE((p.host == "::1" && p.port == 4001));
  env.store_address = "nohost";
  REQUIRE_THROWS_WITH(accel::plan_job_store(env), accel_test::contains("ACCEL_STORE='nohost' is not host:port"));
  env.store_address.reset();
  env.master_addr = "";
  REQUIRE_THROWS_AS(accel::plan_job_store(env), accel::config_error);
}

namespace {
// Whether nothing listens or is bound at 127.0.0.1:port right now.
bool port_free(int port) {
  int err = 0;
  return static_cast<bool>(accel::detail::try_listen_tcp("127.0.0.1", port, 1, err));
}
}  // namespace

TEST_CASE("store: with derived ports, rank 0 hosts the store past ports held by others and every rank finds it", "[store]") {
  // A job id whose first four derived ports are free now; the test then occupies three of them the
  // ways a real machine does: another job's store, a socket bound without listening (a connection's
  // ephemeral port), and a service that answers with something that is not an accel store.
  std::string id;
  for (int n = 0; id.empty(); ++n) {
    const std::string candidate = "test:derived-" + std::to_string(::getpid()) + "-" + std::to_string(n);
    bool all_free = true;
    for (int i = 0; i < 4; ++i) all_free = all_free && port_free(accel::job_port(candidate, i));
    if (all_free) id = candidate;
  }
  std::vector<int> ports;
  for (int i = 0; i < accel::job_port_count; ++i) ports.push_back(accel::job_port(id, i));
  REQUIRE(ports[0] == accel::job_port(id));

  Log other_log;
  StoreServer other_job("127.0.0.1", static_cast<std::uint16_t>(ports[0]), "another-token", other_log.options());
  accel::detail::Fd bound(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(ports[1]));
  REQUIRE(::bind(bound.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  int err = 0;
  accel::detail::Fd foreign = accel::detail::try_listen_tcp("127.0.0.1", ports[2], 16, err);
  REQUIRE(foreign);
  std::atomic<bool> stop{false};
  std::thread foreign_service([&] {  // answers every connection like a web server, then closes it
    while (!stop) {
      const int c = ::accept(foreign.get(), nullptr, nullptr);
      if (c < 0) {
        std::this_thread::sleep_for(1ms);
        continue;
      }
      raw_send(c, bytes("HTTP/1.1 400 Bad Request\r\n\r\n"));
      ::close(c);
    }
  });

  accel::LaunchEnv env;
  env.world_size = 3, env.master_addr = "127.0.0.1", env.timeout = 20s, env.join_timeout = 20s;
  env.job_id = id, env.job_token = id, env.master_port = ports[0], env.master_port_derived = true;
  REQUIRE(accel::plan_job_store(env).derived_ports == ports);
  std::vector<std::future<std::string>> others;
  for (int r = 1; r < 3; ++r)
    others.push_back(std::async(std::launch::async, [env, r]() mutable {
      env.rank = r;
      return accel::connect_job_store(env)->get_string("hello");
    }));
  std::this_thread::sleep_for(50ms);  // the others look for the store before it exists, too
  env.rank = 0;
  auto c0 = accel::connect_job_store(env);
  CHECK(c0->address() == "127.0.0.1:" + std::to_string(ports[3]));
  c0->set("hello", std::string_view("world"));
  for (auto& f : others) CHECK(f.get() == "world");
  // The other job's store turned the probes away without logging them as an intrusion.
  CHECK_FALSE(other_log.has("refused"));
  stop = true;
  foreign_service.join();
}

TEST_CASE("store: when every derived port is held, rank 0's error names them all and how to fix it", "[store]") {
  std::vector<int> ports;
  std::vector<accel::detail::Fd> held;
  for (int i = 0; i < 3; ++i) {
    int err = 0;
    held.push_back(accel::detail::try_listen_tcp("127.0.0.1", 0, 1, err));
    REQUIRE(held.back());
    ports.push_back(accel::detail::socket_port(held.back().get()));
  }
  Log log;
  try {
    StoreServer s("127.0.0.1", ports, "tok", log.options());
    FAIL("listening on a held port succeeded");
  } catch (const accel::comm_error& e) {
    const std::string what = e.what();
    for (int p : ports) CHECK_THAT(what, accel_test::contains(std::to_string(p)));
    CHECK_THAT(what, accel_test::contains("set MASTER_PORT to a free port"));
  }
}

TEST_CASE("store: connect_job_store on rank 0 hosts the store the other ranks join", "[store]") {
  int port = 0;
  {
    Log log;
    StoreServer probe("127.0.0.1", 0, "tok", log.options());
    port = probe.port();
  }
  accel::LaunchEnv env;
  env.world_size = 2, env.master_addr = "127.0.0.1", env.master_port = port, env.timeout = 10s, env.job_token = "t";
  auto other = std::async(std::launch::async, [env]() mutable {
    env.rank = 1;
    auto c = accel::connect_job_store(env);
    return c->get_string("hello");
  });
  env.rank = 0;
  auto c0 = accel::connect_job_store(env);
  c0->set("hello", std::string_view("world"));
  REQUIRE(other.get() == "world");
}
