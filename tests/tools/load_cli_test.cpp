// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel load` through the built command, on host-simulated GPUs (--simulate-gpus).
#include <accel/load/convert.hpp>
#include <accel/load/offload.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/models.hpp"
#include "support/run_command.hpp"
#include "support/safetensors_writer.hpp"

using accel::DType;

namespace {
using accel_test::quoted;

void write_model(const std::filesystem::path& dir) {
  accel_test::write_sharded(dir, {{{"model.embed.weight", DType::F16, {64, 16}, {}}, {"model.layers.0.w", DType::F32, {32, 32}, {}}},
                                  {{"model.layers.1.w", DType::F32, {32, 32}, {}}, {"model.layers.1.ids", DType::I64, {8}, {}},
                                   {"lm_head.weight", DType::F16, {64, 16}, {}}}});
}

// A float32 T5 (one encoder and one decoder block, the parts that matter): transformers keeps the
// feed-forward output projections `wo` in float32 when loading in float16 (the catalog's
// keep-in-fp32 modules), and `shared` is tied to both embeddings and the LM head.
void write_t5(const std::filesystem::path& dir) {
  accel_test::write_safetensors(dir / "model.safetensors",
                                {{"shared.weight", DType::F32, {32, 8}, {}},
                                 {"encoder.block.0.layer.0.SelfAttention.q.weight", DType::F32, {8, 8}, {}},
                                 {"encoder.block.0.layer.1.DenseReluDense.wi.weight", DType::F32, {16, 8}, {}},
                                 {"encoder.block.0.layer.1.DenseReluDense.wo.weight", DType::F32, {8, 16}, {}},
                                 {"encoder.final_layer_norm.weight", DType::F32, {8}, {}},
                                 {"decoder.block.0.layer.2.DenseReluDense.wo.weight", DType::F32, {8, 16}, {}},
                                 {"decoder.final_layer_norm.weight", DType::F32, {8}, {}}});
  accel_test::write_text(dir / "config.json", R"({"architectures": ["T5ForConditionalGeneration"], "d_model": 8, "d_kv": 4,
      "d_ff": 16, "num_heads": 2, "num_layers": 1, "num_decoder_layers": 1, "vocab_size": 32, "torch_dtype": "float32"})");
}

// A float32 Llama whose config says bfloat16 and ties the LM head to the embedding.
void write_llama(const std::filesystem::path& dir, const std::filesystem::path& config) {
  std::vector<accel_test::TensorSpec> t{{"model.embed_tokens.weight", DType::F32, {64, 16}, {}}};
  for (int i = 0; i < 2; ++i)
    for (const char* p : {".self_attn.q_proj.weight", ".mlp.up_proj.weight", ".input_layernorm.weight"})
      t.push_back({"model.layers." + std::to_string(i) + p, DType::F32, p[1] == 'i' ? std::vector<std::int64_t>{16} : std::vector<std::int64_t>{16, 16}, {}});
  t.push_back({"model.norm.weight", DType::F32, {16}, {}});
  accel_test::write_safetensors(dir / "model.safetensors", t);
  accel_test::write_text(config, R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_attention_heads": 2,
      "num_hidden_layers": 2, "torch_dtype": "bfloat16", "tie_word_embeddings": true})");
}

struct DumpedTensor {
  std::string dtype;
  std::vector<std::byte> bytes;
};

// What `accel load --dump-dir` wrote: name -> dtype and bytes, through accel's offload-index reader.
std::map<std::string, DumpedTensor> read_dump(const std::filesystem::path& dir) {
  std::map<std::string, DumpedTensor> out;
  for (const auto& [name, entry] : accel::read_offload_index(dir)) {
    std::ifstream in(accel::offload_file(dir, name), std::ios::binary);
    std::vector<char> raw{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    DumpedTensor d{std::string(accel::torch_name(entry.dtype)), {}};
    for (char c : raw) d.bytes.push_back(static_cast<std::byte>(c));
    REQUIRE(d.bytes.size() == entry.size_bytes());
    out.emplace(name, std::move(d));
  }
  return out;
}
}  // namespace

