// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/model/names.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"

namespace {

const accel::ClassNames& names_of(std::string_view cls) {
  const auto* n = accel::find_class_names(cls);
  REQUIRE(n != nullptr);
  return *n;
}

std::string model_name(std::string_view cls, std::string_view checkpoint_name) {
  return accel::NameMapper(names_of(cls)).to_model(checkpoint_name).model;
}

}  // namespace

TEST_CASE("a ViT Hub folder's names become the model's: blocks, attention and MLP renamed", "[names][vit]") {
  const auto& vit = names_of("ViTForImageClassification");
  CHECK(vit.exact);
  CHECK(vit.base_model_prefix == "vit");
  const accel::NameMapper m(vit);
  CHECK(m.to_model("vit.encoder.layer.11.attention.attention.query.weight").model == "vit.layers.11.attention.q_proj.weight");
  CHECK(m.to_model("vit.encoder.layer.3.attention.output.dense.bias").model == "vit.layers.3.attention.o_proj.bias");
  CHECK(m.to_model("vit.encoder.layer.3.intermediate.dense.weight").model == "vit.layers.3.mlp.fc1.weight");
  CHECK(m.to_model("vit.encoder.layer.3.output.dense.weight").model == "vit.layers.3.mlp.fc2.weight");
  CHECK(m.to_model("vit.encoder.layer.3.layernorm_before.weight").model == "vit.layers.3.layernorm_before.weight");
  SECTION("names nothing renames stay, and a folder already in model names is left alone") {
    CHECK(m.to_model("classifier.weight").model == "classifier.weight");
    CHECK(m.to_model("vit.embeddings.cls_token").model == "vit.embeddings.cls_token");
    CHECK(m.to_model("vit.layers.3.mlp.fc2.weight").model == "vit.layers.3.mlp.fc2.weight");
    CHECK(m.to_model("vit.layers.3.mlp.fc2.weight").rule == -1);
  }
  SECTION("a base-model checkpoint loaded into the classifier gets the prefix, as transformers does") {
    CHECK(m.to_model("encoder.layer.0.output.dense.weight").model == "vit.layers.0.mlp.fc2.weight");
    CHECK(m.to_model("embeddings.cls_token").model == "vit.embeddings.cls_token");
  }
  SECTION("and a classifier checkpoint loaded into the base model loses it") {
    CHECK(model_name("ViTModel", "vit.encoder.layer.0.output.dense.weight") == "layers.0.mlp.fc2.weight");
    CHECK(model_name("ViTModel", "encoder.layer.0.output.dense.weight") == "layers.0.mlp.fc2.weight");
  }
}

