// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file env.hpp
/// @brief LaunchEnv: what the launcher that started this process says about ranks, sizes and rendezvous.
///
/// Conventions are read in this order, the first present one wins: accel launch / torchrun
/// (RANK…), MPICH / Intel MPI (PMI_RANK…), Open MPI (OMPI_COMM_WORLD_*), MVAPICH2 (MV2_COMM_WORLD_*),
/// SLURM srun (SLURM_PROCID… inside a job step). No variables at all means one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Reads one environment variable; std::nullopt when unset. The seam tests replace.
using EnvSource = std::function<std::optional<std::string>(const std::string&)>;

/// @brief The process environment (getenv).
inline EnvSource process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

/// @brief An environment made of a fixed map (tests, or a child's planned environment).
inline EnvSource map_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

/// @brief Which launcher convention supplied the ranks.
enum class Launcher { none, accel, torchrun, mpich, openmpi, mvapich, slurm };

/// @brief Human name of a launcher convention ("torchrun", "Open MPI", …).
inline const char* launcher_name(Launcher l) noexcept {
  switch (l) {
    case Launcher::none: return "none (single process)";
    case Launcher::accel: return "accel launch";
    case Launcher::torchrun: return "torchrun";
    case Launcher::mpich: return "MPICH/Intel MPI";
    case Launcher::openmpi: return "Open MPI";
    case Launcher::mvapich: return "MVAPICH2";
    case Launcher::slurm: return "SLURM srun";
  }
  return "?";
}

/// @brief Ranks, sizes and rendezvous facts of this process.
struct LaunchEnv {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;    ///< machine index
  int num_machines = 1;
  std::string master_addr = "127.0.0.1";  ///< "" when several machines and nobody said where rank 0 is
  int master_port = 29500;
  std::optional<std::string> store_address;  ///< ACCEL_STORE ("host:port"), the store accel launch hosts
  std::string job_token;                     ///< ACCEL_JOB_TOKEN, "" if none
  std::chrono::milliseconds timeout{300'000};  ///< ACCEL_TIMEOUT_S (default 300 s)
  bool torchelastic_agent_store = false;       ///< TORCHELASTIC_USE_AGENT_STORE=True
  bool use_cpu = false;                        ///< ACCEL_USE_CPU is truthy
  std::vector<std::string> diagnostics;        ///< assumptions made, one sentence each
};

/// @brief Splits "host:port" or "[v6]:port" (brackets removed); nullopt unless the host is
///        non-empty and the port is 1-65535.
inline std::optional<std::pair<std::string, int>> split_host_port(std::string_view address) {
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const auto port = text::parse_integer<int>(address.substr(colon + 1));
  if (!port || *port < 1 || *port > 65535) return std::nullopt;
  std::string_view host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::pair<std::string, int>(host, *port);
}

namespace detail {

/// @brief Reads an integer variable; config_error naming it and its value when malformed.
inline std::optional<int> env_int(const EnvSource& env, const std::string& name, long long min_value = 0) {
  auto raw = env(name);
  if (!raw) return std::nullopt;
  const auto v = text::parse_integer<int>(text::trim(*raw));
  if (!v || *v < min_value)
    throw_error<config_error>(name, "='", *raw, "' is not ", min_value > 0 ? "a positive" : "a non-negative",
                              " integer; fix or unset ", name);
  return *v;
}

/// @brief accelerate's str_to_bool: y/yes/t/true/on/1 and n/no/f/false/off/0, any case.
inline std::optional<bool> env_bool(const EnvSource& env, const std::string& name) {
  auto raw = env(name);
  if (!raw) return std::nullopt;
  std::string v;
  for (char c : *raw) v += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (v == "y" || v == "yes" || v == "t" || v == "true" || v == "on" || v == "1") return true;
  if (v == "n" || v == "no" || v == "f" || v == "false" || v == "off" || v == "0" || v.empty()) return false;
  throw_error<config_error>(name, "='", *raw, "' is not a boolean; use 1/0, true/false, yes/no or on/off");
}

/// @brief First host of a SLURM hostlist: "node[01-04,07],gpu1" → "node01".
inline std::string slurm_first_host(std::string_view list) {
  const auto comma = list.find(',');
  const auto bracket = list.find('[');
  if (bracket == std::string_view::npos || (comma != std::string_view::npos && comma < bracket))
    return std::string(list.substr(0, comma));
  const auto end = list.find_first_of(",-]", bracket + 1);
  if (end == std::string_view::npos) throw_error<config_error>("SLURM node list '", list, "' has an unclosed '['");
  return std::string(list.substr(0, bracket)) + std::string(list.substr(bracket + 1, end - bracket - 1));
}

/// @brief Expands SLURM's compressed task counts: "2(x3),1" → {2, 2, 2, 1}.
inline std::vector<int> slurm_expand_counts(std::string_view text, const std::string& var) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto comma = text.find(',', pos);
    std::string_view item = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    pos = comma == std::string_view::npos ? text.size() : comma + 1;
    const auto paren = item.find("(x");
    const auto count = text::parse_integer<int>(text::trim(item.substr(0, paren)));
    std::optional<int> times = 1;
    if (paren != std::string_view::npos)
      times = item.back() == ')' ? text::parse_integer<int>(text::trim(item.substr(paren + 2, item.size() - paren - 3)))
                                 : std::nullopt;
    if (!count || !times || *count <= 0 || *times <= 0 || *times > 1'000'000)
      throw_error<config_error>(var, "='", text, "' is malformed at '", item, "' (expected forms like 4 or 2(x3))");
    out.insert(out.end(), static_cast<std::size_t>(*times), *count);
  }
  return out;
}