TEST_CASE("accel load with a device map file prints per-device totals and the load rate", "[cli][load]") {
  accel_test::TempDir dir;
  write_model(dir.path());
  accel_test::write_text(dir / "map.json", R"({"model.embed": 0, "model.layers.0": 1, "model.layers.1": "cpu", "lm_head": "disk"})");
  auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) + " --device-map " +
                                                         quoted(dir / "map.json") + " --simulate-gpus 1MiB,1MiB 2>&1"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("(5 tensors, 12.1 KiB), device map from") != std::string::npos);
  CHECK(r.output.find("cuda:0            1     2.00 KiB  1 device") != std::string::npos);
  CHECK(r.output.find("cuda:1            1     4.00 KiB  1 device") != std::string::npos);
  CHECK(r.output.find("cpu               2     4.06 KiB  2 pageable") != std::string::npos);
  CHECK(r.output.find("disk              1     2.00 KiB  1 mmap") != std::string::npos);
  CHECK(r.output.find("copied at") != std::string::npos);
  CHECK(r.output.find("fetch buffers on cuda:0: 2 x") != std::string::npos);
}

TEST_CASE("accel load --json plans a map from the headers and reports conversions", "[cli][load]") {
  accel_test::TempDir dir;
  write_model(dir.path());
  // The GPU is exactly the budget: the plan leaves room for both fetch buffers (2 largest layers).
  auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) +
                                                         " --device-map sequential --max-memory 0=8KiB,cpu=1GiB"
                                                         " --simulate-gpus 8KiB --dtype bfloat16 --json"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.output);
  CHECK(j["bytes_loaded"] == 2048 + 2048 + 2048 + 64 + 2048);  // F32 -> BF16 halves the two matrices
  CHECK(j["devices"]["0"]["tensors"].get<int>() >= 1);
  CHECK(j["devices"].contains("cpu"));
  CHECK(j["unexpected"].empty());
  CHECK(j["fetch_buffers"] == 2);
  CHECK(j["warnings"].empty());
}

TEST_CASE("accel load maps bad input to documented exit codes with the reason", "[cli][load]") {
  accel_test::TempDir dir;
  write_model(dir.path());
  const std::string ck = " --checkpoint " + quoted(dir.path());
  SECTION("a truncated shard is a checkpoint error (6)") {
    std::filesystem::resize_file(dir / "model-00002-of-00002.safetensors", 100);
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --device-map '{\"\": \"cpu\"}' 2>&1"));
    CHECK(r.status == 6);
    CHECK(r.output.find("[accel.checkpoint] invalid safetensors file") != std::string::npos);
  }
  SECTION("a map naming an absent GPU is unavailable (4)") {
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --device-map '{\"\": 3}' --simulate-gpus 1MiB 2>&1"));
    CHECK(r.status == 4);
    CHECK(r.output.find("places '' on GPU 3 but only 1 GPU(s) are visible") != std::string::npos);
  }
  SECTION("budgets naming an absent GPU are unavailable (4), even where the plan would leave that GPU empty") {
    // 1 KiB holds no layer of this model: the plan alone would put everything on the CPU.
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --max-memory 3=1KiB,cpu=1GiB --simulate-gpus 1MiB 2>&1"));
    CHECK(r.status == 4);
    CHECK(r.output.find("max_memory gives GPU 3 a budget (1.00 KiB) but only GPU 0 is visible") != std::string::npos);
  }
  SECTION("a GPU too small is out of memory, naming device and bytes") {
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --device-map '{\"\": 0}' --simulate-gpus 4KiB 2>&1"));
    CHECK(r.status == 9);
    CHECK(r.output.find("out of device memory on cuda:0 (host-simulated): requested") != std::string::npos);
  }
  SECTION("strict mode refuses tensors the map does not cover (6)") {
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --device-map '{\"model\": \"cpu\"}' --strict 2>&1"));
    CHECK(r.status == 6);
    CHECK(r.output.find("1 unexpected tensor(s) ('lm_head.weight')") != std::string::npos);
  }
  SECTION("a bad option is a usage error (2)") {
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --cpu-memory sometimes 2>&1"));
    CHECK(r.status == 2);
    CHECK(r.output.find("is not pageable, pinned or zero-copy") != std::string::npos);
  }
  SECTION("--help describes the command") {
    auto r = accel_test::run_command(accel_test::accel_cli("load --help"));
    CHECK(r.status == 0);
    CHECK(r.output.find("usage: accel load --checkpoint PATH") != std::string::npos);
  }
}

