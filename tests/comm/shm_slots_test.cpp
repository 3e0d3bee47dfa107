// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Rounds with small payloads through shared-memory slots (comm/detail/shm_slots.hpp): the waiting
// plan, the slot decisions, results identical to the store path for 2-8 ranks with random sizes
// (0 and the slot boundary included), back-to-back rounds, and the ways a peer can fail.
#include <accel/comm/collectives.hpp>
#include <accel/comm/cpu.hpp>
#include <accel/comm/detail/shm_slots.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/store_log.hpp"
#include "support/thread_world.hpp"

using namespace std::chrono_literals;

namespace {

using Job = accel_test::LocalStore;
namespace d = accel::detail;

// Rank r's payload in round k: `size` bytes derived from (round, rank, position).
std::vector<std::byte> payload_of(int round, int rank, std::size_t size) {
  std::vector<std::byte> v(size);
  for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<std::byte>((round * 131 + rank * 31 + static_cast<int>(i)) & 0xFF);
  return v;
}

// The payload sizes of every (round, rank): random, with 0 and the slot boundary (limit, limit + 1) mixed in.
std::vector<std::vector<std::size_t>> sizes_for(int rounds, int world, std::size_t limit, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<std::size_t>> s(static_cast<std::size_t>(rounds), std::vector<std::size_t>(static_cast<std::size_t>(world)));
  for (auto& round : s)
    for (auto& size : round) {
      switch (rng() % 6) {
        case 0: size = 0; break;
        case 1: size = limit; break;
        case 2: size = limit + 1; break;
        case 3: size = limit - 1; break;
        default: size = rng() % (limit + limit / 4); break;
      }
    }
  return s;
}

// Runs the rounds on `world` thread ranks and checks every part of every round; returns each rank's error.
std::vector<std::string> run_rounds(int world, bool shm, const std::vector<std::vector<std::size_t>>& sizes, std::size_t limit) {
  Job job;
  accel::CpuCommOptions o;
  o.use_shm = shm;
  o.slot_payload_bytes = limit;
  return job.run_cpu(world, o, [&](accel::CpuCommunicator& comm) {
    ACCEL_TEST_ENSURE(comm.uses_shared_memory_slots() == shm);
    for (int k = 0; k < static_cast<int>(sizes.size()); ++k) {
      const auto& round = sizes[static_cast<std::size_t>(k)];
      const auto mine = payload_of(k, comm.rank(), round[static_cast<std::size_t>(comm.rank())]);
      if (k % 7 == 3) {  // a broadcast now and then: only the root's payload travels
        const int root = k % world;
        const auto got = comm.broadcast("bcast", mine, root);
        ACCEL_TEST_ENSURE(got == (comm.rank() == root ? mine : payload_of(k, root, round[static_cast<std::size_t>(root)])));
        continue;
      }
      const accel::Blobs all = comm.all_gather("gather", mine);
      ACCEL_TEST_ENSURE(all.size() == static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r) {
        const auto want = payload_of(k, r, round[static_cast<std::size_t>(r)]);
        const auto got = all[static_cast<std::size_t>(r)];
        ACCEL_TEST_ENSURE(std::vector<std::byte>(got.begin(), got.end()) == want);
      }
    }
  }, 60s);
}

// Two slot engines of one "process" (rank 0 and 1 as threads), wired as a communicator would.
struct SlotPair {
  std::string prefix = d::unique_shm_prefix();
  std::vector<std::unique_ptr<d::ShmSlotExchange>> ranks;
  std::vector<d::ShmSlotExchange::Peer> peers;
  SlotPair(std::chrono::milliseconds timeout0, std::chrono::milliseconds timeout1, std::int64_t pid1 = ::getpid()) {
    ranks.push_back(std::make_unique<d::ShmSlotExchange>(prefix + ".s0", 1024, timeout0));
    ranks.push_back(std::make_unique<d::ShmSlotExchange>(prefix + ".s1", 1024, timeout1));
    for (auto& r : ranks) REQUIRE(r->create());
    peers = {{ranks[0]->segment(), ::getpid()}, {ranks[1]->segment(), pid1}};
    ranks[0]->connect(0, peers);
    ranks[1]->connect(1, peers);
  }
  // One round of rank r with a 10-byte payload.
  bool run(int r, const std::string& label = "gather_object #1") {
    accel::Blobs h, p;
    const std::vector<std::byte> header(8, std::byte{1}), body(10, std::byte{2});
    return ranks[static_cast<std::size_t>(r)]->run(label, header, body, {}, h, p);
  }
};

}  // namespace

