// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// quantization_config read, the tensors of each method's layout classified, contradictions
// refused naming the tensor, and checkpoint trees sized at the stored bytes.
#include <accel/model/checkpoint_tree.hpp>
#include <accel/model/quantization.hpp>

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/safetensors_writer.hpp"

using accel::DType;
using accel::QuantMethod;
using accel::TensorEntry;
using accel_test::contains;

namespace {

nlohmann::json quant(const char* json) { return nlohmann::json{{"quantization_config", nlohmann::json::parse(json)}}; }

accel::QuantizationConfig parsed(const char* json) {
  auto c = accel::parse_quantization_config(quant(json));
  REQUIRE(c);
  return *c;
}

struct Tensors {
  std::vector<TensorEntry> entries;
  std::deque<std::string> names;  // what the entries' names view
  Tensors& add(std::string name, DType dtype, std::vector<std::int64_t> shape) {
    TensorEntry e;
    e.name = names.emplace_back(std::move(name));
    e.dtype = dtype;
    e.shape = std::move(shape);
    const auto bytes = accel::shape_numel(e.shape) * accel::bit_size(dtype) / 8;
    e.end = bytes;
    entries.push_back(std::move(e));
    return *this;
  }
  accel::QuantizedTensors classify(const char* json) const {
    std::vector<const TensorEntry*> p;
    for (const auto& e : entries) p.push_back(&e);
    return accel::classify_quantized_tensors(parsed(json), p);
  }
};

constexpr const char* fp8_block = R"({"quant_method":"fp8","activation_scheme":"dynamic","fmt":"e4m3","weight_block_size":[128,128]})";

}  // namespace

TEST_CASE("quantization_config: each supported method is read with what sizes and checks need", "[quantization]") {
  auto fp8 = parsed(fp8_block);
  REQUIRE(fp8.method == QuantMethod::fp8);
  REQUIRE(fp8.block == std::array<std::int64_t, 2>{128, 128});
  REQUIRE(fp8.description == "fp8 (float8 weights, 128×128 blocks)");
  REQUIRE(fp8.budget_factor == 1.0);
  REQUIRE_FALSE(parsed(R"({"quant_method":"fp8","weight_block_size":null})").block);

  auto gptq = parsed(R"({"quant_method":"gptq","bits":4,"group_size":128,"desc_act":false,"sym":true})");
  REQUIRE((gptq.method == QuantMethod::gptq && gptq.bits == 4 && gptq.group_size == 128));
  REQUIRE(gptq.description == "gptq (4-bit, groups of 128)");
  auto awq = parsed(R"({"quant_method":"awq","bits":4,"group_size":128,"version":"GEMM","zero_point":true})");
  REQUIRE((awq.method == QuantMethod::awq && awq.format == "gemm"));

  auto ct = parsed(R"({"quant_method":"compressed-tensors","format":"pack-quantized","ignore":["lm_head"],
    "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","strategy":"group","group_size":128,"symmetric":true}}}})");
  REQUIRE((ct.method == QuantMethod::compressed_tensors && ct.bits == 4 && ct.group_size == 128 && ct.strategy == "group"));
  REQUIRE(ct.description == "compressed-tensors (pack-quantized, 4-bit, groups of 128)");

  auto bnb = parsed(R"({"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4","llm_int8_skip_modules":["lm_head"]})");
  REQUIRE((bnb.method == QuantMethod::bitsandbytes_4bit && bnb.format == "nf4" && bnb.budget_factor == 0.9));
  REQUIRE(bnb.not_converted == std::vector<std::string>{"lm_head"});
  REQUIRE(parsed(R"({"load_in_8bit":true})").method == QuantMethod::bitsandbytes_8bit);  // before quant_method existed
  REQUIRE(parsed(R"({"quant_method":"mxfp4","modules_to_not_convert":["model.layers.*.self_attn"]})").method == QuantMethod::mxfp4);
  REQUIRE_FALSE(accel::parse_quantization_config(nlohmann::json{{"model_type", "llama"}}));
}

TEST_CASE("quantization_config: unsupported methods and malformed fields are errors that say what to do", "[quantization]") {
  auto fails = [](const char* json, const char* says) {
    REQUIRE_THROWS_AS(accel::parse_quantization_config(quant(json)), accel::checkpoint_error);
    REQUIRE_THROWS_WITH(accel::parse_quantization_config(quant(json)), contains(says));
  };
  // Never a silently dequantized plan.
  fails(R"({"quant_method":"hqq"})", "quantization method 'hqq' is one transformers knows but accel does not support");
  fails(R"({"quant_method":"hqq"})", "fp8, compressed-tensors, gptq, awq, mxfp4 and pre-quantized bitsandbytes");
  fails(R"({"quant_method":"made-up"})", "'made-up' is unknown");
  fails(R"({"bits":4})", "has no quant_method");
  fails(R"({"quant_method":7})", "quant_method is 7, not a method name");
  fails(R"({"quant_method":"fp8","dequantize":true})", "dequantize is true");
  fails(R"({"quant_method":"fp8","weight_block_size":[128]})", "weight_block_size is [128], not [rows, columns]");
  fails(R"({"quant_method":"fp8","weight_block_size":[0,128]})", "weight_block_size");
  fails(R"({"quant_method":"gptq","bits":5})", "bits is 5, not 2, 3, 4 or 8");
  fails(R"({"quant_method":"gptq","bits":4,"group_size":0})", "group_size is 0");
  fails(R"({"quant_method":"compressed-tensors","format":"sparse-24-bitmask"})", "format 'sparse-24-bitmask' is not supported");
  fails(R"({"quant_method":"compressed-tensors","sparsity_config":{"format":"sparse-bitmask"}})", "sparse compressed-tensors");
  fails(R"({"quant_method":"bitsandbytes"})", "exactly one of load_in_4bit and load_in_8bit");
  fails(R"({"quant_method":"fp8","modules_to_not_convert":"lm_head"})", "modules_to_not_convert is \"lm_head\", not a list");
  REQUIRE_THROWS_AS(accel::parse_quantization_config(nlohmann::json{{"quantization_config", "fp8"}}), accel::checkpoint_error);
}

