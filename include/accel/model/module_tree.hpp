// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file module_tree.hpp
/// @brief ModuleTree: a model's modules and tensors (names, shapes, dtypes, ties), never its weights.
///
/// Built with the builder API, from the model skeleton JSON (skeleton.hpp) or from safetensors
/// headers (checkpoint_tree.hpp). The planner reads it through index_tree() and
/// compute_module_sizes(), which follow accelerate's size accounting.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/model/dtype.hpp>
#include <accel/model/detail/name_index.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief "No index" marker for ModuleTree ids.
inline constexpr std::size_t npos_id = std::numeric_limits<std::size_t>::max();

/// @brief The most dotted parts a module or tensor name may have (`model.layers.0.mlp.up_proj.weight`
///        has 6; real models stay under 15). Each module keeps its full name, so a name of d parts
///        costs d prefixes: the limit keeps a small hostile name (80,000 parts in 160 KB) from
///        costing gigabytes and minutes.
inline constexpr std::size_t max_name_parts = 64;

/// @brief The number of dotted parts of `name` ("" has none, "a.b" two).
[[nodiscard]] inline std::size_t name_parts(std::string_view name) noexcept {
  return name.empty() ? 0 : static_cast<std::size_t>(std::count(name.begin(), name.end(), '.')) + 1;
}

/// @brief A parameter or buffer of a ModuleTree.
struct Tensor {
  std::string name;                ///< full dotted name (`model.layers.0.mlp.up_proj.weight`)
  DType dtype = DType::F32;        ///< stored element type
  std::vector<std::int64_t> shape; ///< dimensions; empty for a scalar
  bool buffer = false;             ///< registered as a buffer rather than a parameter
  bool persistent = true;          ///< buffers only: part of the state dict
  std::size_t module = 0;          ///< owning module id
  /// A quantized weight or one of its scales/zero points (quantization.hpp): counted and loaded at
  /// its stored dtype, whatever the load dtype.
  bool quantized = false;
  /// A tied copy the checkpoint leaves out (save_pretrained writes only the tensor the others
  /// share): when its tie group has a member that is not one, sizes count that member.
  bool tied_copy = false;

  /// @brief Element count (1 for a scalar).
  [[nodiscard]] std::uint64_t numel() const noexcept { return shape_numel(shape); }
};

/// @brief A module of a ModuleTree; the root is id 0 with name "".
struct Module {
  std::string name;                     ///< full dotted name
  std::string class_name;               ///< e.g. `LlamaDecoderLayer`; empty when unknown
  std::size_t parent = npos_id;         ///< parent id (npos_id for the root)
  std::vector<std::size_t> children;    ///< child module ids, registration order
  std::vector<std::size_t> parameters;  ///< direct parameter tensor ids, registration order
  std::vector<std::size_t> buffers;     ///< direct buffer tensor ids, registration order
};

struct TreeIndex;

namespace detail {
// A lazily computed TreeIndex shared by const users. Copies start empty; the mutex makes the
// first computation safe when several threads plan the same (const) tree.
class TreeIndexCache {
 public:
  TreeIndexCache() = default;
  TreeIndexCache(const TreeIndexCache&) noexcept {}
  TreeIndexCache(TreeIndexCache&&) noexcept {}
  TreeIndexCache& operator=(const TreeIndexCache&) noexcept {
    clear();
    return *this;
  }
  TreeIndexCache& operator=(TreeIndexCache&&) noexcept {
    clear();
    return *this;
  }
  ~TreeIndexCache() = default;
  // Mutating a tree while another thread reads it is a data race anyway; no lock needed here.
  void clear() noexcept {
    if (value_) value_.reset();
  }
  template <class Compute>
  std::shared_ptr<const TreeIndex> get(Compute&& compute) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!value_) value_ = std::make_shared<const TreeIndex>(compute());
    return value_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const TreeIndex> value_;
};
}  // namespace detail

