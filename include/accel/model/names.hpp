// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file names.hpp
/// @brief Checkpoint names and model names: how the tensor names of a Hub folder (what
///        `save_pretrained` writes) become the names of the model transformers 5 builds (what
///        `from_pretrained(device_map=...)` wants), for every model class transformers exports.
///
/// The rules are data generated from transformers by tests/compat/gen_names.py
/// (include/accel/model/data/names.json, embedded in detail/names_data.hpp) and checked there
/// against transformers' own renaming of every key of every class. A checkpoint name takes the
/// rule whose checkpoint side is its longest matching dotted prefix (`{i}` matches one all-digit
/// part, `linear_{i}` a part that is `linear_` and digits); the numbered values fill the model
/// side in order (`{i+1}`: the value plus one) and the rest of the name follows.
/// A numbered part the model side lacks is fused: many checkpoint tensors (one per expert) make
/// one model tensor (`experts.gate_up_proj`). Before the rules, transformers' base-model prefix
/// rule: a base-model checkpoint loaded into a head class gets the prefix, and the other way round.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/model/architecture.hpp>
#include <accel/model/detail/name_index.hpp>
#include <accel/model/detail/names_data.hpp>
#include <accel/model/json.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief One rename: a checkpoint-side template and the model-side template it becomes.
struct NameRule {
  std::string checkpoint;  ///< `vit.encoder.layer.{i}.intermediate.dense`
  std::string model;       ///< `vit.layers.{i}.mlp.fc1`
};

/// @brief What transformers renames for one model class.
struct ClassNames {
  std::string class_name;                      ///< `ViTForImageClassification`
  std::string model_type;                      ///< `vit`
  std::string base_model_prefix;               ///< `vit`
  std::vector<std::string> checkpoint_roots;   ///< top-level names save_pretrained writes
  std::vector<std::string> model_roots;        ///< top-level names of the model's state dict
  std::vector<std::string> base_roots;         ///< names the checkpoint holds under the prefix
  std::vector<NameRule> renames;               ///< checkpoint -> model
  std::vector<std::vector<std::string>> tied_if_tied;    ///< model-name tie groups (tie_word_embeddings true)
  std::vector<std::vector<std::string>> tied_if_untied;  ///< ... and false
  std::vector<std::vector<std::string>> tied_always;     ///< for configs without tie_word_embeddings
  std::optional<bool> tie_word_embeddings;     ///< the config class default, when it has the key
  bool exact = true;                           ///< false: the rules do not reproduce every key
  std::string first_difference;                ///< for inexact classes: the first key that differs

  /// @brief The tie groups for a config's tie_word_embeddings (unset: the class default).
  [[nodiscard]] const std::vector<std::vector<std::string>>& tied(std::optional<bool> tie) const {
    if (!tie_word_embeddings && tied_if_tied.empty() && tied_if_untied.empty()) return tied_always;
    return tie.value_or(tie_word_embeddings.value_or(true)) ? tied_if_tied : tied_if_untied;
  }
};

