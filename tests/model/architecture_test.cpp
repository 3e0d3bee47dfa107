// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/model/architecture.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"

using accel::DType;
using Strings = std::vector<std::string>;

namespace {

const accel::Architecture& arch(std::string_view name) {
  const auto* a = accel::architecture_catalog().find(name);
  REQUIRE(a != nullptr);
  return *a;
}

accel::ModelConfig config(const std::string& json) { return accel::parse_model_config(json, "test/config.json"); }

std::string parse_error(const std::string& json) {
  try {
    (void)config(json);
  } catch (const accel::checkpoint_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("config.json fields are read into ModelConfig", "[architecture][config]") {
  const auto c = config(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
                            "tie_word_embeddings": false, "is_encoder_decoder": false, "num_hidden_layers": 32,
                            "hidden_size": 4096})");
  CHECK(c.architectures == Strings{"LlamaForCausalLM"});
  CHECK(c.model_type == "llama");
  CHECK(c.dtype == DType::BF16);
  CHECK(c.tie_word_embeddings == false);
  CHECK(c.is_encoder_decoder == false);
  CHECK(c.num_hidden_layers == 32u);
  CHECK(c.json["hidden_size"] == 4096);

  SECTION("transformers 5's `dtype` wins over the older `torch_dtype`") {
    CHECK(config(R"({"dtype": "float16", "torch_dtype": "float32"})").dtype == DType::F16);
  }
  SECTION("GPT-2 and T5 spell the layer count n_layer and num_layers") {
    CHECK(config(R"({"n_layer": 12})").num_hidden_layers == 12u);
    CHECK(config(R"({"num_layers": 6})").num_hidden_layers == 6u);
  }
  SECTION("absent and null fields stay unset") {
    const auto e = config(R"({"tie_word_embeddings": null})");
    CHECK(e.architectures.empty());
    CHECK(e.model_type.empty());
    CHECK_FALSE(e.dtype);
    CHECK_FALSE(e.tie_word_embeddings);
    CHECK_FALSE(e.num_hidden_layers);
  }
}

TEST_CASE("a bad config.json is a checkpoint error naming the file and the field", "[architecture][config]") {
  CHECK(parse_error("[1, 2]") == "[accel.checkpoint] model config 'test/config.json' is not a JSON object; fix or remove it");
  CHECK_THAT(parse_error("{\"a\": 1,"), accel_test::contains("model config 'test/config.json' is not a JSON object: "));
  CHECK(parse_error(R"({"architectures": "LlamaForCausalLM"})") ==
        "[accel.checkpoint] model config 'test/config.json': architectures is \"LlamaForCausalLM\", not a list of class names");
  CHECK_THAT(parse_error(R"({"architectures": [1]})"), accel_test::contains("architectures is [1], not a list of class names"));
  CHECK_THAT(parse_error(R"({"model_type": 3})"), accel_test::contains("model_type is 3, not a string"));
  CHECK_THAT(parse_error(R"({"torch_dtype": "float17"})"),
             accel_test::contains("torch_dtype is \"float17\", not a dtype name (float16, bfloat16, float32, ...)"));
  CHECK_THAT(parse_error(R"({"dtype": 16})"), accel_test::contains("dtype is 16, not a dtype name"));
  CHECK_THAT(parse_error(R"({"tie_word_embeddings": "yes"})"), accel_test::contains("tie_word_embeddings is \"yes\", not true or false"));
  CHECK_THAT(parse_error(R"({"is_encoder_decoder": 1})"), accel_test::contains("is_encoder_decoder is 1, not true or false"));
  CHECK_THAT(parse_error(R"({"num_hidden_layers": -2})"), accel_test::contains("num_hidden_layers is -2, not a non-negative integer"));
  CHECK_THAT(parse_error(R"({"n_layer": 1.5})"), accel_test::contains("n_layer is 1.5, not a non-negative integer"));
  CHECK_THAT(parse_error(R"({"a": 1, "a": 2})"), accel_test::contains("duplicate key 'a'"));
}

TEST_CASE("read_model_config reads a file and names it in errors", "[architecture][config]") {
  accel_test::ScratchDir dir("architecture");
  std::ofstream(dir / "config.json") << R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})";
  CHECK(accel::read_model_config(dir / "config.json").model_type == "gpt2");
  CHECK_THROWS_WITH(accel::read_model_config(dir / "missing.json"), accel_test::contains("cannot read model config"));
}