/// @brief A model's structure: modules, parameters, buffers, and tensors that share storage.
///
/// Tensors tied together (or declared `alias_of` another) are one tensor with several names; sizes
/// count it once, under the name that comes first in model order among those that are not tied
/// copies (add_alias, mark_tied_copy), and the planner keeps every name of it on one device.
/// @code
/// accel::ModuleTree t;
/// t.add_module("model.layers.0", "LlamaDecoderLayer");
/// t.add_parameter("model.layers.0.mlp.up_proj.weight", accel::DType::F16, {11008, 4096});
/// t.add_alias("lm_head.weight", "model.embed_tokens.weight");
/// @endcode
class ModuleTree {
 public:
  /// @brief An empty tree holding only the root module "".
  ModuleTree() {
    modules_.push_back(Module{});
    module_ids_.insert(detail::name_hash(""), 0, module_name());
  }

  /// @name Builder
  ///@{
  /// @brief Reserves room for `modules` modules and `tensors` tensors (saves rehashing).
  void reserve(std::size_t modules, std::size_t tensors) {
    modules_.reserve(modules + 1);
    module_ids_.reserve(modules + 1);
    tensors_.reserve(tensors);
    tensor_ids_.reserve(tensors);
    tie_parent_.reserve(tensors);
  }

  /// @brief Adds a module (and any missing ancestors), or sets the class of an existing one.
  /// @return the module id
  /// @throws accel::usage_error when the name is a tensor's, has an empty component or more than
  ///         max_name_parts parts, or the module already has a different class
  std::size_t add_module(std::string_view name, std::string_view class_name = {}) {
    const auto hash = detail::name_hash(name);
    if (const auto known = module_ids_.find(name, hash, module_name())) {
      auto& m = modules_[*known];
      if (!class_name.empty()) {
        if (!m.class_name.empty() && m.class_name != class_name)
          detail::throw_error<usage_error>("module '", name, "' already has class '", m.class_name, "', not '", class_name,
                                           "'; give each module one class");
        m.class_name = std::string(class_name);
      }
      return *known;
    }
    check_name(name, "module");
    // Up from the name to its nearest known ancestor, checking every missing one before any is
    // added; then down again, adding them outermost first (parents get smaller ids). A loop, not
    // a recursion, and at most max_name_parts prefixes, each hashed once.
    std::array<std::size_t, max_name_parts> ends{};  // lengths of the missing prefixes, innermost first
    std::size_t missing = 0, parent = 0;
    for (std::string_view prefix = name;;) {
      const auto prefix_hash = missing == 0 ? hash : detail::name_hash(prefix);
      if (missing > 0)
        if (const auto known = module_ids_.find(prefix, prefix_hash, module_name())) {
          parent = *known;
          break;
        }
      if (tensor_ids_.find(prefix, prefix_hash, tensor_name()))
        detail::throw_error<usage_error>("module name '", text::excerpt(prefix, 200), "' is already a tensor's name; names must be unique");
      ends[missing++] = prefix.size();
      const auto dot = prefix.rfind('.');
      if (dot == std::string_view::npos) break;  // a top-level module: its parent is the root
      prefix = prefix.substr(0, dot);
    }
    for (std::size_t i = missing; i-- > 0;) {
      const std::string_view prefix = name.substr(0, ends[i]);
      const std::size_t id = modules_.size();
      modules_.push_back(Module{std::string(prefix), i == 0 ? std::string(class_name) : std::string(), parent, {}, {}, {}});
      modules_[parent].children.push_back(id);
      module_ids_.insert(i == 0 ? hash : detail::name_hash(prefix), static_cast<std::uint32_t>(id), module_name());
      parent = id;
    }
    cache_.clear();
    return parent;
  }

  /// @brief Adds a parameter; its module (the name up to the last dot) is created if missing.
  /// @return the tensor id
  /// @throws accel::usage_error for a duplicate or malformed name or a negative dimension
  std::size_t add_parameter(std::string_view name, DType dtype, std::vector<std::int64_t> shape) {
    return add_tensor(name, dtype, std::move(shape), false, true);
  }

  /// @brief Adds a buffer (persistent buffers are in the state dict; others are not).
  /// @return the tensor id
  /// @throws accel::usage_error as add_parameter
  std::size_t add_buffer(std::string_view name, DType dtype, std::vector<std::int64_t> shape, bool persistent = true) {
    return add_tensor(name, dtype, std::move(shape), true, persistent);
  }

