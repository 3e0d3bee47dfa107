// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel plan` and `accel estimate-memory` through the built command.
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "support/catch.hpp"
#include "support/models.hpp"
#include "support/run_command.hpp"
#include "support/safetensors_writer.hpp"

namespace {
// ModelForTest from accelerate's tests: linear1 64 B, batchnorm 72 B, linear2 100 B (float32).
constexpr const char* skeleton = R"({
  "modules": [{"name": ""}, {"name": "linear1"}, {"name": "batchnorm", "class": "BatchNorm1d"}, {"name": "linear2"}],
  "parameters": [{"name": "linear1.weight", "shape": [4, 3], "dtype": "float32"},
                 {"name": "linear1.bias", "shape": [4], "dtype": "float32"},
                 {"name": "batchnorm.weight", "shape": [4], "dtype": "float32"},
                 {"name": "batchnorm.bias", "shape": [4], "dtype": "float32"},
                 {"name": "linear2.weight", "shape": [5, 4], "dtype": "float32"},
                 {"name": "linear2.bias", "shape": [5], "dtype": "float32"}],
  "buffers": [{"name": "batchnorm.running_mean", "shape": [4], "dtype": "float32"},
              {"name": "batchnorm.running_var", "shape": [4], "dtype": "float32"},
              {"name": "batchnorm.num_batches_tracked", "shape": [], "dtype": "int64"}]})";

using accel_test::quoted;
}  // namespace

TEST_CASE("accel plan --json prints only the device map for explicit GPU budgets without a GPU", "[cli][plan]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  auto r = accel_test::run_command(
      accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") + " --max-memory 0=200,1=200 --device-map sequential --json"));
  REQUIRE(r.status == 0);
  auto j = nlohmann::ordered_json::parse(r.output);
  CHECK(j.dump() == R"({"linear1":0,"batchnorm":1,"linear2":1})");
}

TEST_CASE("accel plan --gpu-reserve-layers keeps room for more fetch buffers on the first GPU", "[cli][plan]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  const std::string base = "plan --skeleton " + quoted(dir / "m.json") + " --max-memory 0=300,1=300 --device-map sequential --json";
  auto one = accel_test::run_command(accel_test::accel_cli(base));
  REQUIRE(one.status == 0);
  CHECK(nlohmann::ordered_json::parse(one.output).dump() == R"({"":0})");
  auto two = accel_test::run_command(accel_test::accel_cli(base + " --gpu-reserve-layers 2"));
  REQUIRE(two.status == 0);
  CHECK(nlohmann::ordered_json::parse(two.output).dump() == R"({"linear1":0,"batchnorm":1,"linear2":1})");
  auto bad = accel_test::run_command(accel_test::accel_cli(base + " --gpu-reserve-layers 0 2>&1"));
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, accel_test::contains("--gpu-reserve-layers '0' is not a positive integer"));
}

TEST_CASE("accel plan prints the table, the streaming cost and the map, and draws an SVG", "[cli][plan]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  auto r = accel_test::run_command(accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") +
                                                         " --max_memory '0=170,cpu=80' --svg " + quoted(dir / "p.svg") + " 2>&1"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("device  budget") != std::string::npos);
  CHECK(r.output.find("0       170 B") != std::string::npos);
  CHECK(r.output.find("stream to GPU 0") != std::string::npos);
  CHECK(r.output.find(R"("linear1":0)") != std::string::npos);
  std::ifstream svg(dir / "p.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(text.rfind("<svg", 0) == 0);
  CHECK(text.find("GPU 0") != std::string::npos);
  CHECK(text.find("</svg>") != std::string::npos);
}