TEST_CASE("accel load reports broken checkpoints and maps with their documented exit codes", "[cli][load]") {
  accel_test::TempDir dir;
  const std::string cpu_map = " --device-map '{\"\": \"cpu\"}' 2>&1";
  SECTION("an index whose weight_map is empty is a checkpoint error (6), for load and plan") {
    accel_test::write_text(dir / "model.safetensors.index.json", R"({"metadata": {"total_size": 0}, "weight_map": {}})");
    auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) + cpu_map));
    CHECK(r.status == 6);
    CHECK(r.output.find("'weight_map' is empty") != std::string::npos);
    r = accel_test::run_command(accel_test::accel_cli("plan --checkpoint " + quoted(dir / "model.safetensors.index.json") +
                                                      " --max-memory cpu=1GiB 2>&1"));
    CHECK(r.status == 6);
    CHECK(r.output.find("'weight_map' is empty") != std::string::npos);
  }
  SECTION("a symbolic link loop in the checkpoint folder is a checkpoint error (6), not an internal error") {
    write_model(dir.path());
    std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
    std::filesystem::create_symlink(dir / "model-00002-of-00002.safetensors", dir / "model-00002-of-00002.safetensors");
    auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) + cpu_map));
    INFO(r.output);
    CHECK(r.status == 6);
    CHECK(r.output.find("cannot be resolved: Too many levels of symbolic links (a symbolic link loop)") != std::string::npos);
    r = accel_test::run_command(accel_test::accel_cli("plan --checkpoint " + quoted(dir / "model-00002-of-00002.safetensors") +
                                                      " --max-memory cpu=1GiB 2>&1"));
    CHECK(r.status == 6);
    CHECK(r.output.find("(a symbolic link loop)") != std::string::npos);
  }
  SECTION("a device map file that is a symbolic link loop is a config error (3)") {
    write_model(dir.path());
    std::filesystem::create_symlink(dir / "map.json", dir / "map.json");
    auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) + " --device-map " +
                                                           quoted(dir / "map.json") + " 2>&1"));
    CHECK(r.status == 3);
    CHECK(r.output.find("map.json': Too many levels of symbolic links") != std::string::npos);
  }
  SECTION("a device map placing a module and its child on different devices is a config error (3)") {
    write_model(dir.path());
    auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) +
                                                           " --device-map '{\"\": \"cpu\", \"model.layers.1\": \"disk\"}' 2>&1"));
    CHECK(r.status == 3);
    CHECK(r.output.find("device map keys '' (cpu) and 'model.layers.1' (disk) both cover tensor") != std::string::npos);
  }
}

