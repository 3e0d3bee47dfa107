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
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/plan_options.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

// Nodes are modules [0, M) and tensors [M, M+T); node M+T is the queue's sentinel. Every node,
// module, tensor, layer slot, tie group and device has one record. The queue is a doubly linked
// list through the node records (O(1) pop, push-front, in-place expansion, removal anywhere). The
// "largest waiting layer" is a set of layer slots sorted by size with waiting flags: a queue
// entry marks the layers it covers, so the reserve is always exact and never rescanned.
class PlacementEngine {
 public:
  // `sizes` must be compute_module_sizes(tree, size_options(opts)): the caller computes them once.
  PlacementEngine(const ModuleTree& tree, const PlanOptions& opts, const ModuleSizes& sizes)
      : tree_(tree), opts_(opts), index_(tree.index()), ix_(*index_), sizes_(sizes), log_(opts.verbose),
        module_count_(static_cast<std::uint32_t>(tree.modules().size())),
        end_(module_count_ + static_cast<std::uint32_t>(tree.tensors().size())) {}

  PlanResult run() {
    require_budgets();
    setup_records();
    setup_devices();
    setup_layers();
    setup_ties();
    setup_queue();
    result_.total_bytes = sizes_.total();
    result_.largest_layer = largest_waiting_layer();
    if (transformers_rules()) tf_refresh_reserve(true);
    place_all();
    return finish();
  }

 private:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
  static constexpr std::int64_t unbounded = std::numeric_limits<std::int64_t>::max();

  /// @name Records
  ///@{
  // A module or a tensor as a queue entry (16 bytes: the planner touches one per node).
  struct Node {
    std::uint32_t next = none;    // queue neighbours; both none while not queued
    std::uint32_t prev = none;
    std::uint32_t tie_visit = 0;  // tie_closure's visited stamp
    std::int32_t device = -1;     // devices_ index once placed (or merged by cleaning)
    bool queued() const { return prev != none; }
  };
  struct ModuleState {
    std::uint32_t first_slot = 0;  // the layer slots [first_slot, end_slot) its subtree covers
    std::uint32_t end_slot = 0;    // (set for the modules the layer walk reaches)
    std::int8_t no_split = -1;     // no-split rule, evaluated on first use: -1 unknown, 0, 1
  };
  // (A loose tensor counts for the reserve while its node is queued: see set_waiting.)
  struct TensorState {
    std::int32_t tie_group = -1;  // tie_groups_ index, or -1
  };
  // A unit the planner moves whole (no-split block or module without children), for the reserve.
  struct LayerSlot {
    std::uint64_t size = 0;
    std::uint32_t order = 0;  // position in by_size_
    bool waiting = false;     // covered by a queued entry
  };
  struct TieGroup {
    std::span<const std::uint32_t> members;  // tensor ids, model order
    std::uint32_t visit = 0;                 // groups_inside's stamp
    std::uint32_t inside = 0;                // members inside the entry examined at that stamp
  };
  struct Device {
    Placement where{};
    bool bounded = true;
    std::int64_t budget = 0;
    std::int64_t used = 0;                  // weights placed
    std::int64_t reserved_bookkeeping = 0;  // reserve added when moving on (accelerate)
    std::uint64_t buffers = 0;
    std::uint64_t reserve_seen = 0;
    bool main = false;
    bool got_any = false;
    std::optional<std::uint64_t> required{};
    std::int64_t fail_available = 0;
    std::uint64_t fail_needed = 0;
  };
  // The front entry and what must go with it, as the loop weighs it.
  struct Candidate {
    std::uint32_t node = none;
    std::uint64_t size = 0;                // alone
    std::uint64_t with_ties = 0;           // with its partners
    std::uint64_t reserve = 0;             // largest layer still waiting
    std::vector<std::uint32_t> partners;   // entries holding tensors tied to it
    std::vector<std::uint32_t> tied;       // those tensors, for the trace
  };
  // What a device offers a candidate.
  struct Room {
    std::int64_t limit = 0;      // budget less the reserve it keeps
    std::uint64_t reserved = 0;  // that reserve (0 on a device that keeps none)
  };
  ///@}

  static std::int64_t clamped(std::uint64_t bytes) {
    return static_cast<std::int64_t>(std::min<std::uint64_t>(bytes, unbounded / 2));
  }

