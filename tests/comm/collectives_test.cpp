// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Collectives over thread worlds (sizes 1, 2, 3, 4, 7): order, flattening, shards, broadcast,
// failure markers, sequence mismatches, timeouts; and the DistributedState entry points.
#include <accel/comm/collectives.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_env.hpp"
#include "support/processes.hpp"
#include "support/thread_world.hpp"

using namespace std::chrono_literals;
using accel::Communicator;
using accel_test::message;
using accel_test::run_world;
using accel_test::run_world_ok;

namespace demo {
struct Completion {
  int prompt = 0;
  std::string text;
  std::vector<float> logprobs;
  friend bool operator==(const Completion&, const Completion&) = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Completion, prompt, text, logprobs)

struct Fragile {
  int v = 0;
};
inline void to_json(nlohmann::json& j, const Fragile& f) {
  if (f.v == 2) throw std::runtime_error("value 2 refuses to serialize");
  j = f.v;
}
inline void from_json(const nlohmann::json& j, Fragile& f) { f.v = j.get<int>(); }

// The same shape as Completion, declared for the binary field encoding.
struct Scored {
  int prompt = 0;
  std::string text;
  std::vector<float> logprobs;
  friend bool operator==(const Scored&, const Scored&) = default;
};
ACCEL_DEFINE_FIELDS(Scored, prompt, text, logprobs)
}  // namespace demo
template <>
struct accel::force_json_serialization<demo::Fragile> : std::true_type {};

