// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file collectives.hpp
/// @brief wait_for_everyone, main_process_first, gather_object, broadcast_object (accelerate's names),
///        and the buffer collectives all_gather, all_reduce, broadcast, reduce_scatter over spans.
///
/// Every function has two forms: over a DistributedState (the communicator is created on first use
/// from the launcher environment: CPU backend on CPU, NCCL on a GPU when compiled in) and over any
/// Communicator (tests use in-process thread worlds).
///
/// @code
///   accel::DistributedState state;
///   auto mine = state.split_between_processes(prompts, {.apply_padding = true});
///   std::vector<std::string> out;
///   for (const auto& p : mine) out.push_back(run(p));
///   auto all = accel::gather_object(state, out, mine.shard());  // every prompt's result, input order
///   accel::print(state, all.size(), " results");                 // printed once, by the main process
/// @endcode
///
/// Failure semantics (every collective): a rank whose local step throws (a value that does not
/// serialize, the body of main_process_first) still joins, flagged; that rank rethrows its own
/// exception and every other rank throws comm_error naming it. A rank that dies or exits without
/// joining is reported as comm_error naming it at once; one that is merely late, as timeout_error
/// naming the missing ranks after the timeout (ACCEL_TIMEOUT_S, default 300 s).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <accel/runtime/bytes.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/comm/cpu.hpp>
#include <accel/comm/nccl.hpp>
#include <accel/comm/reduce.hpp>
#include <accel/comm/store.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/comm/serialize.hpp>
#include <accel/runtime/split.hpp>
#include <accel/runtime/distributed_state.hpp>
#include <accel/runtime/cuda.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Which communicator backend to use.
enum class CommBackend { automatic, solo, cpu, nccl };

/// @brief Settings for the communicator a DistributedState gets.
struct CommOptions {
  CommBackend backend = CommBackend::automatic;  ///< automatic: ACCEL_COMM_BACKEND, else by device
  CpuCommOptions cpu;
  NcclCommOptions nccl;
};

/// @brief The backend decision (pure): an explicit request wins, then ACCEL_COMM_BACKEND
/// ("cpu"/"nccl"), then one process → solo, a CUDA device with NCCL compiled in → nccl, else cpu.
/// @throws config_error when ACCEL_COMM_BACKEND holds something else
/// @throws unavailable_error when nccl is requested but not compiled in
inline CommBackend choose_backend(CommBackend requested, const std::optional<std::string>& env_value, int world_size, bool on_cuda) {
  CommBackend b = requested;
  if (b == CommBackend::automatic && env_value && !env_value->empty()) {
    if (*env_value == "cpu") b = CommBackend::cpu;
    else if (*env_value == "nccl") b = CommBackend::nccl;
    else detail::throw_error<config_error>("ACCEL_COMM_BACKEND='", *env_value, "' is not a backend; use cpu or nccl (or unset it)");
  }
  if (b == CommBackend::automatic) {
    if (world_size == 1) return CommBackend::solo;
    return on_cuda && nccl_enabled ? CommBackend::nccl : CommBackend::cpu;
  }
  if (b == CommBackend::nccl && !nccl_enabled)
    detail::throw_error<unavailable_error>("the NCCL backend was requested but NCCL is not compiled in; build with "
                                           "-DACCEL_WITH_NCCL=ON or use ACCEL_COMM_BACKEND=cpu");
  return b;
}

/// @brief Creates a communicator for `state` (joins the job's store unless the job has one process).
/// @throws comm_error / timeout_error when the store cannot be reached; see choose_backend()
/// @note collective: every process must call it
inline std::shared_ptr<Communicator> make_communicator(const DistributedState& state, CommOptions options = {}) {
  const LaunchEnv& env = state.launch_env();
  const char* raw = std::getenv("ACCEL_COMM_BACKEND");
  const auto backend = choose_backend(options.backend, raw ? std::optional<std::string>(raw) : std::nullopt, env.world_size,
                                      state.device().is_cuda());
  if (backend == CommBackend::solo) {
    ACCEL_EXPECTS(env.world_size == 1, "the solo backend serves one process, not ", env.world_size);
    return std::make_shared<SoloCommunicator>(env.timeout);
  }
  if (backend == CommBackend::nccl) {
    ACCEL_EXPECTS(state.device().is_cuda(), "the NCCL backend needs a CUDA device but this process uses ", state.device());
    auto store = env.world_size > 1 ? (state.job_store() ? state.job_store() : connect_job_store(env)) : nullptr;
    return std::make_shared<NcclCommunicator>(std::move(store), env.rank, env.world_size, state.device().index(), env.timeout,
                                              options.nccl);
  }
  return std::make_shared<CpuCommunicator>(state.job_store() ? state.job_store() : connect_job_store(env), env.rank, env.world_size,
                                           options.cpu);
}

