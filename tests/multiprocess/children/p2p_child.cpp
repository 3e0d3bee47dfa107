// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child program of tests/comm/p2p_mp_test.cpp (and the two-machine test): one rank of a job that
// sends point-to-point messages. argv[1] picks the scenario; the main process prints what every
// rank saw (gathered), errors go to stderr as "rank R: <message>" with exit code 2.
//   ring      every rank sends to the next and receives from the previous (send_async), spans of
//             three element types and an empty one, then an object; prints one line per rank
//   pingpong  ranks 0 and 1: spans of every element type, 0 elements, a 64 MiB buffer (both ways;
//             argument big=<bytes> picks another size), objects, and 100 numbered messages each way
//             at once (order); the other ranks idle
//   mismatch  rank 0 sends 4 floats, rank 1 expects 5; then a float32 span to an int32 span;
//             then an object to a span: each rank prints its three errors (gathered)
//   self      every rank sends to itself and to rank <world size>: prints the usage errors
//   grid      4 ranks in a 2 x 2 grid: ping-pong in the stage group and the replica group, a ring
//             in the world; a mismatch in the replica group names group and job ranks
//   (any mode) "path" as a later argument: each rank's line ends with the way its messages went,
//             " (shared memory)" or " (store)" (CPU backend)
//   kill      rank 1 SIGKILLs itself while rank 0 waits in recv from it (and argv[2] == "send":
//             while rank 0 waits in a send to it); rank 0 reports the error and how long it took
// Arguments the scenario does not use are ignored: tests pass a tag there to find the job's
// processes afterwards.
#include <accel/comm/cpu.hpp>
#include <accel/comm/p2p.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw accel::comm_error("wrong result: " + what);
}

template <class T>
std::vector<T> pattern(std::size_t n, int seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<int>((i * 31 + static_cast<std::size_t>(seed) * 7) % 97);
    if constexpr (std::is_integral_v<T>) v[i] = static_cast<T>(x);
    else v[i] = T(static_cast<float>(x));
  }
  return v;
}

// `from` sends `count` elements of T to `to`, which checks them.
template <class T>
void one_way(accel::Communicator& comm, int from, int to, std::size_t count, int seed) {
  if (comm.rank() == from) {
    const auto v = pattern<T>(count, seed);
    accel::send(comm, std::span(v), to);
  } else if (comm.rank() == to) {
    std::vector<T> got(count);
    accel::recv(comm, std::span(got), from);
    expect(got == pattern<T>(count, seed), "span of " + std::to_string(count) + " elements from rank " + std::to_string(from));
  }
}

template <class T>
void both_ways(accel::Communicator& comm, std::size_t count) {
  one_way<T>(comm, 0, 1, count, 1);
  one_way<T>(comm, 1, 0, count, 2);
}

std::string ring(accel::Communicator& comm) {
  const int n = comm.size(), r = comm.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const auto a = pattern<float>(1000, r);
  const auto b = pattern<std::int64_t>(3, r);
  const std::vector<double> empty;
  std::vector<float> ga(1000);
  std::vector<std::int64_t> gb(3);
  std::vector<double> ge;
  auto h1 = accel::send_async(comm, std::span(a), next);
  auto h2 = accel::send_async(comm, std::span(b), next);
  auto h3 = accel::send_async(comm, std::span(empty), next);
  accel::recv(comm, std::span(ga), prev);
  accel::recv(comm, std::span(gb), prev);
  accel::recv(comm, std::span(ge), prev);
  h1.wait(), h2.wait(), h3.wait();
  expect(ga == pattern<float>(1000, prev) && gb == pattern<std::int64_t>(3, prev), "ring from rank " + std::to_string(prev));
  // Objects: even ranks send first, odd ranks receive first (plain calls, no deadlock).
  const std::string mine = "hello from rank " + std::to_string(r);
  std::string got;
  if (r % 2 == 0) {
    accel::send_object(comm, mine, next);
    got = accel::recv_object<std::string>(comm, prev);
  } else {
    got = accel::recv_object<std::string>(comm, prev);
    accel::send_object(comm, mine, next);
  }
  return "rank " + std::to_string(r) + " got '" + got + "'";
}