TEST_CASE("the embedded catalog is the committed JSON and records where it came from", "[architecture][catalog]") {
  const auto text = accel_test::read_file(std::string(ACCEL_TEST_SOURCE_DIR) + "/include/accel/model/data/catalog.json");
  REQUIRE_FALSE(text.empty());
  std::string embedded;
  for (auto piece : accel::detail::catalog_json_pieces) embedded += piece;
  // Run `tests/compat/gen_catalog.py --embed` when this fails.
  CHECK(nlohmann::json::parse(embedded) == nlohmann::json::parse(text));

  const auto& cat = accel::architecture_catalog();
  CHECK(cat.transformers_version == "5.25.0");
  CHECK(cat.torch_version == "2.15.0");
  CHECK(cat.architectures.size() >= 30);
  for (const char* name : {"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GemmaForCausalLM",
                           "Gemma2ForCausalLM", "Gemma3ForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM", "GPT2LMHeadModel",
                           "GPTJForCausalLM", "GPTNeoXForCausalLM", "OPTForCausalLM", "FalconForCausalLM", "BloomForCausalLM",
                           "Starcoder2ForCausalLM", "OlmoForCausalLM", "CohereForCausalLM", "DeepseekV2ForCausalLM",
                           "DeepseekV3ForCausalLM", "T5ForConditionalGeneration", "MT5ForConditionalGeneration",
                           "BartForConditionalGeneration", "MBartForConditionalGeneration", "BertModel", "RobertaModel",
                           "ViTModel", "CLIPModel"}) {
    INFO(name);
    CHECK(cat.find(name) != nullptr);
  }
}

// Format 2 shares a base model's entry between its heads: the head lists its own modules with a
// marker where the base's go, and inherits what it leaves out.
TEST_CASE("a format-2 catalog expands a head over its base exactly, and refuses a broken one", "[architecture][catalog]") {
  const std::string base = R"({"architecture": "TinyModel", "model_type": "tiny", "config_class": "TinyConfig",
      "base_model_prefix": "model", "defaults": {"num_hidden_layers": 4, "hidden_size": 8},
      "no_split_modules": ["TinyLayer"], "attribute_map": {"n_layer": "num_hidden_layers"},
      "modules": [{"path": "", "class": "TinyModel"}, {"path": "embed", "class": "Embedding", "parameters": ["weight"]},
                  {"path": "layers", "class": "ModuleList"}, {"path": "layers.{i}", "class": "TinyLayer", "parameters": ["w"]},
                  {"path": "norm", "class": "TinyNorm", "parameters": ["weight"]},
                  {"path": "rotary", "class": "TinyRotary", "buffers": ["inv_freq"]}],
      "repeats": {"layers": "num_hidden_layers"},
      "buffers": [{"name": "rotary.inv_freq", "shape": ["hidden_size // 2"], "dtype": "float32", "persistent": false}]})";
  const std::string head = R"({"architecture": "TinyForCausalLM", "base": "TinyModel", "base_path": "model",
      "base_model_prefix": "model", "defaults": {"tie_word_embeddings": true},
      "tied": {"true": [["lm_head.weight", "model.embed.weight"]], "false": []},
      "modules": [{"path": "", "class": "TinyForCausalLM"}, {"path": "model", "base": true},
                  {"path": "lm_head", "class": "Linear", "parameters": ["weight"]}]})";
  const auto doc = [](const std::string& entries) {
    return R"({"format": 2, "transformers": "9.9.9", "mappings": {"MODEL_MAPPING_NAMES": ["TinyModel"],
               "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": ["TinyForCausalLM", "HugeForCausalLM"]},
               "skipped": [{"architecture": "HugeForCausalLM", "reason": "needs timm"}], "architectures": [)" + entries + "]}";
  };
  const auto cat = accel::parse_architecture_catalog(doc(head + "," + base));  // a head may come before its base
  REQUIRE(cat.architectures.size() == 2);
  const auto* h = cat.find("TinyForCausalLM");
  REQUIRE(h);
  Strings paths;
  for (const auto& m : h->modules) paths.push_back(m.path + "=" + m.class_name);
  CHECK(paths == Strings{"=TinyForCausalLM", "model=TinyModel", "model.embed=Embedding", "model.layers=ModuleList",
                         "model.layers.{i}=TinyLayer", "model.norm=TinyNorm", "model.rotary=TinyRotary", "lm_head=Linear"});
  CHECK(h->modules[4].parameters == Strings{"w"});
  CHECK(h->modules[6].buffers == Strings{"inv_freq"});
  CHECK(h->model_type == "tiny");
  CHECK(h->config_class == "TinyConfig");
  CHECK(h->no_split_modules == Strings{"TinyLayer"});
  CHECK(h->attribute_map.at("n_layer") == "num_hidden_layers");
  CHECK(h->defaults == nlohmann::json::parse(R"({"num_hidden_layers": 4, "hidden_size": 8, "tie_word_embeddings": true})"));
  REQUIRE(h->repeats.size() == 1);
  CHECK(h->repeats[0] == std::pair<std::string, std::string>{"model.layers", "num_hidden_layers"});
  REQUIRE(h->buffers.size() == 1);
  CHECK(h->buffers[0].name == "model.rotary.inv_freq");
  CHECK(h->tied_if_tied == std::vector<Strings>{{"lm_head.weight", "model.embed.weight"}});
  CHECK(cat.mappings.at("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES") == Strings{"TinyForCausalLM", "HugeForCausalLM"});
  REQUIRE(cat.skipped.size() == 1);
  CHECK(cat.skipped[0] == std::pair<std::string, std::string>{"HugeForCausalLM", "needs timm"});
  // The base's own entry is unchanged by its heads.
  CHECK(cat.find("TinyModel")->modules.size() == 6);

  SECTION("broken sharing is refused by name") {
    std::string no_marker = head;
    no_marker.replace(no_marker.find(R"({"path": "model", "base": true},)"), std::string(R"({"path": "model", "base": true},)").size(), "");
    CHECK_THROWS_WITH(accel::parse_architecture_catalog(doc(no_marker + "," + base)),
                      accel_test::contains("TinyForCausalLM names a base but marks where it goes in 'modules' 0 times"));
    CHECK_THROWS_WITH(accel::parse_architecture_catalog(doc(head)),
                      accel_test::contains("TinyForCausalLM names base 'TinyModel', which the catalog does not hold"));
    CHECK_THROWS_WITH(accel::parse_architecture_catalog(R"({"format": 3, "architectures": []})"),
                      accel_test::contains("is not a catalog of format 1 or 2"));
  }
}