namespace detail {

inline const std::string& embedded_names_text() {
  static const std::string text = join_pieces(names_json_pieces);
  return text;
}

inline ClassNames parse_class_names(const nlohmann::json& e) {
  auto fail = [&](std::string_view what) {
    throw_error<usage_error>("name data: ", what, "; regenerate it with tests/compat/gen_names.py");
  };
  auto strings = [&](const nlohmann::json& v) {
    std::vector<std::string> out;
    if (!v.is_array()) fail("a list is not a list");
    for (const auto& s : v) {
      if (!s.is_string()) fail("a list holds a non-string");
      out.push_back(s.get<std::string>());
    }
    return out;
  };
  auto groups = [&](const nlohmann::json& v) {
    std::vector<std::vector<std::string>> out;
    if (v.is_array())
      for (const auto& g : v) out.push_back(strings(g));
    return out;
  };
  ClassNames c;
  if (!e.is_object() || !e.contains("class") || !e["class"].is_string()) fail("an entry has no class");
  c.class_name = e["class"].get<std::string>();
  c.model_type = e.value("model_type", std::string());
  c.base_model_prefix = e.value("base_model_prefix", std::string());
  c.checkpoint_roots = strings(e.value("checkpoint_roots", nlohmann::json::array()));
  c.model_roots = strings(e.value("model_roots", nlohmann::json::array()));
  c.base_roots = strings(e.value("base_roots", nlohmann::json::array()));
  for (const auto& r : e.value("renames", nlohmann::json::array())) {
    auto pair = strings(r);
    if (pair.size() != 2) fail("a rename is not a pair");
    c.renames.push_back({std::move(pair[0]), std::move(pair[1])});
  }
  const auto tied = e.value("tied", nlohmann::json::object());
  c.tied_if_tied = groups(tied.value("true", nlohmann::json()));
  c.tied_if_untied = groups(tied.value("false", nlohmann::json()));
  c.tied_always = groups(tied.value("always", nlohmann::json()));
  if (auto it = e.find("tie_word_embeddings"); it != e.end() && it->is_boolean()) c.tie_word_embeddings = it->get<bool>();
  c.exact = e.value("exact", true);
  c.first_difference = e.value("first_difference", std::string());
  return c;
}

}  // namespace detail

/// @brief The name rules of a model class (config.json `architectures[0]`), or nullptr when
///        transformers has no such class or could not build it from its config's defaults. Only
///        that class's entry is parsed; entries are cached (thread-safe).
[[nodiscard]] inline const ClassNames* find_class_names(std::string_view class_name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<ClassNames>, std::less<>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(class_name); it != cache.end()) return it->second.get();
  const std::string& text = detail::embedded_names_text();
  const std::string key = detail::concat("{\"class\":\"", class_name, "\",");
  std::unique_ptr<ClassNames> entry;
  if (const auto open = text.find(key); open != std::string::npos)
    if (const auto end = detail::json_object_end(text, open); end != std::string::npos) {
      auto parsed = parse_json_strict(std::string_view(text).substr(open, end - open));
      if (parsed.error.empty()) entry = std::make_unique<ClassNames>(detail::parse_class_names(parsed.value));
    }
  return cache.emplace(std::string(class_name), std::move(entry)).first->second.get();
}

/// @brief The transformers release the embedded name data was generated from.
[[nodiscard]] inline std::string names_transformers_version() {
  const std::string& text = detail::embedded_names_text();
  const std::string key = "\"transformers\":\"";
  const auto at = text.find(key);
  if (at == std::string::npos) return std::string();
  const auto start = at + key.size();
  return text.substr(start, text.find('"', start) - start);
}

class NameArena;

namespace detail {
// One dotted part of a rename rule: written out, or a number between two texts (`{i}`,
// `linear_{i}`), on the model side with a constant added (`{i+1}`, `{i-1}`).
struct NamePart {
  std::string text;           // the part as written
  std::string before, after;  // around the number
  std::int64_t offset = 0;
  bool number = false;

  explicit NamePart(std::string_view written) : text(written) {
    const auto open = written.find('{'), close = written.find('}');
    if (open == std::string_view::npos || close == std::string_view::npos || close < open + 2 ||
        written.find('{', open + 1) != std::string_view::npos || written.find('}', close + 1) != std::string_view::npos)
      return;
    const auto inner = written.substr(open + 1, close - open - 1);
    if (const auto sign = inner.find_first_of("+-"); sign != std::string_view::npos) {
      const auto digits = inner.substr(sign + 1);
      const auto v = text::parse_integer<std::int64_t>(digits);
      if (sign == 0 || !v || !is_block_number(digits)) return;
      offset = inner[sign] == '-' ? -*v : *v;
    }
    number = true;
    before = written.substr(0, open);
    after = written.substr(close + 1);
  }

