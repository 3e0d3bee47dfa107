// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Planning time of infer_auto_device_map (sizes, tie groups, reserve, placement, cleaning: everything
// but reading the skeleton) for the skeletons benchmarks/gen_skeletons.py writes.
//
//   /usr/bin/python3 benchmarks/gen_skeletons.py build/skeletons
//   ACCEL_BENCH_SKELETONS=build/skeletons build/rel/benchmarks/planner_bench
#include <benchmark/benchmark.h>

#include <accel/plan/planner.hpp>
#include <accel/model/skeleton.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

struct Case {
  const char* file;
  const char* budgets;  // spill over four GPUs, cpu and disk, as the accelerate peer does
  const char* block;    // the no-split class
};

constexpr Case cases[] = {
    {"llama2_70b.json", "0=24GiB,1=24GiB,2=24GiB,3=24GiB,cpu=24GiB", "LlamaDecoderLayer"},
    {"layers_1000.json", "0=5GiB,1=5GiB,2=5GiB,3=5GiB,cpu=2GiB", "LlamaDecoderLayer"},
    {"moe_173k.json", "0=16GiB,1=16GiB,2=16GiB,3=16GiB,cpu=16GiB", "MoeDecoderLayer"},
};

void bench_plan(benchmark::State& state, const accel::ModuleTree* tree, accel::PlanOptions opts) {
  std::size_t entries = 0;
  for (auto _ : state) {
    auto plan = accel::plan_device_map(*tree, opts);
    entries = plan.device_map.size();
    benchmark::DoNotOptimize(plan);
  }
  state.counters["tensors"] = static_cast<double>(tree->tensors().size());
  state.counters["map_entries"] = static_cast<double>(entries);
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("ACCEL_BENCH_SKELETONS");
  const std::filesystem::path dir = env ? env : "build/skeletons";
  static std::vector<accel::ModuleTree> trees;
  trees.reserve(std::size(cases));
  for (const auto& c : cases) {
    const auto path = dir / c.file;
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr, "planner_bench: %s missing; run /usr/bin/python3 benchmarks/gen_skeletons.py %s\n",
                   path.string().c_str(), dir.string().c_str());
      return 1;
    }
    trees.push_back(accel::read_skeleton(path));
    accel::PlanOptions opts;
    opts.max_memory = accel::parse_max_memory(c.budgets);
    opts.no_split = {c.block};
    const std::string name = std::string("BM_plan/") + std::filesystem::path(c.file).stem().string();
    benchmark::RegisterBenchmark(name.c_str(), bench_plan, &trees.back(), opts)->Unit(benchmark::kMicrosecond);
    accel::PlanOptions balanced = opts;
    benchmark::RegisterBenchmark((name + "/balanced").c_str(),
                                 [](benchmark::State& st, const accel::ModuleTree* t, accel::PlanOptions o) {
                                   for (auto _ : st) benchmark::DoNotOptimize(accel::plan_device_map(*t, accel::DeviceMapMode::balanced, o));
                                 },
                                 &trees.back(), balanced)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