  /// @brief Marks a tensor as quantized storage (Tensor::quantized): it keeps its stored dtype.
  /// @throws accel::usage_error for an unknown id
  void mark_quantized(std::size_t tensor) {
    if (tensor >= tensors_.size())
      detail::throw_error<usage_error>("tensor id ", tensor, " does not exist (the tree has ", tensors_.size(), " tensors)");
    tensors_[tensor].quantized = true;
    cache_.clear();
  }

  /// @brief Marks a tensor as a tied copy the checkpoint leaves out (Tensor::tied_copy).
  /// @throws accel::usage_error for an unknown id
  void mark_tied_copy(std::size_t tensor) {
    if (tensor >= tensors_.size())
      detail::throw_error<usage_error>("tensor id ", tensor, " does not exist (the tree has ", tensors_.size(), " tensors)");
    tensors_[tensor].tied_copy = true;
    cache_.clear();
  }

  /// @brief Adds parameter `name` as another name of tensor `target` (shared storage, e.g. a tied
  ///        LM head), copying its dtype and shape; if `name` exists it is tied to `target`. A name
  ///        added here is a tied copy (Tensor::tied_copy): sizes count `target`.
  /// @return the tensor id of `name`
  /// @throws accel::usage_error when `target` does not exist or the two differ in dtype or shape
  std::size_t add_alias(std::string_view name, std::string_view target) {
    auto t = find_tensor(target);
    if (!t)
      detail::throw_error<usage_error>("alias '", name, "' refers to tensor '", target,
                                       "', which does not exist; add the target tensor first");
    std::size_t id;
    if (auto existing = find_tensor(name)) id = *existing;
    else {
      const Tensor copy = tensors_[*t];
      id = add_tensor(name, copy.dtype, copy.shape, false, true);
      tensors_[id].tied_copy = true;
    }
    tie_pair(*t, id);
    return id;
  }

  /// @brief Declares that the named tensors are one tensor (every name must already exist).
  /// @throws accel::usage_error for an unknown name, fewer than two names, or mismatched shapes
  void tie(const std::vector<std::string>& names) {
    if (names.size() < 2)
      detail::throw_error<usage_error>("a tied group needs at least two tensor names (got ", names.size(), ")");
    std::vector<std::size_t> ids;
    for (const auto& n : names) {
      auto id = find_tensor(n);
      if (!id) detail::throw_error<usage_error>("tied tensor '", n, "' does not exist; add it before tying it");
      ids.push_back(*id);
    }
    for (std::size_t i = 1; i < ids.size(); ++i) tie_pair(ids[0], ids[i]);
  }
  ///@}

  /// @name Queries
  ///@{
  /// @brief Every module; id 0 is the root "".
  [[nodiscard]] const std::vector<Module>& modules() const noexcept { return modules_; }
  /// @brief Every tensor in registration order.
  [[nodiscard]] const std::vector<Tensor>& tensors() const noexcept { return tensors_; }
  /// @brief Module id by name.
  [[nodiscard]] std::optional<std::size_t> find_module(std::string_view name) const {
    const auto id = module_ids_.find(name, detail::name_hash(name), module_name());
    return id ? std::optional<std::size_t>(*id) : std::nullopt;
  }
  /// @brief Tensor id by name.
  [[nodiscard]] std::optional<std::size_t> find_tensor(std::string_view name) const {
    const auto id = tensor_ids_.find(name, detail::name_hash(name), tensor_name());
    return id ? std::optional<std::size_t>(*id) : std::nullopt;
  }
  /// @brief Representative of the tie group of tensor `id` (union-find root; not model order).
  [[nodiscard]] std::size_t tie_root(std::size_t id) const {
    while (tie_parent_[id] != id) id = tie_parent_[id];
    return id;
  }
  /// @brief True when some tensor shares storage with another.
  [[nodiscard]] bool has_ties() const noexcept { return tie_count_ > 0; }
  /// @brief The model order (see TreeIndex), computed on first use and kept until the tree
  ///        changes; safe to call from several threads on a tree nobody modifies.
  [[nodiscard]] std::shared_ptr<const TreeIndex> index() const;
  ///@}