  // The number this part takes from a name's part (the part's digits), or nullopt when it does
  // not match; a written-out part matches itself and gives an empty view.
  [[nodiscard]] std::optional<std::string_view> value_in(std::string_view p) const {
    if (!number) return text == p ? std::optional<std::string_view>(std::string_view{}) : std::nullopt;
    if (p.size() <= before.size() + after.size() || !p.starts_with(before) || !p.ends_with(after)) return std::nullopt;
    const auto digits = p.substr(before.size(), p.size() - before.size() - after.size());
    return is_block_number(digits) ? std::optional<std::string_view>(digits) : std::nullopt;
  }
};
}  // namespace detail

/// @brief Checkpoint name -> model name for one class (see the file comment for the rule).
class NameMapper {
 public:
  /// @brief A model name and whether other checkpoint tensors fuse into it.
  struct Mapped {
    std::string model;   ///< the model's name for the tensor
    bool fused = false;  ///< a numbered part was dropped: several checkpoint tensors make this one
    int rule = -1;       ///< index of the rule applied (-1: none)
  };

  explicit NameMapper(const ClassNames& names) : names_(&names) {
    for (std::size_t i = 0; i < names.renames.size(); ++i) {
      Rule r;
      r.checkpoint = split(names.renames[i].checkpoint);
      r.model = split(names.renames[i].model);
      std::size_t m = 0;
      for (std::size_t p = 0; p < r.checkpoint.size(); ++p)
        if (r.checkpoint[p].number) r.values.push_back(p);
      for (const auto& p : r.model) m += p.number;
      r.fused = m < r.values.size();
      // Rules whose first part holds a number are found under one key.
      by_head_[r.checkpoint.front().number ? std::string("{i}") : r.checkpoint.front().text].push_back(rules_.size());
      rules_.push_back(std::move(r));
    }
  }

  [[nodiscard]] const ClassNames& names() const noexcept { return *names_; }

  /// @brief The model name of a checkpoint tensor name.
  [[nodiscard]] Mapped to_model(std::string_view checkpoint_name) const {
    Mapped out;
    std::tie(out.fused, out.rule) = map_into(checkpoint_name, out.model);
    return out;
  }

  /// @brief As to_model, writing the model name into `out` (whose capacity is reused, so a loop
  ///        over a checkpoint's names allocates nothing); returns {fused, rule}.
  std::pair<bool, int> map_into(std::string_view checkpoint_name, std::string& out) const {
    const Parts parts(prefix_rule(checkpoint_name));
    const int rule = match(parts);
    build(parts, rule, out);
    return {rule >= 0 && rules_[static_cast<std::size_t>(rule)].fused, rule};
  }

  /// @brief The model name of each of `names`, deciding once per name shape (the name with its
  ///        numbers set aside, unless a rule or a top-level name spells that number): a checkpoint
  ///        of 90k tensors has a few hundred shapes. Each result is a view: the checkpoint name
  ///        itself where nothing changes, else the copy kept in `made`.
  [[nodiscard]] std::vector<std::string_view> map_all(std::span<const std::string_view> names, NameArena& made) const {
    std::vector<std::string_view> out(names.size());
    map_all(names, made, out);
    return out;
  }
  /// @brief As above, into `out` (as long as `names`): pieces of one table mapped on several threads.
  /// @throws std::invalid_argument when `out` is not as long as `names`
  void map_all(std::span<const std::string_view> names, NameArena& made, std::span<std::string_view> out) const;

  /// @brief transformers' base-model prefix rule, applied before the renames: a name of a
  ///        base-model checkpoint (its first part one the class's checkpoints hold under the prefix)
  ///        gets the prefix, and a head model's name loaded into the base model loses it; a name
  ///        under a top-level name of either side, or under none the class knows, is left alone.
  [[nodiscard]] std::string adjust_prefix(std::string_view name) const {
    const auto [prefix, rest] = prefix_rule(name);
    return prefix.empty() ? std::string(rest) : detail::concat(prefix, ".", rest);
  }