  /// @name Node facts (read from the tree, its index and the sizes)
  ///@{
  bool is_module(std::uint32_t n) const { return n < module_count_; }
  std::uint32_t tensor_of(std::uint32_t n) const { return n - module_count_; }
  std::uint32_t node_of_tensor(std::uint32_t t) const { return t + module_count_; }
  std::uint64_t size_of(std::uint32_t n) const { return is_module(n) ? sizes_.module[n] : sizes_.tensor[tensor_of(n)]; }
  std::uint32_t rank_of(std::uint32_t n) const { return is_module(n) ? ix_.module_rank[n] : ix_.tensor_rank[tensor_of(n)]; }
  const std::string& name_of(std::uint32_t n) const {
    return is_module(n) ? tree_.modules()[n].name : tree_.tensors()[tensor_of(n)].name;
  }
  std::uint32_t parent_of(std::uint32_t n) const {
    if (!is_module(n)) return static_cast<std::uint32_t>(tree_.tensors()[tensor_of(n)].module);
    const auto p = tree_.modules()[n].parent;
    return p == npos_id ? none : static_cast<std::uint32_t>(p);
  }
  // Buffer bytes that stay with the node where it is placed.
  std::uint64_t buffer_bytes_of(std::uint32_t n) const {
    if (is_module(n)) return sizes_.module_buffers[n];
    return tree_.tensors()[tensor_of(n)].buffer ? sizes_.tensor[tensor_of(n)] : 0;
  }
  bool no_split(std::uint32_t m) {
    auto& memo = modules_[m].no_split;
    if (memo < 0) memo = no_split_rule_.matches(tree_, m) ? 1 : 0;
    return memo == 1;
  }
  bool splittable(std::uint32_t n) { return is_module(n) && !tree_.modules()[n].children.empty() && !no_split(n); }
  // The entries a split module becomes: direct parameters, children, direct buffers (accelerate
  // drops the buffers; we keep them).
  template <class F>
  void for_each_part(std::uint32_t n, F&& f) const {
    const auto& mod = tree_.modules()[n];
    for (auto p : mod.parameters) f(node_of_tensor(static_cast<std::uint32_t>(p)));
    for (auto c : mod.children) f(static_cast<std::uint32_t>(c));
    for (auto b : mod.buffers) f(node_of_tensor(static_cast<std::uint32_t>(b)));
  }
  // The trace's name lists: ['a', 'b'] (every name).
  std::string quoted_names(const std::vector<std::uint32_t>& nodes) const {
    // (A vector of views rather than std::views::transform, which clang 14 cannot compile over
    // libstdc++ 12's ranges; the libFuzzer harness that plans is built with clang.)
    std::vector<std::string_view> names;
    names.reserve(nodes.size());
    for (auto n : nodes) names.push_back(name_of(n));
    return "[" + text::quoted_list(names, nodes.size()) + "]";
  }
  std::string quoted_tensor_names(const std::vector<std::uint32_t>& tensors) const {
    std::vector<std::uint32_t> nodes;
    for (auto t : tensors) nodes.push_back(node_of_tensor(t));
    return quoted_names(nodes);
  }
  ///@}

  /// @name Setup
  ///@{
  void require_budgets() const {
    if (opts_.max_memory.empty())
      throw_error<usage_error>("no memory budgets given; pass max_memory (e.g. parse_max_memory(\"0=20GiB,cpu=64GiB\")) "
                               "or default_max_memory(devices, ram)");
  }

  void setup_records() {
    no_split_rule_ = NoSplitRule{opts_.no_split, opts_.auto_no_split};
    nodes_.assign(end_ + 1, Node{});
    nodes_[end_].next = nodes_[end_].prev = end_;
    modules_.assign(module_count_, ModuleState{});
    tensors_.assign(end_ - module_count_, TensorState{});
  }

  void setup_devices() {
    const auto& mm = opts_.max_memory;
    for (const auto& [i, b] : mm.gpus) devices_.push_back(Device{Placement::gpu(i), true, clamped(b)});
    if (mm.cpu) devices_.push_back(Device{Placement::cpu(), true, clamped(*mm.cpu)});
    devices_.push_back(mm.disk ? Device{Placement::disk(), true, clamped(*mm.disk)}
                               : Device{Placement::disk(), false, unbounded});
    // Main devices keep room for the largest layer: the first GPU and cpu, or cpu alone.
    if (!mm.gpus.empty()) devices_.front().main = true;
    // cpu keeps room to stage disk-offloaded layers, pointless when disk offload is forbidden.
    const bool disk_forbidden = mm.disk && *mm.disk == 0;
    for (auto& d : devices_)
      if (d.where.is_cpu()) d.main = !disk_forbidden;
    result_.budgets = mm;
  }

