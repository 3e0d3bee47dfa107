// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/model/checkpoint_tree.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/safetensors_writer.hpp"

using accel::DType;
using Strings = std::vector<std::string>;

namespace {

// Tensor names in model order (accelerate's visit: module, parameters, children, buffers).
Strings model_order(const accel::ModuleTree& t) {
  const auto ix = accel::index_tree(t);
  Strings order;
  for (const auto& ten : t.tensors()) order.push_back(ten.name);
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return ix.tensor_rank[*t.find_tensor(a)] < ix.tensor_rank[*t.find_tensor(b)];
  });
  return order;
}

// Writes the tensors (in the order given: file order is not model order) and config.json.
void write_checkpoint(const std::filesystem::path& dir, const Strings& names, const std::string& config,
                      std::vector<std::int64_t> shape = {8, 4}) {
  std::vector<accel_test::TensorSpec> specs;
  for (const auto& n : names) specs.push_back({n, DType::BF16, shape, {}});
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  if (!config.empty()) accel_test::write_text(dir / "config.json", config);
}

const accel::Tensor& tensor(const accel::ModuleTree& t, const std::string& name) {
  const auto id = t.find_tensor(name);
  REQUIRE(id);
  return t.tensors()[*id];
}

std::string class_of(const accel::ModuleTree& t, const std::string& name) {
  const auto id = t.find_module(name);
  REQUIRE(id);
  return t.modules()[*id].class_name;
}

}  // namespace

TEST_CASE("Llama from config.json: construction order, classes, rotary buffers, tie as configured", "[checkpoint_tree][llama]") {
  accel_test::TempDir dir;
  // Alphabetical file order puts lm_head first and model.norm before the layers.
  const Strings names{"lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                      "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight",
                      "model.layers.1.self_attn.q_proj.weight", "model.norm.weight"};
  const std::string config = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
                                 "num_attention_heads": 2, "num_hidden_layers": 2, "tie_word_embeddings": false,
                                 "torch_dtype": "bfloat16"})";
  write_checkpoint(dir.path(), names, config);
  const auto m = accel::read_checkpoint_model(dir.path());
  REQUIRE(m.architecture != nullptr);
  CHECK(m.architecture_note == "LlamaForCausalLM (architecture catalog, transformers 5.25.0)");
  CHECK(m.auto_dtype == DType::BF16);
  CHECK(m.no_split_classes() == Strings{"LlamaDecoderLayer"});
  CHECK(m.buffers_added == 2);
  CHECK(model_order(m.tree) ==
        Strings{"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight",
                "model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight", "model.norm.weight",
                "model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq", "lm_head.weight"});
  CHECK(class_of(m.tree, "model.layers.1") == "LlamaDecoderLayer");
  CHECK(class_of(m.tree, "model.rotary_emb") == "LlamaRotaryEmbedding");
  const auto& inv = tensor(m.tree, "model.rotary_emb.inv_freq");
  CHECK(inv.buffer);
  CHECK_FALSE(inv.persistent);
  CHECK(inv.dtype == DType::F32);
  CHECK(inv.shape == std::vector<std::int64_t>{4});  // head_dim 8 / 2
  CHECK_FALSE(m.tree.has_ties());
  // Computed buffers count at their own dtype whatever the load dtype: 2 × 4 float32.
  const auto sizes = accel::compute_module_sizes(m.tree, accel::SizeOptions{DType::F16});
  CHECK(sizes.module[*m.tree.find_module("model.rotary_emb")] == 32);

  SECTION("tied: the checkpoint leaves lm_head out and the tree ties it back") {
    accel_test::TempDir tied;
    Strings without_head(names.begin() + 1, names.end());
    write_checkpoint(tied.path(), without_head, R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16,
                                                  "num_attention_heads": 2, "num_hidden_layers": 2, "tie_word_embeddings": true})");
    const auto t = accel::read_checkpoint_tree(tied.path());
    REQUIRE(t.find_tensor("lm_head.weight"));
    CHECK(model_order(t).back() == "lm_head.weight");
    CHECK(accel::index_tree(t).tied_groups.size() == 1);
  }
}

