// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Buffer collectives (all_gather, all_reduce, broadcast, reduce_scatter over spans): property tests
// against a serial reference over the CPU backend (shared memory and store rounds), thread worlds
// and the solo backend; mismatched types and lengths fail on every rank naming both.
#include <accel/comm/collectives.hpp>
#include <accel/comm/cpu.hpp>
#include <accel/comm/reduce.hpp>

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "support/catch.hpp"
#include "support/store_log.hpp"
#include "support/thread_world.hpp"

using namespace std::chrono_literals;
using accel::ReduceOp;

namespace {

using Job = accel_test::LocalStore;

// Runs fn(comm) on n CPU-backend ranks (threads, each with its own store connection); returns each
// rank's exception message ("" for none).
std::vector<std::string> run_cpu(int n, accel::CpuCommOptions options, const std::function<void(accel::Communicator&)>& fn,
                                 std::chrono::milliseconds timeout = 30s) {
  return Job().run_cpu(n, options, fn, timeout);
}

// The same over a thread world (the Communicator's default data step) or solo.
std::vector<std::string> run_threads(int n, const std::function<void(accel::Communicator&)>& fn) {
  std::vector<std::string> out;
  for (const auto& e : accel_test::run_world(n, [&](accel::Communicator& c) { fn(c); })) out.push_back(accel_test::message(e));
  return out;
}

// Deterministic per-(seed, rank, index) values, small enough that products stay finite.
template <class T>
T value_of(std::uint64_t seed, int rank, std::size_t i) {
  // splitmix64 of (seed, rank, i): cheap enough to recompute for the reference
  std::uint64_t u = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull;
  u = (u ^ (u >> 30)) * 0xBF58476D1CE4E5B9ull;
  u = (u ^ (u >> 27)) * 0x94D049BB133111EBull;
  u ^= u >> 31;
  if constexpr (std::is_same_v<T, accel::half> || std::is_same_v<T, accel::bfloat16>) {
    return T(static_cast<float>(static_cast<int>(u % 17) - 8) / 4.0f);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(static_cast<double>(static_cast<long long>(u % 2001) - 1000) / 256.0);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(static_cast<long long>(u % 11) - 5);
  } else {
    return static_cast<T>(u % 10);
  }
}

template <class T>
std::vector<T> values(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value_of<T>(seed, rank, i);
  return v;
}

// The serial reference: element i of rank 0 op rank 1 op …, in rank order, half and bfloat16 in
// float, integers wrapping; written independently of the library's kernels.
template <class T>
T reference(std::uint64_t seed, int world, std::size_t i, ReduceOp op) {
  constexpr bool narrow = std::is_same_v<T, accel::half> || std::is_same_v<T, accel::bfloat16>;
  using A = std::conditional_t<narrow, float, T>;
  auto widen = [](T v) -> A {
    if constexpr (narrow) return static_cast<float>(v);
    else return v;
  };
  A acc = widen(value_of<T>(seed, 0, i));
  for (int r = 1; r < world; ++r) {
    const A x = widen(value_of<T>(seed, r, i));
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      if (op == ReduceOp::sum || op == ReduceOp::avg) acc = static_cast<A>(static_cast<U>(static_cast<U>(acc) + static_cast<U>(x)));
      if (op == ReduceOp::prod) acc = static_cast<A>(static_cast<U>(static_cast<U>(acc) * static_cast<U>(x)));
    } else {
      if (op == ReduceOp::sum || op == ReduceOp::avg) acc = acc + x;
      if (op == ReduceOp::prod) acc = acc * x;
    }
    if (op == ReduceOp::min && x < acc) acc = x;
    if (op == ReduceOp::max && acc < x) acc = x;
  }
  if (op == ReduceOp::avg) acc = static_cast<A>(acc / static_cast<A>(world));
  if constexpr (narrow) return T(acc);
  else return acc;
}

template <class T>
bool same(T a, T b) {
  if constexpr (std::is_same_v<T, accel::half> || std::is_same_v<T, accel::bfloat16>) return a.bits == b.bits;
  else return a == b;
}

