// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file skeleton.hpp
/// @brief The model skeleton JSON (DESIGN.md §6): a ModuleTree read from it and written as it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/model/dtype.hpp>
#include <accel/model/json.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

struct SkeletonReader {
  std::string_view label;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw_error<config_error>("malformed model skeleton '", label, "': ", field, " ", what,
                              "; see the skeleton format (modules/parameters/buffers/tied) in docs/planning.md");
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
            fail(concat(where, ".shape[", d, "]"), concat("is ", json_excerpt(v), ", not a non-negative integer"));
          shape.push_back(static_cast<std::int64_t>(v.get<std::uint64_t>()));
        }
      }
      bool persistent = true;
      if (auto p = e.find("persistent"); p != e.end() && !p->is_null()) {
        if (!p->is_boolean()) fail(where + ".persistent", concat("is ", json_excerpt(*p), ", not true or false"));
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
          if (!n.is_string()) fail(where, concat("holds ", json_excerpt(n), ", not a tensor name"));
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
    text = read_text_file(path, "model skeleton");
  } catch (const checkpoint_error& e) {
    std::string_view why = e.what();  // the same sentence, as a config error (one prefix, not two)
    why.remove_prefix(std::min(why.size(), std::string_view("[accel.checkpoint] ").size()));
    detail::throw_error<config_error>(why);
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

ACCEL_NAMESPACE_END
