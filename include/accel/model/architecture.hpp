// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file architecture.hpp
/// @brief What transformers knows about a model and its checkpoint headers do not: config.json read
///        into a value, and the architecture catalog (module classes, construction order, ties,
///        keep-in-fp32 modules, non-persistent buffers) looked up for it.
///
/// The catalog is data generated from transformers by tests/compat/gen_catalog.py
/// (include/accel/model/data/catalog.json, with the transformers and torch versions it came
/// from) and embedded in detail/catalog_data.hpp, so nothing is read from disk at run time.
/// An architecture missing from it gives an "unknown" ArchitectureMatch with the reason;
/// callers then keep their header-only heuristics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/model/detail/catalog_data.hpp>
#include <accel/model/detail/config_expression.hpp>
#include <accel/model/dtype.hpp>
#include <accel/model/json.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief The fields of a model's config.json that planning uses, plus the whole document.
struct ModelConfig {
  std::vector<std::string> architectures;       ///< `architectures` (class names), may be empty
  std::string model_type;                       ///< `model_type`, may be empty
  std::optional<DType> dtype;                   ///< `dtype` (transformers 5) or `torch_dtype` (4.x)
  std::optional<bool> tie_word_embeddings;      ///< unset when absent or null
  std::optional<bool> is_encoder_decoder;       ///< unset when absent or null
  std::optional<std::uint64_t> num_hidden_layers;  ///< `num_hidden_layers`, `n_layer` or `num_layers`
  nlohmann::json json = nlohmann::json::object();  ///< the whole document (catalog expressions read it)
};

/// @brief Parses config.json text.
/// @param label the file name for messages
/// @throws accel::checkpoint_error naming the file and the field when the text is not a JSON object
///         or a field above has the wrong type or an unknown dtype
[[nodiscard]] inline ModelConfig parse_model_config(std::string_view text, std::string_view label = "config.json") {
  auto parsed = parse_json_strict(text);
  if (!parsed.error.empty() || !parsed.value.is_object())
    detail::throw_error<checkpoint_error>("model config '", label, "' is not a JSON object",
                                          parsed.error.empty() ? std::string() : ": " + parsed.error, "; fix or remove it");
  ModelConfig c;
  c.json = std::move(parsed.value);
  auto bad = [&](std::string_view field, const nlohmann::json& v, std::string_view want) {
    detail::throw_error<checkpoint_error>("model config '", label, "': ", field, " is ", json_excerpt(v), ", not ", want);
  };
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = c.json.find(key);
    return it == c.json.end() || it->is_null() ? nullptr : &*it;
  };
  if (auto v = field("architectures")) {
    if (!v->is_array()) bad("architectures", *v, "a list of class names");
    for (const auto& a : *v) {
      if (!a.is_string()) bad("architectures", *v, "a list of class names");
      c.architectures.push_back(a.get<std::string>());
    }
  }
  if (auto v = field("model_type")) {
    if (!v->is_string()) bad("model_type", *v, "a string");
    c.model_type = v->get<std::string>();
  }
  for (const char* key : {"dtype", "torch_dtype"}) {  // transformers 5 writes `dtype`; it wins
    auto v = field(key);
    if (!v || c.dtype) continue;
    if (!v->is_string()) bad(key, *v, "a dtype name");
    auto d = try_dtype_from_string(v->get<std::string>());
    if (!d) bad(key, *v, "a dtype name (float16, bfloat16, float32, ...)");
    // transformers loads a model only in a floating-point dtype (torch refuses any other as the
    // default dtype); accel converts among these three.
    if (!converts_between(*d, DType::F32)) bad(key, *v, "a dtype a model loads in (float32, float16 or bfloat16)");
    c.dtype = d;
  }
  for (auto [key, out] : {std::pair{"tie_word_embeddings", &c.tie_word_embeddings},
                          std::pair{"is_encoder_decoder", &c.is_encoder_decoder}}) {
    if (auto v = field(key)) {
      if (!v->is_boolean()) bad(key, *v, "true or false");
      *out = v->get<bool>();
    }
  }
  for (const char* key : {"num_hidden_layers", "n_layer", "num_layers"}) {
    auto v = field(key);
    // A model of several stacks may count each (LXMERT: {"language": 9, "vision": 5, ...}): its
    // config class reads that, and the catalog counts blocks from its own fields; no one count.
    if (!v || c.num_hidden_layers || v->is_object()) continue;
    if (!v->is_number_unsigned()) bad(key, *v, "a non-negative integer");
    c.num_hidden_layers = v->get<std::uint64_t>();
  }
  return c;
}

/// @brief Reads and parses a config.json file.
/// @throws accel::checkpoint_error when it cannot be read or parsed (see parse_model_config)
[[nodiscard]] inline ModelConfig read_model_config(const std::filesystem::path& path) {
  return parse_model_config(read_text_file(path, "model config"), path.string());
}

/// @name The catalog
///@{
/// @brief A module of an architecture, as a template: numbered parts are `{i}`, `{j}`, ... .
struct ModuleTemplate {
  std::string path;                     ///< `model.layers.{i}.mlp` ("" is the root)
  std::string class_name;               ///< `LlamaMLP`
  std::vector<std::string> parameters;  ///< local names of its direct parameters, registration order
  std::vector<std::string> buffers;     ///< local names of its direct buffers
  std::vector<std::string> children;    ///< child names in construction order; given only where a path has several classes
  /// Parameters the module creates in a dtype of their own, whatever the load dtype (Reformer's
  /// axial position weights in float32): local name -> torch dtype name.
  std::map<std::string, std::string, std::less<>> dtypes{};
};

/// @brief A buffer of an architecture; each shape entry is a catalog expression over config.json.
struct BufferTemplate {
  std::string name;                ///< `model.rotary_emb.inv_freq`; a block's own name replaces its template's there
  std::vector<std::string> shape;  ///< e.g. `max_position_embeddings`; "1" for a constant
  std::string dtype;               ///< torch name, or "model": follows the dtype the model loads in
  bool persistent = true;          ///< in the state dict (so in checkpoints)
};

/// @brief A rename or fusion transformers applies to checkpoint names while loading.
struct WeightConversion {
  std::string kind;                     ///< `WeightRenaming` or `WeightConverter`
  std::vector<std::string> source;      ///< checkpoint-side patterns (transformers' regex syntax)
  std::vector<std::string> target;      ///< model-side patterns
  std::vector<std::string> operations;  ///< e.g. `MergeModulelist`, `Concatenate`
};

