// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// plan_pipeline's model side: the execution order cut into the units a stage boundary never
// splits, what a range of them costs a stage (bytes, the pass's reads, the largest unit, tied
// weights held twice), the estimate of a stage's time under its process's budgets, and the model
// of one stage alone (its modules and tensors, a tie across stages broken into copies).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/objective.hpp>
#include <accel/plan/plan_options.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

// One unit of the execution order: a no-split block, a module without children, or a tensor of a
// module that is split (the planner's units). A stage is a run of whole units.
struct StageUnit {
  std::string name;             // its device-map key
  std::optional<std::size_t> module{};  // the module it is, or
  std::optional<std::size_t> tensor{};  // the tensor it is
  std::uint64_t bytes = 0;      // weights it holds, ties across units left out (TiedAcross)
  std::uint64_t read = 0;       // of those, bytes a pass reads (row-read embeddings left out)
  std::uint64_t largest = 0;    // bytes with its tied members: what a fetch buffer takes for it
  std::uint64_t params = 0;     // parameter elements, each shared one once (at its canonical name)
};

// A tie whose names lie in several units: a stage holding any of them holds the tensor (its own
// copy when another stage holds it too).
struct TiedAcross {
  std::uint64_t bytes = 0;                  // the tensor's size
  std::vector<std::size_t> units;           // the units of its names, ascending (repeats kept)
  std::vector<bool> embedding;              // per name: an input embedding's weight
  std::vector<std::size_t> tensors;         // the names' tensor ids, same order
};

// Bytes, reads and the largest unit of a range of units.
struct RangeLoad {
  std::uint64_t bytes = 0;
  std::uint64_t read = 0;
  std::uint64_t largest = 0;
};