 private:
  struct Rule {
    std::vector<detail::NamePart> checkpoint, model;
    std::vector<std::size_t> values;  ///< positions of the checkpoint side's placeholders
    bool fused = false;
  };
  // A name's dotted parts after the prefix rule: the added prefix, then the name's own; views, on
  // the stack when there are few.
  class Parts {
   public:
    explicit Parts(std::pair<std::string_view, std::string_view> adjusted) {
      const auto [prefix, rest] = adjusted;
      data_ = few_.data();
      if (!prefix.empty()) add(prefix);
      for (const char *p = rest.data(), *q = p, *end = p + rest.size();; ++q)
        if (q == end || *q == '.') {
          add(std::string_view(p, static_cast<std::size_t>(q - p)));
          if (q == end) break;
          p = q + 1;
        }
    }
    Parts(const Parts&) = delete;
    Parts& operator=(const Parts&) = delete;
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] std::string_view operator[](std::size_t i) const noexcept { return data_[i]; }

   private:
    void add(std::string_view part) {
      if (size_ == few_.size()) many_.assign(few_.begin(), few_.end());
      if (size_ >= few_.size()) {
        many_.push_back(part);
        data_ = many_.data();
        ++size_;
        return;
      }
      few_[size_++] = part;
    }
    std::array<std::string_view, 32> few_;
    std::vector<std::string_view> many_;
    std::string_view* data_ = nullptr;
    std::size_t size_ = 0;
  };

  // The rule whose checkpoint side is the longest that matches, or -1.
  [[nodiscard]] int match(const Parts& parts) const {
    int best = -1;
    auto consider = [&](const std::vector<std::size_t>& candidates) {
      for (auto i : candidates) {
        const auto& r = rules_[i];
        if (r.checkpoint.size() > parts.size() || (best >= 0 && r.checkpoint.size() <= rules_[static_cast<std::size_t>(best)].checkpoint.size()))
          continue;
        bool ok = true;
        for (std::size_t p = 0; p < r.checkpoint.size() && ok; ++p) ok = r.checkpoint[p].value_in(parts[p]).has_value();
        if (ok) best = static_cast<int>(i);
      }
    };
    if (auto it = by_head_.find(parts[0]); it != by_head_.end()) consider(it->second);
    if (auto it = by_head_.find(std::string_view("{i}")); it != by_head_.end()) consider(it->second);
    return best;
  }

  // The model name from the parts and the rule (-1: the parts as they are).
  void build(const Parts& parts, int rule, std::string& out) const {
    out.clear();
    auto append = [&](std::string_view part) {
      if (!out.empty()) out += '.';
      out += part;
    };
    std::size_t from = 0;
    if (rule >= 0) {
      const auto& r = rules_[static_cast<std::size_t>(rule)];
      std::size_t v = 0;
      for (const auto& p : r.model) {
        if (!p.number || v >= r.values.size()) {
          append(p.text);
          continue;
        }
        const auto at = r.values[v++];
        const auto value = r.checkpoint[at].value_in(parts[at]).value_or(std::string_view{});
        append(p.before);
        const auto n = p.offset != 0 ? text::parse_integer<std::int64_t>(value) : std::nullopt;
        if (n) out += std::to_string(*n + p.offset);
        else out += value;
        out += p.after;
      }
      from = r.checkpoint.size();
    }
    for (std::size_t p = from; p < parts.size(); ++p) append(parts[p]);
  }

  // adjust_prefix as {a prefix to add (empty: none), the rest of the name}: views, no allocation.
  [[nodiscard]] std::pair<std::string_view, std::string_view> prefix_rule(std::string_view name) const {
    const std::string_view prefix = names_->base_model_prefix;
    if (prefix.empty()) return {{}, name};
    const auto dot = name.find('.');
    const auto head = name.substr(0, dot);
    auto has = [](const std::vector<std::string>& v, std::string_view s) { return std::find(v.begin(), v.end(), s) != v.end(); };
    if (has(names_->checkpoint_roots, head) || has(names_->model_roots, head)) return {{}, name};
    if (has(names_->checkpoint_roots, prefix) && has(names_->base_roots, head)) return {prefix, name};
    if (head == prefix && dot != std::string_view::npos) {
      const auto rest = name.substr(dot + 1);
      const auto next = rest.substr(0, rest.find('.'));
      if (has(names_->checkpoint_roots, next) || has(names_->model_roots, next)) return {{}, rest};
    }
    return {{}, name};
  }
  static std::vector<detail::NamePart> split(std::string_view s) {
    std::vector<detail::NamePart> out;
    for (std::size_t start = 0;;) {
      const auto dot = s.find('.', start);
      out.emplace_back(s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
      if (dot == std::string_view::npos) break;
      start = dot + 1;
    }
    return out;
  }

  const ClassNames* names_;
  std::vector<Rule> rules_;
  std::map<std::string, std::vector<std::size_t>, std::less<>> by_head_;  ///< rules by their first part
};

