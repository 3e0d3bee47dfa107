// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/plan/device_map.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"

using accel::DType;

TEST_CASE("classify_unused_keys: keys for computed buffers and tied copies are the model's; others are unknown",
          "[plan][device_map]") {
  accel::ModuleTree t;
  t.add_parameter("model.embed_tokens.weight", DType::BF16, {64, 16});
  t.add_parameter("model.layers.0.mlp.weight", DType::BF16, {16, 16});
  t.add_buffer("model.layers.0.mlp.running_mean", DType::F32, {16});  // persistent: saved with the weights
  t.add_buffer("model.rotary_emb.inv_freq", DType::F32, {4}, false);
  t.add_buffer("model.rotary_emb.original_inv_freq", DType::F32, {4}, false);
  t.add_parameter("model.norm.weight", DType::BF16, {16});
  t.add_alias("lm_head.weight", "model.embed_tokens.weight");

  // Keys that cover no checkpoint tensor, as plan_load reports them.
  const std::vector<std::string> keys{"model.rotary_emb", "lm_head", "model.rotary_emb.inv_freq", "lm_head.weight",
                                      "model.norm", "model.layers.0.mlp", "model.layers.0.mlp.running_mean", "bogus",
                                      "model.rotary", ""};
  const auto u = accel::classify_unused_keys(t, keys);
  CHECK(u.model_only == std::vector<std::string>{"model.rotary_emb", "lm_head", "model.rotary_emb.inv_freq", "lm_head.weight"});
  // A module whose weights the checkpoint lacks, a persistent buffer, names the model does not
  // have (a prefix of a name is not a name), and the root: all worth reporting.
  CHECK(u.unknown == std::vector<std::string>{"model.norm", "model.layers.0.mlp", "model.layers.0.mlp.running_mean", "bogus",
                                              "model.rotary", ""});

  SECTION("a module mixing computed buffers with a stored weight is not explained") {
    t.add_parameter("model.rotary_emb.scale", DType::F32, {1});
    const auto mixed = accel::classify_unused_keys(t, {"model.rotary_emb", "model.rotary_emb.inv_freq"});
    CHECK(mixed.unknown == std::vector<std::string>{"model.rotary_emb"});
    CHECK(mixed.model_only == std::vector<std::string>{"model.rotary_emb.inv_freq"});
  }
  CHECK(accel::classify_unused_keys(t, {}).unknown.empty());
}