// The catalog covers transformers' auto mappings whole: a class regenerated for a newer transformers
// that is neither an entry nor skipped with a reason fails here, so nothing is left out silently.
TEST_CASE("every class of transformers' auto mappings is catalogued or skipped with a reason", "[architecture][catalog]") {
  const auto& cat = accel::architecture_catalog();
  std::set<std::string> entries, skipped;
  for (const auto& a : cat.architectures) entries.insert(a.name);
  for (const auto& [name, reason] : cat.skipped) {
    INFO(name);
    CHECK_FALSE(reason.empty());
    CHECK(skipped.insert(name).second);
    CHECK(entries.count(name) == 0);
  }
  REQUIRE(cat.mappings.size() >= 8);
  std::set<std::string> text_mappings;  // the 8 people load with device_map (image classification aside)
  for (const auto& [mapping, classes] : cat.mappings) {
    INFO(mapping);
    CHECK_FALSE(classes.empty());
    for (const auto& c : classes) {
      INFO(c);
      CHECK(entries.count(c) + skipped.count(c) == 1);
      if (mapping != "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES") text_mappings.insert(c);
    }
  }
  std::size_t catalogued = 0;
  for (const auto& c : text_mappings) catalogued += entries.count(c);
  CHECK(text_mappings.size() >= 1000);
  CHECK(catalogued * 10 >= text_mappings.size() * 9);  // the goal: at least 90 %
  // Every entry expands (a head over its base) and is found alone as in the whole catalog.
  for (const auto& a : cat.architectures) {
    INFO(a.name);
    const auto* alone = accel::find_architecture(config(R"({"architectures": [")" + a.name + R"("]})")).architecture;
    REQUIRE(alone);
    CHECK(alone->modules.size() == a.modules.size());
    CHECK(alone->buffers.size() == a.buffers.size());
    CHECK_FALSE(a.modules.empty());
  }
  // A skipped class is unknown, with the catalog's reason to look elsewhere, not a broken entry.
  if (!cat.skipped.empty())
    CHECK_FALSE(accel::find_architecture(config(R"({"architectures": [")" + cat.skipped.front().first + R"("]})")).known());
}

TEST_CASE("architectures are found by class name; others are unknown with a reason", "[architecture][catalog]") {
  CHECK(accel::find_architecture(config(R"({"architectures": ["LlamaForCausalLM"]})")).architecture->model_type == "llama");
  CHECK(accel::find_architecture(config(R"({"architectures": ["T5ForConditionalGeneration"]})")).known());

  const auto head = accel::find_architecture(config(R"({"architectures": ["LlamaForSequenceClassification"], "model_type": "llama"})"));
  CHECK_FALSE(head.known());
  CHECK(head.reason ==
        "architecture 'LlamaForSequenceClassification' is not in accel's catalog (transformers 5.25.0); same model_type: "
        "LlamaModel, LlamaForCausalLM; header heuristics apply (for an exact plan, write its entry with "
        "tests/compat/gen_user_catalog.py LlamaForSequenceClassification and pass --catalog FILE or set ACCEL_CATALOG)");
  const auto none = accel::find_architecture(config(R"({"model_type": "llama"})"));
  CHECK_FALSE(none.known());
  CHECK_THAT(none.reason, accel_test::contains("names no architecture"));
}