  // Module layers are sorted once by size, with a cursor to the largest waiting one. Loose tensor
  // entries (few: the direct tensors of split modules) go to a lazy max-heap instead, so the many
  // tensors inside blocks cost nothing here.
  void setup_layers() {
    layer_modules_ = collect_layers();
    const auto count = static_cast<std::uint32_t>(layer_modules_.size());
    slots_.resize(count);
    for (std::uint32_t i = 0; i < count; ++i) slots_[i].size = sizes_.module[layer_modules_[i]];
    by_size_.resize(count);
    for (std::uint32_t i = 0; i < count; ++i) by_size_[i] = i;
    std::sort(by_size_.begin(), by_size_.end(), [&](auto a, auto b) {
      return slots_[a].size != slots_[b].size ? slots_[a].size > slots_[b].size : a < b;
    });
    for (std::uint32_t i = 0; i < count; ++i) slots_[by_size_[i]].order = i;
    top_ = count;
  }

  // The layers in model order; each module reached gets the slot range of its subtree.
  std::vector<std::uint32_t> collect_layers() {
    const auto& mods = tree_.modules();
    std::vector<std::uint32_t> layers;
    std::vector<std::pair<std::uint32_t, bool>> stack{{0, false}};
    while (!stack.empty()) {
      auto [m, leaving] = stack.back();
      stack.pop_back();
      auto& state = modules_[m];
      if (leaving) {
        state.end_slot = static_cast<std::uint32_t>(layers.size());
        continue;
      }
      state.first_slot = static_cast<std::uint32_t>(layers.size());
      if (mods[m].children.empty() || no_split(m)) {
        layers.push_back(m);
        state.end_slot = state.first_slot + 1;
        continue;
      }
      stack.emplace_back(m, true);
      for (auto c = mods[m].children.rbegin(); c != mods[m].children.rend(); ++c)
        stack.emplace_back(static_cast<std::uint32_t>(*c), false);
    }
    return layers;
  }

  void setup_ties() {
    tie_groups_.reserve(ix_.tied_groups.size());
    for (const auto& members : ix_.tied_groups) {
      const auto g = static_cast<std::int32_t>(tie_groups_.size());
      tie_groups_.push_back(TieGroup{members});
      for (auto t : members) {
        tensors_[t].tie_group = g;
        tied_by_rank_.emplace_back(ix_.tensor_rank[t], t);
      }
    }
    std::sort(tied_by_rank_.begin(), tied_by_rank_.end());
  }

  void setup_queue() {
    for_each_part(0, [&](std::uint32_t c) {
      link_before(end_, c);
      set_waiting(c, true);
    });
  }
  ///@}

  /// @name Queue (linked through the node records, sentinel end_)
  ///@{
  bool queue_empty() const { return nodes_[end_].next == end_; }
  std::uint32_t front() const { return nodes_[end_].next; }
  void link_before(std::uint32_t pos, std::uint32_t x) {
    const auto p = nodes_[pos].prev;
    nodes_[p].next = x;
    nodes_[x].prev = p;
    nodes_[x].next = pos;
    nodes_[pos].prev = x;
  }
  void unlink(std::uint32_t x) {
    nodes_[nodes_[x].prev].next = nodes_[x].next;
    nodes_[nodes_[x].next].prev = nodes_[x].prev;
    nodes_[x].next = nodes_[x].prev = none;
  }
  void push_front(std::uint32_t x) {
    link_before(front(), x);
    set_waiting(x, true);
  }
  void leave_queue(std::uint32_t x) {
    unlink(x);
    set_waiting(x, false);
  }
  // Replaces queued entry x by its parts, in place. x leaves first: its layer slots cover its
  // parts' slots, so clearing them after the parts joined would hide the parts from the reserve.
  void expand_in_place(std::uint32_t x) {
    const auto pos = nodes_[x].next;
    leave_queue(x);
    for_each_part(x, [&](std::uint32_t c) {
      link_before(pos, c);
      set_waiting(c, true);
    });
  }
  // Puts the parts of x (already taken from the queue) at the front.
  void expand_at_front(std::uint32_t x) {
    const auto pos = front();
    for_each_part(x, [&](std::uint32_t c) {
      link_before(pos, c);
      set_waiting(c, true);
    });
  }
  ///@}