/// @brief One catalog entry: what transformers builds for one architecture class.
struct Architecture {
  std::string name;               ///< `LlamaForCausalLM` (config.json `architectures[0]`)
  std::string covers;             ///< the Hub families it serves, for people
  std::string model_type;         ///< `llama`
  std::string config_class;       ///< `LlamaConfig`
  std::string base_model_prefix;  ///< `model`
  std::map<std::string, std::string, std::less<>> attribute_map;  ///< `hidden_size` -> `n_embd` (GPT-2)
  nlohmann::json defaults = nlohmann::json::object();  ///< config-class defaults the expressions need
  std::vector<std::string> no_split_modules;           ///< `_no_split_modules`, sorted
  std::vector<std::string> keep_in_fp32_modules;       ///< `_keep_in_fp32_modules` (fp16 loads)
  std::vector<std::string> keep_in_fp32_modules_strict;  ///< `..._strict` (fp16 and bf16 loads)
  std::vector<std::vector<std::string>> tied_if_tied;    ///< tie groups when tie_word_embeddings
  std::vector<std::vector<std::string>> tied_if_untied;  ///< tie groups when not
  std::vector<ModuleTemplate> modules;                   ///< construction (pre-)order
  std::vector<std::pair<std::string, std::string>> repeats;  ///< numbered container -> count expression
  std::vector<BufferTemplate> buffers;                   ///< registration order
  std::vector<WeightConversion> conversions;             ///< load-time checkpoint renames/fusions
};

/// @brief The parsed catalog.
struct ArchitectureCatalog {
  std::string transformers_version;  ///< the transformers release it was generated from
  std::string torch_version;         ///< the torch release it was generated with
  std::vector<Architecture> architectures;
  /// transformers' auto mappings (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, ...) -> every class they
  /// name (format 2; empty for format 1): each is an entry or in `skipped`.
  std::map<std::string, std::vector<std::string>, std::less<>> mappings;
  /// Classes of the mappings the generator could not build, with the reason (format 2).
  std::vector<std::pair<std::string, std::string>> skipped;

  /// @brief The entry for an architecture class name, or nullptr.
  [[nodiscard]] const Architecture* find(std::string_view name) const {
    for (const auto& a : architectures)
      if (a.name == name) return &a;
    return nullptr;
  }
};

