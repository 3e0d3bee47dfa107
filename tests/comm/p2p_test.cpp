// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Point-to-point messages (p2p.hpp) on the in-process thread backend and on the CPU backend with
// ranks as threads (shared-memory channels, and the store path as across machines); the solo
// backend; the descriptor check as a pure function.
#include <accel/comm/p2p.hpp>
#include <accel/comm/detail/shm_p2p.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <thread>
#include <future>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/store_log.hpp"
#include "support/thread_world.hpp"

using namespace std::chrono_literals;
using accel_test::contains;

namespace {

enum class Backend { threads, cpu_shm, cpu_store };

const char* name_of(Backend b) {
  switch (b) {
    case Backend::threads: return "threads";
    case Backend::cpu_shm: return "cpu, shared memory";
    case Backend::cpu_store: return "cpu, store";
  }
  return "?";
}

// Runs fn on `n` ranks of backend `b`; each rank's exception message ("" for none).
std::vector<std::string> run(Backend b, int n, const std::function<void(accel::Communicator&)>& fn,
                             std::chrono::milliseconds timeout = 20s) {
  if (b == Backend::threads) {
    std::vector<std::string> out;
    for (const auto& e : accel_test::run_world(n, fn, timeout)) out.push_back(accel_test::message(e));
    return out;
  }
  accel_test::LocalStore job;
  accel::CpuCommOptions o;
  o.use_shm = b == Backend::cpu_shm;
  o.store_round_bytes = 256 * 1024;  // messages over 128 KiB go through the store in pieces
  return job.run_cpu(n, o, [&](accel::CpuCommunicator& comm) {
    ACCEL_TEST_ENSURE(comm.uses_shared_memory_p2p() == (b == Backend::cpu_shm && n > 1));
    fn(comm);
  }, timeout);
}

const Backend all_backends[] = {Backend::threads, Backend::cpu_shm, Backend::cpu_store};

template <class T>
std::vector<T> pattern(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<int>((i * 7 + static_cast<std::size_t>(seed) * 13) % 101);
    if constexpr (std::is_integral_v<T>) v[i] = static_cast<T>(x);
    else v[i] = T(static_cast<float>(x));
  }
  return v;
}

// Rank r sends to r + 1 and receives from r - 1 (send_async, so every rank can send first).
template <class T>
void ring(accel::Communicator& comm, std::size_t count) {
  const int n = comm.size(), r = comm.rank();
  const auto mine = pattern<T>(count, r);
  std::vector<T> got(count);
  auto h = accel::send_async(comm, std::span(mine), (r + 1) % n);
  accel::recv(comm, std::span(got), (r + n - 1) % n);
  h.wait();
  ACCEL_TEST_ENSURE(got == pattern<T>(count, (r + n - 1) % n));
}

struct Item {
  int id = 0;
  std::string text;
  std::vector<double> values;
  bool operator==(const Item&) const = default;
};
ACCEL_DEFINE_FIELDS(Item, id, text, values)

// A value that refuses to encode when it holds 2.
struct Fragile {
  int v = 0;
};
inline void to_json(nlohmann::json& j, const Fragile& f) {
  if (f.v == 2) throw std::runtime_error("value 2 refuses to serialize");
  j = f.v;
}
inline void from_json(const nlohmann::json& j, Fragile& f) { f.v = j.get<int>(); }

}  // namespace

template <>
struct accel::force_json_serialization<Fragile> : std::true_type {};

namespace {
// A backend whose first send fails here, before anything reaches the peer (as a failed
// shm_open, store connection or allocation would); it records the message numbers it is handed.
class FailFirstSend final : public accel::Communicator {
 public:
  FailFirstSend() : Communicator(0, 2, 5s) {}
  std::vector<std::uint64_t> numbers;
  [[nodiscard]] std::string backend() const override { return "fail-first-send"; }

 protected:
  std::shared_ptr<Communicator> make_group(const accel::GroupSpec&) override { return nullptr; }
  Round exchange(std::uint64_t, const std::string&, std::span<const std::byte>, const accel::Payload&) override { return {}; }
  accel::CollectiveHandle p2p_send(const P2pSend& m) override {
    numbers.push_back(m.number);
    if (m.number == 1) throw std::runtime_error("cannot create the channel (simulated)");
    return {};
  }
};
}  // namespace

