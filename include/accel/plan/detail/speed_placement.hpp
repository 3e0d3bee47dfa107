// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file speed_placement.hpp
/// @brief The speed objective's packing: which units go on the GPUs so that the fewest weight
///        bytes stream per forward pass. Include <accel/plan/objective.hpp> instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/text.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/plan_options.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

// Local names an untied input embedding goes by in transformers' models (token ids → rows).
inline bool input_embedding_local_name(std::string_view module) {
  const auto dot = module.rfind('.');
  const auto local = dot == std::string_view::npos ? module : module.substr(dot + 1);
  for (std::string_view n : {"embed_tokens", "wte", "word_embeddings", "shared", "embed_in", "tok_embeddings",
                             "token_embedding", "word_embedding"})
    if (local == n) return true;
  return false;
}

// A class name containing "embedding", any case (Embedding, LlamaEmbedding, ScaledWordEmbedding).
inline bool names_an_embedding(std::string_view class_name) {
  constexpr std::string_view word = "embedding";
  for (std::size_t i = 0; i + word.size() <= class_name.size(); ++i) {
    std::size_t k = 0;
    while (k < word.size() && (class_name[i + k] | 0x20) == word[k]) ++k;
    if (k == word.size()) return true;
  }
  return false;
}

// One placement unit of the speed packing: atoms (blocks, leaf modules, loose tensors of split
// modules) joined by ties, so tied tensors always share a device.
struct SpeedItem {
  std::vector<std::uint32_t> atoms;  // atom ids, model order
  std::uint64_t bytes = 0;           // counted against a budget: weights and buffers
  std::uint64_t buffers = 0;         // buffer bytes among them
  std::uint64_t streamed = 0;        // what crosses to the GPU per pass when it is off the GPUs
  std::uint64_t layer = 0;           // the largest layer (layer_of, all of it; the loader's fetch unit is this or a deeper map key, never coarser) it belongs to
  bool row_read = false;             // only row-read input embeddings (free anywhere)
};

// An atom: a module moved whole or a loose tensor.
struct SpeedAtom {
  std::uint32_t id = 0;  // module id or tensor id
  bool module = true;
  std::uint32_t rank = 0;
};

// Where each item goes; device indexes follow SpeedPacking::devices.
struct SpeedAssignment {
  std::vector<std::int32_t> device;  // per item
};

// The packing problem for one tree, its sizes and the budgets, built once and solved for several
// reserve sizes.
class SpeedPacking {
 public:
  SpeedPacking(const ModuleTree& tree, const ModuleSizes& sizes, const PlanOptions& opts, const std::vector<bool>& row_read)
      : tree_(tree), index_(tree.index()), ix_(*index_), sizes_(sizes), opts_(opts), row_read_(row_read) {
    collect_atoms();
    collect_items();
    collect_devices();
  }

  [[nodiscard]] const std::vector<SpeedAtom>& atoms() const noexcept { return atoms_; }
  [[nodiscard]] const std::vector<SpeedItem>& items() const noexcept { return items_; }
  [[nodiscard]] const std::vector<Placement>& devices() const noexcept { return devices_; }
  [[nodiscard]] std::uint32_t item_of_atom(std::uint32_t a) const { return atom_item_[a]; }
  [[nodiscard]] std::string atom_name(std::uint32_t a) const {
    const auto& at = atoms_[a];
    return at.module ? tree_.modules()[at.id].name : tree_.tensors()[at.id].name;
  }