 private:
  static void check_name(std::string_view name, std::string_view what) {
    bool bad = name.empty() || name.front() == '.' || name.back() == '.' || name.find("..") != std::string_view::npos;
    if (bad)
      detail::throw_error<usage_error>(what, " name '", text::excerpt(name, 200), "' has an empty component; use dotted names like 'model.layers.0'");
    if (const auto parts = name_parts(name); parts > max_name_parts)
      detail::throw_error<usage_error>(what, " name '", text::excerpt(name, 200), "' has ", parts, " dotted parts, more than the ",
                                       max_name_parts, " a name may have (real models use under 15); shorten the module path");
  }

  std::size_t add_tensor(std::string_view name, DType dtype, std::vector<std::int64_t> shape, bool buffer, bool persistent) {
    check_name(name, buffer ? "buffer" : "parameter");
    const auto hash = detail::name_hash(name);
    if (tensor_ids_.find(name, hash, tensor_name()))
      detail::throw_error<usage_error>("tensor '", name, "' is registered twice; give each tensor one entry");
    if (module_ids_.find(name, hash, module_name()))
      detail::throw_error<usage_error>("tensor name '", name, "' is already a module's name; names must be unique");
    // Sizes are counted as numel × bits (up to 64 bits per element, in any dtype a tensor may be
    // loaded in): a shape whose product overflows that is rejected, never sized as garbage or 0.
    std::uint64_t numel = 1;
    bool overflow = false;
    for (auto d : shape) {
      if (d < 0) detail::throw_error<usage_error>("tensor '", name, "' has negative dimension ", d);
      const auto u = static_cast<std::uint64_t>(d);
      if (u != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 64 / u) overflow = true;
      else numel *= u;
    }
    if (overflow && std::find(shape.begin(), shape.end(), 0) == shape.end()) {
      std::string dims;
      for (auto d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
      detail::throw_error<usage_error>("tensor '", name, "' has shape [", dims,
                                       "], whose size in bits does not fit in 64 bits; fix the shape");
    }
    const auto dot = name.rfind('.');
    const std::string_view prefix = dot == std::string_view::npos ? std::string_view{} : name.substr(0, dot);
    // Consecutive tensors usually share a module: skip the lookup then.
    const std::size_t module = last_module_ < modules_.size() && modules_[last_module_].name == prefix ? last_module_ : add_module(prefix);
    last_module_ = module;
    const std::size_t id = tensors_.size();
    tensors_.push_back(Tensor{std::string(name), dtype, std::move(shape), buffer, persistent, module, false});
    tie_parent_.push_back(id);
    (buffer ? modules_[module].buffers : modules_[module].parameters).push_back(id);
    cache_.clear();
    tensor_ids_.insert(hash, static_cast<std::uint32_t>(id), tensor_name());
    return id;
  }

  void tie_pair(std::size_t a, std::size_t b) {
    const auto& ta = tensors_[a];
    const auto& tb = tensors_[b];
    if (ta.shape != tb.shape || ta.dtype != tb.dtype)
      detail::throw_error<usage_error>("tied tensors '", ta.name, "' (", safetensors_name(ta.dtype), ", ", ta.shape.size(),
                                       " dims) and '", tb.name, "' (", safetensors_name(tb.dtype), ", ", tb.shape.size(),
                                       " dims) differ in dtype or shape; only identical tensors can share storage");
    const std::size_t ra = tie_root(a), rb = tie_root(b);
    if (ra == rb) return;
    tie_parent_[rb] = ra;
    cache_.clear();
    ++tie_count_;
  }

  std::vector<Module> modules_;
  std::vector<Tensor> tensors_;
  std::vector<std::size_t> tie_parent_;
  std::size_t tie_count_ = 0;
  std::size_t last_module_ = 0;
  detail::TreeIndexCache cache_;
  // Name → id, over the names modules_ and tensors_ hold (no second copy of each name).
  detail::NameIndex module_ids_;
  detail::NameIndex tensor_ids_;
  template <class T>
  struct NameOf {
    const std::vector<T>* items;
    std::string_view operator()(std::uint32_t i) const { return (*items)[i].name; }
  };
  [[nodiscard]] NameOf<Module> module_name() const { return {&modules_}; }
  [[nodiscard]] NameOf<Tensor> tensor_name() const { return {&tensors_}; }
};

/// @brief Model order of a ModuleTree, computed once per planning call.
///
/// Nodes (modules and tensors) are numbered depth-first the way accelerate's queue visits them:
/// a module, then its direct parameters, then its children, then its direct buffers. A module's
/// subtree is the contiguous range [rank, end).
struct TreeIndex {
  std::vector<std::uint32_t> module_rank;  ///< module id → its position
  std::vector<std::uint32_t> module_end;   ///< module id → one past its subtree's last position
  std::vector<std::uint32_t> tensor_rank;  ///< tensor id → its position
  std::vector<std::uint32_t> canonical;    ///< tensor id → the group member sizes count: the first in model
                                           ///< order that is not a tied copy (else the first)
  std::vector<std::vector<std::uint32_t>> tied_groups;  ///< tensor ids of each tie group, model order
  /// @name Compact copies of Module/Tensor fields for the loops over every tensor (no pointer
  ///       chasing); compute_module_sizes applies tensor_size's rule to them
  ///@{
  std::vector<std::uint32_t> module_parent;   ///< module id → parent id (root: UINT32_MAX)
  std::vector<std::uint32_t> tensor_module;   ///< tensor id → owning module
  std::vector<std::uint64_t> tensor_numel;    ///< tensor id → element count
  std::vector<DType> tensor_dtype;            ///< tensor id → stored dtype
  std::vector<bool> tensor_buffer;            ///< tensor id → is a buffer
  ///@}