TEST_CASE("p2p: the two ends' descriptors match or name both ranks and what each passed", "[p2p]") {
  using accel::detail::P2pDescriptor;
  using accel::detail::P2pKind;
  const P2pDescriptor f4{P2pKind::buffer, accel::ElementType::float32, 4, {}, {}};
  const P2pDescriptor f5{P2pKind::buffer, accel::ElementType::float32, 5, {}, {}};
  const P2pDescriptor i4{P2pKind::buffer, accel::ElementType::int32, 4, {}, {}};
  const P2pDescriptor s_sent{P2pKind::object, accel::ElementType::uint8, 12, "std::string", {}};
  const P2pDescriptor s_wanted{P2pKind::object, accel::ElementType::uint8, 0, "std::string", {}};
  const P2pDescriptor v_wanted{P2pKind::object, accel::ElementType::uint8, 0, "std::vector<int>", {}};
  const std::string label = "message #3 from rank 0 to rank 1";
  REQUIRE(accel::detail::p2p_mismatch(f4, f4, "rank 0", "rank 1", label).empty());
  REQUIRE(accel::detail::p2p_mismatch(s_sent, s_wanted, "rank 0", "rank 1", label).empty());
  REQUIRE(accel::detail::p2p_mismatch(f4, f5, "rank 0", "rank 1", label) ==
          "send/recv mismatch in message #3 from rank 0 to rank 1: rank 0 sends 4 float32 elements (send), rank 1 expects 5 float32 "
          "elements (recv); both ends must pass the same element type and length (send/recv), or the same type (send_object/recv_object)");
  REQUIRE_THAT(accel::detail::p2p_mismatch(f4, i4, "rank 0", "rank 1", label), contains("rank 1 expects 4 int32 elements (recv)"));
  REQUIRE_THAT(accel::detail::p2p_mismatch(s_sent, v_wanted, "rank 0", "rank 1", label),
               contains("rank 0 sends an object of type std::string (12 encoded bytes, send_object), rank 1 expects an object of type "
                        "std::vector<int> (recv_object)"));
  REQUIRE_THAT(accel::detail::p2p_mismatch(s_sent, f4, "rank 0", "rank 1", label), contains("rank 1 expects 4 float32 elements (recv)"));
  for (const auto& d : {f4, s_sent, v_wanted}) {
    const auto back = accel::detail::decode_p2p_descriptor(accel::detail::encode_p2p_descriptor(d), "rank 0");
    REQUIRE(accel::detail::p2p_mismatch(d, back, "a", "b", label).empty());
    REQUIRE(back.count == d.count);
  }
  // A failure marker's text travels (cut to fit a descriptor).
  const P2pDescriptor failed{P2pKind::object, accel::ElementType::uint8, 0, "Fragile", std::string(5000, 'x')};
  const auto encoded = accel::detail::encode_p2p_descriptor(failed);
  REQUIRE(encoded.size() <= accel::detail::p2p_descriptor_max_bytes);
  REQUIRE(accel::detail::decode_p2p_descriptor(encoded, "rank 0").failure == std::string(960, 'x'));
  REQUIRE_THROWS_AS(accel::detail::decode_p2p_descriptor(std::vector<std::byte>(3), "rank 2"), accel::comm_error);
}

TEST_CASE("p2p: after a message failed on one end, later ones that way fail at once naming the first error", "[p2p]") {
  // Message #1 never reached the peer, which still waits for #1: sending #2 would put the pair out
  // of step for good (the peer reads #2 as #1, or waits out the timeout on every later message).
  FailFirstSend comm;
  const std::vector<int> v = {1, 2};
  REQUIRE_THROWS_WITH(accel::send(comm, std::span(v), 1), contains("simulated"));
  REQUIRE_THROWS_WITH(accel::send(comm, std::span(v), 1),
                      "[accel.comm] message #2 from rank 0 to rank 1: an earlier message #1 from rank 0 to rank 1 failed (cannot create the "
                      "channel (simulated)), so the messages to rank 1 are out of step; create a new communicator");
  REQUIRE(comm.numbers == std::vector<std::uint64_t>{1});  // #2 never reached the backend
  auto h = accel::send_async(comm, std::span(v), 1);
  REQUIRE_THROWS_WITH(h.wait(), contains("message #3 from rank 0 to rank 1: an earlier message #1"));
}

