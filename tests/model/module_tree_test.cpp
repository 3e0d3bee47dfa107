// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/model/checkpoint_tree.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/skeleton.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/models.hpp"
#include "support/safetensors_writer.hpp"

using accel::DType;

namespace {
using accel_test::model_for_test;
std::uint64_t module_size(const accel::ModuleTree& t, const accel::ModuleSizes& s, const char* name) {
  return s.module[*t.find_module(name)];
}
}  // namespace

TEST_CASE("module sizes match accelerate's worked values in fp32 and after half()", "[module_tree]") {
  auto t = model_for_test();
  auto s = accel::compute_module_sizes(t);
  CHECK(module_size(t, s, "linear1") == 64);
  CHECK(module_size(t, s, "batchnorm") == 72);
  CHECK(module_size(t, s, "linear2") == 100);
  CHECK(s.total() == 236);
  CHECK(s.module_buffers[0] == 40);
  auto h = accel::compute_module_sizes(t, {.dtype = DType::F16});
  CHECK(module_size(t, h, "batchnorm") == 40);  // num_batches_tracked stays int64
  CHECK(h.total() == 122);
  // Tensors count at the dtype they are loaded in, up as well as down (228 floating bytes → 456).
  CHECK(accel::compute_module_sizes(t, {.dtype = DType::F64}).total() == 464);
  // accelerate's rule counts min(target, own): a larger target never increases the count.
  CHECK(accel::compute_module_sizes(t, {.dtype = DType::F64, .accelerate_rule = true}).total() == 236);
  CHECK(accel::compute_module_sizes(t, {.dtype = DType::F16, .accelerate_rule = true}).total() == 122);
}

TEST_CASE("special dtypes and keep-in-fp32 override the target dtype", "[module_tree]") {
  auto t = model_for_test();
  accel::SizeOptions o{.dtype = DType::F16};
  o.special_dtypes.emplace("batchnorm.num_batches_tracked", DType::I32);
  o.keep_in_fp32 = {"linear2"};
  auto s = accel::compute_module_sizes(t, o);
  CHECK(module_size(t, s, "batchnorm") == 36);
  CHECK(module_size(t, s, "linear2") == 100);
  CHECK(module_size(t, s, "linear1") == 32);
  accel::SizeOptions f8{.dtype = DType::F8_E4M3};
  CHECK(accel::compute_module_sizes(t, f8).total() == 236 / 4 - 2 + 8);
}

TEST_CASE("aliased and tied tensors are counted once under the first name in model order", "[module_tree]") {
  accel::ModuleTree t;
  t.add_parameter("model.embed.weight", DType::F16, {100, 8});
  t.add_parameter("model.layers.0.w", DType::F16, {8, 8});
  t.add_alias("lm_head.weight", "model.embed.weight");
  auto ix = accel::index_tree(t);
  auto s = accel::compute_module_sizes(t, ix);
  CHECK(s.total() == 1600 + 128);
  CHECK(s.tensor[*t.find_tensor("lm_head.weight")] == 0);
  CHECK(module_size(t, s, "lm_head") == 0);
  REQUIRE(ix.tied_groups.size() == 1);
  CHECK(ix.tied_groups[0] == std::vector<std::uint32_t>{0, 2});
  CHECK(ix.canonical[2] == 0);
  REQUIRE_THROWS_WITH(t.add_alias("x.w", "nope"), accel_test::contains("refers to tensor 'nope', which does not exist"));
  t.add_parameter("other.w", DType::F32, {100, 8});
  REQUIRE_THROWS_WITH(t.tie({"other.w", "model.embed.weight"}), accel_test::contains("differ in dtype or shape"));
}

