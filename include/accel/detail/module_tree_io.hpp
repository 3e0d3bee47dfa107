// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file module_tree_io.hpp
/// @brief Building a ModuleTree from the model skeleton JSON or from safetensors headers.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../config.hpp"
#include "../dtype.hpp"
#include "../error.hpp"
#include "../module_tree.hpp"
#include "../safetensors.hpp"
#include "strict_json.hpp"

ACCEL_NAMESPACE_BEGIN

namespace detail {

struct SkeletonReader {
  std::string_view label;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw_error<config_error>("malformed model skeleton '", label, "': ", field, " ", what,
                              "; see the skeleton format (modules/parameters/buffers/tied) in the README");
  }

  const nlohmann::json* optional_array(const nlohmann::json& root, const char* key) const {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) return nullptr;
    if (!it->is_array()) fail(key, concat("is a JSON ", it->type_name(), ", not an array"));
    return &*it;
  }

  std::string string_field(const nlohmann::json& obj, const std::string& where, const char* key, bool required) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      if (required) fail(where, concat("has no '", key, "'"));
      return {};
    }
    if (!it->is_string()) fail(where + "." + key, concat("is a JSON ", it->type_name(), ", not a string"));
    return it->get<std::string>();
  }

  void read_tensors(ModuleTree& tree, const nlohmann::json& list, const char* key, bool buffers,
                    std::vector<std::pair<std::string, std::string>>& aliases) const {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto& e = list[i];
      const std::string where = std::string(key) + "[" + std::to_string(i) + "]";
      if (!e.is_object()) fail(where, concat("is a JSON ", e.type_name(), ", not an object"));
      const auto name = string_field(e, where, "name", true);
      const auto alias = string_field(e, where, "alias_of", false);
      const auto dtype_text = string_field(e, where, "dtype", alias.empty());
      std::vector<std::int64_t> shape;
      auto sh = e.find("shape");
      if (sh == e.end() || sh->is_null()) {
        if (alias.empty()) fail(where, "has no 'shape'");
      } else {
        if (!sh->is_array()) fail(where + ".shape", concat("is a JSON ", sh->type_name(), ", not an array"));
        for (std::size_t d = 0; d < sh->size(); ++d) {
          const auto& v = (*sh)[d];
          if (!v.is_number_unsigned() || v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
            fail(concat(where, ".shape[", d, "]"), concat("is ", v.dump(), ", not a non-negative integer"));
          shape.push_back(static_cast<std::int64_t>(v.get<std::uint64_t>()));
        }
      }
      bool persistent = true;
      if (auto p = e.find("persistent"); p != e.end() && !p->is_null()) {
        if (!p->is_boolean()) fail(where + ".persistent", concat("is ", p->dump(), ", not true or false"));
        persistent = p->get<bool>();
      }
      if (!alias.empty()) {
        if (buffers) fail(where + ".alias_of", "is given on a buffer; only parameters can be aliases");
        aliases.emplace_back(name, alias);
        // Without dtype/shape, both come from the target once every tensor is known.
        if (dtype_text.empty() || sh == e.end() || sh->is_null()) continue;
      }
      auto dtype = try_dtype_from_string(dtype_text);
      if (!dtype)
        fail(where + ".dtype", concat("is '", dtype_text, "', not a known dtype (", accepted_dtype_names(), ")"));
      try {
        if (buffers) tree.add_buffer(name, *dtype, std::move(shape), persistent);
        else tree.add_parameter(name, *dtype, std::move(shape));
      } catch (const usage_error& err) {
        fail(where, concat("is invalid: ", err.what()));
      }
    }
  }

  ModuleTree read(std::string_view text) const {
    auto parsed = parse_json_strict(text);
    if (!parsed.error.empty()) fail("the file", "is not valid JSON: " + parsed.error);
    const auto& root = parsed.value;
    if (!root.is_object()) fail("the top level", concat("is a JSON ", root.type_name(), ", not an object"));
    ModuleTree tree;
    {
      auto count = [&](const char* k) {
        auto it = root.find(k);
        return it != root.end() && it->is_array() ? it->size() : std::size_t{0};
      };
      tree.reserve(count("modules"), count("parameters") + count("buffers"));
    }
    if (const auto* mods = optional_array(root, "modules")) {
      for (std::size_t i = 0; i < mods->size(); ++i) {
        const auto& e = (*mods)[i];
        const std::string where = "modules[" + std::to_string(i) + "]";
        if (!e.is_object()) fail(where, concat("is a JSON ", e.type_name(), ", not an object"));
        auto name_it = e.find("name");
        if (name_it == e.end() || !name_it->is_string()) fail(where, "has no string 'name'");
        const auto cls = string_field(e, where, "class", false);
        try {
          tree.add_module(name_it->get<std::string>(), cls);
        } catch (const usage_error& err) {
          fail(where, concat("is invalid: ", err.what()));
        }
      }
    }
    std::vector<std::pair<std::string, std::string>> aliases;
    if (const auto* ps = optional_array(root, "parameters")) read_tensors(tree, *ps, "parameters", false, aliases);
    if (const auto* bs = optional_array(root, "buffers")) read_tensors(tree, *bs, "buffers", true, aliases);
    for (const auto& [name, target] : aliases) {
      try {
        tree.add_alias(name, target);
      } catch (const usage_error& err) {
        fail(concat("alias_of of '", name, "'"), concat("is invalid: ", err.what()));
      }
    }
    if (const auto* tied = optional_array(root, "tied")) {
      for (std::size_t i = 0; i < tied->size(); ++i) {
        const auto& g = (*tied)[i];
        const std::string where = "tied[" + std::to_string(i) + "]";
        if (!g.is_array()) fail(where, concat("is a JSON ", g.type_name(), ", not an array of tensor names"));
        std::vector<std::string> names;
        for (const auto& n : g) {
          if (!n.is_string()) fail(where, concat("holds ", n.dump(), ", not a tensor name"));
          names.push_back(n.get<std::string>());
        }
        try {
          tree.tie(names);
        } catch (const usage_error& err) {
          fail(where, concat("is invalid: ", err.what()));
        }
      }
    }
    return tree;
  }
};