TEST_CASE("vision-language and renamed heads: Llava's towers move under model, GPT-NeoX's embed_out is lm_head", "[names]") {
  CHECK(model_name("LlavaForConditionalGeneration", "language_model.model.layers.2.mlp.up_proj.weight") ==
        "model.language_model.layers.2.mlp.up_proj.weight");
  CHECK(model_name("LlavaForConditionalGeneration", "language_model.lm_head.weight") == "lm_head.weight");
  CHECK(model_name("LlavaForConditionalGeneration", "vision_tower.encoder.layers.0.mlp.fc1.bias") ==
        "model.vision_tower.encoder.layers.0.mlp.fc1.bias");
  CHECK(model_name("LlavaForConditionalGeneration", "multi_modal_projector.linear_1.weight") ==
        "model.multi_modal_projector.linear_1.weight");
  CHECK(model_name("LlavaForConditionalGeneration", "model.language_model.norm.weight") == "model.language_model.norm.weight");
  CHECK(model_name("GPTNeoXForCausalLM", "embed_out.weight") == "lm_head.weight");
  CHECK(model_name("GPTNeoXForCausalLM", "gpt_neox.layers.0.mlp.dense_h_to_4h.weight") == "gpt_neox.layers.0.mlp.dense_h_to_4h.weight");
  CHECK(model_name("LlamaForCausalLM", "model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight");
}

TEST_CASE("expert tensors fuse: every Mixtral expert's w1 and w3 make one gate_up_proj", "[names][moe]") {
  const accel::NameMapper m(names_of("MixtralForCausalLM"));
  const auto w1 = m.to_model("model.layers.1.block_sparse_moe.experts.7.w1.weight");
  CHECK(w1.model == "model.layers.1.mlp.experts.gate_up_proj");
  CHECK(w1.fused);
  CHECK(m.to_model("model.layers.1.block_sparse_moe.experts.0.w3.weight").model == "model.layers.1.mlp.experts.gate_up_proj");
  CHECK(m.to_model("model.layers.1.block_sparse_moe.experts.0.w2.weight").model == "model.layers.1.mlp.experts.down_proj");
  const auto gate = m.to_model("model.layers.1.block_sparse_moe.gate.weight");
  CHECK(gate.model == "model.layers.1.mlp.gate.weight");
  CHECK_FALSE(gate.fused);
  CHECK(model_name("Qwen3MoeForCausalLM", "model.layers.5.mlp.experts.127.down_proj.weight") == "model.layers.5.mlp.experts.down_proj");
  CHECK(model_name("DeepseekV3ForCausalLM", "model.layers.5.mlp.experts.255.up_proj.weight") == "model.layers.5.mlp.experts.gate_up_proj");
}

TEST_CASE("the rule with the longest matching prefix wins; written-out numbers before placeholders", "[names]") {
  accel::ClassNames n;
  n.class_name = "Toy";
  n.renames = {{"a.mlp.0", "a.fc1"}, {"a.mlp.{i}", "a.fc2"}, {"a.{i}.x.y", "b.{i}.z"}, {"a.{i}.x", "b.{i}"}, {"c", "d.c"}};
  const accel::NameMapper m(n);
  CHECK(m.to_model("a.mlp.0.weight").model == "a.fc1.weight");
  CHECK(m.to_model("a.mlp.2.weight").model == "a.fc2.weight");
  CHECK(m.to_model("a.4.x.y.bias").model == "b.4.z.bias");
  CHECK(m.to_model("a.4.x.w").model == "b.4.w");
  CHECK(m.to_model("a.4.q").model == "a.4.q");
  CHECK(m.to_model("c").model == "d.c");
  CHECK(m.to_model("cc.w").model == "cc.w");  // whole parts only
  CHECK(m.to_model("a.x4.x.w").model == "a.x4.x.w");
}

TEST_CASE("numbers inside a part, numbers plus a constant and written-out model numbers", "[names]") {
  accel::ClassNames n;
  n.class_name = "Toy";
  n.renames = {{"m.res.queries.{i}", "m.layers.{i+1}.input.query"},
               {"m.visual.layers.linear_{i}", "m.tower.encoder_layers.{i}.projection"},
               {"m.audio.conv2d{i}", "m.audio.convs.{i-1}"},
               {"m.layers.{i}.fc1", "m.layers.{i}.mlp.layers.0"}};
  const accel::NameMapper m(n);
  CHECK(m.to_model("m.res.queries.0").model == "m.layers.1.input.query");
  CHECK(m.to_model("m.res.queries.41").model == "m.layers.42.input.query");
  CHECK(m.to_model("m.visual.layers.linear_17.weight").model == "m.tower.encoder_layers.17.projection.weight");
  CHECK(m.to_model("m.audio.conv2d3.bias").model == "m.audio.convs.2.bias");
  CHECK(m.to_model("m.layers.5.fc1.weight").model == "m.layers.5.mlp.layers.0.weight");
  CHECK_FALSE(m.to_model("m.layers.5.fc1.weight").fused);
  // Only the text around the number and digits match.
  CHECK(m.to_model("m.visual.layers.linear_.weight").model == "m.visual.layers.linear_.weight");
  CHECK(m.to_model("m.visual.layers.linear_x1.weight").model == "m.visual.layers.linear_x1.weight");
  CHECK(m.to_model("m.audio.conv2d.bias").model == "m.audio.conv2d.bias");
  const std::vector<std::string_view> names{"m.res.queries.0", "m.res.queries.7", "m.visual.layers.linear_0.weight",
                                            "m.visual.layers.linear_23.weight", "m.audio.conv2d1.bias", "m.audio.conv2d2.bias"};
  const auto table = accel::name_table(&n, names);
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(table.model[i] == m.to_model(names[i]).model);
  // The classes transformers renames that way.
  CHECK(model_name("Inkling2ForCausalLM", "model.llm.attn_res.attn_queries.3") == "model.layers.4.attention_input.query");
  CHECK(model_name("Inkling2ForCausalLM", "model.llm.attn_res.mlp_queries.3") == "model.layers.3.mlp_input.query");
  CHECK(model_name("InklingForConditionalGeneration", "model.visual.layers.linear_11.weight") ==
        "model.vision_tower.encoder_layers.11.projection.weight");
  CHECK(model_name("Dots3NoteModel", "audio_encoder.dots_encoder.speech_encoder.conv2d2.weight") == "audio_tower.conv_stem.convs.1.weight");
  CHECK(model_name("HunYuanVLForConditionalGeneration", "vit.layers.3.mlp.dense_h_to_4h.weight") ==
        "model.vision_tower.layers.3.mlp.fc1.weight");
  CHECK(names_of("Inkling2ForCausalLM").exact);
}

TEST_CASE("a table of names maps each name as to_model does, though it decides once per name shape", "[names]") {
  // map_all decides once per shape (numbers set aside): numbers a rule or a root spells, a part
  // spelled "#", a base-model prefix added or dropped must not share a decision they should not.
  accel::ClassNames n;
  n.class_name = "Toy";
  n.base_model_prefix = "model";
  n.checkpoint_roots = {"lm_head", "model", "0"};
  n.model_roots = {"lm_head", "model"};
  n.base_roots = {"layers", "embed"};
  n.renames = {{"model.mlp.0", "model.fc1"}, {"model.mlp.{i}", "model.fc2"}, {"model.layers.{i}.experts.{j}.w1.weight", "model.layers.{i}.gate_up"}};
  const std::vector<std::string_view> names{"model.mlp.0.weight", "model.mlp.1.weight", "model.mlp.0.bias", "model.mlp.7.bias",
                                            "model.mlp.#.bias", "model.layers.3.experts.0.w1.weight", "model.layers.3.experts.9.w1.weight",
                                            "model.layers.4.experts.2.w2.weight", "layers.1.experts.2.w1.weight", "embed.weight",
                                            "0.weight", "1.weight", "model.lm_head.weight", "model.x", "lm_head.weight"};
  const auto table = accel::name_table(&n, names);
  const accel::NameMapper m(n);
  REQUIRE(table.model.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    CHECK(table.model[i] == m.to_model(names[i]).model);
  }
  CHECK(table.model[0] == "model.fc1.weight");
  CHECK(table.model[1] == "model.fc2.weight");
  CHECK(table.model[4] == "model.mlp.#.bias");
  CHECK(table.model[8] == "model.layers.1.gate_up");
  CHECK(table.model[12] == "model.lm_head.weight");  // `model` is a top-level name here: left alone
  // A head model's names loaded into the base model lose the prefix, shape or not.
  accel::ClassNames base;
  base.class_name = "ToyModel";
  base.base_model_prefix = "model";
  base.checkpoint_roots = base.model_roots = {"layers", "norm"};
  const std::vector<std::string_view> head_names{"model.layers.0.w", "model.layers.1.w", "layers.2.w", "model.norm.w", "model.x.w"};
  const auto dropped = accel::name_table(&base, head_names);
  CHECK(dropped.model == std::vector<std::string_view>{"layers.0.w", "layers.1.w", "layers.2.w", "norm.w", "model.x.w"});
  const accel::NameMapper mb(base);
  for (std::size_t i = 0; i < head_names.size(); ++i) CHECK(dropped.model[i] == mb.to_model(head_names[i]).model);
}

TEST_CASE("ties transformers makes are in the name data for classes outside the catalog", "[names]") {
  const auto& whisper = names_of("WhisperForConditionalGeneration");
  const auto& groups = whisper.tied(std::nullopt);
  REQUIRE(groups.size() == 1);
  CHECK(groups.front() == std::vector<std::string>{"model.decoder.embed_tokens.weight", "proj_out.weight"});
  CHECK(whisper.tied(false).empty());
}

TEST_CASE("a class transformers does not have has no names; the data says its transformers release", "[names]") {
  CHECK(accel::find_class_names("NoSuchModelForCausalLM") == nullptr);
  CHECK(accel::find_class_names("LlamaForCausal") == nullptr);
  CHECK_FALSE(accel::names_transformers_version().empty());
  const auto t = accel::name_table(nullptr, {"a.b", "c"});
  CHECK(t.identity());
  const auto v = accel::name_table(accel::find_class_names("GPTNeoXForCausalLM"), {"embed_out.weight", "gpt_neox.final_layer_norm.weight"});
  CHECK_FALSE(v.identity());
  CHECK(v.model == std::vector<std::string_view>{"lm_head.weight", "gpt_neox.final_layer_norm.weight"});
  CHECK(v.source.starts_with("GPTNeoXForCausalLM (transformers "));
}

TEST_CASE("names of more dotted parts than the mapper keeps on its stack map like short ones", "[names]") {
  // The parts of a name are kept in place up to 32 and on the heap past that: 31, 32, 33 and 40
  // parts, renamed (GPT-NeoX's embed_out) and not, by the table and by to_model alike.
  const auto* n = accel::find_class_names("GPTNeoXForCausalLM");
  REQUIRE(n);
  std::vector<std::string> owned;
  for (int parts : {31, 32, 33, 40}) {
    std::string tail;
    for (int i = 0; i < parts - 2; ++i) tail += ".p" + std::to_string(i);
    owned.push_back("embed_out" + tail + ".weight");
    owned.push_back("gpt_neox.layers.0" + tail.substr(0, tail.size() - 3) + ".weight");
  }
  const std::vector<std::string_view> names(owned.begin(), owned.end());
  const auto table = accel::name_table(n, names);
  const accel::NameMapper mapper(*n);
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    CHECK(table.model[i] == mapper.to_model(names[i]).model);
  }
  CHECK(table.model[6].starts_with("lm_head.p0.p1."));
  CHECK(table.model[6].ends_with(".p37.weight"));
}