/// @brief Creates `state`'s communicator with explicit options and attaches it (replacing any).
/// @note collective: every process must call it
inline Communicator& init_communicator(DistributedState& state, CommOptions options = {}) {
  state.attach_communicator(make_communicator(state, std::move(options)));
  return *state.communicator();
}

/// @brief `state`'s communicator, created with default options on first use.
/// @note collective the first time (every process joins the store)
inline Communicator& communicator(DistributedState& state) {
  if (Communicator* c = state.communicator()) return *c;
  return init_communicator(state);
}

/// @name Groups
///@{

/// @brief The communicator of this rank's group (MPI_Comm_split): ranks passing the same `color`
/// form a group, ordered by `key`, ties by rank in `comm`. Every collective works on it, and its
/// rounds never mix with another group's or `comm`'s. Messages name a member as "group rank 1
/// (job rank 3)".
/// @param color 0 or more, or no_group: this rank joins no group and gets null
/// @throws usage_error when a rank passes a negative color other than no_group (that rank; the
///         others throw comm_error naming it); comm_error / timeout_error as any collective
/// @note collective over `comm` (one round), then over each group (its setup)
inline std::shared_ptr<Communicator> split(Communicator& comm, int color, int key) { return comm.split(color, key); }
/// @copydoc split(Communicator&, int, int)
inline std::shared_ptr<Communicator> split(DistributedState& state, int color, int key) { return split(communicator(state), color, key); }

/// @brief This rank's groups in a grid of `replicas` x `stages` ranks (rank = replica * stages + stage).
struct GridGroups {
  std::shared_ptr<Communicator> stage_group;    ///< the `stages` ranks of this replica, in stage order (rank there = stage)
  std::shared_ptr<Communicator> replica_group;  ///< the `replicas` ranks holding this stage, in replica order (rank there = replica)
  int replica = 0;                              ///< this rank's replica: rank / stages
  int stage = 0;                                ///< this rank's stage: rank % stages
  int replicas = 0;
  int stages = 0;
};

namespace detail {
/// @brief Why `replicas` x `stages` is not a grid of `size` ranks ("" when it is). Pure.
inline std::string grid_problem(int replicas, int stages, int size) {
  if (replicas < 1 || stages < 1)
    return concat("grid_groups: ", replicas, " replicas x ", stages, " stages; both must be at least 1");
  if (static_cast<long long>(replicas) * stages != size)
    return concat("grid_groups: ", replicas, " replicas x ", stages, " stages make ", static_cast<long long>(replicas) * stages,
                  " ranks, but the communicator has ", size, "; pass replicas and stages whose product is ", size);
  return {};
}
}  // namespace detail

/// @brief The stage group and replica group of this rank in a `replicas` x `stages` grid over
/// `world` (two split()s: by replica, then by stage).
/// @throws usage_error on every rank when replicas * stages is not world.size() (naming the
///         numbers) or the ranks pass different shapes (naming what each passed)
/// @note collective over `world`
inline GridGroups grid_groups(Communicator& world, int replicas, int stages) {
  std::exception_ptr failure;
  try {
    if (auto problem = detail::grid_problem(replicas, stages, world.size()); !problem.empty()) detail::throw_error<usage_error>(problem);
  } catch (...) {
    failure = std::current_exception();
  }
  detail::WireWriter w;
  w.i32(replicas).i32(stages);
  const auto mine = w.take();
  const Blobs all = world.all_gather("grid_groups", failure ? Payload() : Payload(mine), failure);
  std::vector<std::string> shapes;
  for (std::size_t i = 0; i < all.size(); ++i) {
    try {
      detail::WireReader rd(all[i]);
      const int r = rd.i32(), s = rd.i32();
      rd.expect_end();
      shapes.push_back(detail::concat(r, " x ", s));
    } catch (const detail::wire_error& e) {
      detail::throw_error<comm_error>(world.rank_name(static_cast<int>(i)), " sent a malformed grid_groups entry (", e.what(), ")");
    }
  }
  if (std::adjacent_find(shapes.begin(), shapes.end(), std::not_equal_to<>()) != shapes.end())
    detail::throw_error<usage_error>("grid_groups: the ranks pass different grids (replicas x stages): ",
                                     detail::ranks_by(shapes.size(), [&](std::size_t i) { return shapes[i]; }, "pass"),
                                     "; pass the same on every rank");
  GridGroups g;
  g.replicas = replicas, g.stages = stages;
  g.replica = world.rank() / stages, g.stage = world.rank() % stages;
  g.stage_group = split(world, g.replica, g.stage);
  g.replica_group = split(world, g.stage, g.replica);
  return g;
}
/// @copydoc grid_groups(Communicator&, int, int)
inline GridGroups grid_groups(DistributedState& state, int replicas, int stages) {
  return grid_groups(communicator(state), replicas, stages);
}

