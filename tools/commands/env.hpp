// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel env`: what this process sees — version, compiled features, driver, GPUs, CUDA_VISIBLE_DEVICES,
// launcher variables — the "check these first" list as one command.
#pragma once

#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <string_view>

#include <accel/comm/store.hpp>
#include <accel/runtime/version.hpp>
#include <accel/state.hpp>

#include "args.hpp"
#include "bandwidth.hpp"
#include "exit_codes.hpp"

#if ACCEL_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif
#if ACCEL_HAS_NCCL()
#include <nccl.h>
#endif

namespace accel_cli {

inline constexpr OptionSpec env_options[] = {
    {"measure-bandwidth", OptionKind::flag, "", "measure the host-to-GPU and disk read rates (under 2 s), cache them "
                                                "for accel plan, print them, and exit"},
    {"disk-dir", OptionKind::text, "DIR", "folder whose disk --measure-bandwidth reads (default: the current folder; "
                                          "give the offload folder)"},
};

inline constexpr const char* env_help = R"(usage: accel env [--measure-bandwidth [--disk-dir DIR]]

Prints what this process sees, to paste into a bug report:
  - accel's version and the features compiled in (CUDA runtime, NCCL, with versions)
  - the driver state and every visible GPU with its memory and UUID
  - CUDA_VISIBLE_DEVICES as the driver will read it, with every problem found
  - which launcher's variables are set (accel launch, torchrun, MPI, SLURM) and what they mean
  - the device this process would use, and the checks that would fail

With --measure-bandwidth it instead measures the rates accel plan estimates transfer times with:
host to GPU (cudaMemcpy from pinned memory to GPU 0; without CUDA or a GPU, a host memory copy
stands in, and says so) and disk read (a temporary file in --disk-dir, written, dropped from the
page cache, read back, deleted), and caches them in $XDG_CACHE_HOME/accel/bandwidth.json (else
~/.cache/accel/bandwidth.json), where accel plan finds them when no --bandwidth is given.

Exit status: 0, or 3 when the launcher variables are malformed or the cache cannot be written.)";

// `accel env --measure-bandwidth`: measure, print, cache.
inline int run_measure_bandwidth(const ParsedArgs& a) {
  const std::filesystem::path dir = a.value("disk-dir").value_or(".");
  const auto m = measure_bandwidths(default_bandwidth_probe(), dir);
  std::printf("host to GPU: %s/s (%s)\n", accel::text::format_bytes(m.rates.host_to_device).c_str(), m.host_source.c_str());
  std::printf("disk read:   %s/s (%s)\n", accel::text::format_bytes(m.rates.disk_read).c_str(), m.disk_source.c_str());
  const auto path = bandwidth_cache_path(accel::process_env());
  if (!path) throw accel::config_error("env: neither XDG_CACHE_HOME nor HOME is set; nowhere to cache the rates");
  std::error_code ec;
  std::filesystem::create_directories(path->parent_path(), ec);
  std::ofstream out(*path, std::ios::trunc);
  out << bandwidth_cache_json(m);
  if (!out) throw accel::config_error("env: cannot write the bandwidth cache '" + path->string() + "'; check the folder's permissions");
  std::printf("cached in %s (accel plan uses it when no --bandwidth is given)\n", path->string().c_str());
  return 0;
}

inline std::string gib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / double(1ull << 30));
  return buf;
}