namespace detail {

// Generated data embedded as string pieces (detail/*_data.hpp), joined into one text.
template <class Pieces>
std::string join_pieces(const Pieces& pieces) {
  std::string text;
  for (std::string_view piece : pieces) text += piece;
  return text;
}

// The embedded catalog text, joined once.
inline const std::string& embedded_catalog_text() {
  static const std::string text = join_pieces(catalog_json_pieces);
  return text;
}

struct CatalogReader {
  [[noreturn]] static void fail(std::string_view where, std::string_view what) {
    throw_error<usage_error>("architecture catalog: ", where, " ", what, "; regenerate it with tests/compat/gen_catalog.py");
  }
  static std::string str(const nlohmann::json& o, const char* key, std::string_view where) {
    auto it = o.find(key);
    if (it == o.end() || !it->is_string()) fail(where, std::string("has no string '") + key + "'");
    return it->get<std::string>();
  }
  static std::vector<std::string> strings(const nlohmann::json& o, const char* key, std::string_view where) {
    std::vector<std::string> out;
    auto it = o.find(key);
    if (it == o.end()) return out;
    if (!it->is_array()) fail(where, std::string("'") + key + "' is not a list");
    for (const auto& s : *it) {
      if (!s.is_string()) fail(where, std::string("'") + key + "' holds a non-string");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  static std::vector<std::vector<std::string>> groups(const nlohmann::json& o, const char* key, std::string_view where) {
    std::vector<std::vector<std::string>> out;
    if (auto it = o.find(key); it != o.end() && it->is_array())
      for (const auto& g : *it) out.push_back(strings(nlohmann::json{{"g", g}}, "g", where));
    return out;
  }

  // `path` of a base's module mounted at `at` ("" is the base's root).
  static std::string mounted(const std::string& at, const std::string& path) { return path.empty() ? at : at + "." + path; }
  static bool is_base_marker(const nlohmann::json& x) {
    const auto it = x.find("base");
    return it != x.end() && it->is_boolean() && it->get<bool>();
  }

  // One entry. A format-2 entry naming a "base" (another entry, already read as `base`) shares its
  // modules, buffers and repeats mounted at "base_path", and its fields the entry leaves out (see
  // the format in tests/compat/gen_catalog.py).
  static Architecture entry(const nlohmann::json& e, const Architecture* base = nullptr) {
    Architecture a;
    a.name = str(e, "architecture", "an entry");
    const std::string& w = a.name;
    std::string at;
    if (e.contains("base")) {
      const std::string base_name = str(e, "base", w);
      if (!base || base->name != base_name) fail(w, "names base '" + base_name + "', which the catalog does not hold");
      at = str(e, "base_path", w);
      if (at.empty()) fail(w, "has an empty 'base_path'");
    }
    // A field the entry gives, else its base's (format 2), else empty.
    const auto inherit = [&](const char* key, auto& field, auto read, const auto& from_base) {
      if (e.contains(key)) field = read();
      else if (base && !at.empty()) field = from_base;
    };
    a.covers = e.contains("covers") ? str(e, "covers", w) : std::string();
    a.model_type = at.empty() || e.contains("model_type") ? str(e, "model_type", w) : base->model_type;
    a.config_class = at.empty() || e.contains("config_class") ? str(e, "config_class", w) : base->config_class;
    a.base_model_prefix = str(e, "base_model_prefix", w);
    const auto read_map = [&] {
      std::map<std::string, std::string, std::less<>> out;
      const auto attribute_map = e.value("attribute_map", nlohmann::json::object());  // named: items() of a temporary dangles
      for (const auto& [k, v] : attribute_map.items())
        if (v.is_string()) out.emplace(k, v.get<std::string>());
      return out;
    };
    inherit("attribute_map", a.attribute_map, read_map, base ? base->attribute_map : decltype(a.attribute_map){});
    if (base && !at.empty()) a.defaults = base->defaults;
    const auto defaults = e.value("defaults", nlohmann::json::object());  // named: items() of a temporary dangles
    for (const auto& [k, v] : defaults.items()) a.defaults[k] = v;
    const std::vector<std::string> none;
    inherit("no_split_modules", a.no_split_modules, [&] { return strings(e, "no_split_modules", w); }, base ? base->no_split_modules : none);
    inherit("keep_in_fp32_modules", a.keep_in_fp32_modules, [&] { return strings(e, "keep_in_fp32_modules", w); },
            base ? base->keep_in_fp32_modules : none);
    inherit("keep_in_fp32_modules_strict", a.keep_in_fp32_modules_strict,
            [&] { return strings(e, "keep_in_fp32_modules_strict", w); }, base ? base->keep_in_fp32_modules_strict : none);
    const auto tied = e.value("tied", nlohmann::json::object());
    a.tied_if_tied = groups(tied, "true", w);
    a.tied_if_untied = groups(tied, "false", w);

    const auto modules = e.find("modules");
    if (modules == e.end() || !modules->is_array()) fail(w, "has no 'modules' list");
    std::size_t markers = 0;
    for (const auto& m : *modules) {
      if (is_base_marker(m)) {
        if (at.empty() || str(m, "path", w) != at) fail(w, "has a base marker in 'modules' without a matching base_path");
        ++markers;
        for (const auto& bm : base->modules)
          a.modules.push_back({mounted(at, bm.path), bm.class_name, bm.parameters, bm.buffers, bm.children, bm.dtypes});
        continue;
      }
      a.modules.push_back({str(m, "path", w), str(m, "class", w), strings(m, "parameters", w), strings(m, "buffers", w),
                           strings(m, "children", w), {}});
      if (const auto dtypes = m.find("dtypes"); dtypes != m.end()) {
        if (!dtypes->is_object()) fail(w, "has a module whose 'dtypes' is not an object");
        for (const auto& [local, dtype] : dtypes->items()) {
          if (!dtype.is_string() || !try_dtype_from_string(dtype.get<std::string>()))
            fail(w, "has a module whose 'dtypes' gives '" + local + "' no dtype name");
          a.modules.back().dtypes.emplace(local, dtype.get<std::string>());
        }
      }
    }
    if (!at.empty() && markers != 1) fail(w, "names a base but marks where it goes in 'modules' " + std::to_string(markers) + " times");

    const auto repeats = e.value("repeats", nlohmann::json::object());
    for (const auto& [k, v] : repeats.items())
      if (v.is_string()) a.repeats.emplace_back(k, v.get<std::string>());
    if (!at.empty())
      for (const auto& [path, count] : base->repeats) {
        auto full = mounted(at, path);
        if (std::none_of(a.repeats.begin(), a.repeats.end(), [&](const auto& r) { return r.first == full; }))
          a.repeats.emplace_back(std::move(full), count);
      }

    const auto base_buffers = [&] {
      for (const auto& b : base->buffers) a.buffers.push_back({mounted(at, b.name), b.shape, b.dtype, b.persistent});
    };
    if (const auto buffers = e.find("buffers"); buffers != e.end()) {
      for (const auto& b : *buffers) {
        if (is_base_marker(b)) {
          if (at.empty()) fail(w, "has a base marker in 'buffers' but no base");
          base_buffers();
          continue;
        }
        a.buffers.push_back({str(b, "name", w), strings(b, "shape", w), str(b, "dtype", w), b.value("persistent", true)});
      }
    } else if (!at.empty()) {
      base_buffers();
    }
    const auto read_conversions = [&] {
      std::vector<WeightConversion> out;
      const auto conversions = e.value("conversions", nlohmann::json::array());
      for (const auto& c : conversions)
        out.push_back({str(c, "kind", w), strings(c, "source", w), strings(c, "target", w), strings(c, "operations", w)});
      return out;
    };
    inherit("conversions", a.conversions, read_conversions, base ? base->conversions : std::vector<WeightConversion>{});
    return a;
  }

  // The base an entry names ("" when none).
  static std::string base_of(const nlohmann::json& e) {
    const auto it = e.find("base");
    return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
  }
};

}  // namespace detail

/// @brief Parses catalog JSON: the embedded one, another generated by gen_catalog.py, or a user's
///        (tests/compat/gen_user_catalog.py). Format 1 lists whole entries; format 2 also shares a
///        base model's entry between its heads and lists the mappings and the classes skipped.
/// @throws accel::usage_error when it is not a catalog of format 1 or 2, or an entry is malformed
[[nodiscard]] inline ArchitectureCatalog parse_architecture_catalog(std::string_view text) {
  auto parsed = parse_json_strict(text);
  const int format = parsed.error.empty() && parsed.value.is_object() ? parsed.value.value("format", 0) : 0;
  if ((format != 1 && format != 2) || !parsed.value.contains("architectures") || !parsed.value["architectures"].is_array())
    detail::CatalogReader::fail("document", parsed.error.empty() ? "is not a catalog of format 1 or 2" : "is not JSON: " + parsed.error);
  const auto& doc = parsed.value;
  ArchitectureCatalog cat;
  cat.transformers_version = detail::CatalogReader::str(doc, "transformers", "document");
  cat.torch_version = doc.contains("torch") ? detail::CatalogReader::str(doc, "torch", "document") : std::string();
  try {
    // Entries without a base first, then the heads that share one (a base is never a head).
    std::map<std::string, std::size_t, std::less<>> read;
    for (const auto& e : doc["architectures"])
      if (detail::CatalogReader::base_of(e).empty()) {
        cat.architectures.push_back(detail::CatalogReader::entry(e));
        read.emplace(cat.architectures.back().name, cat.architectures.size() - 1);
      }
    for (const auto& e : doc["architectures"])
      if (const auto base = detail::CatalogReader::base_of(e); !base.empty()) {
        const auto it = read.find(base);
        cat.architectures.push_back(detail::CatalogReader::entry(e, it == read.end() ? nullptr : &cat.architectures[it->second]));
      }
    if (const auto mappings = doc.find("mappings"); mappings != doc.end() && mappings->is_object())
      for (const auto& [name, classes] : mappings->items())
        cat.mappings.emplace(name, detail::CatalogReader::strings(nlohmann::json{{"m", classes}}, "m", name));
    if (const auto skipped = doc.find("skipped"); skipped != doc.end() && skipped->is_array())
      for (const auto& x : *skipped)
        cat.skipped.emplace_back(detail::CatalogReader::str(x, "architecture", "skipped"), detail::CatalogReader::str(x, "reason", "skipped"));
  } catch (const nlohmann::json::exception& e) {
    detail::CatalogReader::fail("entry", e.what());
  }
  return cat;
}

/// @brief The catalog embedded in the library (parsed on first use; thread-safe).
[[nodiscard]] inline const ArchitectureCatalog& architecture_catalog() {
  static const ArchitectureCatalog catalog = parse_architecture_catalog(detail::embedded_catalog_text());
  return catalog;
}
///@}

namespace detail {

// The end of the JSON object starting at `open` (one past its closing brace), or npos.
inline std::size_t json_object_end(std::string_view text, std::size_t open) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = open; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// One entry of the embedded catalog, parsed alone (a plan needs one architecture: parsing the
// whole catalog would cost more than the plan). nullptr when the text has no entry by that name
// in the generator's compact form; callers then fall back to the whole catalog.
inline const Architecture* embedded_architecture(std::string_view name) {
  static std::recursive_mutex mutex;  // a head's base is looked up while the head is
  static std::map<std::string, std::unique_ptr<Architecture>, std::less<>> cache;
  std::lock_guard<std::recursive_mutex> lock(mutex);
  if (auto it = cache.find(name); it != cache.end()) return it->second.get();
  // The generated index says where the entry lies in the pieces (binary search): only its own
  // bytes are read, not the 3.7 MB of the whole catalog.
  std::unique_ptr<Architecture> entry;
  const auto hit = std::lower_bound(catalog_index.begin(), catalog_index.end(), name,
                                    [](const CatalogIndexEntry& e, std::string_view n) { return e.name < n; });
  if (hit != catalog_index.end() && hit->name == name) {
    std::string text;
    text.reserve(hit->length);
    std::size_t piece_start = 0;
    for (std::string_view piece : catalog_json_pieces) {
      const std::size_t from = std::max(hit->offset, piece_start), to = std::min(hit->offset + hit->length, piece_start + piece.size());
      if (from < to) text.append(piece.substr(from - piece_start, to - from));
      piece_start += piece.size();
      if (piece_start >= hit->offset + hit->length) break;
    }
    auto parsed = parse_json_strict(text);
    if (!parsed.error.empty() || !parsed.value.is_object()) CatalogReader::fail(std::string(name), "is not a JSON object in the catalog");
    const std::string base_name = CatalogReader::base_of(parsed.value);
    const Architecture* base = base_name.empty() || base_name == name ? nullptr : embedded_architecture(base_name);
    try {
      entry = std::make_unique<Architecture>(CatalogReader::entry(parsed.value, base));
    } catch (const nlohmann::json::exception& e) {
      CatalogReader::fail("entry", e.what());
    }
  }
  return cache.emplace(std::string(name), std::move(entry)).first->second.get();
}

// A top-level string field of the embedded catalog ("transformers", "torch"), read from its head
// (the first piece: no join of the whole text).
inline std::string embedded_catalog_field(std::string_view field) {
  const std::string_view head = catalog_json_pieces.front().substr(0, catalog_json_pieces.front().find("\"mappings\""));
  const std::string key = concat("\"", field, "\":\"");
  const auto at = head.find(key);
  if (at == std::string_view::npos) return std::string();
  const auto start = at + key.size();
  const auto end = head.find('"', start);
  return end == std::string_view::npos ? std::string() : std::string(head.substr(start, end - start));
}
}  // namespace detail

/// @brief Outcome of find_architecture: an entry, or why there is none.
struct ArchitectureMatch {
  const Architecture* architecture = nullptr;  ///< nullptr when unknown
  std::string reason;  ///< for unknown: what was looked for and what the catalog has nearby