///@}

/// @name Synchronisation
///@{

/// @brief Blocks until every process reached this point.
/// @throws comm_error naming a rank that died, exited or called another collective; timeout_error after the timeout
/// @note collective
inline void wait_for_everyone(Communicator& comm) { comm.barrier("wait_for_everyone"); }
/// @copydoc wait_for_everyone(Communicator&)
inline void wait_for_everyone(DistributedState& state) { wait_for_everyone(communicator(state)); }

namespace detail {

// The ranks for which `first` holds run fn, then release the others, which run it afterwards.
template <class F>
decltype(auto) run_first(Communicator& comm, bool first, F&& fn, const char* op) {
  using R = std::invoke_result_t<F&>;
  if (!first) {
    comm.barrier(op);
    return std::forward<F>(fn)();
  }
  std::exception_ptr failure;
  if constexpr (std::is_void_v<R>) {
    try {
      fn();
    } catch (...) {
      failure = std::current_exception();
    }
    comm.barrier(op, failure);
  } else {
    std::optional<R> result;
    try {
      result.emplace(fn());
    } catch (...) {
      failure = std::current_exception();
    }
    comm.barrier(op, failure);
    return R(std::move(*result));
  }
}

}  // namespace detail

/// @brief Runs `fn` on the main process first, then on all others (e.g. download once, then load everywhere).
///
/// If `fn` throws on the main process, it rethrows there and the others throw comm_error naming
/// rank 0 instead of running `fn`.
/// @return what `fn` returns on this process
/// @note collective: every process must call it
template <class F>
decltype(auto) main_process_first(DistributedState& state, F&& fn) {
  return detail::run_first(communicator(state), state.is_main_process(), std::forward<F>(fn), "main_process_first");
}
/// @brief main_process_first over a communicator (rank 0 first).
template <class F>
decltype(auto) main_process_first(Communicator& comm, F&& fn) {
  return detail::run_first(comm, comm.rank() == 0, std::forward<F>(fn), "main_process_first");
}
/// @brief Runs `fn` on each machine's local main process first, then on the others.
/// @note collective: every process must call it
template <class F>
decltype(auto) local_main_process_first(DistributedState& state, F&& fn) {
  return detail::run_first(communicator(state), state.is_local_main_process(), std::forward<F>(fn), "local_main_process_first");
}

/// @brief Calls `fn` on the main process only (not collective).
/// @return void, or std::optional of fn's result (empty on other processes)
template <class F>
auto on_main_process(const DistributedState& state, F&& fn) {
  using R = std::invoke_result_t<F&>;
  if constexpr (std::is_void_v<R>) {
    if (state.is_main_process()) fn();
  } else {
    return state.is_main_process() ? std::optional<R>(fn()) : std::nullopt;
  }
}
/// @brief Calls `fn` on each machine's local main process only (not collective).
template <class F>
auto on_local_main_process(const DistributedState& state, F&& fn) {
  using R = std::invoke_result_t<F&>;
  if constexpr (std::is_void_v<R>) {
    if (state.is_local_main_process()) fn();
  } else {
    return state.is_local_main_process() ? std::optional<R>(fn()) : std::nullopt;
  }
}

/// @brief Prints the arguments and a newline to stdout on the main process only (not collective).
template <class... Args>
void print(const DistributedState& state, Args&&... args) {
  if (!state.is_main_process()) return;
  std::cout << detail::concat(std::forward<Args>(args)...) << std::endl;
}
///@}

/// @name Gathering and broadcasting
///@{