TEST_CASE("fp8 blocks: float8 weights and their ceil-divided scales are stored; the rest follows the load dtype", "[quantization]") {
  Tensors t;
  t.add("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", DType::F8_E4M3, {576, 256})
      .add("model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv", DType::F32, {5, 2})
      .add("model.layers.0.input_layernorm.weight", DType::BF16, {256})
      .add("lm_head.weight", DType::BF16, {64, 256});
  const auto q = t.classify(fp8_block);
  REQUIRE(q.stored == std::vector<bool>{true, true, false, false});
  REQUIRE(q.modules == 1);
  REQUIRE(q.weight_scales == std::vector<std::pair<std::size_t, std::size_t>>{{1, 0}});
  REQUIRE(q.stored_bytes == 576 * 256 + 5 * 2 * 4);
  REQUIRE(q.weight_elements == 576 * 256);
  REQUIRE(q.bytes_saved(DType::BF16) == 576 * 256 * 2 - q.stored_bytes);
  REQUIRE(q.bytes_saved(DType::F8_E4M3) == 0);
}

TEST_CASE("fp8: a weight without its scale, a scale without its weight, a wrong block shape name the tensor", "[quantization]") {
  auto fails = [](const Tensors& t, const char* json, std::vector<std::string> says) {
    try {
      (void)t.classify(json);
      FAIL("no error");
    } catch (const accel::checkpoint_error& e) {
      for (const auto& s : says) REQUIRE_THAT(e.what(), contains(s));
    }
  };
  Tensors missing;
  missing.add("m.q.weight", DType::F8_E4M3, {256, 256});
  fails(missing, fp8_block, {"tensor 'm.q.weight'", "no 'm.q.weight_scale_inv'"});
  Tensors orphan;
  orphan.add("m.q.weight", DType::BF16, {256, 256}).add("m.q.weight_scale_inv", DType::F32, {2, 2});
  fails(orphan, fp8_block, {"tensor 'm.q.weight_scale_inv'", "'m.q.weight' is not a quantized weight"});
  Tensors shape;
  shape.add("m.q.weight", DType::F8_E4M3, {576, 256}).add("m.q.weight_scale_inv", DType::F32, {4, 2});
  fails(shape, fp8_block, {"tensor 'm.q.weight_scale_inv' has shape [4, 2]", "gives [5, 2]", "128×128 blocks"});
  Tensors per_tensor;
  per_tensor.add("m.q.weight", DType::F8_E4M3, {576, 256}).add("m.q.weight_scale_inv", DType::F32, {5, 2});
  fails(per_tensor, R"({"quant_method":"fp8"})", {"one scale per tensor"});
  Tensors listed;
  listed.add("model.layers.3.mlp.gate.weight", DType::F8_E4M3, {256, 256}).add("model.layers.3.mlp.gate.weight_scale_inv", DType::F32, {2, 2});
  fails(listed, R"({"quant_method":"fp8","weight_block_size":[128,128],"modules_to_not_convert":["model.layers.*.mlp.gate"]})",
        {"'model.layers.3.mlp.gate.weight' is stored quantized", "pattern 'model.layers.*.mlp.gate'"});
}

TEST_CASE("modules left unquantized match as transformers' should_convert_module matches them", "[quantization]") {
  REQUIRE(accel::quant_module_listed("lm_head", "lm_head"));
  REQUIRE(accel::quant_module_listed("fc1", "model.decoder.layers.23.fc1"));  // a suffix
  REQUIRE(accel::quant_module_listed("layer.1", "layer.1.attn"));
  REQUIRE_FALSE(accel::quant_module_listed("layer.1", "layer.11.attn"));       // up to a module boundary
  REQUIRE(accel::quant_module_listed("model.layers.*.self_attn", "model.layers.11.self_attn"));
  REQUIRE_FALSE(accel::quant_module_listed("mlp.gate", "model.layers.0.mlp.gate_proj"));
  REQUIRE_FALSE(accel::quant_module_listed("", "lm_head"));
}