TEST_CASE("BART: shared first, encoder before decoder, embeddings tied, final_logits_bias a buffer placed last", "[checkpoint_tree][bart]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(),
                   {"final_logits_bias", "model.decoder.layers.0.fc1.weight", "model.encoder.layers.0.fc1.weight",
                    "model.shared.weight"},
                   R"({"architectures": ["BartForConditionalGeneration"], "model_type": "bart", "encoder_layers": 1,
                       "decoder_layers": 1})");
  const auto m = accel::read_checkpoint_model(dir.path());
  REQUIRE(m.architecture != nullptr);
  CHECK(model_order(m.tree) ==
        Strings{"model.shared.weight", "model.encoder.embed_tokens.weight", "model.encoder.layers.0.fc1.weight",
                "model.decoder.embed_tokens.weight", "model.decoder.layers.0.fc1.weight", "lm_head.weight",
                "final_logits_bias"});
  CHECK(tensor(m.tree, "final_logits_bias").buffer);
  CHECK(tensor(m.tree, "final_logits_bias").persistent);
  const auto ix = accel::index_tree(m.tree);
  REQUIRE(ix.tied_groups.size() == 1);
  CHECK(ix.tied_groups[0].size() == 4);
  CHECK(accel::compute_module_sizes(m.tree).total() == 4 * 64);  // shared counted once, plus 3 tensors
  CHECK(class_of(m.tree, "model.encoder.layers.0") == "BartEncoderLayer");
  CHECK(class_of(m.tree, "model.decoder.layers.0") == "BartDecoderLayer");
}

TEST_CASE("T5: lm_head and both embed_tokens tied to shared even when config.json unties", "[checkpoint_tree][t5]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(),
                   {"decoder.block.0.layer.0.SelfAttention.q.weight", "decoder.final_layer_norm.weight",
                    "encoder.block.0.layer.0.SelfAttention.q.weight", "encoder.block.0.layer.1.DenseReluDense.wo.weight",
                    "encoder.final_layer_norm.weight", "shared.weight"},
                   R"({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "num_layers": 1,
                       "num_decoder_layers": 1, "tie_word_embeddings": false})");
  const auto m = accel::read_checkpoint_model(dir.path());
  CHECK(model_order(m.tree) == Strings{"shared.weight", "encoder.embed_tokens.weight",
                                       "encoder.block.0.layer.0.SelfAttention.q.weight",
                                       "encoder.block.0.layer.1.DenseReluDense.wo.weight", "encoder.final_layer_norm.weight",
                                       "decoder.embed_tokens.weight", "decoder.block.0.layer.0.SelfAttention.q.weight",
                                       "decoder.final_layer_norm.weight", "lm_head.weight"});
  CHECK(accel::index_tree(m.tree).tied_groups.size() == 1);
  CHECK(class_of(m.tree, "encoder.block.0") == "T5Block");
  CHECK(class_of(m.tree, "encoder.block.0.layer.1") == "T5LayerFF");
  CHECK(m.keep_in_fp32(DType::F16) == Strings{"wo"});
  CHECK(m.keep_in_fp32(DType::BF16).empty());
}

TEST_CASE("BERT: no phantom lm_head although BertConfig ties by default; int64 id buffers added", "[checkpoint_tree][bert]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), {"embeddings.word_embeddings.weight", "encoder.layer.0.output.dense.weight", "pooler.dense.weight"},
                   R"({"architectures": ["BertModel"], "model_type": "bert", "num_hidden_layers": 1,
                       "max_position_embeddings": 16})");
  const auto m = accel::read_checkpoint_model(dir.path());
  REQUIRE(m.architecture != nullptr);
  CHECK_FALSE(m.tree.find_tensor("lm_head.weight"));
  CHECK_FALSE(m.tree.has_ties());
  const auto& ids = tensor(m.tree, "embeddings.position_ids");
  CHECK(ids.dtype == DType::I64);
  CHECK(ids.shape == std::vector<std::int64_t>{1, 16});
  CHECK(class_of(m.tree, "embeddings") == "BertEmbeddings");
}