TEST_CASE("Llama: classes, order, no-split blocks, ties and rotary buffers", "[architecture][llama]") {
  const auto& a = arch("LlamaForCausalLM");
  CHECK(a.no_split_modules == Strings{"LlamaDecoderLayer"});
  CHECK(accel::module_class(a, "") == "LlamaForCausalLM");
  CHECK(accel::module_class(a, "model.layers.17") == "LlamaDecoderLayer");
  CHECK(accel::module_class(a, "model.layers.17.mlp.up_proj") == "Linear");
  CHECK(accel::module_class(a, "model.norm") == "LlamaRMSNorm");
  CHECK_FALSE(accel::module_class(a, "model.layers.x"));
  CHECK_FALSE(accel::module_class(a, "model.vision_tower"));

  const auto rank = [&](const char* p) { return accel::module_rank(a, p).value(); };
  CHECK(rank("model.embed_tokens") < rank("model.layers"));
  CHECK(rank("model.layers.0.self_attn") < rank("model.layers.0.mlp"));
  CHECK(rank("model.layers.31") < rank("model.norm"));
  CHECK(rank("model.norm") < rank("model.rotary_emb"));
  CHECK(rank("model") < rank("lm_head"));

  // Llama 2 7B's config: no head_dim, no tie key (LlamaConfig defaults to untied).
  const auto llama2 = config(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
                                 "num_hidden_layers": 3, "torch_dtype": "float16"})");
  CHECK(accel::no_split_paths(a, llama2) == Strings{"model.layers.0", "model.layers.1", "model.layers.2"});
  CHECK(accel::tied_groups(a, llama2).empty());
  CHECK(accel::tied_groups(a, config(R"({"tie_word_embeddings": true})")) ==
        std::vector<Strings>{{"lm_head.weight", "model.embed_tokens.weight"}});
  CHECK(accel::keep_in_fp32_modules(a, DType::F16).empty());

  const auto buffers = accel::non_persistent_buffers(a, llama2, DType::F16);
  REQUIRE(buffers.size() == 2);
  CHECK(buffers[0].name == "model.rotary_emb.inv_freq");
  CHECK(buffers[0].dtype == DType::F32);  // computed in float32 whatever the load dtype
  CHECK(buffers[0].shape == std::vector<std::int64_t>{64});
  CHECK_FALSE(buffers[0].persistent);
  CHECK(buffers[1].name == "model.rotary_emb.original_inv_freq");

  // Llama 3.2 1B: head_dim given; a partial rotary factor in rope_parameters shrinks it.
  const auto llama3 = config(R"({"hidden_size": 2048, "num_attention_heads": 32, "head_dim": 64,
                                 "rope_parameters": {"rope_type": "llama3", "partial_rotary_factor": 0.5}})");
  CHECK(accel::non_persistent_buffers(a, llama3, DType::BF16)[0].shape == std::vector<std::int64_t>{16});
  CHECK_THROWS_WITH(accel::non_persistent_buffers(a, config(R"({"num_attention_heads": 0})"), DType::F16),
                    accel_test::contains("model config lacks what buffer 'model.rotary_emb.inv_freq' of LlamaForCausalLM needs"));
}

TEST_CASE("GPT-2: attribute names, tie by default, no buffers", "[architecture][gpt2]") {
  const auto& a = arch("GPT2LMHeadModel");
  CHECK(a.attribute_map.at("num_hidden_layers") == "n_layer");
  CHECK(accel::module_class(a, "transformer.h.11") == "GPT2Block");
  CHECK(accel::module_class(a, "transformer.h.11.attn.c_attn") == "Conv1D");
  const auto c = config(R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 768})");
  CHECK(accel::no_split_paths(a, c) == Strings{"transformer.h.0", "transformer.h.1"});
  CHECK(accel::evaluate_config_expression("hidden_size // 2", a, c) == 384.0);
  // GPT2Config ties by default: a config.json without the key still ties lm_head.
  CHECK(accel::tied_groups(a, c) == std::vector<Strings>{{"lm_head.weight", "transformer.wte.weight"}});
  CHECK(accel::non_persistent_buffers(a, c, DType::F32).empty());
  CHECK(accel::module_rank(a, "transformer.wte") < accel::module_rank(a, "transformer.wpe"));
}