TEST_CASE("accel plan reads a sharded checkpoint's headers", "[cli][plan]") {
  accel_test::TempDir dir;
  std::vector<accel_test::TensorSpec> a, b;
  a.push_back({"model.embed_tokens.weight", accel::DType::BF16, {64, 16}, {}});
  for (int i = 0; i < 4; ++i) (i < 2 ? a : b).push_back({"model.layers." + std::to_string(i) + ".w", accel::DType::BF16, {16, 16}, {}});
  b.push_back({"lm_head.weight", accel::DType::BF16, {64, 16}, {}});
  accel_test::write_sharded(dir.path(), {a, b});
  auto r = accel_test::run_command(accel_test::accel_cli("plan --checkpoint " + quoted(dir.path()) +
                                                         " --max-memory 0=3000,1=3000,cpu=600 --device-map sequential --json"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  auto j = nlohmann::ordered_json::parse(r.output);
  CHECK(j.begin().key() == "model.embed_tokens");
  CHECK(j.contains("lm_head"));
}

TEST_CASE("accel plan maps each failure to its exit code and message", "[cli][plan]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  const std::string sk = " --skeleton " + quoted(dir / "m.json");
  auto infeasible = accel_test::run_command(accel_test::accel_cli("plan" + sk + " --max-memory 0=50,disk=0 2>&1"));
  CHECK(infeasible.status == 5);
  CHECK(infeasible.output.find("[accel.planning] cannot place") != std::string::npos);
  auto budget = accel_test::run_command(accel_test::accel_cli("plan" + sk + " --max-memory cuda:0=5GiB 2>&1"));
  CHECK(budget.status == 3);
  CHECK(budget.output.find("unknown max_memory key 'cuda:0'") != std::string::npos);
  auto option = accel_test::run_command(accel_test::accel_cli("plan" + sk + " --bogus 2>&1"));
  CHECK(option.status == 2);
  CHECK(option.output.find("unknown option '--bogus'") != std::string::npos);
  auto source = accel_test::run_command(accel_test::accel_cli("plan --max-memory 0=1GiB 2>&1"));
  CHECK(source.status == 2);
  CHECK(source.output.find("give exactly one of --checkpoint PATH or --skeleton FILE") != std::string::npos);
  auto mode = accel_test::run_command(accel_test::accel_cli("plan" + sk + " --max-memory 0=1GiB --device-map fastest 2>&1"));
  CHECK(mode.status == 2);
  accel_test::write_bytes(dir / "bad.safetensors", std::vector<std::byte>(4));
  auto ckpt = accel_test::run_command(accel_test::accel_cli("plan --checkpoint " + quoted(dir / "bad.safetensors") + " --max-memory 0=1GiB 2>&1"));
  CHECK(ckpt.status == 6);
  CHECK(ckpt.output.find("file is 4 bytes") != std::string::npos);
  accel_test::write_text(dir / "broken.json", R"({"parameters": [{"name": "w", "shape": [1]}]})");
  auto skel = accel_test::run_command(accel_test::accel_cli("plan --skeleton " + quoted(dir / "broken.json") + " --max-memory 0=1GiB 2>&1"));
  CHECK(skel.status == 3);
  CHECK(skel.output.find("parameters[0] has no 'dtype'") != std::string::npos);
  auto help = accel_test::run_command(accel_test::accel_cli("plan --help"));
  CHECK(help.status == 0);
  CHECK(help.output.find("--max-memory BUDGETS") != std::string::npos);
}

TEST_CASE("accel plan without budgets measures the machine", "[cli][plan]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  auto r = accel_test::run_command(accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") + " 2>&1"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("budgets (measured") != std::string::npos);
}

TEST_CASE("accel estimate-memory prints total and largest layer per dtype", "[cli][plan]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  auto r = accel_test::run_command(accel_test::accel_cli("estimate-memory --skeleton " + quoted(dir / "m.json") + " --json"));
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.output);
  REQUIRE(j.size() == 4);
  CHECK(j[0]["dtype"] == "float32");
  CHECK(j[0]["total_bytes"] == 236);
  CHECK(j[0]["largest_layer"] == "linear2");
  CHECK(j[0]["largest_layer_bytes"] == 100);
  CHECK(j[1]["total_bytes"] == 122);  // int64 counter keeps 8 bytes
  CHECK(j[3]["dtype"] == "int4");
  CHECK(j[3]["total_bytes"] == 114 / 4 + 8);
  auto table = accel_test::run_command(accel_test::accel_cli("estimate-memory --skeleton " + quoted(dir / "m.json")));
  CHECK(table.status == 0);
  CHECK(table.output.find("float16     50 B (linear2)") != std::string::npos);
  auto bad = accel_test::run_command(accel_test::accel_cli("estimate-memory --skeleton " + quoted(dir / "m.json") + " --dtypes float7 2>&1"));
  CHECK(bad.status == 2);
  CHECK(bad.output.find("unknown dtype 'float7'") != std::string::npos);
}