TEST_CASE("accel load into a full offload folder exits 3 naming the bytes needed, and the rerun completes it",
          "[cli][load][offload]") {
  accel_test::TempDir dir, offload;
  write_model(dir.path());
  accel_test::write_text(dir / "map.json", R"({"": "disk"})");
  const std::string load = accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) + " --device-map " +
                                                 quoted(dir / "map.json") + " --dtype bfloat16 --offload-folder " +
                                                 quoted(offload.path()));
  // Four tensors become 2 KiB bfloat16 files. With SIGXFSZ ignored and a 1 KiB file-size limit
  // the first write fails with EFBIG, as on a full disk.
  auto r = accel_test::run_command("bash -c \"trap '' XFSZ; ulimit -f 1; exec " + load + "\" 2>&1");
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK(r.output.find("ran out of space (File too large)") != std::string::npos);
  CHECK(r.output.find("4 tensors of 8.00 KiB (8192 bytes) are still to be written; free that much space") != std::string::npos);
  CHECK(r.output.find(offload.path().string()) != std::string::npos);
  r = accel_test::run_command(load + " --quiet 2>&1");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output.find("offload folder: 4 written") != std::string::npos);
}

TEST_CASE("accel load converts with accel plan's dtype decision: the catalog's keep-in-fp32 modules and dtype auto",
          "[cli][load]") {
  accel_test::TempDir dir, dump;
  SECTION("T5 in float16 keeps wo in float32, as accel plan sizes it") {
    write_t5(dir.path());
    auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) +
                                                           " --device-map '{\"\": \"cpu\"}' --dtype float16 --json --dump-dir " +
                                                           quoted(dump.path())));
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.output);
    CHECK(j["keep_in_fp32"] == nlohmann::json::array({"wo"}));
    const auto tensors = read_dump(dump.path());
    REQUIRE(tensors.size() == 7);
    for (const auto& [name, t] : tensors) {
      INFO(name);
      CHECK(t.dtype == (name.find(".wo.") != std::string::npos ? "float32" : "float16"));
    }
    // 2 bytes a float16 element, 4 for the two wo: the total accel plan prints for the same dtype.
    const std::uint64_t expected = 2 * (32 * 8 + 8 * 8 + 16 * 8 + 8 + 8) + 4 * (2 * 8 * 16);
    CHECK(j["bytes_loaded"] == expected);
    auto plan = accel_test::run_command(accel_test::accel_cli("plan --checkpoint " + quoted(dir.path()) +
                                                              " --max-memory cpu=1GiB --dtype float16"));
    CHECK_THAT(plan.output, accel_test::contains("tensors, " + accel::text::format_bytes(expected) + ", mode auto"));
    // The wo stay float32 because of the catalog: bfloat16 has no such rule for T5.
    auto bf16 = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) +
                                                              " --device-map '{\"\": \"cpu\"}' --dtype bfloat16 --json"));
    CHECK(nlohmann::json::parse(bf16.output)["bytes_loaded"] == 2 * (32 * 8 + 8 * 8 + 16 * 8 + 2 * 8 * 16 + 8 + 8));
  }
  SECTION("no --dtype with a config.json is auto: the config's dtype, from --config too") {
    accel_test::TempDir elsewhere;
    write_llama(dir.path(), elsewhere / "config.json");
    auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) + " --config " +
                                                           quoted(elsewhere / "config.json") +
                                                           " --device-map '{\"\": \"cpu\"}' --dump-dir " + quoted(dump.path())));
    INFO(r.output);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.output, accel_test::contains("architecture: LlamaForCausalLM (architecture catalog"));
    CHECK_THAT(r.output, accel_test::contains("dtype: bfloat16 (auto: config.json)"));
    for (const auto& [name, t] : read_dump(dump.path())) {
      INFO(name);
      CHECK(t.dtype == "bfloat16");
    }
    // Without the config nothing says bfloat16: tensors load as stored.
    auto stored = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) +
                                                                " --device-map '{\"\": \"cpu\"}' --json"));
    CHECK(nlohmann::json::parse(stored.output)["dtype"].is_null());
  }
}

