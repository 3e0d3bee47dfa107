// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child program of tests/multiprocess/collectives_test.cpp: one rank of a job started by the test
// (or by accel launch). argv[1] picks the scenario; errors go to stderr as "rank R: <message>".
//   gather [L [MS]]  every rank completes its shard of 11 prompts; rank 0 prints them in input
//               order (each ending " (L)" when a label L is given, so a job's output shows whose it
//               is); with MS, the ranks meet and then hold MS milliseconds before gathering, so two
//               jobs started together are surely running at the same time
//   throw       rank 1's value fails to serialize
//   die [R]     rank R (default 1) dies (std::_Exit) while the others wait inside gather_object
//   main-only   gather_object called only on the main process
//   big         4 MiB per rank through gather_object (shared memory), checksummed
#include <accel/comm/collectives.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {
struct Completion {
  int prompt = 0;
  std::string text;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Completion, prompt, text)

struct Fragile {
  int rank = 0;
};
void to_json(nlohmann::json& j, const Fragile& f) {
  if (f.rank == 1) throw std::runtime_error("rank 1's result holds invalid data");
  j = f.rank;
}
void from_json(const nlohmann::json& j, Fragile& f) { f.rank = j.get<int>(); }
}  // namespace
template <>
struct accel::force_json_serialization<Fragile> : std::true_type {};

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "gather";
  int rank = -1;
  try {
    accel::DistributedState state;
    rank = state.process_index();
    if (mode == "gather") {
      std::vector<std::string> prompts;
      for (int i = 0; i < 11; ++i) prompts.push_back("prompt " + std::to_string(i));
      auto mine = state.split_between_processes(prompts, {.apply_padding = true});
      const std::string label = argc > 2 ? std::string(" (") + argv[2] + ")" : std::string();
      if (argc > 3) {
        accel::wait_for_everyone(state);
        std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[3])));
      }
      std::vector<Completion> out;
      for (std::size_t i = 0; i < mine.size(); ++i)
        out.push_back({static_cast<int>(mine.shard().first_index + i),
                       mine[static_cast<std::ptrdiff_t>(i)] + " by rank " + std::to_string(rank) + label});
      const auto all = accel::gather_object(state, out, mine.shard());
      accel::print(state, "backend ", accel::communicator(state).backend(), ", ", all.size(), " results");
      for (const auto& c : all) accel::print(state, c.prompt, ": ", c.text);
      accel::wait_for_everyone(state);
    } else if (mode == "throw") {
      accel::gather_object(state, Fragile{rank});
    } else if (mode == "die") {
      const int victim = argc > 2 ? std::atoi(argv[2]) : 1;
      accel::wait_for_everyone(state);
      if (rank == victim) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are inside gather_object by now
        std::_Exit(9);
      }
      accel::gather_object(state, rank);
    } else if (mode == "main-only") {
      accel::wait_for_everyone(state);
      if (state.is_main_process()) accel::gather_object(state, rank);
    } else if (mode == "all_reduce") {
      // 3 million floats (several shared-memory chunks) and an all_gather of int64, checked.
      std::vector<float> v(3'000'000, static_cast<float>(rank + 1));
      accel::all_reduce(state, std::span(v), accel::ReduceOp::sum);
      std::vector<std::int64_t> ids(3, rank), all(3 * static_cast<std::size_t>(state.num_processes()));
      accel::all_gather(state, std::span<const std::int64_t>(ids), std::span(all));
      accel::print(state, "sum ", v.front(), " ", v.back(), " ids ", all.front(), " ", all.back());
    } else if (mode == "die-reduce") {
      // Rank 1 dies while the others are (most likely) in the middle of moving a 256 MiB buffer.
      std::vector<float> v(64u << 20, 1.0f);
      accel::wait_for_everyone(state);
      if (rank == 1) {
        std::thread([&] { accel::all_reduce(state, std::span(v), accel::ReduceOp::sum); }).detach();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::_Exit(9);
      }
      accel::all_reduce(state, std::span(v), accel::ReduceOp::sum);
    } else if (mode == "big") {
      std::vector<std::uint32_t> mine(1u << 20, static_cast<std::uint32_t>(rank + 1));
      const auto all = accel::gather_object(state, mine);
      std::uint64_t sum = 0;
      for (const auto& v : all) for (auto x : v) sum += x;
      accel::print(state, "sum ", sum);
    }
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}
