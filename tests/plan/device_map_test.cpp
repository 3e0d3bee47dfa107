// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/plan/device_map.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"

using accel::DType;
using accel::Placement;

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

namespace {
// {"m.0": 0, "m.1": "cpu", ...}: `count` keys, every third on cpu.
std::string large_map_json(std::size_t count) {
  std::string text = "{";
  for (std::size_t i = 0; i < count; ++i)
    text += (i ? ", \"m." : "\"m.") + std::to_string(i) + (i % 3 == 1 ? "\": \"cpu\"" : "\": 0");
  return text + "}";
}
}  // namespace

TEST_CASE("a device map of half a million keys reads and writes in file order in linear time", "[plan][device_map][sizes]") {
  // nlohmann's ordered_json finds each key by a linear search: 200,000 keys (5.9 MB) took minutes to
  // read, half a million would take most of an hour (the ctest TIMEOUT fails that), and writing the
  // map back through it was as slow.
  constexpr std::size_t count = 500'000;
  const auto map = accel::DeviceMap::from_json(large_map_json(count));
  REQUIRE(map.size() == count);
  for (std::size_t i : {std::size_t{0}, std::size_t{1}, std::size_t{2}, count / 2, count - 1}) {
    CHECK(map.entries()[i].first == "m." + std::to_string(i));
    CHECK(map.entries()[i].second == (i % 3 == 1 ? Placement::cpu() : Placement::gpu(0)));
  }
  const auto again = accel::DeviceMap::from_json(map.to_json_string());
  CHECK(again.entries() == map.entries());
}

TEST_CASE("a device map past the entry limit or with a key deeper than any name is refused by name", "[plan][device_map][sizes]") {
  using accel_test::contains;
  REQUIRE(accel::device_map_max_entries >= 4'000'000);  // a few million keys must read
  CHECK(accel::DeviceMap::from_json(large_map_json(3), 3).size() == 3);
  REQUIRE_THROWS_AS(accel::DeviceMap::from_json(large_map_json(4), 3), accel::config_error);
  REQUIRE_THROWS_WITH(accel::DeviceMap::from_json(large_map_json(4), 3), contains("device map has more than 3 entries"));
  std::string deep = "a";
  for (std::size_t i = 1; i < accel::max_name_parts; ++i) deep += ".a";
  CHECK(accel::DeviceMap::from_json(R"({")" + deep + R"(": 0})").size() == 1);
  REQUIRE_THROWS_WITH(accel::DeviceMap::from_json(R"({"x": 0, ")" + deep + R"(.a": 0})"),
                      contains("device map key 'a.a.a") && contains("has 65 dotted parts, more than the 64"));
}

TEST_CASE("the one-pass device map reader words every refusal as the strict parse does", "[plan][device_map]") {
  using accel_test::contains;
  auto refusal = [](std::string_view text) {
    try {
      (void)accel::DeviceMap::from_json(text);
    } catch (const accel::config_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(accel::DeviceMap::from_json("{}").empty());
  CHECK(accel::DeviceMap::from_json(R"( {"a": "cuda:2", "b": "3", "": "disk"} )").to_json_string() == R"({"a":2,"b":3,"":"disk"})");
  CHECK_THAT(refusal(""), contains("device map is not valid JSON"));
  CHECK_THAT(refusal(R"({"a": 0} x)"), contains("device map is not valid JSON"));
  CHECK_THAT(refusal(R"({"a": "meta", "b": )"), contains("device map is not valid JSON"));  // the syntax first
  CHECK_THAT(refusal(R"({"a": "meta", "b": 0, "b": 1})"), contains("duplicate key 'b'"));  // then duplicates
  CHECK_THAT(refusal(R"("cpu")"), contains("device map is a JSON string, not an object"));
  CHECK_THAT(refusal("[0]"), contains("device map is a JSON array, not an object"));
  CHECK_THAT(refusal("3"), contains("device map is a JSON number, not an object"));
  // Then the first bad entry in file order.
  CHECK_THAT(refusal(R"({"a": 0, "b": {"c": 1}, "d": "meta"})"), contains("device map value for 'b' is {\"c\": 1}"));
  CHECK_THAT(refusal(R"({"a": [0]})"), contains("device map value for 'a' is [0]"));
  CHECK_THAT(refusal(R"({"a": 1.5})"), contains("device map value for 'a' is 1.5"));
  CHECK_THAT(refusal(R"({"a": true})"), contains("device map value for 'a' is true"));
  CHECK_THAT(refusal(R"({"a": null})"), contains("device map value for 'a' is null"));
  CHECK_THAT(refusal(R"({"a": -0})"), contains("device map value for 'a' is 0"));
  CHECK_THAT(refusal(R"({"a": 1048576})"), contains("device map value for 'a' is 1048576"));
  CHECK_THAT(refusal(R"({"a": "cuda:-1"})"), contains("device map value for 'a' is \"cuda:-1\""));
  CHECK_THAT(refusal("{\"a\": \"\xff\"}"), contains("device map is not valid JSON"));
}

TEST_CASE("classify_unused_keys answers each key of a large map with one lookup", "[plan][device_map][sizes]") {
  // Half a million modules holding only computed buffers, each a key: a scan of the tree per key
  // (2.5e11 steps) would far outlast the ctest TIMEOUT.
  constexpr std::size_t count = 500'000;
  accel::ModuleTree t;
  t.reserve(count, count + 1);
  std::vector<std::string> keys;
  keys.reserve(count + 2);
  for (std::size_t i = 0; i < count; ++i) {
    keys.push_back("r" + std::to_string(i));
    t.add_buffer(keys.back() + ".inv_freq", DType::F32, {1}, false);
  }
  t.add_parameter("r7.scale", DType::F32, {1});  // stored: r7 has something to load
  keys.push_back("nothing");
  const auto u = accel::classify_unused_keys(t, keys);
  CHECK(u.model_only.size() == count - 1);
  CHECK(u.unknown == std::vector<std::string>{"r7", "nothing"});
}

TEST_CASE("covering a name of a million dotted parts looks up only prefixes some key is as long as", "[plan][device_map][sizes]") {
  // A loader given a checkpoint directly (no tree, so no depth limit) asks which key covers each
  // tensor: hashing each of a 2 MB name's million prefixes would take many minutes.
  std::string name = "a";
  for (int i = 1; i < 1'000'000; ++i) name += ".a";
  const auto map = accel::DeviceMap::from_json(R"({"a.a": 1, "b": "cpu"})");
  const auto* c = map.covering(name);
  REQUIRE(c != nullptr);
  CHECK(c->first == "a.a");
  CHECK(map.placement_of(name) == Placement::gpu(1));
  CHECK(map.find(name) == nullptr);
  CHECK(accel::DeviceMap::from_json(R"({"x": 0})").covering(name) == nullptr);
  CHECK(accel::DeviceMap::from_json(R"({"": "disk"})").covering(name)->second == Placement::disk());
}