TEST_CASE("gptq and awq: packed weights with scales, zeros and g_idx are stored; shapes follow bits and groups", "[quantization]") {
  const char* gptq = R"({"quant_method":"gptq","bits":4,"group_size":128})";
  Tensors g;  // in 512, out 256
  g.add("m.q.qweight", DType::I32, {64, 256}).add("m.q.qzeros", DType::I32, {4, 32}).add("m.q.scales", DType::F16, {4, 256})
      .add("m.q.g_idx", DType::I32, {512}).add("m.q.bias", DType::F16, {256}).add("m.norm.weight", DType::F16, {512});
  const auto q = g.classify(gptq);
  REQUIRE(q.stored == std::vector<bool>{true, true, true, true, true, false});
  REQUIRE(q.weight_elements == 512 * 256);
  REQUIRE(q.bytes_saved(DType::F16) == 512 * 256 * 2 - (64 * 256 * 4 + 4 * 32 * 4 + 4 * 256 * 2 + 512 * 4 + 256 * 2));
  Tensors wrong = g;
  wrong.entries[1].shape = {4, 64};
  wrong.entries[1].end = 4 * 64 * 4;
  REQUIRE_THROWS_WITH(wrong.classify(gptq), contains("tensor 'm.q.qzeros' has shape [4, 64] but 512 inputs × 256 outputs at 4 bits"));
  Tensors no_scales;
  no_scales.add("m.q.qweight", DType::I32, {64, 256}).add("m.q.qzeros", DType::I32, {4, 32});
  REQUIRE_THROWS_WITH(no_scales.classify(gptq), contains("no 'm.q.scales'"));

  Tensors a;  // awq gemm packs the output columns: in 512, out 256
  a.add("m.q.qweight", DType::I32, {512, 32}).add("m.q.qzeros", DType::I32, {4, 32}).add("m.q.scales", DType::F16, {4, 256});
  REQUIRE(a.classify(R"({"quant_method":"awq","bits":4,"group_size":128,"version":"gemm"})").weight_elements == 512 * 256);
  REQUIRE_THROWS_WITH(a.classify(gptq), contains("tensor 'm.q.scales' has shape [4, 256]"));
}

TEST_CASE("compressed-tensors: float8 per channel and int4 packed in groups, with zero points", "[quantization]") {
  Tensors f;
  f.add("m.q.weight", DType::F8_E4M3, {256, 512}).add("m.q.weight_scale", DType::BF16, {256, 1}).add("m.q.input_scale", DType::BF16, {1})
      .add("lm_head.weight", DType::BF16, {64, 512});
  const auto fq = f.classify(R"({"quant_method":"compressed-tensors","format":"float-quantized","ignore":["lm_head"],
    "config_groups":{"g":{"weights":{"num_bits":8,"type":"float","strategy":"channel"}}}})");
  REQUIRE(fq.stored == std::vector<bool>{true, true, true, false});

  const char* w4 = R"({"quant_method":"compressed-tensors","format":"pack-quantized",
    "config_groups":{"g":{"weights":{"num_bits":4,"type":"int","strategy":"group","group_size":128,"symmetric":false}}}})";
  Tensors p;
  p.add("m.q.weight_packed", DType::I32, {256, 64}).add("m.q.weight_scale", DType::BF16, {256, 4})
      .add("m.q.weight_zero_point", DType::I32, {32, 4}).add("m.q.weight_shape", DType::I64, {2});
  const auto pq = p.classify(w4);
  REQUIRE(pq.stored == std::vector<bool>{true, true, true, true});
  REQUIRE(pq.weight_elements == 256 * 512);
  Tensors bad = p;
  bad.entries[1].shape = {256, 8};
  REQUIRE_THROWS_WITH(bad.classify(w4), contains("tensor 'm.q.weight_scale' has shape [256, 8] but 512 input columns in groups of 128 gives [256, 4]"));
  Tensors unscaled;
  unscaled.add("m.q.weight_packed", DType::I32, {256, 64});
  REQUIRE_THROWS_WITH(unscaled.classify(w4), contains("no 'm.q.weight_scale'"));
}

TEST_CASE("mxfp4 blocks and scales, bitsandbytes 4-bit quant state and 8-bit SCB", "[quantization]") {
  Tensors m;
  m.add("model.layers.0.mlp.experts.gate_up_proj_blocks", DType::U8, {4, 256, 4, 16})
      .add("model.layers.0.mlp.experts.gate_up_proj_scales", DType::U8, {4, 256, 4})
      .add("model.layers.0.mlp.experts.gate_up_proj_bias", DType::BF16, {4, 256});
  const auto mq = m.classify(R"({"quant_method":"mxfp4"})");
  REQUIRE(mq.stored == std::vector<bool>{true, true, false});
  REQUIRE(mq.weight_elements == 4 * 256 * 128);
  Tensors mbad = m;
  mbad.entries[1].shape = {4, 256, 2};
  REQUIRE_THROWS_WITH(mbad.classify(R"({"quant_method":"mxfp4"})"), contains("gate_up_proj_scales' has shape [4, 256, 2]"));

  Tensors b;
  b.add("m.q.weight", DType::U8, {32768, 1}).add("m.q.weight.absmax", DType::U8, {1024}).add("m.q.weight.nested_absmax", DType::F32, {4})
      .add("m.q.weight.nested_quant_map", DType::F32, {256}).add("m.q.weight.quant_map", DType::F32, {16})
      .add("m.q.weight.quant_state.bitsandbytes__nf4", DType::U8, {120}).add("m.q.bias", DType::BF16, {256});
  const auto bq = b.classify(R"({"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4"})");
  REQUIRE(bq.stored == std::vector<bool>{true, true, true, true, true, true, false});
  REQUIRE(bq.weight_elements == 65536);
  Tensors bmissing;
  bmissing.add("m.q.weight", DType::U8, {32768, 1}).add("m.q.weight.absmax", DType::F32, {1024});
  REQUIRE_THROWS_WITH(bmissing.classify(R"({"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4"})"),
                      contains("no 'm.q.weight.quant_map'"));

  Tensors e;
  e.add("m.q.weight", DType::I8, {256, 512}).add("m.q.SCB", DType::F32, {256}).add("m.q.weight_format", DType::U8, {});
  REQUIRE(e.classify(R"({"quant_method":"bitsandbytes","load_in_8bit":true})").stored == std::vector<bool>{true, true, true});
  e.entries[1].shape = {512};
  REQUIRE_THROWS_WITH(e.classify(R"({"quant_method":"bitsandbytes","load_in_8bit":true})"), contains("tensor 'm.q.SCB' has shape [512]"));
}

