// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file device_map.hpp
/// @brief DeviceMap: module/tensor name → GPU index, `cpu` or `disk`, in model order; HF JSON;
///        clean_device_map, check_device_map and classify_unused_keys.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/model/json.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/model/module_tree.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Where a module or tensor lives: a GPU (by index), CPU memory, or the disk offload folder.
struct Placement {
  /// @brief The three kinds, in fill order.
  enum class Kind : std::uint8_t { gpu, cpu, disk };
  Kind kind = Kind::cpu;  ///< which kind
  int index = 0;          ///< GPU index (0 for cpu/disk)

  /// @brief GPU `i`.
  [[nodiscard]] static constexpr Placement gpu(int i) noexcept { return {Kind::gpu, i}; }
  /// @brief CPU memory.
  [[nodiscard]] static constexpr Placement cpu() noexcept { return {Kind::cpu, 0}; }
  /// @brief Disk offload.
  [[nodiscard]] static constexpr Placement disk() noexcept { return {Kind::disk, 0}; }
  [[nodiscard]] constexpr bool is_gpu() const noexcept { return kind == Kind::gpu; }
  [[nodiscard]] constexpr bool is_cpu() const noexcept { return kind == Kind::cpu; }
  [[nodiscard]] constexpr bool is_disk() const noexcept { return kind == Kind::disk; }
  /// @brief "0", "cpu" or "disk".
  [[nodiscard]] std::string to_string() const {
    return kind == Kind::gpu ? std::to_string(index) : kind == Kind::cpu ? "cpu" : "disk";
  }
  /// @brief The HF JSON value: a number for a GPU, else the string.
  [[nodiscard]] nlohmann::json to_json() const {
    return kind == Kind::gpu ? nlohmann::json(index) : nlohmann::json(to_string());
  }
  friend constexpr bool operator==(const Placement&, const Placement&) = default;
  /// GPUs by index, then cpu, then disk (the fill order).
  friend constexpr auto operator<=>(const Placement& a, const Placement& b) noexcept {
    if (a.kind != b.kind) return static_cast<int>(a.kind) <=> static_cast<int>(b.kind);
    return a.index <=> b.index;
  }
};

/// @brief The layer a tensor belongs to: its name up to its first numeric component
///        ("model.layers.3" for "model.layers.3.mlp.up_proj.weight"), else its module ("lm_head" for
///        "lm_head.weight"; "" for a top-level tensor). What a forward pass fetches as one unit and
///        what the planner's largest-layer reserve counts.
[[nodiscard]] inline std::string_view layer_of(std::string_view tensor) {
  for (std::size_t start = 0;;) {
    const std::size_t dot = tensor.find('.', start);
    if (dot == std::string_view::npos) return tensor.substr(0, start == 0 ? 0 : start - 1);  // the last part names the tensor
    const auto part = tensor.substr(start, dot - start);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return tensor.substr(0, dot);
    start = dot + 1;
  }
}

namespace detail {
// The placements a device map may give, as numbers and as strings (nullopt for anything else).
inline std::optional<Placement> placement_of_number(std::uint64_t index) {
  return index < 1u << 20 ? std::optional(Placement::gpu(static_cast<int>(index))) : std::nullopt;
}
inline std::optional<Placement> placement_of_text(std::string_view s) {
  if (s == "cpu") return Placement::cpu();
  if (s == "disk") return Placement::disk();
  if (auto index = text::parse_integer<int>(s.starts_with("cuda:") ? s.substr(5) : s); index && *index < 1 << 20)
    if (*index >= 0) return Placement::gpu(*index);
  return std::nullopt;
}
}  // namespace detail

/// @brief Parses a device-map value: a non-negative integer, "cpu", "disk", "cuda:N" or "N".
/// @param value the JSON value
/// @param key the map key, for the message
/// @throws accel::config_error for anything else ("meta", "mps", negative numbers)
[[nodiscard]] inline Placement parse_placement(const nlohmann::json& value, std::string_view key) {
  std::optional<Placement> p;
  if (value.is_number_unsigned()) p = detail::placement_of_number(value.get<std::uint64_t>());
  else if (value.is_string()) p = detail::placement_of_text(value.get_ref<const std::string&>());
  if (!p)
    detail::throw_error<config_error>("device map value for '", key, "' is ", json_excerpt(value),
                                      "; use a GPU index (0, 1, ...), \"cpu\" or \"disk\"");
  return *p;
}