std::string pingpong(accel::Communicator& comm, std::size_t big) {
  if (comm.rank() > 1) return "rank " + std::to_string(comm.rank()) + " idle";
  both_ways<std::int8_t>(comm, 333);
  both_ways<std::uint8_t>(comm, 1);
  both_ways<std::int32_t>(comm, 1000);
  both_ways<std::uint32_t>(comm, 17);
  both_ways<std::int64_t>(comm, 4096);
  both_ways<std::uint64_t>(comm, 5);
  both_ways<float>(comm, 100'000);
  both_ways<double>(comm, 65'536);
  both_ways<accel::half>(comm, 2);
  both_ways<accel::bfloat16>(comm, 3);
  both_ways<float>(comm, 0);
  both_ways<std::uint8_t>(comm, big);
  const int peer = 1 - comm.rank();
  // Objects.
  const std::vector<std::string> words = {"alpha", "", std::string(300'000, 'z')};
  if (comm.rank() == 0) {
    accel::send_object(comm, words, peer);
    expect(accel::recv_object<std::vector<int>>(comm, peer) == std::vector<int>{1, 2, 3}, "vector<int> object");
  } else {
    expect(accel::recv_object<std::vector<std::string>>(comm, peer) == words, "vector<string> object");
    accel::send_object(comm, std::vector<int>{1, 2, 3}, peer);
  }
  // Order: 100 numbered messages each way at once.
  std::vector<std::int64_t> out(100), in(100, -1);
  std::vector<accel::CollectiveHandle> sends;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::int64_t>(i) * 10 + comm.rank();
    sends.push_back(accel::send_async(comm, std::span(out).subspan(i, 1), peer));
  }
  for (std::size_t i = 0; i < in.size(); ++i) accel::recv(comm, std::span(in).subspan(i, 1), peer);
  for (auto& h : sends) h.wait();
  for (std::size_t i = 0; i < in.size(); ++i) expect(in[i] == static_cast<std::int64_t>(i) * 10 + peer, "message " + std::to_string(i) + " in order");
  return "rank " + std::to_string(comm.rank()) + " exchanged every kind";
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
    return "no error";
  } catch (const accel::usage_error& e) {
    return std::string("usage_error: ") + e.what();
  }
}

std::string mismatch(accel::Communicator& comm) {
  std::string line = "rank " + std::to_string(comm.rank()) + ":";
  if (comm.rank() > 1) return line + " idle";
  std::vector<float> four(4), five(5);
  std::vector<std::int32_t> ints(4);
  const bool sender = comm.rank() == 0;
  line += "\n  " + error_of([&] { sender ? accel::send(comm, std::span(four), 1) : accel::recv(comm, std::span(five), 0); });
  line += "\n  " + error_of([&] { sender ? accel::send(comm, std::span(four), 1) : accel::recv(comm, std::span(ints), 0); });
  line += "\n  " + error_of([&] { sender ? accel::send_object(comm, 42, 1) : accel::recv(comm, std::span(four), 0); });
  // Still in step afterwards.
  std::vector<float> got(4);
  const auto want = pattern<float>(4, 9);
  if (sender) {
    accel::send(comm, std::span(want), 1);
  } else {
    accel::recv(comm, std::span(got), 0);
    expect(got == want, "message after the mismatches");
  }
  return line;
}

std::string self(accel::Communicator& comm) {
  std::vector<int> v(2);
  return "rank " + std::to_string(comm.rank()) + ":\n  " + error_of([&] { accel::send(comm, std::span(v), comm.rank()); }) + "\n  " +
         error_of([&] { accel::recv(comm, std::span(v), comm.size()); });
}

std::string grid(accel::DistributedState& state) {
  accel::Communicator& world = accel::communicator(state);
  const auto g = accel::grid_groups(state, 2, 2);
  const int r = world.rank();
  for (accel::Communicator* group : {g.stage_group.get(), g.replica_group.get()}) {
    const int peer = 1 - group->rank();
    std::vector<std::int32_t> mine(1 << 16, r), got(1 << 16);
    if (group->rank() == 0) {
      accel::send(*group, std::span(mine), peer);
      accel::recv(*group, std::span(got), peer);
    } else {
      accel::recv(*group, std::span(got), peer);
      accel::send(*group, std::span(mine), peer);
    }
    expect(got.front() == group->job_rank(peer) && got.back() == group->job_rank(peer), "group ping-pong");
  }
  std::string err = error_of([&] {
    std::vector<float> a(3), b(4);
    if (g.replica_group->rank() == 0) accel::send(*g.replica_group, std::span(a), 1);
    else accel::recv(*g.replica_group, std::span(b), 0);
  });
  const std::vector<int> mine(1, r);
  std::vector<int> got(1);
  auto h = accel::send_async(state, std::span(mine), (r + 1) % 4);
  accel::recv(state, std::span(got), (r + 3) % 4);
  h.wait();
  expect(got[0] == (r + 3) % 4, "world ring");
  return "rank " + std::to_string(r) + " replica " + std::to_string(g.replica) + " stage " + std::to_string(g.stage) + ": " + err;
}

// The pingpong scenario's large message: big=<bytes> among the arguments, else 64 MiB.
std::size_t big_bytes(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::strncmp(argv[i], "big=", 4) == 0) return static_cast<std::size_t>(std::stoull(argv[i] + 4));
  return std::size_t{64} << 20;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ring";
  int rank = -1;
  try {
    accel::DistributedState state;
    rank = state.process_index();
    accel::Communicator& comm = accel::communicator(state);
    if (mode == "kill") {
      std::printf("pid %d\n", static_cast<int>(::getpid()));  // for tests that look for its leftovers
      std::fflush(stdout);
      accel::wait_for_everyone(state);
      std::vector<std::uint8_t> buf(1000);
      if (rank == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 waits by now
        ::raise(SIGKILL);
      }
      if (rank == 0) {
        const auto start = std::chrono::steady_clock::now();
        try {
          if (argc > 2 && std::strcmp(argv[2], "send") == 0) {
            // Fill the channel so the send waits: a message larger than the ring.
            std::vector<std::uint8_t> big(std::size_t{16} << 20);
            accel::send(comm, std::span(big), 1);
          } else {
            accel::recv(comm, std::span(buf), 1);
          }
        } catch (const accel::error& e) {
          const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
          std::fprintf(stderr, "rank 0 after %lld ms: %s\n", static_cast<long long>(ms), e.what());
          return 2;
        }
      }
      return 0;
    }
    std::string line;
    if (mode == "ring") line = ring(comm);
    else if (mode == "pingpong") line = pingpong(comm, big_bytes(argc, argv));
    else if (mode == "mismatch") line = mismatch(comm);
    else if (mode == "self") line = self(comm);
    else if (mode == "grid") line = grid(state);
    else throw accel::usage_error("unknown mode " + mode);
    // "path" after the mode: each line also says which way this rank's messages went.
    for (int i = 2; i < argc; ++i)
      if (std::strcmp(argv[i], "path") == 0) {
        const auto* cpu = dynamic_cast<const accel::CpuCommunicator*>(&comm);
        line += !cpu ? " (" + comm.backend() + ")" : cpu->uses_shared_memory_p2p() ? " (shared memory)" : " (store)";
      }
    for (const auto& l : accel::gather_object(state, line)) accel::print(state, l);
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}