TEST_CASE("a block-FP8 Llama folder is sized at its stored bytes, not as if dequantized", "[quantization][checkpoint_tree]") {
  accel_test::TempDir dir;
  std::vector<accel_test::TensorSpec> specs{{"model.embed_tokens.weight", DType::BF16, {64, 256}, {}},
                                            {"model.norm.weight", DType::BF16, {256}, {}},
                                            {"lm_head.weight", DType::BF16, {64, 256}, {}}};
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      const auto base = "model.layers." + std::to_string(l) + "." + p;
      specs.push_back({base + ".weight", DType::F8_E4M3, {256, 256}, {}});
      specs.push_back({base + ".weight_scale_inv", DType::F32, {2, 2}, {}});
    }
  for (int l = 0; l < 2; ++l)
    for (const char* n : {"input_layernorm", "post_attention_layernorm"})
      specs.push_back({"model.layers." + std::to_string(l) + "." + n + ".weight", DType::BF16, {256}, {}});
  accel_test::write_safetensors(dir.path() / "model.safetensors", specs);
  accel_test::write_text(dir.path() / "config.json", R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":256,
    "intermediate_size":256,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,"vocab_size":64,"dtype":"bfloat16",
    "tie_word_embeddings":false,"quantization_config":)" + std::string(fp8_block) + "}");
  const auto model = accel::read_checkpoint_model(dir.path());
  REQUIRE(model.quantization);
  REQUIRE(model.quantization->modules == 14);
  const auto& q = model.tree.tensors()[*model.tree.find_tensor("model.layers.1.mlp.up_proj.weight")];
  REQUIRE((q.quantized && q.dtype == DType::F8_E4M3));
  REQUIRE(model.tree.tensors()[*model.tree.find_tensor("model.layers.1.mlp.up_proj.weight_scale_inv")].quantized);
  REQUIRE_FALSE(model.tree.tensors()[*model.tree.find_tensor("model.norm.weight")].quantized);
  // At bfloat16 the float8 weights and float32 scales count as stored; float32 would not change them either.
  const std::uint64_t rotary = 2 * 32 * 4;  // inv_freq and original_inv_freq: computed, float32
  const std::uint64_t stored = 14 * (256 * 256 + 16) + 2 * 64 * 256 * 2 + 5 * 256 * 2 + rotary;
  REQUIRE(accel::compute_module_sizes(model.tree, {.dtype = DType::BF16}).total() == stored);
  REQUIRE(accel::compute_module_sizes(model.tree, {.dtype = DType::F32}).total() == 14 * (256 * 256 + 16) + 2 * 64 * 256 * 4 + 5 * 256 * 4 + rotary);
  REQUIRE(model.warnings.empty());
}

TEST_CASE("bitsandbytes quant state is part of its weight in the tree; fp8 expert scales join their fused tensor", "[quantization][checkpoint_tree]") {
  accel_test::TempDir dir;
  std::vector<accel_test::TensorSpec> specs{{"model.layers.0.mlp.down_proj.weight", DType::U8, {8192, 1}, {}},
                                            {"model.layers.0.mlp.down_proj.weight.absmax", DType::F32, {256}, {}},
                                            {"model.layers.0.mlp.down_proj.weight.quant_map", DType::F32, {16}, {}},
                                            {"model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4", DType::U8, {100}, {}},
                                            {"model.norm.weight", DType::BF16, {128}, {}}};
  accel_test::write_safetensors(dir.path() / "model.safetensors", specs);
  accel_test::write_text(dir.path() / "config.json", R"({"architectures":["LlamaForCausalLM"],"model_type":"llama",
    "quantization_config":{"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4"}})");
  auto opts = accel::CheckpointTreeOptions{};
  opts.use_catalog = false;
  const auto model = accel::read_checkpoint_model(dir.path(), opts);
  REQUIRE_FALSE(model.tree.find_module("model.layers.0.mlp.down_proj.weight"));
  const auto& w = model.tree.tensors()[*model.tree.find_tensor("model.layers.0.mlp.down_proj.weight")];
  REQUIRE(w.quantized);
  REQUIRE(accel::tensor_size(w, {.dtype = DType::F16}) == 8192 + 256 * 4 + 16 * 4 + 100);
  REQUIRE(model.names.model[1] == "model.layers.0.mlp.down_proj.weight");

  accel::NameTable names{{"model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv",
                          "model.layers.0.self_attn.q_proj.weight_scale_inv", "model.layers.0.self_attn.q_proj.weight"},
                         {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv",
                          "model.layers.0.self_attn.q_proj.weight_scale_inv", "model.layers.0.self_attn.q_proj.weight"},
                         {}};
  accel::QuantizedTensors q;
  q.config = parsed(fp8_block);
  q.stored = {true, true, true, true};
  q.weight_scales = {{1, 0}, {2, 3}};  // as classify_quantized_tensors pairs them
  accel::quantized_model_names(names, q);
  REQUIRE(names.model[1] == "model.layers.0.mlp.experts.gate_up_proj_scale_inv");
  REQUIRE(names.model[2] == "model.layers.0.self_attn.q_proj.weight_scale_inv");
}

