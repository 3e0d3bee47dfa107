// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file env.hpp
/// @brief LaunchEnv: what the launcher that started this process says about ranks, sizes and rendezvous.
///
/// Conventions are read in this order, the first present one wins: accel launch / torchrun
/// (RANK…), MPICH / Intel MPI (PMI_RANK…), Open MPI (OMPI_COMM_WORLD_*), MVAPICH2 (MV2_COMM_WORLD_*),
/// SLURM srun (SLURM_PROCID… inside a job step). No variables at all means one process.
///
/// Job identity: the convention that gave the ranks also names the job (SLURM job and step, Open
/// MPI's job id, Hydra's proxy, torchrun's run id, accel launch's token). The store's token and,
/// without MASTER_PORT, its port derive from that name, so two jobs on one machine never meet.
#pragma once

#include <algorithm>
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
#include <accel/runtime/detail/pmi.hpp>
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

/// @brief Questions for the system that no variable answers; an empty member is never asked.
struct LauncherQuery {
  /// "<host>/<pid>" of the process serving PMI_FD (MPICH's Hydra: the job's proxy on this machine).
  std::function<std::optional<std::string>(int fd)> pmi_fd_peer;
};

/// @brief The real answers (SO_PEERCRED on PMI_FD; nothing is ever written to it).
inline LauncherQuery process_launcher_query() { return {[](int fd) { return detail::unix_socket_peer(fd); }}; }

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

