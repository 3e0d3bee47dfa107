// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file quantization.hpp
/// @brief Pre-quantized checkpoints: config.json's `quantization_config` read, and every tensor of
///        the checkpoint classified as a quantized weight (or its scales, zero points, packing
///        metadata), which is sized and loaded byte-exact at its stored dtype, or as an ordinary
///        tensor, which follows the load dtype.
///
/// Supported methods, as transformers 5 loads them: `fp8` (block or per-tensor float8 weights
/// with `weight_scale_inv`), `compressed-tensors` (float- and int-quantized, pack-quantized int4/
/// int8 and nvfp4 with `weight_scale`, zero points, `weight_shape`), `gptq` and `awq` (`qweight`,
/// `qzeros`, `scales`, `g_idx`), `mxfp4` (gpt-oss `*_blocks` / `*_scales`) and pre-quantized
/// `bitsandbytes` (4-bit: `weight` with its `weight.absmax`, `weight.quant_map`, ...
/// quant-state tensors; 8-bit: `weight` with `SCB`). Any other method is an error naming it: a
/// plan sized as if dequantized would be wrong by a factor of two or four.
///
/// A quantized module is recognised by its tensors (a float8 `weight` with its scale, a `qweight`,
/// `*_blocks`, ...), not by the config's lists of modules left unquantized: those follow the load
/// dtype because they hold ordinary tensors. A module whose tensors contradict the config (a
/// scale without its weight, a weight without its scale, scale or packed shapes that do not match
/// the block, group or bit width) is a checkpoint_error naming the tensor.
#pragma once

#include <algorithm>
#include <array>
#include <bitset>
#include <cctype>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/model/dtype.hpp>
#include <accel/model/json.hpp>
#include <accel/model/names.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/parallel_for.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief The quantization methods accel plans and loads.
enum class QuantMethod : std::uint8_t {
  fp8,                 ///< transformers' FineGrainedFP8: float8 weights, `weight_scale_inv` per block or tensor
  compressed_tensors,  ///< llm-compressor's formats: float/int-quantized, pack-quantized, nvfp4
  gptq,                ///< GPTQ: `qweight`, `qzeros`, `scales`, `g_idx`
  awq,                 ///< AWQ: `qweight`, `qzeros`, `scales`
  mxfp4,               ///< gpt-oss experts: `*_blocks` (two 4-bit floats per byte) and `*_scales`
  bitsandbytes_4bit,   ///< pre-quantized bitsandbytes nf4/fp4: `weight` plus quant-state tensors
  bitsandbytes_8bit,   ///< pre-quantized bitsandbytes LLM.int8: int8 `weight` plus `SCB`
};

/// @brief One group of compressed-tensors' `config_groups`: the layers it targets and how it
///        quantizes their weights.
struct QuantGroup {
  std::string name;                  ///< its key in config_groups
  std::vector<std::string> targets;  ///< module names, `re:` patterns (Python's re.match) or class names (`Linear`)
  bool weights = false;              ///< it quantizes weights (else only activations)
  int bits = 0;                      ///< weights' num_bits
  std::int64_t group_size = 0;       ///< -1: one group per column; 0: unset
  std::string strategy;              ///< lower case; inferred from group_size when the config has none
};

/// @brief A checkpoint's `quantization_config`, as far as sizes, loading and checks need it.
struct QuantizationConfig {
  QuantMethod method = QuantMethod::fp8;
  std::string quant_method;   ///< as config.json writes it (`fp8`, `compressed-tensors`, ...)
  std::string description;    ///< for reports: `fp8 (float8 weights, 128×128 blocks)`
  int bits = 0;               ///< weight bits (gptq, awq, compressed-tensors with one weights group)
  std::int64_t group_size = 0;  ///< gptq/awq/compressed-tensors groups along the input; -1: one group; 0: none
  std::optional<std::array<std::int64_t, 2>> block{};  ///< fp8: weight_block_size; unset: one scale per tensor
  std::string format;         ///< compressed-tensors format, awq version
  std::string strategy;       ///< compressed-tensors weights strategy (group, channel, tensor, block, ...)
  /// compressed-tensors' config_groups (bits, group_size and strategy above are those of its only
  /// weights group, else unset): each quantized layer is checked against the group that targets it.
  std::vector<QuantGroup> groups{};
  /// compressed-tensors' `ignore`: layers left unquantized, by name or `re:` pattern; one of them
  /// stored quantized is an error.
  std::vector<std::string> ignore{};
  /// Modules the config leaves unquantized (modules_to_not_convert, llm_int8_skip_modules), as
  /// transformers matches them (quant_module_listed); checked against the tensors.
  std::vector<std::string> not_converted{};
  /// Tensors transformers' quantized modules hold in float32 whatever the load dtype
  /// (keep_in_fp32_matches patterns: mxfp4's expert biases).
  std::vector<std::string> keep_in_fp32{};
  /// transformers' adjust_max_memory: bitsandbytes plans with 90% of every budget.
  double budget_factor = 1.0;
  /// transformers refuses a map placing any module on cpu or disk (bitsandbytes without
  /// llm_int8_enable_fp32_cpu_offload); accel loads such a map, and says so.
  bool transformers_gpu_only = false;
};

/// @brief Methods transformers 5 knows that accel does not plan or load (named in the error).
inline constexpr std::array<std::string_view, 18> unsupported_quant_methods{
    "aqlm", "auto-round", "bitnet", "eetq", "fbgemm_fp8", "fp_quant", "fouroversix", "gguf", "higgs",
    "hqq", "metal", "nvfp4", "quanto", "quark", "sinq", "spqr", "torchao", "vptq"};

namespace detail {

// ceil(a / b) for a dimension a >= 0 and b > 0. Not (a + b - 1) / b: a zero-element tensor may
// declare any dimension up to 2^63 - 1, and the sum would overflow.
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return b > 0 ? a / b + (a % b != 0 ? 1 : 0) : 0; }

// a × b for dimensions (a, b >= 0), or nullopt when the product overflows 64 bits.
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  if (a < 0 || b < 0 || (b != 0 && a > std::numeric_limits<std::int64_t>::max() / b)) return std::nullopt;
  return a * b;
}

inline std::string ascii_lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The largest group and block size read: larger ones describe no tensor a checkpoint holds.
inline constexpr std::int64_t max_quant_group = std::int64_t{1} << 40;

[[noreturn]] inline void bad_quant_config(std::string_view field, const nlohmann::json& v, std::string_view want) {
  throw_error<checkpoint_error>("config.json: quantization_config.", text::printable(field), " is ", json_excerpt(v), ", not ",
                                want, "; fix config.json (it must describe the tensors as stored)");
}

// `v` as an integer from lo to hi, or nullopt. nlohmann keeps a non-negative integer as unsigned
// and get<std::int64_t>() wraps it: 2^64 - 1 would read as -1 ("one group per column").
inline std::optional<std::int64_t> json_int_in(const nlohmann::json& v, std::int64_t lo, std::int64_t hi) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (hi < 0 || u > static_cast<std::uint64_t>(hi) || static_cast<std::int64_t>(u) < lo) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (!v.is_number_integer()) return std::nullopt;
  const auto i = v.get<std::int64_t>();
  if (i < lo || i > hi) return std::nullopt;
  return i;
}

// `q[key]` as an integer from lo to hi; nullopt when absent or null. `field` (default: key) and
// `want` (default: the range) word the error.
inline std::optional<std::int64_t> quant_int(const nlohmann::json& q, const char* key, std::int64_t lo, std::int64_t hi,
                                             std::string_view field = {}, std::string_view want = {}) {
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return std::nullopt;
  const auto v = json_int_in(*it, lo, hi);
  if (!v)
    bad_quant_config(field.empty() ? std::string_view(key) : field, *it,
                     want.empty() ? concat("an integer from ", lo, " to ", hi) : std::string(want));
  return v;
}

// `q["group_size"]`: exactly -1 (one group per column) or 1 to 2^40; nullopt when absent or null.
inline std::optional<std::int64_t> quant_group_size(const nlohmann::json& q, std::string_view field) {
  const auto want = concat("-1 or a positive integer up to ", max_quant_group);
  const auto v = quant_int(q, "group_size", -1, max_quant_group, field, want);
  if (v == 0) bad_quant_config(field, q.at("group_size"), want);
  return v;
}

inline std::vector<std::string> quant_names(const nlohmann::json& q, const char* key) {
  std::vector<std::string> out;
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return out;
  if (!it->is_array()) bad_quant_config(key, *it, "a list of module names");
  for (std::size_t i = 0; i < it->size(); ++i) {
    const auto& v = (*it)[i];
    if (!v.is_string()) bad_quant_config(concat(key, "[", i, "]"), v, "a module name");
    out.push_back(v.get<std::string>());
  }
  return out;
}

inline std::string group_text(std::int64_t group) {
  return group > 0 ? concat("groups of ", group) : std::string("one group per column");
}

// ---- compressed-tensors' `re:` patterns ----
//
// compressed-tensors matches a `re:` entry of `ignore` or `targets` with Python's
// re.match(pattern, module_name): from the start of the name, not necessarily to its end. accel
// reads those patterns itself, in Python's syntax without lookaround, backreferences, word
// boundaries, possessive repeats or inline flags (no ignore list needs them; they are refused by
// name), and runs each as a Thompson automaton over the name's bytes: one pass, at most one thread
// per instruction at each byte, no recursion. std::regex backtracks instead ((a+)+b takes
// exponential time on a name of a's) and recurses once per byte of the name, and reads ECMAScript,
// not Python.

enum class PatternOp : std::uint8_t { byte_in, split, jump, at_start, at_end, at_end_or_newline, match };

struct PatternInst {
  PatternOp op = PatternOp::match;
  std::uint32_t x = 0, y = 0;  // byte_in: the byte set; split: both next instructions; jump: the next one
};

struct PatternNode {
  enum class Kind : std::uint8_t { bytes, sequence, alternatives, repeat, at_start, at_end, at_end_or_newline };
  static constexpr std::uint32_t unbounded = std::numeric_limits<std::uint32_t>::max();
  Kind kind = Kind::sequence;
  std::uint32_t set = 0;           // bytes: the index of its byte set
  std::uint32_t min = 0, max = 0;  // repeat: counts; max unbounded: no upper bound
  std::vector<PatternNode> kids;   // sequence, alternatives; a repeat's one body
};