TEST_CASE("p2p: an object type name longer than a descriptor carries still matches on both ends", "[p2p]") {
  using accel::detail::P2pDescriptor;
  using accel::detail::P2pKind;
  // A descriptor carries 960 characters of the name; each end compares the peer's cut name with its own.
  const std::string name = "ns::Outer<" + std::string(3000, 'T') + ">";
  const P2pDescriptor sent{P2pKind::object, accel::ElementType::uint8, 12, name, {}};
  const P2pDescriptor wanted{P2pKind::object, accel::ElementType::uint8, 0, name, {}};
  const auto over_wire = [](const P2pDescriptor& d) {
    return accel::detail::decode_p2p_descriptor(accel::detail::encode_p2p_descriptor(d), "rank 0");
  };
  const std::string label = "message #1 from rank 0 to rank 1";
  REQUIRE(over_wire(sent).object_type.size() == 960);
  REQUIRE(accel::detail::p2p_mismatch(over_wire(sent), wanted, "rank 0", "rank 1", label).empty());  // the receiver's check
  REQUIRE(accel::detail::p2p_mismatch(sent, over_wire(wanted), "rank 0", "rank 1", label).empty());  // the sender's
  P2pDescriptor other = wanted;
  other.object_type[5] = 'X';
  REQUIRE_FALSE(accel::detail::p2p_mismatch(over_wire(sent), other, "rank 0", "rank 1", label).empty());
}

TEST_CASE("p2p: the store's word on a peer that left is reworded for the peer's name", "[p2p]") {
  REQUIRE(accel::detail::how_peer_left("group rank 1 (job rank 3) lost its connection to the store without saying goodbye (the process "
                                       "crashed), so it cannot join message #1") ==
          "lost its connection to the store without saying goodbye (the process crashed)");
  REQUIRE(accel::detail::how_peer_left("group rank 0 (job rank 0) exited without joining message #2 (was the collective …)") == "exited");
  REQUIRE(accel::detail::how_peer_left("lost the connection to the store at 1.2.3.4:5 during x (closed); rank 0, which hosts it, exited or crashed")
              .empty());
}

TEST_CASE("p2p: a ring of sends delivers spans of every element type, empty and large ones included", "[p2p]") {
  for (Backend b : all_backends)
    for (int n : {2, 3}) {
      INFO(name_of(b) << ", " << n << " ranks");
      const auto errors = run(b, n, [](accel::Communicator& comm) {
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
          ring<std::int8_t>(comm, count);
          ring<std::uint8_t>(comm, count);
          ring<std::int32_t>(comm, count);
          ring<std::uint32_t>(comm, count);
          ring<std::int64_t>(comm, count);
          ring<std::uint64_t>(comm, count);
          ring<float>(comm, count);
          ring<double>(comm, count);
          ring<accel::half>(comm, count);
          ring<accel::bfloat16>(comm, count);
        }
        ring<float>(comm, 700'001);  // 2.7 MB: many ring chunks, many store pieces, an odd tail
      });
      for (const auto& e : errors) REQUIRE(e == std::string());
    }
}

TEST_CASE("p2p: a message large enough for streaming stores arrives whole into a buffer at any alignment", "[p2p]") {
  // The receiver's copy out of the ring changes from this size on; both buffers start off the
  // 16-byte alignment streaming stores need, and the size leaves a tail of a partial line.
  const std::size_t bytes = static_cast<std::size_t>(accel::detail::p2p_stream_min_bytes) + 77;
  for (int pass = 0; pass < 2; ++pass) {  // the second message reuses the ring from a later step
    const auto errors = run(Backend::cpu_shm, 2, [&](accel::Communicator& comm) {
      if (comm.rank() == 0) {
        const auto data = pattern<std::uint8_t>(bytes + 3, pass);
        accel::send(comm, std::span(data).subspan(3), 1);
      } else {
        std::vector<std::uint8_t> got(bytes + 5, 0xEE);
        accel::recv(comm, std::span(got).subspan(5), 0);
        const auto want = pattern<std::uint8_t>(bytes + 3, pass);
        ACCEL_TEST_ENSURE(std::equal(got.begin() + 5, got.end(), want.begin() + 3));
        ACCEL_TEST_ENSURE(got[4] == 0xEE);
      }
    });
    for (const auto& e : errors) REQUIRE(e == std::string());
  }
}

TEST_CASE("p2p: the streaming copy equals memcpy for every size and alignment around its cases", "[p2p]") {
  std::vector<std::byte> src(4096 + 64), dst(4096 + 64), want(4096 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 31 + 7);
  for (std::size_t n : {0, 1, 15, 16, 63, 255, 256, 257, 319, 1000, 4096})
    for (std::size_t d = 0; d < 18; ++d)
      for (std::size_t s : {0, 1, 9}) {
        INFO(n << " bytes, destination offset " << d << ", source offset " << s);
        std::fill(dst.begin(), dst.end(), std::byte{0xEE});
        want = dst;
        std::memcpy(want.data() + d, src.data() + s, n);
        accel::detail::copy_streaming(dst.data() + d, src.data() + s, n);
        REQUIRE(dst == want);
      }
}