// This test program's operator new and delete (the plain and nothrow forms, which share delete): a
// thread may ask that allocations above a size fail, to reach the out-of-memory paths without
// exhausting the machine. (Not inlined: GCC would otherwise see free() meet operator new and warn of
// a mismatch.)
namespace {
thread_local std::size_t fail_allocations_above = SIZE_MAX;
}  // namespace
[[gnu::noinline]] void* operator new(std::size_t n) {
  if (n > fail_allocations_above) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return n > fail_allocations_above ? nullptr : std::malloc(n == 0 ? 1 : n);
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

TEST_CASE("gather_object returns every rank's value in rank order", "[collectives]") {
  for (int n : accel_test::world_sizes) {
    run_world_ok(n, [n](Communicator& comm) {
      const int r = comm.rank();
      // Uneven sizes: rank r sends r*100 characters; a struct with a vector; a raw scalar.
      auto texts = accel::gather_object(comm, std::string(static_cast<std::size_t>(r) * 100, static_cast<char>('a' + r)));
      ACCEL_TEST_ENSURE(texts.size() == static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) ACCEL_TEST_ENSURE(texts[static_cast<std::size_t>(i)] == std::string(static_cast<std::size_t>(i) * 100, static_cast<char>('a' + i)));
      auto structs = accel::gather_object(comm, demo::Completion{r, "r" + std::to_string(r), std::vector<float>(static_cast<std::size_t>(r), 0.5f)});
      for (int i = 0; i < n; ++i) ACCEL_TEST_ENSURE(structs[static_cast<std::size_t>(i)].prompt == i);
      ACCEL_TEST_ENSURE(accel::gather_object(comm, r * 10).back() == (n - 1) * 10);
      ACCEL_TEST_ENSURE(comm.collectives_entered() == 3);
    });
  }
}

TEST_CASE("gather_object_flat concatenates per-rank vectors in rank order, as accelerate does", "[collectives]") {
  for (int n : accel_test::world_sizes) {
    run_world_ok(n, [n](Communicator& comm) {
      // Rank r contributes r items (rank 0 none): {}, {1}, {2, 2}, ...
      std::vector<int> mine(static_cast<std::size_t>(comm.rank()), comm.rank());
      const auto all = accel::gather_object_flat(comm, mine);
      std::vector<int> expected;
      for (int i = 0; i < n; ++i) expected.insert(expected.end(), static_cast<std::size_t>(i), i);
      ACCEL_TEST_ENSURE(all == expected);
    });
  }
}

namespace {
// Rank r's records of each kind: uneven counts, some ranks empty.
template <class T, class Make>
std::vector<T> records_of(int rank, Make&& make) {
  std::vector<T> out;
  for (int i = 0; i < (rank * 2) % 3 + (rank == 4 ? 5 : 0); ++i) out.push_back(make(rank * 100 + i));
  return out;
}

// gather_object_flat and gather_object_flat_into (into storage holding other records first) give
// exactly the concatenation of gather_object's per-rank vectors.
template <class T, class Make>
void check_flat(Communicator& comm, Make&& make) {
  const auto mine = records_of<T>(comm.rank(), make);
  std::vector<T> concatenated;
  for (auto& part : accel::gather_object(comm, mine)) concatenated.insert(concatenated.end(), part.begin(), part.end());
  ACCEL_TEST_ENSURE(accel::gather_object_flat(comm, mine) == concatenated);
  std::vector<T> out(7, make(999));  // other records, which the call replaces
  accel::gather_object_flat_into(comm, mine, out);
  ACCEL_TEST_ENSURE(out == concatenated);
  out.clear();
  accel::gather_object_flat_into(comm, mine, out);
  ACCEL_TEST_ENSURE(out == concatenated);
}
}  // namespace

TEST_CASE("gather_object_flat decodes every format straight into one vector, empty ranks and uneven counts", "[collectives]") {
  for (int n : accel_test::world_sizes) {
    run_world_ok(n, [](Communicator& comm) {
      check_flat<int>(comm, [](int v) { return v; });                             // raw items
      check_flat<std::string>(comm, [](int v) { return std::string(static_cast<std::size_t>(v % 7 + 20), static_cast<char>('a' + v % 26)); });
      check_flat<demo::Scored>(comm, [](int v) {                                  // declared fields
        return demo::Scored{v, "text " + std::to_string(v), std::vector<float>(static_cast<std::size_t>(v % 4), 0.5f)};
      });
      check_flat<std::pair<int, double>>(comm, [](int v) { return std::pair<int, double>{v, v * 0.25}; });
      check_flat<demo::Completion>(comm, [](int v) {                              // CBOR
        return demo::Completion{v, std::to_string(v), std::vector<float>(static_cast<std::size_t>(v % 3), 1.5f)};
      });
    });
  }
}

TEST_CASE("gather_object with shards drops padding and restores the original order exactly", "[collectives]") {
  for (int n : accel_test::world_sizes)
    for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{9}, std::size_t{17}})
      for (bool pad : {false, true}) {
        std::vector<std::string> inputs;
        for (std::size_t i = 0; i < length; ++i) inputs.push_back("prompt " + std::to_string(i));
        run_world_ok(n, [&](Communicator& comm) {
          auto mine = accel::split_between_processes(inputs, static_cast<std::size_t>(comm.rank()), static_cast<std::size_t>(n),
                                                     {.apply_padding = pad});
          std::vector<std::string> results;
          for (const auto& p : mine) results.push_back(p + " done");
          const auto all = accel::gather_object(comm, results, mine.shard());
          ACCEL_TEST_ENSURE(all.size() == length);
          for (std::size_t i = 0; i < length; ++i) ACCEL_TEST_ENSURE(all[i] == inputs[i] + " done");
        });
      }
}