/// @brief How long the ranks of a job have to join its store when ACCEL_JOIN_TIMEOUT_S is unset.
inline constexpr std::chrono::milliseconds default_join_timeout{60'000};

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
  int master_port = 29500;                ///< MASTER_PORT, else job_port(job_id), else 29500
  /// master_port was derived from job_id (MASTER_PORT unset): the store may be at any of the
  /// job's job_port_count ports, master_port being the first
  bool master_port_derived = false;
  std::optional<std::string> store_address;  ///< ACCEL_STORE ("host:port"), the store accel launch hosts
  /// The launcher's own name for this job, the same on every rank: "slurm:<job>.<step>",
  /// "pmi:<PMI_JOBID>", "openmpi:<job id>", "mpich:<host>/<proxy pid>", "torchrun:<run id>",
  /// "accel:<token fingerprint>", "token:<fingerprint>" (ACCEL_JOB_TOKEN alone); "" when unknown.
  std::string job_id;
  /// What the store's handshake compares: ACCEL_JOB_TOKEN under accel launch; otherwise job_id,
  /// Open MPI's per-job key and ACCEL_JOB_TOKEN (those present, joined by '/'); "" if none.
  std::string job_token;
  /// One sentence when this job's store address is shared by every job without an identity (no
  /// job_id, no MASTER_PORT, no ACCEL_STORE, several processes) and how to fix it; else "".
  std::string rendezvous_warning;
  std::chrono::milliseconds timeout{300'000};  ///< ACCEL_TIMEOUT_S (default 300 s): how long a live rank may be late
  /// ACCEL_JOIN_TIMEOUT_S (default 60 s): every rank must join the job's store within this long of
  /// the first one (a DistributedState joins when created), or the others' collectives fail naming it.
  std::chrono::milliseconds join_timeout{default_join_timeout};
  bool torchelastic_agent_store = false;       ///< TORCHELASTIC_USE_AGENT_STORE=True
  bool use_cpu = false;                        ///< ACCEL_USE_CPU is truthy
  std::vector<std::string> diagnostics;        ///< assumptions made, one sentence each
};

/// @brief Store ports derived from a job id lie in [job_port_first, job_port_last]: from torch's
///        default 29500 up to the top of Linux's default ephemeral range.
inline constexpr int job_port_first = 29500;
inline constexpr int job_port_last = 60999;

namespace detail {
using text::mix64;
/// @brief FNV-1a over the bytes, then mix64.
[[nodiscard]] constexpr std::uint64_t mix_hash(std::string_view s) noexcept { return mix64(text::fnv1a(s)); }
}  // namespace detail

/// @brief How many store ports are derived from one job id. Rank 0 hosts the store at the first
///        of them it can bind (one may be held by another job, or by some connection's ephemeral
///        port, since the range overlaps Linux's); the other ranks look for it at each in turn.
inline constexpr int job_port_count = 8;

/// @brief The `index`-th store port of the job named `job_id` (0 <= index < job_port_count): the
///        same on every rank; two jobs share their first port only by a 1 in 31500 chance, and
///        then each still finds its own store at another of its ports.
[[nodiscard]] constexpr int job_port(std::string_view job_id, int index = 0) noexcept {
  std::uint64_t h = detail::mix_hash(job_id);
  if (index > 0) h = detail::mix64(h + static_cast<std::uint64_t>(index) * 0x9e3779b97f4a7c15ull);
  return job_port_first + static_cast<int>(h % static_cast<std::uint64_t>(job_port_last - job_port_first + 1));
}

/// @brief `<kind>:<8 hex digits>`, the job id of a job known by a secret token: only a
///        fingerprint of the token shows, so messages and logs never reveal it.
[[nodiscard]] inline std::string token_job_id(std::string_view token, std::string_view kind = "accel") {
  static constexpr char digits[] = "0123456789abcdef";
  const std::uint64_t h = detail::mix_hash(token);
  std::string out(kind);
  out += ':';
  for (int shift = 60; shift >= 32; shift -= 4) out += digits[(h >> shift) & 0xf];
  return out;
}

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

/// @brief Reads a positive number of seconds (fractions allowed); config_error naming the variable when malformed.
inline std::optional<std::chrono::milliseconds> env_seconds(const EnvSource& env, const std::string& name) {
  auto t = env(name);
  if (!t) return std::nullopt;
  char* end = nullptr;
  const double s = std::strtod(t->c_str(), &end);
  if (t->empty() || end != t->c_str() + t->size() || !(s > 0) || s > 1e7)
    throw_error<config_error>(name, "='", *t, "' is not a positive number of seconds");
  return std::chrono::milliseconds(static_cast<long long>(s * 1000.0 + 0.5));
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

/// @brief One item of a SLURM host list split into literal text and bracket groups: "a[1-2]-b[07]"
/// → pieces {"a", "-b"} around groups {"1-2", "07"} (pieces.size() == groups.size() + 1).
struct SlurmHostPattern {
  std::vector<std::string> pieces;
  std::vector<std::string> groups;
};

/// @brief Splits a SLURM host list ("node[01-03,7],gpu1") into its items at the commas outside
/// brackets, each item into literal pieces and bracket groups.
/// @throws config_error naming the list when it is empty, a bracket is unbalanced or a group empty
inline std::vector<SlurmHostPattern> slurm_host_patterns(std::string_view list) {
  const auto bad = [&](const char* why) { throw_error<config_error>("SLURM node list '", list, "' ", why); };
  std::vector<SlurmHostPattern> out;
  SlurmHostPattern item{{""}, {}};
  std::size_t i = 0;
  while (i <= list.size()) {
    if (i == list.size() || list[i] == ',') {
      if (item.groups.empty() && item.pieces.front().empty()) bad("has an empty host name");
      out.push_back(std::move(item));
      item = SlurmHostPattern{{""}, {}};
      ++i;
      if (i > list.size()) break;
      continue;
    }
    if (list[i] == ']') bad("has a ']' without its '['");
    if (list[i] != '[') {
      item.pieces.back() += list[i++];
      continue;
    }
    const auto close = list.find(']', i + 1);
    if (close == std::string_view::npos) bad("has an unclosed '['");
    const std::string_view group = list.substr(i + 1, close - i - 1);
    if (group.empty() || group.find('[') != std::string_view::npos) bad("has an empty or nested bracket group");
    item.groups.emplace_back(group);
    item.pieces.emplace_back();
    i = close + 1;
  }
  return out;
}

/// @brief The numbers of one bracket group ("01-03,7" → "01","02","03","7"), each range padded to
/// the width of its first bound as SLURM writes it, stopping after `limit` names.
/// @throws config_error naming the list when a range is not digits or runs backwards
inline std::vector<std::string> slurm_group_names(std::string_view group, std::string_view list, std::size_t limit) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= group.size() && out.size() < limit) {
    const auto comma = std::min(group.find(',', pos), group.size());
    const std::string_view range = group.substr(pos, comma - pos);
    pos = comma + 1;
    const auto dash = range.find('-');
    const std::string_view lo_text = range.substr(0, dash);
    const std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
    const auto lo = text::parse_integer<std::uint64_t>(lo_text), hi = text::parse_integer<std::uint64_t>(hi_text);
    const bool digits = !lo_text.empty() && !hi_text.empty() && lo_text.find_first_not_of("0123456789") == std::string_view::npos &&
                        hi_text.find_first_not_of("0123456789") == std::string_view::npos;
    if (!digits || !lo || !hi || *hi < *lo)
      throw_error<config_error>("SLURM node list '", list, "' has a malformed range '", range, "' (expected forms like 7 or 01-12)");
    for (std::uint64_t n = *lo; n <= *hi && out.size() < limit; ++n) {
      std::string digits_of_n = std::to_string(n);
      if (digits_of_n.size() < lo_text.size()) digits_of_n.insert(0, lo_text.size() - digits_of_n.size(), '0');
      out.push_back(std::move(digits_of_n));
    }
  }
  return out;
}

