// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file checkpoint_tree.hpp
/// @brief A ModuleTree rebuilt from a checkpoint's safetensors headers (and its config.json).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/model/architecture.hpp>
#include <accel/model/dtype.hpp>
#include <accel/model/json.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/names.hpp>
#include <accel/model/quantization.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

// Sibling order for trees rebuilt from checkpoints of architectures the catalog lacks, whose files
// do not record module order; then the earliest shard, then numeric-aware name order:
// 0 embeddings; 1 front ends transformers builds before the model proper: a speech model's feature
// encoder (`feature_extractor`, `feature_projection`), and, when config.json has a vision or audio
// sub-config, its towers (`vision_tower`, `visual`, `audio_tower`, ...); 2 their projectors
// (`multi_modal_projector`, `merger`, `qformer`, ...); 3 everything else (the language model, the
// numbered blocks); 4 norms, which come after the blocks they close (`norm`, `final_layernorm`,
// `ln_f`; LFM2's `embedding_norm` is a norm, not an embedding); 5 output heads.
inline int sibling_rank(std::string_view local, bool towers) {
  static constexpr std::array<std::string_view, 7> heads{"lm_head", "embed_out", "score", "classifier", "qa_outputs", "output", "head"};
  const auto has = [&](std::string_view part) { return local.find(part) != std::string_view::npos; };
  for (auto h : heads)
    if (local == h) return 5;
  if (has("norm") || local == "ln_f" || local == "ln_out") return 4;
  if (has("embed") || local == "wte" || local == "wpe") return 0;
  if (local.starts_with("feature_")) return 1;
  if (towers) {
    if (has("projector") || has("merger") || has("connector") || has("qformer") || has("resampler") || has("adapter") ||
        has("projection"))
      return 2;
    if (has("vision") || has("visual") || has("image") || has("audio") || has("speech")) return 1;
  }
  return 3;
}

// True when config.json (or a sub-config of it, as omni models nest them) describes a vision or
// audio tower: such a model builds its towers before its language model.
inline bool config_has_towers(const nlohmann::json& j, int depth = 0) {
  if (!j.is_object() || depth > 3) return false;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_object()) continue;
    if (key.ends_with("vision_config") || key.ends_with("audio_config") || key.ends_with("speech_config") ||
        config_has_towers(value, depth + 1))
      return true;
  }
  return false;
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
  /// the config class default; no config.json means only an `lm_head` tie by name is added).
  std::optional<bool> tie_word_embeddings{};
  /// The model's config.json when it does not sit next to the checkpoint (`--config FILE`).
  std::optional<std::filesystem::path> config_file{};
  /// The dtype the model is loaded in, for the buffers the catalog creates in the model's dtype
  /// (unset: what `auto` resolves to, see CheckpointModel::auto_dtype).
  std::optional<DType> load_dtype{};
  /// Read the architecture catalog (false: headers and name heuristics only).
  bool use_catalog = true;
  /// A user's catalog (tests/compat/gen_user_catalog.py), searched before the embedded one: for a
  /// class newer than accel's catalog (`accel plan --catalog FILE`; the CLI also reads ACCEL_CATALOG).
  std::optional<std::filesystem::path> catalog_file{};
  /// Build the tree in the model's names, as transformers 5 renames a Hub folder's tensors when it
  /// loads them (names.hpp; fused expert tensors become one); false: the checkpoint's names.
  bool model_names = true;
};

/// @brief A checkpoint as transformers would build it: the tree and what config.json and the
///        catalog said about it.
struct CheckpointModel {
  ModuleTree tree;                          ///< modules in construction order, classes, ties, buffers
  std::optional<ModelConfig> config{};      ///< config.json, when found
  const Architecture* architecture = nullptr;  ///< the catalog entry, or nullptr
  /// The user's catalog (CheckpointTreeOptions::catalog_file), which `architecture` may point into.
  std::shared_ptr<const ArchitectureCatalog> user_catalog{};
  std::string architecture_note{};          ///< which entry was used, or why none
  /// What transformers' `dtype="auto"` loads in: the config's dtype, else the first floating
  /// dtype in the (first shard's) header; unset for a checkpoint without floating tensors.
  std::optional<DType> auto_dtype{};
  std::size_t buffers_added = 0;            ///< non-persistent buffers added from the catalog
  std::size_t tied_groups = 0;              ///< tie groups applied from the catalog
  /// Every checkpoint tensor's name in the tree (identity when the tree keeps checkpoint names).
  NameTable names{};
  /// config.json's quantization_config and the tensors it stores quantized (marked
  /// Tensor::quantized in the tree: sized and loaded as stored); unset for a dense checkpoint.
  std::optional<QuantizedTensors> quantization{};
  /// Said in reports: a catalog no-split class that names no module of the tree, names that
  /// transformers' rules may not reproduce.
  std::vector<std::string> warnings{};