// transformers counts the tensor the others are tied to, as a checkpoint holds it (Csm: the
// backbone's audio embedding, first in model order, is a copy of the depth decoder's).
TEST_CASE("a tied copy first in model order counts nothing; the tensor it is tied to counts", "[module_tree]") {
  for (bool marked_after : {false, true}) {
    accel::ModuleTree t;
    t.add_parameter("backbone.embed_audio.weight", DType::F16, {64, 8});
    t.add_parameter("backbone.layers.0.w", DType::F16, {8, 8});
    t.add_parameter("depth.embed.weight", DType::F16, {64, 8});
    if (marked_after) {  // as a checkpoint tree marks the copies it makes, then ties the group
      t.tie({"backbone.embed_audio.weight", "depth.embed.weight"});
      t.mark_tied_copy(*t.find_tensor("backbone.embed_audio.weight"));
    } else {
      t.tie({"backbone.embed_audio.weight", "depth.embed.weight"});
    }
    auto ix = accel::index_tree(t);
    auto s = accel::compute_module_sizes(t, ix);
    CHECK(s.total() == 1024 + 128);
    const auto held = marked_after ? "depth.embed.weight" : "backbone.embed_audio.weight";
    CHECK(ix.canonical[*t.find_tensor("backbone.embed_audio.weight")] == *t.find_tensor(held));
    CHECK(module_size(t, s, "depth") == (marked_after ? 1024u : 0u));
    CHECK(module_size(t, s, "backbone") == (marked_after ? 128u : 1024u + 128u));
  }
  accel::ModuleTree t;  // add_alias marks the name it adds
  t.add_parameter("depth.embed.weight", DType::F16, {64, 8});
  t.add_alias("backbone.embed_audio.weight", "depth.embed.weight");
  t.add_module("backbone.layers.0");
  CHECK(t.tensors()[*t.find_tensor("backbone.embed_audio.weight")].tied_copy);
  CHECK_FALSE(t.tensors()[*t.find_tensor("depth.embed.weight")].tied_copy);
  REQUIRE_THROWS_WITH(t.mark_tied_copy(99), accel_test::contains("tensor id 99 does not exist"));
}

TEST_CASE("the model order visits parameters, then children, then buffers", "[module_tree]") {
  accel::ModuleTree t;
  t.add_buffer("b", DType::F32, {1});
  t.add_parameter("m.c.w", DType::F32, {1});
  t.add_parameter("p", DType::F32, {1});
  auto ix = accel::index_tree(t);
  // root(0), p(1), m(2), m.c(3), m.c.w(4), b(5)
  CHECK(ix.tensor_rank[*t.find_tensor("p")] == 1);
  CHECK(ix.module_rank[*t.find_module("m")] == 2);
  CHECK(ix.tensor_rank[*t.find_tensor("m.c.w")] == 4);
  CHECK(ix.tensor_rank[*t.find_tensor("b")] == 5);
  CHECK(ix.module_end[*t.find_module("m")] == 5);
  CHECK(ix.contains(*t.find_module("m"), *t.find_tensor("m.c.w")));
  CHECK_FALSE(ix.contains(*t.find_module("m"), *t.find_tensor("b")));
}

TEST_CASE("the builder rejects duplicate, clashing and malformed names", "[module_tree]") {
  accel::ModuleTree t;
  t.add_parameter("a.w", DType::F32, {2});
  REQUIRE_THROWS_WITH(t.add_parameter("a.w", DType::F32, {2}), accel_test::contains("tensor 'a.w' is registered twice"));
  REQUIRE_THROWS_WITH(t.add_module("a.w"), accel_test::contains("module name 'a.w' is already a tensor's name"));
  REQUIRE_THROWS_WITH(t.add_parameter("a", DType::F32, {2}), accel_test::contains("tensor name 'a' is already a module's name"));
  REQUIRE_THROWS_WITH(t.add_parameter("a..w", DType::F32, {2}), accel_test::contains("has an empty component"));
  REQUIRE_THROWS_WITH(t.add_parameter("b.w", DType::F32, {-2}), accel_test::contains("negative dimension -2"));
  t.add_module("a", "Linear");
  REQUIRE_THROWS_WITH(t.add_module("a", "Conv"), accel_test::contains("already has class 'Linear'"));
}