/// @brief The most entries a device map file may have: more than 100 times the keys of the largest
///        checkpoints (DeepSeek-V3: about 92,000 tensors); a file past it is refused before it is
///        held in memory.
inline constexpr std::size_t device_map_max_entries = std::size_t{1} << 24;

/// @brief An ordered map from module or tensor names to placements (HF `device_map`).
///
/// A key covers the tensor of that name or every tensor below it (`model.layers.0` covers
/// `model.layers.0.mlp.up_proj.weight`); `""` covers everything. Insertion order is kept; maps
/// the planner makes are in model order.
class DeviceMap {
 public:
  using Entry = std::pair<std::string, Placement>;  ///< one key and its placement

  /// @brief Sets (or overwrites, keeping its position) the placement of `name`.
  void set(std::string name, Placement p) {
    auto it = index_.find(name);
    if (it != index_.end()) {
      entries_[it->second].second = p;
      return;
    }
    if (name.size() >= key_lengths_.size()) key_lengths_.resize(name.size() + 1, false);
    key_lengths_[name.size()] = true;
    index_.emplace(name, entries_.size());
    entries_.emplace_back(std::move(name), p);
  }
  /// @brief Reserves room for `n` keys.
  void reserve(std::size_t n) {
    entries_.reserve(n);
    index_.reserve(n);
  }
  /// @brief The placement stored under exactly `key`, or nullptr.
  [[nodiscard]] const Placement* find(std::string_view key) const {
    if (!has_key_of_length(key.size())) return nullptr;
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &entries_[it->second].second;
  }
  /// @brief The entry covering a tensor or module: the longest key equal to it or a dotted prefix
  ///        of it (`""` covers everything), or nullptr. One hash lookup per dotted component as long
  ///        as some key has, so linear in the name's length plus the keys' (a name of 80,000 parts
  ///        does not hash 80,000 prefixes).
  [[nodiscard]] const Entry* covering(std::string_view name) const {
    while (true) {
      if (has_key_of_length(name.size()))
        if (auto it = index_.find(name); it != index_.end()) return &entries_[it->second];
      if (name.empty()) return nullptr;
      const auto dot = name.rfind('.');
      name = name.substr(0, dot == std::string_view::npos ? 0 : dot);
    }
  }
  /// @brief Placement of a tensor or module: that of the entry covering() it.
  [[nodiscard]] std::optional<Placement> placement_of(std::string_view name) const {
    if (const auto* e = covering(name)) return e->second;
    return std::nullopt;
  }
  [[nodiscard]] const std::vector<Entry>& entries() const noexcept { return entries_; }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  [[nodiscard]] auto begin() const noexcept { return entries_.begin(); }
  [[nodiscard]] auto end() const noexcept { return entries_.end(); }
  /// @brief The distinct placements used, in fill order (GPUs ascending, cpu, disk).
  [[nodiscard]] std::vector<Placement> devices() const {
    std::vector<Placement> out;
    for (const auto& [k, p] : entries_) out.push_back(p);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  /// @brief The HF JSON object, keys in map order.
  [[nodiscard]] nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    // Appended to ordered_json's vector of pairs directly: its own insert searches the keys
    // linearly (quadratic in the map's size), and the keys here are distinct already.
    using Object = nlohmann::ordered_json::object_t;
    auto& pairs = static_cast<std::vector<Object::value_type, Object::allocator_type>&>(j.get_ref<Object&>());
    pairs.reserve(entries_.size());
    for (const auto& [k, p] : entries_) pairs.emplace_back(k, p.to_json());
    return j;
  }
  /// @brief to_json() as text (`indent` < 0: one line).
  [[nodiscard]] std::string to_json_string(int indent = -1) const { return to_json().dump(indent); }

  /// @brief Parses the HF JSON object (`{"model.layers.0": 0, "lm_head": "cpu"}`), keeping key order,
  ///        in one pass and O(n) for n keys.
  /// @param max_entries the most keys accepted (device_map_max_entries unless a test lowers it)
  /// @throws accel::config_error for invalid JSON, a non-object, a duplicate key, a bad value, more
  ///         than `max_entries` keys, or a key of more than max_name_parts dotted parts (no
  ///         module or tensor has such a name)
  [[nodiscard]] static DeviceMap from_json(std::string_view text, std::size_t max_entries = device_map_max_entries);