// Reads a pattern into a tree, or throws Refused saying why (Python's own words where Python
// refuses the pattern too). Nesting is bounded by the pattern's length (NamePattern::max_bytes).
class PatternParser {
 public:
  struct Refused {
    std::string why;
  };

  explicit PatternParser(std::string_view pattern, std::vector<std::bitset<256>>& sets) : p_(pattern), sets_(sets) {}

  PatternNode parse() {
    auto tree = alternatives();
    if (more()) fail("unbalanced parenthesis");  // only a `)` ends the top level early
    return tree;
  }

 private:
  using Kind = PatternNode::Kind;
  static constexpr std::uint64_t max_repeat = 1000;

  static PatternNode node(Kind kind) {
    PatternNode n;
    n.kind = kind;
    return n;
  }
  [[noreturn]] void fail(std::string_view why) const { throw Refused{concat(why, " at position ", at_)}; }
  [[noreturn]] void unsupported(std::string_view what) const {
    throw Refused{concat(what, " at position ", at_, " is not supported: accel reads Python's patterns without lookaround, "
                         "backreferences, word boundaries, possessive repeats or inline flags")};
  }
  bool more() const { return at_ < p_.size(); }
  bool next_is(char c, std::size_t ahead = 0) const { return at_ + ahead < p_.size() && p_[at_ + ahead] == c; }

  PatternNode bytes(const std::bitset<256>& set) {
    auto n = node(Kind::bytes);
    n.set = static_cast<std::uint32_t>(sets_.size());
    sets_.push_back(set);
    return n;
  }
  PatternNode literal(unsigned char c) {
    std::bitset<256> set;
    set.set(c);
    return bytes(set);
  }

  PatternNode alternatives() {
    auto alt = node(Kind::alternatives);
    alt.kids.push_back(sequence());
    while (next_is('|')) {
      ++at_;
      alt.kids.push_back(sequence());
    }
    if (alt.kids.size() == 1) return std::move(alt.kids.front());
    return alt;
  }

  PatternNode sequence() {
    auto seq = node(Kind::sequence);
    while (more() && p_[at_] != '|' && p_[at_] != ')') seq.kids.push_back(repeated(atom()));
    return seq;
  }

  // `item` with the repeat after it, if one follows.
  PatternNode repeated(PatternNode item) {
    const auto bounds = repeat_bounds(true);
    if (!bounds) return item;
    if (item.kind == Kind::at_start || item.kind == Kind::at_end || item.kind == Kind::at_end_or_newline) fail("nothing to repeat");
    if (next_is('?')) ++at_;  // lazy: the same names match
    else if (next_is('+')) unsupported("a possessive repeat");
    if (repeat_bounds(false)) fail("multiple repeat");
    auto r = node(Kind::repeat);
    r.min = static_cast<std::uint32_t>(bounds->first);
    r.max = static_cast<std::uint32_t>(bounds->second);
    r.kids.push_back(std::move(item));
    return r;
  }

  // The repeat at the cursor (`*`, `+`, `?`, `{m}`, `{m,}`, `{,n}`, `{m,n}`), consumed when
  // `consume`; nullopt for none, and for a `{` that begins no repeat (Python reads it literally).
  std::optional<std::pair<std::uint64_t, std::uint64_t>> repeat_bounds(bool consume) {
    if (!more()) return std::nullopt;
    std::pair<std::uint64_t, std::uint64_t> b{0, PatternNode::unbounded};
    std::size_t end = at_ + 1;
    if (p_[at_] == '+') b.first = 1;
    else if (p_[at_] == '?') b.second = 1;
    else if (p_[at_] == '{') {
      auto number = [&](std::optional<std::uint64_t>& out) {
        for (; end < p_.size() && p_[end] >= '0' && p_[end] <= '9'; ++end)
          out = std::min<std::uint64_t>(out.value_or(0) * 10 + static_cast<std::uint64_t>(p_[end] - '0'), 1'000'000'000'000);
      };
      std::optional<std::uint64_t> lo, hi;
      number(lo);
      const bool comma = end < p_.size() && p_[end] == ',';
      if (comma) {
        ++end;
        number(hi);
      }
      if (end >= p_.size() || p_[end] != '}' || (!lo && !comma)) return std::nullopt;
      ++end;
      b = {lo.value_or(0), comma ? hi.value_or(PatternNode::unbounded) : lo.value_or(0)};
      if (consume && (b.first > max_repeat || (b.second != PatternNode::unbounded && b.second > max_repeat))) {
        at_ = end;
        fail(concat("a repeat count over ", max_repeat));
      }
      if (consume && b.second < b.first) {
        at_ = end;
        fail("min repeat greater than max repeat");
      }
    } else if (p_[at_] != '*') {
      return std::nullopt;
    }
    if (consume) at_ = end;
    return b;
  }

  PatternNode atom() {
    const char c = p_[at_];
    switch (c) {
      case '(': return group();
      case '[': ++at_; return bytes(char_class());
      case '.': {
        ++at_;
        std::bitset<256> any;
        any.set();
        any.reset('\n');
        return bytes(any);
      }
      case '^': ++at_; return node(Kind::at_start);
      case '$': ++at_; return node(Kind::at_end_or_newline);
      case '\\': return escape();
      case '*':
      case '+':
      case '?': fail("nothing to repeat");
      case '{':
        if (repeat_bounds(false)) fail("nothing to repeat");
        break;
      default: break;
    }
    ++at_;
    return literal(static_cast<unsigned char>(c));
  }

  PatternNode group() {
    ++at_;  // (
    if (next_is('?')) {
      ++at_;
      if (!more()) fail("unexpected end of pattern");
      const char k = p_[at_];
      if (k == ':') ++at_;
      else if (k == 'P' && next_is('<', 1)) group_name();
      else if (k == 'P' && next_is('=', 1)) unsupported("a backreference (?P=");
      else if (k == '=' || k == '!') unsupported("a lookahead");
      else if (k == '<' && (next_is('=', 1) || next_is('!', 1))) unsupported("a lookbehind");
      else if (k == '#') unsupported("a comment group");
      else if (k == '(') unsupported("a conditional group");
      else if (k == '>') unsupported("an atomic group");
      else if (std::string_view("aiLmsux-").find(k) != std::string_view::npos) unsupported("an inline flag");
      else fail(concat("unknown extension ?", text::printable(p_.substr(at_, 1))));
    }
    // A group is never an assertion itself: Python repeats (^)* as it repeats (a)*.
    auto g = node(Kind::sequence);
    g.kids.push_back(alternatives());
    if (!next_is(')')) fail("missing ), unterminated subpattern");
    ++at_;
    return g;
  }

  // `(?P<name>`: an identifier, each name once (the capture itself does not matter here).
  void group_name() {
    at_ += 2;
    const auto close = p_.find('>', at_);
    if (close == std::string_view::npos) fail("missing >, unterminated name");
    const auto name = p_.substr(at_, close - at_);
    const auto word = [](char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)) || static_cast<unsigned char>(c) >= 0x80; };
    if (name.empty() || (name[0] >= '0' && name[0] <= '9') || !std::all_of(name.begin(), name.end(), word))
      fail("bad character in group name");
    if (std::find(names_.begin(), names_.end(), name) != names_.end()) fail("redefinition of group name");
    names_.push_back(name);
    at_ = close + 1;
  }

  // \d \D \s \S \w \W as byte sets (bytes from 0x80 count as word bytes: the UTF-8 of letters).
  static std::optional<std::bitset<256>> class_escape(char e) {
    std::bitset<256> set;
    switch (std::tolower(static_cast<unsigned char>(e))) {
      case 'd':
        for (int c = '0'; c <= '9'; ++c) set.set(static_cast<std::size_t>(c));
        break;
      case 's':
        for (const char c : std::string_view(" \t\n\r\f\v\x1c\x1d\x1e\x1f")) set.set(static_cast<unsigned char>(c));
        break;
      case 'w':
        for (std::size_t c = 0; c < 256; ++c)
          if (c == '_' || c >= 0x80 || std::isalnum(static_cast<int>(c))) set.set(c);
        break;
      default: return std::nullopt;
    }
    if (std::isupper(static_cast<unsigned char>(e))) set.flip();
    return set;
  }

  // The byte an escape other than a class stands for; the cursor is past the escaped character `e`.
  unsigned char escaped_byte(char e, bool in_class) {
    const auto octal = [](char c) { return c >= '0' && c <= '7'; };
    const auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    // `e` and up to two more octal digits (Python's \0, \012, and \1 in a class).
    const auto octal_value = [&] {
      unsigned value = static_cast<unsigned>(e - '0');
      for (int n = 0; n < 2 && more() && octal(p_[at_]); ++n, ++at_) value = value * 8 + static_cast<unsigned>(p_[at_] - '0');
      if (value > 0xff) fail("octal escape value outside of range 0-0o377");
      return static_cast<unsigned char>(value);
    };
    switch (e) {
      case 'a': return '\a';
      case 'f': return '\f';
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'v': return '\v';
      case 'x': {
        if (at_ + 1 >= p_.size() || hex(p_[at_]) < 0 || hex(p_[at_ + 1]) < 0) fail("incomplete escape \\x");
        const auto value = hex(p_[at_]) * 16 + hex(p_[at_ + 1]);
        at_ += 2;
        return static_cast<unsigned char>(value);
      }
      case 'u':
      case 'U':
      case 'N': unsupported("a \\u, \\U or \\N escape");
      default: break;
    }
    if (in_class && e == 'b') return '\b';
    if (octal(e) && (e == '0' || in_class)) return octal_value();
    if (e >= '1' && e <= '9' && !in_class) {  // a group's number, unless three octal digits make a byte
      if (octal(e) && at_ + 1 < p_.size() && octal(p_[at_]) && octal(p_[at_ + 1])) return octal_value();
      --at_;
      unsupported("a backreference");
    }
    if (static_cast<unsigned char>(e) < 0x80 && std::isalnum(static_cast<unsigned char>(e))) {
      --at_;
      fail(concat("bad escape \\", e));
    }
    return static_cast<unsigned char>(e);
  }

  PatternNode escape() {
    ++at_;  // backslash
    if (!more()) fail("bad escape (end of pattern)");
    const char e = p_[at_++];
    if (e == 'A') return node(Kind::at_start);
    if (e == 'Z') return node(Kind::at_end);
    if (e == 'b' || e == 'B') {
      --at_;
      unsupported("a word boundary");
    }
    if (const auto set = class_escape(e)) return bytes(*set);
    return literal(escaped_byte(e, false));
  }

  // `[...]` after its `[`: bytes, ranges, class escapes; `^` first negates, `]` first is a byte.
  std::bitset<256> char_class() {
    std::bitset<256> set;
    const bool negate = next_is('^');
    if (negate) ++at_;
    // One byte of a class (a class escape such as \d when `set_out` is given), or nullopt for it.
    auto item = [&](std::bitset<256>* set_out) -> std::optional<unsigned char> {
      if (!more()) fail("unterminated character set");
      const char c = p_[at_++];
      if (c != '\\') return static_cast<unsigned char>(c);
      if (!more()) fail("unterminated character set");
      const char e = p_[at_++];
      if (const auto cls = class_escape(e)) {
        if (!set_out) fail("bad character range");
        *set_out |= *cls;
        return std::nullopt;
      }
      return escaped_byte(e, true);
    };
    for (bool first = true;; first = false) {
      if (!more()) fail("unterminated character set");
      if (p_[at_] == ']' && !first) {
        ++at_;
        break;
      }
      const auto lo = item(&set);
      const bool range = next_is('-') && at_ + 1 < p_.size() && p_[at_ + 1] != ']';
      if (!lo) {
        if (range) fail("bad character range");
        continue;
      }
      if (!range) {
        set.set(*lo);
        continue;
      }
      ++at_;  // -
      const auto hi = item(nullptr);
      if (*hi < *lo) fail("bad character range");
      for (unsigned c = *lo; c <= *hi; ++c) set.set(c);
    }
    if (negate) set.flip();
    return set;
  }

  std::string_view p_;
  std::vector<std::bitset<256>>& sets_;
  std::vector<std::string_view> names_{};
  std::size_t at_ = 0;
};

