// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file objective.hpp
/// @brief The speed objective: a device map that streams the fewest weight bytes per forward
///        pass within the budgets a fit map used, with what it costs beside the fit map.
///
/// A map with cpu or disk entries copies those weights to the execution GPU (PlanResult::execution)
/// on every forward pass. The speed objective places the same units under the same budgets
/// and no-split rules, but:
/// - an input embedding not tied to an output layer leaves the GPUs first: a pass reads only the
///   rows of its token ids (DispatchedModel::read_rows), so it costs no table copy (counted as 0);
/// - the largest-layer reserve (gpu_reserve_layers × the largest layer) is kept only on the
///   execution GPU and only for layers actually offloaded; none when nothing streams;
/// - GPUs are packed fuller (several packings are tried; the cheapest is kept), cpu before disk,
///   tied tensors together, blocks whole;
/// - without a GPU (a process that computes on the CPU, reading what is on disk on every pass),
///   the same packing over cpu and disk: largest first into the cpu budget, and the row-read
///   embedding to disk before any layer (its rows are read from there), so host memory holds
///   the layers that are read whole.
/// The fit map is always a candidate: the speed map never streams more bytes, and is checked
/// against every budget before it is kept.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/plan_options.hpp>
#include <accel/plan/detail/speed_placement.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Parses transfer rates: "cpu=25GB/s,disk=3GB/s" (either key may be left out and keeps
///        its value from `defaults`). Units GB/s and MB/s (powers of 10), GiB/s and MiB/s (powers
///        of 2); `cpu` is the host → GPU rate, `disk` the offload folder's read rate.
/// @throws accel::config_error naming the piece that is wrong and how to write it
[[nodiscard]] inline Bandwidths parse_bandwidths(std::string_view text, Bandwidths defaults = {}) {
  struct Unit {
    std::string_view suffix;
    double factor;
  };
  static constexpr Unit units[] = {{"GiB/s", 1073741824.0}, {"MiB/s", 1048576.0}, {"GB/s", 1e9}, {"MB/s", 1e6}};
  const auto bad = [&](std::string_view piece, std::string_view why) {
    detail::throw_error<config_error>("bandwidth '", piece, "' in '", text, "' ", why,
                                      "; write cpu=RATE,disk=RATE with RATE like 25GB/s, 3.5GiB/s or 800MB/s");
  };
  if (text::trim(text).empty()) bad(text, "is empty");
  Bandwidths out = defaults;
  bool seen_cpu = false, seen_disk = false;
  for (std::size_t start = 0; start <= text.size();) {
    const auto comma = text.find(',', start);
    const auto piece = text::trim(text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    start = comma == std::string_view::npos ? text.size() + 1 : comma + 1;
    const auto eq = piece.find('=');
    if (eq == std::string_view::npos) bad(piece, "has no '='");
    const auto key = text::trim(piece.substr(0, eq)), value = text::trim(piece.substr(eq + 1));
    if (key != "cpu" && key != "disk") bad(piece, "names neither cpu nor disk");
    if ((key == "cpu" && seen_cpu) || (key == "disk" && seen_disk)) bad(piece, "repeats a key");
    const Unit* unit = nullptr;
    for (const auto& u : units)
      if (value.size() > u.suffix.size() && value.ends_with(u.suffix)) unit = &u;
    if (!unit) bad(piece, "has no unit GB/s, GiB/s, MB/s or MiB/s");
    const std::string number(text::trim(value.substr(0, value.size() - unit->suffix.size())));
    char* end = nullptr;
    const double v = std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() || !(v > 0) || v > 1e6 ||
        number.find_first_of("xXnNiI") != std::string::npos)
      bad(piece, "is not a positive number with a unit");
    (key == "cpu" ? out.host_to_device : out.disk_read) = v * unit->factor;
    (key == "cpu" ? seen_cpu : seen_disk) = true;
  }
  return out;
}

namespace detail {
// Whether tensor `t` is the weight of an input embedding module (the structure and names
// row_read_embeddings describes), whatever it is tied to.
inline bool input_embedding_weight(const ModuleTree& tree, std::size_t t) {
  const auto& tens = tree.tensors();
  const auto& mod = tree.modules()[tens[t].module];
  if (tens[t].module == 0 || !mod.children.empty() || !input_embedding_local_name(mod.name)) return false;
  if (!mod.class_name.empty() && !names_an_embedding(mod.class_name)) return false;
  return mod.parameters.size() == 1 && mod.parameters[0] == t && tens[t].shape.size() == 2 && !tens[t].buffer &&
         tens[t].name.ends_with(".weight");
}
}  // namespace detail

