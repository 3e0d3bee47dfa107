// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file checkpoint_tree.hpp
/// @brief A ModuleTree rebuilt from a checkpoint's safetensors headers (and its config.json).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/model/dtype.hpp>
#include <accel/model/json.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

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
    throw_error<checkpoint_error>("model config '", ckpt.config_file->string(), "': tie_word_embeddings is ", json_excerpt(*it),
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