TEST_CASE("accel load accepts the map accel plan writes silently and still reports keys the model does not explain",
          "[cli][load]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), dir / "config.json");
  const std::string ck = " --checkpoint " + quoted(dir.path());
  // Spread over cpu and disk, so the map has a key per block, the rotary buffers and the tied head.
  auto plan = accel_test::run_command(accel_test::accel_cli("plan" + ck + " --max-memory cpu=4KiB --json"));
  INFO(plan.output);
  REQUIRE(plan.status == 0);
  accel_test::write_text(dir / "map.json", plan.output);
  const auto map = nlohmann::ordered_json::parse(plan.output);
  REQUIRE(map.contains("model.rotary_emb"));
  REQUIRE(map.contains("lm_head"));
  REQUIRE(map["model.layers"] == "disk");
  auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --device-map " + quoted(dir / "map.json") +
                                                         " --offload-folder " + quoted(dir / "offload") + " 2>&1"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("note:") == std::string::npos);
  auto j = nlohmann::json::parse(accel_test::run_command(accel_test::accel_cli(
      "load" + ck + " --device-map " + quoted(dir / "map.json") + " --offload-folder " + quoted(dir / "offload") + " --json")).output);
  CHECK(j["unused_device_map_keys"].empty());
  CHECK(j["model_only_device_map_keys"] == nlohmann::json::array({"model.rotary_emb", "lm_head"}));

  // A key the model lacks, next to the model's own keys, is still reported.
  auto odd = accel_test::run_command(accel_test::accel_cli(
      "load" + ck + " --device-map '{\"model\": \"cpu\", \"model.rotary_emb\": \"cpu\", \"lm_head\": \"cpu\", \"model.bogus\": \"cpu\"}' 2>&1"));
  INFO(odd.output);
  REQUIRE(odd.status == 0);
  CHECK_THAT(odd.output, accel_test::contains("note: 1 device-map key(s) cover no checkpoint tensor and name nothing the "
                                              "model computes or ties: 'model.bogus'"));
}

TEST_CASE("accel load --dump-dir writes every tensor as loaded, copied back from the GPUs", "[cli][load]") {
  accel_test::TempDir dir, dump;
  write_model(dir.path());
  auto r = accel_test::run_command(accel_test::accel_cli(
      "load --checkpoint " + quoted(dir.path()) + " --simulate-gpus 1MiB --dtype float32 --offload-folder " +
      quoted(dir / "offload") + " --device-map '{\"model.embed\": 0, \"model.layers\": \"cpu\", \"lm_head\": \"disk\"}' --dump-dir " +
      quoted(dump.path()) + " 2>&1"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, accel_test::contains("loaded tensors written to " + dump.path().string()));
  const auto t = read_dump(dump.path());
  REQUIRE(t.size() == 5);
  // Stored float32 and int64: the file's bytes unchanged.
  CHECK(t.at("model.layers.0.w").bytes == accel_test::pattern_bytes("model.layers.0.w", 32 * 32 * 4));
  CHECK(t.at("model.layers.1.ids").dtype == "int64");
  CHECK(t.at("model.layers.1.ids").bytes == accel_test::pattern_bytes("model.layers.1.ids", 8 * 8));
  // float16 on disk and on the (simulated) GPU, converted to float32 exactly.
  for (const char* name : {"model.embed.weight", "lm_head.weight"}) {
    INFO(name);
    const auto& d = t.at(name);
    CHECK(d.dtype == "float32");
    REQUIRE(d.bytes.size() == 64 * 16 * 4);
    const auto src = accel_test::pattern_bytes(name, 64 * 16 * 2);
    std::vector<std::byte> expected(d.bytes.size());
    accel::convert_elements(accel::DType::F16, accel::DType::F32, src.data(), expected.data(), 64 * 16);
    CHECK(d.bytes == expected);
  }
  auto same = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) + " --device-map '{\"\": \"cpu\"}'"
                                                            " --offload-folder " + quoted(dump.path()) + " --dump-dir " +
                                                            quoted(dump / "." ) + " 2>&1"));
  CHECK(same.status == 2);
  CHECK_THAT(same.output, accel_test::contains("--dump-dir and --offload-folder name the same folder"));
}

