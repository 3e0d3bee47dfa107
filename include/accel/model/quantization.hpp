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
#include <cctype>
#include <cstdint>
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

/// @brief A checkpoint's `quantization_config`, as far as sizes, loading and checks need it.
struct QuantizationConfig {
  QuantMethod method = QuantMethod::fp8;
  std::string quant_method;   ///< as config.json writes it (`fp8`, `compressed-tensors`, ...)
  std::string description;    ///< for reports: `fp8 (float8 weights, 128×128 blocks)`
  int bits = 0;               ///< weight bits (gptq, awq, compressed-tensors with one weights group)
  std::int64_t group_size = 0;  ///< gptq/awq/compressed-tensors groups along the input; -1: one group; 0: none
  std::optional<std::array<std::int64_t, 2>> block{};  ///< fp8: weight_block_size; unset: one scale per tensor
  std::string format;         ///< compressed-tensors format, awq version
  std::string strategy;       ///< compressed-tensors weights strategy (group, channel, tensor, block)
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

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

inline std::string ascii_lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

[[noreturn]] inline void bad_quant_config(std::string_view field, const nlohmann::json& v, std::string_view want) {
  throw_error<checkpoint_error>("config.json: quantization_config.", field, " is ", json_excerpt(v), ", not ", want,
                                "; fix config.json (it must describe the tensors as stored)");
}

inline std::optional<std::int64_t> quant_int(const nlohmann::json& q, const char* key, std::int64_t lo, std::int64_t hi) {
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() || it->get<std::int64_t>() < lo || it->get<std::int64_t>() > hi)
    bad_quant_config(key, *it, concat("an integer from ", lo, " to ", hi));
  return it->get<std::int64_t>();
}

inline std::vector<std::string> quant_names(const nlohmann::json& q, const char* key) {
  std::vector<std::string> out;
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return out;
  if (!it->is_array()) bad_quant_config(key, *it, "a list of module names");
  for (const auto& v : *it) {
    if (!v.is_string()) bad_quant_config(key, v, "a module name");
    out.push_back(v.get<std::string>());
  }
  return out;
}

inline std::string group_text(std::int64_t group) {
  return group > 0 ? concat("groups of ", group) : std::string("one group per column");
}

inline void parse_fp8(const nlohmann::json& q, QuantizationConfig& c) {
  if (auto d = q.find("dequantize"); d != q.end() && d->is_boolean() && d->get<bool>())
    throw_error<checkpoint_error>("config.json: quantization_config.dequantize is true: transformers would load bfloat16 "
                                  "weights computed from the float8 ones, and accel loads stored bytes only; remove it, "
                                  "or dequantize the checkpoint offline");
  if (auto b = q.find("weight_block_size"); b != q.end() && !b->is_null()) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer() ||
        (*b)[0].get<std::int64_t>() < 1 || (*b)[1].get<std::int64_t>() < 1)
      bad_quant_config("weight_block_size", *b, "[rows, columns] of positive integers, or null");
    c.block = std::array<std::int64_t, 2>{(*b)[0].get<std::int64_t>(), (*b)[1].get<std::int64_t>()};
  }
  c.not_converted = quant_names(q, "modules_to_not_convert");
  c.description = c.block ? concat("fp8 (float8 weights, ", (*c.block)[0], "×", (*c.block)[1], " blocks)")
                          : std::string("fp8 (float8 weights, one scale per tensor)");
}

inline void parse_gptq_awq(const nlohmann::json& q, QuantizationConfig& c) {
  const auto bits = quant_int(q, "bits", 2, 8);
  if (!bits || (*bits != 2 && *bits != 3 && *bits != 4 && *bits != 8))
    bad_quant_config("bits", q.contains("bits") ? q["bits"] : nlohmann::json(), "2, 3, 4 or 8");
  c.bits = static_cast<int>(*bits);
  c.group_size = quant_int(q, "group_size", -1, std::int64_t{1} << 40).value_or(-1);
  if (c.group_size == 0) bad_quant_config("group_size", q.at("group_size"), "-1 or a positive integer");
  if (c.method == QuantMethod::awq) {
    auto v = q.find("version");
    c.format = v != q.end() && v->is_string() ? ascii_lower(v->get<std::string>()) : std::string("gemm");
    c.description = concat("awq (", c.format, ", ", c.bits, "-bit, ", group_text(c.group_size), ")");
  } else {
    c.description = concat("gptq (", c.bits, "-bit, ", group_text(c.group_size), ")");
  }
}