/// @brief Which tensors are input embeddings a forward pass reads by rows.
///
/// A module without children whose local name is one transformers gives token embeddings
/// (`embed_tokens`, `wte`, `word_embeddings`, `shared`, `embed_in`, `tok_embeddings`,
/// `token_embedding`, `word_embedding`), whose class, when known, names an embedding
/// (`Embedding`, `LlamaEmbedding`, `Gemma3TextScaledWordEmbedding`, ...), and whose only parameter
/// is a 2-D `weight`. A weight tied to anything but such embeddings (an LM head: GPT-2, Gemma, T5)
/// is read whole by that module, so it is not row-read.
/// @return one flag per tensor id (every name of a row-read tensor is flagged)
[[nodiscard]] inline std::vector<bool> row_read_embeddings(const ModuleTree& tree) {
  const auto& tens = tree.tensors();
  std::vector<bool> out(tens.size(), false);
  auto embedding_weight = [&](std::size_t t) { return detail::input_embedding_weight(tree, t); };
  std::vector<bool> tied(tens.size(), false);
  const auto index = tree.index();
  for (const auto& group : index->tied_groups) {
    const bool all = std::all_of(group.begin(), group.end(), [&](auto t) { return embedding_weight(t); });
    for (auto t : group) {
      tied[t] = true;
      out[t] = all;
    }
  }
  for (std::size_t t = 0; t < tens.size(); ++t)
    if (!tied[t]) out[t] = embedding_weight(t);
  return out;
}

namespace detail {
// streaming_cost with the row-read flags already computed (row_read_embeddings), for callers that
// cost several maps of one tree.
inline StreamingCost streaming_cost(const ModuleTree& tree, const ModuleSizes& sizes, const DeviceMap& map,
                                    const PlanOptions& opts, const std::vector<bool>& row_read) {
  StreamingCost c;
  const auto index = tree.index();
  const auto placements = map.devices();
  const bool gpu = std::any_of(placements.begin(), placements.end(), [](const Placement& p) { return p.is_gpu(); });
  for (std::size_t t = 0; t < tree.tensors().size(); ++t) {
    if (index->canonical[t] != t || sizes.tensor[t] == 0) continue;
    const auto& ten = tree.tensors()[t];
    const auto p = map.placement_of(ten.name);
    if (!p || p->is_gpu() || (ten.buffer && !opts.offload_buffers)) continue;
    if (row_read[t]) c.row_read += sizes.tensor[t];
    else if (p->is_disk()) c.from_disk += sizes.tensor[t];
    else if (gpu) c.from_cpu += sizes.tensor[t];
  }
  const auto& bw = opts.bandwidths;
  c.seconds = static_cast<double>(c.from_cpu) / bw.host_to_device + static_cast<double>(c.from_disk) / bw.disk_read +
              (gpu ? static_cast<double>(c.from_disk) / bw.host_to_device : 0.0);
  return c;
}
}  // namespace detail

/// @brief What `map` streams per forward pass (see StreamingCost for what is counted).
/// @param sizes compute_module_sizes(tree, size_options(opts))
/// @param opts offload_buffers and bandwidths are read
[[nodiscard]] inline StreamingCost streaming_cost(const ModuleTree& tree, const ModuleSizes& sizes, const DeviceMap& map,
                                                  const PlanOptions& opts) {
  return detail::streaming_cost(tree, sizes, map, opts, row_read_embeddings(tree));
}

namespace detail {
// Bytes a set of tensors takes packed as the loader packs an arena or a fetch buffer (each at a
// multiple of 256 bytes, in an order these sizes do not fix): at most each size rounded up to 256,
// less the smallest rounding (whichever comes last is not padded); a lone tensor takes its size.
class PackedBytes {
 public:
  void add(std::uint64_t bytes) {
    if (bytes == 0) return;  // empty tensors take no room
    const std::uint64_t rounded = (bytes + 255) / 256 * 256;
    rounded_ += rounded;
    least_pad_ = std::min(least_pad_, rounded - bytes);
  }
  [[nodiscard]] std::uint64_t bound() const noexcept { return rounded_ ? rounded_ - least_pad_ : 0; }

