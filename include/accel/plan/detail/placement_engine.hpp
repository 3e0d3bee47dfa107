// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file placement_engine.hpp
/// @brief The greedy placement loop behind plan_device_map (accelerate's infer_auto_device_map,
///        fixed and made O(n log n)). Include <accel/plan/planner.hpp> instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/runtime/error.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/plan/plan_options.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

// Nodes are modules [0, M) and tensors [M, M+T). The queue is a doubly linked list over nodes
// (O(1) pop, push-front, in-place expansion, removal anywhere). The "largest waiting layer" is a
// set of layer slots sorted by size with activity flags: a queue entry activates the layers it
// covers, so the reserve is always exact and never rescanned.
class PlacementEngine {
 public:
  PlacementEngine(const ModuleTree& tree, const PlanOptions& opts)
      : tree_(tree), opts_(opts), ix_holder_(tree.index()), ix_(*ix_holder_),
        sizes_(compute_module_sizes(tree, ix_, size_options(opts))),
        m_(static_cast<std::uint32_t>(tree.modules().size())),
        n_(m_ + static_cast<std::uint32_t>(tree.tensors().size())) {}

  PlanResult run() {
    no_split_rule_ = NoSplitRule{opts_.no_split, opts_.auto_no_split};
    no_split_cache_.assign(m_, -1);
    if (opts_.max_memory.empty())
      throw_error<usage_error>("no memory budgets given; pass max_memory (e.g. parse_max_memory(\"0=20GiB,cpu=64GiB\")) "
                               "or default_max_memory(devices, ram)");
    setup_devices();
    setup_layers();
    setup_ties();
    setup_queue();
    result_.total_bytes = sizes_.total();
    result_.largest_layer = max_layer();
    place_all();
    return finish();
  }

 private:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
  static constexpr std::int64_t unbounded = std::numeric_limits<std::int64_t>::max();

  struct Device {
    Placement where{};
    bool bounded = true;
    std::int64_t budget = 0;
    std::int64_t used = 0;      // weights placed
    std::int64_t reserved_bookkeeping = 0;  // reserve added when moving on (accelerate)
    std::uint64_t buffers = 0;
    std::uint64_t reserve_seen = 0;
    bool main = false;
    bool got_any = false;
    std::optional<std::uint64_t> required{};
    std::int64_t fail_available = 0;
    std::uint64_t fail_needed = 0;
  };

  // ---- node helpers -------------------------------------------------------------------------
  bool is_module(std::uint32_t n) const { return n < m_; }
  std::uint32_t tensor_of(std::uint32_t n) const { return n - m_; }
  std::uint64_t node_size(std::uint32_t n) const { return is_module(n) ? sizes_.module[n] : sizes_.tensor[tensor_of(n)]; }
  std::uint32_t node_rank(std::uint32_t n) const { return is_module(n) ? ix_.module_rank[n] : ix_.tensor_rank[tensor_of(n)]; }
  const std::string& node_name(std::uint32_t n) const {
    return is_module(n) ? tree_.modules()[n].name : tree_.tensors()[tensor_of(n)].name;
  }
  std::uint32_t parent_of(std::uint32_t n) const {
    if (!is_module(n)) return static_cast<std::uint32_t>(tree_.tensors()[tensor_of(n)].module);
    const auto p = tree_.modules()[n].parent;
    return p == npos_id ? none : static_cast<std::uint32_t>(p);
  }
  bool no_split(std::uint32_t m) {
    auto& c = no_split_cache_[m];
    if (c < 0) c = no_split_rule_.matches(tree_, m) ? 1 : 0;
    return c == 1;
  }
  bool splittable(std::uint32_t n) { return is_module(n) && !tree_.modules()[n].children.empty() && !no_split(n); }
  // Direct parameters, children, direct buffers (accelerate drops the buffers; we keep them).
  template <class F>
  void for_expansion(std::uint32_t n, F&& f) const {
    const auto& mod = tree_.modules()[n];
    for (auto p : mod.parameters) f(static_cast<std::uint32_t>(p) + m_);
    for (auto c : mod.children) f(static_cast<std::uint32_t>(c));
    for (auto b : mod.buffers) f(static_cast<std::uint32_t>(b) + m_);
  }
  std::string device_label(const Device& d) const { return d.where.to_string(); }