// What matching patterns against a checkpoint's layers has spent: automaton steps, and states
// of the cached automata (each up to a few KiB), both bounded by their caller.
struct PatternBudget {
  std::uint64_t steps = 0;
  std::size_t dfa_states = 0;
};

// A compiled `re:` pattern. Matching runs the Thompson automaton through a cache of the thread
// sets it reaches (a DFA built lazily over the pattern's byte classes): the layers of a checkpoint
// share most of their bytes, so after the first few names each byte is one table lookup.
class NamePattern {
 public:
  static constexpr std::size_t max_bytes = 512;       // of a pattern
  static constexpr std::size_t max_program = 4096;    // instructions, once its repeats are written out
  static constexpr std::size_t max_dfa_states = 1 << 15;  // cached states, all patterns together

  // The pattern compiled, or nullopt with `why`.
  [[nodiscard]] static std::optional<NamePattern> compile(std::string_view pattern, std::string& why) {
    if (pattern.size() > max_bytes) {
      why = concat("it is ", pattern.size(), " bytes long; accel reads patterns of up to ", max_bytes, " bytes");
      return std::nullopt;
    }
    NamePattern out;
    try {
      out.emit(PatternParser(pattern, out.sets_).parse());
      out.push({PatternOp::match});
    } catch (const PatternParser::Refused& r) {
      why = r.why;
      return std::nullopt;
    }
    out.make_byte_classes();
    return out;
  }

  // Whether the pattern matches at the start of `name` (re.match).
  [[nodiscard]] bool matches_start(std::string_view name, PatternBudget& budget) const {
    const auto n = name.size();
    // The cache covers positions inside the name, where neither `^` nor `$` holds. A name of
    // under two bytes, or one ending in a newline (`$` holds before it), is run thread by thread.
    if (n < 2 || name.back() == '\n') return simulate(name, budget);
    if (start_ == unbuilt) start_ = closure(std::vector<std::uint32_t>{0}, {true, false, false}, budget);
    if (start_ == unbuilt) return simulate(name, budget);
    budget.steps += n;
    // next_ holds, per state and byte class, the row (state × classes) of the state after the
    // byte, or matched / dead / unbuilt: one load per byte.
    auto row = start_;
    for (std::size_t pos = 0;; ++pos) {
      if (row == matched) return true;
      if (row == dead) return false;
      const auto byte = static_cast<unsigned char>(name[pos]);
      const auto at = static_cast<std::size_t>(row) + class_of_[byte];
      if (pos + 1 == n) {  // the last byte: `$` and \Z hold after it
        if (last_[at] < 0) last_[at] = closure(advance(state(row), byte), {false, true, true}, budget, false) == matched ? 1 : 0;
        return last_[at] == 1;
      }
      if (next_[at] == unbuilt) {
        const auto next = closure(advance(state(row), byte), {false, false, false}, budget);
        if (next == unbuilt) return simulate(name, budget);
        next_[at] = next;
      }
      row = next_[at];
    }
  }

 private:
  NamePattern() = default;

  struct Where {  // which assertions hold at a position
    bool start, end, end_or_newline;
  };

  // Follows splits, jumps and assertions from `seeds`, each instruction once, and leaves the byte
  // tests reached, sorted, in threads_. With `cache`, returns the cached state they make (matched,
  // dead, a row; unbuilt once the states of all patterns reach max_dfa_states); else matched,
  // dead, or 0 for threads alive.
  std::int32_t closure(const std::vector<std::uint32_t>& seeds, Where at, PatternBudget& budget, bool cache = true) const {
    if (seen_.size() != program_.size()) seen_.assign(program_.size(), 0);
    if (++mark_ == 0) {  // the marks wrapped: start them again
      std::fill(seen_.begin(), seen_.end(), 0);
      mark_ = 1;
    }
    threads_.clear();
    stack_.assign(seeds.rbegin(), seeds.rend());  // the first seed first (the order does not change whether it matches)
    ++budget.steps;
    while (!stack_.empty()) {
      const auto pc = stack_.back();
      stack_.pop_back();
      if (seen_[pc] == mark_) continue;
      seen_[pc] = mark_;
      ++budget.steps;
      const auto& inst = program_[pc];
      switch (inst.op) {
        case PatternOp::byte_in: threads_.push_back(pc); break;
        case PatternOp::split:
          stack_.push_back(inst.y);
          stack_.push_back(inst.x);
          break;
        case PatternOp::jump: stack_.push_back(inst.x); break;
        case PatternOp::at_start:
          if (at.start) stack_.push_back(pc + 1);
          break;
        case PatternOp::at_end:
          if (at.end) stack_.push_back(pc + 1);
          break;
        case PatternOp::at_end_or_newline:
          if (at.end_or_newline) stack_.push_back(pc + 1);
          break;
        case PatternOp::match: return matched;
      }
    }
    if (threads_.empty()) return dead;
    if (!cache) return 0;
    std::sort(threads_.begin(), threads_.end());
    if (const auto it = dfa_index_.find(threads_); it != dfa_index_.end()) return it->second;
    if (budget.dfa_states >= max_dfa_states) return unbuilt;
    ++budget.dfa_states;
    const auto row = static_cast<std::int32_t>(next_.size());
    next_.resize(next_.size() + classes_, unbuilt);
    last_.resize(last_.size() + classes_, -1);
    states_.push_back(threads_);
    dfa_index_.emplace(threads_, row);
    return row;
  }
  // The threads that take `byte`, each moved past its test (in seeds_).
  const std::vector<std::uint32_t>& advance(const std::vector<std::uint32_t>& threads, unsigned char byte) const {
    seeds_.clear();
    for (const auto pc : threads)
      if (sets_[program_[pc].x][byte]) seeds_.push_back(pc + 1);
    return seeds_;
  }
  const std::vector<std::uint32_t>& state(std::int32_t row) const { return states_[static_cast<std::size_t>(row) / classes_]; }
  // The automaton run thread by thread, nothing cached.
  bool simulate(std::string_view name, PatternBudget& budget) const {
    const auto n = name.size();
    const auto where = [&](std::size_t pos) { return Where{pos == 0, pos == n, pos == n || (pos + 1 == n && name[pos] == '\n')}; };
    std::vector<std::uint32_t> now{0};
    for (std::size_t pos = 0;; ++pos) {
      const auto r = closure(now, where(pos), budget, false);
      if (r == matched) return true;
      if (r == dead || pos == n) return false;
      now = advance(threads_, static_cast<unsigned char>(name[pos]));
    }
  }

  // Bytes every set of the pattern treats alike share a class: the cache's tables are per class.
  void make_byte_classes() {
    std::map<std::vector<bool>, std::uint8_t> ids;
    for (std::size_t b = 0; b < 256; ++b) {
      std::vector<bool> in(sets_.size());
      for (std::size_t i = 0; i < sets_.size(); ++i) in[i] = sets_[i][b];
      const auto [it, fresh] = ids.emplace(std::move(in), static_cast<std::uint8_t>(ids.size()));
      class_of_[b] = it->second;
    }
    classes_ = ids.size();
  }

  std::uint32_t push(PatternInst inst) {
    if (program_.size() >= max_program)
      throw PatternParser::Refused{concat("it takes more than ", max_program, " instructions once its repeats are written out")};
    program_.push_back(inst);
    return static_cast<std::uint32_t>(program_.size() - 1);
  }
  std::uint32_t here() const { return static_cast<std::uint32_t>(program_.size()); }