inline void parse_compressed_tensors(const nlohmann::json& q, QuantizationConfig& c) {
  static constexpr std::array<std::string_view, 7> formats{"float-quantized", "pack-quantized", "int-quantized",
                                                           "naive-quantized", "nvfp4-pack-quantized", "dense",
                                                           "mixed-precision"};
  auto format_ok = [&](const nlohmann::json& f, std::string_view field) {
    if (f.is_null()) return;
    if (!f.is_string()) bad_quant_config(field, f, "a format name");
    if (std::find(formats.begin(), formats.end(), f.get<std::string>()) == formats.end())
      throw_error<checkpoint_error>("config.json: compressed-tensors format '", f.get<std::string>(), "' is not supported (",
                                    text::join(formats), " are); accel will not plan it as if it were dense");
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
  std::size_t weight_groups = 0;
  if (groups != q.end() && groups->is_object())
    for (const auto& [name, g] : groups->items()) {
      if (!g.is_object()) bad_quant_config("config_groups." + name, g, "an object");
      if (auto f = g.find("format"); f != g.end()) format_ok(*f, "config_groups." + name + ".format");
      auto w = g.find("weights");
      if (w == g.end() || w->is_null()) continue;
      if (!w->is_object()) bad_quant_config("config_groups." + name + ".weights", *w, "an object");
      ++weight_groups;
      const auto bits = quant_int(*w, "num_bits", 1, 32);
      const auto group = quant_int(*w, "group_size", -1, std::int64_t{1} << 40);
      auto s = w->find("strategy");
      c.bits = static_cast<int>(bits.value_or(0));
      c.group_size = group.value_or(0);
      c.strategy = s != w->end() && s->is_string() ? s->get<std::string>() : std::string();
    }
  if (weight_groups != 1) {  // shapes are checked only when one group says what every module holds
    c.bits = 0;
    c.group_size = 0;
    c.strategy.clear();
  }
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
    c.description = "bitsandbytes (4-bit " + c.format + ")";
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
        "config.json: quantization method '", text::excerpt(c.quant_method), "' is ",
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

// Checks and marks one module's tensors for one method; `find` looks up a local name.
class QuantModule {
 public:
  QuantModule(const QuantizationConfig& c, std::string_view module, std::span<const QuantLocal> locals, QuantizedTensors& out)
      : c_(c), module_(module), locals_(locals), out_(out) {}

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
  std::string full(std::string_view local) const { return module_.empty() ? std::string(local) : concat(module_, ".", local); }

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
                                      "), but quantization_config lists its module '", module_, "' (pattern '", pattern,
                                      "') among the modules left unquantized; fix config.json or the checkpoint");
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
                                  " gives ", shape_text(want), " (", c_.description, "); the checkpoint does not match its "
                                  "quantization_config");
  }
  [[noreturn]] void bad_dtype(const QuantLocal& l, std::string_view want) const {
    throw_error<checkpoint_error>("tensor '", full(l.local), "' is ", torch_name(l.entry->dtype), " but ", c_.description,
                                  " stores it as ", want, "; the checkpoint does not match its quantization_config");
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
  void fp8() {
    for (const auto& l : locals_) {
      if (!is_float8(l.entry->dtype)) continue;
      const auto* scale = find(l.local, "_scale_inv");
      if (!scale) missing(l, concat(l.local, "_scale_inv"), "weight");
      if (!is_floating(scale->entry->dtype) || is_float8(scale->entry->dtype)) bad_dtype(*scale, "float32 or bfloat16");
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
  // `weight_packed` (int4 in int32, nvfp4 in uint8) and every weight_/input_/output_ companion.
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
    const auto& s = w->entry->shape;
    if (s.size() != 2) bad_shape(*w, {}, "a quantized linear weight is two-dimensional; its shape");
    std::int64_t cols = s[1];
    if (packed) {
      if (packed->entry->dtype == DType::U8) cols *= 2;  // nvfp4: two 4-bit values per byte
      else if (packed->entry->dtype == DType::I32 && c_.bits > 0) cols = cols * 32 / c_.bits;
      else if (packed->entry->dtype != DType::I32) bad_dtype(*packed, "int32 (or uint8 for nvfp4)");
      else cols *= 8;  // several weight groups: count as int4, the common packing
    }
    if (c_.strategy == "group" && c_.group_size > 0) {
      expect_shape(*scale, {s[0], ceil_div(cols, c_.group_size)}, [&] { return concat(cols, " input columns in groups of ", c_.group_size); });
      if (const auto* zp = find("weight_zero_point"); zp && c_.bits > 0 && packed) {
        expect_shape(*zp, {ceil_div(s[0] * c_.bits, 32), ceil_div(cols, c_.group_size)},
                     [&] { return concat(s[0], " packed rows of ", c_.bits, "-bit zero points in groups of ", c_.group_size); });
        // transformers' compressed-tensors modules unpack them: one int8 per row and group.
        out_.sized_as.emplace_back(zp->index, DType::I8, std::vector<std::int64_t>{s[0], ceil_div(cols, c_.group_size)});
      }
    } else if (c_.strategy == "channel") {
      expect_shape(*scale, {s[0], 1}, [&] { return concat("one scale per output channel of ", s[0]); });
    } else if (c_.strategy == "tensor" && scale->entry->numel() != 1) {
      bad_shape(*scale, {1}, "one scale per tensor");
    }
    weight(*w, static_cast<std::uint64_t>(s[0]) * static_cast<std::uint64_t>(cols));
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
      const std::int64_t in = gptq ? s[0] * 32 / c_.bits : s[0], out = gptq ? s[1] : s[1] * 32 / c_.bits;
      const std::int64_t groups = c_.group_size > 0 ? ceil_div(in, c_.group_size) : 1;
      const auto why = [&] { return concat(in, " inputs × ", out, " outputs at ", c_.bits, " bits, ", group_text(c_.group_size)); };
      expect_shape(*scales, {groups, out}, why);
      expect_shape(*zeros, {groups, ceil_div(out * c_.bits, 32)}, why);
      if (const auto* g = find("g_idx")) expect_shape(*g, {in}, why);
    }
    weight(*q, q->entry->numel() * 32 / static_cast<std::uint64_t>(c_.bits));
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
  auto next = begin;
  for (std::size_t i = 0; i < tensors.size(); ++i) grouped[next[module_of[i]]++] = {locals[i], tensors[i], i};
  for (std::size_t m = 0; m < modules.size(); ++m)
    detail::QuantModule(config, modules[m], std::span<const detail::QuantLocal>(grouped).subspan(begin[m], begin[m + 1] - begin[m]), out).run();
  if (out.modules == 0 && !tensors.empty())
    detail::throw_error<checkpoint_error>("config.json's quantization_config says ", config.description, " but no tensor of the "
                                          "checkpoint is stored that way (", tensors.front()->name, " is ",
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
