// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// What the one-call load decides before it reads a weight, on a large headers-only folder (the
// DeepSeek-V3 FP8 folder of benchmarks/compare/plan_hub_names.py: 163 shards, 92k tensors):
// plan_auto_dispatch, then the loader's decisions (names, map names, the map in checkpoint names,
// the quantized tensors, plan_load, the quantized-together check). The executor that follows is
// left out: on a sparse folder it would read hundreds of GiB of zeros, and it runs the same LoadPlan
// either way. Built against a tree before LoadOptions::naming it times the loader's decisions as
// plan_and_load made them then (each step as that code called it), so two builds can be compared
// process by process.
//
// usage: plan_and_load_bench FOLDER [--runs N]   (one line: median ms of plan, loader, both; the load plan's fingerprint)
#include <accel/load/auto_dispatch.hpp>
#include <accel/plan/map_names.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if __has_include(<accel/load/pipeline_load.hpp>)
#define ACCEL_BENCH_PLAN_CARRIES_NAMING 1
#else
#define ACCEL_BENCH_PLAN_CARRIES_NAMING 0
#endif

using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// A fingerprint of a load plan (every tensor's name, dtypes, placement, storage and arena slot),
// to show that both builds decide the same load.
std::uint64_t fingerprint(const accel::LoadPlan& plan) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  for (const auto& t : plan.tensors) {
    mix(t.name.data(), t.name.size());
    const int v[] = {static_cast<int>(t.stored_dtype), static_cast<int>(t.dtype), t.placement.index,
                     static_cast<int>(t.placement.kind), static_cast<int>(t.storage)};
    mix(v, sizeof v);
    mix(&t.arena, sizeof t.arena);
    mix(&t.arena_offset, sizeof t.arena_offset);
    mix(&t.bytes, sizeof t.bytes);
  }
  return h;
}

// The loader's decisions; returns the load plan's fingerprint (so nothing is optimised away).
std::uint64_t loader_decisions(const accel::Checkpoint& ck, const accel::AutoDispatchPlan& planned) {
#if ACCEL_BENCH_PLAN_CARRIES_NAMING
  return fingerprint(accel::detail::decide_dispatch(ck, planned.plan.device_map, planned.load).plan);
#else
  // plan_and_load before the plan carried its names: every step as it was called there.
  const auto naming = accel::checkpoint_naming(ck, planned.load.config_file);
  const bool model_names = accel::detect_map_names(planned.plan.device_map, naming.names) == accel::MapNames::model;
  accel::LoadOptions opts = planned.load;
  if (naming.quantization) {
    for (auto& n : naming.quantization->stored_names(ck.tensor_names)) opts.stored_dtype_tensors.push_back(std::move(n));
    for (const auto& k : naming.quantization->config.keep_in_fp32)
      if (std::find(opts.keep_in_fp32.begin(), opts.keep_in_fp32.end(), k) == opts.keep_in_fp32.end()) opts.keep_in_fp32.push_back(k);
  }
  auto plan = accel::plan_load(ck, model_names ? accel::to_checkpoint_names(planned.plan.device_map, naming.names) : planned.plan.device_map,
                               opts, 0);
  if (naming.quantization) accel::detail::require_quantized_together(plan, *naming.quantization, ck);
  return fingerprint(plan);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: plan_and_load_bench FOLDER [--runs N]\n");
    return 2;
  }
  int runs = 7;
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
  const auto ck = accel::resolve_checkpoint(argv[1]);
  accel::AutoDispatchOptions o;
  o.max_memory = accel::parse_max_memory("cpu=0");  // everything on disk: views into the shards, nothing allocated
  o.load.devices = std::vector<accel::DeviceMemoryPtr>{};
  o.load.progress = false;
  o.load.offload_folder = "unused-offload";
  std::vector<double> plan_ms, load_ms, both_ms;
  std::uint64_t decided = 0;
  for (int r = 0; r < runs + 1; ++r) {  // the first run warms up
    const auto t0 = Clock::now();
    const auto planned = accel::plan_auto_dispatch(ck, o);
    const double p = ms_since(t0);
    const auto t1 = Clock::now();
    decided = loader_decisions(ck, planned);
    const double l = ms_since(t1);
    if (r == 0) continue;
    plan_ms.push_back(p);
    load_ms.push_back(l);
    both_ms.push_back(p + l);
  }
  std::printf("%s plan_auto_dispatch %.1f ms, loader decisions %.1f ms, both %.1f ms (median of %d; load plan %016llx)\n",
              ACCEL_BENCH_PLAN_CARRIES_NAMING ? "naming carried" : "naming recomputed", median(plan_ms), median(load_ms),
              median(both_ms), runs, static_cast<unsigned long long>(decided));
}
