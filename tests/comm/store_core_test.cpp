// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The store's state machine without sockets: rank membership and liveness. Time is passed in, so
// the join deadline is tested at exact instants, and a connection "closing" is one call.
#include <accel/comm/store_core.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "support/catch.hpp"

using namespace std::chrono_literals;
using accel::detail::FailureKind;
using accel::detail::Msg;
using accel::detail::StoreClock;
using accel::detail::StoreCore;
using accel::detail::StoreCoreOptions;
using accel::detail::WireReader;
using accel::detail::WireWriter;

namespace {

// One reply as the client would read it: its type, and for a failure its kind and message.
struct Reply {
  Msg type{};
  FailureKind kind{};
  std::string message;
};

struct Harness {
  StoreCore core;
  StoreClock::time_point t0 = StoreClock::time_point{} + 1000h;
  std::vector<std::string> log;

  explicit Harness(std::chrono::milliseconds join_timeout, int world = 3) : core(options(join_timeout, world)) {}

  StoreCoreOptions options(std::chrono::milliseconds join_timeout, int world) {
    StoreCoreOptions o;
    o.job_token = "tok";
    o.world_size = world;
    o.log = [this](const std::string& m) { log.push_back(m); };
    o.join_timeout = join_timeout;
    return o;
  }

  StoreClock::time_point at(std::chrono::milliseconds since_start) const { return t0 + since_start; }

  // Replies queued on connection `id` since the last call.
  std::vector<Reply> replies(StoreCore::ConnId id) {
    std::vector<Reply> out;
    auto& conns = core.connections();
    auto it = conns.find(id);
    if (it == conns.end()) return out;
    for (const auto& chunk : it->second.out) {
      WireReader r(std::span<const std::byte>(*chunk).subspan(accel::detail::frame_header_bytes));
      Reply rep;
      rep.type = static_cast<Msg>(r.u8());
      if (rep.type == Msg::failure) rep.kind = static_cast<FailureKind>(r.u8()), rep.message = r.str();
      out.push_back(rep);
    }
    it->second.out.clear();
    return out;
  }

  void send(StoreCore::ConnId id, const std::vector<std::byte>& frame, StoreClock::time_point now) {
    core.receive(id, frame, now);
    core.resume(now);
  }

  // Connection `id` opens at `now` and says hello as `rank`.
  void join(StoreCore::ConnId id, int rank, StoreClock::time_point now, int world = 3) {
    core.open(id, "peer" + std::to_string(id), now);
    send(id, accel::detail::encode_hello("tok", rank, world), now);
    const auto r = replies(id);
    REQUIRE(r.size() == 1);
    REQUIRE(r[0].type == Msg::ok);
  }