  /// @brief True when the catalog knows the architecture.
  [[nodiscard]] bool known() const noexcept { return architecture != nullptr; }
};

/// @brief Looks up `architectures[0]` of a config in the catalog. Only the exact class counts:
///        another head on the same model type builds different modules.
[[nodiscard]] inline ArchitectureMatch find_architecture(const ModelConfig& config, const ArchitectureCatalog& catalog) {
  ArchitectureMatch m;
  if (config.architectures.empty()) {
    m.reason = "config.json names no architecture (no 'architectures' list); header heuristics apply";
    return m;
  }
  const auto& name = config.architectures.front();
  m.architecture = catalog.find(name);
  if (m.known()) return m;
  std::string same_type;
  for (const auto& a : catalog.architectures)
    if (!config.model_type.empty() && a.model_type == config.model_type) same_type += (same_type.empty() ? "" : ", ") + a.name;
  m.reason = detail::concat("architecture '", name, "' is not in accel's catalog (transformers ", catalog.transformers_version,
                            ")", same_type.empty() ? std::string() : "; same model_type: " + same_type,
                            "; header heuristics apply");
  return m;
}

/// @brief Looks up `architectures[0]` of a config in a user's catalog first (when given: entries
///        written by tests/compat/gen_user_catalog.py from the user's own transformers), then in
///        the embedded one. Only the entry found is parsed (the whole catalog costs more than a
///        plan); the whole catalog is read only to explain a miss, which also says how to add one.
[[nodiscard]] inline ArchitectureMatch find_architecture(const ModelConfig& config, const ArchitectureCatalog* user = nullptr) {
  if (!config.architectures.empty()) {
    if (user)
      if (const auto* a = user->find(config.architectures.front())) return ArchitectureMatch{a, {}};
    if (const auto* a = detail::embedded_architecture(config.architectures.front())) return ArchitectureMatch{a, {}};
  }
  auto match = find_architecture(config, architecture_catalog());
  if (!config.architectures.empty())
    match.reason += detail::concat(" (for an exact plan, write its entry with tests/compat/gen_user_catalog.py ",
                                   config.architectures.front(), " and pass --catalog FILE or set ACCEL_CATALOG)");
  return match;
}

/// @brief Reads a user's catalog file (format 1 or 2; see parse_architecture_catalog).
/// @throws accel::config_error naming the file when it cannot be read or is not a catalog
[[nodiscard]] inline ArchitectureCatalog read_architecture_catalog(const std::filesystem::path& path) {
  try {
    return parse_architecture_catalog(read_text_file(path, "architecture catalog"));
  } catch (const error& e) {
    // the same sentence, as a config error naming the file
    detail::throw_error<config_error>("catalog file '", path.string(), "': ", detail::message_body(e));
  }
}

/// @brief The transformers release the embedded catalog was generated from.
[[nodiscard]] inline std::string catalog_transformers_version() {
  auto v = detail::embedded_catalog_field("transformers");
  return v.empty() ? architecture_catalog().transformers_version : v;
}

namespace detail {
// A template's numbered part: `{i}`, `{j}`, ... .
inline bool is_placeholder(std::string_view part) { return part.size() >= 3 && part.front() == '{' && part.back() == '}'; }
// A path's block number: one or more digits.
inline bool is_block_number(std::string_view part) {
  return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
}
// One dotted part of a template against one of a path: a placeholder takes any block number.
inline bool template_part_matches(std::string_view t, std::string_view p) {
  return is_placeholder(t) ? is_block_number(p) : t == p;
}
}  // namespace detail

/// @name Pure functions over a catalog entry
///@{
/// @brief True when a concrete module path matches a template (`{i}` = one all-digit part).
[[nodiscard]] inline bool template_matches(std::string_view templ, std::string_view path) {
  for (;;) {
    const auto td = templ.find('.'), pd = path.find('.');
    if (!detail::template_part_matches(templ.substr(0, td), path.substr(0, pd))) return false;
    if ((td == std::string_view::npos) != (pd == std::string_view::npos)) return false;
    if (td == std::string_view::npos) return true;
    templ.remove_prefix(td + 1);
    path.remove_prefix(pd + 1);
  }
}

/// @brief Evaluates a catalog expression against a config (its json, then the entry's defaults).
/// @return the value, or nullopt when the config lacks what it needs
/// @throws accel::usage_error for a malformed expression
[[nodiscard]] inline std::optional<double> evaluate_config_expression(std::string_view expr, const Architecture& arch,
                                                                      const ModelConfig& config) {
  const detail::ConfigScope scope{&config.json, &arch.defaults, &arch.attribute_map};
  return detail::ConfigExpression(expr, scope).evaluate();
}

/// @brief The templates of one entry that match concrete module paths, found by the path's shape
///        (each all-digit part read as `{}`) in one lookup instead of trying every template; for
///        looking up many paths (model_from_checkpoint looks up every tensor and module).
class TemplateIndex {
 public:
  explicit TemplateIndex(const Architecture& arch) : arch_(&arch) {
    for (std::size_t i = 0; i < arch.modules.size(); ++i) {
      const std::string_view templ = arch.modules[i].path;
      // A literal number (or a literal "{}") in a template would be read as a block number in a
      // path's shape: such templates are tried one by one instead.
      bool literal = false;
      for (std::size_t start = 0; start <= templ.size();) {
        const auto end = std::min(templ.find('.', start), templ.size());
        const auto part = templ.substr(start, end - start);
        literal = literal || part == "{}" || detail::is_block_number(part);
        start = end + 1;
      }
      if (literal) literal_.push_back(i);
      else by_shape_[shape(templ, true)].push_back(i);
    }
  }
  [[nodiscard]] const Architecture& architecture() const noexcept { return *arch_; }