/// @brief Names the rules made, each kept once (experts fused into one tensor share its name), at
///        addresses that stay put: a NameTable's model names view them.
class NameArena {
 public:
  /// @brief A lasting view of `name`: the one already kept, or a new copy.
  std::string_view keep(std::string_view name) {
    // The names just kept first (experts in a row make the same few names): compared, not hashed.
    for (const auto r : recent_)
      if (r.size() == name.size() && r == name) return r;
    const auto hash = detail::name_hash(name);
    const auto id = static_cast<std::uint32_t>(names_->size());
    const auto name_of = [&](std::uint32_t i) -> std::string_view { return i == id ? name : std::string_view((*names_)[i]); };
    const auto kept = index_.insert(hash, id, name_of);
    const std::string_view out = kept ? std::string_view((*names_)[*kept]) : std::string_view(names_->emplace_back(name));
    recent_[next_++ % recent_.size()] = out;
    return out;
  }
  /// @brief Shared ownership of what keep() returned views of.
  [[nodiscard]] std::shared_ptr<const void> storage() const { return names_; }

 private:
  std::shared_ptr<std::deque<std::string>> names_ = std::make_shared<std::deque<std::string>>();
  detail::NameIndex index_;
  std::array<std::string_view, 4> recent_{};
  std::size_t next_ = 0;
};