TEST_CASE("gather_object with shards restores the order of declared structs (binary field encoding)", "[collectives]") {
  for (int n : {2, 3, 7})
    run_world_ok(n, [n](Communicator& comm) {
      auto mine = accel::split_between_processes(std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, static_cast<std::size_t>(comm.rank()),
                                                 static_cast<std::size_t>(n), {.apply_padding = true});
      std::vector<demo::Scored> results;
      for (int p : mine) results.push_back({p, std::string(static_cast<std::size_t>(p), 'x'), std::vector<float>(static_cast<std::size_t>(p), 0.5f)});
      const auto all = accel::gather_object(comm, results, mine.shard());
      ACCEL_TEST_ENSURE(all.size() == 11);
      for (int i = 0; i < 11; ++i)
        ACCEL_TEST_ENSURE(all[static_cast<std::size_t>(i)] ==
                          (demo::Scored{i, std::string(static_cast<std::size_t>(i), 'x'), std::vector<float>(static_cast<std::size_t>(i), 0.5f)}));
    });
}

TEST_CASE("gather_object with shards accepts results without the padding items", "[collectives]") {
  run_world_ok(4, [](Communicator& comm) {
    const auto shard = accel::shard_for(9, static_cast<std::size_t>(comm.rank()), 4, {.apply_padding = true});
    std::vector<int> results;
    for (std::size_t i = 0; i < shard.real_count; ++i) results.push_back(static_cast<int>(shard.first_index + i));
    const auto all = accel::gather_object(comm, results, shard);
    ACCEL_TEST_ENSURE(all == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  });
}

TEST_CASE("gather_object with shards rejects results that do not match the shard on every rank", "[collectives]") {
  const auto errors = run_world(3, [](Communicator& comm) {
    const auto shard = accel::shard_for(6, static_cast<std::size_t>(comm.rank()), 3);
    std::vector<int> results(comm.rank() == 1 ? 5 : 2, 0);
    accel::gather_object(comm, results, shard);
  });
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[1]), accel::usage_error);
  REQUIRE(message(errors[1]).find("rank 1 passed 5 results for a shard of 2 items") != std::string::npos);
  for (int r : {0, 2}) {
    REQUIRE_THROWS_AS(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), accel::comm_error);
    REQUIRE(message(errors[static_cast<std::size_t>(r)]).find("rank 1 failed before gather_object #1") != std::string::npos);
  }
}

TEST_CASE("gather_object with shards of different inputs is a usage error on every rank", "[collectives]") {
  const auto errors = run_world(2, [](Communicator& comm) {
    const auto shard = accel::shard_for(comm.rank() == 0 ? 4 : 6, static_cast<std::size_t>(comm.rank()), 2);
    accel::gather_object(comm, std::vector<int>(shard.real_count), shard);
  });
  for (const auto& e : errors) {
    REQUIRE_THROWS_AS(std::rethrow_exception(e), accel::usage_error);
    REQUIRE(message(e).find("rank 1 split an input of 6 items but rank 0 one of 4") != std::string::npos);
  }
}

TEST_CASE("broadcast_object delivers the root's value to every rank", "[collectives]") {
  for (int n : accel_test::world_sizes)
    for (int root = 0; root < n; root += 3)
      run_world_ok(n, [root](Communicator& comm) {
        const demo::Completion mine{comm.rank(), "from " + std::to_string(comm.rank()), {1.f}};
        const auto got = accel::broadcast_object(comm, mine, root);
        ACCEL_TEST_ENSURE(got.prompt == root);
        ACCEL_TEST_ENSURE(got.text == "from " + std::to_string(root));
      });
  const auto errors = run_world(2, [](Communicator& comm) { accel::broadcast_object(comm, 1, 2); });
  ACCEL_TEST_ENSURE(message(errors[0]).find("broadcast: root 2 is not a rank of this 2-process job") != std::string::npos);
}