// Sibling order for trees rebuilt from checkpoints, whose files do not record module order:
// embeddings first, output heads last, then the earliest shard, then numeric-aware name order.
inline int sibling_rank(std::string_view local) {
  static constexpr std::array<std::string_view, 7> heads{"lm_head", "embed_out", "score", "classifier", "qa_outputs", "output", "head"};
  for (auto h : heads)
    if (local == h) return 2;
  if (local.find("embed") != std::string_view::npos || local == "wte" || local == "wpe") return 0;
  return 1;
}

/// @brief Numeric-aware name order: "layers.2" < "layers.10"; "weight" before "bias" first.
inline bool natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = a[i] >= '0' && a[i] <= '9', db = b[j] >= '0' && b[j] <= '9';
    if (da && db) {
      std::size_t ei = i, ej = j;
      while (ei < a.size() && a[ei] >= '0' && a[ei] <= '9') ++ei;
      while (ej < b.size() && b[ej] >= '0' && b[ej] <= '9') ++ej;
      auto na = a.substr(i, ei - i), nb = b.substr(j, ej - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

}  // namespace detail

/// @brief Reads the model skeleton JSON (DESIGN.md §6): `modules` (pre-order, optional `class`),
///        `parameters` and `buffers` (name, shape, dtype; `alias_of`, `persistent` optional),
///        `tied` groups; unknown keys are ignored.
/// @param text the JSON text
/// @param label the file name used in messages
/// @return the tree
/// @throws accel::config_error naming the offending field (`parameters[3].shape[1]`) and why
[[nodiscard]] inline ModuleTree skeleton_from_json(std::string_view text, std::string_view label = "<string>") {
  return detail::SkeletonReader{label}.read(text);
}

/// @brief Reads a skeleton file.
/// @throws accel::config_error when unreadable or malformed
[[nodiscard]] inline ModuleTree read_skeleton(const std::filesystem::path& path) {
  std::string text;
  try {
    text = detail::read_text_file(path, "model skeleton");
  } catch (const checkpoint_error& e) {
    detail::throw_error<config_error>(e.what());
  }
  return skeleton_from_json(text, path.string());
}

/// @brief Writes a tree as model skeleton JSON (modules in pre-order, tensors, tie groups), the
///        format skeleton_from_json reads.
[[nodiscard]] inline std::string to_skeleton_json(const ModuleTree& tree, int indent = -1) {
  const auto cached = tree.index();
  const TreeIndex& ix = *cached;
  nlohmann::ordered_json j;
  j["modules"] = nlohmann::ordered_json::array();
  j["parameters"] = nlohmann::ordered_json::array();
  j["buffers"] = nlohmann::ordered_json::array();
  std::vector<std::size_t> order(tree.modules().size());
  for (std::size_t m = 0; m < order.size(); ++m) order[m] = m;
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return ix.module_rank[a] < ix.module_rank[b]; });
  for (auto m : order) {
    const auto& mod = tree.modules()[m];
    nlohmann::ordered_json e{{"name", mod.name}};
    if (!mod.class_name.empty()) e["class"] = mod.class_name;
    j["modules"].push_back(e);
  }
  std::vector<std::size_t> tensors(tree.tensors().size());
  for (std::size_t t = 0; t < tensors.size(); ++t) tensors[t] = t;
  std::sort(tensors.begin(), tensors.end(), [&](auto a, auto b) { return ix.tensor_rank[a] < ix.tensor_rank[b]; });
  for (auto t : tensors) {
    const auto& ten = tree.tensors()[t];
    nlohmann::ordered_json e{{"name", ten.name}, {"shape", ten.shape}, {"dtype", std::string(torch_name(ten.dtype))}};
    if (ten.buffer && !ten.persistent) e["persistent"] = false;
    j[ten.buffer ? "buffers" : "parameters"].push_back(e);
  }
  if (!ix.tied_groups.empty()) {
    j["tied"] = nlohmann::ordered_json::array();
    for (const auto& g : ix.tied_groups) {
      nlohmann::ordered_json names = nlohmann::ordered_json::array();
      for (auto t : g) names.push_back(tree.tensors()[t].name);
      j["tied"].push_back(names);
    }
  }
  return j.dump(indent);
}