// One random case of every operation for element type T on `comm`; throws on a wrong element.
template <class T>
void check_all_ops(accel::Communicator& comm, std::uint64_t seed) {
  const int n = comm.size(), me = comm.rank();
  std::mt19937_64 shared(seed);  // the same draws on every rank
  const std::size_t len = shared() % 3 == 0 ? shared() % 8 : shared() % 20'000;
  const auto op = static_cast<ReduceOp>(shared() % 5);
  const int root = static_cast<int>(shared() % static_cast<std::uint64_t>(n));
  const std::string what = std::string(accel::element_type_name(accel::element_type_of<T>())) + " len " + std::to_string(len) + " op " +
                           std::string(accel::reduce_op_name(op)) + " root " + std::to_string(root);
  auto ensure = [&](bool ok, const char* where, std::size_t i) {
    if (!ok) throw std::runtime_error(std::string(where) + " wrong at element " + std::to_string(i) + " (" + what + ")");
  };

  auto data = values<T>(seed, me, len);
  accel::all_reduce(comm, std::span(data), op);
  for (std::size_t i = 0; i < len; ++i) ensure(same(data[i], reference<T>(seed, n, i, op)), "all_reduce", i);

  const auto mine = values<T>(seed, me, len);
  std::vector<T> gathered(len * static_cast<std::size_t>(n));
  accel::all_gather(comm, std::span(mine), std::span(gathered));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < len; ++i)
      ensure(same(gathered[static_cast<std::size_t>(r) * len + i], value_of<T>(seed, r, i)), "all_gather", i);

  auto b = values<T>(seed, me, len);
  auto handle = accel::broadcast_async(comm, std::span(b), root);
  handle.wait();
  for (std::size_t i = 0; i < len; ++i) ensure(same(b[i], value_of<T>(seed, root, i)), "broadcast", i);

  // reduce_scatter: every rank sends n blocks of len; block r's reduction lands on rank r.
  const auto send = values<T>(seed, me, len * static_cast<std::size_t>(n));
  std::vector<T> block(len);
  accel::reduce_scatter(comm, std::span(send), std::span(block), op);
  for (std::size_t i = 0; i < len; ++i)
    ensure(same(block[i], reference<T>(seed, n, static_cast<std::size_t>(me) * len + i, op)), "reduce_scatter", i);
}

void check_every_type(accel::Communicator& comm, std::uint64_t seed) {
  check_all_ops<float>(comm, seed);
  check_all_ops<double>(comm, seed + 1);
  check_all_ops<accel::half>(comm, seed + 2);
  check_all_ops<accel::bfloat16>(comm, seed + 3);
  check_all_ops<std::int32_t>(comm, seed + 4);
  check_all_ops<std::int64_t>(comm, seed + 5);
  check_all_ops<std::uint8_t>(comm, seed + 6);
  check_all_ops<std::int8_t>(comm, seed + 7);
  check_all_ops<std::uint32_t>(comm, seed + 8);
  check_all_ops<std::uint64_t>(comm, seed + 9);
}

void require_no_errors(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r] == std::string());
  }
}

}  // namespace

TEST_CASE("buffer collectives: the descriptor check names the ranks, their types and lengths", "[buffers]") {
  using accel::detail::BufferDescriptor;
  const BufferDescriptor f{accel::BufferOp::all_reduce, accel::ElementType::float32, ReduceOp::sum, 10, 10};
  BufferDescriptor i = f;
  i.type = accel::ElementType::int32;
  REQUIRE_THROWS_WITH(accel::detail::check_descriptors({f, i, f}, "all_reduce #3"),
                      accel_test::contains("all_reduce #3: element types differ across ranks: ranks 0, 2 pass float32, rank 1 "
                                           "passes int32; every rank must pass spans of the same element type"));
  BufferDescriptor shorter = f;
  shorter.send_count = shorter.recv_count = 9;
  REQUIRE_THROWS_WITH(accel::detail::check_descriptors({f, shorter}, "all_reduce #1"),
                      accel_test::contains("all_reduce #1: buffer lengths differ across ranks: rank 0 passes 10 float32 elements, "
                                           "rank 1 passes 9 float32 elements"));
  BufferDescriptor other_op = f;
  other_op.op = ReduceOp::max;
  REQUIRE_THROWS_WITH(accel::detail::check_descriptors({f, other_op}, "all_reduce #1"),
                      accel_test::contains("reduction operators differ across ranks: rank 0 passes sum, rank 1 passes max"));
  REQUIRE_NOTHROW(accel::detail::check_descriptors({f, f, f}, "all_reduce #1"));
  // A descriptor survives its encoding.
  const auto back = accel::detail::decode_descriptor(accel::detail::encode_descriptor(i), 0);
  REQUIRE(back.type == accel::ElementType::int32);
  REQUIRE(back.send_count == 10);
}