TEST_CASE("blocks past the config's count are left out of the tree and said, as transformers never loads them", "[checkpoint_tree]") {
  accel_test::TempDir dir;
  std::vector<accel_test::TensorSpec> specs{{"model.embed_tokens.weight", DType::BF16, {64, 16}, {}}};
  for (int l = 0; l < 3; ++l)  // layer 2 is a multi-token-prediction layer beside num_hidden_layers = 2
    specs.push_back({"model.layers." + std::to_string(l) + ".mlp.up_proj.weight", DType::BF16, {32, 16}, {}});
  specs.push_back({"model.layers.2.eh_proj.weight", DType::BF16, {16, 32}, {}});
  accel_test::write_safetensors(dir.path() / "model.safetensors", specs);
  accel_test::write_text(dir.path() / "config.json", R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":16,
    "intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":2,"vocab_size":64})");
  const auto model = accel::read_checkpoint_model(dir.path());
  REQUIRE(model.tree.find_tensor("model.layers.1.mlp.up_proj.weight"));
  REQUIRE_FALSE(model.tree.find_module("model.layers.2"));
  REQUIRE(model.warnings.size() == 1);
  REQUIRE_THAT(model.warnings.front(), contains("model.layers.2 (2 tensors, 2.00 KiB) is past the model's blocks"));
}

TEST_CASE("a large checkpoint's names, worked out in pieces beside its quantization, are the names worked out in one pass", "[quantization][names]") {
  // Past 10k tensors checkpoint_naming maps the names in pieces on two threads, each piece deciding
  // its name shapes alone: the stitched table must be the one-pass table, name for name, in order.
  accel_test::TempDir dir;
  std::vector<accel_test::TensorSpec> specs{{"model.embed_tokens.weight", DType::BF16, {8, 4}, {}}};
  for (int l = 0; l < 14; ++l)
    for (int e = 0; e < 128; ++e)
      for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
        const auto base = "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." + p;
        specs.push_back({base + ".weight", DType::F8_E4M3, {1, 1}, {}});
        specs.push_back({base + ".weight_scale_inv", DType::F32, {1, 1}, {}});
      }
  REQUIRE(specs.size() > 10'000);
  accel_test::write_safetensors(dir.path() / "model.safetensors", specs);
  accel_test::write_text(dir.path() / "config.json", R"({"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3",
    "quantization_config":)" + std::string(fp8_block) + "}");
  const auto ckpt = accel::resolve_checkpoint(dir.path());
  const auto config = accel::read_model_config(dir.path() / "config.json");
  const auto naming = accel::checkpoint_naming(ckpt, &config);
  REQUIRE(naming.class_names);
  REQUIRE(naming.quantization);
  auto one_pass = accel::name_table(naming.class_names, ckpt.tensor_names, ckpt.name_storage());
  accel::quantized_model_names(one_pass, *naming.quantization);
  REQUIRE(naming.names.checkpoint == one_pass.checkpoint);
  REQUIRE(naming.names.model == one_pass.model);
  REQUIRE(naming.names.source == one_pass.source);
  REQUIRE(std::count(naming.names.model.begin(), naming.names.model.end(), "model.layers.13.mlp.experts.gate_up_proj") == 2 * 128);
  REQUIRE(std::count(naming.names.model.begin(), naming.names.model.end(), "model.layers.13.mlp.experts.down_proj_scale_inv") == 128);
  // Each fused weight's scale is named after the weight, whichever piece named each.
  std::size_t fused_scales = 0;
  for (const auto& [scale, weight] : naming.quantization->weight_scales) {
    const std::string w(naming.names.model[weight]);
    if (w.ends_with(".weight")) continue;
    ++fused_scales;
    REQUIRE(naming.names.model[scale] == w + "_scale_inv");
  }
  CHECK(fused_scales == 14 * 128 * 3);
}

// ---- Issue 33: what a hostile config.json or header could slip past the checks ----

namespace {

// The message of the checkpoint_error `f` throws (FAIL when it throws nothing or something else).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const accel::checkpoint_error& e) {
    return e.what();
  }
  FAIL("no checkpoint_error");
  return {};
}