  /// @brief Calls f(index into modules) for every template matching `path`, in construction order.
  template <class F>
  void for_each_match(std::string_view path, F&& f) const {
    static const std::vector<std::size_t> none;
    const auto it = by_shape_.find(shape(path, false));
    const auto& shaped = it == by_shape_.end() ? none : it->second;
    auto a = shaped.begin();
    auto b = literal_.begin();
    while (a != shaped.end() || b != literal_.end()) {
      if (b == literal_.end() || (a != shaped.end() && *a < *b)) {
        f(*a++);
      } else {
        if (template_matches(arch_->modules[*b].path, path)) f(*b);
        ++b;
      }
    }
  }

 private:
  // A template's parts `{name}`, or a path's all-digit parts, become `{}`.
  static std::string shape(std::string_view text, bool is_template) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t start = 0; start <= text.size();) {
      const auto end = std::min(text.find('.', start), text.size());
      const auto part = text.substr(start, end - start);
      const bool block = is_template ? detail::is_placeholder(part) : detail::is_block_number(part);
      if (start > 0) out += '.';
      out += block ? std::string_view("{}") : part;
      start = end + 1;
    }
    return out;
  }

  const Architecture* arch_;
  std::unordered_map<std::string, std::vector<std::size_t>> by_shape_;
  std::vector<std::size_t> literal_;  ///< templates with a literal number part, tried one by one
};

/// @brief The templates (indices into the entry's modules) the module at `path` may be: every one
///        matching it, and when a path has several classes (dense and MoE layers, T5's sub-layers)
///        only those whose child names include all of `child_names`, fewest children first (a
///        template with more children has some such a module would hold: Inkling2-Loop's full
///        decoder layer lacks its full loop layer's message gates), construction order among equals.
template <class Name = std::string>
[[nodiscard]] inline std::vector<std::size_t> module_templates(const TemplateIndex& index, std::string_view path,
                                                               const std::vector<Name>& child_names = {}) {
  std::vector<std::size_t> found;
  index.for_each_match(path, [&](std::size_t i) { found.push_back(i); });
  if (found.size() > 1 && !child_names.empty()) {
    const auto& modules = index.architecture().modules;
    std::erase_if(found, [&](std::size_t i) {
      const auto& kids = modules[i].children;
      return !std::all_of(child_names.begin(), child_names.end(), [&](const Name& c) {
        return std::any_of(kids.begin(), kids.end(), [&](const std::string& t) { return detail::template_part_matches(t, c); });
      });
    });
    std::stable_sort(found.begin(), found.end(),
                     [&](std::size_t a, std::size_t b) { return modules[a].children.size() < modules[b].children.size(); });
  }
  return found;
}

/// @brief Where a path has several templates, the one its child names decide (module_templates'
///        first, when no other has as few children); nullptr when one template or none matches
///        the path, or several alike remain.
template <class Name>
[[nodiscard]] inline const ModuleTemplate* module_template_by_children(const TemplateIndex& index, std::string_view path,
                                                                       const std::vector<Name>& child_names) {
  std::size_t candidates = 0;
  index.for_each_match(path, [&](std::size_t) { ++candidates; });
  if (candidates < 2 || child_names.empty()) return nullptr;
  const auto found = module_templates(index, path, child_names);
  const auto& modules = index.architecture().modules;
  if (found.empty() || (found.size() > 1 && modules[found[1]].children.size() == modules[found[0]].children.size())) return nullptr;
  return &modules[found.front()];
}