inline int run_env(std::span<char*> args) {
  const auto a = parse_args(args, {env_options});
  if (a.help()) {
    std::fputs(format_help(env_help, env_options).c_str(), stdout);
    return 0;
  }
  if (a.has("measure-bandwidth")) return run_measure_bandwidth(a);
  if (a.has("disk-dir")) throw accel::usage_error("env: --disk-dir is for --measure-bandwidth; add it");
  std::printf("accel %s\n", accel::version_string);
#if ACCEL_HAS_CUDA()
  int runtime = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  std::printf("CUDA runtime: compiled in (%d.%d)\n", runtime / 1000, runtime % 1000 / 10);
#else
  std::printf("CUDA runtime: not compiled in (build with ACCEL_WITH_CUDA=ON to use GPUs)\n");
#endif
#if ACCEL_HAS_NCCL()
  int nccl = 0;
  (void)ncclGetVersion(&nccl);
  std::printf("NCCL: compiled in (%d.%d.%d)\n", nccl / 10000, nccl % 10000 / 100, nccl % 100);
#else
  std::printf("NCCL: not compiled in (GPU collectives fall back to the CPU transport)\n");
#endif
  const auto list = accel::default_device_query().list(true);
  std::printf("driver: %s\n", list.driver.empty() ? ("none (" + list.status + ")").c_str() : ("CUDA " + list.driver).c_str());
  const auto visible = accel::parse_visible_devices(accel::process_env()("CUDA_VISIBLE_DEVICES"));
  std::printf("visible GPUs: %zu%s\n", list.gpus.size(), list.gpus.empty() ? (" (" + list.status + ")").c_str() : "");
  for (const auto& g : list.gpus)
    std::printf("  cuda:%d  %s  %s total, %s free  %s  (physical GPU %s)\n", g.index, g.name.c_str(), gib(g.total_memory).c_str(),
                gib(g.free_memory).c_str(), g.uuid.c_str(), visible.physical(g.index).c_str());
  if (!visible.set) {
    std::printf("CUDA_VISIBLE_DEVICES: unset (every GPU is visible)\n");
  } else {
    std::string ids;
    for (const auto& id : visible.ids) ids += (ids.empty() ? "" : ",") + id;
    std::printf("CUDA_VISIBLE_DEVICES: '%s' -> effective [%s]\n", accel::process_env()("CUDA_VISIBLE_DEVICES")->c_str(), ids.c_str());
  }
  for (const auto& d : visible.diagnostics) std::printf("  warning: %s\n", d.c_str());
  try {
    // Describes the job without joining it: `accel env` is no rank of it.
    const accel::DistributedState state(accel::StateOptions{.make_current = false, .join_job = false});
    const auto& e = state.launch_env();
    std::printf("launcher: %s\n", accel::launcher_name(e.launcher));
    std::printf("  rank %d of %d, local rank %d of %d, machine %d of %d\n", e.rank, e.world_size, e.local_rank, e.local_world_size,
                e.group_rank, e.num_machines);
    std::printf("  rendezvous: %s:%d%s%s%s\n", e.master_addr.empty() ? "<unknown>" : e.master_addr.c_str(), e.master_port,
                e.master_port_derived ? " (port derived from the job id)" : "",
                e.store_address ? (", accel store " + *e.store_address).c_str() : "",
                e.job_token.empty() ? "" : ", job token set");
    if (e.world_size > 1) {
      // Where the collectives will meet, as connect_job_store decides it (torchrun's agent store
      // holds MASTER_PORT itself, so the job's store is one port up).
      try {
        const accel::StorePlan plan = accel::plan_job_store(e);
        std::printf("  store: %s, hosted by %s%s\n", accel::detail::host_port(plan.host, plan.port).c_str(),
                    e.store_address ? "accel launch" : "rank 0",
                    e.torchelastic_agent_store && !e.store_address ? " (MASTER_PORT+1: torchrun's agent store holds MASTER_PORT)" : "");
      } catch (const accel::config_error& err) {
        std::printf("  store: unknown (%s)\n", err.what());
      }
    }
    std::printf("  job id: %s\n", e.job_id.empty() ? "none" : e.job_id.c_str());
    if (!e.rendezvous_warning.empty()) std::printf("  warning: %s\n", e.rendezvous_warning.c_str());
    std::printf("  timeout: %.1f s (ACCEL_TIMEOUT_S), join timeout: %.1f s (ACCEL_JOIN_TIMEOUT_S)\n",
                static_cast<double>(e.timeout.count()) / 1000.0, static_cast<double>(e.join_timeout.count()) / 1000.0);
    for (const auto& d : e.diagnostics) std::printf("  note: %s\n", d.c_str());
    std::printf("this process: %s\n", state.to_string().c_str());
  } catch (const accel::config_error& err) {
    std::printf("launcher: invalid\n  error: %s\n", err.what());
    return exit_config;
  }
  return 0;
}

}  // namespace accel_cli