TEST_CASE("T5: encoder before decoder, sub-layers told apart by their children, fp32 'wo'", "[architecture][t5]") {
  const auto& a = arch("T5ForConditionalGeneration");
  CHECK(a.keep_in_fp32_modules == Strings{"wo"});
  CHECK(accel::keep_in_fp32_modules(a, DType::F16) == Strings{"wo"});
  CHECK(accel::keep_in_fp32_modules(a, DType::BF16).empty());
  CHECK(accel::module_rank(a, "shared") < accel::module_rank(a, "encoder"));
  CHECK(accel::module_rank(a, "encoder.final_layer_norm") < accel::module_rank(a, "decoder"));
  CHECK(accel::module_rank(a, "decoder") < accel::module_rank(a, "lm_head"));

  CHECK_FALSE(accel::module_class(a, "encoder.block.0.layer.1"));  // two classes: children decide
  CHECK(accel::module_class(a, "encoder.block.0.layer.1", {"DenseReluDense", "layer_norm"}) == "T5LayerFF");
  CHECK(accel::module_class(a, "decoder.block.3.layer.1", {"EncDecAttention"}) == "T5LayerCrossAttention");

  // Flan-T5 says tie_word_embeddings false; transformers 5 ties all four names anyway.
  const auto c = config(R"({"architectures": ["T5ForConditionalGeneration"], "num_layers": 2, "tie_word_embeddings": false})");
  CHECK(accel::tied_groups(a, c) ==
        std::vector<Strings>{{"decoder.embed_tokens.weight", "encoder.embed_tokens.weight", "lm_head.weight", "shared.weight"}});
  // num_decoder_layers absent: it falls back to num_layers.
  CHECK(accel::no_split_paths(a, c) == Strings{"encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"});
  CHECK(accel::expand_template(a, "decoder.block.{i}.layer.{j}", config(R"({"num_layers": 4, "num_decoder_layers": 1})")) ==
        Strings{"decoder.block.0.layer.0", "decoder.block.0.layer.1", "decoder.block.0.layer.2"});
}

TEST_CASE("BART: encoder first, final_logits_bias a persistent buffer, layers from both counts", "[architecture][bart]") {
  const auto& a = arch("BartForConditionalGeneration");
  CHECK(a.no_split_modules == Strings{"BartDecoderLayer", "BartEncoderLayer"});
  CHECK(accel::module_rank(a, "model.encoder.layers.0") < accel::module_rank(a, "model.decoder.embed_tokens"));
  REQUIRE(a.buffers.size() == 1);
  CHECK(a.buffers[0].name == "final_logits_bias");
  CHECK(a.buffers[0].persistent);
  CHECK(a.buffers[0].shape == Strings{"1", "vocab_size"});
  const auto c = config(R"({"encoder_layers": 1, "decoder_layers": 2})");
  CHECK(accel::non_persistent_buffers(a, c, DType::F16).empty());
  CHECK(accel::no_split_paths(a, c) == Strings{"model.encoder.layers.0", "model.decoder.layers.0", "model.decoder.layers.1"});
  CHECK(accel::tied_groups(a, c).size() == 1);  // BartConfig ties by default
  CHECK(accel::tied_groups(a, c)[0].size() == 4);
}

TEST_CASE("BERT: embeddings are a no-split block; position ids sized by the config or its default", "[architecture][bert]") {
  const auto& a = arch("BertForMaskedLM");
  CHECK(a.no_split_modules == Strings{"BertEmbeddings", "BertLayer"});
  CHECK(accel::no_split_paths(a, config(R"({"num_hidden_layers": 1})")) ==
        Strings{"bert.embeddings", "bert.encoder.layer.0"});
  CHECK(accel::tied_groups(a, config("{}")) ==
        std::vector<Strings>{{"bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"},
                             {"cls.predictions.bias", "cls.predictions.decoder.bias"}});
  auto b = accel::non_persistent_buffers(a, config("{}"), DType::F16);
  REQUIRE(b.size() == 2);
  CHECK(b[0].name == "bert.embeddings.position_ids");
  CHECK(b[0].dtype == DType::I64);
  CHECK(b[0].shape == std::vector<std::int64_t>{1, 512});  // BertConfig's default
  b = accel::non_persistent_buffers(a, config(R"({"max_position_embeddings": 128})"), DType::F16);
  CHECK(b[1].name == "bert.embeddings.token_type_ids");
  CHECK(b[1].shape == std::vector<std::int64_t>{1, 128});
}

TEST_CASE("DeepSeek-V3: dense and MoE layers share a path and differ in children", "[architecture][deepseek]") {
  const auto& a = arch("DeepseekV3ForCausalLM");
  CHECK(accel::module_class(a, "model.layers.9.mlp", {"experts", "gate", "shared_experts"}) == "DeepseekV3MoE");
  CHECK(accel::module_class(a, "model.layers.0.mlp", {"gate_proj", "up_proj", "down_proj"}) == "DeepseekV3MLP");
  CHECK(a.keep_in_fp32_modules_strict == Strings{"e_score_correction_bias", "gate.weight"});
  CHECK_FALSE(a.conversions.empty());  // per-expert checkpoint tensors are fused on load
  // Older configs have no head_dim; the rotary part is qk_rope_head_dim.
  CHECK(accel::non_persistent_buffers(a, config(R"({"qk_rope_head_dim": 64, "hidden_size": 7168})"), DType::BF16)[0].shape ==
        std::vector<std::int64_t>{32});
}