  /// @brief True when tensor `t` lies in module `m`'s subtree.
  [[nodiscard]] bool contains(std::size_t m, std::size_t t) const noexcept {
    return tensor_rank[t] >= module_rank[m] && tensor_rank[t] < module_end[m];
  }
};

/// @brief Computes the model order, canonical names and tie groups of `tree` in O(n).
[[nodiscard]] inline TreeIndex index_tree(const ModuleTree& tree) {
  const auto& mods = tree.modules();
  const auto& tens = tree.tensors();
  TreeIndex ix;
  ix.module_rank.assign(mods.size(), 0);
  ix.module_end.assign(mods.size(), 0);
  ix.tensor_rank.assign(tens.size(), 0);
  ix.module_parent.resize(mods.size());
  for (std::size_t m = 0; m < mods.size(); ++m)
    ix.module_parent[m] = mods[m].parent == npos_id ? UINT32_MAX : static_cast<std::uint32_t>(mods[m].parent);
  ix.tensor_module.resize(tens.size());
  ix.tensor_numel.resize(tens.size());
  ix.tensor_dtype.resize(tens.size());
  ix.tensor_buffer.resize(tens.size());
  for (std::size_t t = 0; t < tens.size(); ++t) {
    ix.tensor_module[t] = static_cast<std::uint32_t>(tens[t].module);
    ix.tensor_numel[t] = tens[t].numel();
    ix.tensor_dtype[t] = tens[t].dtype;
    ix.tensor_buffer[t] = tens[t].buffer;
  }
  std::uint32_t next = 0;
  // Explicit stack: (module, stage) where stage 0 = enter, 1 = leave.
  std::vector<std::pair<std::size_t, bool>> stack{{0, false}};
  while (!stack.empty()) {
    auto [m, leaving] = stack.back();
    stack.pop_back();
    const auto& mod = mods[m];
    if (leaving) {
      for (auto b : mod.buffers) ix.tensor_rank[b] = next++;
      ix.module_end[m] = next;
      continue;
    }
    ix.module_rank[m] = next++;
    for (auto p : mod.parameters) ix.tensor_rank[p] = next++;
    stack.emplace_back(m, true);
    for (auto c = mod.children.rbegin(); c != mod.children.rend(); ++c) stack.emplace_back(*c, false);
  }
  ix.canonical.resize(tens.size());
  for (std::size_t t = 0; t < tens.size(); ++t) ix.canonical[t] = static_cast<std::uint32_t>(t);
  if (tree.has_ties()) {
    std::vector<std::size_t> root(tens.size());
    std::vector<std::uint32_t> count(tens.size(), 0);
    for (std::size_t t = 0; t < tens.size(); ++t) ++count[root[t] = tree.tie_root(t)];
    std::vector<std::int64_t> group_of(tens.size(), -1);
    for (std::size_t t = 0; t < tens.size(); ++t) {
      if (count[root[t]] < 2) continue;
      auto& g = group_of[root[t]];
      if (g < 0) {
        g = static_cast<std::int64_t>(ix.tied_groups.size());
        ix.tied_groups.emplace_back();
      }
      ix.tied_groups[static_cast<std::size_t>(g)].push_back(static_cast<std::uint32_t>(t));
    }
    for (auto& g : ix.tied_groups) {
      std::sort(g.begin(), g.end(), [&](auto a, auto b) { return ix.tensor_rank[a] < ix.tensor_rank[b]; });
      // transformers counts the tensor the others are tied to (the one a checkpoint holds), which
      // is not always the first: Csm's backbone audio embedding is a copy of its depth decoder's.
      const auto held = std::find_if(g.begin(), g.end(), [&](auto t) { return !tens[t].tied_copy; });
      for (auto t : g) ix.canonical[t] = held != g.end() ? *held : g.front();
    }
    std::sort(ix.tied_groups.begin(), ix.tied_groups.end(),
              [&](const auto& a, const auto& b) { return ix.tensor_rank[a.front()] < ix.tensor_rank[b.front()]; });
  }
  return ix;
}

inline std::shared_ptr<const TreeIndex> ModuleTree::index() const {
  return cache_.get([this] { return index_tree(*this); });
}

/// @brief How tensor sizes are counted.
///
/// By default every tensor counts at the dtype it is loaded in (tensor_load_dtype: floating
/// tensors take `dtype`, up or down, or float32 when they match `keep_in_fp32`); buffers that are
/// not in the state dict (non-persistent, e.g. rotary `inv_freq`) are computed by the model, not
/// loaded, and count at their own dtype, as do quantized tensors (Tensor::quantized: loaded
/// byte-exact). `accelerate_rule` selects accelerate's
/// compute_module_sizes instead: a floating tensor counts min(target, own) bytes.
struct SizeOptions {
  /// The load dtype of floating tensors (unset: each keeps its own).
  std::optional<DType> dtype{};
  /// Exact tensor name → dtype used for it, overriding every other rule (accelerate's special_dtypes).
  std::map<std::string, DType, std::less<>> special_dtypes{};
  /// keep-in-fp32 patterns (keep_in_fp32_matches): matching floating tensors count 4 bytes per element.
  std::vector<std::string> keep_in_fp32{};
  /// accelerate's rule: a floating tensor counts the smaller of `dtype` and its own.
  bool accelerate_rule = false;
};

/// @brief Byte sizes of every tensor and module subtree.
struct ModuleSizes {
  std::vector<std::uint64_t> tensor;          ///< per tensor; 0 for a non-canonical alias name
  std::vector<std::uint64_t> module;          ///< per module: its subtree, every shared tensor once
  std::vector<std::uint64_t> module_buffers;  ///< per module: the buffers of its subtree
  /// @brief The whole model (the root's size).
  [[nodiscard]] std::uint64_t total() const noexcept { return module.empty() ? 0 : module[0]; }
};

namespace detail {
// The size rule for one SizeOptions, the only place it is written: tensor_size and
// compute_module_sizes both count through it. The name is read only when the options name
// tensors, so the planner's loop over the index's compact copies never touches a Tensor.
class SizeRule {
 public:
  explicit SizeRule(const SizeOptions& opts)
      : opts_(opts), load_{opts.dtype, opts.keep_in_fp32},
        reads_names_(!opts.special_dtypes.empty() || !opts.keep_in_fp32.empty()) {}