TEST_CASE("the recent-views cache finds a key by its view, not by its text, and keeps the last few", "[names]") {
  const std::string a = "model.layers.0.mlp.experts.down_proj", same_text = a;
  accel::detail::RecentViews<int, 2> recent;
  CHECK(recent.find(a) == nullptr);
  recent.put(a, 1);
  REQUIRE(recent.find(a) != nullptr);
  CHECK(*recent.find(a) == 1);
  CHECK(recent.find(same_text) == nullptr);                    // equal text elsewhere: a miss, looked up the slow way
  CHECK(recent.find(std::string_view(a).substr(0, 5)) == nullptr);  // same start, other length
  recent.put(same_text, 2);
  recent.put("gate_up_proj", 3);  // a third key pushes out the first
  CHECK(recent.find(a) == nullptr);
  CHECK(*recent.find(same_text) == 2);
}

TEST_CASE("a name arena keeps each name once, whether it was kept just before or long ago", "[names]") {
  accel::NameArena arena;
  std::string scratch = "model.layers.0.mlp.experts.gate_up_proj";
  const auto first = arena.keep(scratch);
  CHECK(first == scratch);
  CHECK(first.data() != scratch.data());  // a copy the arena owns
  CHECK(arena.keep(scratch).data() == first.data());  // just kept: found among the recent names
  for (int i = 0; i < 10; ++i) arena.keep("model.layers." + std::to_string(i) + ".mlp.experts.down_proj");
  CHECK(arena.keep(scratch).data() == first.data());  // long ago: found through the index
  scratch = "model.layers.0.mlp.experts.gate_up_prox";  // same length, other text
  CHECK(arena.keep(scratch).data() != first.data());
}

TEST_CASE("map_all into a span maps like map_all into a vector, and refuses a span of another length", "[names]") {
  const accel::NameMapper m(names_of("ViTForImageClassification"));
  const std::vector<std::string_view> names{"vit.encoder.layer.0.attention.output.dense.bias", "classifier.weight"};
  accel::NameArena a, b;
  std::vector<std::string_view> out(names.size());
  m.map_all(names, a, out);
  CHECK(out == m.map_all(names, b));
  CHECK(out[0] == "vit.layers.0.attention.o_proj.bias");
  std::vector<std::string_view> short_out(1);
  REQUIRE_THROWS_WITH(m.map_all(names, a, short_out), accel_test::contains("1 places for 2 names"));
}