struct ConventionVars {
  Launcher launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

inline constexpr ConventionVars conventions[] = {
    {Launcher::torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::mpich, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {Launcher::openmpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::mvapich, "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

/// @brief Whether a convention is present. SLURM counts only inside an srun step: a bare sbatch
/// script (SLURM_JOB_ID without SLURM_STEP_ID) also has SLURM_PROCID=0 and SLURM_NTASKS=N, yet it
/// is one process, and reading it as rank 0 of N would hang its first collective.
inline bool convention_present(const EnvSource& env, const ConventionVars& c) {
  if (c.launcher == Launcher::slurm)
    return env(c.rank).has_value() && !(env("SLURM_JOB_ID") && !env("SLURM_STEP_ID") && !env("SLURM_STEPID"));
  return env(c.rank) || env(c.size) || env(c.local_rank) || env(c.local_size);
}

struct RawRanks {
  int rank, size;
  std::optional<int> local_rank, local_size;
};

inline RawRanks read_convention(const EnvSource& env, const ConventionVars& c) {
  auto rank = env_int(env, c.rank);
  const bool step_size = c.launcher == Launcher::slurm && env("SLURM_STEP_NUM_TASKS");
  auto size = env_int(env, step_size ? "SLURM_STEP_NUM_TASKS" : c.size, 1);
  if (!rank || !size) {
    const char* have = rank ? c.rank : c.size;
    const char* missing = rank ? c.size : c.rank;
    throw_error<config_error>(have, "=", *env(have), " is set but ", missing, " is not (", launcher_name(c.launcher),
                              " sets both); set ", missing, " or unset ", have);
  }
  RawRanks r{*rank, *size, env_int(env, c.local_rank), std::nullopt};
  if (c.launcher == Launcher::slurm) {
    const char* var = env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                      : env(c.local_size)              ? c.local_size
                                                       : "SLURM_TASKS_PER_NODE";
    if (auto per_node = env(var)) {
      const auto counts = slurm_expand_counts(*per_node, var);
      const int node = env_int(env, "SLURM_NODEID").value_or(0);
      // SLURM_NTASKS_PER_NODE is one number for every node; the compressed forms list each node.
      const std::size_t at = counts.size() == 1 ? 0 : static_cast<std::size_t>(node);
      if (at >= counts.size())
        throw_error<config_error>("SLURM_NODEID=", node, " is out of range for ", var, "='", *per_node, "' (",
                                  counts.size(), " nodes)");
      r.local_size = counts[at];
    }
  } else {
    r.local_size = env_int(env, c.local_size, 1);
  }
  return r;
}

}  // namespace detail

/// @brief Reads the launcher environment (pure: everything comes through `env`).
/// @throws config_error naming the variable and its value when a value is malformed, out of range,
///         or contradicts another convention with the same world size.
inline LaunchEnv read_launch_env(const EnvSource& env) {
  using namespace detail;
  LaunchEnv out;
  const ConventionVars* chosen = nullptr;
  for (const auto& c : conventions)
    if (convention_present(env, c)) {
      chosen = &c;
      break;
    }
  if (chosen) {
    const RawRanks r = read_convention(env, *chosen);
    out.launcher = chosen->launcher;
    if (out.launcher == Launcher::torchrun && env_bool(env, "ACCEL_LAUNCHED").value_or(false)) out.launcher = Launcher::accel;
    out.rank = r.rank;
    out.world_size = r.size;
    if (r.rank >= r.size)
      throw_error<config_error>(chosen->rank, "=", r.rank, " is not below ", chosen->size, "=", r.size,
                                "; ranks run from 0 to ", chosen->size, "-1");
    if (r.local_size) out.local_world_size = *r.local_size;
    else if (r.size > 1) {
      out.local_world_size = r.size;
      out.diagnostics.push_back(concat(chosen->local_size, " is unset: assuming all ", r.size, " processes run on this machine"));
    }
    if (r.local_rank) out.local_rank = *r.local_rank;
    else if (r.size > 1) {
      out.local_rank = out.local_world_size == r.size ? r.rank : r.rank % out.local_world_size;
      out.diagnostics.push_back(concat(chosen->local_rank, " is unset: assuming local rank ", out.local_rank));
    }
    if (out.local_world_size > out.world_size)
      throw_error<config_error>(chosen->local_size, "=", out.local_world_size, " exceeds ", chosen->size, "=", out.world_size,
                                "; a machine cannot hold more processes than the job");
    if (out.local_rank >= out.local_world_size)
      throw_error<config_error>(chosen->local_rank, "=", out.local_rank, " is not below ", chosen->local_size, "=",
                                out.local_world_size, "; local ranks run from 0 to ", chosen->local_size, "-1");
    out.num_machines = (out.world_size + out.local_world_size - 1) / out.local_world_size;
    if (out.launcher == Launcher::torchrun || out.launcher == Launcher::accel) {
      if (auto g = env_int(env, "GROUP_WORLD_SIZE", 1)) out.num_machines = *g;
      out.group_rank = env_int(env, "GROUP_RANK").value_or(out.rank / out.local_world_size);
    } else if (out.launcher == Launcher::slurm) {
      out.group_rank = env_int(env, "SLURM_NODEID").value_or(0);
      for (const char* var : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})
        if (auto n = env_int(env, var, 1)) {
          out.num_machines = *n;
          break;
        }
    } else {
      out.group_rank = out.rank / out.local_world_size;
    }
    if (out.group_rank >= out.num_machines)
      throw_error<config_error>("machine index ", out.group_rank, " is not below the number of machines ", out.num_machines,
                                " (from ", launcher_name(out.launcher), "'s variables); check GROUP_RANK/GROUP_WORLD_SIZE");
    // A lower-precedence convention with the same world size but another rank is a stale export,
    // not a nested launcher (srun starting torchrun gives different sizes, which is fine).
    for (const auto& c : conventions) {
      if (&c == chosen || !convention_present(env, c) || !env(c.rank) || !env(c.size)) continue;
      const RawRanks other = read_convention(env, c);
      if (other.size == out.world_size && other.rank != out.rank)
        throw_error<config_error>("conflicting launcher variables: ", chosen->rank, "=", out.rank, " (", launcher_name(chosen->launcher),
                                  ") but ", c.rank, "=", other.rank, " (", launcher_name(c.launcher), ") with the same world size ",
                                  out.world_size, "; unset the stale one");
    }
  }
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) throw_error<config_error>("MASTER_ADDR is set but empty; set it to rank 0's host name or address");
    out.master_addr = *addr;
  } else if (out.launcher == Launcher::slurm && env("SLURM_STEP_NODELIST")) {
    out.master_addr = slurm_first_host(*env("SLURM_STEP_NODELIST"));
  } else if (out.num_machines > 1) {
    out.master_addr.clear();
    out.diagnostics.push_back("MASTER_ADDR is unset on a multi-machine job: collectives need rank 0's address in MASTER_ADDR");
  }
  if (auto port = env_int(env, "MASTER_PORT", 1)) {
    if (*port > 65535) throw_error<config_error>("MASTER_PORT='", *env("MASTER_PORT"), "' is not a TCP port (1-65535)");
    out.master_port = *port;
  }
  if (auto store = env("ACCEL_STORE")) {
    if (!split_host_port(*store))
      throw_error<config_error>("ACCEL_STORE='", *store, "' is not host:port (it is set by accel launch; do not set it by hand)");
    out.store_address = *store;
  }
  out.job_token = env("ACCEL_JOB_TOKEN").value_or("");
  if (auto t = env("ACCEL_TIMEOUT_S")) {
    char* end = nullptr;
    const double s = std::strtod(t->c_str(), &end);
    if (t->empty() || end != t->c_str() + t->size() || !(s > 0) || s > 1e7)
      throw_error<config_error>("ACCEL_TIMEOUT_S='", *t, "' is not a positive number of seconds");
    out.timeout = std::chrono::milliseconds(static_cast<long long>(s * 1000.0 + 0.5));
  }
  out.torchelastic_agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  out.use_cpu = env_bool(env, "ACCEL_USE_CPU").value_or(false);
  return out;
}

ACCEL_NAMESPACE_END