  /// @name Reserve: the largest layer still waiting
  ///@{
  // An entry joins (on) or leaves the queue: a module's layer slots follow it; a loose tensor is
  // pushed on the heap when it joins and dropped lazily once its node is no longer queued.
  void set_waiting(std::uint32_t n, bool on) {
    if (!is_module(n)) {
      if (on) {
        tensor_heap_.emplace_back(sizes_.tensor[tensor_of(n)], tensor_of(n));
        std::push_heap(tensor_heap_.begin(), tensor_heap_.end());
      }
      return;
    }
    for (auto slot = modules_[n].first_slot; slot < modules_[n].end_slot; ++slot) {
      slots_[slot].waiting = on;
      if (on) top_ = std::min(top_, slots_[slot].order);
    }
  }
  std::uint64_t largest_waiting_layer() { return std::max(largest_waiting_module(), largest_waiting_tensor()); }
  std::uint64_t largest_waiting_module() {
    while (top_ < by_size_.size() && !slots_[by_size_[top_]].waiting) ++top_;
    return top_ < by_size_.size() ? slots_[by_size_[top_]].size : 0;
  }
  std::uint64_t largest_waiting_tensor() {
    while (!tensor_heap_.empty() && !nodes_[node_of_tensor(tensor_heap_.front().second)].queued()) {
      std::pop_heap(tensor_heap_.begin(), tensor_heap_.end());
      tensor_heap_.pop_back();
    }
    return tensor_heap_.empty() ? 0 : tensor_heap_.front().first;
  }
  ///@}

  /// @name transformers' reserve (PlanRules::transformers)
  ///@{
  // transformers keeps the largest layer's size and the names of the layers of that size. Taking
  // an entry drops the names inside it; once none is left, and after every split, the size is
  // recomputed over the queued modules (loose tensors count only in the first computation). An
  // entry moved on to the next device is not counted again until the next recomputation.
  //
  // transformers rescans the queue for each recomputation and the name list for each entry taken,
  // quadratic in the entries (160,000 loose tensors: minutes). Here the layers a recomputation
  // finds are the waiting layer slots (the slots of the queued modules, what its walk down the
  // splittable modules reaches), read from the size order; the names kept are model-order
  // positions in a sorted set, so taking an entry erases the range of its subtree.
  bool transformers_rules() const { return opts_.rules == PlanRules::transformers; }
  void tf_refresh_reserve(bool with_tensors) {
    tf_layers_.clear();
    tf_reserve_ = largest_waiting_module();
    for (auto i = top_; i < by_size_.size() && slots_[by_size_[i]].size == tf_reserve_; ++i)
      if (slots_[by_size_[i]].waiting) tf_layers_.insert(ix_.module_rank[layer_modules_[by_size_[i]]]);
    if (!with_tensors) return;
    for (auto e = front(); e != end_; e = nodes_[e].next) {
      if (is_module(e)) continue;
      const auto size = size_of(e);
      if (size > tf_reserve_) {
        tf_reserve_ = size;
        tf_layers_.clear();
      }
      if (size == tf_reserve_) tf_layers_.insert(rank_of(e));
    }
  }
  std::uint64_t tf_reserve_after_taking(std::uint32_t taken) {
    const auto first = rank_of(taken);
    const auto end = is_module(taken) ? ix_.module_end[taken] : first + 1;
    tf_layers_.erase(tf_layers_.lower_bound(first), tf_layers_.lower_bound(end));
    if (tf_layers_.empty()) tf_refresh_reserve(false);
    return tf_reserve_;
  }
  ///@}