  // Thompson's construction; every loop below pushes an instruction per turn, so max_program
  // bounds the work however the repeats nest.
  void emit(const PatternNode& n) {
    using Kind = PatternNode::Kind;
    switch (n.kind) {
      case Kind::bytes: push({PatternOp::byte_in, n.set, 0}); return;
      case Kind::at_start: push({PatternOp::at_start}); return;
      case Kind::at_end: push({PatternOp::at_end}); return;
      case Kind::at_end_or_newline: push({PatternOp::at_end_or_newline}); return;
      case Kind::sequence:
        for (const auto& k : n.kids) emit(k);
        return;
      case Kind::alternatives: {
        std::vector<std::uint32_t> exits;
        for (std::size_t i = 0; i < n.kids.size(); ++i) {
          if (i + 1 == n.kids.size()) {
            emit(n.kids[i]);
            break;
          }
          const auto split = push({PatternOp::split});
          program_[split].x = split + 1;
          emit(n.kids[i]);
          exits.push_back(push({PatternOp::jump}));
          program_[split].y = here();
        }
        for (const auto e : exits) program_[e].x = here();
        return;
      }
      case Kind::repeat: {
        const auto& body = n.kids.front();
        std::uint32_t done = 0;
        for (; done < n.min; ++done) {
          const auto before = here();
          emit(body);
          if (here() == before) return;  // an empty body repeats to nothing
        }
        if (n.max == PatternNode::unbounded) {
          const auto loop = push({PatternOp::split});
          program_[loop].x = loop + 1;
          emit(body);
          push({PatternOp::jump, loop, 0});
          program_[loop].y = here();
          return;
        }
        std::vector<std::uint32_t> skips;
        for (; done < n.max; ++done) {
          skips.push_back(push({PatternOp::split}));
          program_[skips.back()].x = skips.back() + 1;
          const auto before = here();
          emit(body);
          if (here() == before) break;
        }
        for (const auto s : skips) program_[s].y = here();
        return;
      }
    }
  }

  std::vector<PatternInst> program_;
  std::vector<std::bitset<256>> sets_;
  std::array<std::uint8_t, 256> class_of_{};
  std::size_t classes_ = 0;
  // The cache: each state's threads; per state and byte class the next state's row (or
  // matched, dead, unbuilt) and whether the name matches when that byte is its last (-1: not known).
  static constexpr std::int32_t unbuilt = -1, matched = -2, dead = -3;
  mutable std::vector<std::vector<std::uint32_t>> states_;
  mutable std::vector<std::int32_t> next_;
  mutable std::vector<std::int8_t> last_;
  mutable std::map<std::vector<std::uint32_t>, std::int32_t> dfa_index_;
  mutable std::int32_t start_ = unbuilt;
  // Scratch of closure and advance, kept between calls.
  mutable std::vector<std::uint32_t> seen_, stack_, threads_, seeds_;
  mutable std::uint32_t mark_ = 0;
};

// An entry of compressed-tensors' `ignore` or a group's `targets`, as its match_name reads one:
// `re:` and a pattern tried at the start of the module's name, else the module's whole name (or,
// for targets, a class name such as Linear).
struct NameEntry {
  std::string text;  // as config.json writes it
  std::optional<NamePattern> pattern{};
};

// `text` read as an entry of `field`; a `re:` pattern accel cannot read is refused naming both.
inline NameEntry name_entry(std::string text, std::string_view field) {
  NameEntry e{std::move(text)};
  if (!e.text.starts_with("re:")) return e;
  std::string why;
  e.pattern = NamePattern::compile(std::string_view(e.text).substr(3), why);
  if (!e.pattern)
    throw_error<checkpoint_error>("config.json: quantization_config.", text::printable(field), " entry '", text::printable(e.text),
                                  "' is not a regular expression accel can read (", why, "); fix the pattern (compressed-tensors "
                                  "matches it with Python's re.match against module names)");
  return e;
}

// Whether two groups quantize weights alike (so either may apply to a layer for the checks).
inline bool same_weights(const QuantGroup& a, const QuantGroup& b) {
  return a.weights == b.weights && a.bits == b.bits && a.group_size == b.group_size && a.strategy == b.strategy;
}

inline void parse_fp8(const nlohmann::json& q, QuantizationConfig& c) {
  if (auto d = q.find("dequantize"); d != q.end() && d->is_boolean() && d->get<bool>())
    throw_error<checkpoint_error>("config.json: quantization_config.dequantize is true: transformers would load bfloat16 "
                                  "weights computed from the float8 ones, and accel loads stored bytes only; remove it, "
                                  "or dequantize the checkpoint offline");
  if (auto b = q.find("weight_block_size"); b != q.end() && !b->is_null()) {
    std::optional<std::int64_t> rows, cols;
    if (b->is_array() && b->size() == 2) {
      rows = json_int_in((*b)[0], 1, max_quant_group);
      cols = json_int_in((*b)[1], 1, max_quant_group);
    }
    if (!rows || !cols)
      bad_quant_config("weight_block_size", *b, concat("[rows, columns] of positive integers up to ", max_quant_group, ", or null"));
    c.block = std::array<std::int64_t, 2>{*rows, *cols};
  }
  c.not_converted = quant_names(q, "modules_to_not_convert");
  c.description = c.block ? concat("fp8 (float8 weights, ", (*c.block)[0], "×", (*c.block)[1], " blocks)")
                          : std::string("fp8 (float8 weights, one scale per tensor)");
}

inline void parse_gptq_awq(const nlohmann::json& q, QuantizationConfig& c) {
  const auto bits = quant_int(q, "bits", 2, 8, "bits", "2, 3, 4 or 8");
  if (!bits || *bits == 5 || *bits == 6 || *bits == 7)
    bad_quant_config("bits", q.contains("bits") ? q.at("bits") : nlohmann::json(), "2, 3, 4 or 8");
  c.bits = static_cast<int>(*bits);
  c.group_size = quant_group_size(q, "group_size").value_or(-1);
  if (c.method == QuantMethod::awq) {
    auto v = q.find("version");
    c.format = v != q.end() && v->is_string() ? ascii_lower(v->get<std::string>()) : std::string("gemm");
    c.description = concat("awq (", text::printable(c.format), ", ", c.bits, "-bit, ", group_text(c.group_size), ")");
  } else {
    c.description = concat("gptq (", c.bits, "-bit, ", group_text(c.group_size), ")");
  }
}

// The weight strategies compressed-tensors defines (QuantizationStrategy).
inline constexpr std::array<std::string_view, 7> ct_strategies{"tensor", "channel", "group", "block",
                                                               "token",  "tensor_group", "attn_head"};

// A group's `weights`, checked as compressed-tensors' QuantizationArgs checks them: a strategy it
// defines (in any case), or without one the strategy group_size implies; group and tensor_group
// need a positive group_size.
inline void parse_ct_weights(const nlohmann::json& w, const std::string& at, QuantGroup& g) {
  g.weights = true;
  g.bits = static_cast<int>(quant_int(w, "num_bits", 1, 32, at + ".num_bits").value_or(0));
  g.group_size = quant_group_size(w, at + ".group_size").value_or(0);
  if (auto s = w.find("strategy"); s != w.end() && !s->is_null()) {
    const auto want = concat("one of ", text::join(ct_strategies));
    if (!s->is_string()) bad_quant_config(at + ".strategy", *s, want);
    g.strategy = ascii_lower(s->get<std::string>());
    if (std::find(ct_strategies.begin(), ct_strategies.end(), g.strategy) == ct_strategies.end())
      bad_quant_config(at + ".strategy", *s, want);
  } else {
    g.strategy = g.group_size > 0 ? "group" : g.group_size == -1 ? "channel" : "tensor";
  }
  if ((g.strategy == "group" || g.strategy == "tensor_group") && g.group_size <= 0)
    bad_quant_config(at + ".group_size", w.contains("group_size") ? w.at("group_size") : nlohmann::json(),
                     concat("a positive integer (strategy '", g.strategy, "' needs one)"));
}

// A group's `targets`: a list of names, each `re:` pattern one accel can read.
inline std::vector<std::string> parse_ct_targets(const nlohmann::json& g, const std::string& at) {
  std::vector<std::string> out;
  auto t = g.find("targets");
  if (t == g.end() || t->is_null()) return out;
  if (!t->is_array()) bad_quant_config(at + ".targets", *t, "a list of module names, re: patterns or class names");
  for (std::size_t i = 0; i < t->size(); ++i) {
    if (!(*t)[i].is_string()) bad_quant_config(concat(at, ".targets[", i, "]"), (*t)[i], "a module name, re: pattern or class name");
    out.push_back(name_entry((*t)[i].get<std::string>(), at + ".targets").text);
  }
  return out;
}

inline void parse_compressed_tensors(const nlohmann::json& q, QuantizationConfig& c) {
  static constexpr std::array<std::string_view, 7> formats{"float-quantized", "pack-quantized", "int-quantized",
                                                           "naive-quantized", "nvfp4-pack-quantized", "dense",
                                                           "mixed-precision"};
  auto format_ok = [&](const nlohmann::json& f, std::string_view field) {
    if (f.is_null()) return;
    if (!f.is_string()) bad_quant_config(field, f, "a format name");
    if (std::find(formats.begin(), formats.end(), f.get<std::string>()) == formats.end())
      throw_error<checkpoint_error>("config.json: compressed-tensors format '", text::printable(f.get<std::string>()),
                                    "' is not supported (", text::join(formats), " are); accel will not plan it as if it were dense");
  };
  if (auto f = q.find("format"); f != q.end()) {
    format_ok(*f, "format");
    if (f->is_string()) c.format = f->get<std::string>();
  }
  if (auto s = q.find("sparsity_config"); s != q.end() && !s->is_null() && !(s->is_object() && s->empty()))
    throw_error<checkpoint_error>("config.json: compressed-tensors sparsity_config is set: sparse compressed-tensors "
                                  "checkpoints are not supported");
  auto groups = q.find("config_groups");
  if (groups != q.end() && !groups->is_null() && !groups->is_object())
    bad_quant_config("config_groups", *groups, "an object of quantization groups");
  if (groups != q.end() && groups->is_object())
    for (const auto& [name, g] : groups->items()) {
      const std::string at = "config_groups." + name;
      if (!g.is_object()) bad_quant_config(at, g, "an object");
      if (auto f = g.find("format"); f != g.end()) format_ok(*f, at + ".format");
      QuantGroup group;
      group.name = name;
      group.targets = parse_ct_targets(g, at);
      auto w = g.find("weights");
      if (w != g.end() && !w->is_null()) {
        if (!w->is_object()) bad_quant_config(at + ".weights", *w, "an object");
        parse_ct_weights(*w, at + ".weights", group);
      }
      c.groups.push_back(std::move(group));
    }
  // compressed-tensors maps each target to the last group in the file that lists it; the parsed
  // document keeps no file order, so a target two groups quantize differently is refused.
  std::unordered_map<std::string_view, std::size_t> owner;
  for (std::size_t g = 0; g < c.groups.size(); ++g)
    for (const auto& t : c.groups[g].targets) {
      const auto [it, fresh] = owner.emplace(t, g);
      if (!fresh && it->second != g && !same_weights(c.groups[it->second], c.groups[g]))
        throw_error<checkpoint_error>("config.json: quantization_config.config_groups.", text::printable(c.groups[it->second].name),
                                      " and config_groups.", text::printable(c.groups[g].name), " both target '", text::printable(t),
                                      "' and quantize its weights differently; compressed-tensors applies the one later in the "
                                      "file, which accel cannot tell: list the target in one group only");
    }
  const auto weight_groups = std::count_if(c.groups.begin(), c.groups.end(), [](const QuantGroup& g) { return g.weights; });
  if (weight_groups == 1) {  // what every layer holds, unless the layer's targets name another group
    const auto& g = *std::find_if(c.groups.begin(), c.groups.end(), [](const QuantGroup& x) { return x.weights; });
    c.bits = g.bits;
    c.group_size = g.group_size;
    c.strategy = g.strategy;
  }
  c.ignore = quant_names(q, "ignore");
  for (const auto& e : c.ignore) (void)name_entry(e, "ignore");
  std::string what = c.format.empty() ? std::string("compressed") : c.format;
  if (c.bits) what += concat(", ", c.bits, "-bit");
  if (c.strategy == "group" && c.group_size > 0) what += concat(", groups of ", c.group_size);
  else if (!c.strategy.empty()) what += ", per " + c.strategy;
  c.description = "compressed-tensors (" + what + ")";
}