TEST_CASE("shm slots: spin only with CPUs to spare, yield otherwise", "[cpu][slots]") {
  STATIC_REQUIRE(d::spin_plan(2, 4).spin.count() > 0);
  STATIC_REQUIRE(d::spin_plan(4, 64).spin.count() > 0);
  STATIC_REQUIRE(d::spin_plan(2, 2).spin.count() == 0);  // a peer may share this CPU: spinning would keep it off
  STATIC_REQUIRE(d::spin_plan(3, 2).spin.count() == 0);
  STATIC_REQUIRE(d::spin_plan(8, 2).spin.count() == 0);
  STATIC_REQUIRE(d::spin_plan(8, 2).yield.count() > 0);  // back off to other processes before sleeping
  CHECK(d::usable_cpus() >= 1);
}

TEST_CASE("shm slots: what fits a slot, and when a communicator may use them", "[cpu][slots]") {
  STATIC_REQUIRE(d::sends_in_slot(0, 0, 1024));
  STATIC_REQUIRE(d::sends_in_slot(d::slot_header_room, 1024, 1024));
  STATIC_REQUIRE_FALSE(d::sends_in_slot(d::slot_header_room + 1, 0, 1024));
  STATIC_REQUIRE_FALSE(d::sends_in_slot(10, 1025, 1024));
  // A slot made for 1024-byte payloads holds the largest entry this rank may send, and no more.
  STATIC_REQUIRE(d::fits_slot(d::slot_header_room, 1024, d::slot_bytes_for(1024)));
  STATIC_REQUIRE_FALSE(d::fits_slot(d::slot_header_room, 1025, d::slot_bytes_for(1024)));
  STATIC_REQUIRE_FALSE(d::fits_slot(~std::size_t{0}, 1, d::slot_bytes_for(1024)));  // no overflow on hostile sizes
  STATIC_REQUIRE_FALSE(d::fits_slot(1, ~std::size_t{0}, d::slot_bytes_for(1024)));

  // Slot payloads: with one peer as requested; with more, each round's copies of the peers' entries
  // stay within 1 MiB (so the default 256 KiB holds up to 5 ranks), but slots never shrink under
  // 64 KiB (nor grow past the request).
  constexpr std::size_t kib = 1024;
  STATIC_REQUIRE(d::slot_payload_limit(256 * kib, 2) == 256 * kib);
  STATIC_REQUIRE(d::slot_payload_limit(256 * kib, 5) == 256 * kib);
  STATIC_REQUIRE(d::slot_payload_limit(256 * kib, 8) == 1024 * kib / 7);
  STATIC_REQUIRE(d::slot_payload_limit(256 * kib, 17) == 64 * kib);
  STATIC_REQUIRE(d::slot_payload_limit(256 * kib, 1000) == 64 * kib);
  STATIC_REQUIRE(d::slot_payload_limit(4 * kib, 64) == 4 * kib);
  STATIC_REQUIRE(d::slot_payload_limit(8 << 20, 2) == 8 << 20);

  const std::vector<std::string> segs = {"/a", "/b"};
  CHECK(d::slots_usable(true, true, segs, {7, 7}, 7));
  CHECK_FALSE(d::slots_usable(false, true, segs, {7, 7}, 7));     // another machine
  CHECK_FALSE(d::slots_usable(true, false, segs, {7, 7}, 7));     // shared memory switched off
  CHECK_FALSE(d::slots_usable(true, true, {"/a", ""}, {7, 7}, 7));  // a rank without a slot segment
  CHECK_FALSE(d::slots_usable(true, true, segs, {7, 8}, 7));      // a rank whose pid cannot be watched
  CHECK_FALSE(d::slots_usable(true, true, segs, {0, 0}, 0));      // no PID namespace known
  CHECK_FALSE(d::slots_usable(true, true, {"/a"}, {7}, 7));       // one rank: nothing to exchange
}