TEST_CASE("no-split blocks come from classes, glob patterns or numbered children", "[module_tree]") {
  accel::ModuleTree t;
  t.add_module("model.layers.0", "Block");
  t.add_parameter("model.layers.0.w", DType::F32, {1});
  t.add_parameter("model.layers.1.w", DType::F32, {1});
  t.add_parameter("model.norm.w", DType::F32, {1});
  auto id = [&](const char* n) { return *t.find_module(n); };
  auto by_class = accel::no_split_modules(t, {"Block"});
  CHECK(by_class[id("model.layers.0")]);
  CHECK_FALSE(by_class[id("model.layers.1")]);
  auto by_glob = accel::no_split_modules(t, {"model.layers.*"});
  CHECK(by_glob[id("model.layers.0")]);
  CHECK(by_glob[id("model.layers.1")]);
  CHECK_FALSE(by_glob[id("model.layers")]);
  auto automatic = accel::no_split_modules(t, {});
  CHECK(automatic[id("model.layers.1")]);
  CHECK_FALSE(automatic[id("model.norm")]);
  CHECK_FALSE(accel::no_split_modules(t, {}, false)[id("model.layers.1")]);
  CHECK(accel::glob_match("a.*.c", "a.b.x.c"));
  CHECK(accel::glob_match("a.?", "a.1"));
  CHECK_FALSE(accel::glob_match("a.?", "a.12"));
}

TEST_CASE("a skeleton JSON builds the tree with classes, buffers, aliases and ties", "[module_tree]") {
  auto t = accel::skeleton_from_json(R"({
    "modules": [{"name": "", "class": "LlamaForCausalLM"}, {"name": "model.layers.0", "class": "LlamaDecoderLayer"}],
    "parameters": [{"name": "model.embed_tokens.weight", "shape": [32, 4], "dtype": "float16"},
                   {"name": "model.layers.0.mlp.up_proj.weight", "shape": [8, 4], "dtype": "BF16"},
                   {"name": "lm_head.weight", "alias_of": "model.embed_tokens.weight"},
                   {"name": "x.a", "shape": [2], "dtype": "float32"}, {"name": "x.b", "shape": [2], "dtype": "float32"}],
    "buffers": [{"name": "model.rotary_emb.inv_freq", "shape": [2], "dtype": "float32", "persistent": false}],
    "tied": [["x.a", "x.b"]], "extra": 1})");
  CHECK(t.modules()[0].class_name == "LlamaForCausalLM");
  CHECK(t.modules()[*t.find_module("model.layers.0")].class_name == "LlamaDecoderLayer");
  auto head = t.tensors()[*t.find_tensor("lm_head.weight")];
  CHECK(head.shape == std::vector<std::int64_t>{32, 4});
  CHECK(head.dtype == DType::F16);
  CHECK_FALSE(t.tensors()[*t.find_tensor("model.rotary_emb.inv_freq")].persistent);
  CHECK(t.tensors()[*t.find_tensor("model.rotary_emb.inv_freq")].buffer);
  auto ix = accel::index_tree(t);
  CHECK(ix.tied_groups.size() == 2);
  CHECK(accel::compute_module_sizes(t, ix).total() == 256 + 64 + 8 + 8);
}