TEST_CASE("accel load fetches into the GPU its plan kept room on, even one that holds no weights", "[cli][load][execution]") {
  // A 50 MB Llama on 0=75MiB,1=75MiB,cpu=20MiB as float32, scaled down 16x: GPU 0 keeps room for
  // two fetch buffers of the LM head (a 1.95 MiB embedding-sized layer), so the embedding no
  // longer fits there and GPU 0 holds nothing; GPU 1 is full. The buffers go to GPU 0, in every
  // mode (the loader used to take the lowest GPU of the map, GPU 1, and ran out of memory there).
  accel_test::TempDir dir;
  accel_test::write_scaled_llama(dir.path());
  const std::string base = "load --checkpoint " + quoted(dir.path()) + " --max-memory 0=4800KiB,1=4800KiB,cpu=1280KiB"
                           " --simulate-gpus 4800KiB,4800KiB --dtype float32 --offload-folder " + quoted(dir / "offload") + " --json";
  for (const char* mode : {"auto", "balanced", "balanced_low_0", "sequential"}) {
    INFO(mode);
    auto fit = accel_test::run_command(accel_test::accel_cli(base + " --device-map " + mode + " 2>&1"));
    INFO(fit.output);
    REQUIRE(fit.status == 0);
    const auto j = nlohmann::json::parse(fit.output);
    CHECK_FALSE(j["devices"].contains("0"));
    CHECK(j["devices"].contains("1"));
    CHECK(j["device_map"]["lm_head"] == "disk");
    CHECK(j["execution_device"] == 0);
    CHECK(j["fetch_buffers"] == 2);
    CHECK(j["fetch_buffer_bytes"] == 2048000);
    CHECK(j["warnings"].empty());
    // The speed objective moves the embedding off the GPUs (read by rows) and loads too.
    auto speed = accel_test::run_command(accel_test::accel_cli(base + " --device-map " + mode + " --objective speed 2>&1"));
    INFO(speed.output);
    CHECK(speed.status == 0);
  }
}

TEST_CASE("accel load refuses a plan no GPU can fetch its offloaded layers into (5), before anything is written",
          "[cli][load][execution]") {
  // 0=17MiB,1=81MiB,cpu=34MiB as float32, scaled down 16x: GPU 0 is too small for a buffer of the
  // LM head, GPU 1 too full.
  accel_test::TempDir dir;
  accel_test::write_scaled_llama(dir.path());
  auto r = accel_test::run_command(accel_test::accel_cli(
      "load --checkpoint " + quoted(dir.path()) + " --max-memory 0=1088KiB,1=5184KiB,cpu=2176KiB --simulate-gpus 1088KiB,5184KiB"
      " --dtype float32 --device-map sequential --offload-folder " + quoted(dir / "offload") + " 2>&1"));
  INFO(r.output);
  CHECK(r.status == 5);
  CHECK_THAT(r.output, accel_test::contains("[accel.planning] cannot load this map: no GPU has room for a fetch buffer of "
                                            "'lm_head' (1.95 MiB, the largest layer left on cpu or disk)") &&
                           accel_test::contains("GPU 0 has 1.06 MiB left of its 1.06 MiB budget, GPU 1 has 819.50 KiB left") &&
                           accel_test::contains("raise a GPU's budget"));
  CHECK_FALSE(std::filesystem::exists(dir / "offload"));
}