// GPT-Neo's attention keeps its causal mask (local layers: a sliding window) as a non-persistent
// bool buffer, 1 x 1 x max_position_embeddings^2: 4 MiB per block at 1.3B, that no checkpoint
// stores. transformers counts it in the block's size and so in the largest-layer reserve; a tree
// without it put a block more on a GPU than transformers does (tests/compat golden maps).
TEST_CASE("GPT-Neo: each block's causal mask is a computed bool buffer counted in the block", "[checkpoint_tree][gpt_neo]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(),
                   {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.attention.q_proj.weight",
                    "transformer.h.0.mlp.c_fc.weight", "transformer.h.1.attn.attention.q_proj.weight",
                    "transformer.h.1.mlp.c_fc.weight", "transformer.ln_f.weight"},
                   R"({"architectures": ["GPTNeoForCausalLM"], "model_type": "gpt_neo", "hidden_size": 8, "num_layers": 2,
                       "num_heads": 2, "attention_types": [[["global", "local"], 1]], "max_position_embeddings": 16,
                       "window_size": 4})");
  const auto m = accel::read_checkpoint_model(dir.path());
  REQUIRE(m.architecture != nullptr);
  CHECK(m.no_split_classes() == Strings{"GPTNeoBlock"});
  CHECK(m.buffers_added == 2);
  for (const char* block : {"transformer.h.0", "transformer.h.1"}) {
    INFO(block);
    const auto& mask = tensor(m.tree, std::string(block) + ".attn.attention.bias");
    CHECK(mask.buffer);
    CHECK_FALSE(mask.persistent);
    CHECK(mask.dtype == DType::BOOL);
    CHECK(mask.shape == std::vector<std::int64_t>{1, 1, 16, 16});
    CHECK(class_of(m.tree, block) == "GPTNeoBlock");
  }
  CHECK(class_of(m.tree, "transformer.h.0.attn.attention") == "GPTNeoSelfAttention");
  // GPTNeoConfig ties by default: lm_head is the embedding's copy.
  REQUIRE(m.tree.find_tensor("lm_head.weight"));
  CHECK(accel::index_tree(m.tree).tied_groups.size() == 1);
  // In float16: two 8 x 4 weights at 2 bytes, and the mask at 1 byte an element whatever the load dtype.
  const auto sizes = accel::compute_module_sizes(m.tree, accel::SizeOptions{DType::F16});
  CHECK(sizes.module[*m.tree.find_module("transformer.h.1")] == 2 * 8 * 4 * 2 + 16 * 16);
}

TEST_CASE("an unknown architecture keeps the header heuristics and says why", "[checkpoint_tree]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), {"model.layers.0.w", "model.embed_tokens.weight"},
                   R"({"architectures": ["LlamaForSequenceClassification"], "model_type": "llama"})");
  const auto m = accel::read_checkpoint_model(dir.path());
  CHECK(m.architecture == nullptr);
  CHECK_THAT(m.architecture_note, accel_test::contains("'LlamaForSequenceClassification' is not in accel's catalog"));
  CHECK(m.no_split_classes().empty());
  // transformers' own ties for the class (name data): a sequence classifier has no tied lm_head.
  CHECK(model_order(m.tree) == Strings{"model.embed_tokens.weight", "model.layers.0.w"});

  SECTION("a class transformers lacks too: a config that ties word embeddings (absent: true) ties lm_head") {
    accel_test::TempDir other;
    write_checkpoint(other.path(), {"model.layers.0.w", "model.embed_tokens.weight"},
                     R"({"architectures": ["FancyLMForCausalLM"], "model_type": "fancy"})");
    const auto f = accel::read_checkpoint_model(other.path());
    CHECK(f.names.identity());
    CHECK(model_order(f.tree) == Strings{"model.embed_tokens.weight", "model.layers.0.w", "lm_head.weight"});
  }

  accel_test::TempDir bare;
  write_checkpoint(bare.path(), {"w"}, "");
  CHECK_THAT(accel::read_checkpoint_model(bare.path()).architecture_note, accel_test::contains("no config.json"));
}

