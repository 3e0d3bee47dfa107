// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file models.hpp
/// @brief Small model trees and checkpoints shared by the module-tree, planner and load tests.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <accel/model/module_tree.hpp>

#include "safetensors_writer.hpp"

namespace accel_test {

/// @brief accelerate's ModelForTest: Linear(3,4), BatchNorm1d(4), Linear(4,5), float32.
inline accel::ModuleTree model_for_test() {
  using accel::DType;
  accel::ModuleTree t;
  t.add_parameter("linear1.weight", DType::F32, {4, 3});
  t.add_parameter("linear1.bias", DType::F32, {4});
  t.add_parameter("batchnorm.weight", DType::F32, {4});
  t.add_parameter("batchnorm.bias", DType::F32, {4});
  t.add_buffer("batchnorm.running_mean", DType::F32, {4});
  t.add_buffer("batchnorm.running_var", DType::F32, {4});
  t.add_buffer("batchnorm.num_batches_tracked", DType::I64, {});
  t.add_parameter("linear2.weight", DType::F32, {5, 4});
  t.add_parameter("linear2.bias", DType::F32, {5});
  return t;
}

/// @brief Writes a bfloat16 Llama checkpoint with its config.json (untied LM head) to `dir`: a 50 MB
///        Llama (12 layers, hidden 256, vocabulary 32,000) scaled down 16x in bytes, keeping what
///        makes its maps: 12 decoder layers, each embedding about 10 layers large, every tensor a
///        multiple of 256 bytes. Hidden 128 with one KV head, intermediate 24, vocabulary 4,000:
///        3.26 MB (6.52 MB as float32; an embedding 2,048,000 bytes, a layer 201,728).
inline void write_scaled_llama(const std::filesystem::path& dir) {
  using accel::DType;
  constexpr std::int64_t hidden = 128, kv = 32, intermediate = 24, vocab = 4000;
  std::vector<TensorSpec> t{{"model.embed_tokens.weight", DType::BF16, {vocab, hidden}, {}}};
  for (int i = 0; i < 12; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", DType::BF16, {hidden}, {}});
    t.push_back({p + "self_attn.q_proj.weight", DType::BF16, {hidden, hidden}, {}});
    t.push_back({p + "self_attn.k_proj.weight", DType::BF16, {kv, hidden}, {}});
    t.push_back({p + "self_attn.v_proj.weight", DType::BF16, {kv, hidden}, {}});
    t.push_back({p + "self_attn.o_proj.weight", DType::BF16, {hidden, hidden}, {}});
    t.push_back({p + "post_attention_layernorm.weight", DType::BF16, {hidden}, {}});
    t.push_back({p + "mlp.gate_proj.weight", DType::BF16, {intermediate, hidden}, {}});
    t.push_back({p + "mlp.up_proj.weight", DType::BF16, {intermediate, hidden}, {}});
    t.push_back({p + "mlp.down_proj.weight", DType::BF16, {hidden, intermediate}, {}});
  }
  t.push_back({"model.norm.weight", DType::BF16, {hidden}, {}});
  t.push_back({"lm_head.weight", DType::BF16, {vocab, hidden}, {}});
  write_safetensors(dir / "model.safetensors", t);
  write_text(dir / "config.json", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 24, "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 12,
    "vocab_size": 4000, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})");
}

}  // namespace accel_test