TEST_CASE("EncoderDecoder: a config without tie_word_embeddings ties what its decoder ties", "[architecture][encoder-decoder]") {
  const auto& a = arch("EncoderDecoderModel");
  CHECK(accel::tied_groups(a, config("{}")) ==
        std::vector<Strings>{{"decoder.bert.embeddings.word_embeddings.weight", "decoder.cls.predictions.decoder.weight"},
                             {"decoder.cls.predictions.bias", "decoder.cls.predictions.decoder.bias"}});
}

TEST_CASE("classes a checkpoint cannot tell apart, all no-split, are planned as the first", "[architecture][tree]") {
  // GraniteSpeech5: subsampling and plain conformer blocks hold the same children.
  const auto& a = arch("GraniteSpeech5Encoder");
  accel::ModuleTree tree;
  for (const char* l : {"0", "5"}) tree.add_parameter(std::string("layers.") + l + ".norm_out.weight", DType::F32, {8});
  std::set<std::string, std::less<>> stood_in;
  (void)accel::annotate_module_classes(tree, accel::TemplateIndex(a), &stood_in);
  CHECK(tree.modules()[*tree.find_module("layers.5")].class_name == "GraniteSpeech5EncoderSubsamplingBlock");
  CHECK(stood_in == std::set<std::string, std::less<>>{"GraniteSpeech5EncoderBlock"});
  CHECK(accel::no_split_modules(tree, a.no_split_modules, false)[*tree.find_module("layers.5")]);
  // T5's sub-layers of different kinds stay undecided without children.
  CHECK_FALSE(accel::module_class(arch("T5ForConditionalGeneration"), "encoder.block.0.layer.1"));
}

TEST_CASE("a container inside numbered blocks holds the blocks the checkpoint holds there", "[architecture][buffers]") {
  const auto& a = arch("SwinModel");  // stages of depths[i] blocks: the catalog counts the first stage's 2 for all
  const auto c = config("{}");
  const accel::BlockCount held = [](std::string_view container) -> std::optional<std::uint64_t> {
    if (container == "encoder.layers.2.blocks") return 18;
    return std::nullopt;
  };
  const auto names = accel::expand_template(a, "encoder.layers.{i}.blocks.{j}", c, &held);
  CHECK(names.size() == 2 + 2 + 18 + 2);
  CHECK(names[4 + 17] == "encoder.layers.2.blocks.17");
  CHECK(accel::expand_template(a, "encoder.layers.{i}.blocks.{j}", c).size() == 8);
}