TEST_CASE("a config.json elsewhere is read through config_file (accel plan --config)", "[checkpoint_tree]") {
  accel_test::TempDir dir, cfg;
  write_checkpoint(dir.path(), {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"}, "");
  accel_test::write_text(cfg / "gpt2.json", R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 1})");
  const auto m = accel::read_checkpoint_model(dir.path(), {.config_file = cfg / "gpt2.json"});
  REQUIRE(m.architecture != nullptr);
  CHECK(class_of(m.tree, "transformer.h.0") == "GPT2Block");
  CHECK(m.tree.find_tensor("lm_head.weight"));  // GPT2Config ties by default
  CHECK_THROWS_WITH(accel::read_checkpoint_model(dir.path(), {.config_file = cfg / "missing.json"}),
                    accel_test::contains("cannot read model config"));
}

TEST_CASE("a no-split class or glob that matches nothing is an error naming the nearest and the known classes", "[checkpoint_tree][no_split]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"},
                   R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1})");
  const auto t = accel::read_checkpoint_tree(dir.path());
  CHECK_NOTHROW(accel::check_no_split_specs(t, {"LlamaDecoderLayer", "model.layers.*", "model.norm"}));
  CHECK_THROWS_WITH(accel::check_no_split_specs(t, {"LlamaDecoderLayr"}),
                    "[accel.usage] no-split 'LlamaDecoderLayr' matches no module of this model (no class, name or glob "
                    "match); did you mean 'LlamaDecoderLayer'?; its classes: 'Embedding', 'Linear', 'LlamaDecoderLayer', "
                    "'LlamaForCausalLM', 'LlamaMLP', 'LlamaModel', 'LlamaRMSNorm', 'LlamaRotaryEmbedding', 'ModuleList'");
  CHECK_THROWS_WITH(accel::check_no_split_specs(t, {"model.blocks.*"}),
                    accel_test::contains("no-split 'model.blocks.*' matches no module"));
  // Headers alone carry no class names (the defect: such a name silently matched nothing).
  accel_test::TempDir bare;
  write_checkpoint(bare.path(), {"model.layers.0.w"}, "");
  CHECK_THROWS_WITH(accel::check_no_split_specs(accel::read_checkpoint_tree(bare.path()), {"LlamaDecoderLayer"}),
                    accel_test::contains("the model has no class names (headers only"));
}

TEST_CASE("a ViT folder in Hub names builds the model's tree: renamed blocks with their classes, as a model-name folder", "[checkpoint_tree][names]") {
  const std::string config = R"({"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": 8,
                                 "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16,
                                 "image_size": 8, "patch_size": 4, "num_labels": 3})";
  Strings hub{"vit.embeddings.cls_token", "vit.layernorm.weight", "classifier.weight"}, model = hub;
  for (const char* layer : {"0", "1"})
    for (auto [c, m] : {std::pair{"attention.attention.query", "attention.q_proj"}, {"attention.output.dense", "attention.o_proj"},
                        {"intermediate.dense", "mlp.fc1"}, {"output.dense", "mlp.fc2"}, {"layernorm_before", "layernorm_before"}}) {
      hub.push_back(std::string("vit.encoder.layer.") + layer + "." + c + ".weight");
      model.push_back(std::string("vit.layers.") + layer + "." + m + ".weight");
    }
  accel_test::TempDir a, b;
  write_checkpoint(a.path(), hub, config);
  write_checkpoint(b.path(), model, config);
  const auto from_hub = accel::read_checkpoint_model(a.path());
  const auto from_model = accel::read_checkpoint_model(b.path());
  CHECK(from_hub.warnings.empty());
  CHECK_FALSE(from_hub.names.identity());
  CHECK(from_model.names.identity());
  CHECK(model_order(from_hub.tree) == model_order(from_model.tree));
  CHECK(class_of(from_hub.tree, "vit.layers.1") == "ViTLayer");
  CHECK(from_hub.names.source.starts_with("ViTForImageClassification (transformers "));
  SECTION("kept in checkpoint names, the catalog's no-split class names nothing, and the report says so") {
    accel::CheckpointTreeOptions o;
    o.model_names = false;
    const auto kept = accel::read_checkpoint_model(a.path(), o);
    REQUIRE(kept.warnings.size() == 1);
    CHECK_THAT(kept.warnings.front(), accel_test::contains("no-split class ViTLayer of the catalog names no module"));
  }
}