TEST_CASE("a malformed skeleton is a config error naming the field", "[module_tree]") {
  using accel_test::contains;
  auto bad = [](const std::string& text) { return accel::skeleton_from_json(text, "s.json"); };
  REQUIRE_THROWS_AS(bad("[]"), accel::config_error);
  REQUIRE_THROWS_WITH(bad("[]"), contains("malformed model skeleton 's.json': the top level is a JSON array"));
  REQUIRE_THROWS_WITH(bad("{"), contains("is not valid JSON"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": {}})"), contains("parameters is a JSON object, not an array"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"shape": [1], "dtype": "F32"}]})"), contains("parameters[0] has no 'name'"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"name": "w", "dtype": "F32"}]})"), contains("parameters[0] has no 'shape'"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"name": "w", "shape": [1]}]})"), contains("parameters[0] has no 'dtype'"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"name": "w", "shape": [1, -3], "dtype": "F32"}]})"),
                      contains("parameters[0].shape[1] is -3, not a non-negative integer"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"name": "w", "shape": [1], "dtype": "float17"}]})"),
                      contains("parameters[0].dtype is 'float17', not a known dtype"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"name": "w", "shape": [1], "dtype": 16}]})"),
                      contains("parameters[0].dtype is a JSON number, not a string"));
  REQUIRE_THROWS_WITH(bad(R"({"buffers": [{"name": "b", "shape": [1], "dtype": "F32", "persistent": "no"}]})"),
                      contains("buffers[0].persistent is \"no\", not true or false"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"name": "w", "shape": [1], "dtype": "F32"}, {"name": "w", "shape": [1], "dtype": "F32"}]})"),
                      contains("parameters[1] is invalid: [accel.usage] tensor 'w' is registered twice"));
  REQUIRE_THROWS_WITH(bad(R"({"parameters": [{"name": "h", "alias_of": "nope"}]})"),
                      contains("alias_of of 'h' is invalid"));
  REQUIRE_THROWS_WITH(bad(R"({"tied": [["a", "b"]]})"), contains("tied[0] is invalid: [accel.usage] tied tensor 'a' does not exist"));
  REQUIRE_THROWS_WITH(bad(R"({"tied": ["a"]})"), contains("tied[0] is a JSON string, not an array of tensor names"));
  REQUIRE_THROWS_WITH(bad(R"({"modules": [{"class": "X"}]})"), contains("modules[0] has no string 'name'"));
  REQUIRE_THROWS_WITH(bad(R"({"modules": [{"name": "a", "class": 3}]})"), contains("modules[0].class is a JSON number"));
  REQUIRE_THROWS_WITH(bad(R"({"modules": [], "modules": []})"), contains("duplicate key 'modules'"));
  REQUIRE_THROWS_WITH(accel::read_skeleton("/nonexistent/s.json"), contains("cannot read model skeleton '/nonexistent/s.json'"));
}

TEST_CASE("a checkpoint tree orders embeddings first, layers numerically and heads last", "[module_tree]") {
  accel_test::TempDir dir;
  std::vector<accel_test::TensorSpec> specs;
  for (const char* n : {"lm_head.weight", "model.layers.10.w", "model.layers.2.w", "model.norm.weight",
                        "model.embed_tokens.weight", "model.layers.2.b"})
    specs.push_back({n, DType::BF16, {4, 4}, {}});
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  auto t = accel::read_checkpoint_tree(dir.path());
  auto ix = accel::index_tree(t);
  std::vector<std::string> order(t.tensors().size());
  for (std::size_t i = 0; i < t.tensors().size(); ++i) order[i] = t.tensors()[i].name;
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return ix.tensor_rank[*t.find_tensor(a)] < ix.tensor_rank[*t.find_tensor(b)];
  });
  CHECK(order == std::vector<std::string>{"model.embed_tokens.weight", "model.layers.2.b", "model.layers.2.w",
                                          "model.layers.10.w", "model.norm.weight", "lm_head.weight"});
  CHECK_FALSE(t.has_ties());  // no config.json: no tie added
}