namespace detail {

// Encodes this rank's part of collective `op` into the communicator's send buffer: `write(head)`
// appends to the buffer and returns the body (plain data viewed where it lies). What it throws is
// kept in `failure`, to travel as this rank's failure; memory exhausted there becomes a
// serialization_error with the size encoded so far instead of a bare std::bad_alloc.
template <class T, class Write>
Payload encode_part(Communicator& comm, std::string_view op, std::exception_ptr& failure, Write&& write) {
  std::vector<std::byte>& head = comm.send_buffer();
  head.clear();
  std::span<const std::byte> body;
  try {
    body = write(head);
  } catch (const std::bad_alloc&) {
    failure = std::make_exception_ptr(serialization_error(concat("rank ", comm.rank(), " ran out of memory encoding its ", type_name<T>(), " for ",
                                                                 op, " (", text::format_bytes(head.capacity()),
                                                                 " encoded so far); send less per call")));
  } catch (...) {
    failure = std::current_exception();
  }
  return Payload(head, body);
}

// Encodes `value` and gathers every rank's encoding.
template <class T>
Blobs gather_encoded(Communicator& comm, const T& value) {
  std::exception_ptr failure;
  const Payload mine =
      encode_part<T>(comm, "gather_object", failure, [&](std::vector<std::byte>& head) { return encode_payload(head, value, comm.rank()); });
  return comm.all_gather("gather_object", mine, failure);
}

// Runs the decoding step `fn` of rank `from`'s `bytes`-byte value; memory exhausted there becomes
// a serialization_error naming the ranks and the size, not a bare std::bad_alloc.
template <class F>
void out_of_memory_as_error(const Communicator& comm, std::size_t bytes, int from, F&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    throw_error<serialization_error>("rank ", comm.rank(), " ran out of memory decoding the ", text::format_bytes(bytes),
                                     " value from rank ", from, "; gather less per call");
  }
}

}  // namespace detail