std::string config_error(const char* json) {
  return error_of([&] { (void)accel::parse_quantization_config(quant(json)); });
}

std::string classify_error(const Tensors& t, const char* json) {
  return error_of([&] { (void)t.classify(json); });
}

// compressed-tensors, one int4 group of 128 for every Linear, with an `ignore` list spliced in.
std::string ct_w4(const std::string& ignore) {
  return R"({"quant_method":"compressed-tensors","format":"pack-quantized","ignore":)" + ignore +
         R"(,"config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","strategy":"group","group_size":128}}}})";
}

// One int4 layer packed in int32 (in 512, out 256, groups of 128) at `module`.
Tensors& add_w4(Tensors& t, const std::string& module) {
  return t.add(module + ".weight_packed", DType::I32, {256, 64}).add(module + ".weight_scale", DType::BF16, {256, 4})
      .add(module + ".weight_shape", DType::I64, {2});
}

}  // namespace

TEST_CASE("names and values from files are escaped in every message: a NUL byte does not cut it short", "[quantization]") {
  using namespace std::string_literals;
  auto m = config_error(R"({"quant_method":"fp8\u0000 and the rest"})");
  REQUIRE_THAT(m, contains("quantization method 'fp8\\x00 and the rest' is unknown"));
  m = config_error(R"({"quant_method":"compressed-tensors","format":"dense\u0000x"})");
  REQUIRE_THAT(m, contains("format 'dense\\x00x' is not supported"));
  m = config_error(R"({"quant_method":"compressed-tensors","config_groups":{"g\u0000x":7}})");
  REQUIRE_THAT(m, contains("config_groups.g\\x00x is 7, not an object"));
  Tensors named;
  named.add("m.q\0x.weight"s, DType::F8_E4M3, {256, 256});
  m = classify_error(named, fp8_block);
  REQUIRE_THAT(m, contains("tensor 'm.q\\x00x.weight'"));
  REQUIRE_THAT(m, contains("no 'm.q\\x00x.weight_scale_inv'; the checkpoint is incomplete"));
  Tensors awq;  // the description carries the config's own `version`
  awq.add("m.q.qweight", DType::I32, {512, 32}).add("m.q.qzeros", DType::I32, {4, 32});
  m = classify_error(awq, R"({"quant_method":"awq","bits":4,"group_size":128,"version":"gemm\u0000x"})");
  REQUIRE_THAT(m, contains("awq (gemm\\x00x, 4-bit, groups of 128) packed weight but the checkpoint has no 'm.q.scales'"));
  Tensors dense;
  dense.add("m.\x1b[2Jq.weight", DType::BF16, {4, 4});
  m = classify_error(dense, fp8_block);
  REQUIRE_THAT(m, contains("(m.\\x1b[2Jq.weight is bfloat16)"));
}

TEST_CASE("integer fields: 2^64 - 1 is not -1, and every integer is checked against its range", "[quantization]") {
  auto m = config_error(R"({"quant_method":"gptq","bits":4,"group_size":18446744073709551615})");
  REQUIRE_THAT(m, contains("quantization_config.group_size is 18446744073709551615, not -1 or a positive integer"));
  m = config_error(R"({"quant_method":"awq","bits":4,"group_size":9223372036854775808})");
  REQUIRE_THAT(m, contains("group_size is 9223372036854775808"));
  m = config_error(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":4,"strategy":"group","group_size":18446744073709551615}}}})");
  REQUIRE_THAT(m, contains("config_groups.g.weights.group_size is 18446744073709551615"));
  m = config_error(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":4,"strategy":"channel","group_size":0}}}})");
  REQUIRE_THAT(m, contains("config_groups.g.weights.group_size is 0, not -1 or a positive integer"));
  m = config_error(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":18446744073709551615}}}})");
  REQUIRE_THAT(m, contains("config_groups.g.weights.num_bits is 18446744073709551615, not an integer from 1 to 32"));
  m = config_error(R"({"quant_method":"fp8","weight_block_size":[4611686018427387904,128]})");
  REQUIRE_THAT(m, contains("weight_block_size is [4611686018427387904, 128], not [rows, columns] of positive integers up to"));
  m = config_error(R"({"quant_method":"gptq","bits":18446744073709551612})");
  REQUIRE_THAT(m, contains("bits is 18446744073709551612, not 2, 3, 4 or 8"));
  // What the libraries write still reads.
  REQUIRE(parsed(R"({"quant_method":"gptq","bits":4,"group_size":-1})").group_size == -1);
  REQUIRE(parsed(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":8,"strategy":"channel","group_size":null}}}})").strategy == "channel");
}