TEST_CASE("accel load --gpus_per_process 2 --process 1 loads on that process's group whose GPUs the keys index", "[cli][load][group]") {
  accel_test::TempDir dir;
  write_model(dir.path());
  accel_test::write_text(dir / "map.json", R"({"model.embed": 0, "model.layers.0": 1, "model.layers.1": "cpu", "lm_head": "cpu"})");
  const std::string base = "env CUDA_VISIBLE_DEVICES=4,5,6,7 " +
                           accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) +
                                                 " --simulate-gpus 1MiB,1MiB,1MiB,1MiB --gpus_per_process 2 --process 1 --quiet ");
  auto r = accel_test::run_command(base + "--device-map " + quoted(dir / "map.json") + " 2>&1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("group: local process 1 of 2, 2 GPUs each: cuda:2,cuda:3 (physical GPUs 6,7)") != std::string::npos);
  CHECK(r.output.find("cuda:2            1     2.00 KiB  1 device") != std::string::npos);  // key 0: the group's first
  CHECK(r.output.find("cuda:3            1     4.00 KiB  1 device") != std::string::npos);
  CHECK(r.output.find("fetch buffers on cuda:2:") != std::string::npos);
  auto planned = accel_test::run_command(base + "--device-map balanced --max-memory 0=1MiB,1=1MiB,cpu=1MiB --json");
  REQUIRE(planned.status == 0);
  const auto j = nlohmann::json::parse(planned.output);
  CHECK(j["group"]["devices"] == nlohmann::json::array({"cuda:2", "cuda:3"}));
  CHECK(j["group"]["physical_gpus"] == nlohmann::json::array({"6", "7"}));
  for (const auto& [key, where] : j["device_map"].items()) CHECK((where == 0 || where == 1));
  auto past = accel_test::run_command(base + "--max-memory 0=1MiB,2=1MiB 2>&1");
  CHECK(past.status == 2);
  CHECK(past.output.find("max_memory gives GPU 2 a budget (1.00 MiB) but this process's group has 2 GPUs") != std::string::npos);
  auto out_of_range = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir.path()) +
                                                                    " --simulate-gpus 1MiB,1MiB --gpus_per_process 2 --process 1 2>&1"));
  CHECK(out_of_range.status == 2);
  CHECK(out_of_range.output.find("load: --process 1 is out of range: 2 visible GPUs hold 1 process of 2 GPUs (--process 0)") !=
        std::string::npos);
}

TEST_CASE("accel load --stages loads one rank's stage and reports its planned and loaded bytes", "[cli][load][stages]") {
  const std::string ck =
      " --checkpoint " + quoted(std::filesystem::path(ACCEL_TEST_SOURCE_DIR) / "tests/compat/fixtures/forward/llama");
  std::uint64_t planned = 0, loaded = 0;
  std::size_t tensors = 0;
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --stages 2 --replicas 2 --process " + std::to_string(rank + 2) +
                                                           " --max-memory 0=4MiB,cpu=8MiB --simulate-gpus 8MiB --json"));
    INFO(r.output);
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.output);
    CHECK(j["stage"] == rank);
    CHECK(j["replica"] == 1);
    CHECK(j["bytes_loaded"].get<std::uint64_t>() + j["computed_bytes"].get<std::uint64_t>() == j["planned_bytes"].get<std::uint64_t>());
    CHECK(j["devices"]["0"]["bytes"] == j["bytes_loaded"]);
    planned += j["planned_bytes"].get<std::uint64_t>();
    loaded += j["bytes_loaded"].get<std::uint64_t>();
    tensors += j["tensors"].get<std::size_t>();
  }
  CHECK(tensors == 39);  // the two stages hold the whole checkpoint
  CHECK(loaded < planned);  // the rotary frequencies are computed, not loaded
  SECTION("a rank past the job, or --replicas alone, is a usage error (2)") {
    auto r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --stages 2 --process 2 --max-memory cpu=8MiB 2>&1"));
    CHECK(r.status == 2);
    CHECK(r.output.find("--process 2 with --stages 2 and --replicas 1; ranks are 0 to 1") != std::string::npos);
    r = accel_test::run_command(accel_test::accel_cli("load" + ck + " --replicas 2 --max-memory cpu=8MiB 2>&1"));
    CHECK(r.status == 2);
    CHECK(r.output.find("--replicas needs --stages S") != std::string::npos);
  }
}