TEST_CASE("tie groups with placeholders are one group per value; written-out numbers tie those blocks only", "[architecture][tied]") {
  accel::Architecture a;
  a.name = "Toy";
  a.repeats = {{"heads", "n - 1"}, {"embeds", "n"}, {"layers", "2"}, {"layers.{i}.experts", "2"}};
  a.tied_if_tied = {{"embeds.{i}.weight", "heads.{i-1}.weight"},
                    {"layers.{i}.experts.{j}.a", "layers.{i}.experts.{j}.b"},
                    {"layers.0.experts.0.c", "shared.c"},
                    {"layers.{i}.shared.w", "layers.{i}.shared.w"}};  // one module several blocks share
  const auto c = config(R"({"n": 4})");
  CHECK(accel::tied_groups(a, c) == std::vector<Strings>{{"embeds.1.weight", "heads.0.weight"},
                                                         {"embeds.2.weight", "heads.1.weight"},
                                                         {"embeds.3.weight", "heads.2.weight"},
                                                         {"layers.0.experts.0.a", "layers.0.experts.0.b"},
                                                         {"layers.0.experts.1.a", "layers.0.experts.1.b"},
                                                         {"layers.1.experts.0.a", "layers.1.experts.0.b"},
                                                         {"layers.1.experts.1.a", "layers.1.experts.1.b"},
                                                         {"layers.0.experts.0.c", "shared.c"},
                                                         {"layers.0.shared.w", "layers.1.shared.w"}});
  a.tied_if_tied = {{"nowhere.{i}.x", "shared.x"}};
  CHECK_THROWS_WITH(accel::tied_groups(a, c), accel_test::contains("model config gives no block count for the placeholder {i}"));
  // Bark ties each fine-acoustics head to the next codebook's embedding (its config has no
  // tie_word_embeddings); Udop ties the relative attention bias of its first block only.
  const auto bark = accel::tied_groups(arch("BarkModel"), config("{}"));
  REQUIRE(bark.size() == 7);
  CHECK(bark[0] == Strings{"fine_acoustics.input_embeds_layers.1.weight", "fine_acoustics.lm_heads.0.weight"});
  CHECK(bark[6] == Strings{"fine_acoustics.input_embeds_layers.7.weight", "fine_acoustics.lm_heads.6.weight"});
  const auto udop = accel::tied_groups(arch("UdopForConditionalGeneration"), config("{}"));
  CHECK(std::find(udop.begin(), udop.end(),
                  Strings{"decoder.relative_bias.biases.0.relative_attention_bias.weight",
                          "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                          "encoder.relative_bias.biases.0.relative_attention_bias.weight"}) != udop.end());
}

TEST_CASE("several classes on one path: the children decide, the fewest children among those that fit", "[architecture]") {
  const accel::TemplateIndex t5(arch("T5ForConditionalGeneration"));
  // T5's feed-forward sub-layer builds DenseReluDense before its layer_norm: the template keeps its children in that order.
  const auto* ff = accel::module_template_by_children(t5, "encoder.block.0.layer.1", Strings{"layer_norm", "DenseReluDense"});
  REQUIRE(ff != nullptr);
  CHECK(ff->class_name == "T5LayerFF");
  CHECK(ff->children == Strings{"DenseReluDense", "layer_norm", "dropout"});
  CHECK(accel::module_template_by_children(t5, "encoder.block.0", Strings{"layer"}) == nullptr);  // one template
  // Inkling2-Loop's full layer and full loop layer both have a full layer's children; the loop
  // layer's message gates would be there too.
  const auto& loop = arch("Inkling2LoopTextModel");
  const Strings full{"attention_input", "mlp_input", "self_attn", "mlp", "q_input_layernorm", "k_input_layernorm",
                     "v_input_layernorm", "post_attention_layernorm", "post_attention_convolution", "post_mlp_convolution"};
  CHECK(accel::module_class(loop, "layers.5", full) == "Inkling2LoopFullDecoderLayer");
  Strings gated = full;
  gated.push_back("q_message_gate");
  CHECK(accel::module_class(loop, "layers.5", gated) == "Inkling2LoopFullLoopDecoderLayer");
}

TEST_CASE("catalog expressions: floor division, ?? fallbacks, missing values, syntax errors", "[architecture][expression]") {
  accel::Architecture a;
  a.defaults = {{"d", 7}};
  a.attribute_map = {{"width", "n_embd"}};
  const auto c = config(R"({"n_embd": 10, "sub": {"x": 3}, "none": null, "flag": true})");
  auto eval = [&](const char* e) { return accel::evaluate_config_expression(e, a, c); };
  CHECK(eval("width // 3") == 3.0);
  CHECK(eval("-width // 3") == -4.0);
  CHECK(eval("(width + 1) * 2 - sub.x") == 19.0);
  CHECK(eval("none ?? d") == 7.0);
  CHECK(eval("absent ?? none ?? 5") == 5.0);
  CHECK(eval("width * 0.5 // 1") == 5.0);
  CHECK_FALSE(eval("absent + 1"));
  CHECK_FALSE(eval("flag"));  // booleans are not numbers
  CHECK_THROWS_AS(eval("width //"), accel::usage_error);
  CHECK_THROWS_WITH(eval("(width"), accel_test::contains("catalog expression '(width': missing ')'"));
  CHECK_FALSE(eval("width // 0"));
}

TEST_CASE("a tree rebuilt from headers gets classes and its non-persistent buffers", "[architecture][tree]") {
  accel::ModuleTree tree;
  tree.add_parameter("model.embed_tokens.weight", DType::BF16, {128, 16});
  for (const char* l : {"0", "1"}) {
    const std::string p = std::string("model.layers.") + l;
    tree.add_parameter(p + ".self_attn.q_proj.weight", DType::BF16, {16, 16});
    tree.add_parameter(p + ".mlp.up_proj.weight", DType::BF16, {32, 16});
  }
  tree.add_parameter("model.norm.weight", DType::BF16, {16});
  tree.add_parameter("lm_head.weight", DType::BF16, {128, 16});
  const auto& a = arch("LlamaForCausalLM");
  CHECK(accel::annotate_module_classes(tree, a) == tree.modules().size());
  CHECK(tree.modules()[*tree.find_module("model.layers.1")].class_name == "LlamaDecoderLayer");
  CHECK(accel::no_split_modules(tree, a.no_split_modules, false)[*tree.find_module("model.layers.0")]);

  const auto c = config(R"({"hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 2})");
  CHECK(accel::add_non_persistent_buffers(tree, a, c, DType::BF16) == 2);
  CHECK(accel::add_non_persistent_buffers(tree, a, c, DType::BF16) == 0);  // already there
  const auto& inv = tree.tensors()[*tree.find_tensor("model.rotary_emb.inv_freq")];
  CHECK(inv.buffer);
  CHECK_FALSE(inv.persistent);
  CHECK(inv.shape == std::vector<std::int64_t>{4});
  CHECK(accel::annotate_module_classes(tree, a) == 1);  // the new model.rotary_emb
}

TEST_CASE("an entry parsed alone from the embedded text equals the whole catalog's", "[architecture][catalog]") {
  // find_architecture parses only the entry a plan needs; it must be the same entry.
  const auto& cat = accel::architecture_catalog();
  for (const auto& a : cat.architectures) {
    INFO(a.name);
    const auto* e = accel::detail::embedded_architecture(a.name);
    REQUIRE(e != nullptr);
    CHECK(e->model_type == a.model_type);
    CHECK(e->defaults == a.defaults);
    CHECK(e->attribute_map == a.attribute_map);
    CHECK(e->no_split_modules == a.no_split_modules);
    CHECK(e->keep_in_fp32_modules == a.keep_in_fp32_modules);
    CHECK(e->keep_in_fp32_modules_strict == a.keep_in_fp32_modules_strict);
    CHECK(e->tied_if_tied == a.tied_if_tied);
    CHECK(e->tied_if_untied == a.tied_if_untied);
    CHECK(e->repeats == a.repeats);
    REQUIRE(e->modules.size() == a.modules.size());
    for (std::size_t i = 0; i < a.modules.size(); ++i) {
      CHECK(e->modules[i].path == a.modules[i].path);
      CHECK(e->modules[i].class_name == a.modules[i].class_name);
      CHECK(e->modules[i].parameters == a.modules[i].parameters);
      CHECK(e->modules[i].buffers == a.modules[i].buffers);
      CHECK(e->modules[i].children == a.modules[i].children);
    }
    REQUIRE(e->buffers.size() == a.buffers.size());
    for (std::size_t i = 0; i < a.buffers.size(); ++i) CHECK(e->buffers[i].shape == a.buffers[i].shape);
    CHECK(accel::find_architecture(config(R"({"architectures": [")" + a.name + R"("]})")).architecture == e);
  }
  CHECK(accel::detail::embedded_architecture("NoSuchModel") == nullptr);
  CHECK(accel::catalog_transformers_version() == cat.transformers_version);
}

TEST_CASE("TemplateIndex finds exactly the templates template_matches accepts, in construction order", "[architecture][index]") {
  // Every catalog entry, paths made from its own templates (numbers put in for `{i}`), and the
  // near misses: a number where a name belongs, a name where a number belongs, a part too many.
  std::vector<accel::Architecture> entries = accel::architecture_catalog().architectures;
  accel::Architecture literal;  // templates with literal numbers are tried one by one
  for (const auto& [path, cls] : std::vector<std::pair<std::string, std::string>>{
           {"", "Root"}, {"blocks", "ModuleList"}, {"blocks.{i}", "Block"}, {"blocks.0", "FirstBlock"}, {"blocks.{i}.{}", "Odd"},
           {"blocks.{i}.mlp", "Mlp"}}) {
    accel::ModuleTemplate m;
    m.path = path, m.class_name = cls;
    literal.modules.push_back(m);
  }
  entries.push_back(literal);
  std::size_t checked = 0;
  for (const auto& a : entries) {
    const accel::TemplateIndex index(a);
    std::vector<std::string> paths{"", "7", "x.y.z"};
    for (const auto& m : a.modules) {
      std::string with_numbers, with_names;
      std::size_t start = 0;
      for (int k = 0; start <= m.path.size(); ++k) {
        const auto end = std::min(m.path.find('.', start), m.path.size());
        const auto part = m.path.substr(start, end - start);
        const bool block = part.size() >= 3 && part.front() == '{';
        with_numbers += (start ? "." : "") + (block ? std::to_string(k * 7 % 13) : part);
        with_names += (start ? "." : "") + (block ? std::string("layer") : std::string(part == "0" ? "zero" : "0"));
        start = end + 1;
      }
      paths.insert(paths.end(), {with_numbers, with_names, with_numbers + ".3", with_numbers + ".extra", m.path});
    }
    for (const auto& path : paths) {
      std::vector<std::size_t> expected, found;
      for (std::size_t i = 0; i < a.modules.size(); ++i)
        if (accel::template_matches(a.modules[i].path, path)) expected.push_back(i);
      index.for_each_match(path, [&](std::size_t i) { found.push_back(i); });
      INFO(a.name << ": '" << path << "'");
      CHECK(found == expected);
      ++checked;
    }
  }
  CHECK(checked > 1000);
  const accel::TemplateIndex index(literal);
  CHECK(accel::module_rank(index, "blocks.0") == std::size_t{2});
  CHECK(accel::module_class(index, "blocks.5.mlp") == std::string("Mlp"));
  CHECK_FALSE(accel::module_class(index, "blocks.0"));  // Block and FirstBlock both match
}