  /// @name Ties
  ///@{
  bool inside(std::uint32_t entry, std::uint32_t tensor) const {
    return is_module(entry) ? ix_.contains(entry, tensor) : tensor_of(entry) == tensor;
  }
  // The tie groups with a member inside `entry`, each with its `inside` count.
  std::vector<std::uint32_t> groups_inside(std::uint32_t entry) {
    std::vector<std::uint32_t> groups;
    const auto stamp = ++group_epoch_;
    auto note = [&](std::uint32_t t) {
      const auto g = static_cast<std::uint32_t>(tensors_[t].tie_group);
      auto& group = tie_groups_[g];
      if (group.visit != stamp) {
        group.visit = stamp;
        group.inside = 0;
        groups.push_back(g);
      }
      ++group.inside;
    };
    if (is_module(entry)) {
      auto lo = std::lower_bound(tied_by_rank_.begin(), tied_by_rank_.end(), std::make_pair(ix_.module_rank[entry], 0u));
      for (auto it = lo; it != tied_by_rank_.end() && it->first < ix_.module_end[entry]; ++it) note(it->second);
    } else if (tensors_[tensor_of(entry)].tie_group >= 0) {
      note(tensor_of(entry));
    }
    return groups;
  }
  // The tied tensors outside `entry` whose group has a member inside it.
  std::vector<std::uint32_t> outside_tied(std::uint32_t entry) {
    std::vector<std::uint32_t> out;
    if (tied_by_rank_.empty()) return out;
    for (auto g : groups_inside(entry)) {
      const auto& group = tie_groups_[g];
      if (group.inside == group.members.size()) continue;
      for (auto t : group.members)
        if (!inside(entry, t)) out.push_back(t);
    }
    // transformers lists a group's names sorted, and splits the partners in that order.
    if (opts_.rules == PlanRules::transformers)
      std::sort(out.begin(), out.end(), [&](auto a, auto b) { return tree_.tensors()[a].name < tree_.tensors()[b].name; });
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
    const auto stamp = ++tie_epoch_;
    nodes_[cur].tie_visit = stamp;
    std::vector<std::uint32_t> work{cur};
    while (!work.empty()) {
      const auto e = work.back();
      work.pop_back();
      for (auto t : outside_tied(e)) {
        std::uint32_t x = node_of_tensor(t);
        while (x != none && nodes_[x].tie_visit != stamp && !present(x)) x = parent_of(x);
        if (x == none) {
          missing = true;
          continue;
        }
        if (nodes_[x].tie_visit == stamp) continue;
        if (tied_out) tied_out->push_back(t);
        nodes_[x].tie_visit = stamp;
        out.push_back(x);
        work.push_back(x);
      }
    }
    return out;
  }
  ///@}

  /// @name The loop
  ///@{
  // accelerate's greedy pass: the front entry goes on the current device with its tied partners
  // when they fit; otherwise a partner or the entry itself is split, or (optionally) a smaller
  // entry is brought forward; failing all that, the loop moves on to the next device.
  void place_all() {
    std::size_t d = 0;
    while (!queue_empty()) {
      const Candidate c = take_candidate();
      Device& dev = devices_[d];
      const Room room = room_on(dev, c.reserve);
      if (dev.main) dev.reserve_seen = room.reserved;
      if (!dev.bounded || dev.used + clamped(c.with_ties) <= room.limit) {
        place_with_partners(c, d, room);
        continue;
      }
      if (split_a_partner(c, dev, room)) continue;
      if (split_itself(c, dev, room)) continue;
      if (opts_.fallback_allocation && !dev.got_any && !dev.where.is_disk() &&
          try_fallback(c, d, dev.main ? room.reserved : c.reserve))
        continue;
      move_on(c, dev, room);
      push_front(c.node);
      if (++d == devices_.size()) fail(c);
    }
  }

  // Takes the front entry from the queue and finds what it weighs with its tied partners.
  Candidate take_candidate() {
    Candidate c;
    c.node = front();
    leave_queue(c.node);
    const std::string& name = name_of(c.node);
    if (log_) *log_ << "\nTreating module " << name << ".\n";
    c.reserve = transformers_rules() ? tf_reserve_after_taking(c.node) : largest_waiting_layer();
    c.size = size_of(c.node);
    bool missing = false;
    c.partners = tie_closure(c.node, [&](std::uint32_t e) { return nodes_[e].queued(); }, missing, &c.tied);
    if (missing)
      throw_error<planning_error>("internal planner error: a tensor tied to '", name,
                                  "' was placed before it; please report this with the model skeleton");
    if (log_ && !c.tied.empty()) {
      *log_ << "  Found the relevant tied param groups " << quoted_tensor_names(c.tied) << "\n";
      *log_ << "  So those parameters need to be taken into account " << quoted_names(c.partners) << "\n";
    }
    c.with_ties = c.size;
    for (auto p : c.partners) c.with_ties += size_of(p);
    return c;
  }

  // Main devices keep room for the largest waiting layer (the first GPU for gpu_reserve_layers).
  Room room_on(const Device& dev, std::uint64_t reserve) const {
    if (!dev.main) return Room{dev.budget, 0};
    const std::uint64_t reserved = dev.where.is_cpu() ? reserve : reserve * std::max<std::uint64_t>(opts_.gpu_reserve_layers, 1);
    return Room{dev.budget - clamped(reserved), reserved};
  }