/// @brief The class of the module at `path`. When a path has several classes (dense and MoE
///        layers, T5's sub-layers) its child names decide (module_template_by_children).
/// @return the class, or nullopt when no template matches or the children do not decide
[[nodiscard]] inline std::optional<std::string> module_class(const TemplateIndex& index, std::string_view path,
                                                             const std::vector<std::string>& child_names = {}) {
  const auto found = module_templates(index, path, std::vector<std::string>{});
  if (found.size() == 1) return index.architecture().modules[found.front()].class_name;
  if (const auto* m = module_template_by_children(index, path, child_names)) return m->class_name;
  return std::nullopt;
}
/// @brief module_class for one path.
[[nodiscard]] inline std::optional<std::string> module_class(const Architecture& arch, std::string_view path,
                                                             const std::vector<std::string>& child_names = {}) {
  return module_class(TemplateIndex(arch), path, child_names);
}

/// @brief Construction-order rank of `path`: the index of its first template in `arch.modules`.
///        Sorting siblings by (rank, block number) gives transformers' module order.
[[nodiscard]] inline std::optional<std::size_t> module_rank(const TemplateIndex& index, std::string_view path) {
  std::optional<std::size_t> first;
  index.for_each_match(path, [&](std::size_t i) {
    if (!first) first = i;
  });
  return first;
}
/// @brief module_rank for one path.
[[nodiscard]] inline std::optional<std::size_t> module_rank(const Architecture& arch, std::string_view path) {
  return module_rank(TemplateIndex(arch), path);
}

/// @brief How many blocks a numbered container holds (`model.layers` -> num_hidden_layers).
/// @return nullopt when `container` is not numbered or the config lacks the count
[[nodiscard]] inline std::optional<std::uint64_t> repeat_count(const Architecture& arch, std::string_view container,
                                                               const ModelConfig& config) {
  for (const auto& [templ, expr] : arch.repeats) {
    if (templ != container) continue;
    auto v = evaluate_config_expression(expr, arch, config);
    if (!v || *v < 0) return std::nullopt;
    return static_cast<std::uint64_t>(*v);
  }
  return std::nullopt;
}

/// @brief How many blocks a concrete numbered container holds by another account than the
///        config's (the checkpoint's tensors), or nullopt when it does not know.
using BlockCount = std::function<std::optional<std::uint64_t>(std::string_view container)>;

/// @brief Every concrete path of a template, numbered parts expanded with repeat_count.
/// @param held when given, the count of a container inside numbered blocks (Swin's
///        `layers.{i}.blocks`, whose count is a per-stage list the catalog records as the first
///        stage's) where it knows one
/// @throws accel::checkpoint_error when the config lacks a count the template needs
[[nodiscard]] inline std::vector<std::string> expand_template(const Architecture& arch, std::string_view templ,
                                                              const ModelConfig& config, const BlockCount* held = nullptr) {
  std::vector<std::string> out{std::string()};
  std::string so_far;  // the template up to here: the container of the next placeholder
  auto join = [](const std::string& a, std::string_view b) { return a.empty() ? std::string(b) : a + "." + std::string(b); };
  for (;;) {
    const auto dot = templ.find('.');
    const auto part = templ.substr(0, dot);
    if (part.size() >= 3 && part.front() == '{' && part.back() == '}') {
      const auto count = repeat_count(arch, so_far, config);
      const bool nested = held && so_far.find('{') != std::string::npos;
      std::vector<std::string> next;
      for (const auto& prefix : out) {
        auto n = count;
        if (nested)
          if (auto h = (*held)(prefix)) n = h;
        if (!n)
          detail::throw_error<checkpoint_error>("model config gives no block count for '", so_far, "' of ", arch.name,
                                                "; the catalog reads it from config.json");
        for (std::uint64_t i = 0; i < *n; ++i) next.push_back(join(prefix, std::to_string(i)));
      }
      out = std::move(next);
    } else {
      for (auto& prefix : out) prefix = join(prefix, part);
    }
    so_far = join(so_far, part);
    if (dot == std::string_view::npos) break;
    templ.remove_prefix(dot + 1);
  }
  return out;
}

/// @brief Module paths of the no-split blocks (`_no_split_modules` classes) for this config.
/// @throws accel::checkpoint_error as expand_template
[[nodiscard]] inline std::vector<std::string> no_split_paths(const Architecture& arch, const ModelConfig& config) {
  std::vector<std::string> out;
  for (const auto& m : arch.modules) {
    if (std::find(arch.no_split_modules.begin(), arch.no_split_modules.end(), m.class_name) == arch.no_split_modules.end())
      continue;
    for (auto& p : expand_template(arch, m.path, config))
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(std::move(p));
  }
  return out;
}

namespace detail {
// A tie template's placeholder: its letter and the constant added (`{i}` 0, `{i+1}` 1, `{i-1}` -1).
inline std::optional<std::pair<std::string_view, std::int64_t>> tie_placeholder(std::string_view part) {
  if (!is_placeholder(part)) return std::nullopt;
  const auto inner = part.substr(1, part.size() - 2);
  const auto sign = inner.find_first_of("+-");
  if (sign == std::string_view::npos) return std::pair{inner, std::int64_t{0}};
  const auto digits = inner.substr(sign + 1);
  const auto v = text::parse_integer<std::int64_t>(digits);
  if (!v || !is_block_number(digits)) return std::nullopt;
  return std::pair{inner.substr(0, sign), inner[sign] == '-' ? -*v : *v};
}

// How many blocks the numbered container `container` holds, its numbered parts (placeholders of
// any letter, or written-out numbers) matched against the catalog's repeats by position.
inline std::optional<std::uint64_t> container_count(const Architecture& arch, std::string_view container, const ModelConfig& config) {
  const auto same_shape = [](std::string_view a, std::string_view b) {
    for (;;) {
      const auto da = a.find('.'), db = b.find('.');
      const auto pa = a.substr(0, da), pb = b.substr(0, db);
      const bool na = is_placeholder(pa) || is_block_number(pa), nb = is_placeholder(pb) || is_block_number(pb);
      if (na != nb || (!na && pa != pb)) return false;
      if ((da == std::string_view::npos) != (db == std::string_view::npos)) return false;
      if (da == std::string_view::npos) return true;
      a.remove_prefix(da + 1);
      b.remove_prefix(db + 1);
    }
  };
  for (const auto& [templ, expr] : arch.repeats)
    if (same_shape(templ, container)) {
      auto v = evaluate_config_expression(expr, arch, config);
      if (!v || *v < 0) return std::nullopt;
      return static_cast<std::uint64_t>(*v);
    }
  return std::nullopt;
}
}  // namespace detail