/// @brief Every host of a SLURM host list, in SLURM's order ("a[1-2]-b[3-4]" → a1-b3, a1-b4,
/// a2-b3, a2-b4), at most `limit` of them.
/// @throws config_error naming the list when it is malformed
inline std::vector<std::string> slurm_expand_hosts(std::string_view list, std::size_t limit = 1u << 16) {
  std::vector<std::string> out;
  for (const auto& item : slurm_host_patterns(list)) {
    std::vector<std::string> names{item.pieces.front()};
    for (std::size_t g = 0; g < item.groups.size(); ++g) {
      const auto numbers = slurm_group_names(item.groups[g], list, limit);
      std::vector<std::string> next;
      for (const auto& prefix : names)
        for (const auto& n : numbers) {
          if (next.size() >= limit) break;
          next.push_back(prefix + n + item.pieces[g + 1]);
        }
      names = std::move(next);
    }
    for (auto& n : names) {
      if (out.size() >= limit) return out;
      out.push_back(std::move(n));
    }
  }
  return out;
}

/// @brief First host of a SLURM host list: "node[01-04,07],gpu1" → "node01" (where rank 0 runs).
/// @throws config_error naming the list when it is malformed
inline std::string slurm_first_host(std::string_view list) { return slurm_expand_hosts(list, 1).front(); }

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
  if (!rank && !size) {
    // Only a local variable is set (MPI_LOCALRANKID alone, say): name the one that is.
    const char* have = env(c.local_rank) ? c.local_rank : c.local_size;
    throw_error<config_error>(have, "=", env(have).value_or(""), " is set but neither ", c.rank, " nor ", c.size, " is (",
                              launcher_name(c.launcher), " sets all of them); set ", c.rank, " and ", c.size, " or unset ", have);
  }
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

/// @brief A launcher's name for the job (id), a per-job secret it also gives (extra), or why it
///        gives none (missing).
struct JobIdentity {
  std::string id, extra, missing;
};

/// @brief The identity the convention that gave the ranks offers, read from that convention's own
/// variables only: variables of another launcher may be inherited by several jobs (two mpiruns
/// started from one srun step both see SLURM_STEP_ID=0), so they would name different jobs alike.
inline JobIdentity launcher_identity(const EnvSource& env, const LaunchEnv& e, const LauncherQuery& query) {
  const auto value = [&](const char* name) { return env(name).value_or(""); };
  switch (e.launcher) {
    case Launcher::slurm: {
      const std::string step = env("SLURM_STEP_ID") ? value("SLURM_STEP_ID") : value("SLURM_STEPID");
      if (!value("SLURM_JOB_ID").empty() && !step.empty()) return {concat("slurm:", value("SLURM_JOB_ID"), ".", step), "", ""};
      return {"", "", "SLURM_JOB_ID or SLURM_STEP_ID is unset"};
    }
    case Launcher::openmpi: {
      // Open MPI 4.1 (ORTE) sets both to the job id; Open MPI 5 (PRRTE) names the job by its
      // PMIx namespace. The precondition key is random per mpirun, so two jobs whose 32-bit ids
      // collide still get different tokens.
      std::string id = value("OMPI_MCA_ess_base_jobid");
      if (id.empty()) id = value("PMIX_NAMESPACE");
      if (id.empty()) return {"", "", "neither OMPI_MCA_ess_base_jobid nor PMIX_NAMESPACE is set"};
      return {"openmpi:" + id, value("OMPI_MCA_orte_precondition_transports"), ""};
    }
    case Launcher::mpich: {
      if (!value("PMI_JOBID").empty()) return {"pmi:" + value("PMI_JOBID"), "", ""};  // srun --mpi=pmi2
      const auto fd = text::parse_integer<int>(value("PMI_FD"));
      if (!fd) return {"", "", "neither PMI_JOBID nor PMI_FD is set"};
      // Hydra runs one proxy per job and machine, so its pid names the job only when the whole
      // job is on this machine.
      if (e.local_world_size != e.world_size)
        return {"", "", "Hydra names a job only per machine (by its proxy) and this job spans machines"};
      const auto peer = query.pmi_fd_peer ? query.pmi_fd_peer(*fd) : std::nullopt;
      if (!peer) return {"", "", concat("PMI_FD=", *fd, " is not a socket to Hydra's proxy")};
      return {"mpich:" + *peer, "", ""};
    }
    case Launcher::torchrun: {
      // The static rendezvous (torchrun's default) names every run "none"; it always sets
      // MASTER_PORT, where its own agent store already keeps other jobs out.
      const std::string run = value("TORCHELASTIC_RUN_ID");
      if (!run.empty() && run != "none") return {"torchrun:" + run, "", ""};
      return {"", "", run.empty() ? "TORCHELASTIC_RUN_ID is unset" : "TORCHELASTIC_RUN_ID is 'none'"};
    }
    case Launcher::mvapich: return {"", "", "MVAPICH2 sets no job identity"};
    case Launcher::accel: return {"", "", "ACCEL_JOB_TOKEN is unset"};
    case Launcher::none: break;
  }
  return {"", "", "no launcher variables"};
}

}  // namespace detail