  // ---- queue (linked list with sentinel n_) ---------------------------------------------------
  void link_before(std::uint32_t pos, std::uint32_t x) {
    const auto p = prev_[pos];
    next_[p] = x;
    prev_[x] = p;
    next_[x] = pos;
    prev_[pos] = x;
    queued_[x] = true;
  }
  void unlink(std::uint32_t x) {
    next_[prev_[x]] = next_[x];
    prev_[next_[x]] = prev_[x];
    queued_[x] = false;
  }
  std::uint32_t front() const { return next_[n_]; }
  void push_front(std::uint32_t x) {
    link_before(next_[n_], x);
    activate(x);
  }
  // Replaces queued entry x by its expansion, in place.
  void expand_in_place(std::uint32_t x) {
    for_expansion(x, [&](std::uint32_t c) {
      link_before(x, c);
      activate(c);
    });
    unlink(x);
    deactivate(x);
  }
  // Replaces the (already popped) front entry x by its expansion at the front.
  void expand_at_front(std::uint32_t x) {
    const auto pos = next_[n_];
    for_expansion(x, [&](std::uint32_t c) {
      link_before(pos, c);
      activate(c);
    });
  }

  // ---- layers ---------------------------------------------------------------------------------
  void setup_layers() {
    const auto& mods = tree_.modules();
    layer_first_.assign(m_, 0);
    layer_last_.assign(m_, 0);
    std::vector<std::pair<std::uint32_t, bool>> stack{{0, false}};
    while (!stack.empty()) {
      auto [m, leaving] = stack.back();
      stack.pop_back();
      if (leaving) {
        layer_last_[m] = static_cast<std::uint32_t>(layer_modules_.size());
        continue;
      }
      layer_first_[m] = static_cast<std::uint32_t>(layer_modules_.size());
      if (mods[m].children.empty() || no_split(m)) {
        layer_modules_.push_back(m);
        layer_last_[m] = layer_first_[m] + 1;
        continue;
      }
      stack.emplace_back(m, true);
      for (auto c = mods[m].children.rbegin(); c != mods[m].children.rend(); ++c)
        stack.emplace_back(static_cast<std::uint32_t>(*c), false);
    }
    // Module layers: sorted once by size, with a cursor to the largest active one. Loose tensor
    // entries (few: the direct tensors of split modules) go to a lazy max-heap instead, so the
    // many tensors inside blocks cost nothing here.
    const auto layers = static_cast<std::uint32_t>(layer_modules_.size());
    slot_size_.resize(layers);
    for (std::uint32_t i = 0; i < layers; ++i) slot_size_[i] = sizes_.module[layer_modules_[i]];
    sorted_.resize(layers);
    for (std::uint32_t i = 0; i < layers; ++i) sorted_[i] = i;
    std::sort(sorted_.begin(), sorted_.end(), [&](auto a, auto b) {
      return slot_size_[a] != slot_size_[b] ? slot_size_[a] > slot_size_[b] : a < b;
    });
    pos_in_sorted_.resize(layers);
    for (std::uint32_t i = 0; i < layers; ++i) pos_in_sorted_[sorted_[i]] = i;
    active_.assign(layers, false);
    top_ = layers;
    tensor_active_.assign(n_ - m_, false);
  }
  void set_slot(std::uint32_t slot, bool on) {
    active_[slot] = on;
    if (on) top_ = std::min(top_, pos_in_sorted_[slot]);
  }
  void activate(std::uint32_t n) { toggle(n, true); }
  void deactivate(std::uint32_t n) { toggle(n, false); }
  void toggle(std::uint32_t n, bool on) {
    if (!is_module(n)) {
      const auto t = tensor_of(n);
      tensor_active_[t] = on;
      if (on) {
        tensor_heap_.emplace_back(sizes_.tensor[t], t);
        std::push_heap(tensor_heap_.begin(), tensor_heap_.end());
      }
      return;
    }
    for (auto i = layer_first_[n]; i < layer_last_[n]; ++i) set_slot(i, on);
  }
  std::uint64_t max_layer() {
    while (top_ < sorted_.size() && !active_[sorted_[top_]]) ++top_;
    const std::uint64_t module_max = top_ < sorted_.size() ? slot_size_[sorted_[top_]] : 0;
    while (!tensor_heap_.empty() && !tensor_active_[tensor_heap_.front().second]) {
      std::pop_heap(tensor_heap_.begin(), tensor_heap_.end());
      tensor_heap_.pop_back();
    }
    const std::uint64_t tensor_max = tensor_heap_.empty() ? 0 : tensor_heap_.front().first;
    return std::max(module_max, tensor_max);
  }