/// @brief Every process's `value`, in rank order, on every process (torch's all_gather_object).
///
/// In:  rank r holds value_r.   Out: {value_0, value_1, …, value_{n-1}} on every rank.
/// @throws serialization_error naming the rank whose bytes do not decode as T
/// @throws comm_error naming the rank that failed to encode its value, died or exited; timeout_error
/// @note collective
template <class T>
std::vector<T> gather_object(Communicator& comm, const T& value) {
  const Blobs all = detail::gather_encoded(comm, value);
  std::vector<T> out;
  out.reserve(all.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    detail::out_of_memory_as_error(comm, all[i].size(), static_cast<int>(i), [&] { out.push_back(from_bytes<T>(all[i], static_cast<int>(i))); });
  return out;
}

/// @brief gather_object into storage the caller keeps: `out` is resized to the world size and
/// out[i] decoded in place from rank i's value, reusing the memory `out` holds from an earlier call
/// (vector capacity, and for vectors of strings or of ACCEL_DEFINE_FIELDS structs every item's
/// strings and vectors), so a loop that gathers values of a steady shape allocates nothing after
/// its first call.
///
/// In:  rank r holds value_r; `out` anything.   Out: out == {value_0, …, value_{n-1}} on every rank.
/// @throws as gather_object; on an error `out` holds valid but unspecified values
/// @note collective
template <class T>
void gather_object_into(Communicator& comm, const T& value, std::vector<T>& out) {
  const Blobs all = detail::gather_encoded(comm, value);
  out.resize(all.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    detail::out_of_memory_as_error(comm, all[i].size(), static_cast<int>(i), [&] { from_bytes_into(all[i], out[i], static_cast<int>(i)); });
}
/// @copydoc gather_object_into(Communicator&, const T&, std::vector<T>&)
template <class T>
void gather_object_into(DistributedState& state, const T& value, std::vector<T>& out) {
  gather_object_into(communicator(state), value, out);
}
/// @copydoc gather_object(Communicator&, const T&)
template <class T>
std::vector<T> gather_object(DistributedState& state, const T& value) {
  return gather_object(communicator(state), value);
}

/// @brief gather_object_flat into storage the caller keeps: every rank's records decoded straight
/// into `out`, sized once from the payloads' counts, reusing the memory `out` holds from an earlier
/// call (capacity, and for strings or ACCEL_DEFINE_FIELDS structs every item's strings and vectors).
///
/// In:  rank 0 {a, b}, rank 1 {}, rank 2 {c}; `out` anything.   Out: out == {a, b, c} on every rank.
/// @throws as gather_object; on an error `out` holds valid but unspecified values
/// @note collective
template <class T>
void gather_object_flat_into(Communicator& comm, const std::vector<T>& values, std::vector<T>& out) {
  const Blobs all = detail::gather_encoded(comm, values);
  std::vector<detail::VectorItems<std::vector<T>>> parts;
  parts.reserve(all.size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    detail::out_of_memory_as_error(comm, all[i].size(), static_cast<int>(i), [&] { parts.emplace_back(all[i], static_cast<int>(i)); });
    total += parts.back().count();
  }
  if constexpr (std::is_default_constructible_v<T>) {
    if (out.capacity() < total) {
      out.reserve(total);
      detail::advise_huge_pages(out.data(), total * sizeof(T));
    }
    out.resize(total);
    std::size_t at = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const auto n = parts[i].count();
      detail::out_of_memory_as_error(comm, all[i].size(), static_cast<int>(i), [&] { parts[i].into(std::span<T>(out.data() + at, n)); });
      at += n;
    }
  } else {  // only CBOR items can lack a default constructor: already decoded, moved over
    out.clear();
    out.reserve(total);
    for (auto& part : parts) part.append_to(out);
  }
}
/// @copydoc gather_object_flat_into(Communicator&, const std::vector<T>&, std::vector<T>&)
template <class T>
void gather_object_flat_into(DistributedState& state, const std::vector<T>& values, std::vector<T>& out) {
  gather_object_flat_into(communicator(state), values, out);
}

/// @brief Concatenation of every process's vector in rank order (accelerate's gather_object on lists),
///        decoded straight into one vector (see gather_object_flat_into).
///
/// In:  rank 0 {a, b}, rank 1 {}, rank 2 {c}.   Out: {a, b, c} on every rank.
/// @throws as gather_object
/// @note collective
template <class T>
std::vector<T> gather_object_flat(Communicator& comm, const std::vector<T>& values) {
  std::vector<T> out;
  gather_object_flat_into(comm, values, out);
  return out;
}
/// @copydoc gather_object_flat(Communicator&, const std::vector<T>&)
template <class T>
std::vector<T> gather_object_flat(DistributedState& state, const std::vector<T>& values) {
  return gather_object_flat(communicator(state), values);
}

namespace detail {

// The shard form's prefix: total, first index, real count (u64 each), then padding so that raw data
// after it stays 32-byte aligned.
inline constexpr std::size_t shard_prefix_bytes = 32;


}  // namespace detail

/// @brief The results of split_between_processes shares, padding dropped, in the input's original order.
///
/// In:  9 prompts on 4 processes with padding: shards [0,1,2] [3,4] [5,6] [7,8] padded to 3 items,
///      each process passes its 3 results and its shard.   Out: the 9 results for prompts 0..8.
/// @param results this process's results, one per item of its shard (padding included or not)
/// @param shard this process's shard (`view.shard()` of split_between_processes)
/// @throws usage_error on every rank when a rank's results do not match its shard, or the shards do
///         not cover the input exactly once (the offending rank named)
/// @throws as gather_object otherwise
/// @note collective
template <class T>
std::vector<T> gather_object(Communicator& comm, const std::vector<T>& results, const Shard& shard) {
  std::exception_ptr failure;
  const Payload mine = detail::encode_part<std::vector<T>>(comm, "gather_object", failure, [&](std::vector<std::byte>& head) {
    if (results.size() != shard.padded_count && results.size() != shard.real_count)
      detail::throw_error<usage_error>("gather_object: rank ", comm.rank(), " passed ", results.size(), " results for a shard of ",
                                       shard.real_count, " items (", shard.padded_count, " with padding); pass one result per item");
    append_le<std::uint64_t>(head, shard.total);
    append_le<std::uint64_t>(head, shard.first_index);
    append_le<std::uint64_t>(head, shard.real_count);
    head.resize(detail::shard_prefix_bytes, std::byte{0});
    return encode_payload(head, results, comm.rank());
  });
  const Blobs all = comm.all_gather("gather_object", mine, failure);
  struct Part {
    std::uint64_t total, first, real;
    std::size_t rank;
  };
  std::vector<Part> parts;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto b = all[i];
    if (b.size() < detail::shard_prefix_bytes)
      detail::throw_error<serialization_error>("gather_object: rank ", i, " sent ", b.size(),
                                               " bytes, too few for a shard (did every rank pass its shard?)");
    const auto t = b.first(detail::shard_prefix_bytes);
    parts.push_back({load_le<std::uint64_t>(t.data()), load_le<std::uint64_t>(t.data() + 8), load_le<std::uint64_t>(t.data() + 16), i});
  }
  std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.first < b.first || (a.first == b.first && a.rank < b.rank); });
  std::uint64_t next = 0;
  for (const auto& p : parts) {
    if (p.total != parts.front().total)
      detail::throw_error<usage_error>("gather_object: rank ", p.rank, " split an input of ", p.total, " items but rank ",
                                       parts.front().rank, " one of ", parts.front().total, "; every rank must split the same input");
    if (p.real > 0 && p.first != next)
      detail::throw_error<usage_error>("gather_object: the shards do not cover the input exactly once: rank ", p.rank, " starts at item ",
                                       p.first, " but item ", next, " is ", p.first > next ? "missing" : "covered twice");
    if (p.real > 0) next = p.first + p.real;
  }
  if (!parts.empty() && next != parts.front().total)
    detail::throw_error<usage_error>("gather_object: the shards cover ", next, " of ", parts.front().total, " items");
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(next));
  for (const auto& p : parts) {
    if (p.real == 0) continue;
    const auto b = all[p.rank];
    auto items = from_bytes<std::vector<T>>(b.subspan(detail::shard_prefix_bytes), static_cast<int>(p.rank));
    if (items.size() < p.real)
      detail::throw_error<serialization_error>("gather_object: rank ", p.rank, " sent ", items.size(), " results for ", p.real, " items");
    std::move(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(p.real), std::back_inserter(out));
  }
  return out;
}
/// @copydoc gather_object(Communicator&, const std::vector<T>&, const Shard&)
template <class T>
std::vector<T> gather_object(DistributedState& state, const std::vector<T>& results, const Shard& shard) {
  return gather_object(communicator(state), results, shard);
}