TEST_CASE("a rank whose value fails to serialize makes every rank throw, naming it", "[collectives]") {
  for (int n : {3, 4, 7}) {
    const auto errors = run_world(n, [](Communicator& comm) { accel::gather_object(comm, demo::Fragile{comm.rank()}); });
    // Rank 2 rethrows its own error; every other rank gets the same comm_error naming rank 2.
    REQUIRE_THROWS_AS(std::rethrow_exception(errors[2]), accel::serialization_error);
    ACCEL_TEST_ENSURE(message(errors[2]) == "[accel.serialization] cannot encode a demo::Fragile on rank 2: value 2 refuses to serialize");
    for (int r = 0; r < n; ++r) {
      if (r == 2) continue;
      REQUIRE_THROWS_AS(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), accel::comm_error);
      ACCEL_TEST_ENSURE(message(errors[static_cast<std::size_t>(r)]) ==
              "[accel.comm] rank 2 failed before gather_object #1 and joined it with a failure marker, so no result can be "
              "returned (rank 2: [accel.serialization] cannot encode a demo::Fragile on rank 2: value 2 refuses to serialize)");
    }
  }
}

TEST_CASE("a rank that runs out of memory encoding its value fails every rank with an error naming it, the collective and the size",
          "[collectives]") {
  // Rank 1's 2 MiB string cannot be encoded where allocations above 1 MiB fail: in broadcast_object
  // (rank 1 the root), gather_object, and the shard gather.
  const std::vector<std::string> big{std::string(2u << 20, 'x')};
  for (const char* op : {"broadcast_object", "gather_object", "shard gather"}) {
    INFO(op);
    const std::string what = std::strcmp(op, "broadcast_object") == 0 ? "broadcast_object" : "gather_object";
    const auto errors = run_world(3, [&](Communicator& comm) {
      const std::vector<std::string> mine = comm.rank() == 1 ? big : std::vector<std::string>{"small"};
      if (comm.rank() == 1) fail_allocations_above = 1u << 20;
      struct Reset {
        ~Reset() { fail_allocations_above = SIZE_MAX; }
      } reset;
      if (what == "broadcast_object") accel::broadcast_object(comm, mine, 1);
      else if (std::strcmp(op, "gather_object") == 0) accel::gather_object(comm, mine);
      else {
        const std::vector<int> input{0, 1, 2};
        accel::gather_object(comm, mine, accel::split_between_processes(input, static_cast<std::size_t>(comm.rank()), 3).shard());
      }
    });
    REQUIRE_THROWS_AS(std::rethrow_exception(errors[1]), accel::serialization_error);
    CHECK_THAT(message(errors[1]), accel_test::contains("rank 1 ran out of memory encoding its std::vector<"));
    CHECK_THAT(message(errors[1]), accel_test::contains(" for " + what + " ("));
    CHECK_THAT(message(errors[1]), accel_test::contains(" encoded so far); send less per call"));
    for (int r : {0, 2}) {
      REQUIRE_THROWS_AS(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), accel::comm_error);
      CHECK_THAT(message(errors[static_cast<std::size_t>(r)]), accel_test::contains("rank 1 failed before " + what));
      CHECK_THAT(message(errors[static_cast<std::size_t>(r)]), accel_test::contains("rank 1 ran out of memory encoding its"));
    }
  }
}

TEST_CASE("values that decode as another type report the sending rank on every rank", "[collectives]") {
  const auto errors = run_world(2, [](Communicator& comm) {
    if (comm.rank() == 0) accel::gather_object(comm, std::string("text"));
    else accel::gather_object(comm, 42);
  });
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[0]), accel::serialization_error);
  REQUIRE(message(errors[0]).find("value from rank 1 has format 1") != std::string::npos);
  REQUIRE(message(errors[1]).find("value from rank 0 has format 2") != std::string::npos);
}

TEST_CASE("ranks gathering plain data of different types of one size fail on every rank, naming both", "[collectives]") {
  const auto errors = run_world(2, [](Communicator& comm) {
    if (comm.rank() == 0) accel::gather_object(comm, std::vector<std::int64_t>{1, 2, 3});
    else accel::gather_object(comm, std::vector<double>{1.0, 2.0, 3.0});
  });
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[0]), accel::serialization_error);
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[1]), accel::serialization_error);
  CHECK(message(errors[0]).find("value from rank 1 holds 8-byte floating-point items but std::vector<long") != std::string::npos);
  CHECK(message(errors[1]).find("value from rank 0 holds 8-byte signed-integer items but std::vector<double") != std::string::npos);
}