inline void parse_bitsandbytes(const nlohmann::json& q, QuantizationConfig& c) {
  auto flag = [&](const char* key) {
    auto it = q.find(key);
    return it != q.end() && it->is_boolean() && it->get<bool>();
  };
  const bool four = flag("load_in_4bit") || flag("_load_in_4bit"), eight = flag("load_in_8bit") || flag("_load_in_8bit");
  if (four == eight)
    throw_error<checkpoint_error>("config.json: a bitsandbytes quantization_config must set exactly one of load_in_4bit "
                                  "and load_in_8bit to true (it sets ", four ? "both" : "neither", ")");
  c.method = four ? QuantMethod::bitsandbytes_4bit : QuantMethod::bitsandbytes_8bit;
  c.not_converted = quant_names(q, "llm_int8_skip_modules");
  c.budget_factor = 0.9;
  c.transformers_gpu_only = !flag("llm_int8_enable_fp32_cpu_offload");
  if (four) {
    auto t = q.find("bnb_4bit_quant_type");
    c.format = t != q.end() && t->is_string() ? t->get<std::string>() : std::string("fp4");
    c.bits = 4;
    c.description = "bitsandbytes (4-bit " + text::printable(c.format) + ")";
  } else {
    c.bits = 8;
    c.description = "bitsandbytes (8-bit LLM.int8)";
  }
}

}  // namespace detail

/// @brief Reads config.json's `quantization_config` (the whole config document is passed).
/// @return nullopt when the config has none
/// @throws accel::checkpoint_error for a method accel does not support (naming it and the ones it
///         does), and for a field of the wrong type or value
[[nodiscard]] inline std::optional<QuantizationConfig> parse_quantization_config(const nlohmann::json& config) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const auto& q = *it;
  if (!q.is_object())
    detail::throw_error<checkpoint_error>("config.json: quantization_config is ", json_excerpt(q), ", not an object; fix config.json");
  QuantizationConfig c;
  auto m = q.find("quant_method");
  if (m == q.end() || m->is_null()) {
    // bitsandbytes configs written before quant_method existed say only load_in_4bit/8bit
    if (!q.contains("load_in_4bit") && !q.contains("load_in_8bit") && !q.contains("_load_in_4bit") &&
        !q.contains("_load_in_8bit"))
      detail::throw_error<checkpoint_error>("config.json: quantization_config has no quant_method; accel cannot tell how the "
                                    "checkpoint is quantized (add quant_method)");
    c.quant_method = "bitsandbytes";
  } else {
    if (!m->is_string()) detail::bad_quant_config("quant_method", *m, "a method name");
    c.quant_method = m->get<std::string>();
  }
  const std::string method = detail::ascii_lower(c.quant_method);
  if (method == "fp8") {
    c.method = QuantMethod::fp8;
    detail::parse_fp8(q, c);
  } else if (method == "compressed-tensors" || method == "compressed_tensors") {
    c.method = QuantMethod::compressed_tensors;
    detail::parse_compressed_tensors(q, c);
  } else if (method == "gptq" || method == "awq") {
    c.method = method == "gptq" ? QuantMethod::gptq : QuantMethod::awq;
    detail::parse_gptq_awq(q, c);
  } else if (method == "mxfp4") {
    c.method = QuantMethod::mxfp4;
    c.not_converted = detail::quant_names(q, "modules_to_not_convert");
    c.keep_in_fp32 = {"experts.gate_up_proj_bias", "experts.down_proj_bias"};
    c.bits = 4;
    c.description = "mxfp4 (4-bit float blocks of 32, 8-bit shared scales)";
  } else if (method == "bitsandbytes") {
    detail::parse_bitsandbytes(q, c);
  } else {
    const bool known = std::find(unsupported_quant_methods.begin(), unsupported_quant_methods.end(), method) !=
                       unsupported_quant_methods.end();
    detail::throw_error<checkpoint_error>(
        "config.json: quantization method '", text::printable(c.quant_method), "' is ",
        known ? "one transformers knows but accel does not support" : "unknown", "; accel plans and loads fp8, "
        "compressed-tensors, gptq, awq, mxfp4 and pre-quantized bitsandbytes checkpoints (it will not plan a quantized "
        "checkpoint as if it were dense)");
  }
  return c;
}

/// @brief Whether `module` is one of the config's unquantized modules, as transformers'
///        should_convert_module matches them: the pattern from the start of the name up to a module
///        boundary (`*` any run, `.` any character: its regular expressions in practice), or as a suffix.
[[nodiscard]] inline bool quant_module_listed(std::string_view pattern, std::string_view module) {
  if (pattern.empty()) return false;
  if (module.ends_with(pattern)) return true;
  // From the start; the match must end at a module boundary.
  return detail::glob_prefix_matches(pattern, module, [&](std::size_t at) {
    return at == module.size() || module[at] == '.' || (at > 0 && module[at - 1] == '.');
  });
}

/// @brief Which checkpoint tensors a quantization stores quantized, and what that saves.
struct QuantizedTensors {
  QuantizationConfig config;
  /// Per checkpoint tensor (Checkpoint::tensor_names order): true for a quantized weight or one of
  /// its companions (scales, zero points, packing metadata), loaded byte-exact at its stored dtype.
  std::vector<bool> stored;
  /// Per checkpoint tensor: a stored tensor that is not itself a weight (a scale, zero point,
  /// quant state): transformers' model holds it inside its weight's module, or inside the weight.
  std::vector<bool> companion;
  /// Stored tensors transformers' model holds in another form than the file (compressed-tensors
  /// unpacks asymmetric zero points to int8): {tensor index, dtype, shape} it is sized at.
  std::vector<std::tuple<std::size_t, DType, std::vector<std::int64_t>>> sized_as{};
  /// fp8: {scale, weight} for each module weight (`m.weight`) and its `m.weight_scale_inv`, by
  /// tensor index; a fused weight's scale takes the fused name (quantized_model_names).
  std::vector<std::pair<std::size_t, std::size_t>> weight_scales{};
  std::size_t modules = 0;            ///< quantized weights (a module's weight, or one expert group)
  std::uint64_t stored_bytes = 0;     ///< bytes of the tensors marked stored
  std::uint64_t weight_elements = 0;  ///< elements those weights have once dequantized

  /// @brief Bytes the quantized weights would take at `bits` per element instead.
  [[nodiscard]] std::uint64_t dequantized_bytes(unsigned bits) const { return weight_elements * bits / 8; }
  /// @brief ... if loaded in `dtype` instead.
  [[nodiscard]] std::uint64_t dequantized_bytes(DType dtype) const { return dequantized_bytes(bit_size(dtype)); }
  /// @brief Bytes the quantization saves against those weights at `bits` per element (0 if none).
  [[nodiscard]] std::uint64_t bytes_saved(unsigned bits) const {
    const auto d = dequantized_bytes(bits);
    return d > stored_bytes ? d - stored_bytes : 0;
  }
  /// @brief ... against loading them in `dtype`.
  [[nodiscard]] std::uint64_t bytes_saved(DType dtype) const { return bytes_saved(bit_size(dtype)); }
  /// @brief The names of the tensors marked stored (for LoadOptions::stored_dtype_tensors).
  [[nodiscard]] std::vector<std::string> stored_names(const std::vector<std::string_view>& tensor_names) const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < stored.size() && i < tensor_names.size(); ++i)
      if (stored[i]) out.emplace_back(tensor_names[i]);
    return out;
  }
};