  /// @brief The catalog's no-split classes (empty for an unknown architecture).
  [[nodiscard]] std::vector<std::string> no_split_classes() const {
    return architecture ? architecture->no_split_modules : std::vector<std::string>{};
  }
  /// @brief What budgets are multiplied by when planning it (PlanOptions::budget_scale): its
  ///        quantization's memory adjustment, as transformers makes it (bitsandbytes 0.9), else 1.
  [[nodiscard]] double budget_scale() const { return quantization ? quantization->config.budget_factor : 1.0; }
  /// @brief The catalog's keep-in-fp32 modules for a load dtype (transformers' rule: the plain
  ///        list for float16, the strict list for float16 and bfloat16).
  [[nodiscard]] std::vector<std::string> keep_in_fp32(std::optional<DType> load) const {
    auto out = architecture && load ? keep_in_fp32_modules(*architecture, *load) : std::vector<std::string>{};
    if (quantization)  // what the quantized modules hold in float32 whatever the dtype
      for (const auto& k : quantization->config.keep_in_fp32) out.push_back(k);
    if (architecture && load)  // what the model creates in float32: from_pretrained keeps a tensor in the model's dtype
      for (const auto& p : own_float32_patterns(*architecture)) out.push_back(p);
    return out;
  }
};

namespace detail {
inline std::optional<bool> config_ties_embeddings(const std::optional<ModelConfig>& config) {
  if (!config) return std::nullopt;
  return config->tie_word_embeddings.value_or(true);
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

// The first template of `arch` matching `path` that lists `local` among its parameters (0) or
// buffers (1), with the position there; nullopt when none does.
inline std::optional<std::pair<int, std::size_t>> catalog_tensor_slot(const TemplateIndex& index, std::string_view path,
                                                                      std::string_view local) {
  std::optional<std::pair<int, std::size_t>> slot;
  index.for_each_match(path, [&](std::size_t t) {
    const auto& m = index.architecture().modules[t];
    for (std::size_t i = 0; i < m.parameters.size() && !slot; ++i)
      if (m.parameters[i] == local) slot = std::pair{0, i};
    for (std::size_t i = 0; i < m.buffers.size() && !slot; ++i)
      if (m.buffers[i] == local) slot = std::pair{1, i};
  });
  return slot;
}

// One tensor of the tree to build: a checkpoint tensor, a tied copy the checkpoint leaves out, or
// a buffer the model computes.
struct TreeEntry {
  std::string_view name;  ///< a view of the NameTable's names, or of the names model_from_checkpoint makes
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::size_t shard = 0;
  bool buffer = false;
  bool persistent = true;
  std::optional<std::size_t> catalog_position;  ///< its position in its catalog template, once looked up (SIZE_MAX: none)
  std::size_t fused_parts = 0;           ///< checkpoint tensors fused into it (0: one, not fused)
  std::vector<std::int64_t> part_shape;  ///< the shape each fused part has (empty: they differ)
  bool quantized = false;                ///< quantized storage: kept at its stored dtype
  bool tied_copy = false;                ///< a tied copy the checkpoint leaves out (Tensor::tied_copy)
};

// The modules the checkpoint's tensors make (entries [0, count)), each with its children's names,
// built on first use. They decide which class a block has where the catalog gives a path several
// (Encodec's convolution, LSTM and residual layers; Zamba's Mamba and hybrid layers; dense and MoE
// layers), and so which children and buffers transformers builds in it.
class CheckpointModules {
 public:
  CheckpointModules(const std::vector<TreeEntry>& entries, std::size_t count) : entries_(&entries), count_(count) {}
  /// The names of the children of the module at `path` ("" the root), or nullptr when no
  /// checkpoint tensor lies under it.
  const std::vector<std::string_view>* children(std::string_view path) {
    if (!built_) build();
    const auto it = kids_.find(path);
    return it == kids_.end() ? nullptr : &it->second;
  }

 private:
  void build() {
    built_ = true;
    kids_.try_emplace(std::string_view{});
    for (std::size_t i = 0; i < count_; ++i) {
      const std::string_view name = (*entries_)[i].name;
      std::string_view parent{};
      for (auto dot = name.find('.'); dot != std::string_view::npos; dot = name.find('.', dot + 1)) {
        const auto path = name.substr(0, dot);
        if (kids_.try_emplace(path).second) {  // a new module: its parent gains a child
          const auto start = parent.empty() ? 0 : parent.size() + 1;
          kids_[parent].push_back(name.substr(start, dot - start));
        }
        parent = path;
      }
    }
  }
  const std::vector<TreeEntry>* entries_;
  std::size_t count_;
  bool built_ = false;
  std::unordered_map<std::string_view, std::vector<std::string_view>> kids_;
};

// Whether transformers builds `name`, a tied copy or a computed buffer the checkpoint does not
// hold, where a catalog template expanded over every block puts it. A module path the catalog gives
// several classes is decided by the children the checkpoint holds under it (as
// annotate_module_classes decides its class): the name is built only when every class still
// possible there has its next part, a child module or the tensor itself. Encodec's LSTM layers have
// no `kernel_size` buffer, Reformer's local-attention layers no `self_mask_value_float16`, Zamba's
// Mamba layers no copy of the shared transformer block. A path of one class, or whose children fit
// none of its classes, decides nothing.
inline bool built_in_checkpoint(const TemplateIndex& index, CheckpointModules& modules, std::string_view name) {
  const auto& arch = index.architecture();
  const auto has = [](const std::vector<std::string>& list, std::string_view s) { return std::find(list.begin(), list.end(), s) != list.end(); };
  const auto has_child = [](const ModuleTemplate& m, std::string_view c) {  // a numbered child as `{j}`
    return std::any_of(m.children.begin(), m.children.end(), [&](const std::string& t) { return template_part_matches(t, c); });
  };
  std::vector<const ModuleTemplate*> found;
  for (auto dot = name.find('.'); dot != std::string_view::npos; dot = name.find('.', dot + 1)) {
    const auto path = name.substr(0, dot);
    found.clear();
    index.for_each_match(path, [&](std::size_t t) { found.push_back(&arch.modules[t]); });
    // Several classes of one template (not a literal block beside a numbered one).
    if (found.size() < 2 || std::any_of(found.begin(), found.end(), [&](auto m) { return m->path != found.front()->path; })) continue;
    if (const auto* kids = modules.children(path))
      std::erase_if(found, [&](const ModuleTemplate* m) {
        return !std::all_of(kids->begin(), kids->end(), [&](std::string_view k) { return has_child(*m, k); });
      });
    if (found.empty()) continue;
    const auto end = name.find('.', dot + 1);
    const auto next = name.substr(dot + 1, end == std::string_view::npos ? std::string_view::npos : end - dot - 1);
    const bool tensor = end == std::string_view::npos;
    if (!std::all_of(found.begin(), found.end(), [&](const ModuleTemplate* m) {
          return tensor ? has(m->parameters, next) || has(m->buffers, next) : has_child(*m, next);
        }))
      return false;
  }
  return true;
}

// Adds a quantized companion to the tensor it is part of in the model (bitsandbytes' quant state
// to its weight): the entry becomes its bytes, which is what planning counts for stored tensors.
inline void fold_into(TreeEntry& into, const TensorEntry& part) {
  if (into.dtype != DType::U8 || into.shape.size() != 1) {
    into.shape = {static_cast<std::int64_t>(shape_numel(into.shape) * bit_size(into.dtype) / 8)};
    into.dtype = DType::U8;
  }
  into.shape[0] += static_cast<std::int64_t>(part.size_bytes());
}

// Adds one more checkpoint tensor to a model tensor several make (one expert's `gate_proj`
// into `experts.gate_up_proj`). Planning needs the element count: parts of equal shape [r, c]
// give [parts, r, c] (transformers' [experts, 2r, c] for gate and up holds as many), parts of
// different shapes one flat dimension.
inline void fuse_into(TreeEntry& into, const TensorEntry& part, std::string_view part_name) {
  if (part.dtype != into.dtype)
    throw_error<checkpoint_error>("tensor '", part_name, "' is ", torch_name(part.dtype), " but the other tensors that make '",
                                  into.name, "' are ", torch_name(into.dtype), "; transformers cannot fuse them");
  if (into.fused_parts == 0) {
    into.part_shape = into.shape;
    into.fused_parts = 1;
  }
  ++into.fused_parts;
  if (part.shape == into.part_shape) {
    if (into.shape.size() == into.part_shape.size() + 1 && into.shape[0] == static_cast<std::int64_t>(into.fused_parts - 1)) {
      into.shape[0] += 1;  // [parts so far, part_shape...]: no new vector per part
      return;
    }
    into.shape = {static_cast<std::int64_t>(into.fused_parts)};
    for (auto d : into.part_shape) into.shape.push_back(d);
  } else {
    into.part_shape.clear();
    into.shape = {static_cast<std::int64_t>(shape_numel(into.shape) + shape_numel(part.shape))};
  }
}

// The block `name` lies in when its number is past its container's count (`model.layers.61` of
// 61 layers), else nullopt.
inline std::optional<std::string_view> block_beyond(std::string_view name,
                                                    const std::vector<std::pair<std::string, std::uint64_t>>& counts) {
  for (const auto& [container, count] : counts) {
    if (!name.starts_with(container)) continue;
    const auto end = name.find('.', container.size());
    const auto number = name.substr(container.size(), end == std::string_view::npos ? std::string_view::npos : end - container.size());
    if (auto i = text::parse_integer<std::uint64_t>(number); i && *i >= count) return name.substr(0, end);
  }
  return std::nullopt;
}

// A tensor name deeper than max_name_parts is refused before any per-name work pays for its
// depth (renaming rules walk its parts; the module tree keeps every prefix of it).
inline void check_name_parts(std::string_view name, std::string_view where) {
  if (const auto parts = name_parts(name); parts > max_name_parts)
    throw_error<checkpoint_error>("tensor '", text::excerpt(name, 200), "'", where, " has ", parts, " dotted parts, more than the ",
                                  max_name_parts, " a module path may have (real models use under 15); it names no module "
                                  "of a model: rename or drop that tensor");
}

inline void check_name_parts(const Checkpoint& ckpt) {
  for (std::size_t shard = 0; shard < ckpt.headers.size(); ++shard)
    for (const auto& e : ckpt.headers[shard].tensors) {
      const auto where = [&] { return concat(" in ", shard < ckpt.shard_files.size() ? ckpt.shard_files[shard].string() : "the checkpoint"); };
      if (name_parts(e.name) > max_name_parts) check_name_parts(e.name, where());
      // An empty dotted part (`../../x`, `a..b`, a leading or trailing dot) names no module.
      const std::string_view n = e.name;
      if (n.empty() || n.front() == '.' || n.back() == '.' || n.find("..") != std::string_view::npos)
        throw_error<checkpoint_error>("tensor '", text::printable(n), "'", where(), " has an empty dotted part; a tensor name "
                                      "is a module path and a parameter name, like 'model.layers.0.mlp.weight': rename or "
                                      "drop that tensor");
    }
}

inline std::optional<DType> first_floating_dtype(const Checkpoint& ckpt) {
  if (ckpt.headers.empty()) return std::nullopt;
  std::vector<const TensorEntry*> first;
  for (const auto& t : ckpt.headers.front().tensors) first.push_back(&t);
  std::sort(first.begin(), first.end(), [](auto a, auto b) { return a->name < b->name; });
  for (auto t : first)
    if (is_floating(t->dtype) && bit_size(t->dtype) >= 16) return t->dtype;
  return std::nullopt;
}
// Every floating tensor that is not stored quantized is loaded in the model's dtype (`load_dtype`,
// else config.json's): refused here, by the planner and the loader alike, when the loader cannot
// convert it (float8 or float4 weights without a quantization_config saying how they are stored,
// float64), so a plan never exists that its load refuses. `stored`: the quantization's per-tensor
// marks, in Checkpoint::tensor_names order.
template <class StoredMarks>
inline void check_load_dtype(const Checkpoint& ckpt, const StoredMarks* stored, std::optional<DType> load_dtype,
                             std::optional<DType> config_dtype) {
  const auto target = load_dtype ? load_dtype : config_dtype;
  if (!target) return;
  for (std::size_t shard = 0, n = 0; shard < ckpt.headers.size(); ++shard)
    for (const auto& e : ckpt.headers[shard].tensors) {
      const bool as_stored = stored && (*stored)[n++];
      if (as_stored || !is_floating(e.dtype) || converts_between(e.dtype, *target)) continue;
      const auto what = concat("tensor '", text::printable(e.name), "' is stored as ", safetensors_name(e.dtype), " and cannot be loaded as ",
                               torch_name(*target));
      if (load_dtype)
        throw_error<usage_error>(what, " (the dtype option): accel converts only among float32, float16 and bfloat16; "
                                       "drop the dtype option");
      throw_error<checkpoint_error>(what, " (config.json's dtype): accel converts only among float32, float16 and bfloat16, and "
                                          "config.json has no quantization_config saying how ", safetensors_name(e.dtype),
                                          " weights are stored; add the quantization_config the checkpoint was written with");
    }
}
}  // namespace detail

/// @brief Builds the model of a checkpoint from its safetensors headers and config.json.
///
/// With a config.json (next to the checkpoint or `opts.config_file`) whose architecture the
/// catalog knows, the tree is what transformers constructs: modules in construction order
/// (encoder before decoder, `shared` first, top-level buffers last), their classes (so the
/// catalog's no-split classes name the blocks), the checkpoint's persistent buffers as buffers,
/// the tied copies the checkpoint leaves out (`lm_head.weight`, T5's `encoder.embed_tokens.weight`)
/// tied to the tensor it holds, and the non-persistent buffers (rotary `inv_freq`) with their
/// sizes. Otherwise siblings are ordered by heuristics: embeddings first, output heads (`lm_head`,
/// `score`, `classifier`, ...) last, then the earliest shard holding them, then numeric-aware name
/// order; every tensor is a parameter, and a config that ties word embeddings ties `lm_head.weight`
/// to the input embedding. `architecture_note` says which.
/// @throws accel::checkpoint_error for an unreadable config.json, a config lacking a value the
///         catalog needs, or a tensor name of more than max_name_parts dotted parts
[[nodiscard]] inline CheckpointModel model_from_checkpoint(const Checkpoint& ckpt, const CheckpointTreeOptions& opts = {}) {
  detail::check_name_parts(ckpt);
  CheckpointModel out;
  const auto config_path = opts.config_file ? opts.config_file : ckpt.config_file;
  if (config_path) out.config = read_model_config(*config_path);
  out.auto_dtype = out.config && out.config->dtype ? out.config->dtype : detail::first_floating_dtype(ckpt);
  const Architecture* arch = nullptr;
  if (!out.config) {
    out.architecture_note = "no config.json next to the checkpoint (pass --config FILE); header heuristics apply";
  } else if (!opts.use_catalog) {
    out.architecture_note = "architecture catalog not used; header heuristics apply";
  } else {
    if (opts.catalog_file) out.user_catalog = std::make_shared<const ArchitectureCatalog>(read_architecture_catalog(*opts.catalog_file));
    auto match = find_architecture(*out.config, out.user_catalog.get());
    arch = match.architecture;
    const bool from_user = arch && out.user_catalog && out.user_catalog->find(arch->name) == arch;
    out.architecture_note =
        !match.known() ? match.reason
        : from_user    ? detail::concat(arch->name, " (catalog ", opts.catalog_file->string(), ", transformers ",
                                        out.user_catalog->transformers_version, ")")
                       : detail::concat(arch->name, " (architecture catalog, transformers ", catalog_transformers_version(), ")");
  }
  out.architecture = arch;
  std::optional<TemplateIndex> index;
  if (arch) index.emplace(*arch);

  // The names: the model's (transformers' renames of a Hub folder's names), else the checkpoint's;
  // and what its quantization stores as is.
  auto naming = checkpoint_naming(ckpt, out.config ? &*out.config : nullptr, opts.model_names);
  out.names = std::move(naming.names);
  out.quantization = std::move(naming.quantization);
  detail::check_load_dtype(ckpt, out.quantization ? &out.quantization->stored : nullptr, opts.load_dtype, out.auto_dtype);
  const ClassNames* class_names = naming.class_names;
  if (class_names && !class_names->exact)
    out.warnings.push_back(detail::concat("transformers' renames of ", class_names->class_name,
                                          " are not all reproduced by accel's rules (", class_names->first_difference,
                                          "); check the map's names"));

  // The tensors: the checkpoint's, then the catalog's tied copies and computed buffers.
  std::vector<detail::TreeEntry> entries;
  std::deque<std::string> made_names;  // the names of tied copies and buffers, which entries view
  detail::NameIndex fused;             // model name -> entry, for names several tensors make
  detail::RecentViews<std::uint32_t> recent;  // the same, for the names just seen (experts in a row)
  std::vector<std::size_t> entry_source;                     // entry -> the checkpoint tensor it started from
  std::unordered_map<std::size_t, const std::tuple<std::size_t, DType, std::vector<std::int64_t>>*> resized;
  // Blocks past the config's count (DeepSeek-V3's multi-token-prediction layer 61 beside its 61
  // decoder layers) are not part of the model transformers builds: it never loads them.
  std::vector<std::pair<std::string, std::uint64_t>> block_counts;
  if (arch)
    for (const auto& [container, expr] : arch->repeats)
      if (container.find('{') == std::string::npos)
        if (auto count = repeat_count(*arch, container, *out.config)) block_counts.emplace_back(container + ".", *count);
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> beyond;  // block -> tensors, bytes
  if (out.quantization)
    for (const auto& r : out.quantization->sized_as) resized.emplace(std::get<0>(r), &r);
  entry_source.reserve(ckpt.tensor_names.size());
  // Shard by shard, in header order: the order of ckpt.tensor_names (n), with no name lookup.
  for (std::size_t shard = 0, n = 0; shard < ckpt.headers.size(); ++shard)
    for (std::size_t i = 0; i < ckpt.headers[shard].tensors.size(); ++i, ++n) {
      const auto& e = ckpt.headers[shard].tensors[i];
      const std::string_view name = out.names.model[n];
      if (auto block = detail::block_beyond(name, block_counts)) {
        auto& [tensors, bytes] = beyond[std::string(*block)];
        ++tensors;
        bytes += e.size_bytes();
        continue;
      }
      const bool quantized = out.quantization && out.quantization->stored[n];
      const bool companion = quantized && out.quantization->companion[n];
      const auto id = static_cast<std::uint32_t>(entries.size());
      std::optional<std::uint32_t> known;
      if (const auto* seen = recent.find(name)) {
        known = *seen;
      } else {
        known = fused.insert(detail::name_hash(name), id, [&](std::uint32_t k) { return k == id ? name : entries[k].name; });
        recent.put(name, known.value_or(id));
      }
      if (known) {
        // Several renamed tensors make one (experts), a quantized weight's state is part of it; a
        // renamed one meeting a tensor already of that name is a folder holding both spellings.
        auto& into = entries[*known];
        const auto first = ckpt.tensor_names[entry_source[*known]];
        if (quantized && into.quantized && (companion || out.quantization->companion[entry_source[*known]])) {
          detail::fold_into(into, e);
          continue;
        }
        if (first == name || ckpt.tensor_names[n] == name)
          detail::throw_error<checkpoint_error>("tensors '", first, "' and '", ckpt.tensor_names[n], "' are both the model's '",
                                                name, "'; the folder mixes checkpoint and model names: keep one of them");
        detail::fuse_into(into, e, ckpt.tensor_names[n]);
        continue;
      }
      entry_source.push_back(n);
      detail::TreeEntry t{name, e.dtype, e.shape, shard, false, true, {}, 0, {}, quantized};
      if (auto r = resized.find(n); r != resized.end())  // sized as transformers' model holds it, not as the file does
        std::tie(t.dtype, t.shape) = std::tie(std::get<1>(*r->second), std::get<2>(*r->second));
      if (arch) {
        const auto dot = name.rfind('.');
        const std::string_view path = dot == std::string::npos ? std::string_view{} : std::string_view(name).substr(0, dot);
        const std::string_view local = dot == std::string::npos ? std::string_view(name) : std::string_view(name).substr(dot + 1);
        const auto slot = detail::catalog_tensor_slot(*index, path, local);
        if (slot) t.buffer = slot->first == 1;
        t.catalog_position = slot ? slot->second : SIZE_MAX;
      }
      entries.push_back(std::move(t));
    }
  for (const auto& [block, count] : beyond)
    out.warnings.push_back(detail::concat(block, " (", text::plural(static_cast<long long>(count.first), "tensor"), ", ",
                                          text::format_bytes(count.second), ") is past the model's blocks, which the config "
                                          "counts; transformers does not load it, so it is neither planned nor loaded"));
  std::vector<std::vector<std::string>> ties;
  if (arch) {
    std::unordered_map<std::string_view, std::size_t> present;  // `entries` grows below; its names stay put
    for (std::size_t i = 0; i < entries.size(); ++i) present.emplace(entries[i].name, i);
    detail::CheckpointModules modules(entries, entries.size());
    auto config = *out.config;
    if (opts.tie_word_embeddings) config.tie_word_embeddings = opts.tie_word_embeddings;
    for (auto& group : tied_groups(*arch, config)) {
      // The tensor the checkpoint holds is the one the others share (save_pretrained leaves the
      // tied copies out); a group the checkpoint holds nothing of is left alone. A copy only
      // where the model builds one (a template's blocks of another class have none).
      std::erase_if(group, [&](const std::string& n) { return !present.count(n) && !detail::built_in_checkpoint(*index, modules, n); });
      const auto source = std::find_if(group.begin(), group.end(), [&](const std::string& n) { return present.count(n) > 0; });
      if (source == group.end()) continue;
      const auto src = entries[present.at(*source)];
      for (const auto& n : group)
        if (!present.count(n))
          entries.push_back({made_names.emplace_back(n), src.dtype, src.shape, src.shard, false, true, {}, 0, {}, src.quantized, true});
      ties.push_back(std::move(group));
    }
    const DType model_dtype = opts.load_dtype.value_or(out.auto_dtype.value_or(DType::F32));
    // A container inside numbered blocks holds the blocks the checkpoint holds there (Swin's
    // stages of depths[i] blocks: the catalog has the first stage's count for them all).
    std::unordered_map<std::string, std::optional<std::uint64_t>> held_counts;
    const BlockCount held = [&](std::string_view container) -> std::optional<std::uint64_t> {
      std::string key(container);
      key += '.';
      if (auto it = held_counts.find(key); it != held_counts.end()) return it->second;
      std::optional<std::uint64_t> n;
      for (const auto& e : entries) {
        if (!e.name.starts_with(key)) continue;
        const auto rest = e.name.substr(key.size());
        if (auto i = text::parse_integer<std::uint64_t>(rest.substr(0, rest.find('.'))); i && *i < entries.size())
          n = std::max(n.value_or(0), *i + 1);  // (a number past every tensor's count is no block of the model)
      }
      return held_counts.emplace(std::move(key), n).first->second;
    };
    for (auto& b : non_persistent_buffers(*arch, *out.config, model_dtype, &held)) {
      if (present.count(b.name) || !detail::built_in_checkpoint(*index, modules, b.name)) continue;
      entries.push_back({made_names.emplace_back(std::move(b.name)), b.dtype, std::move(b.shape), SIZE_MAX, true, false, {}, 0, {}, false});
      ++out.buffers_added;
    }
  }

  // The modules the names make: one node per dotted prefix, found through one table keyed by the
  // whole prefix (a view of the first name that made it), its hash built part by part.
  struct Node {
    std::string_view path;  // the module's full name
    std::string_view local;
    std::vector<std::size_t> children;
    std::vector<std::size_t> tensors;  // indices into entries
    std::size_t min_shard = SIZE_MAX;
  };
  std::vector<Node> nodes(1);
  nodes.reserve(entries.size() / 2 + 16);
  detail::NameIndex node_ids;
  node_ids.reserve(entries.size() / 2 + 16);
  const auto path_of = [&](std::uint32_t k) { return nodes[k].path; };
  std::string_view last_prefix;
  std::size_t last_node = 0, last_shard = 0;
  bool have_last = false;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string_view name = entries[i].name;
    const std::size_t shard = entries[i].shard;
    const auto last_dot = name.rfind('.');
    const std::string_view prefix = last_dot == std::string_view::npos ? std::string_view{} : name.substr(0, last_dot);
    std::size_t cur = 0;
    if (have_last && shard >= last_shard && prefix == last_prefix) {
      cur = last_node;  // the previous tensor's module, its ancestors' min_shard no greater than this shard
    } else {
      // Renaming may add a part or two to a name the checkpoint check passed.
      detail::check_name_parts(name, " (the model's name of a checkpoint tensor)");
      nodes[0].min_shard = std::min(nodes[0].min_shard, shard);
      std::uint64_t hash = 0;
      std::size_t start = 0;
      for (auto dot = name.find('.'); dot != std::string_view::npos; dot = name.find('.', start)) {
        const auto part = name.substr(start, dot - start);
        hash = detail::name_hash(part) ^ text::mix64(hash + 0x9e3779b97f4a7c15ull);
        const auto id = static_cast<std::uint32_t>(nodes.size());
        nodes.push_back(Node{name.substr(0, dot), part, {}, {}, SIZE_MAX});
        if (const auto known = node_ids.insert(hash, id, path_of)) {
          nodes.pop_back();
          cur = *known;
        } else {
          nodes[cur].children.push_back(id);
          cur = id;
        }
        nodes[cur].min_shard = std::min(nodes[cur].min_shard, shard);
        start = dot + 1;
      }
      last_prefix = prefix, last_node = cur, last_shard = shard, have_last = true;
    }
    nodes[cur].tensors.push_back(i);
  }
  if (arch) {
    // A module holding tensors whose children hold none (weight norm's ParametrizationList and its
    // `0`) has no children in the checkpoint; transformers' model has them, and a module with
    // children is no layer to transformers (not kept room for, split into its tensors when too
    // large), so they are added, empty, from the catalog.
    std::unordered_map<std::string_view, std::vector<std::string_view>> child_parts;  // template -> child parts
    for (const auto& m : arch->modules) {
      const auto dot = m.path.rfind('.');
      if (m.path.empty()) continue;
      auto& v = child_parts[dot == std::string::npos ? std::string_view{} : std::string_view(m.path).substr(0, dot)];
      const auto part = dot == std::string::npos ? std::string_view(m.path) : std::string_view(m.path).substr(dot + 1);
      if (std::find(v.begin(), v.end(), part) == v.end()) v.push_back(part);
    }
    for (std::size_t id = 1, count = nodes.size(); id < count; ++id) {
      if (!nodes[id].children.empty() || nodes[id].tensors.empty()) continue;
      const ModuleTemplate* only = nullptr;
      std::size_t matches = 0;
      index->for_each_match(nodes[id].path, [&](std::size_t t) {
        only = &arch->modules[t];
        ++matches;
      });
      if (matches != 1) continue;
      const auto it = child_parts.find(only->path);
      if (it == child_parts.end()) continue;
      for (const auto part : it->second) {
        std::uint64_t n = 1;
        if (detail::is_placeholder(part)) {
          const auto c = repeat_count(*arch, only->path, *out.config);
          if (!c) continue;
          n = *c;
        }
        for (std::uint64_t i = 0; i < n; ++i) {
          const std::string& path =
              made_names.emplace_back(detail::concat(nodes[id].path, ".", detail::is_placeholder(part) ? std::to_string(i) : std::string(part)));
          const std::string_view view = path;
          nodes[id].children.push_back(nodes.size());
          nodes.push_back(Node{view, view.substr(nodes[id].path.size() + 1), {}, {}, nodes[id].min_shard});
        }
      }
    }
  }
  auto local_of = [&](std::size_t t) {
    std::string_view n = entries[t].name;
    auto dot = n.rfind('.');
    return dot == std::string_view::npos ? n : n.substr(dot + 1);
  };
  ModuleTree& tree = out.tree;
  tree.reserve(nodes.size(), entries.size());
  // Depth-first: sort each node's children and tensors, then add them.
  std::vector<std::size_t> stack{0};
  std::vector<std::pair<std::size_t, std::size_t>> keyed, kids;
  const bool towers = out.config && detail::config_has_towers(out.config->json);  // for the heuristic order
  while (!stack.empty()) {
    const auto id = stack.back();
    stack.pop_back();
    auto& node = nodes[id];
    const std::string_view prefix = node.path;
    if (id != 0) tree.add_module(prefix);
    // Known tensors in the catalog's registration order, the others after them.
    auto tensor_key = [&](std::size_t t) {
      auto& pos = entries[t].catalog_position;  // checkpoint tensors were looked up above; copies and buffers are here
      if (!pos) {
        const auto slot = arch ? detail::catalog_tensor_slot(*index, prefix, local_of(t)) : std::nullopt;
        pos = slot ? slot->second : SIZE_MAX;
      }
      return *pos;
    };
    keyed.clear();
    for (auto t : node.tensors) keyed.emplace_back(tensor_key(t), t);
    std::sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first < b.first;
      auto la = local_of(a.second), lb = local_of(b.second);
      if ((la == "weight") != (lb == "weight")) return la == "weight";
      return detail::natural_less(la, lb);
    });
    for (const auto& [key, t] : keyed) {
      auto& e = entries[t];
      const auto added = e.buffer ? tree.add_buffer(e.name, e.dtype, e.shape, e.persistent) : tree.add_parameter(e.name, e.dtype, e.shape);
      if (e.quantized) tree.mark_quantized(added);
      if (e.tied_copy) tree.mark_tied_copy(added);
    }
    // Siblings: the catalog's construction order when it knows them, then the heuristics. Under
    // a path of several classes the children of the class they make are in its own order (T5's
    // feed-forward sub-layer: DenseReluDense before the layer_norm its attention sub-layer has
    // after SelfAttention).
    kids.clear();
    const ModuleTemplate* parent = nullptr;
    if (arch && id != 0 && node.children.size() > 1) {
      std::vector<std::string_view> locals;
      for (auto c : node.children) locals.push_back(nodes[c].local);
      parent = module_template_by_children(*index, prefix, locals);
    }
    for (auto c : node.children) {
      std::size_t rank = SIZE_MAX;
      if (parent) {
        rank = static_cast<std::size_t>(std::find_if(parent->children.begin(), parent->children.end(), [&](const std::string& t) {
                                          return detail::template_part_matches(t, nodes[c].local);
                                        }) - parent->children.begin());
      } else if (arch) {
        if (auto r = module_rank(*index, nodes[c].path)) rank = *r;
      }
      kids.emplace_back(rank, c);
    }
    std::sort(kids.begin(), kids.end(), [&](const auto& ka, const auto& kb) {
      if (ka.first != kb.first) return ka.first < kb.first;
      const auto &na = nodes[ka.second], &nb = nodes[kb.second];
      if (ka.first == SIZE_MAX) {
        const int ra = detail::sibling_rank(na.local, towers), rb = detail::sibling_rank(nb.local, towers);
        if (ra != rb) return ra < rb;
        if (na.min_shard != nb.min_shard) return na.min_shard < nb.min_shard;
      }
      return detail::natural_less(na.local, nb.local);
    });
    for (auto c = kids.rbegin(); c != kids.rend(); ++c) stack.push_back(c->second);
  }
  if (arch) {
    std::set<std::string, std::less<>> stood_in;  // classes planned as another they look like
    (void)annotate_module_classes(tree, *index, &stood_in);
    // A no-split class transformers builds but no module of this tree has: its blocks would be
    // split, so say so.
    for (const auto& cls : arch->no_split_modules) {
      const bool built = std::any_of(arch->modules.begin(), arch->modules.end(), [&](const ModuleTemplate& m) { return m.class_name == cls; });
      const bool found = stood_in.count(cls) > 0 ||
                         std::any_of(tree.modules().begin(), tree.modules().end(), [&](const Module& m) { return m.class_name == cls; });
      if (built && !found)
        out.warnings.push_back(detail::concat("no-split class ", cls, " of the catalog names no module of this checkpoint (",
                                              out.names.identity() ? "its names are not the model's" : "even in the model's names",
                                              "): its blocks may be split across devices"));
    }
    for (const auto& group : ties) {
      // Tie what is identical; a checkpoint holding two differing members keeps them apart.
      std::vector<std::string> same;
      const auto* first = &tree.tensors()[*tree.find_tensor(group.front())];
      for (const auto& n : group) {
        const auto& t = tree.tensors()[*tree.find_tensor(n)];
        if (t.shape == first->shape && t.dtype == first->dtype) same.push_back(n);
      }
      if (same.size() > 1) {
        tree.tie(same);
        ++out.tied_groups;
      }
    }
    return out;
  }
  if (class_names) {
    // transformers' tie groups for this class (the copies save_pretrained leaves out); groups over
    // numbered parts need the block counts only the catalog has.
    const auto tie = opts.tie_word_embeddings ? opts.tie_word_embeddings : out.config->tie_word_embeddings;
    for (const auto& group : class_names->tied(tie)) {
      if (std::any_of(group.begin(), group.end(), [](const std::string& n) { return n.find('{') != std::string::npos; })) continue;
      const auto source = std::find_if(group.begin(), group.end(), [&](const std::string& n) { return tree.find_tensor(n).has_value(); });
      if (source == group.end()) continue;
      for (const auto& n : group)
        if (!tree.find_tensor(n)) tree.add_alias(n, *source);
      ++out.tied_groups;
    }
    return out;
  }
  const auto tie = opts.tie_word_embeddings ? opts.tie_word_embeddings : detail::config_ties_embeddings(out.config);
  if (tie.value_or(false)) {
    if (auto emb = detail::find_input_embedding(tree)) {
      const auto& et = tree.tensors()[*emb];
      auto head = tree.find_tensor("lm_head.weight");
      if (!head) tree.add_alias("lm_head.weight", et.name);
      else if (tree.tensors()[*head].shape == et.shape && tree.tensors()[*head].dtype == et.dtype)
        tree.add_alias("lm_head.weight", et.name);
    }
  }
  return out;
}

/// @brief Builds a ModuleTree from a checkpoint's headers (see model_from_checkpoint).
/// @throws accel::checkpoint_error for an unreadable config.json
[[nodiscard]] inline ModuleTree tree_from_checkpoint(const Checkpoint& ckpt, const CheckpointTreeOptions& opts = {}) {
  return model_from_checkpoint(ckpt, opts).tree;
}

/// @brief Resolves a checkpoint path (file, index or folder) and builds its model.
/// @throws accel::checkpoint_error as resolve_checkpoint and model_from_checkpoint
[[nodiscard]] inline CheckpointModel read_checkpoint_model(const std::filesystem::path& path, const CheckpointTreeOptions& opts = {}) {
  return model_from_checkpoint(resolve_checkpoint(path), opts);
}

/// @brief Resolves a checkpoint path (file, index or folder) and builds its tree from headers.
/// @throws accel::checkpoint_error as resolve_checkpoint
[[nodiscard]] inline ModuleTree read_checkpoint_tree(const std::filesystem::path& path, const CheckpointTreeOptions& opts = {}) {
  return tree_from_checkpoint(resolve_checkpoint(path), opts);
}

ACCEL_NAMESPACE_END