TEST_CASE("different collectives on different ranks are reported as a mismatch, not a hang", "[collectives]") {
  const auto errors = run_world(3, [](Communicator& comm) {
    if (comm.rank() == 0) accel::gather_object(comm, 1);
    else accel::wait_for_everyone(comm);
  });
  for (const auto& e : errors) {
    REQUIRE_THROWS_AS(std::rethrow_exception(e), accel::comm_error);
    REQUIRE(message(e).find("collective mismatch at ") != std::string::npos);
    REQUIRE(message(e).find("rank 0 called gather_object #1, rank 1 called wait_for_everyone #1, rank 2 called wait_for_everyone #1") !=
            std::string::npos);
    REQUIRE(message(e).find("inside if (state.is_main_process()) is the usual cause") != std::string::npos);
  }
}

TEST_CASE("a collective called on only the main rank fails when the others finish, not after the timeout", "[collectives]") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_world(
      3, [](Communicator& comm) {
        if (comm.rank() == 0) accel::gather_object(comm, 1);  // the accelerate footgun
      },
      60s);
  REQUIRE(std::chrono::steady_clock::now() - t0 < 30s);
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[0]), accel::comm_error);
  REQUIRE(message(errors[0]).find("returned without joining gather_object #1") != std::string::npos);
  REQUIRE_FALSE(errors[1]);
}

TEST_CASE("a rank that is late past the timeout gives a timeout naming it", "[collectives]") {
  const auto errors = run_world(
      3, [](Communicator& comm) {
        if (comm.rank() == 2) std::this_thread::sleep_for(600ms);
        else accel::wait_for_everyone(comm);
      },
      100ms);
  REQUIRE_THROWS_AS(std::rethrow_exception(errors[0]), accel::timeout_error);
  REQUIRE(message(errors[0]).find("timed out in wait_for_everyone #1: ranks 2 have not arrived") != std::string::npos);
}

TEST_CASE("main_process_first runs the body on rank 0 before every other rank", "[collectives]") {
  for (int n : accel_test::world_sizes) {
    std::atomic<int> order{0};
    std::vector<int> when(static_cast<std::size_t>(n), -1);
    run_world_ok(n, [&](Communicator& comm) {
      const int got = accel::main_process_first(comm, [&] {
        when[static_cast<std::size_t>(comm.rank())] = order++;
        return comm.rank() + 100;
      });
      REQUIRE(got == comm.rank() + 100);
    });
    REQUIRE(when[0] == 0);
    for (int r = 1; r < n; ++r) REQUIRE(when[static_cast<std::size_t>(r)] > 0);
  }
}

TEST_CASE("main_process_first: a body that throws on rank 0 stops the others with an error naming rank 0", "[collectives]") {
  std::atomic<int> ran{0};
  const auto errors = run_world(3, [&](Communicator& comm) {
    accel::main_process_first(comm, [&] {
      ++ran;
      if (comm.rank() == 0) throw std::runtime_error("download failed");
    });
  });
  REQUIRE(ran == 1);
  REQUIRE(message(errors[0]) == "download failed");
  REQUIRE(message(errors[1]).find("rank 0 failed before main_process_first #1") != std::string::npos);
  REQUIRE(message(errors[2]).find("(rank 0: download failed)") != std::string::npos);
}