/// @brief `root`'s value on every process (the value passed by other processes is ignored).
/// @throws usage_error when root is not a rank; serialization_error when root's bytes do not decode
/// @throws comm_error naming root when it failed to encode its value, died or exited
/// @note collective
template <class T>
T broadcast_object(Communicator& comm, const T& value, int root = 0) {
  std::exception_ptr failure;
  Payload mine;
  if (comm.rank() == root)
    mine = detail::encode_part<T>(comm, "broadcast_object", failure, [&](std::vector<std::byte>& head) { return encode_payload(head, value, root); });
  const auto got = comm.broadcast("broadcast_object", mine, root, failure);
  std::optional<T> out;
  detail::out_of_memory_as_error(comm, got.size(), root, [&] { out.emplace(from_bytes<T>(got, root)); });
  return std::move(*out);
}
/// @copydoc broadcast_object(Communicator&, const T&, int)
template <class T>
T broadcast_object(DistributedState& state, const T& value, int root = 0) {
  return broadcast_object(communicator(state), value, root);
}
///@}

/// @name Buffer collectives
/// Over spans of numbers: host memory on the CPU and solo backends, device memory of the
/// process's own GPU under NCCL (ncclAllGather, ncclAllReduce, ncclBroadcast, ncclReduceScatter).
/// Element types: int8/uint8/int32/uint32/int64/uint64, float, double, accel::half, accel::bfloat16.
/// Every rank must pass the same element type, operator and lengths: otherwise every rank throws
/// usage_error naming the ranks and what each passed, before any data moves.
///
/// - plain call: returns when the result is in place (under NCCL: on the communicator's own
///   stream, waited for);
/// - `*_async`: returns a CollectiveHandle; wait() returns when the result is in place (the CPU
///   and solo backends finish before returning, so their handle is already complete);
/// - with a `cudaStream_t` (CUDA builds only): under NCCL enqueued on that stream and returns
///   without waiting (stream-ordered, as torch's ops); on host backends the stream is synchronised
///   first, so host buffers written by earlier work on it are complete.
///@{