TEST_CASE("p2p: objects travel both ways between two ranks (ping-pong)", "[p2p]") {
  for (Backend b : all_backends) {
    INFO(name_of(b));
    const auto errors = run(b, 2, [](accel::Communicator& comm) {
      const int peer = 1 - comm.rank();
      const std::string text(100'000, 'x');
      const std::vector<std::string> words = {"a", "", "longer word"};
      const std::map<std::string, int> table = {{"one", 1}, {"two", 2}};
      const Item item{7, "seven", {1.5, 2.5}};
      for (int round = 0; round < 3; ++round) {
        if (comm.rank() == 0) {
          accel::send_object(comm, round, peer);
          accel::send_object(comm, text, peer);
          accel::send_object(comm, words, peer);
          ACCEL_TEST_ENSURE(accel::recv_object<std::map<std::string, int>>(comm, peer) == table);
          ACCEL_TEST_ENSURE(accel::recv_object<Item>(comm, peer) == item);
          ACCEL_TEST_ENSURE(accel::recv_object<std::string>(comm, peer).empty());
        } else {
          ACCEL_TEST_ENSURE(accel::recv_object<int>(comm, peer) == round);
          ACCEL_TEST_ENSURE(accel::recv_object<std::string>(comm, peer) == text);
          ACCEL_TEST_ENSURE(accel::recv_object<std::vector<std::string>>(comm, peer) == words);
          accel::send_object(comm, table, peer);
          accel::send_object(comm, item, peer);
          accel::send_object(comm, std::string(), peer);
        }
      }
    });
    for (const auto& e : errors) REQUIRE(e == std::string());
  }
}

TEST_CASE("p2p: messages between a pair arrive in the order they were sent, sync and async mixed", "[p2p]") {
  for (Backend b : all_backends) {
    INFO(name_of(b));
    const auto errors = run(b, 2, [](accel::Communicator& comm) {
      const int peer = 1 - comm.rank();
      constexpr int count = 60;
      // Both ranks send `count` numbers to each other at once (sends queued), and receive them.
      std::vector<std::vector<std::int64_t>> out(count), in(count, std::vector<std::int64_t>(3));
      std::vector<accel::CollectiveHandle> sends;
      for (int i = 0; i < count; ++i) {
        out[static_cast<std::size_t>(i)] = {i, comm.rank(), -i};
        sends.push_back(accel::send_async(comm, std::span(out[static_cast<std::size_t>(i)]), peer));
      }
      std::vector<accel::CollectiveHandle> recvs;
      for (int i = 0; i < count; ++i) {
        if (i % 3 == 0) recvs.push_back(accel::recv_async(comm, std::span(in[static_cast<std::size_t>(i)]), peer));
        else accel::recv(comm, std::span(in[static_cast<std::size_t>(i)]), peer);  // after the queued ones before it
      }
      for (auto& h : recvs) h.wait();
      for (auto& h : sends) h.wait();
      for (int i = 0; i < count; ++i) ACCEL_TEST_ENSURE((in[static_cast<std::size_t>(i)] == std::vector<std::int64_t>{i, peer, -i}));
    });
    for (const auto& e : errors) REQUIRE(e == std::string());
  }
}

TEST_CASE("p2p: a size, element type or object type mismatch fails both ends naming both ranks, and the pair goes on", "[p2p]") {
  for (Backend b : all_backends) {
    INFO(name_of(b));
    const auto errors = run(b, 2, [](accel::Communicator& comm) {
      const bool sender = comm.rank() == 0;
      auto expect_mismatch = [&](const std::function<void()>& call, const std::string& needle) {
        try {
          call();
        } catch (const accel::usage_error& e) {
          const std::string what = e.what();
          ACCEL_TEST_ENSURE(what.find("send/recv mismatch in message #") != std::string::npos);
          ACCEL_TEST_ENSURE(what.find("rank 0 sends") != std::string::npos);
          ACCEL_TEST_ENSURE(what.find("rank 1 expects") != std::string::npos);
          if (what.find(needle) == std::string::npos) throw std::runtime_error("no '" + needle + "' in: " + what);
          return;
        }
        throw std::runtime_error("no usage_error for " + needle);
      };
      std::vector<float> four(4, 1.0F), five(5);
      std::vector<std::int32_t> ints(4);
      expect_mismatch([&] { sender ? accel::send(comm, std::span(four), 1) : accel::recv(comm, std::span(five), 0); },
                      "rank 0 sends 4 float32 elements (send), rank 1 expects 5 float32 elements (recv)");
      expect_mismatch([&] { sender ? accel::send(comm, std::span(four), 1) : accel::recv(comm, std::span(ints), 0); },
                      "rank 1 expects 4 int32 elements (recv)");
      expect_mismatch([&] { sender ? accel::send_object(comm, std::string("hi"), 1) : (void)accel::recv_object<int>(comm, 0); },
                      "rank 1 expects an object of type int (recv_object)");
      expect_mismatch([&] { sender ? accel::send_object(comm, 5, 1) : accel::recv(comm, std::span(four), 0); },
                      "send_object), rank 1 expects 4 float32 elements (recv)");
      // Large: the refusal comes before the bulk of the data moves.
      std::vector<double> big(1'000'000, 2.0), other(999'999);
      expect_mismatch([&] { sender ? accel::send(comm, std::span(big), 1) : accel::recv(comm, std::span(other), 0); },
                      "rank 0 sends 1000000 float64 elements");
      expect_mismatch([&] {
        if (sender) return accel::send_async(comm, std::span(four), 1).wait();
        accel::recv_async(comm, std::span(five), 0).wait();
      }, "message #6 from rank 0 to rank 1");
      // The pair is still in step: the next message goes through.
      std::vector<double> got(big.size());
      if (sender) {
        accel::send(comm, std::span(big), 1);
      } else {
        accel::recv(comm, std::span(got), 0);
        ACCEL_TEST_ENSURE(got == big);
      }
    });
    REQUIRE(errors == std::vector<std::string>{"", ""});
  }
}

TEST_CASE("p2p: sending to oneself or to a rank outside the communicator is a usage error and nothing moves", "[p2p]") {
  for (Backend b : all_backends) {
    INFO(name_of(b));
    const auto errors = run(b, 2, [](accel::Communicator& comm) {
      std::vector<int> v(3, comm.rank());
      auto refused = [&](const std::function<void()>& call, const std::string& needle) {
        try {
          call();
        } catch (const accel::usage_error& e) {
          if (std::string(e.what()).find(needle) == std::string::npos) throw std::runtime_error(e.what());
          return;
        }
        throw std::runtime_error("no usage_error: " + needle);
      };
      const int me = comm.rank();
      refused([&] { accel::send(comm, std::span(v), me); }, "send: rank " + std::to_string(me) + " cannot send to itself");
      refused([&] { accel::recv(comm, std::span(v), me); }, "cannot receive from itself");
      refused([&] { accel::send(comm, std::span(v), 2); }, "send: 2 is not a rank of this 2-rank communicator (ranks 0 to 1)");
      refused([&] { accel::recv(comm, std::span(v), -1); }, "recv: -1 is not a rank");
      refused([&] { (void)accel::send_async(comm, std::span(v), 5); }, "5 is not a rank");
      refused([&] { (void)accel::recv_object<int>(comm, me); }, "itself");
      // Nothing moved: the first real message is message #1 and carries the right data.
      std::vector<int> got(3);
      if (me == 0) {
        accel::send(comm, std::span(v), 1);
      } else {
        accel::recv(comm, std::span(got), 0);
        ACCEL_TEST_ENSURE(got == std::vector<int>(3, 0));
      }
    });
    REQUIRE(errors == std::vector<std::string>{"", ""});
  }
  accel::SoloCommunicator solo;
  std::vector<float> v(2);
  REQUIRE_THROWS_WITH(accel::send(solo, std::span(v), 0), contains("send: rank 0 cannot send to itself"));
  REQUIRE_THROWS_WITH(accel::recv(solo, std::span(v), 1), contains("recv: 1 is not a rank of this 1-rank communicator"));
}

TEST_CASE("p2p: a peer that leaves while this rank waits for it is named within seconds, not waited for", "[p2p]") {
  for (Backend b : all_backends) {
    INFO(name_of(b));
    for (bool wait_in_recv : {false, true}) {
      const auto start = std::chrono::steady_clock::now();
      // A 60 s timeout: only noticing the departure ends this quickly.
      const auto errors = run(b, 2, [&](accel::Communicator& comm) {
        std::vector<int> v(10);
        if (comm.rank() == 1) return;  // leaves without a word
        if (wait_in_recv) accel::recv(comm, std::span(v), 1);
        else accel::send(comm, std::span(v), 1);
      }, 60s);
      INFO("rank 0: " << errors[0]);
      REQUIRE(std::chrono::steady_clock::now() - start < 15s);
      REQUIRE(errors[1].empty());
      REQUIRE_THAT(errors[0], contains("rank 1 "));
      REQUIRE_THAT(errors[0], contains(wait_in_recv ? "message #1 from rank 1 to rank 0" : "message #1 from rank 0 to rank 1"));
    }
  }
}

TEST_CASE("p2p: in the groups of a 2 x 2 grid ranks are group ranks, and errors name group and job ranks", "[p2p]") {
  for (Backend b : all_backends) {
    INFO(name_of(b));
    const auto errors = run(b, 4, [](accel::Communicator& world) {
      const auto grid = accel::grid_groups(world, 2, 2);
      // Stage group (the replica's two stages): stage 0 sends its job rank to stage 1 and back.
      accel::Communicator& stages = *grid.stage_group;
      accel::Communicator& replicas = *grid.replica_group;
      const int peer = 1 - stages.rank();
      if (stages.rank() == 0) {
        accel::send_object(stages, world.rank(), peer);
        ACCEL_TEST_ENSURE(accel::recv_object<int>(stages, peer) == world.rank() + 1);
      } else {
        ACCEL_TEST_ENSURE(accel::recv_object<int>(stages, peer) == world.rank() - 1);
        accel::send_object(stages, world.rank(), peer);
      }
      // Replica group: a mismatch names group ranks and job ranks.
      std::vector<float> a(3), bigger(4);
      try {
        if (replicas.rank() == 0) accel::send(replicas, std::span(a), 1);
        else accel::recv(replicas, std::span(bigger), 0);
        throw std::runtime_error("no mismatch reported");
      } catch (const accel::usage_error& e) {
        const std::string s = e.what(), stage = std::to_string(grid.stage);
        const std::string want = "group rank 0 (job rank " + stage + ") sends 3 float32 elements (send), group rank 1 (job rank " +
                                 std::to_string(2 + grid.stage) + ") expects 4 float32 elements";
        if (s.find(want) == std::string::npos) throw std::runtime_error(s);
      }
      // The world communicator's own messages are separate from the groups'.
      std::vector<int> mine(2, world.rank()), got(2);
      auto h = accel::send_async(world, std::span(mine), (world.rank() + 1) % 4);
      accel::recv(world, std::span(got), (world.rank() + 3) % 4);
      h.wait();
      ACCEL_TEST_ENSURE(got == std::vector<int>(2, (world.rank() + 3) % 4));
    });
    REQUIRE(errors == std::vector<std::string>(4, ""));
  }
}

TEST_CASE("p2p: a value that fails to encode fails the receiver at once, naming the sender and its error; the pair goes on", "[p2p]") {
  for (Backend b : all_backends) {
    INFO(name_of(b));
    std::string sender_error, receiver_error;
    const auto start = std::chrono::steady_clock::now();
    // A 60 s timeout: only the failure marker ends the receive quickly.
    const auto errors = run(b, 2, [&](accel::Communicator& comm) {
      if (comm.rank() == 0) {
        try {
          accel::send_object(comm, Fragile{2}, 1);
        } catch (const accel::serialization_error& e) {
          sender_error = e.what();
        }
        accel::send_object(comm, Fragile{5}, 1);  // the next message is the next one received
        const std::vector<int> v = {1, 2, 3};
        accel::send(comm, std::span(v), 1);
      } else {
        try {
          (void)accel::recv_object<Fragile>(comm, 0);
        } catch (const accel::comm_error& e) {
          receiver_error = e.what();
        }
        ACCEL_TEST_ENSURE(accel::recv_object<Fragile>(comm, 0).v == 5);
        std::vector<int> v(3);
        accel::recv(comm, std::span(v), 0);
        ACCEL_TEST_ENSURE((v == std::vector<int>{1, 2, 3}));
      }
    }, 60s);
    REQUIRE(errors == std::vector<std::string>{"", ""});
    REQUIRE(std::chrono::steady_clock::now() - start < 15s);
    REQUIRE(sender_error == "[accel.serialization] cannot encode a (anonymous namespace)::Fragile on rank 0: value 2 refuses to serialize");
    REQUIRE(receiver_error ==
            "[accel.comm] rank 0 failed before message #1 from rank 0 to rank 1 and sent a failure marker instead, so there is nothing "
            "to receive (rank 0: [accel.serialization] cannot encode a (anonymous namespace)::Fragile on rank 0: value 2 refuses to serialize)");
  }
}

TEST_CASE("p2p: through the store, a peer that closed its communicator but lives on is named within seconds", "[p2p]") {
  for (bool wait_in_recv : {true, false}) {
    INFO("rank 0 waits in " << (wait_in_recv ? "recv" : "send"));
    accel_test::LocalStore job;
    accel::CpuCommOptions o;
    o.use_shm = false;
    // Both ranks keep their store connections to the end: the store sees nobody leave.
    auto c0 = job.client(0, 2, 60s), c1 = job.client(1, 2, 60s);
    std::promise<void> done;
    auto rank1 = std::async(std::launch::async, [&] {
      { accel::CpuCommunicator comm(c1, 1, 2, o); }  // made, then closed after 300 ms
      done.get_future().wait();
    });
    std::string error;
    const auto start = std::chrono::steady_clock::now();
    try {
      accel::CpuCommunicator comm(c0, 0, 2, o);
      std::this_thread::sleep_for(300ms);
      std::vector<int> v(4);
      if (wait_in_recv) accel::recv(comm, std::span(v), 1);
      else accel::send(comm, std::span(v), 1);
    } catch (const accel::comm_error& e) {
      error = e.what();
    }
    const auto took = std::chrono::steady_clock::now() - start;
    done.set_value();
    rank1.get();
    INFO("rank 0: " << error);
    REQUIRE(took < 15s);
    REQUIRE(error == std::string("[accel.comm] rank 1 closed its communicator without taking part in message #1 from ") +
                         (wait_in_recv ? "rank 1 to rank 0" : "rank 0 to rank 1"));
  }
}

TEST_CASE("p2p: through the store, a receiver that fails midway fails its sender at once", "[p2p]") {
  // 1 MiB in pieces of 128 KiB: without a marker the sender would wait in piece 2 until the 60 s timeout.
  const auto start = std::chrono::steady_clock::now();
  std::promise<void> sender_done;
  auto sender_finished = sender_done.get_future().share();
  const auto errors = run(Backend::cpu_store, 2, [&](accel::Communicator& comm) {
    std::vector<std::uint8_t> v(1 << 20, 7);
    if (comm.rank() == 0) {
      struct Done {
        std::promise<void>& p;
        ~Done() { p.set_value(); }
      } done{sender_done};
      comm.send_message(1, accel::detail::buffer_descriptor<std::uint8_t>(v.size()), accel::Payload(std::as_bytes(std::span(v))));
    } else {
      try {
        comm.recv_message(0, accel::detail::buffer_descriptor<std::uint8_t>(v.size()),
                          [](std::uint64_t) -> std::byte* { throw std::runtime_error("no room here"); });
      } catch (...) {
        sender_finished.wait_for(30s);  // stays connected: its leaving must not be what ends the sender's wait
        throw;
      }
    }
  }, 60s);
  REQUIRE(std::chrono::steady_clock::now() - start < 15s);
  REQUIRE(errors[1] == "no room here");
  REQUIRE(errors[0] == "[accel.comm] rank 1 gave up on message #1 from rank 0 to rank 1 midway (rank 1: no room here)");
}

TEST_CASE("p2p: destroying a communicator with an unmatched send_async or recv_async pending does not wait out the timeout", "[p2p]") {
  for (Backend b : {Backend::cpu_shm, Backend::cpu_store}) {
    for (bool receive : {false, true}) {
      INFO(name_of(b) << (receive ? ", recv_async" : ", send_async"));
      accel_test::LocalStore job;
      accel::CpuCommOptions o;
      o.use_shm = b == Backend::cpu_shm;
      auto c0 = job.client(0, 2, 60s), c1 = job.client(1, 2, 60s);
      std::promise<void> done;
      auto rank1 = std::async(std::launch::async, [&] {
        accel::CpuCommunicator comm(c1, 1, 2, o);  // lives on, never answers
        done.get_future().wait();
      });
      std::string error;
      const auto start = std::chrono::steady_clock::now();
      std::vector<int> v(4), w(4);
      accel::CollectiveHandle h, queued;
      {
        accel::CpuCommunicator comm(c0, 0, 2, o);
        h = receive ? accel::recv_async(comm, std::span(v), 1) : accel::send_async(comm, std::span(v), 1);
        queued = receive ? accel::recv_async(comm, std::span(w), 1) : accel::send_async(comm, std::span(w), 1);  // waits behind h
        std::this_thread::sleep_for(200ms);  // the call is waiting for rank 1
      }  // destroyed here, the calls still pending
      const auto took = std::chrono::steady_clock::now() - start;
      std::string queued_error;
      try {
        h.wait();
      } catch (const accel::comm_error& e) {
        error = e.what();
      }
      try {
        queued.wait();
      } catch (const accel::comm_error& e) {
        queued_error = e.what();
      }
      done.set_value();
      rank1.get();
      REQUIRE(took < 15s);
      REQUIRE_THAT(error, contains("the communicator is being destroyed"));
      // The call that never ran says which message it was.
      REQUIRE(queued_error == std::string("[accel.comm] message #2 from ") + (receive ? "rank 1 to rank 0" : "rank 0 to rank 1") +
                                  ": the communicator was destroyed before this point-to-point call ran (it waited behind earlier calls "
                                  "to the same peer), so nothing of it moved");
    }
  }
}

TEST_CASE("p2p: a shared-memory channel that cannot be made names the OS error", "[p2p]") {
  const std::string name = "/accel-p2p-test-dir-" + std::to_string(::getpid());
  accel::detail::ShmP2pChannel ch(name, true, {1, "rank 1", 0}, 1s, {}, {});
  // posix_fallocate returns its error instead of setting errno: the message names the returned one.
  REQUIRE_THROWS_WITH(ch.open_failed(4096, ENOSPC), contains(std::strerror(ENOSPC)));
  // A name taken by a directory: shm_open fails, and its errno is named.
  REQUIRE(::mkdir(("/dev/shm" + name).c_str(), 0700) == 0);
  std::string error;
  try {
    ch.open("message #1 from rank 0 to rank 1");
  } catch (const accel::comm_error& e) {
    error = e.what();
  }
  ::rmdir(("/dev/shm" + name).c_str());
  REQUIRE_THAT(error, contains(std::strerror(EINVAL)));  // glibc's shm_open reports a directory so
  REQUIRE_THAT(error, contains("to rank 1"));
}

namespace {
// The point-to-point channel segments of this process's communicators in /dev/shm.
std::vector<std::string> channel_segments() {
  std::vector<std::string> out;
  const std::string pid = "." + std::to_string(::getpid()) + ".";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("accel.", 0) == 0 && name.find(pid) != std::string::npos && name.find(".p.") != std::string::npos) out.push_back(name);
  }
  return out;
}
}  // namespace

