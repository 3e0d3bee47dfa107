// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/plan/map_names.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"

using Strings = std::vector<std::string>;

namespace {

// A ViT-like table: blocks renamed, a renamed head, one fused pair, one name unchanged.
accel::NameTable vit_like() {
  accel::NameTable t;
  t.checkpoint = {"vit.encoder.layer.0.attention.attention.query.weight", "vit.encoder.layer.0.output.dense.weight",
                  "vit.encoder.layer.1.attention.attention.query.weight", "vit.encoder.layer.1.output.dense.weight",
                  "embed_out.weight", "moe.experts.0.w1.weight", "moe.experts.0.w3.weight", "moe.experts.1.w1.weight",
                  "moe.experts.1.w3.weight", "moe.experts.0.w2.weight", "moe.experts.1.w2.weight", "classifier.weight"};
  t.model = {"vit.layers.0.attention.q_proj.weight", "vit.layers.0.mlp.fc2.weight", "vit.layers.1.attention.q_proj.weight",
             "vit.layers.1.mlp.fc2.weight", "lm_head.weight", "moe.experts.gate_up_proj", "moe.experts.gate_up_proj",
             "moe.experts.gate_up_proj", "moe.experts.gate_up_proj", "moe.experts.down_proj", "moe.experts.down_proj",
             "classifier.weight"};
  t.source = "Toy (test)";
  return t;
}

Strings keys(const accel::DeviceMap& m) {
  Strings out;
  for (const auto& [k, p] : m) out.push_back(k);
  return out;
}

}  // namespace

TEST_CASE("a model-name map is rewritten in checkpoint names, every checkpoint tensor placed as its model tensor", "[map_names]") {
  const auto table = vit_like();
  const auto model_map = accel::DeviceMap::from_json(
      R"({"vit.layers.0": 0, "vit.layers.1.attention": 1, "vit.layers.1.mlp": "cpu", "lm_head": "cpu",
          "moe.experts.gate_up_proj": 0, "moe.experts.down_proj": "disk", "classifier": "disk"})");
  const auto ckpt = accel::to_checkpoint_names(model_map, table);
  CHECK(keys(ckpt) == Strings{"vit.encoder.layer.0", "vit.encoder.layer.1.attention", "vit.encoder.layer.1.output",
                              "embed_out", "moe.experts.0.w1.weight", "moe.experts.0.w3.weight", "moe.experts.1.w1.weight",
                              "moe.experts.1.w3.weight", "moe.experts.0.w2.weight", "moe.experts.1.w2.weight", "classifier"});
  for (std::size_t i = 0; i < table.checkpoint.size(); ++i) {
    INFO(table.checkpoint[i]);
    CHECK(ckpt.placement_of(table.checkpoint[i]) == model_map.placement_of(table.model[i]));
  }
  SECTION("a key covering a module whose checkpoint prefix holds more than it stays tensor by tensor") {
    // vit.layers.1.mlp covers only output.dense of the checkpoint's layer 1.
    CHECK_FALSE(ckpt.find("vit.encoder.layer.1"));
  }
  SECTION("a longer key keeps its tensors where it puts them") {
    const auto nested = accel::DeviceMap::from_json(R"({"": 0, "moe.experts.down_proj": 1})");
    const auto c = accel::to_checkpoint_names(nested, table);
    CHECK(c.placement_of("moe.experts.1.w2.weight") == accel::Placement::gpu(1));
    CHECK(c.placement_of("moe.experts.1.w1.weight") == accel::Placement::gpu(0));
  }
  SECTION("keys covering no checkpoint tensor stay as they are") {
    const auto c = accel::to_checkpoint_names(accel::DeviceMap::from_json(R"({"rotary": 0, "lm_head": 1})"), table);
    CHECK(keys(c) == Strings{"rotary", "embed_out"});
  }
  SECTION("with nothing renamed the map is unchanged") {
    accel::NameTable same;
    same.checkpoint = same.model = {"a.w", "b.w"};
    CHECK(keys(accel::to_checkpoint_names(model_map, same)) == keys(model_map));
  }
}

TEST_CASE("which names a map uses is told by its keys; a map mixing both is refused", "[map_names]") {
  const auto table = vit_like();
  using accel::MapNames;
  CHECK(accel::detect_map_names(accel::DeviceMap::from_json(R"({"vit.layers.0": 0, "classifier": 1})"), table) == MapNames::model);
  CHECK(accel::detect_map_names(accel::DeviceMap::from_json(R"({"vit.encoder.layer.0": 0, "classifier": 1})"), table) ==
        MapNames::checkpoint);
  CHECK(accel::detect_map_names(accel::DeviceMap::from_json(R"({"": 0})"), table) == MapNames::model);
  CHECK(accel::detect_map_names(accel::DeviceMap::from_json(R"({"lm_head": 0, "unknown": 1})"), table) == MapNames::model);
  SECTION("names the model has beyond the checkpoint (tied copies) count as model names") {
    CHECK(accel::detect_map_names(accel::DeviceMap::from_json(R"({"tied_head": 0, "embed_out": 1})"), table) == MapNames::checkpoint);
    CHECK_THROWS_WITH(accel::detect_map_names(accel::DeviceMap::from_json(R"({"tied_head": 0, "embed_out": 1})"), table,
                                              {"tied_head.weight"}),
                      accel_test::contains("mixes model names ('tied_head') and checkpoint names ('embed_out')"));
  }
  CHECK_THROWS_AS(accel::detect_map_names(accel::DeviceMap::from_json(R"({"vit.layers.0": 0, "vit.encoder.layer.1": 1})"), table),
                  accel::config_error);
  CHECK(accel::parse_map_names("checkpoint") == MapNames::checkpoint);
  CHECK_THROWS_AS(accel::parse_map_names("hub"), accel::usage_error);
}