  void place_with_partners(const Candidate& c, std::size_t d, const Room& room) {
    Device& dev = devices_[d];
    if (log_) {
      *log_ << "Putting " << name_of(c.node);
      if (!c.partners.empty()) *log_ << " and " << quoted_names(c.partners);
      *log_ << " (size=" << c.with_ties << ")";
      if (dev.bounded) *log_ << " (available=" << room.limit - dev.used << ")";
      *log_ << " on " << dev.where.to_string() << ".\n";
    }
    place(c.node, d);
    for (auto p : c.partners) {
      leave_queue(p);
      place(p, d);
    }
    dev.used += clamped(c.with_ties);
    dev.got_any = true;
  }

  void place(std::uint32_t node, std::size_t d) {
    nodes_[node].device = static_cast<std::int32_t>(d);
    placed_.push_back(node);
    if (!opts_.offload_buffers) devices_[d].buffers += buffer_bytes_of(node);
  }

  // Fits alone but not with its partners: split the first splittable partner and try again.
  bool split_a_partner(const Candidate& c, const Device& dev, const Room& room) {
    if (c.partners.empty() || dev.used + clamped(c.size) > room.limit) return false;
    if (log_)
      *log_ << "Not enough space on " << dev.where.to_string() << " to put " << name_of(c.node) << " and "
            << quoted_names(c.partners) << " (space available " << room.limit - dev.used << ", needed size " << c.with_ties
            << ").\n";
    const auto split = std::find_if(c.partners.begin(), c.partners.end(), [&](std::uint32_t p) { return splittable(p); });
    if (split == c.partners.end()) {
      if (log_) *log_ << "None of the tied module can be split, going to the next device.\n";
      return false;
    }
    if (log_) *log_ << "Splitting " << name_of(*split) << ".\n";
    expand_in_place(*split);
    push_front(c.node);
    if (transformers_rules()) tf_refresh_reserve(false);
    return true;
  }

  // Does not fit alone (transformers: or with its partners, none of which could be split): put
  // its parts at the front instead.
  bool split_itself(const Candidate& c, const Device& dev, const Room& room) {
    if (opts_.rules != PlanRules::transformers && dev.used + clamped(c.size) < room.limit) return false;
    if (log_)
      *log_ << "Not enough space on " << dev.where.to_string() << " to put " << name_of(c.node) << " (space available "
            << room.limit - dev.used << ", module size " << c.size << ").\n";
    if (!splittable(c.node)) {
      if (log_) *log_ << "This module cannot be split, going to the next device.\n";
      return false;
    }
    if (log_) *log_ << "Splitting " << name_of(c.node) << ".\n";
    expand_at_front(c.node);
    if (transformers_rules()) tf_refresh_reserve(false);
    return true;
  }

  // What the device is left with when the loop moves on to the next one.
  static void move_on(const Candidate& c, Device& dev, const Room& room) {
    if (!dev.got_any) dev.required = c.with_ties + room.reserved;
    dev.reserved_bookkeeping += static_cast<std::int64_t>(room.reserved);
    dev.fail_available = room.limit - dev.used;
    dev.fail_needed = c.with_ties;
  }
  ///@}

  /// @name Fallback (accelerate's fallback_allocate)
  ///@{
  bool try_fallback(const Candidate& c, std::size_t d, std::uint64_t reserve) {
    const Device& dev = devices_[d];
    const std::int64_t limit = dev.budget - clamped(std::max(reserve, c.with_ties));
    if (limit < 0) return false;
    const std::uint32_t found = find_fitting_entry(static_cast<std::uint64_t>(limit));
    if (found == none) return false;
    if (log_)
      *log_ << "Fallback: putting " << name_of(found) << " first, as it fits on " << dev.where.to_string() << " (limit "
            << limit << ").\n";
    bring_to_front(found, c.node);
    return true;
  }