TEST_CASE("config.json tie_word_embeddings ties a missing lm_head to the embedding", "[module_tree]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors",
                                {{"model.embed_tokens.weight", DType::F16, {16, 4}, {}}, {"model.layers.0.w", DType::F16, {4, 4}, {}}});
  accel_test::write_text(dir / "config.json", R"({"model_type": "llama"})");  // absent key: transformers default true
  auto t = accel::read_checkpoint_tree(dir.path());
  REQUIRE(t.find_tensor("lm_head.weight"));
  CHECK(accel::compute_module_sizes(t).total() == 128 + 32);
  CHECK(accel::index_tree(t).tied_groups.size() == 1);
  accel_test::write_text(dir / "config.json", R"({"tie_word_embeddings": false})");
  CHECK_FALSE(accel::read_checkpoint_tree(dir.path()).find_tensor("lm_head.weight"));
  CHECK(accel::read_checkpoint_tree(dir.path(), {.tie_word_embeddings = true}).find_tensor("lm_head.weight"));
  accel_test::write_text(dir / "config.json", R"({"tie_word_embeddings": "yes"})");
  REQUIRE_THROWS_WITH(accel::read_checkpoint_tree(dir.path()), accel_test::contains("tie_word_embeddings is \"yes\""));
}

TEST_CASE("a tree written as skeleton JSON reads back the same", "[module_tree]") {
  auto t = accel::skeleton_from_json(R"({
    "modules": [{"name": "", "class": "M"}, {"name": "a", "class": "Block"}],
    "parameters": [{"name": "a.w", "shape": [2, 3], "dtype": "bfloat16"}, {"name": "b.w", "shape": [2, 3], "dtype": "bfloat16"}],
    "buffers": [{"name": "a.s", "shape": [1], "dtype": "int64", "persistent": false}],
    "tied": [["a.w", "b.w"]]})");
  const auto text = accel::to_skeleton_json(t);
  auto back = accel::skeleton_from_json(text);
  CHECK(accel::to_skeleton_json(back) == text);
  CHECK(text.find(R"("tied":[["a.w","b.w"]])") != std::string::npos);
  CHECK(back.modules()[*back.find_module("a")].class_name == "Block");
}

TEST_CASE("the largest layer is a block, a leaf module or a loose tensor", "[module_tree]") {
  accel::ModuleTree t;
  t.add_parameter("big", DType::F32, {100});               // loose root tensor: 400
  t.add_parameter("m.layers.0.a.w", DType::F32, {30});     // block 0: 120 + 120
  t.add_parameter("m.layers.0.b.w", DType::F32, {30});
  t.add_parameter("m.head.w", DType::F32, {50});           // leaf module: 200
  auto sizes = accel::compute_module_sizes(t);
  auto blocks = accel::no_split_modules(t, {});
  auto l = accel::largest_layer(t, sizes, blocks);
  CHECK(l.name == "big");
  CHECK(l.bytes == 400);
  accel::ModuleTree u;
  u.add_parameter("m.layers.0.a.w", DType::F32, {30});
  u.add_parameter("m.layers.0.b.w", DType::F32, {30});
  auto us = accel::compute_module_sizes(u);
  CHECK(accel::largest_layer(u, us, accel::no_split_modules(u, {})).name == "m.layers.0");
  CHECK(accel::largest_layer(u, us, accel::no_split_modules(u, {}, false)).name == "m.layers.0.a");
}

TEST_CASE("the cached model order follows later changes to the tree", "[module_tree]") {
  accel::ModuleTree t;
  t.add_parameter("a.w", DType::F32, {1});
  auto first = t.index();
  CHECK(first->tensor_rank.size() == 1);
  t.add_parameter("b.w", DType::F32, {1});
  CHECK(t.index()->tensor_rank.size() == 2);
  CHECK(first->tensor_rank.size() == 1);  // an old snapshot stays valid
  accel::ModuleTree copy = t;
  CHECK(copy.index()->tensor_rank.size() == 2);
}

namespace {
// `parts` dotted parts: "a.a.…" (the last one is the tensor's own name).
std::string dotted_name(std::size_t parts) {
  std::string name = "a";
  for (std::size_t i = 1; i < parts; ++i) name += ".a";
  return name;
}
}  // namespace