TEST_CASE("choose_backend: explicit request, then ACCEL_COMM_BACKEND, then the device", "[collectives]") {
  using accel::CommBackend;
  REQUIRE(accel::choose_backend(CommBackend::automatic, std::nullopt, 1, true) == CommBackend::solo);
  REQUIRE(accel::choose_backend(CommBackend::automatic, std::nullopt, 2, false) == CommBackend::cpu);
  REQUIRE(accel::choose_backend(CommBackend::automatic, std::nullopt, 2, true) == (accel::nccl_enabled ? CommBackend::nccl : CommBackend::cpu));
  REQUIRE(accel::choose_backend(CommBackend::automatic, std::string("cpu"), 2, true) == CommBackend::cpu);
  REQUIRE(accel::choose_backend(CommBackend::cpu, std::string("nccl"), 2, true) == CommBackend::cpu);
  REQUIRE_THROWS_WITH(accel::choose_backend(CommBackend::automatic, std::string("gloo"), 2, true),
                      accel_test::contains("ACCEL_COMM_BACKEND='gloo' is not a backend; use cpu or nccl"));
  if (!accel::nccl_enabled)
    REQUIRE_THROWS_AS(accel::choose_backend(CommBackend::nccl, std::nullopt, 2, true), accel::unavailable_error);
}

TEST_CASE("a one-process DistributedState gathers and broadcasts without any store", "[collectives]") {
  accel::DistributedState state(accel::map_env({}), accel::cpu_only_device_query());
  REQUIRE(accel::gather_object(state, 5) == std::vector<int>{5});
  REQUIRE(state.communicator()->backend() == "solo");
  REQUIRE(accel::broadcast_object(state, std::string("x")) == "x");
  accel::wait_for_everyone(state);
  REQUIRE(accel::main_process_first(state, [] { return 3; }) == 3);
  REQUIRE(accel::on_main_process(state, [] { return 4; }) == std::optional<int>(4));
}

TEST_CASE("DistributedState collectives create the CPU communicator from the launcher environment", "[collectives]") {
  const int port = accel_test::free_port();
  const int n = 3;
  std::vector<std::future<std::vector<std::string>>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [r, port] {
      auto vars = accel_test::with(accel_test::torchrun_vars(r, n, n), {{"MASTER_PORT", std::to_string(port)}, {"ACCEL_TIMEOUT_S", "20"}});
      accel::DistributedState state(accel::map_env(vars), accel::cpu_only_device_query());
      const std::vector<std::string> prompts = {"a", "b", "c", "d", "e"};
      auto mine = state.split_between_processes(prompts, {.apply_padding = true});
      std::vector<std::string> out(mine.begin(), mine.end());
      auto all = accel::gather_object(state, out, mine.shard());
      ACCEL_TEST_ENSURE(state.communicator()->backend() == "cpu");
      ACCEL_TEST_ENSURE(accel::broadcast_object(state, std::string("root says hi"), 0) == "root says hi");
      accel::wait_for_everyone(state);
      return all;
    }));
  for (auto& f : ranks) REQUIRE(f.get() == std::vector<std::string>{"a", "b", "c", "d", "e"});
}

// ---- Groups: split() and grid_groups() ----

namespace {
// Every member's job rank, gathered over `group` (so the group's order shows).
std::vector<int> job_ranks_of(Communicator& group, int job_rank) { return accel::gather_object(group, job_rank); }
}  // namespace