  // False when every tensor of one dtype counts the same; callers may then pass an empty name.
  [[nodiscard]] bool reads_names() const noexcept { return reads_names_; }

  // An exact special dtype wins; a buffer outside the state dict or a quantized tensor keeps its
  // own; otherwise the load dtype (tensor_load_dtype), or accelerate's min(target, own) under
  // accelerate_rule.
  [[nodiscard]] DType counted_dtype(DType own, std::string_view name, bool keeps_own = false) const {
    if (reads_names_)
      if (auto it = opts_.special_dtypes.find(name); it != opts_.special_dtypes.end()) return it->second;
    if (keeps_own || !is_floating(own)) return own;
    if (!opts_.accelerate_rule) return tensor_load_dtype(own, reads_names_ ? name : std::string_view{}, load_);
    if (reads_names_)
      for (const auto& kept : opts_.keep_in_fp32)
        if (keep_in_fp32_matches(kept, name)) return DType::F32;
    if (opts_.dtype && bit_size(*opts_.dtype) < bit_size(own)) return *opts_.dtype;
    return own;
  }

  [[nodiscard]] std::uint64_t bytes(DType own, std::uint64_t numel, std::string_view name, bool keeps_own = false) const {
    return numel * bit_size(counted_dtype(own, name, keeps_own)) / 8;
  }