namespace detail {

// One tensor of a module, by its name below the module (`weight`, `qzeros`, `weight.absmax`).
struct QuantLocal {
  std::string_view local;
  const TensorEntry* entry;
  std::size_t index;  // in the checkpoint's tensor order
};

// The module a tensor belongs to for quantization: bitsandbytes' quant state hangs below the
// weight (`m.weight.absmax`, `m.weight.quant_state.bitsandbytes__nf4`) and belongs to `m`.
inline std::pair<std::string_view, std::string_view> quant_owner(std::string_view name) {
  if (auto w = name.find(".weight."); w != std::string_view::npos) return {name.substr(0, w), name.substr(w + 1)};
  const auto dot = name.rfind('.');
  if (dot == std::string_view::npos) return {std::string_view{}, name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

inline bool is_float8(DType d) {
  return d == DType::F8_E4M3 || d == DType::F8_E5M2 || d == DType::F8_E4M3FNUZ || d == DType::F8_E5M2FNUZ;
}

// A tensor named as a scale (`weight_scale_inv`, `weight_scale`, `input_scale`, `k_scale`): never a
// weight, whatever its dtype.
inline bool is_scale_name(std::string_view local) { return local.ends_with("_scale_inv") || local.ends_with("_scale"); }

// compressed-tensors' `ignore` and its groups' `targets`, read once for a checkpoint's layers and
// matched as compressed-tensors matches them against module names.
class CompressedTensorsNames {
 public:
  // Automaton steps all the layers' matches may take together (about a second uncached; 20 times
  // what 5 patterns take on the 45k layers of a DeepSeek-V3): patterns written to be slow on the
  // checkpoint's names are refused rather than stalling the plan.
  static constexpr std::uint64_t max_steps = std::uint64_t{1} << 28;

  explicit CompressedTensorsNames(const QuantizationConfig& c) : c_(c) {
    for (const auto& e : c.ignore) {
      if (e.starts_with("re:")) ignore_patterns_.push_back(name_entry(e, "ignore"));
      else ignore_names_.push_back(e);
    }
    std::sort(ignore_names_.begin(), ignore_names_.end());
    std::unordered_map<std::string_view, std::size_t> seen;  // each target once (apply_quantization_config's dict)
    for (std::size_t g = 0; g < c.groups.size(); ++g)
      for (const auto& t : c.groups[g].targets)
        if (seen.emplace(t, g).second) targets_.emplace_back(name_entry(t, concat("config_groups.", c.groups[g].name, ".targets")), g);
    // match_targets' order: entries without "re:" first, then patterns, each part alphabetically.
    std::sort(targets_.begin(), targets_.end(), [](const auto& a, const auto& b) {
      return std::pair(a.first.text.find("re:") != std::string::npos, std::string_view(a.first.text)) <
             std::pair(b.first.text.find("re:") != std::string::npos, std::string_view(b.first.text));
    });
  }

  // The entry of `ignore` that names `layer`, if any.
  std::optional<std::string_view> ignored(std::string_view layer) const {
    if (std::binary_search(ignore_names_.begin(), ignore_names_.end(), layer, std::less<>{})) return layer;
    for (const auto& e : ignore_patterns_)
      if (matches(e, layer)) return std::string_view(e.text);
    return std::nullopt;
  }

  // The group whose scheme compressed-tensors gives `layer` (match_targets, then the first target's
  // group): a target naming the layer, else a pattern matching it, else a class name. Names cannot
  // tell a layer's class; a quantized layer is a Linear, and a class target that might come before
  // Linear decides only when it quantizes weights alike. nullptr: the names do not decide.
  const QuantGroup* group_of(std::string_view layer) const {
    for (const auto& [e, g] : targets_)
      if (matches(e, layer)) return &c_.groups[g];
    const QuantGroup* first = nullptr;
    for (const auto& [e, g] : targets_) {
      if (e.pattern || !looks_like_class(e.text)) continue;
      if (!first) first = &c_.groups[g];
      else if (!same_weights(*first, c_.groups[g])) return nullptr;
      if (e.text == "Linear") break;
    }
    return first;
  }

 private:
  // Class names are CamelCase and undotted (Linear, Embedding); module names are neither.
  static bool looks_like_class(std::string_view t) {
    return !t.empty() && t.front() >= 'A' && t.front() <= 'Z' && t.find('.') == std::string_view::npos;
  }
  bool matches(const NameEntry& e, std::string_view layer) const {
    if (!e.pattern) return e.text == layer;
    const bool hit = e.pattern->matches_start(layer, budget_);
    if (budget_.steps > max_steps)
      throw_error<checkpoint_error>("config.json: quantization_config's ignore and targets patterns take more than ", max_steps,
                                    " steps to match against the checkpoint's layers (at '", text::printable(e.text), "' and layer '",
                                    text::printable(layer), "'); write them simpler");
    return hit;
  }

  const QuantizationConfig& c_;
  std::vector<std::string> ignore_names_;
  std::vector<NameEntry> ignore_patterns_;
  std::vector<std::pair<NameEntry, std::size_t>> targets_;  // with its group's index
  mutable PatternBudget budget_;
};

// Checks and marks one module's tensors for one method; `find` looks up a local name.
class QuantModule {
 public:
  QuantModule(const QuantizationConfig& c, std::string_view module, std::span<const QuantLocal> locals, QuantizedTensors& out,
              const CompressedTensorsNames* ct = nullptr)
      : c_(c), module_(module), locals_(locals), out_(out), ct_(ct) {}

  const QuantLocal* find(std::string_view local) const {
    for (const auto& l : locals_)
      if (l.local == local) return &l;
    return nullptr;
  }
  // The tensor called `stem` + `suffix` (`weight` + `_scale_inv`), found without building the name.
  const QuantLocal* find(std::string_view stem, std::string_view suffix) const {
    for (const auto& l : locals_)
      if (l.local.size() == stem.size() + suffix.size() && l.local.starts_with(stem) && l.local.ends_with(suffix)) return &l;
    return nullptr;
  }
  // The tensor's full name, for a message (control bytes escaped).
  std::string full(std::string_view local) const {
    return text::printable(module_.empty() ? std::string(local) : concat(module_, ".", local));
  }

  void keep(const QuantLocal* l) {
    if (!l || out_.stored[l->index]) return;
    out_.stored[l->index] = true;
    out_.companion[l->index] = true;
    out_.stored_bytes += l->entry->size_bytes();
  }
  void weight(const QuantLocal& l, std::uint64_t elements) {
    keep(&l);
    out_.companion[l.index] = false;
    ++out_.modules;
    out_.weight_elements += elements;
    for (const auto& pattern : c_.not_converted)
      if (quant_module_listed(pattern, module_))
        throw_error<checkpoint_error>("tensor '", full(l.local), "' is stored quantized (", torch_name(l.entry->dtype),
                                      "), but quantization_config lists its module '", text::printable(module_), "' (pattern '",
                                      text::printable(pattern), "') among the modules left unquantized; fix config.json or the "
                                      "checkpoint");
  }
  [[noreturn]] void missing(const QuantLocal& l, std::string_view want, std::string_view what) const {
    throw_error<checkpoint_error>("tensor '", full(l.local), "' is a ", c_.description, " ", what, " but the checkpoint has no '",
                                  full(want), "'; the checkpoint is incomplete or its quantization_config is wrong");
  }
  [[noreturn]] void orphan(const QuantLocal& l, std::string_view want) const {
    throw_error<checkpoint_error>("tensor '", full(l.local), "' is a ", c_.description, " companion but '", full(want),
                                  "' is not a quantized weight of the checkpoint; the checkpoint is incomplete or its "
                                  "quantization_config is wrong");
  }
  [[noreturn]] void bad_shape(const QuantLocal& l, const std::vector<std::int64_t>& want, std::string_view why) const {
    throw_error<checkpoint_error>("tensor '", full(l.local), "' has shape ", shape_text(l.entry->shape), " but ", why,
                                  " gives ", shape_text(want), " (", c_.description,
                                  group_ ? concat(", config_groups.", text::printable(group_->name)) : std::string(),
                                  "); the checkpoint does not match its quantization_config");
  }
  [[noreturn]] void bad_dtype(const QuantLocal& l, std::string_view want) const {
    throw_error<checkpoint_error>("tensor '", full(l.local), "' is ", torch_name(l.entry->dtype), " but ", c_.description,
                                  " stores it as ", want, "; the checkpoint does not match its quantization_config");
  }
  // A float8 tensor named as a scale: a malformed scale, not a weight without its own scale.
  [[noreturn]] void bad_scale(const QuantLocal& l) const {
    throw_error<checkpoint_error>("scale '", full(l.local), "' is ", torch_name(l.entry->dtype), "; fp8 scales are float32 / bfloat16 "
                                  "(a tensor named as a scale is never a float8 weight); the checkpoint is malformed: write its "
                                  "scales as float32 or bfloat16");
  }
  // a × b for the shape of `l`'s companions. A header may declare any dimension up to 2^63 - 1 for
  // a tensor without elements, so the product can overflow: refused, naming the tensor.
  std::int64_t mul(const QuantLocal& l, std::int64_t a, std::int64_t b, std::string_view what) const {
    if (const auto p = checked_mul(a, b)) return *p;
    throw_error<checkpoint_error>("tensor '", full(l.local), "' has shape ", shape_text(l.entry->shape), ": ", what, " (", a, " × ",
                                  b, ") overflow 64 bits, so the shapes of its companions cannot be computed; the checkpoint's "
                                  "header is malformed (fix the tensor's shape)");
  }
  // `why` makes the message's reason only when the shape is wrong.
  template <class Why>
  void expect_shape(const QuantLocal& l, const std::vector<std::int64_t>& want, Why&& why) const {
    if (l.entry->shape != want) bad_shape(l, want, why());
  }

  void run() {
    switch (c_.method) {
      case QuantMethod::fp8: return fp8();
      case QuantMethod::compressed_tensors: return compressed_tensors();
      case QuantMethod::gptq:
      case QuantMethod::awq: return gptq_awq();
      case QuantMethod::mxfp4: return mxfp4();
      case QuantMethod::bitsandbytes_4bit: return bnb4();
      case QuantMethod::bitsandbytes_8bit: return bnb8();
    }
  }

 private:
  // fp8: every float8 tensor `x` has `x_scale_inv` (`weight` → `weight_scale_inv`): [ceil(rows/b0),
  // ceil(cols/b1)] per block (leading expert dimensions kept), one element per tensor without blocks.
  // A tensor is a scale by its name: a float8 one is a malformed scale, not a weight.
  void fp8() {
    for (const auto& l : locals_)
      if (is_float8(l.entry->dtype) && is_scale_name(l.local)) bad_scale(l);
    for (const auto& l : locals_) {
      if (!is_float8(l.entry->dtype)) continue;
      const auto* scale = find(l.local, "_scale_inv");
      if (!scale) missing(l, concat(l.local, "_scale_inv"), "weight");
      if (!is_floating(scale->entry->dtype)) bad_dtype(*scale, "float32 or bfloat16");
      const auto& s = l.entry->shape;
      if (c_.block && s.size() >= 2) {
        auto want = s;
        want[s.size() - 2] = ceil_div(s[s.size() - 2], (*c_.block)[0]);
        want[s.size() - 1] = ceil_div(s[s.size() - 1], (*c_.block)[1]);
        expect_shape(*scale, want, [&] { return concat("its weight ", shape_text(s), " in ", (*c_.block)[0], "×", (*c_.block)[1], " blocks"); });
      } else if (!c_.block && scale->entry->numel() != 1) {
        bad_shape(*scale, {}, "one scale per tensor (no weight_block_size)");
      }
      weight(l, l.entry->numel());
      keep(scale);
      if (l.local == "weight") {
        out_.weight_scales.emplace_back(scale->index, l.index);
        keep(find("activation_scale"));
        keep(find("input_scale"));
      }
    }
    for (const auto& l : locals_)
      if (l.local.ends_with("_scale_inv") && !out_.stored[l.index]) orphan(l, l.local.substr(0, l.local.size() - 10));
  }

  // compressed-tensors: a module with `weight_scale` is quantized: its `weight` (float8/int8) or
  // `weight_packed` (int4 in int32, nvfp4 in uint8) and every weight_/input_/output_ companion,
  // with the shapes the group that targets it gives (config_groups may quantize layers apart).
  void compressed_tensors() {
    const auto* scale = find("weight_scale");
    const auto* packed = find("weight_packed");
    const auto* w = packed ? packed : find("weight");
    if (!scale) {
      if (packed) missing(*packed, "weight_scale", "packed weight");
      if (w && (is_float8(w->entry->dtype) || w->entry->dtype == DType::I8)) missing(*w, "weight_scale", "quantized weight");
      return;
    }
    if (!w) orphan(*scale, "weight_packed");
    if (const auto entry = ct_ ? ct_->ignored(module_) : std::nullopt)
      throw_error<checkpoint_error>("config.json: quantization_config.ignore entry '", text::printable(*entry), "' matches layer '",
                                    text::printable(module_), "', but '", full(w->local), "' is stored quantized (",
                                    torch_name(w->entry->dtype), ", with its weight_scale): transformers would leave the layer "
                                    "unquantized and could not load its quantized tensors; remove the entry from ignore, or fix "
                                    "the checkpoint");
    // The group compressed-tensors gives this layer; where names cannot tell, the config's only
    // weights group (c_'s bits, group_size and strategy; unset with several).
    const QuantGroup* group = ct_ ? ct_->group_of(module_) : nullptr;
    const int bits = group ? (group->weights ? group->bits : 0) : c_.bits;
    const std::int64_t group_size = group ? group->group_size : c_.group_size;
    const std::string_view strategy = group ? (group->weights ? group->strategy : std::string_view()) : c_.strategy;
    if (c_.groups.size() > 1) group_ = group;
    const auto& s = w->entry->shape;
    if (s.size() != 2) bad_shape(*w, {}, "a quantized linear weight is two-dimensional; its shape");
    std::int64_t cols = s[1];
    if (packed) {
      if (packed->entry->dtype == DType::U8) cols = mul(*packed, s[1], 2, "the 4-bit values it packs");  // nvfp4: two per byte
      else if (packed->entry->dtype == DType::I32 && bits > 0) cols = mul(*packed, s[1], 32, "the bits it packs") / bits;
      else if (packed->entry->dtype != DType::I32) bad_dtype(*packed, "int32 (or uint8 for nvfp4)");
      else cols = mul(*packed, s[1], 8, "the 4-bit values it packs");  // bits unknown: count as int4, the common packing
    }
    if (strategy == "group" && group_size > 0) {
      expect_shape(*scale, {s[0], ceil_div(cols, group_size)}, [&] { return concat(cols, " input columns in groups of ", group_size); });
      if (const auto* zp = find("weight_zero_point"); zp && bits > 0 && packed) {
        expect_shape(*zp, {ceil_div(mul(*w, s[0], bits, "the bits of its rows' zero points"), 32), ceil_div(cols, group_size)},
                     [&] { return concat(s[0], " packed rows of ", bits, "-bit zero points in groups of ", group_size); });
        // transformers' compressed-tensors modules unpack them: one int8 per row and group.
        out_.sized_as.emplace_back(zp->index, DType::I8, std::vector<std::int64_t>{s[0], ceil_div(cols, group_size)});
      }
    } else if (strategy == "channel") {
      expect_shape(*scale, {s[0], 1}, [&] { return concat("one scale per output channel of ", s[0]); });
    } else if (strategy == "tensor" && scale->entry->numel() != 1) {
      bad_shape(*scale, {1}, "one scale per tensor");
    }
    weight(*w, static_cast<std::uint64_t>(mul(*w, s[0], cols, "its elements")));
    for (const auto& l : locals_)
      if (l.local.starts_with("weight_") || l.local.starts_with("input_") || l.local.starts_with("output_")) keep(&l);
  }

  // gptq/awq: `qweight` int32 with `scales` and `qzeros` (gptq also `g_idx`; the module's `bias`
  // is float16 as stored). gptq packs rows: qweight [in·bits/32, out]; awq (gemm) packs columns:
  // qweight [in, out·bits/32]; scales [groups, out]; qzeros [groups, out·bits/32].
  void gptq_awq() {
    const auto* q = find("qweight");
    if (!q) {
      for (const auto& l : locals_)
        if (l.local == "qzeros" || l.local == "g_idx") orphan(l, "qweight");
      return;
    }
    if (q->entry->dtype != DType::I32) bad_dtype(*q, "int32");
    const auto* scales = find("scales");
    const auto* zeros = find("qzeros");
    if (!scales) missing(*q, "scales", "packed weight");
    if (!zeros) missing(*q, "qzeros", "packed weight");
    const auto& s = q->entry->shape;
    if (s.size() != 2) bad_shape(*q, {}, "a packed weight is two-dimensional; its shape");
    const bool gptq = c_.method == QuantMethod::gptq, gemm = !gptq && (c_.format == "gemm" || c_.format.empty());
    if (gptq || gemm) {
      const std::int64_t in = gptq ? mul(*q, s[0], 32, "the bits it packs") / c_.bits : s[0];
      const std::int64_t out = gptq ? s[1] : mul(*q, s[1], 32, "the bits it packs") / c_.bits;
      const std::int64_t groups = c_.group_size > 0 ? ceil_div(in, c_.group_size) : 1;
      const auto why = [&] { return concat(in, " inputs × ", out, " outputs at ", c_.bits, " bits, ", group_text(c_.group_size)); };
      expect_shape(*scales, {groups, out}, why);
      expect_shape(*zeros, {groups, ceil_div(mul(*q, out, c_.bits, "the bits of its zero points"), 32)}, why);
      if (const auto* g = find("g_idx")) expect_shape(*g, {in}, why);
    }
    const auto elements = mul(*q, static_cast<std::int64_t>(q->entry->numel()), 32, "the bits it packs");
    weight(*q, static_cast<std::uint64_t>(elements) / static_cast<std::uint64_t>(c_.bits));
    for (const auto& l : locals_) keep(&l);  // scales, qzeros, g_idx, bias: all as the kernels store them
  }

  // mxfp4: `x_blocks` uint8 [..., n/32, 16] with `x_scales` uint8 [..., n/32].
  void mxfp4() {
    for (const auto& l : locals_) {
      if (!l.local.ends_with("_blocks")) continue;
      const auto stem = l.local.substr(0, l.local.size() - 7);
      const auto* scales = find(stem, "_scales");
      if (!scales) missing(l, concat(stem, "_scales"), "block tensor");
      if (l.entry->dtype != DType::U8) bad_dtype(l, "uint8");
      if (scales->entry->dtype != DType::U8) bad_dtype(*scales, "uint8 (e8m0 exponents)");
      const auto& s = l.entry->shape;
      if (s.size() < 2 || s.back() != 16) bad_shape(l, {}, "mxfp4 packs 32 values in 16 bytes; a last dimension of 16");
      expect_shape(*scales, std::vector<std::int64_t>(s.begin(), s.end() - 1), [&] { return concat("one scale per block of ", shape_text(s)); });
      weight(l, l.entry->numel() * 2);
      keep(scales);
    }
    for (const auto& l : locals_)
      if (l.local.ends_with("_scales") && !out_.stored[l.index]) orphan(l, concat(l.local.substr(0, l.local.size() - 7), "_blocks"));
  }

  // bitsandbytes 4-bit: `weight` uint8 [n, 1] (two values per byte) with `weight.absmax`,
  // `weight.quant_map` and `weight.quant_state.bitsandbytes__<type>` (double quantization adds
  // `weight.nested_absmax` and `weight.nested_quant_map`).
  void bnb4() {
    const QuantLocal* state = nullptr;
    for (const auto& l : locals_)
      if (l.local.starts_with("weight.quant_state.")) state = &l;
    const auto* w = find("weight");
    const auto* absmax = find("weight.absmax");
    if (!w || !(state || absmax)) {
      if (state || absmax) orphan(state ? *state : *absmax, "weight");
      return;
    }
    if (w->entry->dtype != DType::U8) bad_dtype(*w, "uint8 (two 4-bit values per byte)");
    if (!absmax) missing(*w, "weight.absmax", "4-bit weight");
    if (!find("weight.quant_map")) missing(*w, "weight.quant_map", "4-bit weight");
    if (!state) missing(*w, concat("weight.quant_state.bitsandbytes__", c_.format), "4-bit weight");
    weight(*w, w->entry->numel() * 2);
    for (const auto& l : locals_)
      if (l.local.starts_with("weight.")) keep(&l);
  }

  // bitsandbytes 8-bit: `weight` int8 [out, in] with `SCB` [out] (and `weight_format`).
  void bnb8() {
    const auto* w = find("weight");
    const auto* scb = find("SCB");
    if (!w || w->entry->dtype != DType::I8) {
      if (scb) orphan(*scb, "weight");
      return;
    }
    if (!scb) missing(*w, "SCB", "int8 weight");
    if (!w->entry->shape.empty())
      expect_shape(*scb, {w->entry->shape[0]}, [&] { return concat("one scale per row of ", shape_text(w->entry->shape)); });
    weight(*w, w->entry->numel());
    keep(scb);
    keep(find("weight_format"));
  }

  const QuantizationConfig& c_;
  std::string_view module_;
  std::span<const QuantLocal> locals_;
  QuantizedTensors& out_;
  const CompressedTensorsNames* ct_;  // compressed-tensors' ignore and targets (nullptr for other methods)
  const QuantGroup* group_ = nullptr;  // the group checked, for messages, when config_groups has several
};

}  // namespace detail

/// @brief Classifies the tensors of a checkpoint under its quantization (a pure function).
/// @param tensors every tensor, in the checkpoint's order (Checkpoint::tensor_names)
/// @throws accel::checkpoint_error naming the tensor when the tensors contradict the config
[[nodiscard]] inline QuantizedTensors classify_quantized_tensors(const QuantizationConfig& config,
                                                                 const std::vector<const TensorEntry*>& tensors) {
  QuantizedTensors out;
  out.config = config;
  out.stored.assign(tensors.size(), false);
  out.companion.assign(tensors.size(), false);
  // Tensors grouped by module in one array (a counting sort over module ids), not a vector each.
  detail::NameIndex module_ids;
  module_ids.reserve(tensors.size() / 2 + 1);
  std::vector<std::string_view> modules, locals(tensors.size());
  std::vector<std::uint32_t> module_of(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto [owner, local] = detail::quant_owner(tensors[i]->name);
    const std::string_view module = owner;  // a plain variable: lambdas cannot capture a binding in C++20
    const auto id = static_cast<std::uint32_t>(modules.size());
    const auto name_of = [&](std::uint32_t m) { return m == id ? module : modules[m]; };
    const auto known = module_ids.insert(detail::name_hash(module), id, name_of);
    if (!known) modules.push_back(module);
    module_of[i] = known.value_or(id);
    locals[i] = local;
  }
  std::vector<std::size_t> begin(modules.size() + 1, 0);
  for (auto m : module_of) ++begin[m + 1];
  for (std::size_t m = 0; m < modules.size(); ++m) begin[m + 1] += begin[m];
  std::vector<detail::QuantLocal> grouped(tensors.size());
  std::optional<detail::CompressedTensorsNames> ct;
  if (config.method == QuantMethod::compressed_tensors) ct.emplace(config);
  auto next = begin;
  for (std::size_t i = 0; i < tensors.size(); ++i) grouped[next[module_of[i]]++] = {locals[i], tensors[i], i};
  for (std::size_t m = 0; m < modules.size(); ++m)
    detail::QuantModule(config, modules[m], std::span<const detail::QuantLocal>(grouped).subspan(begin[m], begin[m + 1] - begin[m]), out,
                        ct ? &*ct : nullptr)
        .run();
  if (out.modules == 0 && !tensors.empty())
    detail::throw_error<checkpoint_error>("config.json's quantization_config says ", config.description, " but no tensor of the "
                                          "checkpoint is stored that way (", text::printable(tensors.front()->name), " is ",
                                          torch_name(tensors.front()->dtype), "); remove quantization_config from a "
                                          "dequantized checkpoint, or fix the files");
  return out;
}

/// @brief The quantization of a resolved checkpoint, from a config.json document already read.
/// @return nullopt for a checkpoint without `quantization_config`
/// @throws accel::checkpoint_error as parse_quantization_config and classify_quantized_tensors
[[nodiscard]] inline std::optional<QuantizedTensors> checkpoint_quantization(const Checkpoint& checkpoint,
                                                                           const nlohmann::json& config) {
  auto parsed = parse_quantization_config(config);
  if (!parsed) return std::nullopt;
  std::vector<const TensorEntry*> tensors;
  tensors.reserve(checkpoint.tensor_names.size());
  checkpoint.for_each_entry([&](std::size_t, const TensorEntry& e) { tensors.push_back(&e); });
  return classify_quantized_tensors(*parsed, tensors);
}

/// @brief One line for reports: the method, how many weights stay quantized and their bytes, and
///        what the quantization saves against loading them in `dtype` (when given and floating).
/// @code
/// fp8 (float8 weights, 128×128 blocks): 14 weights as stored, 896.44 KiB; 1.75 MiB as bfloat16 (saves 896 KiB)
/// @endcode
[[nodiscard]] inline std::string quantization_summary(const QuantizedTensors& q, std::optional<DType> dtype) {
  std::string out = detail::concat(q.config.description, ": ", text::plural(static_cast<long long>(q.modules), "weight"),
                                   " as stored, ", text::format_bytes(q.stored_bytes));
  if (dtype && is_floating(*dtype) && bit_size(*dtype) >= 16)
    out += detail::concat("; ", text::format_bytes(q.dequantized_bytes(*dtype)), " as ", torch_name(*dtype), " (saves ",
                          text::format_bytes(q.bytes_saved(*dtype)), ")");
  return out;
}

/// @brief Gives quantized companions the model name transformers gives them (names.hpp): the
///        bitsandbytes quant state of a weight (`m.weight.absmax`) is part of that weight
///        (`m.weight`), mxfp4's `x_blocks` and `x_scales` are the model's `x`, and the scale of a float8 weight fused with others
///        (`experts.3.gate_proj.weight_scale_inv`) is the fused tensor's (`experts.gate_up_proj_scale_inv`).
inline void quantized_model_names(NameTable& names, const QuantizedTensors& q) {
  const auto n = std::min(names.model.size(), q.stored.size());
  if (q.config.method == QuantMethod::bitsandbytes_4bit) {
    for (std::size_t i = 0; i < n; ++i)
      if (auto w = names.model[i].find(".weight."); q.stored[i] && w != std::string::npos) names.model[i] = names.model[i].substr(0, w + 7);
    return;
  }
  if (q.config.method == QuantMethod::mxfp4) {  // `x_blocks` is the model's `x`, which holds `x_scales` too
    for (std::size_t i = 0; i < n; ++i)
      if (q.stored[i] && (names.model[i].ends_with("_blocks") || names.model[i].ends_with("_scales")))
        names.model[i].remove_suffix(7);
    return;
  }
  if (q.config.method != QuantMethod::fp8 || names.identity()) return;
  NameArena made;
  std::string scratch;
  detail::RecentViews<std::string_view> recent;  // fused weight -> its scale's name, for the experts in a row
  for (const auto& [scale, weight] : q.weight_scales) {
    if (scale >= n || weight >= n || names.model[weight].ends_with(".weight")) continue;
    if (const auto* known = recent.find(names.model[weight])) {
      names.model[scale] = *known;
      continue;
    }
    scratch.assign(names.model[weight]).append("_scale_inv");  // a fused weight's scale
    names.model[scale] = made.keep(scratch);
    recent.put(names.model[weight], names.model[scale]);
  }
  names.storage.push_back(made.storage());
}

/// @brief What loading a checkpoint needs of its config.json besides the map.
struct CheckpointNaming {
  NameTable names;                                 ///< the model name of every checkpoint tensor
  std::optional<QuantizedTensors> quantization{};  ///< unset: a dense checkpoint
  const ClassNames* class_names = nullptr;         ///< whose rules renamed them (nullptr: none)
};

/// @brief The names and the quantization of a checkpoint under a config already read: the rules of
///        the class it names (none, or a class transformers lacks: unchanged; `model_names` false:
///        the checkpoint's names are kept), quantized companions named as transformers names them.
/// @param config nullptr: no config.json, so neither renames nor a quantization
/// @throws accel::checkpoint_error for a quantization the tensors contradict
[[nodiscard]] inline CheckpointNaming checkpoint_naming(const Checkpoint& checkpoint, const ModelConfig* config,
                                                       bool model_names = true) {
  CheckpointNaming out;
  if (config && model_names && !config->architectures.empty()) out.class_names = find_class_names(config->architectures.front());
  // The names and the quantization do not depend on each other: for a large checkpoint they are
  // worked out on two threads, the names in pieces (each deciding its name shapes on its own) so
  // that the thread done with the quantization takes its share of them. A quantization error is
  // thrown once every piece is done or skipped.
  const auto& names = checkpoint.tensor_names;
  const bool threads = config && out.class_names && names.size() >= 10'000;
  const std::size_t pieces = threads ? 8 : 1;
  std::vector<NameArena> made(pieces);
  std::optional<NameMapper> mapper;
  if (out.class_names) mapper.emplace(*out.class_names);
  const auto piece = [&](auto& v, std::size_t i) { return std::span(v).subspan(names.size() * i / pieces, names.size() * (i + 1) / pieces - names.size() * i / pieces); };
  if (mapper) out.names.model.resize(names.size());
  parallel_for(
      pieces + 1, threads ? 2 : 1,
      [&](std::size_t task, unsigned) -> std::uint64_t {
        if (task == 0) {
          if (config) out.quantization = checkpoint_quantization(checkpoint, config->json);
        } else if (mapper) {
          mapper->map_all(piece(names, task - 1), made[task - 1], piece(out.names.model, task - 1));
        }
        return 0;
      },
      [](std::uint64_t) {});
  out.names.checkpoint = names;
  out.names.storage = checkpoint.name_storage();
  if (mapper) {
    for (const auto& m : made) out.names.storage.push_back(m.storage());
    out.names.source = name_table_source(*out.class_names);
  } else {
    out.names.model = names;
  }
  if (out.quantization) quantized_model_names(out.names, *out.quantization);
  return out;
}

/// @brief As above, reading config.json (`config_file`, else the one next to the checkpoint).
/// @throws accel::checkpoint_error for an unreadable config.json or a quantization it contradicts
[[nodiscard]] inline CheckpointNaming checkpoint_naming(const Checkpoint& checkpoint,
                                                       const std::optional<std::filesystem::path>& config_file = {}) {
  const auto path = config_file ? config_file : checkpoint.config_file;
  const std::optional<ModelConfig> config = path ? std::optional<ModelConfig>(read_model_config(*path)) : std::nullopt;
  return checkpoint_naming(checkpoint, config ? &*config : nullptr);
}

ACCEL_NAMESPACE_END