 private:
  std::uint64_t rounded_ = 0, least_pad_ = 255;
};

// What a map puts on each GPU and the largest layer it leaves on cpu or disk, counted as the
// loader packs them (an arena per map key on a GPU; a fetch buffer per layer): every tensor a
// checkpoint holds (shared ones once; not the non-persistent buffers the model computes, which no
// checkpoint holds and the loader never places).
struct MapFootprint {
  bool any_gpu = false;                   // some weight is on a GPU
  std::map<int, std::uint64_t> gpu_bytes; // packed bytes per GPU (only when something is offloaded)
  std::string largest;                    // the largest offloaded layer (layer_of), first in model order on ties
  std::uint64_t largest_bytes = 0;        // its packed bytes
};

// `row_read`: tensors a forward pass reads by rows (left out of the fetch buffers), or nullptr.
inline MapFootprint map_footprint(const ModuleTree& tree, const ModuleSizes& sizes, const DeviceMap& map,
                                  const std::vector<bool>* row_read) {
  MapFootprint f;
  bool any_off = false;
  for (const auto& [key, where] : map) (where.is_gpu() ? f.any_gpu : any_off) = true;
  if (!f.any_gpu || !any_off) return f;  // runs on the CPU, or nothing is fetched
  const auto index = tree.index();
  std::unordered_map<const DeviceMap::Entry*, PackedBytes> arenas;  // by the GPU key holding them
  std::unordered_map<std::string_view, PackedBytes> layers;        // offloaded, by layer
  std::vector<std::string_view> layer_order;
  for (std::size_t t = 0; t < tree.tensors().size(); ++t) {
    const auto& ten = tree.tensors()[t];
    if (index->canonical[t] != t || sizes.tensor[t] == 0 || (ten.buffer && !ten.persistent)) continue;
    const auto* key = map.covering(ten.name);
    if (!key) continue;
    if (key->second.is_gpu()) {
      arenas[key].add(sizes.tensor[t]);
    } else if (!row_read || !(*row_read)[t]) {
      const auto [it, fresh] = layers.try_emplace(layer_of(ten.name));
      if (fresh) layer_order.push_back(it->first);
      it->second.add(sizes.tensor[t]);
    }
  }
  for (const auto& [key, bytes] : arenas) f.gpu_bytes[key->second.index] += bytes.bound();
  for (const auto layer : layer_order)
    if (const auto bytes = layers.at(layer).bound(); bytes > f.largest_bytes) {
      f.largest_bytes = bytes;
      f.largest = std::string(layer);
    }
  return f;
}

// The GPU that runs the offloaded layers and how many fetch buffers it has room for (see
// ExecutionPlan): `reserve_gpu` (where the plan kept its reserve) first, then the other GPUs of
// `budgets` in order; GPUs with a budget of 0 take nothing. Room is the budget less the packed
// weights on the GPU. None with room for one buffer: the first candidate with 0 slots (not loadable).
inline ExecutionPlan choose_execution(const MapFootprint& f, std::optional<int> reserve_gpu, const MaxMemory& budgets,
                                      std::uint32_t wanted) {
  ExecutionPlan e;
  if (!f.any_gpu) return e;
  std::vector<int> candidates;
  if (reserve_gpu && budgets.gpus.count(*reserve_gpu) && budgets.gpus.at(*reserve_gpu) > 0) candidates.push_back(*reserve_gpu);
  for (const auto& [gpu, bytes] : budgets.gpus)
    if (bytes > 0 && gpu != reserve_gpu) candidates.push_back(gpu);
  if (candidates.empty()) {  // not a map of these budgets: its lowest GPU, as the loader would take
    for (const auto& [gpu, bytes] : f.gpu_bytes) candidates.push_back(gpu);
    if (candidates.empty() && reserve_gpu) candidates.push_back(*reserve_gpu);
  }
  e.gpu = candidates.empty() ? std::optional<int>() : std::optional<int>(candidates.front());
  e.fetch_buffer_bytes = f.largest_bytes;
  e.largest_offloaded_layer = f.largest;
  if (f.largest_bytes == 0) return e;
  wanted = std::max<std::uint32_t>(wanted, 1);
  for (const int gpu : candidates) {
    const auto budget = budgets.gpus.count(gpu) ? budgets.gpus.at(gpu) : 0;
    const auto used = f.gpu_bytes.count(gpu) ? f.gpu_bytes.at(gpu) : 0;
    const auto room = budget > used ? budget - used : 0;
    const auto fits = static_cast<std::uint32_t>(std::min<std::uint64_t>(wanted, room / f.largest_bytes));
    if (fits > e.fetch_slots) {
      e.gpu = gpu;
      e.fetch_slots = fits;
    }
    if (fits == wanted) break;
  }
  return e;
}

// Why `e` cannot be loaded, or holds fewer buffers than asked: per GPU its room.
inline std::string fetch_room_note(const ExecutionPlan& e, const MapFootprint& f, const MaxMemory& budgets,
                                   std::uint32_t wanted) {
  std::string rooms;
  for (const auto& [gpu, budget] : budgets.gpus) {
    const auto used = f.gpu_bytes.count(gpu) ? f.gpu_bytes.at(gpu) : 0;
    rooms += concat(rooms.empty() ? "" : ", ", "GPU ", gpu, " has ", text::format_bytes(budget > used ? budget - used : 0),
                    " left of its ", text::format_bytes(budget), " budget");
  }
  const std::string layer = concat("'", e.largest_offloaded_layer, "' (", text::format_bytes(e.fetch_buffer_bytes),
                                   ", the largest layer left on cpu or disk)");
  if (!e.loadable())
    return concat("no GPU has room for a fetch buffer of ", layer, ", which a forward pass copies to the execution GPU: ",
                  rooms, "; raise a GPU's budget (max_memory, --max-memory), or try the speed objective "
                  "(PlanObjective::speed, --objective speed), whose packing keeps that room on the execution GPU");
  return concat("GPU ", *e.gpu, " has room for ", e.fetch_slots, " of the ", wanted, " fetch buffers of ", layer, " (", rooms,
                "), so prefetch overlaps less; raise a GPU's budget to keep room for all of them");
}

// Sets plan.execution for `budgets` (the GPUs' budgets as given, times budget_scale). A plan that
// cannot be loaded is a planning_error when opts.require_fetch_room, else a warning.
inline void plan_execution(const ModuleTree& tree, const ModuleSizes& sizes, PlanResult& plan, const MaxMemory& budgets,
                           const PlanOptions& opts) {
  std::optional<int> reserve_gpu;
  for (const auto& d : plan.devices)
    if (d.device.is_gpu() && (d.main || !reserve_gpu)) {
      reserve_gpu = d.device.index;
      if (d.main) break;
    }
  const auto row_read = plan.objective == PlanObjective::speed ? row_read_embeddings(tree) : std::vector<bool>();
  const auto footprint = map_footprint(tree, sizes, plan.device_map, row_read.empty() ? nullptr : &row_read);
  const auto wanted = std::max<std::uint32_t>(opts.gpu_reserve_layers, 1);
  plan.execution = choose_execution(footprint, reserve_gpu, budgets, wanted);
  const auto& e = plan.execution;
  if (e.loadable() && (e.fetch_buffer_bytes == 0 || e.fetch_slots == wanted)) return;
  auto note = fetch_room_note(e, footprint, budgets, wanted);
  if (!e.loadable() && opts.require_fetch_room) throw_error<planning_error>("cannot load this map: ", note);
  plan.warnings.push_back(std::move(note));
}
}  // namespace detail