TEST_CASE("p2p: a sender whose receiver already closed its communicator leaves no shared-memory channel behind", "[p2p]") {
  accel_test::LocalStore job;
  accel::CpuCommOptions o;
  auto c0 = job.client(0, 2, 60s), c1 = job.client(1, 2, 60s);
  std::promise<void> done;
  auto rank1 = std::async(std::launch::async, [&] {
    { accel::CpuCommunicator comm(c1, 1, 2, o); }  // made, then closed (its channels unlinked) at once
    done.get_future().wait();                         // the process lives on
  });
  std::string error;
  {
    accel::CpuCommunicator comm(c0, 0, 2, o);
    REQUIRE(comm.uses_shared_memory_p2p());
    std::this_thread::sleep_for(300ms);
    std::vector<int> v(4);
    try {
      accel::send(comm, std::span(v), 1);
    } catch (const accel::comm_error& e) {
      error = e.what();
    }
  }
  done.set_value();
  rank1.get();
  REQUIRE_THAT(error, contains("rank 1 closed its communicator"));
  REQUIRE(channel_segments().empty());  // a segment the sender made would outlive both communicators
}

TEST_CASE("p2p: a leftover segment under a channel's name is not reused", "[p2p]") {
  // A process that had this pid died unswept and left channels whose names this process's next
  // communicators will use, their counters and offers garbage.
  const std::string base = "/accel." + std::to_string(accel::detail::pid_namespace_id()) + "." + std::to_string(::getpid()) + ".";
  std::vector<std::string> planted;
  for (int c = 0; c < 64; ++c)
    for (int sender : {0, 1}) {
      const std::string name = base + std::to_string(c) + ".p." + std::to_string(sender);
      const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) continue;
      std::vector<unsigned char> junk(4096, 0x5A);
      REQUIRE(::write(fd, junk.data(), junk.size()) == static_cast<ssize_t>(junk.size()));
      ::close(fd);
      planted.push_back(name);
    }
  REQUIRE(!planted.empty());
  const auto errors = run(Backend::cpu_shm, 2, [](accel::Communicator& comm) {
    const int peer = 1 - comm.rank();
    std::vector<int> mine(100, comm.rank()), got(100);
    for (int i = 0; i < 3; ++i) {
      if (comm.rank() == 0) {
        accel::send(comm, std::span(mine), peer);
        accel::recv(comm, std::span(got), peer);
      } else {
        accel::recv(comm, std::span(got), peer);
        accel::send(comm, std::span(mine), peer);
      }
      ACCEL_TEST_ENSURE(got == std::vector<int>(100, peer));
    }
  }, 10s);
  for (const auto& name : planted) ::shm_unlink(name.c_str());
  REQUIRE(errors == std::vector<std::string>{"", ""});
}