TEST_CASE("buffer collectives: element types map C++ types onto NCCL's set", "[buffers]") {
  STATIC_REQUIRE(accel::element_type_of<float>() == accel::ElementType::float32);
  STATIC_REQUIRE(accel::element_type_of<long long>() == accel::ElementType::int64);
  STATIC_REQUIRE(accel::element_type_of<unsigned char>() == accel::ElementType::uint8);
  STATIC_REQUIRE(accel::element_type_of<accel::half>() == accel::ElementType::float16);
  STATIC_REQUIRE(accel::element_type_of<accel::bfloat16>() == accel::ElementType::bfloat16);
  STATIC_REQUIRE(!accel::is_buffer_element_v<short>);
  STATIC_REQUIRE(!accel::is_buffer_element_v<bool>);
  // half and bfloat16 reduce in float and round once: 1 + 2^-11 is not a binary16 but the sum of three is.
  const accel::half one(1.0f), tiny(0.00048828125f);  // 2^-11
  std::vector<accel::half> a{one}, b{tiny}, c{tiny}, out(1);
  accel::detail::reduce_into<accel::half>(out.data(), {a.data(), b.data(), c.data()}, 1, ReduceOp::sum);
  REQUIRE(static_cast<float>(out[0]) == 1.0009765625f);  // 1 + 2^-10, not 1 (pairwise rounding would lose both)
}

TEST_CASE("buffer collectives: CPU backend over shared memory matches the serial reference, 2-8 ranks", "[buffers][cpu]") {
  for (int n : {2, 3, 5, 8}) {
    accel::CpuCommOptions o;
    o.buffer_chunk_bytes = 4096;  // many pipelined steps for a few thousand elements
    o.name = "prop" + std::to_string(n);
    const auto errors = run_cpu(n, o, [&](accel::Communicator& comm) {
      ACCEL_TEST_ENSURE(dynamic_cast<accel::CpuCommunicator&>(comm).uses_shared_memory());
      for (std::uint64_t seed = 1; seed <= 3; ++seed) check_every_type(comm, seed * 100 + static_cast<std::uint64_t>(n));
    });
    INFO("world " << n);
    require_no_errors(errors);
  }
}

TEST_CASE("buffer collectives: a large all_reduce crosses many chunks with the default chunk size", "[buffers][cpu]") {
  const auto errors = run_cpu(4, {}, [](accel::Communicator& comm) {
    std::vector<float> v(3'000'017);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000) + static_cast<float>(comm.rank());
    for (int round = 0; round < 3; ++round) {
      std::vector<float> w = v;
      accel::all_reduce(comm, std::span(w), ReduceOp::sum);
      for (std::size_t i = 0; i < w.size(); i += 997)
        ACCEL_TEST_ENSURE(w[i] == 4.0f * static_cast<float>(i % 1000) + 6.0f);
      ACCEL_TEST_ENSURE(w.back() == 4.0f * static_cast<float>((w.size() - 1) % 1000) + 6.0f);
    }
  });
  require_no_errors(errors);
}

TEST_CASE("buffer collectives: the store path, thread worlds and solo give the same results", "[buffers]") {
  SECTION("CPU backend without shared memory") {
    accel::CpuCommOptions o;
    o.use_shm = false;
    const auto errors = run_cpu(3, o, [](accel::Communicator& comm) { check_every_type(comm, 7); });
    require_no_errors(errors);
  }
  SECTION("thread worlds") {
    for (int n : {1, 2, 4, 7}) require_no_errors(run_threads(n, [](accel::Communicator& comm) { check_every_type(comm, 11); }));
  }
  SECTION("solo") {
    accel::SoloCommunicator solo;
    check_every_type(solo, 13);
  }
}

TEST_CASE("buffer collectives: different element types fail on every rank naming both", "[buffers][cpu]") {
  for (bool shm : {true, false}) {
    accel::CpuCommOptions o;
    o.use_shm = shm;
    const auto errors = run_cpu(2, o, [](accel::Communicator& comm) {
      if (comm.rank() == 0) {
        std::vector<std::int64_t> v(8, 1);
        accel::all_reduce(comm, std::span(v), ReduceOp::sum);
      } else {
        std::vector<double> v(8, 1.0);  // the same byte size: must not be reinterpreted
        accel::all_reduce(comm, std::span(v), ReduceOp::sum);
      }
    });
    for (const auto& e : errors) {
      REQUIRE_THAT(e, accel_test::contains("[accel.usage] all_reduce #1: element types differ across ranks: rank 0 passes int64, "
                                           "rank 1 passes float64"));
    }
  }
}

TEST_CASE("buffer collectives: different lengths fail on every rank naming the ranks and lengths", "[buffers][cpu]") {
  const auto errors = run_cpu(3, {}, [](accel::Communicator& comm) {
    std::vector<float> v(comm.rank() == 1 ? 99 : 100);
    accel::broadcast(comm, std::span(v), 0);
  });
  for (const auto& e : errors)
    REQUIRE_THAT(e, accel_test::contains("broadcast #1: buffer lengths differ across ranks: ranks 0, 2 pass 100 float32 elements, "
                                         "rank 1 passes 99 float32 elements; every rank must pass spans of the same length"));
  // The communicator stays usable: nothing moved.
  const auto again = run_cpu(2, {}, [](accel::Communicator& comm) {
    std::vector<int> v(3, comm.rank() == 0 ? 1 : 2);
    try {
      std::vector<int> w(static_cast<std::size_t>(comm.rank()) + 1);
      accel::all_reduce(comm, std::span(w), ReduceOp::sum);
      ACCEL_TEST_ENSURE(false);
    } catch (const accel::usage_error&) {
    }
    accel::all_reduce(comm, std::span(v), ReduceOp::sum);
    ACCEL_TEST_ENSURE(v == std::vector<int>(3, 3));
  });
  require_no_errors(again);
}