TEST_CASE("split orders each group by key then by rank and gives no_group ranks null", "[collectives][groups]") {
  // Colors 0 1 0 1 0 and rank 5 in no group; keys 5 1 5 0 2: group 0 is ranks 4, 0, 2 (0 and 2 tie
  // on key 5 and keep their order), group 1 is ranks 3, 1.
  const std::vector<int> colors = {0, 1, 0, 1, 0, accel::no_group}, keys = {5, 1, 5, 0, 2, 9};
  run_world_ok(6, [&](Communicator& world) {
    const int r = world.rank();
    const auto group = accel::split(world, colors[static_cast<std::size_t>(r)], keys[static_cast<std::size_t>(r)]);
    if (r == 5) {
      ACCEL_TEST_ENSURE(group == nullptr);
    } else {
      const std::vector<int> expected = colors[static_cast<std::size_t>(r)] == 0 ? std::vector<int>{4, 0, 2} : std::vector<int>{3, 1};
      ACCEL_TEST_ENSURE(group != nullptr && group->is_group() && !world.is_group());
      ACCEL_TEST_ENSURE(group->size() == static_cast<int>(expected.size()));
      ACCEL_TEST_ENSURE(expected[static_cast<std::size_t>(group->rank())] == r);
      ACCEL_TEST_ENSURE(job_ranks_of(*group, r) == expected);
      for (int i = 0; i < group->size(); ++i) ACCEL_TEST_ENSURE(group->job_rank(i) == expected[static_cast<std::size_t>(i)]);
      std::vector<int> sum = {r, 1};
      accel::all_reduce<int>(*group, sum, accel::ReduceOp::sum);
      ACCEL_TEST_ENSURE(sum == std::vector<int>{colors[static_cast<std::size_t>(r)] == 0 ? 6 : 4, group->size()});
      // A group of a group: its job ranks are the job's, not the parent group's.
      const auto sub = accel::split(*group, group->rank() == 0 ? accel::no_group : 0, -group->rank());
      if (group->rank() != 0) {
        std::vector<int> rest(expected.begin() + 1, expected.end());
        std::reverse(rest.begin(), rest.end());
        ACCEL_TEST_ENSURE(job_ranks_of(*sub, r) == rest);
        ACCEL_TEST_ENSURE(sub->job_rank(0) == rest.front());
      }
    }
    ACCEL_TEST_ENSURE(accel::gather_object(world, r).size() == 6);  // the world's rounds are unaffected
  });
}

TEST_CASE("grid_groups gives each rank its stage group and its replica group", "[collectives][groups]") {
  for (const auto& [replicas, stages] : std::vector<std::pair<int, int>>{{2, 2}, {1, 3}, {3, 2}}) {
    INFO(replicas << " x " << stages);
    run_world_ok(replicas * stages, [replicas = replicas, stages = stages](Communicator& world) {
      const int r = world.rank();
      const auto g = accel::grid_groups(world, replicas, stages);
      ACCEL_TEST_ENSURE(g.replica == r / stages && g.stage == r % stages && g.replicas == replicas && g.stages == stages);
      ACCEL_TEST_ENSURE(g.stage_group->size() == stages && g.stage_group->rank() == g.stage);
      ACCEL_TEST_ENSURE(g.replica_group->size() == replicas && g.replica_group->rank() == g.replica);
      for (int round = 0; round < 3; ++round) {  // interleaved: stage group, replica group, world
        std::vector<int> stage_members, replica_members;
        for (int s = 0; s < stages; ++s) stage_members.push_back(g.replica * stages + s);
        for (int p = 0; p < replicas; ++p) replica_members.push_back(p * stages + g.stage);
        ACCEL_TEST_ENSURE(job_ranks_of(*g.stage_group, r) == stage_members);
        ACCEL_TEST_ENSURE(job_ranks_of(*g.replica_group, r) == replica_members);
        ACCEL_TEST_ENSURE(job_ranks_of(world, r).size() == static_cast<std::size_t>(replicas * stages));
      }
    });
  }
}

TEST_CASE("grid_groups refuses a grid that is not the world's size or differs across ranks", "[collectives][groups]") {
  auto errors = run_world(4, [](Communicator& world) { accel::grid_groups(world, 3, 2); });
  for (const auto& e : errors) {
    REQUIRE(e);
    CHECK_THROWS_AS(std::rethrow_exception(e), accel::usage_error);
    CHECK_THAT(message(e), accel_test::contains("grid_groups: 3 replicas x 2 stages make 6 ranks, but the communicator has 4"));
  }
  errors = run_world(4, [](Communicator& world) { accel::grid_groups(world, world.rank() == 3 ? 1 : 2, world.rank() == 3 ? 4 : 2); });
  for (const auto& e : errors) {
    REQUIRE(e);
    CHECK_THROWS_AS(std::rethrow_exception(e), accel::usage_error);
    CHECK_THAT(message(e), accel_test::contains("the ranks pass different grids (replicas x stages): ranks 0, 1, 2 pass 2 x 2, rank 3 "
                                                "passes 1 x 4"));
  }
  errors = run_world(3, [](Communicator& world) { accel::grid_groups(world, 0, 3); });
  for (const auto& e : errors) CHECK_THAT(message(e), accel_test::contains("0 replicas x 3 stages; both must be at least 1"));
}