inline void NameMapper::map_all(std::span<const std::string_view> names, NameArena& made, std::span<std::string_view> out) const {
  if (out.size() != names.size())
    throw std::invalid_argument(detail::concat("NameMapper::map_all: ", out.size(), " places for ", names.size(), " names"));
  // Numbers a rule part or a top-level name spells stay in the shape: they can decide.
  std::vector<std::string_view> spelled;
  auto note = [&](std::string_view part) {
    if (detail::is_block_number(part)) spelled.push_back(part);
  };
  for (const auto& r : rules_)
    for (const auto& p : r.checkpoint)
      if (!p.number) note(p.text);
  for (const auto* roots : {&names_->checkpoint_roots, &names_->model_roots, &names_->base_roots})
    for (const auto& p : *roots) note(p);
  note(names_->base_model_prefix);
  // Shape -> {the prefix rule's outcome: 0 none, 1 adds the prefix, 2 drops the first part; rule}.
  std::deque<std::string> shapes;
  std::vector<std::pair<int, int>> decided;
  detail::NameIndex known;
  std::vector<char> buffer;
  std::string scratch;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string_view name = names[i];
    // The shape, written in one pass: '#' for a number set aside, '=' and the part otherwise (a part
    // spelled "#" stays apart from a number), parts joined by dots; at most 2 × size + 1 bytes.
    if (buffer.size() < 2 * name.size() + 1) buffer.resize(2 * name.size() + 1);
    char* w = buffer.data();
    for (const char *p = name.data(), *end = p + name.size();;) {
      const char* q = std::find(p, end, '.');
      const std::string_view part(p, static_cast<std::size_t>(q - p));
      if (detail::is_block_number(part) && std::find(spelled.begin(), spelled.end(), part) == spelled.end()) {
        *w++ = '#';
      } else {
        *w++ = '=';
        w = std::copy(p, q, w);
      }
      if (q == end) break;
      *w++ = '.';
      p = q + 1;
    }
    const std::string_view shape(buffer.data(), static_cast<std::size_t>(w - buffer.data()));
    const auto id = static_cast<std::uint32_t>(shapes.size());
    const auto shape_of = [&](std::uint32_t k) -> std::string_view { return k == id ? shape : std::string_view(shapes[k]); };
    std::pair<int, int> decision;
    if (const auto seen = known.insert(detail::name_hash(shape), id, shape_of)) {
      decision = decided[*seen];
    } else {
      const auto adjusted = prefix_rule(name);
      decision = {adjusted.first.empty() ? (adjusted.second.size() == name.size() ? 0 : 2) : 1, match(Parts(adjusted))};
      shapes.emplace_back(shape);
      decided.push_back(decision);
    }
    if (decision == std::pair{0, -1}) {
      out[i] = name;
      continue;
    }
    // The prefix rule reads the first two parts, which the shape keeps unless they are numbers it
    // never spells: its outcome is the shape's.
    const std::pair<std::string_view, std::string_view> adjusted =
        decision.first == 1   ? std::pair{std::string_view(names_->base_model_prefix), name}
        : decision.first == 2 ? std::pair{std::string_view{}, name.substr(name.find('.') + 1)}
                              : std::pair{std::string_view{}, name};
    build(Parts(adjusted), decision.second, scratch);
    out[i] = scratch == name ? name : made.keep(scratch);
  }
}

/// @brief Every checkpoint tensor's model name, in the checkpoint's order.
struct NameTable {
  std::vector<std::string_view> checkpoint;  ///< checkpoint names
  std::vector<std::string_view> model;       ///< the model name of each (the same view where nothing renames)
  std::string source;                        ///< whose rules: `ViTForImageClassification (transformers 5.25.0)`, or why none
  /// What the views point into (the checkpoint headers' names, the names the rules made), shared
  /// by copies: a table outlives the Checkpoint it was made from.
  std::vector<std::shared_ptr<const void>> storage{};

  /// @brief True when no name changes (no rules, or none that applies).
  [[nodiscard]] bool identity() const {
    if (checkpoint.size() != model.size()) return false;
    for (std::size_t i = 0; i < checkpoint.size(); ++i)
      if (checkpoint[i].data() != model[i].data() && checkpoint[i] != model[i]) return false;
    return true;
  }
};

/// @brief NameTable::source for a table made with `names`' rules.
[[nodiscard]] inline std::string name_table_source(const ClassNames& names) {
  return detail::concat(names.class_name, " (transformers ", names_transformers_version(), ")");
}

/// @brief The model names of `checkpoint_names` under one class's rules (nullptr: unchanged).
/// @param storage what the names view (kept by the table): Checkpoint::name_storage()
[[nodiscard]] inline NameTable name_table(const ClassNames* names, const std::vector<std::string_view>& checkpoint_names,
                                          std::vector<std::shared_ptr<const void>> storage = {}) {
  NameTable t;
  t.checkpoint = checkpoint_names;
  t.storage = std::move(storage);
  if (!names) {
    t.model = checkpoint_names;
    return t;
  }
  NameArena made;
  t.model = NameMapper(*names).map_all(checkpoint_names, made);
  t.storage.push_back(made.storage());
  t.source = name_table_source(*names);
  return t;
}

ACCEL_NAMESPACE_END