TEST_CASE("buffer collectives: a receive span of the wrong size fails on its rank and is named on the others", "[buffers]") {
  const auto errors = run_threads(3, [](accel::Communicator& comm) {
    std::vector<float> send(4), recv(comm.rank() == 2 ? 11 : 12);
    accel::all_gather(comm, std::span<const float>(send), std::span(recv));
  });
  REQUIRE_THAT(errors[2], accel_test::contains("all_gather: rank 2's receive span holds 11 elements but it must hold send × world "
                                               "size = 4 × 3 = 12"));
  for (int r : {0, 1})
    REQUIRE_THAT(errors[static_cast<std::size_t>(r)], accel_test::contains("rank 2 failed before all_gather #1"));
}

namespace {

// Two engines of one 2-rank world in this process (rank 1's segment created, its data step run or not).
struct EnginePair {
  std::string prefix = accel::detail::unique_shm_prefix();
  std::vector<accel::detail::ShmBufferEngine::Peer> peers{{prefix + ".r0", ::getpid(), accel::detail::pid_namespace_id()},
                                                          {prefix + ".r1", ::getpid(), accel::detail::pid_namespace_id()}};
  std::unique_ptr<accel::detail::ShmBufferEngine> make(int rank, std::chrono::milliseconds timeout) {
    auto e = std::make_unique<accel::detail::ShmBufferEngine>(rank, peers, 4096, timeout);
    e->prepare();
    return e;
  }
};

accel::BufferCall reduce_call(std::vector<float>& v) {
  accel::BufferCall c;
  c.kind = accel::BufferOp::all_reduce;
  c.send = c.recv = v.data();
  c.send_count = c.recv_count = v.size();
  return c;
}

}  // namespace

TEST_CASE("buffer collectives: a peer that never delivers is a timeout naming it, and the engine stays failed", "[buffers][cpu]") {
  EnginePair pair;
  auto r0 = pair.make(0, 200ms);
  auto r1 = pair.make(1, 20s);  // its segment exists, its data step runs only later
  std::vector<float> v(10'000, 1.0f);
  const std::string label = "all_reduce #1";
  REQUIRE_THROWS_AS(r0->run(reduce_call(v), label), accel::timeout_error);
  REQUIRE_THROWS_WITH(r0->run(reduce_call(v), label), accel_test::contains("failed mid-transfer"));
  // Rank 1, arriving late, finds that rank 0 gave up instead of waiting out its own timeout.
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(r1->run(reduce_call(v), label), accel_test::contains("rank 0 gave up during all_reduce #1"));
  REQUIRE(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("buffer collectives: a peer that died but is not reaped yet counts as gone", "[buffers][cpu]") {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  std::this_thread::sleep_for(100ms);  // it has exited: a zombie until waited for
  CHECK(accel::detail::process_gone(child));
  CHECK_FALSE(accel::detail::process_gone(::getpid()));
  ::waitpid(child, nullptr, 0);
  CHECK(accel::detail::process_gone(child));
}

TEST_CASE("buffer collectives: a peer whose process is gone is named at once", "[buffers][cpu]") {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);  // reaped: the pid no longer exists
  EnginePair pair;
  pair.peers[1].pid = child;
  auto r0 = pair.make(0, 20s);
  auto r1 = pair.make(1, 20s);
  std::vector<float> v(10'000, 1.0f);
  REQUIRE_THROWS_WITH(r0->run(reduce_call(v), "all_reduce #4"),
                      accel_test::contains("rank 1 (pid " + std::to_string(child) + ") exited or died during all_reduce #4"));
}

TEST_CASE("buffer collectives: ranks with different chunk sizes are refused at construction", "[buffers][cpu]") {
  Job job;
  std::vector<std::future<std::string>> fs;
  for (int r = 0; r < 2; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      accel::CpuCommOptions o;
      o.buffer_chunk_bytes = r == 0 ? 4096 : 8192;
      try {
        accel::CpuCommunicator comm(job.client(r, 2), r, 2, o);
        return std::string();
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    }));
  for (auto& f : fs)
    REQUIRE_THAT(f.get(), accel_test::contains("CpuCommOptions::buffer_chunk_bytes differs across ranks: rank 0 passes 4096, rank 1 passes "
                                               "8192; pass the same value on every rank"));
}