TEST_CASE("compressed-tensors ignore: a list of names and valid re: patterns, none naming a layer stored quantized", "[quantization]") {
  REQUIRE_THAT(config_error(ct_w4(R"("lm_head")").c_str()), contains("quantization_config.ignore is \"lm_head\", not a list of module names"));
  REQUIRE_THAT(config_error(ct_w4(R"(["lm_head",7])").c_str()), contains("quantization_config.ignore[1] is 7, not a module name"));
  auto m = config_error(ct_w4(R"(["re:.*(mlp"])").c_str());
  REQUIRE_THAT(m, contains("quantization_config.ignore entry 're:.*(mlp' is not a regular expression accel can read"));
  REQUIRE_THAT(m, contains("missing )"));
  REQUIRE_THAT(config_error(ct_w4(R"(["re:*lm_head"])").c_str()), contains("nothing to repeat"));
  REQUIRE_THAT(config_error(ct_w4(R"(["re:[a-"])").c_str()), contains("'re:[a-'"));
  REQUIRE_THAT(config_error(ct_w4(R"(["re:(?<=mlp)gate"])").c_str()), contains("lookbehind"));
  REQUIRE_THAT(config_error(ct_w4("[\"re:" + std::string(600, 'a') + "\"]").c_str()), contains("600 bytes"));

  Tensors t;
  add_w4(t, "model.layers.0.mlp.down_proj");
  add_w4(t, "model.layers.0.self_attn.q_proj");
  t.add("model.layers.0.mlp.gate.weight", DType::BF16, {8, 512}).add("lm_head.weight", DType::BF16, {64, 512});
  // Real lists: plain names and patterns that match only the layers left in bfloat16.
  const auto ok = t.classify(ct_w4(R"(["lm_head","re:.*mlp\\.gate$","re:model\\.layers\\.\\d+\\.mlp\\.gate(?:_up)?$","re:visual.*"])").c_str());
  REQUIRE(ok.modules == 2);
  m = classify_error(t, ct_w4(R"(["lm_head","re:.*"])").c_str());
  REQUIRE_THAT(m, contains("ignore entry 're:.*' matches layer 'model.layers.0.mlp.down_proj'"));
  REQUIRE_THAT(m, contains("'model.layers.0.mlp.down_proj.weight_packed' is stored quantized"));
  REQUIRE_THAT(m, contains("transformers would leave the layer unquantized and could not load"));
  m = classify_error(t, ct_w4(R"(["model.layers.0.self_attn.q_proj"])").c_str());
  REQUIRE_THAT(m, contains("ignore entry 'model.layers.0.self_attn.q_proj' matches layer 'model.layers.0.self_attn.q_proj'"));
  m = classify_error(t, ct_w4(R"(["re:model.layers.0.(mlp|self_attn).(down|o)_proj"])").c_str());  // re.match: a prefix
  REQUIRE_THAT(m, contains("layer 'model.layers.0.mlp.down_proj'"));
  // A pattern that takes exponential time by backtracking is matched in one pass over the name.
  Tensors slow;
  add_w4(slow, std::string(64, 'a'));
  REQUIRE(slow.classify(ct_w4(R"(["re:(a+)+b","re:(a|aa)*c","re:(.*)*x$"])").c_str()).modules == 1);
}

TEST_CASE("compressed-tensors: a weight strategy compressed-tensors does not define is refused naming the group", "[quantization]") {
  auto m = config_error(R"({"quant_method":"compressed-tensors","config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"strategy":"per-row","group_size":128}}}})");
  REQUIRE_THAT(m, contains("quantization_config.config_groups.group_0.weights.strategy is \"per-row\", not one of tensor, channel, group, block, token, tensor_group"));
  REQUIRE_THAT(config_error(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":4,"strategy":7}}}})"),
               contains("config_groups.g.weights.strategy is 7"));
  REQUIRE_THAT(config_error(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":4,"strategy":"group"}}}})"),
               contains("config_groups.g.weights.group_size is null, not a positive integer (strategy 'group' needs one)"));
  // compressed-tensors reads strategies in any case, and infers one from group_size when absent.
  REQUIRE(parsed(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":8,"strategy":"CHANNEL"}}}})").strategy == "channel");
  REQUIRE(parsed(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":4,"group_size":32}}}})").strategy == "group");
  for (const char* s : {"tensor", "channel", "block", "token", "tensor_group", "attn_head"}) {
    const auto j = std::string(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"num_bits":8,"strategy":")") + s +
                   R"(","group_size":)" + (std::string(s) == "tensor_group" ? "16" : "null") + "}}}}";
    REQUIRE(parsed(j.c_str()).strategy == s);
  }
}

