// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file map_names.hpp
/// @brief Device maps in either kind of name: which kind a map uses (model names, what
///        transformers' from_pretrained wants; checkpoint names, what the files hold and
///        accelerate's load_checkpoint_and_dispatch reads), and a map rewritten in checkpoint names.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <accel/model/names.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief The kind of names a device map's keys are.
enum class MapNames : std::uint8_t {
  model,       ///< the model's (transformers 5) names
  checkpoint,  ///< the checkpoint's names
};

/// @brief "model" or "checkpoint".
[[nodiscard]] constexpr std::string_view map_names_name(MapNames n) noexcept {
  return n == MapNames::model ? "model" : "checkpoint";
}

/// @brief Parses "model" or "checkpoint".
/// @throws accel::usage_error for anything else
[[nodiscard]] inline MapNames parse_map_names(std::string_view s) {
  if (s == "model") return MapNames::model;
  if (s == "checkpoint") return MapNames::checkpoint;
  detail::throw_error<usage_error>("names '", s, "' is not model or checkpoint");
}

namespace detail {

// Names sorted with their indices, so the names under a key (`key` itself and `key.…`) are found
// by two binary searches.
class SortedNames {
 public:
  // Views of `names`, which outlive it.
  template <class Names>
  explicit SortedNames(const Names& names) {
    sorted_.reserve(names.size());
    for (std::size_t i = 0; i < names.size(); ++i) sorted_.emplace_back(std::string_view(names[i]), i);
    std::sort(sorted_.begin(), sorted_.end());
  }
  // Indices of the names equal to `key` or starting with `key.` ("" covers everything).
  [[nodiscard]] std::vector<std::size_t> under(std::string_view key) const {
    std::vector<std::size_t> out;
    if (key.empty()) {
      for (const auto& [n, i] : sorted_) out.push_back(i);
      return out;
    }
    auto by_name = [](const std::pair<std::string_view, std::size_t>& e, std::string_view k) { return e.first < k; };
    for (auto it = std::lower_bound(sorted_.begin(), sorted_.end(), key, by_name); it != sorted_.end() && it->first == key; ++it)
      out.push_back(it->second);
    const std::string dotted = concat(key, ".");
    for (auto it = std::lower_bound(sorted_.begin(), sorted_.end(), std::string_view(dotted), by_name);
         it != sorted_.end() && it->first.starts_with(dotted); ++it)
      out.push_back(it->second);
    std::sort(out.begin(), out.end());
    return out;
  }
  [[nodiscard]] bool covers_any(std::string_view key) const { return key.empty() || !under(key).empty(); }

 private:
  std::vector<std::pair<std::string_view, std::size_t>> sorted_;
};

// The dotted prefix every name shares ("" when none).
inline std::string common_dotted_prefix(const std::vector<std::string_view>& names) {
  if (names.empty()) return std::string();
  std::string_view p = names.front();
  for (auto n : names) {
    std::size_t i = 0;
    while (i < p.size() && i < n.size() && p[i] == n[i]) ++i;
    if (!(i == p.size() && (n.size() == i || n[i] == '.'))) {
      // cut back to a whole dotted part of both
      while (i > 0 && !((i == p.size() || p[i] == '.') && (i == n.size() || n[i] == '.'))) --i;
      p = p.substr(0, i);
    }
  }
  return std::string(p);
}

}  // namespace detail

/// @brief Which kind of names a device map uses, judged by its keys: a key is a model name when
///        it is, or is a dotted prefix of, a model name of the table (or of `model_extra`: tied copies
///        and computed buffers the checkpoint does not hold), and a checkpoint name likewise. Keys
///        that are both say nothing; keys that are neither are left to the loader's report.
/// @return model when every key is a model name (a map that fits both is read as model names:
///         where no name changes, the two are the same map)
/// @throws accel::config_error naming a key of each kind when some keys are only model names and
///         others only checkpoint names
[[nodiscard]] inline MapNames detect_map_names(const DeviceMap& map, const NameTable& table,
                                               const std::vector<std::string>& model_extra = {}) {
  if (table.identity()) return MapNames::model;
  const detail::SortedNames model(table.model), checkpoint(table.checkpoint), extra(model_extra);
  std::string only_model, only_checkpoint;
  for (const auto& [key, where] : map) {
    const bool m = model.covers_any(key) || extra.covers_any(key), c = checkpoint.covers_any(key);
    if (m && !c && only_model.empty()) only_model = key;
    if (c && !m && only_checkpoint.empty()) only_checkpoint = key;
  }
  if (!only_model.empty() && !only_checkpoint.empty())
    detail::throw_error<config_error>("device map mixes model names ('", only_model, "') and checkpoint names ('",
                                      only_checkpoint, "') of ", table.source,
                                      "; write it in one kind (accel plan --names model|checkpoint writes either)");
  return only_checkpoint.empty() ? MapNames::model : MapNames::checkpoint;
}

/// @brief A device map in model names rewritten in checkpoint names, in the same order: each key
///        becomes the shortest checkpoint prefix that holds exactly the checkpoint tensors whose model
///        names it covers (`vit.layers.3` -> `vit.encoder.layer.3`, `lm_head` -> `embed_out`), else
///        those tensors' own names (a fused `experts.gate_up_proj` -> every expert's `gate_proj` and
///        `up_proj`). Keys that cover no checkpoint tensor (a tied copy, a computed buffer, an
///        unknown name) stay as they are. Every checkpoint tensor lands where the model map put
///        the model tensor it makes.
[[nodiscard]] inline DeviceMap to_checkpoint_names(const DeviceMap& map, const NameTable& table) {
  if (table.identity()) return map;
  const detail::SortedNames model(table.model), checkpoint(table.checkpoint);
  DeviceMap out;
  auto add = [&](std::string_view key, Placement where) {
    if (!out.find(key)) out.set(std::string(key), where);
  };
  for (const auto& [key, where] : map) {
    const auto idx = model.under(key);
    if (key.empty() || idx.empty()) {
      add(key, where);
      continue;
    }
    // The same relative path on both sides: `lm_head` + `.weight` <- `embed_out` + `.weight`.
    std::string candidate;
    bool same = true;
    for (std::size_t n = 0; n < idx.size() && same; ++n) {
      const std::string_view m = table.model[idx[n]], c = table.checkpoint[idx[n]];
      const auto rel = m.substr(key.size());
      same = c.size() > rel.size() && c.ends_with(rel);
      if (!same) break;
      const auto prefix = c.substr(0, c.size() - rel.size());
      if (n == 0) candidate = std::string(prefix);
      else same = prefix == candidate;
    }
    if (!same) {
      std::vector<std::string_view> names;
      for (auto i : idx) names.push_back(table.checkpoint[i]);
      candidate = detail::common_dotted_prefix(names);
    }
    if (!candidate.empty() && checkpoint.under(candidate) == idx) {
      // The shortest name for the same tensors: `…layer.1.output.dense.weight` -> `…layer.1.output`.
      for (auto dot = candidate.rfind('.'); dot != std::string::npos; dot = candidate.rfind('.')) {
        if (checkpoint.under(std::string_view(candidate).substr(0, dot)) != idx) break;
        candidate.resize(dot);
      }
      add(candidate, where);
    } else {
      // Each on its own, where the model map puts the model tensor it makes (a longer key may
      // place it elsewhere than `key`).
      for (auto i : idx) add(table.checkpoint[i], map.placement_of(table.model[i]).value_or(where));
    }
  }
  return out;
}

ACCEL_NAMESPACE_END