/// @brief Options for ModuleTree construction from checkpoint headers.
struct CheckpointTreeOptions {
  /// Overrides config.json's `tie_word_embeddings` (unset: read it; absent in the config means
  /// true, transformers' default; no config.json means no tie is added).
  std::optional<bool> tie_word_embeddings{};
};

namespace detail {
inline std::optional<bool> config_ties_embeddings(const Checkpoint& ckpt) {
  if (!ckpt.config_file) return std::nullopt;
  const auto text = read_text_file(*ckpt.config_file, "model config");
  auto parsed = parse_json_strict(text);
  if (!parsed.error.empty() || !parsed.value.is_object())
    throw_error<checkpoint_error>("model config '", ckpt.config_file->string(), "' is not a JSON object",
                                  parsed.error.empty() ? std::string() : ": " + parsed.error, "; fix or remove it");
  auto it = parsed.value.find("tie_word_embeddings");
  if (it == parsed.value.end() || it->is_null()) return true;
  if (!it->is_boolean())
    throw_error<checkpoint_error>("model config '", ckpt.config_file->string(), "': tie_word_embeddings is ", it->dump(),
                                  ", not true or false");
  return it->get<bool>();
}

inline std::optional<std::size_t> find_input_embedding(const ModuleTree& tree) {
  static constexpr std::array<std::string_view, 6> exact{"model.embed_tokens.weight", "transformer.wte.weight",
                                                         "model.decoder.embed_tokens.weight", "gpt_neox.embed_in.weight",
                                                         "transformer.word_embeddings.weight", "shared.weight"};
  for (auto n : exact)
    if (auto id = tree.find_tensor(n)) return id;
  static constexpr std::array<std::string_view, 4> suffixes{"embed_tokens.weight", "wte.weight", "word_embeddings.weight",
                                                            "embed_in.weight"};
  for (const auto& t : tree.tensors())
    for (auto s : suffixes)
      if (std::string_view(t.name).ends_with(s)) return tree.find_tensor(t.name);
  return std::nullopt;
}
}  // namespace detail