/// @brief The speed objective's map and how it compares with the fit map.
struct SpeedPlan {
  PlanResult plan;                 ///< the map kept for speed: a better one, or the fit map itself
  ObjectiveComparison comparison;  ///< both maps' cost and what moved
};

namespace detail {
// True when `a` streams less than `b`: no more bytes, no more time, and less of one.
inline bool cheaper(const StreamingCost& a, const StreamingCost& b) {
  const bool time_ok = a.seconds <= b.seconds * (1 + 1e-12);
  return a.streamed() <= b.streamed() && time_ok && (a.streamed() < b.streamed() || a.seconds < b.seconds * (1 - 1e-12));
}

// Why the packing moved one unit, relative to the fit map.
inline std::string move_reason(bool row_read, Placement from, Placement to, const std::string& room_freed) {
  if (row_read && !to.is_gpu()) return "input embedding: rows are read, not the table";
  if (to.is_gpu() && !from.is_gpu()) return "room freed by " + room_freed;
  if (to.is_gpu()) return "GPUs repacked to hold more";
  if (from.is_gpu()) return "its GPU room holds larger layers that would otherwise stream";
  if (to.is_cpu()) return "host before disk: cpu room freed";
  return "cpu room given to larger layers";
}
}  // namespace detail

/// @brief Plans for the speed objective within the budgets `fit` was placed with, and compares.
/// @param sizes compute_module_sizes(tree, size_options(opts))
/// @param opts the options `fit` was planned with (budgets are taken from fit.budgets: after
///        balancing and budget_scale); gpu_reserve_layers, offload_buffers, no-split rules and
///        bandwidths are read
/// @param fit the fit map (plan_device_map with PlanObjective::fit)
/// @return the map kept (`fit` unchanged when no packing streams less) and both costs; a map of its
///         own comes with its PlanResult::execution within fit.budgets, and only where every fetch
///         buffer fits there (plan_device_map then sets it for the budgets as given)
/// @code
/// auto fit = accel::plan_device_map(tree, sizes, accel::DeviceMapMode::automatic, opts);
/// auto speed = accel::plan_speed_objective(tree, sizes, opts, fit);
/// std::printf("%llu bytes per pass instead of %llu\n", speed.comparison.speed.streamed(), speed.comparison.fit.streamed());
/// @endcode
[[nodiscard]] inline SpeedPlan plan_speed_objective(const ModuleTree& tree, const ModuleSizes& sizes, const PlanOptions& opts,
                                                    const PlanResult& fit) {
  PlanOptions o = opts;
  o.max_memory = fit.budgets;
  o.verbose = nullptr;
  const auto row_read = row_read_embeddings(tree);
  SpeedPlan out{fit, {}};
  out.plan.objective = PlanObjective::speed;
  auto& cmp = out.comparison;
  cmp.bandwidths = o.bandwidths;
  cmp.fit = detail::streaming_cost(tree, sizes, fit.device_map, o, row_read);
  cmp.speed = cmp.fit;
  for (std::size_t t = 0; t < row_read.size(); ++t)
    if (row_read[t] && tree.index()->canonical[t] == t) cmp.row_read.push_back(tree.tensors()[t].name);
  if (cmp.fit.streamed() == 0 || (o.max_memory.gpus.empty() && !o.max_memory.cpu)) return out;

  const detail::SpeedPacking packing(tree, sizes, o, row_read);
  const auto& devices = packing.devices();
  const std::uint64_t layers = std::max<std::uint64_t>(o.gpu_reserve_layers, 1);
  std::optional<detail::SpeedAssignment> best;
  DeviceMap best_map;
  std::uint64_t best_reserve = 0, best_disk_reserve = 0;
  for (const auto reserve : packing.reserve_candidates())
    for (const bool by_size : {true, false})
      for (const bool row_read_off : {true, false}) {
        auto a = packing.pack(reserve, by_size, row_read_off);
        if (!a) continue;
        // The budgets, checked on the result: the execution GPU (for this objective the lowest GPU
        // holding anything) keeps room for the largest layer that streams, cpu for the largest one on disk.
        const auto [used, buffers] = packing.usage(*a);
        const auto gpu_reserve = packing.largest_layer_off_gpus(*a, false) * layers;
        const auto on_disk = packing.largest_layer_off_gpus(*a, true);
        const auto disk_reserve = on_disk > 0 && packing.cpu_keeps_reserve() ? on_disk : 0;
        bool ok = true, exec_seen = false;
        for (std::size_t d = 0; d < devices.size(); ++d) {
          std::uint64_t need = used[d];
          if (devices[d].is_gpu() && used[d] > 0 && !exec_seen) {
            need += gpu_reserve;
            exec_seen = true;
          }
          if (devices[d].is_cpu()) need += disk_reserve;
          ok = ok && need <= static_cast<std::uint64_t>(packing.budget(d));
        }
        if (!ok) continue;
        auto map = packing.to_map(*a);
        const auto cost = detail::streaming_cost(tree, sizes, map, o, row_read);
        if (!detail::cheaper(cost, cmp.speed)) continue;
        // The loader's check of the same room (ExecutionPlan): each tensor packed as it packs them,
        // buffers too. A map whose every fetch buffer does not fit is no better than the fit map.
        std::optional<int> exec_gpu;
        for (std::size_t d = 0; d < devices.size() && !exec_gpu; ++d)
          if (devices[d].is_gpu() && used[d] > 0) exec_gpu = devices[d].index;
        const auto exec = detail::choose_execution(detail::map_footprint(tree, sizes, map, &row_read), exec_gpu, o.max_memory,
                                                   static_cast<std::uint32_t>(layers));
        if (exec.fetch_buffer_bytes > 0 && exec.fetch_slots < layers) continue;
        cmp.speed = cost;
        best = std::move(a);
        best_map = std::move(map);
        best_reserve = gpu_reserve;
        best_disk_reserve = disk_reserve;
      }
  if (!best) return out;

  // The plan: same devices and budgets as the fit plan, this map's accounting.
  PlanResult& r = out.plan;
  r.device_map = std::move(best_map);
  r.warnings.clear();
  r.info.clear();
  const auto [used, buffers] = packing.usage(*best);
  std::optional<std::size_t> exec;
  r.devices.clear();
  for (std::size_t d = 0; d < devices.size(); ++d) {
    DevicePlan p;
    p.device = devices[d];
    if (!devices[d].is_disk() || o.max_memory.disk) p.budget = static_cast<std::uint64_t>(packing.budget(d));
    p.placed = used[d];
    p.buffers = o.offload_buffers ? 0 : buffers[d];
    if (devices[d].is_gpu() && used[d] > 0 && !exec) {
      exec = d;
      p.main = true;
      p.reserve = best_reserve;
    }
    if (devices[d].is_cpu()) {
      p.main = packing.cpu_keeps_reserve();
      p.reserve = best_disk_reserve;
    }
    r.devices.push_back(std::move(p));
  }
  for (const auto& [key, where] : r.device_map)
    for (auto& p : r.devices)
      if (p.device == where) p.modules.push_back(key);
  r.execution = detail::choose_execution(detail::map_footprint(tree, sizes, r.device_map, &row_read),
                                         exec ? std::optional<int>(devices[*exec].index) : std::nullopt, o.max_memory,
                                         static_cast<std::uint32_t>(layers));
  cmp.speed_map_differs = true;

  // Why each unit moved: what the fit map spent GPU room on that this one does not.
  std::uint64_t embedding_freed = 0, fit_reserve = 0, fit_gap = 0;
  std::vector<std::string> embeddings;
  for (const auto& p : fit.devices)
    if (p.device.is_gpu()) {
      if (p.main) fit_reserve = p.reserve;
      if (p.budget && *p.budget > p.placed + (p.main ? p.reserve : 0)) fit_gap += *p.budget - p.placed - (p.main ? p.reserve : 0);
    }
  const auto& atoms = packing.atoms();
  std::vector<std::pair<std::uint32_t, Placement>> fit_moved;  // atom, fit placement
  for (std::uint32_t a = 0; a < atoms.size(); ++a) {
    const auto name = packing.atom_name(a);
    const auto& item = packing.items()[packing.item_of_atom(a)];
    if (item.bytes == 0) continue;
    const auto from = fit.device_map.placement_of(name);
    const auto to = devices[static_cast<std::size_t>(best->device[packing.item_of_atom(a)])];
    if (!from || *from == to) continue;
    if (item.row_read && from->is_gpu() && !to.is_gpu()) {
      embedding_freed += item.bytes;
      embeddings.push_back(name);
    }
    fit_moved.emplace_back(a, *from);
  }
  std::vector<std::string> parts;
  if (embedding_freed)
    parts.push_back(text::quoted_list(embeddings) + " leaving the GPUs (" + text::format_bytes(embedding_freed) + ")");
  if (exec && fit_reserve > best_reserve)
    parts.push_back("the reserve on GPU " + devices[*exec].to_string() + " shrinking from " + text::format_bytes(fit_reserve) + " to " +
                    text::format_bytes(best_reserve));
  if (fit_gap) parts.push_back(text::format_bytes(fit_gap) + " the fit map left unused on the GPUs");
  std::string room;
  for (std::size_t k = 0; k < parts.size(); ++k) room += (k ? (k + 1 == parts.size() ? " and " : ", ") : "") + parts[k];
  if (room.empty()) room = "a tighter packing";
  for (const auto& [a, from] : fit_moved) {
    const auto& item = packing.items()[packing.item_of_atom(a)];
    const auto to = devices[static_cast<std::size_t>(best->device[packing.item_of_atom(a)])];
    cmp.moves.push_back({packing.atom_name(a), from, to, detail::move_reason(item.row_read, from, to, room)});
  }
  return out;
}

ACCEL_NAMESPACE_END