TEST_CASE("a name of more dotted parts than max_name_parts is refused before any module is made", "[module_tree][sizes]") {
  using accel_test::contains;
  // Every module keeps its whole name, so a name of d parts costs d prefixes: 80,000 parts (160 KB)
  // took 50 s and 6 GB through the builder's recursion. 1,000 parts are refused at once.
  accel::ModuleTree t;
  const auto deep = dotted_name(1000);
  REQUIRE_THROWS_AS(t.add_parameter(deep, DType::F32, {1}), accel::usage_error);
  REQUIRE_THROWS_WITH(t.add_parameter(deep, DType::F32, {1}),
                      contains("has 1000 dotted parts, more than the 64 a name may have") && contains("(1999 characters)"));
  REQUIRE_THROWS_WITH(t.add_module(deep), contains("module name 'a.a.a") && contains("has 1000 dotted parts"));
  CHECK(t.modules().size() == 1);
  CHECK(t.tensors().empty());
  // A skeleton says which entry (a config error, as any malformed skeleton).
  REQUIRE_THROWS_WITH(accel::skeleton_from_json(R"({"parameters": [{"name": ")" + deep + R"(", "shape": [1], "dtype": "F32"}]})", "s.json"),
                      contains("parameters[0] is invalid") && contains("1000 dotted parts"));
}

TEST_CASE("a name of max_name_parts parts builds its ancestors outermost first, each under its prefix", "[module_tree][sizes]") {
  accel::ModuleTree t;
  REQUIRE(accel::max_name_parts == 64);
  const auto name = dotted_name(accel::max_name_parts);
  const auto id = t.add_parameter(name, DType::F32, {1});
  REQUIRE(t.modules().size() == accel::max_name_parts);  // the root and 63 modules
  const auto& mods = t.modules();
  for (std::size_t m = 1; m < mods.size(); ++m) {
    CHECK(mods[m].name == dotted_name(m));
    CHECK(mods[m].parent == m - 1);
    CHECK(mods[m - 1].children == std::vector<std::size_t>{m});
    CHECK(t.find_module(mods[m].name) == m);
  }
  CHECK(t.tensors()[id].module == mods.size() - 1);
  // A class goes to the module named, not to the ancestors made for it.
  CHECK(t.add_module("x.y.z", "Block") == mods.size() + 2);
  CHECK(t.modules()[*t.find_module("x.y.z")].class_name == "Block");
  CHECK(t.modules()[*t.find_module("x.y")].class_name.empty());
  CHECK(t.modules()[*t.find_module("x.y")].parent == *t.find_module("x"));
  // Every missing ancestor is checked before any is added.
  t.add_parameter("p.w", DType::F32, {1});
  const auto before = t.modules().size();
  REQUIRE_THROWS_WITH(t.add_module("p.w.x.y"), accel_test::contains("module name 'p.w' is already a tensor's name"));
  CHECK(t.modules().size() == before);
  CHECK_FALSE(t.find_module("p.w.x"));
}

TEST_CASE("a checkpoint tensor of more dotted parts than max_name_parts is a checkpoint error naming its file", "[module_tree][sizes]") {
  using accel_test::contains;
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{dotted_name(1000), DType::F32, {1}, {}}, {"b.weight", DType::F32, {1}, {}}});
  REQUIRE_THROWS_AS(accel::read_checkpoint_model(dir.path()), accel::checkpoint_error);
  REQUIRE_THROWS_WITH(accel::read_checkpoint_model(dir.path()),
                      contains("model.safetensors has 1000 dotted parts, more than the 64 a module path may have") &&
                          contains("rename or drop that tensor"));
  accel_test::write_safetensors(dir / "model.safetensors", {{dotted_name(64), DType::F32, {1}, {}}});
  CHECK(accel::read_checkpoint_model(dir.path()).tree.modules().size() == 64);
}