TEST_CASE("shm slots: random sizes give what the store path gives, 2-8 ranks", "[cpu][slots]") {
  constexpr std::size_t limit = 2048;
  for (int world : {2, 3, 5, 8}) {
    INFO("world " << world);
    const auto sizes = sizes_for(world == 8 ? 25 : 60, world, limit, 1234u + static_cast<unsigned>(world));
    for (bool shm : {true, false}) {
      INFO((shm ? "slots" : "store"));
      for (const auto& e : run_rounds(world, shm, sizes, limit)) REQUIRE(e == std::string());
    }
  }
}

TEST_CASE("shm slots: typed collectives through slots, large rounds mixed in", "[cpu][slots]") {
  Job job;
  accel::CpuCommOptions o;
  o.slot_payload_bytes = 4096;
  const auto errors = job.run_cpu(4, o, [](accel::CpuCommunicator& comm) {
    ACCEL_TEST_ENSURE(comm.uses_shared_memory_slots());
    for (int k = 0; k < 30; ++k) {
      const std::size_t n = k % 5 == 0 ? 100'000 : static_cast<std::size_t>(k * 10);  // every fifth round: too large for a slot
      const auto all = accel::gather_object(comm, std::vector<int>(n, k * 10 + comm.rank()));
      for (int r = 0; r < 4; ++r) {
        ACCEL_TEST_ENSURE(all[static_cast<std::size_t>(r)].size() == n);
        ACCEL_TEST_ENSURE(n == 0 || all[static_cast<std::size_t>(r)].back() == k * 10 + r);
      }
      ACCEL_TEST_ENSURE(accel::broadcast_object(comm, std::string("from ") + std::to_string(comm.rank()), k % 4) ==
                        "from " + std::to_string(k % 4));
      accel::wait_for_everyone(comm);
    }
  }, 60s);
  for (const auto& e : errors) REQUIRE(e == std::string());
}

TEST_CASE("shm slots: thousands of back-to-back rounds never read a slot being rewritten", "[cpu][slots]") {
  Job job;
  const auto errors = job.run_cpu(3, {}, [](accel::CpuCommunicator& comm) {
    for (int k = 0; k < 3000; ++k) {
      const auto all = accel::gather_object(comm, std::vector<std::int64_t>(1 + k % 17, k * 8 + comm.rank()));
      for (int r = 0; r < 3; ++r) {
        const auto& part = all[static_cast<std::size_t>(r)];
        ACCEL_TEST_ENSURE(part.size() == static_cast<std::size_t>(1 + k % 17));
        ACCEL_TEST_ENSURE(part.front() == k * 8 + r && part.back() == k * 8 + r);
      }
    }
  }, 60s);
  for (const auto& e : errors) REQUIRE(e == std::string());
}

TEST_CASE("shm slots: a type mismatch fails on every rank naming both types", "[cpu][slots]") {
  Job job;
  const auto errors = job.run_cpu(2, {}, [](accel::CpuCommunicator& comm) {
    ACCEL_TEST_ENSURE(comm.uses_shared_memory_slots());
    if (comm.rank() == 0) accel::gather_object(comm, std::vector<std::int64_t>(4, 1));
    else accel::gather_object(comm, std::vector<double>(4, 1.0));
  }, 20s);
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.find("signed-integer") != std::string::npos);
    CHECK(e.find("floating-point") != std::string::npos);
  }
}

TEST_CASE("shm slots: a failure marker travels through the slot and names the rank everywhere", "[cpu][slots]") {
  Job job;
  const auto errors = job.run_cpu(3, {}, [](accel::CpuCommunicator& comm) {
    std::exception_ptr failure;
    if (comm.rank() == 2) failure = std::make_exception_ptr(accel::usage_error("rank 2's own problem"));
    comm.all_gather("gather_object", std::vector<std::byte>(5), failure);
  }, 20s);
  REQUIRE(errors[2].find("rank 2's own problem") != std::string::npos);
  for (int r : {0, 1}) REQUIRE(errors[static_cast<std::size_t>(r)].find("rank 2 failed before gather_object #1") != std::string::npos);
}

TEST_CASE("shm slots: a rank that closed its communicator without joining is named by the store", "[cpu][slots]") {
  Job job;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = job.run_cpu(3, {}, [](accel::CpuCommunicator& comm) {
    ACCEL_TEST_ENSURE(comm.uses_shared_memory_slots());
    accel::wait_for_everyone(comm);
    if (comm.rank() == 1) accel::gather_object(comm, 1);
  }, 60s);
  REQUIRE(errors[1].find("exited without joining gather_object #2") != std::string::npos);
  REQUIRE(errors[0].empty());
  REQUIRE(errors[2].empty());
  REQUIRE(std::chrono::steady_clock::now() - start < 30s);  // noticed, not timed out
}