TEST_CASE("accel plan on hostile JSON exits 3 with a short message, never a signal", "[cli][plan]") {
  accel_test::TempDir dir;
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  // A shape nested 100k deep used to crash the error message's recursive dump() with SIGSEGV.
  accel_test::write_text(dir / "deep.json", R"({"parameters": [{"name": "w", "dtype": "F16", "shape": [)" + deep + "]}]}");
  auto r = accel_test::run_command(accel_test::accel_cli("plan --skeleton " + quoted(dir / "deep.json") + " --max-memory 0=1GiB 2>&1"));
  CHECK(r.status == 3);
  CHECK_THAT(r.output, accel_test::contains("nested deeper than 256 levels"));
  CHECK(r.output.size() < 1000);
  accel_test::write_text(dir / "m.json", skeleton);
  for (const char* budgets : {R"('{"cpu":1e30}')", R"('{"cpu":1.5}')", R"('{"0":1e30}')", R"('{"cpu":18446744073709551616}')"}) {
    auto b = accel_test::run_command(accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") + " --max-memory " + budgets + " 2>&1"));
    INFO(budgets << ": " << b.output);
    CHECK(b.status == 3);  // used to plan with a budget of 0 or 1 byte and exit 0
    CHECK_THAT(b.output, accel_test::contains("use a whole byte count"));
  }
}

TEST_CASE("accel plan reads config.json: catalog blocks, the load dtype, checked no-split names, --like accelerate", "[cli][plan]") {
  accel_test::TempDir dir;
  std::vector<accel_test::TensorSpec> t{{"model.embed_tokens.weight", accel::DType::BF16, {64, 16}, {}}};
  for (int i = 0; i < 4; ++i)
    for (const char* p : {".self_attn.q_proj.weight", ".mlp.up_proj.weight"})
      t.push_back({"model.layers." + std::to_string(i) + p, accel::DType::BF16, {16, 16}, {}});
  t.push_back({"model.norm.weight", accel::DType::BF16, {16}, {}});
  t.push_back({"lm_head.weight", accel::DType::BF16, {64, 16}, {}});
  accel_test::write_safetensors(dir / "model.safetensors", t);
  accel_test::write_text(dir / "config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16,
      "num_attention_heads": 2, "num_hidden_layers": 4, "torch_dtype": "bfloat16"})");
  const std::string base = "plan --checkpoint " + quoted(dir.path()) + " --max-memory 0=8000,1=8000,cpu=100000";
  auto r = accel_test::run_command(accel_test::accel_cli(base + " --device-map balanced 2>&1"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, accel_test::contains("architecture: LlamaForCausalLM (architecture catalog, transformers 5.25.0)"));
  CHECK_THAT(r.output, accel_test::contains("blocks: LlamaDecoderLayer (catalog); rules: transformers; dtype: bfloat16"));
  CHECK_THAT(r.output, accel_test::contains("GPU 0 budget lowered from 7.81 KiB to 6.53 KiB: balanced share"));
  // bf16 on disk, float32 when loaded: sized at 4 bytes (the defect sized them at 2).
  auto f32 = accel_test::run_command(accel_test::accel_cli(base + " --dtype float32"));
  CHECK_THAT(f32.output, accel_test::contains("tensors, 16.09 KiB"));
  auto acc = accel_test::run_command(accel_test::accel_cli(base + " --dtype float32 --like accelerate"));
  CHECK_THAT(acc.output, accel_test::contains("tensors, 8.06 KiB"));
  CHECK_THAT(acc.output, accel_test::contains("blocks: none (--like accelerate without --no-split)"));
  auto typo = accel_test::run_command(accel_test::accel_cli(base + " --no-split LlamaDecoderLayr 2>&1"));
  CHECK(typo.status == 2);
  CHECK_THAT(typo.output, accel_test::contains("no-split 'LlamaDecoderLayr' matches no module of this model"));
  CHECK_THAT(typo.output, accel_test::contains("did you mean 'LlamaDecoderLayer'?"));
  auto none = accel_test::run_command(accel_test::accel_cli(base + " --no-split none"));
  CHECK_THAT(none.output, accel_test::contains("blocks: none (--no-split none)"));
  auto est = accel_test::run_command(accel_test::accel_cli("estimate-memory --checkpoint " + quoted(dir.path()) + " --json"));
  REQUIRE(est.status == 0);
  auto j = nlohmann::json::parse(est.output);
  CHECK(j[0]["largest_layer"] == "model.embed_tokens");
  CHECK(j[1]["largest_layer_bytes"] == 2048);
}

TEST_CASE("accel plan --skeleton naming a folder is a config error (3) with one prefix, not an internal error", "[cli][plan]") {
  accel_test::TempDir dir;
  auto r = accel_test::run_command(accel_test::accel_cli("plan --skeleton " + quoted(dir.path()) + " 2>&1"));
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK(r.output.find("accel plan: [accel.config] cannot read model skeleton '" + dir.path().string() + "': it is a folder") !=
        std::string::npos);
}

TEST_CASE("accel plan names the execution GPU and the fetch buffers it kept room for, as accel load uses them",
          "[cli][plan][execution]") {
  // The map accel load plans for 0=75MiB,1=75MiB,cpu=20MiB on a 50 MB Llama as float32, scaled down
  // 16x: GPU 0 keeps room for two buffers of the LM head and so holds no weight; it runs the LM head.
  accel_test::TempDir dir;
  accel_test::write_scaled_llama(dir.path());
  const std::string base = "plan --checkpoint " + quoted(dir.path()) +
                           " --max-memory 0=4800KiB,1=4800KiB,cpu=1280KiB --dtype float32 --gpu-reserve-layers 2";
  auto text = accel_test::run_command(accel_test::accel_cli(base + " 2>&1"));
  INFO(text.output);
  REQUIRE(text.status == 0);
  CHECK_THAT(text.output, accel_test::contains("0       4.69 MiB     0 B") &&
                              accel_test::contains("execution GPU 0: room kept for 2 fetch buffers of 1.95 MiB ('lm_head', the "
                                                   "largest layer left on cpu or disk)") &&
                              accel_test::contains("stream to GPU 0"));
  auto report = accel_test::run_command(accel_test::accel_cli(base + " --json-report"));
  REQUIRE(report.status == 0);
  const auto j = nlohmann::json::parse(report.output);
  CHECK(j["execution"] == nlohmann::json::parse(R"({"gpu": 0, "fetch_buffers": 2, "fetch_buffer_bytes": 2048000,
                                                    "largest_offloaded_layer": "lm_head", "loadable": true})"));
}

TEST_CASE("accel plan --gpus_per_process 2 --process 1 plans on that process's group and names it", "[cli][plan][group]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  const std::string base = "env CUDA_VISIBLE_DEVICES=4,5,6,7 " +
                           accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") +
                                                 " --simulate-gpus 1GiB,1GiB,1GiB,1GiB --gpus_per_process 2 --process 1 ");
  SECTION("the text names the group's GPUs; --json keys index the group") {
    auto text = accel_test::run_command(base + "--max-memory 0=200,1=200 --device-map sequential 2>&1");
    INFO(text.output);
    REQUIRE(text.status == 0);
    CHECK_THAT(text.output, accel_test::contains("group: local process 1 of 2, 2 GPUs each: cuda:2,cuda:3 (physical GPUs 6,7); "
                                                 "the map's GPU keys 0-1 index it"));
    auto json = accel_test::run_command(base + "--max-memory 0=200,1=200 --device-map sequential --json");
    REQUIRE(json.status == 0);
    CHECK(nlohmann::ordered_json::parse(json.output).dump() == R"({"linear1":0,"batchnorm":1,"linear2":1})");
  }
  SECTION("measured budgets come from the group's GPUs only, keyed from 0") {
    const std::string sized = "env CUDA_VISIBLE_DEVICES=4,5,6,7 " +
                              accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") +
                                                    " --simulate-gpus 1GiB,1GiB,2GiB,3GiB --gpus_per_process 2 --process 1 2>&1");
    auto r = accel_test::run_command(sized);
    INFO(r.output);
    REQUIRE(r.status == 0);
    // free less max(1 GiB, 10 %): 2 GiB keeps 1 GiB, 3 GiB keeps 2 GiB; the 1 GiB GPUs of process 0 are not planned on.
    CHECK_THAT(r.output, accel_test::contains("): 0=1.00 GiB, 1=2.00 GiB, cpu="));
  }
  SECTION("a budget key past the group is refused, naming its size") {
    auto r = accel_test::run_command(base + "--max-memory 0=100,2=200 2>&1");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, accel_test::contains("max_memory gives GPU 2 a budget (200 B) but this process's group has 2 GPUs: "
                                              "cuda:2,cuda:3 (physical GPUs 6,7); GPU keys index the group: 0 to 1"));
  }
}