 private:
  std::vector<Entry> entries_;
  // Transparent hashing: lookups by string_view (covering() walks prefixes) allocate nothing.
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::size_t, KeyHash, std::equal_to<>> index_;
  // Which key lengths occur: a prefix of no key's length is not hashed (lookups along a name's
  // prefixes would otherwise hash each one, quadratic in its depth).
  std::vector<bool> key_lengths_;
  [[nodiscard]] bool has_key_of_length(std::size_t n) const noexcept { return n < key_lengths_.size() && key_lengths_[n]; }
};

namespace detail {
// Reads a device map straight into a DeviceMap, in file order: nlohmann's ordered_json would keep
// the order too, but finds each key by a linear search, quadratic in the map's size (200,000 keys:
// minutes), and a DOM would be built only to be copied. Anything it does not expect (a syntax
// error, a duplicate or too deep key, a value that is no placement) stops it; the caller then
// words the error from a strict parse.
class DeviceMapReader final : public nlohmann::json_sax<nlohmann::json> {
 public:
  DeviceMapReader(DeviceMap& map, std::size_t limit) : map_(map), limit_(limit) {}
  bool over_limit = false;  ///< stopped at key number limit + 1
  bool complete = false;    ///< read a whole object of valid entries

  bool null() override { return false; }
  bool boolean(bool) override { return false; }
  bool number_integer(number_integer_t) override { return false; }  // negative
  bool number_unsigned(number_unsigned_t v) override { return put(placement_of_number(v)); }
  bool number_float(number_float_t, const string_t&) override { return false; }
  bool string(string_t& v) override { return put(placement_of_text(v)); }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override { return std::exchange(started_, true) == false; }
  bool end_object() override { return complete = true; }  // the top level's: deeper ones were refused
  bool start_array(std::size_t) override { return false; }
  bool end_array() override { return false; }
  bool key(string_t& k) override {
    if (map_.size() == limit_) {
      over_limit = true;
      return false;
    }
    if (name_parts(k) > max_name_parts || map_.find(k)) return false;
    key_ = k;
    pending_ = true;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool put(std::optional<Placement> p) {
    if (!p || !pending_) return false;  // (a value outside the object: a top level that is not one)
    map_.set(std::move(key_), *p);
    key_.clear();
    pending_ = false;
    return true;
  }
  DeviceMap& map_;
  std::size_t limit_;
  std::string key_;
  bool started_ = false, pending_ = false;
};

// The top-level keys of a JSON object in file order, for the error of a map the reader refused.
class TopLevelKeys final : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::vector<std::string> keys;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth_ > 0; }
  bool end_object() override { return --depth_ >= 0; }
  bool start_array(std::size_t) override { return ++depth_ > 0; }
  bool end_array() override { return --depth_ >= 0; }
  bool key(string_t& k) override {
    if (depth_ == 1) keys.push_back(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  long depth_ = 0;
};
}  // namespace detail

inline DeviceMap DeviceMap::from_json(std::string_view text, std::size_t max_entries) {
  DeviceMap m;
  detail::DeviceMapReader reader(m, max_entries);
  try {
    if (nlohmann::json::sax_parse(text.begin(), text.end(), &reader) && reader.complete) return m;
  } catch (const nlohmann::json::exception&) {
    // (the strict parse below says what)
  }
  if (reader.over_limit)
    detail::throw_error<config_error>("device map has more than ", max_entries, " entries, the most accel reads (a model "
                                      "has far fewer modules and tensors); write one key per module or layer, or \"\" "
                                      "for everything");
  // Something is wrong: say what, as a strict parse and then each entry in file order find it.
  auto parsed = parse_json_strict(text);
  if (!parsed.error.empty()) detail::throw_error<config_error>("device map is not valid JSON: ", parsed.error);
  if (!parsed.value.is_object())
    detail::throw_error<config_error>("device map is a JSON ", parsed.value.type_name(), ", not an object of name → device");
  detail::TopLevelKeys order;
  (void)nlohmann::json::sax_parse(text.begin(), text.end(), &order);
  for (const auto& k : order.keys) {
    if (const auto parts = name_parts(k); parts > max_name_parts)
      detail::throw_error<config_error>("device map key '", text::excerpt(k, 200), "' has ", parts, " dotted parts, more than the ",
                                        max_name_parts, " a module or tensor name may have, so it names nothing of a model; "
                                        "drop it or fix it");
    (void)parse_placement(parsed.value[k], k);
  }
  throw std::logic_error("internal error: the device map reader refused a map the strict parse accepts; please report "
                         "this with the map");
}

/// @brief accelerate's clean_device_map: wherever every key below a prefix shares one placement and
///        there is more than one such key, they are replaced by the prefix (`""` for all).
///
/// In: `{"a.x":0,"a.y":0,"b.x":1,"b.y":1,"c":1}` Out: `{"a":0,"b":1,"c":1}`. Unlike accelerate
/// (which appends merged keys, so order depends on hashing), each merged key takes the position
/// of the first key it replaces, so the result stays in the input's order.
[[nodiscard]] inline DeviceMap clean_device_map(const DeviceMap& map) {
  // Trie over dotted components; each node knows its subtree's key count and common placement.
  struct Node {
    std::string name;
    std::vector<std::size_t> children;
    std::unordered_map<std::string_view, std::size_t> child_ids;
    std::optional<Placement> own;  // a key exactly at this node
    std::size_t first = SIZE_MAX;  // smallest input position in the subtree
    std::size_t count = 0;
    bool uniform = true;
    Placement value{};
  };
  std::vector<Node> nodes(1);
  const auto& es = map.entries();
  for (std::size_t i = 0; i < es.size(); ++i) {
    std::string_view key = es[i].first;
    std::size_t cur = 0;
    if (!key.empty()) {
      std::size_t start = 0;
      while (true) {
        auto dot = key.find('.', start);
        auto end = dot == std::string_view::npos ? key.size() : dot;
        auto part = key.substr(start, end - start);
        auto it = nodes[cur].child_ids.find(part);
        if (it == nodes[cur].child_ids.end()) {
          const std::size_t id = nodes.size();
          nodes.push_back(Node{std::string(key.substr(0, end)), {}, {}, std::nullopt, SIZE_MAX, 0, true, {}});
          // string_view keys point into the (stable) std::string of the map entry.
          nodes[cur].child_ids.emplace(part, id);
          nodes[cur].children.push_back(id);
          cur = id;
        } else {
          cur = it->second;
        }
        if (dot == std::string_view::npos) break;
        start = dot + 1;
      }
    }
    nodes[cur].own = es[i].second;
    nodes[cur].first = std::min(nodes[cur].first, i);
  }
  // Children have larger ids than parents: fold bottom-up.
  for (std::size_t n = nodes.size(); n-- > 0;) {
    auto& node = nodes[n];
    bool have = false;
    if (node.own) {
      node.value = *node.own;
      node.count = 1;
      have = true;
    }
    for (auto c : node.children) {
      const auto& ch = nodes[c];
      if (ch.count == 0) continue;
      node.first = std::min(node.first, ch.first);
      node.count += ch.count;
      if (!ch.uniform) node.uniform = false;
      else if (have && !(ch.value == node.value)) node.uniform = false;
      else if (!have) {
        node.value = ch.value;
        have = true;
      }
    }
  }
  std::vector<std::pair<std::size_t, DeviceMap::Entry>> out;
  std::vector<std::size_t> stack{0};
  while (!stack.empty()) {
    const auto n = stack.back();
    stack.pop_back();
    const auto& node = nodes[n];
    if (node.count == 0) continue;
    if (node.uniform && node.count > 1) {
      out.push_back({node.first, {node.name, node.value}});
      continue;
    }
    if (node.own) out.push_back({node.first, {node.name, *node.own}});
    for (auto c : node.children) stack.push_back(c);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  DeviceMap result;
  for (auto& [pos, e] : out) result.set(std::move(e.first), e.second);
  return result;
}

/// @brief What check_device_map found that is allowed but suspicious.
struct DeviceMapCheck {
  std::vector<std::string> warnings;  ///< e.g. tied tensors on different devices
};

/// @brief Verifies that `map` gives every tensor of `tree` (parameters, buffers, every name of a
///        tied tensor) exactly one placement.
/// @return warnings (tied tensors split across devices)
/// @throws accel::planning_error listing uncovered tensors, tensors covered by two keys, or keys
///         that name no module or tensor of the tree
[[nodiscard]] inline DeviceMapCheck check_device_map(const ModuleTree& tree, const DeviceMap& map) {
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    for (std::size_t i = 0; i < names.size() && i < 10; ++i) s += (i ? ", " : "") + names[i];
    if (names.size() > 10) s += detail::concat(", ... (", names.size() - 10, " more)");
    return s;
  };
  std::vector<std::string> unknown;
  for (const auto& [k, p] : map)
    if (!k.empty() && !tree.find_module(k) && !tree.find_tensor(k)) unknown.push_back(k);
  if (!unknown.empty())
    detail::throw_error<planning_error>("device map names ", unknown.size(), " key(s) that are neither modules nor tensors of the model: ",
                                        list(unknown), "; check the spelling against the model's names");
  std::vector<std::string> uncovered, twice;
  std::vector<std::optional<Placement>> where(tree.tensors().size());
  for (std::size_t t = 0; t < tree.tensors().size(); ++t) {
    const auto& name = tree.tensors()[t].name;
    std::string key = name;
    int hits = 0;
    while (true) {
      if (const auto* p = map.find(key)) {
        if (!hits) where[t] = *p;
        ++hits;
      }
      if (key.empty()) break;
      auto dot = key.rfind('.');
      key.resize(dot == std::string::npos ? 0 : dot);
    }
    if (hits == 0) uncovered.push_back(name);
    else if (hits > 1) twice.push_back(name);
  }
  if (!uncovered.empty())
    detail::throw_error<planning_error>("device map does not give a device for ", uncovered.size(), " tensor(s): ", list(uncovered),
                                        "; add their modules to the map (or use \"\" for everything)");
  if (!twice.empty())
    detail::throw_error<planning_error>("device map places ", twice.size(), " tensor(s) twice, through nested keys: ", list(twice),
                                        "; keep only one of a key and the keys below it");
  DeviceMapCheck out;
  const auto cached = tree.index();  // shared with the planner's runs on this tree
  const TreeIndex& ix = *cached;
  for (const auto& g : ix.tied_groups) {
    bool split = false;
    for (auto t : g) split = split || !(*where[t] == *where[g.front()]);
    if (!split) continue;
    std::string desc;
    for (auto t : g) desc += (desc.empty() ? "" : ", ") + tree.tensors()[t].name + " on " + where[t]->to_string();
    out.warnings.push_back("tied tensors are on different devices (" + desc + "); they will be loaded as separate copies");
  }
  return out;
}

/// @brief Device-map keys that cover no checkpoint tensor (LoadReport::unused_keys), split by
///        whether the model explains them.
struct UnusedKeys {
  /// Keys naming a module or tensor of the model whose every tensor is a non-persistent buffer
  /// (rotary `inv_freq`: computed, never saved) or a tied copy of another tensor (`lm_head` tied to
  /// the input embedding: saved once): planned, as transformers plans them, with nothing to load.
  std::vector<std::string> model_only;
  /// Every other key: not a name of the model, or a module whose weights the checkpoint lacks.
  std::vector<std::string> unknown;
};

/// @brief Sorts `keys` (device-map keys that cover no checkpoint tensor) into the ones `tree`
///        explains and the others; order is kept within each list.
/// @note `accel load` reports only UnusedKeys::unknown, so a map written by `accel plan --json`
///       for a model built from its config.json loads without notes about its buffer and tied keys.
[[nodiscard]] inline UnusedKeys classify_unused_keys(const ModuleTree& tree, const std::vector<std::string>& keys) {
  UnusedKeys out;
  if (keys.empty()) return out;
  const auto cached = tree.index();
  const TreeIndex& ix = *cached;
  std::vector<bool> tied(tree.tensors().size(), false);
  for (const auto& g : ix.tied_groups)
    if (g.size() > 1)
      for (auto t : g) tied[t] = true;
  auto nothing_to_load = [&](std::size_t t) {
    const auto& ten = tree.tensors()[t];
    return tied[t] || (ten.buffer && !ten.persistent);
  };
  // Per module: whether every tensor of its subtree has nothing to load, folded bottom-up
  // (children have larger ids than their parents) so that each key costs one lookup, not a scan
  // of the tree (a map of many such keys would be quadratic).
  const auto& mods = tree.modules();
  std::vector<bool> computed_only(mods.size(), true);
  for (std::size_t t = 0; t < tree.tensors().size(); ++t)
    if (!nothing_to_load(t)) computed_only[tree.tensors()[t].module] = false;
  for (std::size_t m = mods.size(); m-- > 1;)
    if (!computed_only[m]) computed_only[mods[m].parent] = false;
  for (const auto& key : keys) {
    bool explained = false;
    if (auto id = tree.find_tensor(key)) explained = nothing_to_load(*id);
    else if (auto m = tree.find_module(key); m && !key.empty()) explained = computed_only[*m];
    (explained ? out.model_only : out.unknown).push_back(key);
  }
  return out;
}

ACCEL_NAMESPACE_END