TEST_CASE("Mixtral's experts in Hub names fuse into the model's tensors, every byte counted once", "[checkpoint_tree][names][moe]") {
  const std::string config = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 8,
                                 "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
                                 "num_local_experts": 2, "tie_word_embeddings": false})";
  const Strings names{"model.embed_tokens.weight", "model.layers.0.block_sparse_moe.gate.weight",
                      "model.layers.0.block_sparse_moe.experts.0.w1.weight", "model.layers.0.block_sparse_moe.experts.0.w2.weight",
                      "model.layers.0.block_sparse_moe.experts.0.w3.weight", "model.layers.0.block_sparse_moe.experts.1.w1.weight",
                      "model.layers.0.block_sparse_moe.experts.1.w2.weight", "model.layers.0.block_sparse_moe.experts.1.w3.weight",
                      "model.norm.weight", "lm_head.weight"};
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), names, config);
  const auto m = accel::read_checkpoint_model(dir.path());
  CHECK(tensor(m.tree, "model.layers.0.mlp.experts.gate_up_proj").numel() == 4 * 8 * 4);
  CHECK(tensor(m.tree, "model.layers.0.mlp.experts.gate_up_proj").shape[0] == 4);  // four parts of one shape: [4, r, c]
  CHECK(tensor(m.tree, "model.layers.0.mlp.experts.down_proj").numel() == 2 * 8 * 4);
  CHECK(tensor(m.tree, "model.layers.0.mlp.gate.weight").numel() == 8 * 4);
  CHECK_FALSE(m.tree.find_tensor("model.layers.0.block_sparse_moe.experts.0.w1.weight"));
  CHECK(class_of(m.tree, "model.layers.0") == "MixtralDecoderLayer");
  CHECK(m.names.model[2] == "model.layers.0.mlp.experts.gate_up_proj");
}

TEST_CASE("a class outside the catalog gets transformers' ties from the name data: ALBERT's decoder", "[checkpoint_tree][names]") {
  const std::string config = R"({"architectures": ["AlbertForMaskedLM"], "model_type": "albert"})";
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), {"albert.embeddings.word_embeddings.weight", "predictions.bias", "predictions.dense.weight"}, config,
                   {8});
  // The catalog holds ALBERT: withheld here, as for a class newer than it.
  const auto m = accel::model_from_checkpoint(accel::resolve_checkpoint(dir.path()), {.use_catalog = false});
  CHECK(m.architecture == nullptr);
  REQUIRE(m.tree.find_tensor("predictions.decoder.weight"));
  REQUIRE(m.tree.find_tensor("predictions.decoder.bias"));
  CHECK(m.tied_groups == 2);
  CHECK_FALSE(m.tree.find_tensor("lm_head.weight"));  // not the heuristic's guess
  const auto ix = m.tree.index();
  CHECK(ix->canonical[*m.tree.find_tensor("predictions.decoder.weight")] == *m.tree.find_tensor("albert.embeddings.word_embeddings.weight"));
}

TEST_CASE("a quantization_config over a checkpoint holding no quantized tensor is refused, never planned dense", "[checkpoint_tree]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), {"model.layers.0.w"},
                   R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
                       "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})");
  CHECK_THROWS_WITH(accel::read_checkpoint_model(dir.path()),
                    accel_test::contains("quantization_config says fp8 (float8 weights, 128×128 blocks) but no tensor"));
}

TEST_CASE("a folder holding a tensor in both spellings is refused, naming both", "[checkpoint_tree][names]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), {"embed_out.weight", "lm_head.weight", "gpt_neox.final_layer_norm.weight"},
                   R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "num_hidden_layers": 1})");
  CHECK_THROWS_WITH(accel::read_checkpoint_model(dir.path()),
                    accel_test::contains("tensors 'embed_out.weight' and 'lm_head.weight' are both the model's 'lm_head.weight'"));
}