class StageUnits {
 public:
  StageUnits(const ModuleTree& tree, const ModuleSizes& sizes, const PlanOptions& opts) {
    const auto index = tree.index();
    const auto& ix = *index;
    const auto& mods = tree.modules();
    const auto& tens = tree.tensors();
    const NoSplitRule rule{opts.no_split, opts.auto_no_split};
    // Tensors per module subtree: modules without any are no unit (nothing to place).
    std::vector<std::size_t> held(mods.size(), 0);
    for (std::size_t t = 0; t < tens.size(); ++t) ++held[tens[t].module];
    for (std::size_t m = mods.size(); m-- > 1;) held[mods[m].parent] += held[m];
    std::vector<std::size_t> unit_of_module(mods.size(), npos_id), tensor_unit(tens.size(), npos_id);
    auto add = [&](StageUnit u) {
      units_.push_back(std::move(u));
      return units_.size() - 1;
    };
    // Model order (TreeIndex): a module, its direct parameters, its children, its direct buffers.
    std::vector<std::pair<std::size_t, bool>> stack{{0, false}};
    while (!stack.empty()) {
      const auto [m, leaving] = stack.back();
      stack.pop_back();
      const auto& mod = mods[m];
      if (leaving) {
        for (auto b : mod.buffers) tensor_unit[b] = add({tens[b].name, std::nullopt, b});
        continue;
      }
      if (m != 0 && (mod.children.empty() || rule.matches(tree, m))) {
        if (held[m]) unit_of_module[m] = add({mod.name, m, std::nullopt});
        continue;
      }
      for (auto p : mod.parameters) tensor_unit[p] = add({tens[p].name, std::nullopt, p});
      stack.emplace_back(m, true);
      for (auto c = mod.children.rbegin(); c != mod.children.rend(); ++c) stack.emplace_back(*c, false);
    }
    // A unit module's whole subtree belongs to it (parents have smaller ids than children).
    for (std::size_t m = 1; m < mods.size(); ++m)
      if (unit_of_module[m] == npos_id) unit_of_module[m] = unit_of_module[mods[m].parent];
    for (std::size_t t = 0; t < tens.size(); ++t)
      if (tensor_unit[t] == npos_id) tensor_unit[t] = unit_of_module[tens[t].module];
    unit_of_tensor_ = tensor_unit;

    const auto row_read = row_read_embeddings(tree);
    std::vector<bool> across(tens.size(), false);
    for (const auto& group : ix.tied_groups) {
      TiedAcross g;
      for (auto t : group) {
        g.units.push_back(tensor_unit[t]);
        g.embedding.push_back(input_embedding_weight(tree, t));
        g.tensors.push_back(t);
      }
      if (std::all_of(g.units.begin(), g.units.end(), [&](auto u) { return u == g.units.front(); })) continue;
      g.bytes = sizes.tensor[ix.canonical[group.front()]];
      for (auto t : group) across[t] = true;
      // Once per unit: a unit holding two names of the tie holds the tensor once.
      std::vector<std::size_t> holders = g.units;
      std::sort(holders.begin(), holders.end());
      holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
      for (auto u : holders) units_[u].largest += g.bytes;
      // Sorted by unit for the range tests; names and flags follow.
      std::vector<std::size_t> order(g.units.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return g.units[a] < g.units[b]; });
      TiedAcross sorted{g.bytes, {}, {}, {}};
      for (auto i : order) {
        sorted.units.push_back(g.units[i]);
        sorted.embedding.push_back(g.embedding[i]);
        sorted.tensors.push_back(g.tensors[i]);
      }
      tied_.push_back(std::move(sorted));
    }
    for (std::size_t t = 0; t < tens.size(); ++t) {
      if (ix.canonical[t] != t) continue;
      auto& u = units_[tensor_unit[t]];
      if (!tens[t].buffer) u.params += ix.tensor_numel[t];
      if (across[t]) continue;
      u.bytes += sizes.tensor[t];
      u.largest += sizes.tensor[t];
      if (!row_read[t]) u.read += sizes.tensor[t];
    }
    prefix_bytes_.assign(units_.size() + 1, 0);
    prefix_read_.assign(units_.size() + 1, 0);
    prefix_params_.assign(units_.size() + 1, 0);
    for (std::size_t i = 0; i < units_.size(); ++i) {
      prefix_bytes_[i + 1] = prefix_bytes_[i] + units_[i].bytes;
      prefix_read_[i + 1] = prefix_read_[i] + units_[i].read;
      prefix_params_[i + 1] = prefix_params_[i] + units_[i].params;
    }
    // Range maxima of `largest` in O(1): a sparse table.
    sparse_.push_back({});
    for (const auto& u : units_) sparse_[0].push_back(u.largest);
    for (std::size_t w = 1; (std::size_t{1} << w) <= units_.size(); ++w) {
      const auto& prev = sparse_[w - 1];
      std::vector<std::uint64_t> row(units_.size() + 1 - (std::size_t{1} << w));
      for (std::size_t i = 0; i < row.size(); ++i) row[i] = std::max(prev[i], prev[i + (std::size_t{1} << (w - 1))]);
      sparse_.push_back(std::move(row));
    }
  }

  [[nodiscard]] const std::vector<StageUnit>& units() const noexcept { return units_; }
  [[nodiscard]] std::size_t size() const noexcept { return units_.size(); }
  [[nodiscard]] const std::vector<TiedAcross>& tied() const noexcept { return tied_; }
  [[nodiscard]] std::size_t unit_of_tensor(std::size_t t) const { return unit_of_tensor_[t]; }

  // Units [i, j): a tie across units counts once if any of its names is inside; it is read whole
  // unless every name inside is an input embedding's (rows only: the head it is tied to is in
  // another stage, which holds its own copy).
  [[nodiscard]] RangeLoad load(std::size_t i, std::size_t j) const {
    RangeLoad r{prefix_bytes_[j] - prefix_bytes_[i], prefix_read_[j] - prefix_read_[i], 0};
    if (i < j) {
      std::size_t w = 0;
      while ((std::size_t{2} << w) <= j - i) ++w;
      r.largest = std::max(sparse_[w][i], sparse_[w][j - (std::size_t{1} << w)]);
    }
    for (const auto& g : tied_) {
      if (j <= g.units.front() || i > g.units.back()) continue;  // (units are sorted)
      bool inside = false, read_whole = false;
      for (std::size_t k = 0; k < g.units.size(); ++k)
        if (g.units[k] >= i && g.units[k] < j) {
          inside = true;
          read_whole = read_whole || !g.embedding[k];
        }
      if (!inside) continue;
      r.bytes += g.bytes;
      if (read_whole) r.read += g.bytes;
    }
    return r;
  }
  // Parameter elements of units [i, j) (each shared parameter once, where its canonical name is).
  [[nodiscard]] std::uint64_t params(std::size_t i, std::size_t j) const { return prefix_params_[j] - prefix_params_[i]; }

 private:
  std::vector<StageUnit> units_;
  std::vector<TiedAcross> tied_;
  std::vector<std::size_t> unit_of_tensor_;
  std::vector<std::uint64_t> prefix_bytes_, prefix_read_, prefix_params_;
  std::vector<std::vector<std::uint64_t>> sparse_;
};

// What one stage's process offers: its GPUs together, its cpu, its disk (budget_scale applied).
struct StageCapacity {
  std::uint64_t gpu = 0;
  std::optional<std::uint64_t> cpu{};
  std::optional<std::uint64_t> disk{};
};

inline StageCapacity stage_capacity(const MaxMemory& budgets, double scale) {
  const auto scaled = scale != 1.0 ? budgets.scaled(scale) : budgets;
  StageCapacity c;
  for (const auto& [gpu, bytes] : scaled.gpus) c.gpu += bytes;
  c.cpu = scaled.cpu;
  c.disk = scaled.disk;
  return c;
}

