// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The CPU backend over a real store server, ranks as threads with their own connections.
#include <accel/comm/collectives.hpp>
#include <accel/comm/cpu.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/store_log.hpp"
#include "support/thread_world.hpp"

using namespace std::chrono_literals;

namespace {

using Job = accel_test::LocalStore;

std::size_t shm_files_of_this_process() {
  std::size_t n = 0;
  const std::string prefix = "accel." + std::to_string(accel::detail::pid_namespace_id()) + "." + std::to_string(::getpid()) + ".";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) ++n;
    ::closedir(d);
  }
  return n;
}

}  // namespace

TEST_CASE("cpu backend: gathers small and large payloads in rank order, with and without shared memory", "[cpu]") {
  for (bool shm : {true, false})
    for (int n : {1, 2, 3, 4}) {
      Job job;
      accel::CpuCommOptions o;
      o.use_shm = shm;
      o.name = "g" + std::to_string(n) + (shm ? "s" : "t");
      const auto errors = job.run_cpu(n, o, [&](accel::CpuCommunicator& comm) {
        ACCEL_TEST_ENSURE(comm.uses_shared_memory() == shm);
        for (std::size_t size : {std::size_t{10}, std::size_t{100'000}, std::size_t{1'500'000}}) {
          // Rank r sends size + r bytes of value r, so sizes and contents differ per rank.
          std::vector<std::uint8_t> mine(size + static_cast<std::size_t>(comm.rank()), static_cast<std::uint8_t>(comm.rank()));
          const auto all = accel::gather_object(comm, mine);
          ACCEL_TEST_ENSURE(all.size() == static_cast<std::size_t>(n));
          for (int i = 0; i < n; ++i) {
            ACCEL_TEST_ENSURE(all[static_cast<std::size_t>(i)].size() == size + static_cast<std::size_t>(i));
            ACCEL_TEST_ENSURE(all[static_cast<std::size_t>(i)].back() == static_cast<std::uint8_t>(i));
          }
        }
      }, 20s);
      for (const auto& e : errors) REQUIRE(e == std::string());
    }
  REQUIRE(shm_files_of_this_process() == 0);  // segments are unlinked with their communicator
}

TEST_CASE("cpu backend: segments a killed process left behind are removed, live ones kept", "[cpu]") {
  // A pid that no longer exists: a child that has exited and been reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);
  const std::string ns = std::to_string(accel::detail::pid_namespace_id());
  const std::string dead = "/accel." + ns + "." + std::to_string(child) + ".0.a";
  const std::string live = "/accel." + ns + "." + std::to_string(::getpid()) + ".999.a";
  const std::string other_ns = "/accel.1." + std::to_string(child) + ".0.a";  // another container's: not ours to judge
  for (const auto& name : {dead, live, other_ns}) {
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  auto exists = [](const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; };
  REQUIRE(accel::detail::remove_stale_shm_segments() >= 1);
  CHECK_FALSE(exists(dead));
  CHECK(exists(live));
  CHECK(exists(other_ns));
  ::shm_unlink(live.c_str());
  ::shm_unlink(other_ns.c_str());
}

TEST_CASE("cpu backend: many back-to-back large rounds never read a segment being rewritten", "[cpu]") {
  Job job;
  accel::CpuCommOptions o;
  o.shm_threshold = 1;
  const auto errors = job.run_cpu(3, o, [](accel::CpuCommunicator& comm) {
    for (int round = 0; round < 40; ++round) {
      std::vector<int> mine(70'000 + static_cast<std::size_t>(round), round * 10 + comm.rank());  // past a slot: segments
      const auto all = accel::gather_object(comm, mine);
      for (int i = 0; i < 3; ++i) {
        ACCEL_TEST_ENSURE(all[static_cast<std::size_t>(i)].front() == round * 10 + i);
        ACCEL_TEST_ENSURE(all[static_cast<std::size_t>(i)].back() == round * 10 + i);
      }
    }
  }, 20s);
  for (const auto& e : errors) REQUIRE(e == std::string());
}

TEST_CASE("cpu backend: broadcast, barrier and the shard gather work over the store", "[cpu]") {
  Job job;
  const auto errors = job.run_cpu(4, {}, [](accel::CpuCommunicator& comm) {
    ACCEL_TEST_ENSURE(accel::broadcast_object(comm, std::string(300'000, static_cast<char>('a' + comm.rank())), 2) == std::string(300'000, 'c'));
    accel::wait_for_everyone(comm);
    std::vector<int> input(10);
    for (int i = 0; i < 10; ++i) input[static_cast<std::size_t>(i)] = i * i;
    auto mine = accel::split_between_processes(input, static_cast<std::size_t>(comm.rank()), 4, {.apply_padding = true});
    ACCEL_TEST_ENSURE(accel::gather_object(comm, std::vector<int>(mine.begin(), mine.end()), mine.shard()) == input);
  }, 20s);
  for (const auto& e : errors) REQUIRE(e == std::string());
}

TEST_CASE("cpu backend: a collective called only on rank 0 fails as soon as the others exit", "[cpu]") {
  Job job;
  const auto errors = job.run_cpu(3, {}, [](accel::CpuCommunicator& comm) {
    if (comm.rank() == 0) accel::gather_object(comm, 1);
  }, 20s);
  REQUIRE(errors[0].find("exited without joining gather_object #1 (was the collective called on only some ranks") != std::string::npos);
  REQUIRE(errors[1].empty());
  REQUIRE(errors[2].empty());
}

TEST_CASE("cpu backend: different collectives on different ranks are reported on every rank", "[cpu]") {
  Job job;
  const auto errors = job.run_cpu(2, {}, [](accel::CpuCommunicator& comm) {
    if (comm.rank() == 0) accel::broadcast_object(comm, 1, 0);
    else accel::gather_object(comm, 1);
  }, 20s);
  for (const auto& e : errors)
    REQUIRE(e.find("collective mismatch at ") != std::string::npos);
  REQUIRE(errors[0].find("rank 0 called broadcast_object #1 (root 0), rank 1 called gather_object #1") != std::string::npos);
}

TEST_CASE("cpu backend: a late rank produces a timeout naming it", "[cpu]") {
  Job job;
  std::vector<std::future<std::string>> fs;
  auto c0 = job.client(0, 2, 300ms), c1 = job.client(1, 2, 300ms);
  std::promise<void> release;
  auto r1 = std::async(std::launch::async, [&] {
    accel::CpuCommunicator comm(c1, 1, 2);
    release.get_future().wait();  // joins the communicator, then stays away from the barrier
  });
  accel::CpuCommunicator comm(c0, 0, 2);
  REQUIRE_THROWS_AS(accel::wait_for_everyone(comm), accel::timeout_error);
  release.set_value();
  r1.get();
  c1.reset();  // rank 1's only connection: now it has exited
  auto c2 = job.client(0, 2, 300ms);
  accel::CpuCommOptions o;
  o.name = "other";
  REQUIRE_THROWS_WITH(accel::CpuCommunicator(c2, 0, 2, o),
                      accel_test::contains("rank 1 exited without joining communicator setup (other)"));
}

TEST_CASE("cpu backend: ACCEL_CPU_SHM=0 sends everything through the store", "[cpu]") {
  Job job;
  ::setenv("ACCEL_CPU_SHM", "0", 1);
  const auto errors = job.run_cpu(2, {}, [](accel::CpuCommunicator& comm) {
    ACCEL_TEST_ENSURE(!comm.uses_shared_memory());
    ACCEL_TEST_ENSURE(accel::gather_object(comm, std::string(100'000, 'x')).size() == 2);
  }, 20s);
  ::unsetenv("ACCEL_CPU_SHM");
  for (const auto& e : errors) REQUIRE(e == std::string());
}