/// @brief Builds a ModuleTree from a checkpoint's headers (every tensor a parameter).
///
/// safetensors files do not record module order, so siblings are ordered by: embeddings first,
/// output heads (`lm_head`, `score`, `classifier`, ...) last, then the earliest shard holding
/// them, then numeric-aware name order (`layers.2` before `layers.10`). A skeleton gives the exact
/// order when it matters. When the config ties word embeddings, `lm_head.weight` becomes another
/// name of the input embedding (added when missing, tied when present with the same shape).
/// @throws accel::checkpoint_error for an unreadable config.json
[[nodiscard]] inline ModuleTree tree_from_checkpoint(const Checkpoint& ckpt, const CheckpointTreeOptions& opts = {}) {
  struct Node {
    std::string_view local;
    std::vector<std::size_t> children;
    std::vector<std::size_t> tensors;  // indices into ckpt.tensor_names
    std::size_t min_shard = SIZE_MAX;
    std::unordered_map<std::string_view, std::size_t> child_ids;
  };
  std::vector<Node> nodes(1);
  for (std::size_t i = 0; i < ckpt.tensor_names.size(); ++i) {
    std::string_view name = ckpt.tensor_names[i];
    const std::size_t shard = ckpt.locations.at(ckpt.tensor_names[i]).shard;
    std::size_t cur = 0;
    nodes[0].min_shard = std::min(nodes[0].min_shard, shard);
    std::size_t start = 0;
    for (auto dot = name.find('.'); dot != std::string_view::npos; dot = name.find('.', start)) {
      auto part = name.substr(start, dot - start);
      auto it = nodes[cur].child_ids.find(part);
      std::size_t next;
      if (it == nodes[cur].child_ids.end()) {
        next = nodes.size();
        nodes.push_back(Node{part, {}, {}, SIZE_MAX, {}});
        nodes[cur].child_ids.emplace(part, next);
        nodes[cur].children.push_back(next);
      } else {
        next = it->second;
      }
      cur = next;
      nodes[cur].min_shard = std::min(nodes[cur].min_shard, shard);
      start = dot + 1;
    }
    nodes[cur].tensors.push_back(i);
  }
  auto local_of = [&](std::size_t t) {
    std::string_view n = ckpt.tensor_names[t];
    auto dot = n.rfind('.');
    return dot == std::string_view::npos ? n : n.substr(dot + 1);
  };
  ModuleTree tree;
  // Depth-first: sort each node's children and tensors, then add them.
  std::vector<std::pair<std::size_t, std::string>> stack{{0, std::string()}};
  while (!stack.empty()) {
    auto [id, prefix] = std::move(stack.back());
    stack.pop_back();
    auto& node = nodes[id];
    if (id != 0) tree.add_module(prefix);
    std::sort(node.tensors.begin(), node.tensors.end(), [&](std::size_t a, std::size_t b) {
      auto la = local_of(a), lb = local_of(b);
      if ((la == "weight") != (lb == "weight")) return la == "weight";
      return detail::natural_less(la, lb);
    });
    for (auto t : node.tensors) {
      const auto& e = ckpt.entry(ckpt.locations.at(ckpt.tensor_names[t]));
      tree.add_parameter(e.name, e.dtype, e.shape);
    }
    std::sort(node.children.begin(), node.children.end(), [&](std::size_t a, std::size_t b) {
      const auto &na = nodes[a], &nb = nodes[b];
      const int ra = detail::sibling_rank(na.local), rb = detail::sibling_rank(nb.local);
      if (ra != rb) return ra < rb;
      if (na.min_shard != nb.min_shard) return na.min_shard < nb.min_shard;
      return detail::natural_less(na.local, nb.local);
    });
    for (auto c = node.children.rbegin(); c != node.children.rend(); ++c)
      stack.emplace_back(*c, prefix.empty() ? std::string(nodes[*c].local) : prefix + "." + std::string(nodes[*c].local));
  }
  const auto tie = opts.tie_word_embeddings ? opts.tie_word_embeddings : detail::config_ties_embeddings(ckpt);
  if (tie.value_or(false)) {
    if (auto emb = detail::find_input_embedding(tree)) {
      const auto& et = tree.tensors()[*emb];
      auto head = tree.find_tensor("lm_head.weight");
      if (!head) tree.add_alias("lm_head.weight", et.name);
      else if (tree.tensors()[*head].shape == et.shape && tree.tensors()[*head].dtype == et.dtype)
        tree.add_alias("lm_head.weight", et.name);
    }
  }
  return tree;
}

/// @brief Resolves a checkpoint path (file, index or folder) and builds its tree from headers.
/// @throws accel::checkpoint_error as resolve_checkpoint
[[nodiscard]] inline ModuleTree read_checkpoint_tree(const std::filesystem::path& path, const CheckpointTreeOptions& opts = {}) {
  return tree_from_checkpoint(resolve_checkpoint(path), opts);
}

ACCEL_NAMESPACE_END