namespace detail {

template <class T>
BufferCall buffer_call(BufferOp kind, std::span<const T> send, std::span<T> recv) {
  BufferCall c;
  c.kind = kind;
  c.type = element_type_of<T>();
  c.send = send.data(), c.send_count = send.size();
  c.recv = recv.data(), c.recv_count = recv.size();
  return c;
}

// Runs `c`; without a stream and not async, waits for completion.
inline CollectiveHandle submit_buffer(Communicator& comm, BufferCall c) {
  const bool wait = !c.async && c.stream == nullptr;
  CollectiveHandle h = comm.run_buffer(c);
  if (wait) h.wait();
  return c.async ? std::move(h) : CollectiveHandle();
}

#if ACCEL_HAS_CUDA()
// Host backends have no stream to order on: the stream's earlier work is waited for instead.
inline BufferCall on_stream(Communicator& comm, BufferCall c, cudaStream_t stream) {
  if (comm.device_buffers()) {
    c.stream = static_cast<void*>(stream);
  } else {
    ACCEL_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  return c;
}
#endif

}  // namespace detail

/// @brief Every rank's `send`, concatenated in rank order, into `recv` (recv.size() == send.size() × world size).
///
/// In: rank r sends {r, r}, 3 ranks.   Out: recv = {0, 0, 1, 1, 2, 2} on every rank.
/// @throws usage_error when recv has the wrong size (this rank) or the ranks' types/lengths differ (every rank)
/// @note collective
template <class T>
void all_gather(Communicator& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
  detail::submit_buffer(comm, detail::buffer_call<T>(BufferOp::all_gather, send, recv));
}
/// @brief all_gather, returning a handle (see the group's notes).
template <class T>
CollectiveHandle all_gather_async(Communicator& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
  auto c = detail::buffer_call<T>(BufferOp::all_gather, send, recv);
  c.async = true;
  return detail::submit_buffer(comm, c);
}

/// @brief Element-wise reduction of every rank's `data`, in place on every rank.
///
/// In: rank r holds {r, 10}, 3 ranks, sum.   Out: {3, 30} on every rank.
/// @note collective
template <class T>
void all_reduce(Communicator& comm, std::span<T> data, ReduceOp op) {
  auto c = detail::buffer_call<T>(BufferOp::all_reduce, std::span<const T>(data), data);
  c.op = op;
  detail::submit_buffer(comm, c);
}
/// @brief all_reduce, returning a handle.
template <class T>
CollectiveHandle all_reduce_async(Communicator& comm, std::span<T> data, ReduceOp op) {
  auto c = detail::buffer_call<T>(BufferOp::all_reduce, std::span<const T>(data), data);
  c.op = op, c.async = true;
  return detail::submit_buffer(comm, c);
}

/// @brief `root`'s `data` copied into every rank's `data`.
/// @throws usage_error when root is not a rank
/// @note collective
template <class T>
void broadcast(Communicator& comm, std::span<T> data, int root) {
  auto c = detail::buffer_call<T>(BufferOp::broadcast, std::span<const T>(data), data);
  c.root = root;
  detail::submit_buffer(comm, c);
}
/// @brief broadcast, returning a handle.
template <class T>
CollectiveHandle broadcast_async(Communicator& comm, std::span<T> data, int root) {
  auto c = detail::buffer_call<T>(BufferOp::broadcast, std::span<const T>(data), data);
  c.root = root, c.async = true;
  return detail::submit_buffer(comm, c);
}

/// @brief Block r of the element-wise reduction of every rank's `send`, into rank r's `recv`
/// (send.size() == recv.size() × world size).
///
/// In: 2 ranks, rank r sends {r, r, 10, 10}, sum.   Out: rank 0 recv {1, 1}, rank 1 recv {20, 20}.
/// @note collective
template <class T>
void reduce_scatter(Communicator& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv, ReduceOp op) {
  auto c = detail::buffer_call<T>(BufferOp::reduce_scatter, send, recv);
  c.op = op;
  detail::submit_buffer(comm, c);
}
/// @brief reduce_scatter, returning a handle.
template <class T>
CollectiveHandle reduce_scatter_async(Communicator& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv,
                                      ReduceOp op) {
  auto c = detail::buffer_call<T>(BufferOp::reduce_scatter, send, recv);
  c.op = op, c.async = true;
  return detail::submit_buffer(comm, c);
}

/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>)
template <class T>
void all_gather(DistributedState& state, std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
  all_gather<T>(communicator(state), send, recv);
}
/// @copydoc all_gather_async(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>)
template <class T>
CollectiveHandle all_gather_async(DistributedState& state, std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
  return all_gather_async<T>(communicator(state), send, recv);
}
/// @copydoc all_reduce(Communicator&, std::span<T>, ReduceOp)
template <class T>
void all_reduce(DistributedState& state, std::span<T> data, ReduceOp op) {
  all_reduce<T>(communicator(state), data, op);
}
/// @copydoc all_reduce_async(Communicator&, std::span<T>, ReduceOp)
template <class T>
CollectiveHandle all_reduce_async(DistributedState& state, std::span<T> data, ReduceOp op) {
  return all_reduce_async<T>(communicator(state), data, op);
}
/// @copydoc broadcast(Communicator&, std::span<T>, int)
template <class T>
void broadcast(DistributedState& state, std::span<T> data, int root) {
  broadcast<T>(communicator(state), data, root);
}
/// @copydoc broadcast_async(Communicator&, std::span<T>, int)
template <class T>
CollectiveHandle broadcast_async(DistributedState& state, std::span<T> data, int root) {
  return broadcast_async<T>(communicator(state), data, root);
}
/// @copydoc reduce_scatter(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, ReduceOp)
template <class T>
void reduce_scatter(DistributedState& state, std::span<const std::type_identity_t<T>> send, std::span<T> recv, ReduceOp op) {
  reduce_scatter<T>(communicator(state), send, recv, op);
}
/// @copydoc reduce_scatter_async(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, ReduceOp)
template <class T>
CollectiveHandle reduce_scatter_async(DistributedState& state, std::span<const std::type_identity_t<T>> send, std::span<T> recv,
                                      ReduceOp op) {
  return reduce_scatter_async<T>(communicator(state), send, recv, op);
}