TEST_CASE("split with a bad color or beside another collective fails on every rank", "[collectives][groups]") {
  auto errors = run_world(3, [](Communicator& world) { accel::split(world, world.rank() == 1 ? -5 : 0, 0); });
  CHECK_THROWS_AS(std::rethrow_exception(errors[1]), accel::usage_error);
  CHECK_THAT(message(errors[1]), accel_test::contains("split: color -5 is negative; pass a color of 0 or more, or accel::no_group"));
  for (std::size_t r : {0u, 2u}) CHECK_THAT(message(errors[r]), accel_test::contains("rank 1 failed before split #1"));
  errors = run_world(2, [](Communicator& world) {
    if (world.rank() == 0) accel::split(world, 0, 0);
    else accel::gather_object(world, 1);
  });
  for (const auto& e : errors) CHECK_THAT(message(e), accel_test::contains("collective mismatch at "));
  for (const auto& e : errors) CHECK_THAT(message(e), accel_test::contains("rank 0 called split #1, rank 1 called gather_object #1"));
}

TEST_CASE("a group member that leaves is named by group rank and job rank to the rest of its group", "[collectives][groups]") {
  // Groups {0, 2} and {1, 3}: job rank 3 leaves while job rank 1 waits for it; group {0, 2} goes on.
  const auto errors = run_world(4, [](Communicator& world) {
    const auto group = accel::split(world, world.rank() % 2, world.rank());
    if (world.rank() == 3) return;
    const auto all = accel::gather_object(*group, world.rank());
    ACCEL_TEST_ENSURE(all.size() == 2);
  });
  REQUIRE(errors[0] == nullptr);
  REQUIRE(errors[2] == nullptr);
  REQUIRE(errors[3] == nullptr);
  CHECK_THAT(message(errors[1]), accel_test::contains("group rank 1 (job rank 3) returned without joining gather_object #1"));
}

TEST_CASE("a failure marker inside a group names the group rank and the job rank", "[collectives][groups]") {
  const auto errors = run_world(4, [](Communicator& world) {
    const auto group = accel::split(world, world.rank() < 2 ? 0 : 1, -world.rank());  // {1, 0} and {3, 2}
    accel::gather_object(*group, demo::Fragile{world.rank() == 3 ? 2 : 0});
  });
  CHECK_THAT(message(errors[3]), accel_test::contains("value 2 refuses to serialize"));
  CHECK_THAT(message(errors[2]), accel_test::contains("group rank 0 (job rank 3) failed before gather_object #1"));
  CHECK(errors[0] == nullptr);
  CHECK(errors[1] == nullptr);
}

TEST_CASE("a one-process communicator splits into a group of one", "[collectives][groups]") {
  accel::SoloCommunicator solo;
  CHECK(accel::split(solo, accel::no_group, 0) == nullptr);
  const auto g = accel::split(solo, 4, 7);
  REQUIRE(g);
  CHECK(g->size() == 1);
  CHECK(g->rank_name(0) == "group rank 0 (job rank 0)");
  CHECK(accel::gather_object(*g, 5) == std::vector<int>{5});
  const auto grid = accel::grid_groups(solo, 1, 1);
  CHECK(accel::gather_object(*grid.stage_group, 1) == std::vector<int>{1});
}