/// @brief ACCEL_JOIN_TIMEOUT_S, else default_join_timeout (a launcher hosting the store reads it too).
/// @throws config_error when it is not a positive number of seconds
inline std::chrono::milliseconds join_timeout_from(const EnvSource& env) {
  return detail::env_seconds(env, "ACCEL_JOIN_TIMEOUT_S").value_or(default_join_timeout);
}

/// @brief ACCEL_GPUS_PER_PROCESS (set by `accel launch --gpus_per_process K`, or by hand for
///        torchrun, mpirun and srun), else 1: how many GPUs each process owns.
/// @throws config_error naming the variable and its value when it is not a positive integer
inline int gpus_per_process_from(const EnvSource& env) {
  return detail::env_int(env, "ACCEL_GPUS_PER_PROCESS", 1).value_or(1);
}

/// @brief Reads the launcher environment (pure: everything comes through `env` and `query`).
/// @param query questions for the system; the default asks none (then a Hydra job has no identity)
/// @throws config_error naming the variable and its value when a value is malformed, out of range,
///         or contradicts another convention with the same world size.
inline LaunchEnv read_launch_env(const EnvSource& env, const LauncherQuery& query = {}) {
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
  if (out.launcher == Launcher::none && env("SLURM_JOB_ID") && !env("SLURM_STEP_ID") && !env("SLURM_STEPID"))
    out.diagnostics.push_back(concat("SLURM_JOB_ID=", *env("SLURM_JOB_ID"),
                                     " is set but this is no srun step (SLURM_STEP_ID is unset): this batch script runs as one "
                                     "process; start the ranks with `srun ./program` inside it"));
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) throw_error<config_error>("MASTER_ADDR is set but empty; set it to rank 0's host name or address");
    out.master_addr = *addr;
  } else if (const char* var = out.launcher != Launcher::slurm    ? nullptr
                               : env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                               : env("SLURM_JOB_NODELIST")  ? "SLURM_JOB_NODELIST"
                               : env("SLURM_NODELIST")      ? "SLURM_NODELIST"
                                                            : nullptr) {
    out.master_addr = slurm_first_host(*env(var));
  } else if (out.num_machines > 1) {
    out.master_addr.clear();
    out.diagnostics.push_back("MASTER_ADDR is unset on a multi-machine job: collectives need rank 0's address in MASTER_ADDR");
  }
  const auto master_port = env_int(env, "MASTER_PORT", 1);
  if (master_port) {
    if (*master_port > 65535) throw_error<config_error>("MASTER_PORT='", *env("MASTER_PORT"), "' is not a TCP port (1-65535)");
    out.master_port = *master_port;
  }
  if (auto store = env("ACCEL_STORE")) {
    if (!split_host_port(*store))
      throw_error<config_error>("ACCEL_STORE='", *store, "' is not host:port (it is set by accel launch; do not set it by hand)");
    out.store_address = *store;
  }
  const std::string token = env("ACCEL_JOB_TOKEN").value_or("");
  if (out.launcher == Launcher::accel && !token.empty()) {
    out.job_id = token_job_id(token, "accel");
    out.job_token = token;
  } else {
    const JobIdentity id = launcher_identity(env, out, query);
    out.job_id = !id.id.empty() ? id.id : !token.empty() ? token_job_id(token, "token") : std::string();
    for (const std::string* part : {&id.id, &id.extra, &token})
      if (!part->empty()) out.job_token += (out.job_token.empty() ? "" : "/") + *part;
    if (out.job_id.empty() && !master_port && !out.store_address && out.world_size > 1)
      out.rendezvous_warning = concat(
          "no job identity (", launcher_name(out.launcher), ": ", id.missing, ") and MASTER_PORT is unset, so every such job on ",
          out.master_addr.empty() ? std::string("rank 0's machine") : out.master_addr, " meets at port ", out.master_port,
          " and two running at once would mix their ranks; give each job its own MASTER_PORT, or its own ACCEL_JOB_TOKEN "
          "(the port is then derived from it)");
  }
  if (!master_port && !out.job_id.empty()) {
    out.master_port = job_port(out.job_id);
    out.master_port_derived = true;
  }
  if (auto t = env_seconds(env, "ACCEL_TIMEOUT_S")) out.timeout = *t;
  out.join_timeout = join_timeout_from(env);
  out.torchelastic_agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  out.use_cpu = env_bool(env, "ACCEL_USE_CPU").value_or(false);
  return out;
}

ACCEL_NAMESPACE_END