  // Breadth-first over a copy of the queue; a splittable entry that is too big is replaced by its
  // parts at the front of the search.
  std::uint32_t find_fitting_entry(std::uint64_t limit) {
    std::deque<std::uint32_t> search;
    const std::uint32_t stamp = ++search_epoch_;
    if (in_search_.empty()) in_search_.assign(end_, 0);
    for (auto e = front(); e != end_; e = nodes_[e].next) {
      search.push_back(e);
      in_search_[e] = stamp;
    }
    while (!search.empty()) {
      const auto e = search.front();
      search.pop_front();
      in_search_[e] = 0;
      bool missing = false;
      const auto partners = tie_closure(e, [&](std::uint32_t x) { return in_search_[x] == stamp; }, missing);
      std::uint64_t need = size_of(e);
      for (auto p : partners) need += size_of(p);
      if (!missing && need <= limit) return e;
      if (splittable(e)) {
        std::vector<std::uint32_t> parts;
        for_each_part(e, [&](std::uint32_t x) { parts.push_back(x); });
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
          search.push_front(*it);
          in_search_[*it] = stamp;
        }
      }
    }
    return none;
  }

  // Expands the queued ancestors of `found` down to it, then queues it ahead of `cur`.
  void bring_to_front(std::uint32_t found, std::uint32_t cur) {
    std::vector<std::uint32_t> path;
    for (auto e = found; !nodes_[e].queued(); e = parent_of(e)) path.push_back(parent_of(e));
    for (auto it = path.rbegin(); it != path.rend(); ++it) expand_in_place(*it);
    leave_queue(found);
    push_front(cur);
    push_front(found);
  }
  ///@}

  [[noreturn]] void fail(const Candidate& c) const {
    std::string per_device;
    for (const auto& dev : devices_) per_device += "\n  " + dev.where.to_string() + ": " + failure_detail(dev);
    throw_error<planning_error>("cannot place '", name_of(c.node), "' (", c.with_ties, " bytes, ", text::format_bytes(c.with_ties),
                                ", with tied weights) on any device; model total ", result_.total_bytes, " bytes (",
                                text::format_bytes(result_.total_bytes), "); per device:", per_device,
                                "\nraise the budgets (--max-memory), add cpu, or allow disk offload");
  }

  static std::string failure_detail(const Device& dev) {
    if (dev.bounded && dev.budget == 0) return dev.where.is_disk() ? "forbidden (disk=0)" : "budget 0";
    std::string s = concat("needs ", dev.fail_needed, " bytes (", text::format_bytes(dev.fail_needed), "), available ",
                           std::max<std::int64_t>(0, dev.fail_available), " of budget ", dev.budget, " (",
                           text::format_bytes(static_cast<std::uint64_t>(dev.budget)), ")");
    if (dev.main) s += concat(", reserve ", dev.reserve_seen, " kept for the largest layer");
    return s;
  }

  /// @name The result
  ///@{
  PlanResult finish() {
    build_map();
    report_devices();
    note_devices_that_got_nothing();
    warn_about_resident_buffers();
    return std::move(result_);
  }

  void build_map() {
    std::sort(placed_.begin(), placed_.end(), [&](auto a, auto b) { return rank_of(a) < rank_of(b); });
    const std::vector<std::uint32_t> keys = opts_.clean_result ? merged_keys() : placed_;
    result_.device_map.reserve(keys.size());
    for (auto n : keys) result_.device_map.set(name_of(n), devices_[static_cast<std::size_t>(nodes_[n].device)].where);
  }

  // clean_device_map on the tree itself: a module whose subtree holds more than one placed entry,
  // all on one device, replaces them. Same result as the string version, without building it.
  std::vector<std::uint32_t> merged_keys() {
    struct Subtree {
      std::uint32_t placed = 0;  // placed entries inside
      std::int32_t device = -1;  // their device index, or -2 when they differ
    };
    std::vector<Subtree> subtrees(module_count_);
    auto add = [](Subtree& s, std::uint32_t placed, std::int32_t device) {
      if (placed == 0) return;
      s.placed += placed;
      if (s.device == -1) s.device = device;
      else if (s.device != device) s.device = -2;
    };
    for (auto n : placed_) add(subtrees[is_module(n) ? n : parent_of(n)], 1, nodes_[n].device);
    // Bottom-up, once per module (children have larger ids than their parents), rather than up
    // every placed entry's ancestors.
    for (std::uint32_t m = module_count_; m-- > 1;) add(subtrees[parent_of(m)], subtrees[m].placed, subtrees[m].device);
    // Top-down: emit merged modules; elsewhere emit placed entries as they are.
    std::vector<std::uint32_t> keys;
    std::vector<std::uint32_t> stack{0};
    while (!stack.empty()) {
      const auto m = stack.back();
      stack.pop_back();
      if (nodes_[m].device >= 0) {
        keys.push_back(m);
        continue;
      }
      if (subtrees[m].placed > 1 && subtrees[m].device >= 0) {
        keys.push_back(m);
        nodes_[m].device = subtrees[m].device;
        continue;
      }
      for_each_part(m, [&](std::uint32_t c) {
        if (!is_module(c)) {
          if (nodes_[c].device >= 0) keys.push_back(c);
        } else if (subtrees[c].placed > 0) {
          stack.push_back(c);
        }
      });
    }
    std::sort(keys.begin(), keys.end(), [&](auto a, auto b) { return rank_of(a) < rank_of(b); });
    return keys;
  }

  void report_devices() {
    for (const auto& dev : devices_) {
      DevicePlan p;
      p.device = dev.where;
      if (dev.bounded) p.budget = static_cast<std::uint64_t>(dev.budget);
      p.placed = static_cast<std::uint64_t>(dev.used);
      p.reserve = dev.reserve_seen;
      p.buffers = dev.buffers;
      p.main = dev.main;
      p.required = dev.required;
      result_.devices.push_back(std::move(p));
    }
    for (const auto& [key, where] : result_.device_map)
      for (auto& p : result_.devices)
        if (p.device == where) p.modules.push_back(key);
  }

  void note_devices_that_got_nothing() {
    std::string message = "no modules could be assigned to the following devices due to insufficient memory:";
    bool any = false;
    for (const auto& dev : devices_)
      if (!dev.got_any && dev.required) {  // set only once the device was tried
        message += concat("\n  - ", dev.where.to_string(), ": ", *dev.required, " bytes required");
        any = true;
      }
    if (any) result_.info.push_back(std::move(message));
  }

  void warn_about_resident_buffers() {
    std::uint64_t offloaded_buffers = 0;
    bool any_gpu = false;
    for (const auto& dev : devices_) {
      if (!dev.where.is_gpu()) offloaded_buffers += dev.buffers;
      any_gpu = any_gpu || dev.where.is_gpu();
    }
    if (opts_.offload_buffers || offloaded_buffers == 0 || !any_gpu) return;
    const bool fits = std::any_of(devices_.begin(), devices_.end(), [&](const Device& dev) {
      return dev.where.is_gpu() && dev.budget >= static_cast<std::int64_t>(offloaded_buffers) + dev.used + dev.reserved_bookkeeping;
    });
    if (!fits)
      result_.warnings.push_back(concat("offloaded modules hold ", offloaded_buffers,
                                        " bytes of buffers that stay resident on the execution GPU, and no GPU "
                                        "has that much room left; plan with offload_buffers (--offload-buffers) "
                                        "if loading runs out of memory"));
  }
  ///@}

  const ModuleTree& tree_;
  const PlanOptions& opts_;
  std::shared_ptr<const TreeIndex> index_;
  const TreeIndex& ix_;
  const ModuleSizes& sizes_;
  std::ostream* log_;
  NoSplitRule no_split_rule_{};
  std::uint32_t module_count_, end_;
  PlanResult result_;
  std::vector<Node> nodes_;  // end_ + 1: every module, every tensor, the sentinel
  std::vector<ModuleState> modules_;
  std::vector<TensorState> tensors_;
  std::vector<LayerSlot> slots_;
  std::vector<std::uint32_t> by_size_;  // slots, largest first
  std::uint32_t top_ = 0;               // by_size_ cursor: no waiting slot before it
  std::vector<std::pair<std::uint64_t, std::uint32_t>> tensor_heap_;  // (size, tensor), lazy deletion
  std::vector<TieGroup> tie_groups_;
  std::vector<std::uint32_t> layer_modules_;  // slot -> its module
  std::uint64_t tf_reserve_ = 0;              // transformers' largest layer size
  std::set<std::uint32_t> tf_layers_;         // and the model-order positions of the layers of that size still counted
  std::vector<std::pair<std::uint32_t, std::uint32_t>> tied_by_rank_;  // (rank, tensor) of tied tensors
  std::vector<Device> devices_;
  std::vector<std::uint32_t> placed_;
  std::uint32_t tie_epoch_ = 0, group_epoch_ = 0;
  // The fallback search's scratch, allocated on first use: the stamp of the search holding a node.
  std::vector<std::uint32_t> in_search_;
  std::uint32_t search_epoch_ = 0;
};

}  // namespace detail
ACCEL_NAMESPACE_END