  void exchange(StoreCore::ConnId id, int rank, const std::string& label, StoreClock::time_point now, int world = 3) {
    send(id, WireWriter(Msg::exchange).str("k/" + label).i32(rank).i32(world).u64(300'000).str(label).str("v").finish(), now);
  }

  void bye(StoreCore::ConnId id, StoreClock::time_point now) { send(id, WireWriter(Msg::bye).finish(), now); }
};

}  // namespace

TEST_CASE("store core: a rank that never connects within the join timeout fails the exchanges waiting for it", "[store][liveness]") {
  Harness h(60s);
  h.join(1, 0, h.at(0ms));
  h.join(2, 1, h.at(10ms));
  h.exchange(1, 0, "gather_object #1", h.at(20ms));
  h.exchange(2, 1, "gather_object #1", h.at(20ms));
  REQUIRE(h.core.next_deadline() == h.at(60s));  // the join deadline comes before the 300 s exchange deadline
  h.core.tick(h.at(59'999ms));
  REQUIRE(h.replies(1).empty());
  h.core.tick(h.at(60s));
  h.core.resume(h.at(60s));
  for (StoreCore::ConnId id : {1u, 2u}) {
    const auto r = h.replies(id);
    REQUIRE(r.size() == 1);
    REQUIRE(r[0].kind == FailureKind::peer_gone);
    REQUIRE_THAT(r[0].message, accel_test::contains("rank 2 never joined the job: it did not connect to the store within 60 s "
                                                    "(ACCEL_JOIN_TIMEOUT_S) of the first rank"));
    REQUIRE_THAT(r[0].message, accel_test::contains("so it cannot join gather_object #1"));
  }
  REQUIRE(h.log.size() == 1);
  REQUIRE_THAT(h.log[0], accel_test::contains("rank 2 never connected within 60 s"));
  // The next collective fails at once as well, and a rank arriving late is refused with the reason.
  h.exchange(1, 0, "gather_object #2", h.at(61s));
  REQUIRE_THAT(h.replies(1).at(0).message, accel_test::contains("rank 2 never joined the job"));
  h.core.open(3, "late", h.at(62s));
  h.send(3, accel::detail::encode_hello("tok", 2, 3), h.at(62s));
  const auto late = h.replies(3);
  REQUIRE(late.at(0).kind == FailureKind::refused);
  REQUIRE_THAT(late.at(0).message, accel_test::contains("rank 2 arrived after the join timeout (60 s, ACCEL_JOIN_TIMEOUT_S)"));
}

TEST_CASE("store core: a second process claiming a rank is refused naming the holder, while the holder's own connections are not",
          "[store]") {
  Harness h(60s);
  // Connection `id` says hello as `rank` from the process numbered `process`; its one reply.
  const auto hello = [&](StoreCore::ConnId id, int rank, std::uint64_t process, std::chrono::milliseconds t) {
    h.core.open(id, "peer" + std::to_string(id), h.at(t));
    h.send(id, accel::detail::encode_hello("tok", rank, 3, {}, false, process), h.at(t));
    const auto r = h.replies(id);
    REQUIRE(r.size() == 1);
    return r[0];
  };
  REQUIRE(hello(1, 1, 11, 0ms).type == Msg::ok);
  REQUIRE(hello(2, 1, 11, 1ms).type == Msg::ok);  // the same process's second connection (p2p, a watcher)
  const Reply taken = hello(3, 1, 22, 2ms);
  REQUIRE(taken.kind == FailureKind::refused);
  REQUIRE_THAT(taken.message, accel_test::contains("rank 1 is already taken in this job by another process (peer1, connected): two "
                                                   "jobs share this store's address (give each job its own MASTER_PORT"));
  REQUIRE_THAT(taken.message, accel_test::contains("or the launcher gave rank 1 to two processes"));
  REQUIRE(hello(4, 2, 0, 3ms).type == Msg::ok);  // a client that sends no number is not checked
  // Once the holder has exited, its rank stays its own: another process is still refused, the
  // holder (a second DistributedState of the same program) is welcome back.
  for (StoreCore::ConnId id : {1u, 2u}) h.bye(id, h.at(4ms)), h.core.closed(id, h.at(4ms));
  REQUIRE_THAT(hello(5, 1, 22, 5ms).message, accel_test::contains("(peer1, exited)"));
  REQUIRE(hello(6, 1, 11, 6ms).type == Msg::ok);
}

TEST_CASE("store core: ranks that all join in time are never blamed, however late their first collective", "[store][liveness]") {
  Harness h(2s);
  h.join(1, 0, h.at(0ms));
  h.join(2, 1, h.at(1s));
  h.join(3, 2, h.at(1999ms));
  h.core.tick(h.at(2s));
  h.core.tick(h.at(1h));
  REQUIRE(h.log.empty());
  REQUIRE_FALSE(h.core.next_deadline().has_value());  // nothing left to wake up for
  for (StoreCore::ConnId id : {1u, 2u, 3u}) h.exchange(id, static_cast<int>(id) - 1, "barrier #1", h.at(1h));
  for (StoreCore::ConnId id : {1u, 2u, 3u}) REQUIRE(h.replies(id).at(0).type == Msg::list);
}

TEST_CASE("store core: without a join timeout a missing rank is only named when the wait times out", "[store][liveness]") {
  Harness h(0ms);
  h.join(1, 0, h.at(0ms));
  h.exchange(1, 0, "barrier #1", h.at(0ms));
  h.core.tick(h.at(299s));
  REQUIRE(h.replies(1).empty());
  h.core.tick(h.at(300s));
  const auto r = h.replies(1);
  REQUIRE(r.at(0).kind == FailureKind::timeout);
  REQUIRE_THAT(r.at(0).message, accel_test::contains("ranks 1 (never connected), 2 (never connected) have not arrived"));
}

TEST_CASE("store core: the join deadline fails key waits too, since the missing rank may be the one to set the key", "[store][liveness]") {
  Harness h(5s, 2);
  h.join(1, 1, h.at(0ms), 2);
  h.send(1, WireWriter(Msg::get).str("nccl-id").u64(300'000).finish(), h.at(1s));
  h.core.tick(h.at(5s));
  const auto r = h.replies(1);
  REQUIRE(r.at(0).kind == FailureKind::peer_gone);
  REQUIRE_THAT(r.at(0).message, accel_test::contains("rank 0 never joined the job"));
  REQUIRE_THAT(r.at(0).message, accel_test::contains("while this process waited for store key 'nccl-id'"));
}

TEST_CASE("store core: a rank gone without a goodbye is reported without claiming it crashed", "[store][liveness]") {
  Harness h(60s);
  h.join(1, 0, h.at(0ms));
  h.join(2, 1, h.at(0ms));
  h.join(3, 2, h.at(0ms));
  h.exchange(1, 0, "gather_object #1", h.at(1s));
  h.core.closed(2, h.at(2s));  // rank 1: exit(3) without destructors, or SIGKILL: the store cannot tell which
  h.core.resume(h.at(2s));
  const auto r = h.replies(1);
  REQUIRE(r.at(0).kind == FailureKind::peer_gone);
  REQUIRE_THAT(r.at(0).message, accel_test::contains("rank 1 lost its connection to the store without saying goodbye (the process "
                                                     "crashed, was killed, or ended without destroying its DistributedState), so it "
                                                     "cannot join gather_object #1"));
  REQUIRE(r.at(0).message.find("crashed or was killed") == std::string::npos);
}

TEST_CASE("store core: a rank that says goodbye after the last collective is not blamed while others finish it", "[store][liveness]") {
  Harness h(60s);
  h.join(1, 0, h.at(0ms));
  h.join(2, 1, h.at(0ms));
  h.join(3, 2, h.at(0ms));
  // Every rank is in the last collective; it completes when rank 2 arrives, and rank 2 leaves at once.
  h.exchange(1, 0, "wait_for_everyone #9", h.at(1s));
  h.exchange(2, 1, "wait_for_everyone #9", h.at(1s));
  h.exchange(3, 2, "wait_for_everyone #9", h.at(1s));
  h.bye(3, h.at(1s));
  h.core.closed(3, h.at(1s));
  h.core.resume(h.at(1s));
  for (StoreCore::ConnId id : {1u, 2u}) {
    const auto r = h.replies(id);
    REQUIRE(r.size() == 1);
    REQUIRE(r[0].type == Msg::list);
  }
  // A collective after it is one rank 2 can never join: named as an exit, not a crash.
  h.exchange(1, 0, "gather_object #10", h.at(2s));
  REQUIRE_THAT(h.replies(1).at(0).message, accel_test::contains("rank 2 exited without joining gather_object #10"));
  REQUIRE(h.log.empty());
}

TEST_CASE("store core: a finished exchange of large values leaves no copy of them in the store", "[store][large]") {
  // Two ranks exchange 8 MiB each, fed as the server's socket loop feeds them (256 KiB reads).
  Harness h(0ms, 2);
  h.join(1, 0, h.at(0ms), 2);
  h.join(2, 1, h.at(0ms), 2);
  const std::size_t value_bytes = std::size_t{8} << 20;
  for (StoreCore::ConnId id : {1u, 2u}) {
    const std::vector<std::byte> value(value_bytes, std::byte{static_cast<unsigned char>(id)});
    const auto frame =
        WireWriter(Msg::exchange).str("k/big").i32(static_cast<int>(id) - 1).i32(2).u64(300'000).str("gather_object #1").bytes(value).finish();
    for (std::size_t at = 0; at < frame.size(); at += 256 * 1024) {
      const std::size_t n = std::min<std::size_t>(256 * 1024, frame.size() - at);
      h.core.receive(id, std::span<const std::byte>(frame).subspan(at, n), h.at(1ms));
    }
    h.core.resume(h.at(1ms));
  }
  REQUIRE(h.core.retained_bytes() >= 2 * value_bytes);  // the reply to both, queued
  for (StoreCore::ConnId id : {1u, 2u}) {
    const auto r = h.replies(id);  // written out: the queue empties
    REQUIRE(r.size() == 1);
    REQUIRE(r[0].type == Msg::list);
  }
  // What stays is bounded by the receive buffers' small retained capacity, not by the values.
  REQUIRE(h.core.retained_bytes() <= 2 * accel::detail::FrameAssembler::retained_capacity);
}

namespace {
// A group's exchange: `members` are the job ranks of its slots.
std::vector<std::byte> group_exchange(int rank, const std::vector<int>& members, const std::string& label) {
  WireWriter w(Msg::exchange);
  w.str("g/" + label).i32(rank).i32(static_cast<int>(members.size())).u64(300'000).str(label).str("v");
  w.u32(static_cast<std::uint32_t>(members.size()));
  for (int m : members) w.i32(m);
  return w.finish();
}
}  // namespace

TEST_CASE("store core: a group's exchange watches its members' job ranks rather than the slots' numbers", "[store][groups]") {
  Harness h(60s, 4);
  for (StoreCore::ConnId id : {1u, 2u, 3u, 4u}) h.join(id, static_cast<int>(id) - 1, h.at(0ms), 4);
  h.send(3, group_exchange(0, {2, 3}, "gather_object #1"), h.at(1s));  // job rank 2 as group rank 0
  h.bye(2, h.at(2s)), h.core.closed(2, h.at(2s)), h.core.resume(h.at(2s));  // job rank 1 leaves: not a member
  REQUIRE(h.replies(3).empty());
  h.core.closed(4, h.at(3s));  // job rank 3 dies
  h.core.resume(h.at(3s));
  const auto r = h.replies(3);
  REQUIRE(r.at(0).kind == FailureKind::peer_gone);
  REQUIRE_THAT(r.at(0).message, accel_test::contains("group rank 1 (job rank 3) lost its connection to the store without saying goodbye"));
}

TEST_CASE("store core: a group's members must agree and match the joining connection's rank", "[store][groups]") {
  Harness h(60s, 4);
  for (StoreCore::ConnId id : {1u, 2u, 3u, 4u}) h.join(id, static_cast<int>(id) - 1, h.at(0ms), 4);
  h.send(1, group_exchange(0, {0, 2}, "barrier #1"), h.at(1s));
  h.send(3, group_exchange(1, {0, 3}, "barrier #1"), h.at(1s));
  const auto r = h.replies(3);
  REQUIRE(r.at(0).kind == FailureKind::mismatch);
  REQUIRE_THAT(r.at(0).message, accel_test::contains("rank 1 joined barrier #1 with members [0, 3] but others use [0, 2]"));
  REQUIRE(h.replies(1).at(0).kind == FailureKind::mismatch);
  h.send(2, group_exchange(0, {3, 1}, "barrier #2"), h.at(2s));  // job rank 1 claims job rank 3's place
  REQUIRE_THAT(h.replies(2).at(0).message, accel_test::contains("job rank 1 joined barrier #2 as group rank 0, which is job rank 3's place"));
  CHECK_THROWS_AS(accel::detail::parse_request(std::span<const std::byte>(group_exchange(0, {1, 1}, "x")).subspan(4)),
                  accel::detail::wire_error);
}