TEST_CASE("accel plan refuses a GPU group it cannot plan for and says what to give", "[cli][plan][group]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", skeleton);
  const std::string base = "plan --skeleton " + quoted(dir / "m.json") + " --max-memory 0=100,1=200 ";
  const auto run = [&](const std::string& args) { return accel_test::run_command(accel_test::accel_cli(base + args + " 2>&1")); };
  auto past = run("--simulate-gpus 1GiB,1GiB,1GiB,1GiB --gpus_per_process 2 --process 2");
  CHECK(past.status == 2);
  CHECK_THAT(past.output, accel_test::contains("plan: --process 2 is out of range: 4 visible GPUs hold 2 processes of 2 GPUs "
                                               "(--process 0 to 1); give one of those, or a smaller --gpus_per_process"));
  auto few = run("--simulate-gpus 1GiB,1GiB --gpus_per_process 3");
  CHECK(few.status == 2);
  CHECK_THAT(few.output, accel_test::contains("plan: --gpus_per_process 3 needs 3 GPUs per process but only 2 GPUs are visible"));
  CHECK_THAT(few.output, accel_test::contains("give --gpus_per_process 2 or less"));
  auto zero = run("--simulate-gpus 1GiB,1GiB --gpus_per_process 0");
  CHECK(zero.status == 2);
  CHECK_THAT(zero.output, accel_test::contains("--gpus_per_process '0' is not a positive integer"));
  auto alone = run("--simulate-gpus 1GiB,1GiB --process 1");
  CHECK(alone.status == 2);
  CHECK_THAT(alone.output, accel_test::contains("plan: --process 1 picks a process of a job with several GPUs per process; give "
                                                "its GPUs per process too (--gpus_per_process K), or drop --process"));
  auto none = accel_test::run_command("env CUDA_VISIBLE_DEVICES= " + accel_test::accel_cli(base + "--gpus_per_process 2 2>&1"));
  CHECK(none.status == 2);
  CHECK_THAT(none.output, accel_test::contains("plan: --gpus_per_process 2 plans on a process's group of GPUs, but no GPU is "
                                               "visible (CUDA_VISIBLE_DEVICES=''); run it where the job's GPUs are, or give "
                                               "them with --simulate-gpus SIZES"));
  auto help = accel_test::run_command(accel_test::accel_cli("plan --help"));
  CHECK_THAT(help.output, accel_test::contains("--gpus-per-process K") && accel_test::contains("--process R") &&
                              accel_test::contains("--simulate-gpus SIZES") &&
                              accel_test::contains("With --gpus_per_process K [--process R] it plans as local process R"));
}