TEST_CASE("compressed-tensors: overlapping config_groups apply the group compressed-tensors picks, and its shapes are checked", "[quantization]") {
  // match_targets' order: targets naming the layer exactly, then `re:` patterns (each set
  // alphabetically), then class names such as Linear; the first target's group applies.
  const char* mixed = R"({"quant_method":"compressed-tensors","format":"mixed-precision","config_groups":{
    "int4":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","strategy":"group","group_size":128}},
    "int8":{"targets":["re:.*down_proj$"],"weights":{"num_bits":8,"type":"int","strategy":"channel"}}}})";
  Tensors t;
  add_w4(t, "m.q_proj");
  t.add("m.down_proj.weight_packed", DType::I32, {256, 128}).add("m.down_proj.weight_scale", DType::BF16, {256, 1});
  const auto q = t.classify(mixed);
  REQUIRE(q.modules == 2);
  REQUIRE(q.weight_elements == 2 * 256 * 512);  // down_proj unpacked at 8 bits, not counted as int4
  Tensors wrong_down = t;
  wrong_down.entries[4].shape = {256, 4};  // int4 groups of 128: the shape of the other group
  auto m = classify_error(wrong_down, mixed);
  REQUIRE_THAT(m, contains("tensor 'm.down_proj.weight_scale' has shape [256, 4] but one scale per output channel of 256 gives [256, 1]"));
  REQUIRE_THAT(m, contains("config_groups.int8"));
  Tensors wrong_q = t;
  wrong_q.entries[1].shape = {256, 1};
  REQUIRE_THAT(classify_error(wrong_q, mixed), contains("tensor 'm.q_proj.weight_scale' has shape [256, 1] but 512 input columns in groups of 128 gives [256, 4]"));
  // Two patterns match the layer: the one first in alphabetical order wins ("re:.*" before "re:m").
  const char* two = R"({"quant_method":"compressed-tensors","config_groups":{
    "b":{"targets":["re:m\\..*"],"weights":{"num_bits":4,"strategy":"group","group_size":128}},
    "a":{"targets":["re:.*down_proj"],"weights":{"num_bits":8,"strategy":"channel"}}}})";
  REQUIRE_THAT(classify_error(wrong_down, two), contains("config_groups.a"));
  // An exact name beats every pattern.
  const char* exact = R"({"quant_method":"compressed-tensors","config_groups":{
    "by_name":{"targets":["m.down_proj"],"weights":{"num_bits":8,"strategy":"channel"}},
    "rest":{"targets":["re:.*"],"weights":{"num_bits":4,"strategy":"group","group_size":128}}}})";
  REQUIRE(t.classify(exact).modules == 2);
  REQUIRE_THAT(classify_error(wrong_down, exact), contains("config_groups.by_name"));
  REQUIRE_THAT(config_error(R"({"quant_method":"compressed-tensors","config_groups":{"g":{"targets":["re:("],"weights":{"num_bits":4}}}})"),
               contains("config_groups.g.targets entry 're:(' is not a regular expression accel can read"));
}

TEST_CASE("fp8: a scale is told by its name; a float8 scale is a malformed scale, not a weight", "[quantization]") {
  Tensors t;  // the scale first, as a header sorted by name lists it
  t.add("m.q.weight_scale_inv", DType::F8_E4M3, {2, 2}).add("m.q.weight", DType::F8_E4M3, {256, 256});
  auto m = classify_error(t, fp8_block);
  REQUIRE_THAT(m, contains("scale 'm.q.weight_scale_inv' is float8_e4m3fn; fp8 scales are float32 / bfloat16"));
  REQUIRE_THAT(m, !contains("_scale_inv_scale_inv"));
  Tensors input;
  input.add("m.q.weight", DType::F8_E4M3, {256, 256}).add("m.q.weight_scale_inv", DType::F32, {2, 2}).add("m.q.input_scale", DType::F8_E5M2, {1});
  REQUIRE_THAT(classify_error(input, fp8_block), contains("scale 'm.q.input_scale' is float8_e5m2"));
  Tensors lone;
  lone.add("m.k.weight_scale", DType::F8_E4M3, {1}).add("m.q.weight", DType::F8_E4M3, {256, 256}).add("m.q.weight_scale_inv", DType::F32, {2, 2});
  REQUIRE_THAT(classify_error(lone, fp8_block), contains("scale 'm.k.weight_scale' is float8_e4m3fn"));
}

TEST_CASE("zero-element tensors with huge dimensions: companion shapes are computed without overflow, or refused", "[quantization]") {
  constexpr std::int64_t big = std::int64_t{1} << 62;
  Tensors ct;
  ct.add("m.q.weight_packed", DType::I32, {0, big}).add("m.q.weight_scale", DType::BF16, {0, 1});
  auto m = classify_error(ct, ct_w4("[]").c_str());
  REQUIRE_THAT(m, contains("tensor 'm.q.weight_packed' has shape [0, 4611686018427387904]"));
  REQUIRE_THAT(m, contains("overflow"));
  Tensors gptq;
  gptq.add("m.q.qweight", DType::I32, {0, big}).add("m.q.qzeros", DType::I32, {1, 1}).add("m.q.scales", DType::F16, {1, 1});
  m = classify_error(gptq, R"({"quant_method":"awq","bits":4,"group_size":128})");
  REQUIRE_THAT(m, contains("tensor 'm.q.qweight' has shape [0, 4611686018427387904]"));
  REQUIRE_THAT(m, contains("overflow"));
  Tensors rows;
  rows.add("m.q.qweight", DType::I32, {big, 0}).add("m.q.qzeros", DType::I32, {1, 1}).add("m.q.scales", DType::F16, {1, 1});
  REQUIRE_THAT(classify_error(rows, R"({"quant_method":"gptq","bits":4,"group_size":128})"), contains("overflow"));
  // Ceil-divided blocks of the largest dimension a header can hold: exact, not wrapped negative.
  Tensors fp8;
  fp8.add("m.q.weight", DType::F8_E4M3, {0, INT64_MAX}).add("m.q.weight_scale_inv", DType::F32, {0, 1});
  REQUIRE_THAT(classify_error(fp8, fp8_block), contains("gives [0, 72057594037927936]"));
  Tensors exact = fp8;
  exact.entries[1].shape = {0, std::int64_t{72057594037927936}};
  REQUIRE(exact.classify(fp8_block).modules == 1);
}