 private:
  const SizeOptions& opts_;
  LoadDTypeRule load_;
  bool reads_names_;
};
}  // namespace detail

/// @brief Bytes one tensor counts for under `opts` (ignoring aliasing).
[[nodiscard]] inline std::uint64_t tensor_size(const Tensor& t, const SizeOptions& opts) {
  return detail::SizeRule(opts).bytes(t.dtype, t.numel(), t.name, (t.buffer && !t.persistent) || t.quantized);
}

/// @brief accelerate's compute_module_sizes over a tree: each shared tensor counted once (under
///        TreeIndex::canonical: the member the others are tied to), added to its module and every ancestor.
[[nodiscard]] inline ModuleSizes compute_module_sizes(const ModuleTree& tree, const TreeIndex& ix,
                                                      const SizeOptions& opts = {}) {
  const auto& mods = tree.modules();
  const auto& tens = tree.tensors();
  ModuleSizes s;
  s.tensor.assign(tens.size(), 0);
  s.module.assign(mods.size(), 0);
  s.module_buffers.assign(mods.size(), 0);
  const detail::SizeRule rule(opts);
  for (std::size_t t = 0; t < tens.size(); ++t) {
    if (ix.canonical[t] != t) continue;
    const std::string_view name = rule.reads_names() ? std::string_view(tens[t].name) : std::string_view{};
    const std::uint64_t bytes =
        rule.bytes(ix.tensor_dtype[t], ix.tensor_numel[t], name, (ix.tensor_buffer[t] && !tens[t].persistent) || tens[t].quantized);
    s.tensor[t] = bytes;
    const auto m = ix.tensor_module[t];
    s.module[m] += bytes;
    if (ix.tensor_buffer[t]) s.module_buffers[m] += bytes;
  }
  // Children always have larger ids than their parents (add_module creates parents first).
  for (std::size_t m = mods.size(); m-- > 1;) {
    s.module[ix.module_parent[m]] += s.module[m];
    s.module_buffers[ix.module_parent[m]] += s.module_buffers[m];
  }
  return s;
}

/// @brief Convenience overload computing the index itself.
[[nodiscard]] inline ModuleSizes compute_module_sizes(const ModuleTree& tree, const SizeOptions& opts = {}) {
  return compute_module_sizes(tree, *tree.index(), opts);
}

/// @brief fnmatch-style glob: `*` matches any run of characters (dots included), `?` one character.
[[nodiscard]] inline bool glob_match(std::string_view pattern, std::string_view text) {
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

/// @brief Which modules must never be split across devices.
///
/// A module is a block when its class name equals one of `specs`, or its name equals one or matches
/// it as a glob (`model.layers.*`). With no specs and `auto_numbered`, the numbered children of any
/// module (`layers.0`, `layers.1`, `h.11`) are blocks. The root is never a block.
struct NoSplitRule {
  std::vector<std::string> specs{};  ///< class names, module names or globs
  bool auto_numbered = true;         ///< with no specs: numbered children are blocks

  /// @brief Whether module `m` of `tree` is a block.
  [[nodiscard]] bool matches(const ModuleTree& tree, std::size_t m) const {
    if (m == 0) return false;
    const auto& mod = tree.modules()[m];
    if (specs.empty()) {
      if (!auto_numbered) return false;
      const auto dot = mod.name.rfind('.');
      const std::string_view local = dot == std::string::npos ? std::string_view(mod.name) : std::string_view(mod.name).substr(dot + 1);
      bool digits = !local.empty();
      for (char c : local) digits = digits && c >= '0' && c <= '9';
      return digits;
    }
    for (const auto& s : specs) {
      if (!mod.class_name.empty() && mod.class_name == s) return true;
      if (s.find_first_of("*?") == std::string::npos ? mod.name == s : glob_match(s, mod.name)) return true;
    }
    return false;
  }
};

/// @brief Checks that every no-split spec names something in `tree`: a class of one of its
///        modules, a module name, or a glob matching one. A spec that matches nothing would
///        silently leave layers splittable, so it is an error.
/// @throws accel::usage_error naming the spec, the classes the tree has, and the nearest
///         class or module names
inline void check_no_split_specs(const ModuleTree& tree, const std::vector<std::string>& specs) {
  std::vector<bool> used(specs.size(), false);
  for (std::size_t m = 1; m < tree.modules().size(); ++m)
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (!used[i] && NoSplitRule{{specs[i]}, false}.matches(tree, m)) used[i] = true;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (used[i]) continue;
    std::vector<std::string> classes;
    for (const auto& mod : tree.modules())
      if (!mod.class_name.empty()) classes.push_back(mod.class_name);
    std::sort(classes.begin(), classes.end());
    classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
    // Nearest names: classes and module names within a third of the spec's length in edits.
    std::vector<std::pair<std::size_t, std::string>> near;
    auto consider = [&](const std::string& name) {
      const auto d = text::edit_distance(specs[i], name);
      if (d <= std::max<std::size_t>(2, specs[i].size() / 3) &&
          std::none_of(near.begin(), near.end(), [&](const auto& n) { return n.second == name; }))
        near.emplace_back(d, name);
    };
    for (const auto& c : classes) consider(c);
    for (const auto& mod : tree.modules()) consider(mod.name);
    std::sort(near.begin(), near.end());
    std::vector<std::string> nearest;
    for (std::size_t k = 0; k < near.size() && k < 3; ++k) nearest.push_back(near[k].second);
    detail::throw_error<usage_error>(
        "no-split '", specs[i], "' matches no module of this model (no class, name or glob match)",
        nearest.empty() ? std::string() : "; did you mean " + text::quoted_list(nearest) + "?",
        classes.empty() ? std::string("; the model has no class names (headers only: give module names or globs "
                                      "like 'model.layers.*', or the model's config.json so its classes are known)")
                        : "; its classes: " + text::quoted_list(classes, 40));
  }
}

/// @brief NoSplitRule evaluated for every module.
/// @return one flag per module id
[[nodiscard]] inline std::vector<bool> no_split_modules(const ModuleTree& tree, const std::vector<std::string>& specs,
                                                        bool auto_numbered = true) {
  const NoSplitRule rule{specs, auto_numbered};
  std::vector<bool> out(tree.modules().size(), false);
  for (std::size_t m = 1; m < out.size(); ++m) out[m] = rule.matches(tree, m);
  return out;
}

/// @brief The largest unit the planner moves whole: a no-split block, a module without children,
///        or a loose tensor of a module that gets split.
struct LayerSize {
  std::string name;          ///< its name ("" when the tree is empty)
  std::uint64_t bytes = 0;   ///< its size
};

/// @brief Finds the largest layer (as the planner's reserve sees it, before any placement); of
///        equal ones, the first in model order.
[[nodiscard]] inline LayerSize largest_layer(const ModuleTree& tree, const ModuleSizes& sizes, const std::vector<bool>& no_split) {
  LayerSize best;
  const auto& mods = tree.modules();
  auto consider = [&](const std::string& name, std::uint64_t bytes) {
    if (bytes > best.bytes) best = LayerSize{name, bytes};
  };
  std::vector<std::size_t> stack{0};
  while (!stack.empty()) {
    const auto m = stack.back();
    stack.pop_back();
    const auto& mod = mods[m];
    if (m != 0 && (mod.children.empty() || no_split[m])) {
      consider(mod.name, sizes.module[m]);
      continue;
    }
    for (auto t : mod.parameters) consider(tree.tensors()[t].name, sizes.tensor[t]);
    for (auto t : mod.buffers) consider(tree.tensors()[t].name, sizes.tensor[t]);
    // Reverse push: children are visited in model order, so ties go to the first.
    for (auto c = mod.children.rbegin(); c != mod.children.rend(); ++c) stack.push_back(*c);
  }
  return best;
}

ACCEL_NAMESPACE_END