#if ACCEL_HAS_CUDA()
/// @brief The stream-ordered forms (CUDA builds): under NCCL enqueued on `stream`, no host wait;
/// on host backends `stream` is synchronised first and the call completes before returning.
template <class T>
void all_gather(Communicator& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv, cudaStream_t stream) {
  detail::submit_buffer(comm, detail::on_stream(comm, detail::buffer_call<T>(BufferOp::all_gather, send, recv), stream));
}
/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, cudaStream_t)
template <class T>
void all_reduce(Communicator& comm, std::span<T> data, ReduceOp op, cudaStream_t stream) {
  auto c = detail::buffer_call<T>(BufferOp::all_reduce, std::span<const T>(data), data);
  c.op = op;
  detail::submit_buffer(comm, detail::on_stream(comm, c, stream));
}
/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, cudaStream_t)
template <class T>
void broadcast(Communicator& comm, std::span<T> data, int root, cudaStream_t stream) {
  auto c = detail::buffer_call<T>(BufferOp::broadcast, std::span<const T>(data), data);
  c.root = root;
  detail::submit_buffer(comm, detail::on_stream(comm, c, stream));
}
/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, cudaStream_t)
template <class T>
void reduce_scatter(Communicator& comm, std::span<const std::type_identity_t<T>> send, std::span<T> recv, ReduceOp op,
                    cudaStream_t stream) {
  auto c = detail::buffer_call<T>(BufferOp::reduce_scatter, send, recv);
  c.op = op;
  detail::submit_buffer(comm, detail::on_stream(comm, c, stream));
}
/// @brief all_reduce on `stream`, returning a handle whose wait() blocks the host until it is done.
template <class T>
CollectiveHandle all_reduce_async(Communicator& comm, std::span<T> data, ReduceOp op, cudaStream_t stream) {
  auto c = detail::buffer_call<T>(BufferOp::all_reduce, std::span<const T>(data), data);
  c.op = op, c.async = true;
  return detail::submit_buffer(comm, detail::on_stream(comm, c, stream));
}
/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, cudaStream_t)
template <class T>
void all_gather(DistributedState& state, std::span<const std::type_identity_t<T>> send, std::span<T> recv, cudaStream_t stream) {
  all_gather<T>(communicator(state), send, recv, stream);
}
/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, cudaStream_t)
template <class T>
void all_reduce(DistributedState& state, std::span<T> data, ReduceOp op, cudaStream_t stream) {
  all_reduce<T>(communicator(state), data, op, stream);
}
/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, cudaStream_t)
template <class T>
void broadcast(DistributedState& state, std::span<T> data, int root, cudaStream_t stream) {
  broadcast<T>(communicator(state), data, root, stream);
}
/// @copydoc all_gather(Communicator&, std::span<const std::type_identity_t<T>>, std::span<T>, cudaStream_t)
template <class T>
void reduce_scatter(DistributedState& state, std::span<const std::type_identity_t<T>> send, std::span<T> recv, ReduceOp op,
                    cudaStream_t stream) {
  reduce_scatter<T>(communicator(state), send, recv, op, stream);
}
#endif
///@}

ACCEL_NAMESPACE_END