// The heuristic order for architectures no catalog holds. Before: towers after the language model
// (alphabetical), wav2vec2's `encoder` before `feature_extractor`, a final norm that sorts before
// `layers` first, and LFM2's `embedding_norm` taken for an embedding.
TEST_CASE("outside the catalog: towers before the language model, feature encoders first, norms after the blocks",
          "[checkpoint_tree][fallback]") {
  SECTION("a vision-language model: config.json's vision_config puts its tower and projector first") {
    accel_test::TempDir dir;
    write_checkpoint(dir.path(), {"lm_head.weight", "model.language_model.layers.0.w", "model.language_model.embed_tokens.weight",
                                  "model.language_model.final_layernorm.weight", "model.multi_modal_projector.linear.weight",
                                  "model.vision_tower.blocks.0.w"},
                     R"({"architectures": ["Future3VLForConditionalGeneration"], "model_type": "future3_vl",
                         "vision_config": {"depth": 1}, "text_config": {"num_hidden_layers": 1}})");
    const auto m = accel::read_checkpoint_model(dir.path());
    CHECK_FALSE(m.architecture);
    CHECK(model_order(m.tree) == Strings{"model.vision_tower.blocks.0.w", "model.multi_modal_projector.linear.weight",
                                         "model.language_model.embed_tokens.weight", "model.language_model.layers.0.w",
                                         "model.language_model.final_layernorm.weight", "lm_head.weight"});
    CHECK_THAT(m.architecture_note, accel_test::contains("'Future3VLForConditionalGeneration' is not in accel's catalog "
                                                         "(transformers 5.25.0)") &&
                                        accel_test::contains("gen_user_catalog.py Future3VLForConditionalGeneration and pass "
                                                             "--catalog FILE or set ACCEL_CATALOG"));
  }
  SECTION("a speech encoder: the feature encoder before the transformer encoder") {
    accel_test::TempDir dir;
    write_checkpoint(dir.path(), {"wav2vec9.encoder.layers.0.w", "wav2vec9.feature_extractor.conv_layers.0.conv.weight",
                                  "wav2vec9.feature_projection.projection.weight", "lm_head.weight"},
                     R"({"architectures": ["Wav2Vec9ForCTC"], "model_type": "wav2vec9"})");
    const auto m = accel::read_checkpoint_model(dir.path());
    CHECK(model_order(m.tree) == Strings{"wav2vec9.feature_extractor.conv_layers.0.conv.weight",
                                         "wav2vec9.feature_projection.projection.weight", "wav2vec9.encoder.layers.0.w",
                                         "lm_head.weight"});
  }
  SECTION("norms after the numbered blocks; LFM2's embedding_norm is a norm") {
    accel_test::TempDir dir;
    write_checkpoint(dir.path(), {"model.embedding_norm.weight", "model.layers.0.w", "model.embed_tokens.weight",
                                  "model.final_layernorm.weight", "model.layers.1.w"},
                     R"({"architectures": ["Lfm9ForCausalLM"], "model_type": "lfm9", "tie_word_embeddings": false})");
    const auto m = accel::read_checkpoint_model(dir.path());
    CHECK(model_order(m.tree) == Strings{"model.embed_tokens.weight", "model.layers.0.w", "model.layers.1.w",
                                         "model.embedding_norm.weight", "model.final_layernorm.weight"});
  }
}

TEST_CASE("a user's catalog plans a class accel's catalog lacks exactly, and is looked up first", "[checkpoint_tree][catalog]") {
  accel_test::TempDir dir;
  write_checkpoint(dir.path(), {"model.b.weight", "model.a.weight", "head.weight"},
                   R"({"architectures": ["TinyNewForCausalLM"], "model_type": "tiny_new"})");
  // Construction order b, a (alphabetical would give a, b); `model.a` is the no-split block.
  accel_test::write_text(dir / "user_catalog.json", R"({"format": 2, "transformers": "6.1.0", "architectures": [
      {"architecture": "TinyNewForCausalLM", "model_type": "tiny_new", "config_class": "TinyNewConfig", "base_model_prefix": "model",
       "no_split_modules": ["TinyBlock"],
       "modules": [{"path": "", "class": "TinyNewForCausalLM"}, {"path": "model", "class": "TinyNewModel"},
                   {"path": "model.b", "class": "Linear", "parameters": ["weight"]},
                   {"path": "model.a", "class": "TinyBlock", "parameters": ["weight"]},
                   {"path": "head", "class": "Linear", "parameters": ["weight"]}]}]})");
  accel::CheckpointTreeOptions opts;
  opts.catalog_file = dir / "user_catalog.json";
  const auto m = accel::model_from_checkpoint(accel::resolve_checkpoint(dir.path()), opts);
  REQUIRE(m.architecture);
  CHECK(m.architecture->name == "TinyNewForCausalLM");
  CHECK(m.no_split_classes() == Strings{"TinyBlock"});
  CHECK(model_order(m.tree) == Strings{"model.b.weight", "model.a.weight", "head.weight"});
  CHECK_THAT(m.architecture_note, accel_test::contains("TinyNewForCausalLM (catalog " + (dir / "user_catalog.json").string() +
                                                       ", transformers 6.1.0)"));
  opts.catalog_file = dir / "missing.json";
  CHECK_THROWS_WITH(accel::model_from_checkpoint(accel::resolve_checkpoint(dir.path()), opts),
                    accel_test::contains("catalog file '" + (dir / "missing.json").string() + "': cannot read architecture catalog"));
}