  // ---- ties -----------------------------------------------------------------------------------
  void setup_ties() {
    group_of_.assign(n_ - m_, -1);
    for (std::size_t g = 0; g < ix_.tied_groups.size(); ++g)
      for (auto t : ix_.tied_groups[g]) {
        group_of_[t] = static_cast<std::int32_t>(g);
        tied_by_rank_.emplace_back(ix_.tensor_rank[t], t);
      }
    std::sort(tied_by_rank_.begin(), tied_by_rank_.end());
    group_stamp_.assign(ix_.tied_groups.size(), 0);
    group_inside_.assign(ix_.tied_groups.size(), 0);
    node_stamp_.assign(n_ + 1, 0);
  }
  bool inside(std::uint32_t entry, std::uint32_t tensor) const {
    return is_module(entry) ? ix_.contains(entry, tensor) : tensor_of(entry) == tensor;
  }
  // The tied tensors outside `entry` whose group has a member inside it.
  std::vector<std::uint32_t> outside_tied(std::uint32_t entry) {
    std::vector<std::uint32_t> out;
    if (tied_by_rank_.empty()) return out;
    ++group_epoch_;
    std::vector<std::uint32_t> groups;
    auto note = [&](std::uint32_t t) {
      const auto g = static_cast<std::size_t>(group_of_[t]);
      if (group_stamp_[g] != group_epoch_) {
        group_stamp_[g] = group_epoch_;
        group_inside_[g] = 0;
        groups.push_back(static_cast<std::uint32_t>(g));
      }
      ++group_inside_[g];
    };
    if (is_module(entry)) {
      auto lo = std::lower_bound(tied_by_rank_.begin(), tied_by_rank_.end(), std::make_pair(ix_.module_rank[entry], 0u));
      for (auto it = lo; it != tied_by_rank_.end() && it->first < ix_.module_end[entry]; ++it) note(it->second);
    } else if (group_of_[tensor_of(entry)] >= 0) {
      note(tensor_of(entry));
    }
    for (auto g : groups) {
      if (group_inside_[g] == ix_.tied_groups[g].size()) continue;
      for (auto t : ix_.tied_groups[g])
        if (!inside(entry, t)) out.push_back(t);
    }
    return out;
  }
  // Every other entry that must go with `cur`: the entries holding tensors tied to it, then, in
  // turn, the entries tied to those (accelerate stops at the first level, which can strand a tie
  // held by a partner). `present(node)` says whether a node is a candidate entry.
  template <class Present>
  std::vector<std::uint32_t> tie_closure(std::uint32_t cur, Present&& present, bool& missing,
                                         std::vector<std::uint32_t>* tied_out = nullptr) {
    std::vector<std::uint32_t> out;
    missing = false;
    if (tied_by_rank_.empty()) return out;
    ++epoch_;
    node_stamp_[cur] = epoch_;
    std::vector<std::uint32_t> work{cur};
    while (!work.empty()) {
      const auto e = work.back();
      work.pop_back();
      for (auto t : outside_tied(e)) {
        std::uint32_t x = t + m_;
        while (x != none && node_stamp_[x] != epoch_ && !present(x)) x = parent_of(x);
        if (x == none) {
          missing = true;
          continue;
        }
        if (node_stamp_[x] == epoch_) continue;
        if (tied_out) tied_out->push_back(t);
        node_stamp_[x] = epoch_;
        out.push_back(x);
        work.push_back(x);
      }
    }
    return out;
  }
  std::string names_of(const std::vector<std::uint32_t>& nodes, bool tensors) const {
    std::string s = "[";
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      s += i ? ", '" : "'";
      s += tensors ? tree_.tensors()[nodes[i]].name : node_name(nodes[i]);
      s += "'";
    }
    return s + "]";
  }

  // ---- devices --------------------------------------------------------------------------------
  void setup_devices() {
    const auto& mm = opts_.max_memory;
    auto clamp = [](std::uint64_t v) { return static_cast<std::int64_t>(std::min<std::uint64_t>(v, unbounded / 2)); };
    for (const auto& [i, b] : mm.gpus) devices_.push_back(Device{Placement::gpu(i), true, clamp(b)});
    if (mm.cpu) devices_.push_back(Device{Placement::cpu(), true, clamp(*mm.cpu)});
    devices_.push_back(mm.disk ? Device{Placement::disk(), true, clamp(*mm.disk)} : Device{Placement::disk(), false, unbounded});
    // Main devices keep room for the largest layer: the first GPU and cpu, or cpu alone.
    if (!mm.gpus.empty()) devices_.front().main = true;
    // cpu keeps room to stage disk-offloaded layers, pointless when disk offload is forbidden.
    const bool disk_forbidden = mm.disk && *mm.disk == 0;
    for (auto& d : devices_)
      if (d.where.is_cpu()) d.main = !disk_forbidden;
    result_.budgets = mm;
  }

  void setup_queue() {
    next_.assign(n_ + 1, n_);
    prev_.assign(n_ + 1, n_);
    queued_.assign(n_ + 1, false);
    device_of_.assign(n_, -1);
    for_expansion(0, [&](std::uint32_t c) {
      link_before(n_, c);
      activate(c);
    });
  }

  void place(std::uint32_t node, std::size_t d) {
    device_of_[node] = static_cast<std::int32_t>(d);
    placed_.push_back(node);
    if (!opts_.offload_buffers)
      devices_[d].buffers += is_module(node) ? sizes_.module_buffers[node]
                                             : (tree_.tensors()[tensor_of(node)].buffer ? sizes_.tensor[tensor_of(node)] : 0);
  }

  // ---- the loop -------------------------------------------------------------------------------
  void place_all() {
    std::ostream* log = opts_.verbose;
    std::size_t d = 0;
    while (front() != n_) {
      const std::uint32_t cur = front();
      unlink(cur);
      deactivate(cur);
      const std::string& name = node_name(cur);
      if (log) *log << "\nTreating module " << name << ".\n";
      const std::uint64_t reserve = max_layer();
      const std::uint64_t size = node_size(cur);
      std::vector<std::uint32_t> tied;
      bool missing = false;
      auto partners = tie_closure(cur, [&](std::uint32_t e) { return queued_[e]; }, missing, &tied);
      if (missing)
        throw_error<planning_error>("internal planner error: a tensor tied to '", name,
                                    "' was placed before it; please report this with the model skeleton");
      if (log && !tied.empty()) {
        *log << "  Found the relevant tied param groups " << names_of(tied, true) << "\n";
        *log << "  So those parameters need to be taken into account " << names_of(partners, false) << "\n";
      }
      std::uint64_t with_ties = size;
      for (auto p : partners) with_ties += node_size(p);
      Device& dev = devices_[d];
      std::int64_t limit = dev.budget;
      std::uint64_t reserved = 0;
      if (dev.main) {
        reserved = dev.where.is_cpu() ? reserve : reserve * std::max<std::uint64_t>(opts_.gpu_reserve_layers, 1);
        dev.reserve_seen = reserved;
        limit = dev.budget - static_cast<std::int64_t>(std::min<std::uint64_t>(reserved, unbounded / 2));
      }
      const auto need = static_cast<std::int64_t>(std::min<std::uint64_t>(with_ties, unbounded / 2));
      const auto alone = static_cast<std::int64_t>(std::min<std::uint64_t>(size, unbounded / 2));
      if (!dev.bounded || dev.used + need <= limit) {
        if (log) {
          *log << "Putting " << name;
          if (!partners.empty()) *log << " and " << names_of(partners, false);
          *log << " (size=" << with_ties << ")";
          if (dev.bounded) *log << " (available=" << limit - dev.used << ")";
          *log << " on " << device_label(dev) << ".\n";
        }
        place(cur, d);
        for (auto p : partners) {
          unlink(p);
          deactivate(p);
          place(p, d);
        }
        dev.used += need;
        dev.got_any = true;
        continue;
      }
      if (!partners.empty() && dev.used + alone <= limit) {
        if (log)
          *log << "Not enough space on " << device_label(dev) << " to put " << name << " and " << names_of(partners, false)
               << " (space available " << limit - dev.used << ", needed size " << with_ties << ").\n";
        std::uint32_t split = none;
        for (auto p : partners)
          if (splittable(p)) {
            split = p;
            break;
          }
        if (split != none) {
          if (log) *log << "Splitting " << node_name(split) << ".\n";
          expand_in_place(split);
          push_front(cur);
          continue;
        }
        if (log) *log << "None of the tied module can be split, going to the next device.\n";
      }
      if (dev.used + alone >= limit) {
        if (log)
          *log << "Not enough space on " << device_label(dev) << " to put " << name << " (space available "
               << limit - dev.used << ", module size " << size << ").\n";
        if (splittable(cur)) {
          if (log) *log << "Splitting " << name << ".\n";
          expand_at_front(cur);
          continue;
        }
        if (log) *log << "This module cannot be split, going to the next device.\n";
      }
      if (opts_.fallback_allocation && !dev.got_any && !dev.where.is_disk() && try_fallback(cur, d, dev.main ? reserved : reserve, with_ties)) continue;
      if (!dev.got_any) dev.required = with_ties + reserved;
      dev.reserved_bookkeeping += static_cast<std::int64_t>(reserved);
      dev.fail_available = limit - dev.used;
      dev.fail_needed = with_ties;
      push_front(cur);
      if (++d == devices_.size()) fail(cur, with_ties);
    }
  }

  bool try_fallback(std::uint32_t cur, std::size_t d, std::uint64_t reserve, std::uint64_t with_ties) {
    const Device& dev = devices_[d];
    const std::int64_t limit = dev.budget - static_cast<std::int64_t>(std::min<std::uint64_t>(std::max(reserve, with_ties), unbounded / 2));
    if (limit < 0) return false;
    // Breadth-first over a copy of the queue; a splittable candidate that is too big is replaced
    // by its expansion at the front (accelerate's fallback_allocate).
    std::deque<std::uint32_t> search;
    const std::uint32_t mark = ++search_epoch_;
    if (search_mark_.empty()) search_mark_.assign(n_, 0);
    for (auto e = front(); e != n_; e = next_[e]) {
      search.push_back(e);
      search_mark_[e] = mark;
    }
    std::uint32_t found = none;
    while (!search.empty()) {
      const auto c = search.front();
      search.pop_front();
      search_mark_[c] = 0;
      bool missing = false;
      auto partners = tie_closure(c, [&](std::uint32_t e) { return search_mark_[e] == mark; }, missing);
      std::uint64_t need = node_size(c);
      for (auto p : partners) need += node_size(p);
      if (!missing && need <= static_cast<std::uint64_t>(limit)) {
        found = c;
        break;
      }
      if (splittable(c)) {
        std::vector<std::uint32_t> items;
        for_expansion(c, [&](std::uint32_t x) { items.push_back(x); });
        for (auto it = items.rbegin(); it != items.rend(); ++it) {
          search.push_front(*it);
          search_mark_[*it] = mark;
        }
      }
    }
    if (found == none) return false;
    if (opts_.verbose)
      *opts_.verbose << "Fallback: putting " << node_name(found) << " first, as it fits on " << device_label(dev)
                     << " (limit " << limit << ").\n";
    // Expand the queued ancestors of `found` down to it, then move it to the front.
    std::vector<std::uint32_t> path;
    for (auto e = found; !queued_[e]; e = parent_of(e)) path.push_back(parent_of(e));
    for (auto it = path.rbegin(); it != path.rend(); ++it) expand_in_place(*it);
    unlink(found);
    deactivate(found);
    push_front(cur);
    push_front(found);
    return true;
  }

  [[noreturn]] void fail(std::uint32_t cur, std::uint64_t with_ties) const {
    std::string per_device;
    for (const auto& dev : devices_) {
      per_device += "\n  " + device_label(dev) + ": ";
      if (dev.bounded && dev.budget == 0) {
        per_device += dev.where.is_disk() ? "forbidden (disk=0)" : "budget 0";
        continue;
      }
      per_device += concat("needs ", dev.fail_needed, " bytes (", text::format_bytes(dev.fail_needed), "), available ",
                           std::max<std::int64_t>(0, dev.fail_available), " of budget ", dev.budget, " (",
                           text::format_bytes(static_cast<std::uint64_t>(dev.budget)), ")");
      if (dev.main) per_device += concat(", reserve ", dev.reserve_seen, " kept for the largest layer");
    }
    throw_error<planning_error>("cannot place '", node_name(cur), "' (", with_ties, " bytes, ", text::format_bytes(with_ties),
                                ", with tied weights) on any device; model total ", result_.total_bytes, " bytes (",
                                text::format_bytes(result_.total_bytes), "); per device:", per_device,
                                "\nraise the budgets (--max-memory), add cpu, or allow disk offload");
  }

  // clean_device_map on the tree itself: a module whose subtree holds more than one placed entry,
  // all on one device, replaces them. Same result as the string version, without building it.
  void build_map() {
    std::sort(placed_.begin(), placed_.end(), [&](auto a, auto b) { return node_rank(a) < node_rank(b); });
    std::vector<std::uint32_t> keys;
    if (!opts_.clean_result) {
      keys = placed_;
    } else {
      std::vector<std::uint32_t> count(m_, 0);
      std::vector<std::int32_t> value(m_, -1);  // device index, or -2 when mixed
      for (auto n : placed_) {
        const auto d = device_of_[n];
        for (std::uint32_t a = is_module(n) ? n : parent_of(n); a != none; a = parent_of(a)) {
          ++count[a];
          if (value[a] == -1) value[a] = d;
          else if (value[a] != d) value[a] = -2;
        }
      }
      // Top-down: emit merged modules; elsewhere emit placed entries as they are.
      std::vector<std::uint32_t> stack{0};
      while (!stack.empty()) {
        const auto m = stack.back();
        stack.pop_back();
        if (device_of_[m] >= 0) {
          keys.push_back(m);
          continue;
        }
        if (count[m] > 1 && value[m] >= 0) {
          keys.push_back(m);
          device_of_[m] = value[m];
          continue;
        }
        for_expansion(m, [&](std::uint32_t c) {
          if (!is_module(c)) {
            if (device_of_[c] >= 0) keys.push_back(c);
          } else if (count[c] > 0) {
            stack.push_back(c);
          }
        });
      }
      std::sort(keys.begin(), keys.end(), [&](auto a, auto b) { return node_rank(a) < node_rank(b); });
    }
    result_.device_map.reserve(keys.size());
    for (auto n : keys) result_.device_map.set(node_name(n), devices_[static_cast<std::size_t>(device_of_[n])].where);
  }

  PlanResult finish() {
    build_map();
    std::vector<std::string> nothing;
    std::uint64_t offloaded_buffers = 0;
    bool any_gpu = false;
    for (const auto& dev : devices_) {
      DevicePlan p;
      p.device = dev.where;
      if (dev.bounded) p.budget = static_cast<std::uint64_t>(dev.budget);
      p.placed = static_cast<std::uint64_t>(dev.used);
      p.reserve = dev.reserve_seen;
      p.buffers = dev.buffers;
      p.main = dev.main;
      p.required = dev.required;
      if (!dev.got_any && dev.required)  // set only once the device was tried
        nothing.push_back(concat("  - ", device_label(dev), ": ", *dev.required, " bytes required"));
      if (!dev.where.is_gpu()) offloaded_buffers += dev.buffers;
      any_gpu = any_gpu || dev.where.is_gpu();
      result_.devices.push_back(std::move(p));
    }
    for (const auto& [k, where] : result_.device_map)
      for (auto& p : result_.devices)
        if (p.device == where) p.modules.push_back(k);
    if (!nothing.empty()) {
      std::string text = "no modules could be assigned to the following devices due to insufficient memory:";
      for (const auto& l : nothing) text += "\n" + l;
      result_.info.push_back(std::move(text));
    }
    if (!opts_.offload_buffers && offloaded_buffers > 0 && any_gpu) {
      bool fits = false;
      for (const auto& dev : devices_)
        if (dev.where.is_gpu() &&
            dev.budget >= static_cast<std::int64_t>(offloaded_buffers) + dev.used + dev.reserved_bookkeeping)
          fits = true;
      if (!fits)
        result_.warnings.push_back(concat("offloaded modules hold ", offloaded_buffers,
                                          " bytes of buffers that stay resident on the execution GPU, and no GPU "
                                          "has that much room left; plan with offload_buffers (--offload-buffers) "
                                          "if loading runs out of memory"));
    }
    return std::move(result_);
  }

  const ModuleTree& tree_;
  const PlanOptions& opts_;
  std::shared_ptr<const TreeIndex> ix_holder_;
  const TreeIndex& ix_;
  ModuleSizes sizes_;
  NoSplitRule no_split_rule_{};
  std::vector<std::int8_t> no_split_cache_;  // -1 unknown, 0/1 (evaluated only for visited modules)
  std::uint32_t m_, n_;
  std::vector<Device> devices_;
  PlanResult result_;
  // queue
  std::vector<std::uint32_t> next_, prev_;
  std::vector<bool> queued_;
  std::vector<std::int32_t> device_of_;
  std::vector<std::uint32_t> placed_;
  // layers
  std::vector<std::uint32_t> layer_first_, layer_last_, layer_modules_;
  std::vector<std::uint64_t> slot_size_;
  std::vector<std::uint32_t> sorted_, pos_in_sorted_;
  std::vector<bool> active_;
  std::uint32_t top_ = 0;
  std::vector<bool> tensor_active_;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> tensor_heap_;
  // ties
  std::vector<std::int32_t> group_of_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> tied_by_rank_;
  std::vector<std::uint32_t> group_stamp_, group_inside_, node_stamp_;
  std::uint32_t epoch_ = 0, group_epoch_ = 0;
  std::vector<std::uint32_t> search_mark_;
  std::uint32_t search_epoch_ = 0;
};

}  // namespace detail
ACCEL_NAMESPACE_END