/// @brief Tied parameter groups as transformers builds them for this config (each sorted): the
///        config's tie_word_embeddings, else the config class default, else true. A group with
///        placeholders is one group per value of them, shared across its names (`{i+1}`: that
///        value plus one); each letter takes the values for which every container it numbers has
///        that block (Bark's `lm_heads.{i-1}` with `input_embeds_layers.{i}`: i from 1 to 7). A
///        group of one template (a module several blocks share) is every block it expands to.
/// @throws accel::checkpoint_error when the config gives no block count for any container a
///         placeholder numbers
[[nodiscard]] inline std::vector<std::vector<std::string>> tied_groups(const Architecture& arch, const ModelConfig& config) {
  bool tie = true;
  if (config.tie_word_embeddings) tie = *config.tie_word_embeddings;
  else if (auto it = arch.defaults.find("tie_word_embeddings"); it != arch.defaults.end() && it->is_boolean()) tie = it->get<bool>();
  std::vector<std::vector<std::string>> out;
  for (const auto& g : tie ? arch.tied_if_tied : arch.tied_if_untied) {
    // One template, however often written (a module several blocks share): every block of it.
    if (!g.empty() && g.front().find('{') != std::string::npos &&
        std::all_of(g.begin(), g.end(), [&](const std::string& t) { return t == g.front(); })) {
      auto names = expand_template(arch, g.front(), config);
      std::sort(names.begin(), names.end());
      if (names.size() > 1) out.push_back(std::move(names));
      continue;
    }
    // Each letter's values: [low, high), narrowed by every container it numbers.
    std::vector<std::string_view> letters;
    std::vector<std::pair<std::int64_t, std::int64_t>> range;
    std::vector<bool> counted;
    for (const auto& t : g) {
      const std::string_view name = t;
      for (std::size_t start = 0; start <= name.size();) {
        const auto end = std::min(name.find('.', start), name.size());
        if (const auto ph = detail::tie_placeholder(name.substr(start, end - start))) {
          auto at = std::find(letters.begin(), letters.end(), ph->first);
          if (at == letters.end()) {
            letters.push_back(ph->first);
            range.emplace_back(std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
            counted.push_back(false);
            at = letters.end() - 1;
          }
          const auto k = static_cast<std::size_t>(at - letters.begin());
          if (const auto n = start > 0 ? detail::container_count(arch, name.substr(0, start - 1), config) : std::nullopt) {
            range[k].first = std::max(range[k].first, -ph->second);
            range[k].second = std::min(range[k].second, static_cast<std::int64_t>(*n) - ph->second);
            counted[k] = true;
          }
        }
        start = end + 1;
      }
    }
    for (std::size_t k = 0; k < letters.size(); ++k)
      if (!counted[k])
        detail::throw_error<checkpoint_error>("model config gives no block count for the placeholder {", letters[k], "} of the tie group of '",
                                              g.empty() ? std::string() : g.front(), "' of ", arch.name, "; the catalog reads it from config.json");
    if (std::any_of(range.begin(), range.end(), [](const auto& r) { return r.first >= r.second; })) continue;
    std::vector<std::int64_t> value(letters.size());
    for (std::size_t k = 0; k < letters.size(); ++k) value[k] = range[k].first;
    for (;;) {
      std::vector<std::string> names;
      for (const auto& t : g) {
        std::string name;
        const std::string_view templ = t;
        for (std::size_t start = 0; start <= templ.size();) {
          const auto end = std::min(templ.find('.', start), templ.size());
          const auto part = templ.substr(start, end - start);
          if (start > 0) name += '.';
          if (const auto ph = detail::tie_placeholder(part)) {
            const auto k = static_cast<std::size_t>(std::find(letters.begin(), letters.end(), ph->first) - letters.begin());
            name += std::to_string(value[k] + ph->second);
          } else {
            name += part;
          }
          start = end + 1;
        }
        names.push_back(std::move(name));
      }
      std::sort(names.begin(), names.end());
      names.erase(std::unique(names.begin(), names.end()), names.end());
      if (names.size() > 1) out.push_back(std::move(names));
      // The next combination of the letters' values (the last letter fastest).
      std::size_t k = letters.size();
      while (k > 0 && ++value[k - 1] >= range[k - 1].second) {
        value[k - 1] = range[k - 1].first;
        --k;
      }
      if (k == 0) break;
    }
  }
  return out;
}

/// @brief Module-name patterns transformers keeps in float32 when loading in `load_dtype`:
///        `_keep_in_fp32_modules` for float16, `_keep_in_fp32_modules_strict` for float16 and
///        bfloat16 (a name matches a module when it is one of its dotted parts or suffixes).
[[nodiscard]] inline std::vector<std::string> keep_in_fp32_modules(const Architecture& arch, DType load_dtype) {
  std::vector<std::string> out;
  if (load_dtype == DType::F16) out = arch.keep_in_fp32_modules;
  if (load_dtype == DType::F16 || load_dtype == DType::BF16)
    for (const auto& s : arch.keep_in_fp32_modules_strict)
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

namespace detail {
// False when a block number of `name` is past its container's count for this config
// (`encoder.stages.1.layers.9` of a stage of 4 layers); true when every count is known and holds,
// or not known.
inline bool within_block_counts(const Architecture& arch, std::string_view name, const ModelConfig& config) {
  static constexpr std::string_view letters = "ijklmnopq";
  std::string container;  // the template up to here, numbered parts as the catalog writes them
  std::size_t numbered = 0;
  for (std::size_t start = 0; start <= name.size();) {
    const auto end = std::min(name.find('.', start), name.size());
    const auto part = name.substr(start, end - start);
    if (is_block_number(part) && numbered < letters.size()) {
      const auto count = repeat_count(arch, container, config);
      if (count && text::parse_integer<std::uint64_t>(part).value_or(0) >= *count) return false;
      container += (container.empty() ? "{" : ".{") + std::string(1, letters[numbered++]) + "}";
    } else {
      container += (container.empty() ? "" : ".") + std::string(part);
    }
    start = end + 1;
  }
  return true;
}
}  // namespace detail

/// @brief keep-in-fp32 patterns (keep_in_fp32_matches) of the parameters the model creates in
///        float32 whatever the load dtype (ModuleTemplate::dtypes), a block number written `*`.
[[nodiscard]] inline std::vector<std::string> own_float32_patterns(const Architecture& arch) {
  std::vector<std::string> out;
  for (const auto& m : arch.modules)
    for (const auto& [local, dtype] : m.dtypes) {
      if (dtype != "float32") continue;
      std::string pattern;
      for (std::size_t start = 0; start <= m.path.size() && !m.path.empty();) {
        const auto end = std::min(m.path.find('.', start), m.path.size());
        const auto part = std::string_view(m.path).substr(start, end - start);
        pattern += detail::is_placeholder(part) ? std::string_view("*") : part;
        pattern += '.';
        start = end + 1;
      }
      pattern += local;
      if (std::find(out.begin(), out.end(), pattern) == out.end()) out.push_back(std::move(pattern));
    }
  return out;
}

/// @brief A concrete buffer: name, dtype and shape for one config.
struct BufferSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  bool persistent = false;
};

/// @brief The largest buffer non_persistent_buffers computes from a config (2^60 bytes, so its size
///        in bits fits 64 bits): nothing real comes near it, a field like `head_dim: 2^62` does.
inline constexpr std::uint64_t buffer_max_bytes = std::uint64_t{1} << 60;

/// @brief The buffers checkpoints do not hold (rotary `inv_freq`, `position_ids`, ...), with
///        shapes computed from the config; "model"-typed ones take `load_dtype`.
/// @param held block counts of containers inside numbered blocks (see expand_template)
/// @throws accel::checkpoint_error naming the buffer and the expression when the config lacks a
///         value its shape needs, or gives it more than buffer_max_bytes
[[nodiscard]] inline std::vector<BufferSpec> non_persistent_buffers(const Architecture& arch, const ModelConfig& config,
                                                                    DType load_dtype, const BlockCount* held = nullptr) {
  std::vector<BufferSpec> out;
  std::vector<std::string_view> own;  // blocks whose buffer differs from its template's (a name without placeholders)
  for (const auto& b : arch.buffers)
    if (!b.persistent && b.name.find('{') == std::string::npos) own.push_back(b.name);
  for (const auto& b : arch.buffers) {
    if (b.persistent) continue;
    const DType dtype = b.dtype == "model" ? load_dtype : dtype_from_string(b.dtype);
    std::vector<std::int64_t> shape;
    std::uint64_t numel = 1;
    for (const auto& e : b.shape) {
      auto v = evaluate_config_expression(e, arch, config);
      if (!v || *v < 0)
        detail::throw_error<checkpoint_error>("model config lacks what buffer '", b.name, "' of ", arch.name, " needs: ", e);
      // Checked before the cast (a double past 2^63, or infinite, has no int64 value): a config
      // whose fields give a buffer more bytes than any machine holds is a broken config.
      const auto too_large = [&] {
        detail::throw_error<checkpoint_error>("model config gives buffer '", b.name, "' of ", arch.name, " the dimension ", e, " = ",
                                              *v, ", which makes it larger than ", text::format_bytes(buffer_max_bytes),
                                              "; fix the config field it reads");
      };
      if (!(*v < 0x1p62)) too_large();
      const auto dim = static_cast<std::uint64_t>(*v);
      if (dim != 0 && numel > buffer_max_bytes / dim) too_large();
      numel *= dim;
      if (tensor_bytes(dtype, numel).value_or(buffer_max_bytes + 1) > buffer_max_bytes) too_large();
      shape.push_back(static_cast<std::int64_t>(dim));
    }
    const bool templated = b.name.find('{') != std::string::npos;
    if (!templated && !detail::within_block_counts(arch, b.name, config)) continue;  // a block this config lacks
    for (auto& name : expand_template(arch, b.name, config, held))
      if (!templated || std::find(own.begin(), own.end(), name) == own.end()) out.push_back({std::move(name), dtype, shape, false});
  }
  return out;
}
///@}

/// @name Applying an entry to a ModuleTree built from checkpoint headers
///@{
/// @brief Gives every module of `tree` whose path the catalog knows its class (modules that
///        already have one keep it). Classes a checkpoint cannot tell apart (the same child
///        names: GraniteSpeech5's subsampling and plain conformer blocks) that are all no-split,
///        or all not, are planned alike: the first stands for them.
/// @param stood_in when given, gets the classes such a first one stood in for
/// @return how many modules got a class
[[nodiscard]] inline std::size_t annotate_module_classes(ModuleTree& tree, const TemplateIndex& index,
                                                         std::set<std::string, std::less<>>* stood_in = nullptr) {
  const auto& arch = index.architecture();
  const auto no_split = [&](std::size_t i) {
    const auto& ns = arch.no_split_modules;
    return std::find(ns.begin(), ns.end(), arch.modules[i].class_name) != ns.end();
  };
  std::size_t n = 0;
  for (std::size_t id = 0; id < tree.modules().size(); ++id) {
    const auto& m = tree.modules()[id];
    if (!m.class_name.empty()) continue;
    std::vector<std::string> kids;
    for (auto c : m.children) {
      const auto& cn = tree.modules()[c].name;
      kids.push_back(cn.substr(cn.rfind('.') + 1));
    }
    auto found = module_templates(index, m.name, kids);
    if (found.empty()) continue;
    // Fewest children first: the templates with more are not this module.
    if (const auto fewest = arch.modules[found.front()].children.size(); !kids.empty())
      std::erase_if(found, [&](std::size_t i) { return arch.modules[i].children.size() > fewest; });
    const bool alike = std::all_of(found.begin(), found.end(), [&](std::size_t i) { return no_split(i) == no_split(found.front()); });
    if (found.size() > 1 && !alike) continue;
    if (stood_in)
      for (std::size_t k = 1; k < found.size(); ++k) stood_in->insert(arch.modules[found[k]].class_name);
    const std::string name = m.name;
    tree.add_module(name, arch.modules[found.front()].class_name);
    ++n;
  }
  return n;
}
/// @brief annotate_module_classes for one entry.
[[nodiscard]] inline std::size_t annotate_module_classes(ModuleTree& tree, const Architecture& arch) {
  return annotate_module_classes(tree, TemplateIndex(arch));
}

/// @brief Adds the non-persistent buffers `tree` lacks (see non_persistent_buffers).
/// @return how many were added
/// @throws accel::checkpoint_error as non_persistent_buffers
inline std::size_t add_non_persistent_buffers(ModuleTree& tree, const Architecture& arch, const ModelConfig& config,
                                              DType load_dtype) {
  std::size_t n = 0;
  for (auto& b : non_persistent_buffers(arch, config, load_dtype)) {
    if (tree.find_tensor(b.name)) continue;
    tree.add_buffer(b.name, b.dtype, std::move(b.shape), false);
    ++n;
  }
  return n;
}
///@}

ACCEL_NAMESPACE_END