  // Distinct layer sizes of the items that stream, smallest first, with 0: the reserves to try.
  [[nodiscard]] std::vector<std::uint64_t> reserve_candidates() const {
    std::vector<std::uint64_t> out{0};
    for (const auto& it : items_)
      if (it.streamed > 0) out.push_back(it.layer);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // Packs the GPUs keeping room for `layers` × `reserve` on the execution GPU (the lowest one with
  // a budget): items whose layer exceeds `reserve` must be on a GPU. `by_size` packs largest first
  // (first-fit decreasing), else in model order. `row_read_off` sends row-read embeddings to cpu or
  // disk first. Returns nothing when the items that must stay on the GPUs do not fit.
  [[nodiscard]] std::optional<SpeedAssignment> pack(std::uint64_t reserve, bool by_size, bool row_read_off) const {
    const std::uint64_t layers = std::max<std::uint64_t>(opts_.gpu_reserve_layers, 1);
    std::vector<std::int64_t> room(devices_.size(), 0);
    std::optional<std::size_t> exec;
    for (std::size_t d = 0; d < devices_.size(); ++d) {
      room[d] = budget_[d];
      if (devices_[d].is_gpu() && budget_[d] > 0 && !exec) exec = d;
    }
    if (exec) {
      room[*exec] -= clamp(reserve * layers);
      if (room[*exec] < 0) return std::nullopt;
    }
    SpeedAssignment out;
    out.device.assign(items_.size(), -1);
    std::vector<std::uint32_t> order(items_.size());
    std::iota(order.begin(), order.end(), 0u);
    auto must_stay = [&](std::uint32_t i) { return items_[i].streamed > 0 && items_[i].layer > reserve; };
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      if (must_stay(a) != must_stay(b)) return must_stay(a);
      return by_size && items_[a].bytes > items_[b].bytes;
    });
    std::vector<std::uint32_t> off;
    for (const auto i : order) {
      const auto& it = items_[i];
      if (it.row_read && row_read_off) continue;
      bool placed = false;
      for (std::size_t d = 0; d < devices_.size() && !placed; ++d)
        if (devices_[d].is_gpu() && clamp(it.bytes) <= room[d]) {
          room[d] -= clamp(it.bytes);
          out.device[i] = static_cast<std::int32_t>(d);
          placed = true;
        }
      if (placed) continue;
      if (must_stay(i)) return std::nullopt;
      off.push_back(i);
    }
    if (!place_off_gpus(off, room, out, row_read_off)) return std::nullopt;
    return out;
  }

  // Per-device bytes placed and buffers, from an assignment.
  [[nodiscard]] std::pair<std::vector<std::uint64_t>, std::vector<std::uint64_t>> usage(const SpeedAssignment& a) const {
    std::vector<std::uint64_t> used(devices_.size(), 0), buffers(devices_.size(), 0);
    for (std::size_t i = 0; i < items_.size(); ++i) {
      used[static_cast<std::size_t>(a.device[i])] += items_[i].bytes;
      buffers[static_cast<std::size_t>(a.device[i])] += items_[i].buffers;
    }
    return {used, buffers};
  }

  // The device map of an assignment: a module whose tensors all share a device is one key
  // (clean_device_map's merge), otherwise its direct tensors and children; model order.
  [[nodiscard]] DeviceMap to_map(const SpeedAssignment& a) const {
    const auto& mods = tree_.modules();
    const auto& tens = tree_.tensors();
    std::vector<std::int32_t> tensor_device(tens.size(), -1);
    std::vector<std::int32_t> module_device(mods.size(), -1);  // -1 no tensor, -2 mixed
    auto merge = [](std::int32_t& into, std::int32_t d) {
      if (into == -1) into = d;
      else if (into != d) into = -2;
    };
    for (std::size_t t = 0; t < tens.size(); ++t) {
      tensor_device[t] = a.device[atom_item_[tensor_atom_[t]]];
      merge(module_device[ix_.tensor_module[t]], tensor_device[t]);
    }
    for (std::size_t m = mods.size(); m-- > 1;)
      if (module_device[m] != -1) merge(module_device[ix_.module_parent[m]], module_device[m]);
    std::vector<std::pair<std::uint32_t, std::pair<std::string, std::int32_t>>> keys;  // (rank, key)
    std::vector<std::size_t> stack{0};
    while (!stack.empty()) {
      const auto m = stack.back();
      stack.pop_back();
      if (module_device[m] >= 0) {
        keys.push_back({ix_.module_rank[m], {mods[m].name, module_device[m]}});
        continue;
      }
      for (auto t : mods[m].parameters) keys.push_back({ix_.tensor_rank[t], {tens[t].name, tensor_device[t]}});
      for (auto t : mods[m].buffers) keys.push_back({ix_.tensor_rank[t], {tens[t].name, tensor_device[t]}});
      for (auto c : mods[m].children)
        if (module_device[c] != -1) stack.push_back(c);
    }
    std::sort(keys.begin(), keys.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    DeviceMap map;
    map.reserve(keys.size());
    for (auto& [rank, key] : keys) map.set(std::move(key.first), devices_[static_cast<std::size_t>(key.second)]);
    return map;
  }

  // The largest layer (layer_of) by its streamed bytes off the GPUs (or on disk only), summed
  // over what sits there: the loader fetches a layer's offloaded tensors into one buffer.
  [[nodiscard]] std::uint64_t largest_layer_off_gpus(const SpeedAssignment& a, bool disk_only) const {
    std::vector<std::uint64_t> per_unit(unit_count_, 0);
    std::uint64_t best = 0;
    for (std::size_t t = 0; t < tree_.tensors().size(); ++t) {
      if (!streams(t)) continue;
      const auto d = a.device[atom_item_[tensor_atom_[t]]];
      const auto& where = devices_[static_cast<std::size_t>(d)];
      if (where.is_gpu() || (disk_only && !where.is_disk())) continue;
      best = std::max(best, per_unit[tensor_unit_[t]] += sizes_.tensor[t]);
    }
    return best;
  }

  [[nodiscard]] std::int64_t budget(std::size_t d) const { return budget_[d]; }
  [[nodiscard]] bool cpu_keeps_reserve() const { return !(opts_.max_memory.disk && *opts_.max_memory.disk == 0); }

 private:
  static constexpr std::int64_t unbounded = std::numeric_limits<std::int64_t>::max() / 4;
  static std::int64_t clamp(std::uint64_t v) { return static_cast<std::int64_t>(std::min<std::uint64_t>(v, unbounded)); }

  // A canonical tensor whose bytes cross to the GPU when it is off the GPUs.
  [[nodiscard]] bool streams(std::size_t t) const {
    if (ix_.canonical[t] != t || row_read_[t] || sizes_.tensor[t] == 0) return false;
    return opts_.offload_buffers || !ix_.tensor_buffer[t];
  }

  // Atoms in model order: blocks and modules without children whole, the direct tensors of every
  // other module alone (the finest split the fit planner can make too).
  void collect_atoms() {
    const NoSplitRule rule{opts_.no_split, opts_.auto_no_split};
    const auto& mods = tree_.modules();
    tensor_atom_.assign(tree_.tensors().size(), 0);
    std::vector<std::size_t> stack{0};
    auto add_tensor = [&](std::size_t t) {
      tensor_atom_[t] = static_cast<std::uint32_t>(atoms_.size());
      atoms_.push_back({static_cast<std::uint32_t>(t), false, ix_.tensor_rank[t]});
    };
    std::vector<std::uint32_t> module_atom(mods.size(), UINT32_MAX);
    while (!stack.empty()) {
      const auto m = stack.back();
      stack.pop_back();
      if (m != 0 && (mods[m].children.empty() || rule.matches(tree_, m))) {
        module_atom[m] = static_cast<std::uint32_t>(atoms_.size());
        atoms_.push_back({static_cast<std::uint32_t>(m), true, ix_.module_rank[m]});
        continue;
      }
      for (auto t : mods[m].parameters) add_tensor(t);
      for (auto t : mods[m].buffers) add_tensor(t);
      for (auto c = mods[m].children.rbegin(); c != mods[m].children.rend(); ++c) stack.push_back(*c);
    }
    // Modules precede their children in id order, so an atom's descendants inherit it.
    for (std::size_t m = 1; m < mods.size(); ++m)
      if (module_atom[m] == UINT32_MAX) module_atom[m] = module_atom[ix_.module_parent[m]];
    for (std::size_t t = 0; t < tree_.tensors().size(); ++t)
      if (const auto a = module_atom[ix_.tensor_module[t]]; a != UINT32_MAX) tensor_atom_[t] = a;
    std::vector<std::uint32_t> order(atoms_.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](auto x, auto y) { return atoms_[x].rank < atoms_[y].rank; });
    std::vector<std::uint32_t> renumber(atoms_.size());
    std::vector<SpeedAtom> sorted;
    for (std::uint32_t k = 0; k < order.size(); ++k) {
      renumber[order[k]] = k;
      sorted.push_back(atoms_[order[k]]);
    }
    atoms_ = std::move(sorted);
    for (auto& a : tensor_atom_) a = renumber[a];
  }

  // Items: atoms joined by ties (union-find), with their sizes, streamed bytes and layers.
  void collect_items() {
    std::vector<std::uint32_t> parent(atoms_.size());
    std::iota(parent.begin(), parent.end(), 0u);
    auto find = [&](std::uint32_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (const auto& group : ix_.tied_groups)
      for (std::size_t k = 1; k < group.size(); ++k) {
        const auto a = find(tensor_atom_[group[0]]), b = find(tensor_atom_[group[k]]);
        if (a != b) parent[std::max(a, b)] = std::min(a, b);  // the root is the first atom in model order
      }
    atom_item_.assign(atoms_.size(), 0);
    std::vector<std::uint32_t> item_of_root(atoms_.size(), UINT32_MAX);
    for (std::uint32_t a = 0; a < atoms_.size(); ++a) {
      const auto r = find(a);
      if (item_of_root[r] == UINT32_MAX) {
        item_of_root[r] = static_cast<std::uint32_t>(items_.size());
        items_.emplace_back();
      }
      atom_item_[a] = item_of_root[r];
      items_[atom_item_[a]].atoms.push_back(a);
    }
    // Layer units: the whole streamed size of each (the worst a reserve can need for it).
    std::unordered_map<std::string_view, std::uint32_t> unit_ids;
    tensor_unit_.assign(tree_.tensors().size(), 0);
    std::vector<std::uint64_t> unit_bytes;
    for (std::size_t t = 0; t < tree_.tensors().size(); ++t) {
      const auto [it, fresh] = unit_ids.try_emplace(layer_of(tree_.tensors()[t].name), static_cast<std::uint32_t>(unit_bytes.size()));
      if (fresh) unit_bytes.push_back(0);
      tensor_unit_[t] = it->second;
      if (streams(t)) unit_bytes[it->second] += sizes_.tensor[t];
    }
    unit_count_ = unit_bytes.size();
    std::vector<std::uint64_t> row_bytes(items_.size(), 0);
    for (std::size_t t = 0; t < tree_.tensors().size(); ++t) {
      if (ix_.canonical[t] != t) continue;
      auto& it = items_[atom_item_[tensor_atom_[t]]];
      const auto bytes = sizes_.tensor[t];
      it.bytes += bytes;
      if (ix_.tensor_buffer[t]) it.buffers += bytes;
      if (row_read_[t]) row_bytes[atom_item_[tensor_atom_[t]]] += bytes;
      if (streams(t)) {
        it.streamed += bytes;
        it.layer = std::max(it.layer, unit_bytes[tensor_unit_[t]]);
      }
    }
    for (std::size_t i = 0; i < items_.size(); ++i) items_[i].row_read = items_[i].streamed == 0 && row_bytes[i] > 0;
  }

  void collect_devices() {
    const auto& mm = opts_.max_memory;
    for (const auto& [i, b] : mm.gpus) {
      devices_.push_back(Placement::gpu(i));
      budget_.push_back(clamp(b));
    }
    if (mm.cpu) {
      devices_.push_back(Placement::cpu());
      budget_.push_back(clamp(*mm.cpu));
    }
    devices_.push_back(Placement::disk());
    budget_.push_back(mm.disk ? clamp(*mm.disk) : unbounded);
  }

  // What the GPUs did not take goes to cpu, largest first, then to disk; cpu keeps room to stage
  // the largest layer headed for disk. That layer is known only once packed, so the reserves are
  // tried from the smallest (0, then each layer size among these items): the first packing whose
  // disk layers all fit the reserve it kept is taken (the largest reserve always is one). Row-read
  // embeddings take what cpu or disk room is left.
  bool place_off_gpus(const std::vector<std::uint32_t>& off_items, std::vector<std::int64_t>& room, SpeedAssignment& out,
                      bool row_read_off) const {
    std::vector<std::uint32_t> off = off_items, rows;
    if (row_read_off)
      for (std::uint32_t i = 0; i < items_.size(); ++i)
        if (items_[i].row_read) rows.push_back(i);
    std::stable_sort(off.begin(), off.end(), [&](auto a, auto b) { return items_[a].bytes > items_[b].bytes; });
    const std::size_t disk = devices_.size() - 1;
    const std::optional<std::size_t> cpu = devices_.size() >= 2 && devices_[disk - 1].is_cpu() ? std::optional(disk - 1) : std::nullopt;
    std::uint64_t total = 0;
    std::vector<std::uint64_t> reserves{0};
    for (auto i : off) {
      total += items_[i].bytes;
      reserves.push_back(items_[i].layer);
    }
    std::sort(reserves.begin(), reserves.end());
    reserves.erase(std::unique(reserves.begin(), reserves.end()), reserves.end());
    const bool reserve_needed = cpu && clamp(total) > room[*cpu] && cpu_keeps_reserve();
    if (!reserve_needed) reserves = {0};
    for (std::size_t k = 0; k < reserves.size(); ++k) {
      std::vector<std::int64_t> r = room;
      SpeedAssignment a = out;
      if (reserve_needed) r[*cpu] -= clamp(reserves[k]);
      auto put = [&](std::uint32_t i, std::optional<std::size_t> d) {
        if (!d || clamp(items_[i].bytes) > r[*d]) return false;
        r[*d] -= clamp(items_[i].bytes);
        a.device[i] = static_cast<std::int32_t>(*d);
        return true;
      };
      bool placed = true;
      std::uint64_t largest_on_disk = 0;
      for (auto i : off) {
        if (put(i, cpu)) continue;
        if (!put(i, disk)) {
          placed = false;
          break;
        }
        largest_on_disk = std::max(largest_on_disk, items_[i].layer);
      }
      if (!placed) return false;  // disk full: a larger reserve only leaves less room
      if (largest_on_disk > reserves[k] && k + 1 < reserves.size()) continue;
      for (auto i : rows)
        if (!put(i, cpu) && !put(i, disk)) {
          // No room left off the GPUs: a GPU then.
          bool on_gpu = false;
          for (std::size_t d = 0; d < devices_.size() && !on_gpu; ++d)
            if (devices_[d].is_gpu()) on_gpu = put(i, d);
          if (!on_gpu) return false;
        }
      room = std::move(r);
      out = std::move(a);
      return true;
    }
    return false;
  }

  const ModuleTree& tree_;
  std::shared_ptr<const TreeIndex> index_;
  const TreeIndex& ix_;
  const ModuleSizes& sizes_;
  const PlanOptions& opts_;
  const std::vector<bool>& row_read_;
  std::vector<SpeedAtom> atoms_;
  std::vector<std::uint32_t> tensor_atom_;  // tensor id → atom id
  std::vector<std::uint32_t> atom_item_;    // atom id → item id
  std::vector<SpeedItem> items_;
  std::vector<std::uint32_t> tensor_unit_;  // tensor id → layer unit id
  std::size_t unit_count_ = 0;
  std::vector<Placement> devices_;          // GPUs ascending, cpu if budgeted, disk
  std::vector<std::int64_t> budget_;
};

}  // namespace detail
ACCEL_NAMESPACE_END