TEST_CASE("shm slots: a peer that closed its communicator before this one mapped it counts as left", "[cpu][slots]") {
  // Rank 0 made its communicator and destroyed it (its segment unlinked) before rank 1 learnt its peers.
  const std::string prefix = d::unique_shm_prefix();
  auto r0 = std::make_unique<d::ShmSlotExchange>(prefix + ".s0", 1024, 20s);
  d::ShmSlotExchange r1(prefix + ".s1", 1024, 20s);
  REQUIRE(r0->create());
  REQUIRE(r1.create());
  const std::vector<d::ShmSlotExchange::Peer> peers = {{r0->segment(), ::getpid()}, {r1.segment(), ::getpid()}};
  r0.reset();
  r1.connect(1, peers);
  try {
    accel::Blobs h, p;
    const std::vector<std::byte> header(8), body(10);
    r1.run("gather_object #1", header, body, {}, h, p);
    FAIL("the round completed without rank 0");
  } catch (const d::shm_peer_left& e) {
    CHECK(e.rank() == 0);
    CHECK_THAT(std::string(e.what()), accel_test::contains("closed its communicator without joining gather_object #1"));
  }
}

TEST_CASE("shm slots: ranks that leave at once while a slow rank's first collective is still to come", "[cpu][slots]") {
  for (int attempt = 0; attempt < 5; ++attempt) {
    Job job;  // a fresh store: in a reused one, this attempt's ranks would find the last one's as exited
    const auto errors = job.run_cpu(3, {}, [](accel::CpuCommunicator& comm) {
      if (comm.rank() != 2) return;  // ranks 0 and 1 create their communicator and destroy it at once
      std::this_thread::sleep_for(50ms);
      accel::wait_for_everyone(comm);
    }, 20s);
    INFO(errors[0] << " | " << errors[1] << " | " << errors[2]);
    REQUIRE(errors[0].empty());
    REQUIRE(errors[1].empty());
    REQUIRE_THAT(errors[2], accel_test::contains("exited without joining wait_for_everyone #1"));
  }
}

TEST_CASE("shm slots: a peer whose process is gone is named at once", "[cpu][slots]") {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);  // reaped: the pid no longer exists
  SlotPair pair(20s, 20s, child);
  const auto start = std::chrono::steady_clock::now();
  try {
    pair.run(0);
    FAIL("the round completed without rank 1");
  } catch (const d::shm_peer_left& e) {
    CHECK(e.rank() == 1);
    CHECK_THAT(std::string(e.what()), accel_test::contains("rank 1 (pid " + std::to_string(child) + ") exited or died without joining gather_object #1"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  REQUIRE_THROWS_WITH(pair.run(0), accel_test::contains("an earlier collective on this communicator failed mid-round"));
}

TEST_CASE("shm slots: a peer that never arrives is a timeout naming it, one that gave up is named by the next", "[cpu][slots]") {
  SlotPair pair(200ms, 20s);
  REQUIRE_THROWS_WITH(pair.run(0), accel_test::contains("timed out after 200 ms in gather_object #1: rank 1 has not arrived"));
  // Rank 1 completes round 1 (rank 0 posted it before giving up) and then finds rank 0 gone from round 2.
  REQUIRE(pair.run(1));
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(pair.run(1, "barrier #2"), accel_test::contains("rank 0 gave up during an earlier round"));
  REQUIRE(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("shm slots: one rank's too-large entry sends the round through the store on every rank", "[cpu][slots]") {
  SlotPair pair(20s, 20s);
  auto other = std::async(std::launch::async, [&] { return pair.run(1); });  // 10 bytes: fits
  accel::Blobs h, p;
  const std::vector<std::byte> header(8), big(2000);
  REQUIRE_FALSE(pair.ranks[0]->run("gather_object #1", header, big, {}, h, p));
  REQUIRE_FALSE(other.get());
  REQUIRE(h.size() == 0);
  // The next round still lines up.
  auto next = std::async(std::launch::async, [&] { return pair.run(1); });
  REQUIRE(pair.run(0));
  REQUIRE(next.get());
}