// How a stage holding `r` fits a process offering `c`, as the planner places it: past its GPUs
// the GPUs keep room for `reserve_layers` of the largest unit (to run it from), the rest goes off
// them; cpu keeps room for the largest unit when some goes to disk (the planner's cpu reserve). A
// process without GPUs holds its weights in host memory, the rest on disk.
struct StageFit {
  std::uint64_t gpu_reserve = 0;  // GPU bytes kept free for the largest unit (0: the stage fits its GPUs)
  std::uint64_t off_gpu = 0;      // bytes off the GPUs (on cpu or disk)
  std::uint64_t cpu_reserve = 0;  // cpu bytes kept free for the largest unit (some go to disk)
  std::uint64_t to_disk = 0;      // bytes on disk
  bool fits = true;               // to_disk within the disk budget
};

inline StageFit stage_fit(const RangeLoad& r, const StageCapacity& c, std::uint32_t reserve_layers) {
  StageFit f;
  const std::uint64_t cpu = c.cpu.value_or(0);
  if (c.gpu == 0) {
    f.off_gpu = r.bytes;
    f.to_disk = r.bytes > cpu ? r.bytes - cpu : 0;
  } else if (r.bytes > c.gpu) {
    f.gpu_reserve = std::min(c.gpu, r.largest * std::max<std::uint32_t>(reserve_layers, 1));
    f.off_gpu = r.bytes - (c.gpu - f.gpu_reserve);
    if (f.off_gpu > cpu) f.cpu_reserve = std::min(cpu, r.largest);
    const std::uint64_t cpu_room = cpu - f.cpu_reserve;
    f.to_disk = f.off_gpu > cpu_room ? f.off_gpu - cpu_room : 0;
  }
  f.fits = !c.disk || f.to_disk <= *c.disk;
  return f;
}

// The estimated seconds of a stage holding `r` on a process offering `c`, before any placement,
// placed as stage_fit places it: what stays on the GPUs is read there, row-read embeddings leave
// them first (they cost nothing anywhere), then cpu before disk, each streamed byte at its rate (as
// streaming_cost counts it). A process without GPUs reads its weights from host memory. Infinite
// when the process cannot hold the stage.
inline double estimate_stage_seconds(const RangeLoad& r, const StageCapacity& c, const Bandwidths& bw, double gpu_read,
                                     double cpu_read, std::uint32_t reserve_layers) {
  const auto d = [](std::uint64_t v) { return static_cast<double>(v); };
  const auto f = stage_fit(r, c, reserve_layers);
  if (!f.fits) return std::numeric_limits<double>::infinity();
  const std::uint64_t row_read = r.bytes - r.read;
  const std::uint64_t from_disk = f.to_disk > row_read ? f.to_disk - row_read : 0;  // row-read ones go to disk first
  if (c.gpu == 0) return d(r.read - from_disk) / cpu_read + d(from_disk) / bw.disk_read;
  const std::uint64_t streamed = f.off_gpu > row_read ? f.off_gpu - row_read : 0;
  const std::uint64_t from_cpu = streamed - std::min(streamed, from_disk);
  return d(r.read - std::min(r.read, streamed)) / gpu_read + d(from_cpu) / bw.host_to_device +
         d(from_disk) * (1 / bw.disk_read + 1 / bw.host_to_device);
}

// The model of units [i, j) alone: their tensors with every module above them (classes kept), in
// model order. Names tied inside the range stay one tensor; a name whose tie partners are all
// outside is a tensor of its own (the stage's copy).
inline ModuleTree stage_tree(const ModuleTree& tree, const StageUnits& units, std::size_t i, std::size_t j) {
  const auto& mods = tree.modules();
  const auto& tens = tree.tensors();
  std::vector<bool> in_tensor(tens.size(), false), in_module(mods.size(), false);
  for (std::size_t t = 0; t < tens.size(); ++t) {
    const auto u = units.unit_of_tensor(t);
    if (u < i || u >= j) continue;
    in_tensor[t] = true;
    for (auto m = tens[t].module; m != npos_id && !in_module[m]; m = mods[m].parent) in_module[m] = true;
  }
  ModuleTree sub;
  for (std::size_t m = 1; m < mods.size(); ++m)
    if (in_module[m]) sub.add_module(mods[m].name, mods[m].class_name);
  for (std::size_t t = 0; t < tens.size(); ++t) {
    if (!in_tensor[t]) continue;
    const auto& ten = tens[t];
    const auto id = ten.buffer ? sub.add_buffer(ten.name, ten.dtype, ten.shape, ten.persistent)
                               : sub.add_parameter(ten.name, ten.dtype, ten.shape);
    if (ten.quantized) sub.mark_quantized(id);
    if (ten.tied_copy) sub.mark_tied_copy(id);
  }
  for (const auto& group : tree.index()->tied_groups) {
    std::vector<std::string> names;
    for (auto t : group)
      if (in_tensor[t]) names.push_back(tens[t].name);
    if (names.size() > 1) sub.tie(names);
  }
  return sub;
}

}  // namespace detail

ACCEL_NAMESPACE_END
