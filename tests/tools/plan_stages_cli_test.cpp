// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel plan --stages S [--replicas R]` through the built command: the text report, --json, the
// SVG, budgets per stage process from simulated GPUs, and the errors.
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "support/catch.hpp"
#include "support/run_command.hpp"
#include "support/safetensors_writer.hpp"

namespace {
using accel_test::quoted;

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A Llama-like skeleton in float32: embed_tokens 2 KiB, six 1 KiB blocks, norm 32 B, lm_head 2 KiB
// (tied to the embedding with `tied`).
std::string llama_skeleton(bool tied = false) {
  nlohmann::json modules = nlohmann::json::array(), params = nlohmann::json::array();
  modules.push_back({{"name", ""}});
  modules.push_back({{"name", "model.embed_tokens"}, {"class", "Embedding"}});
  params.push_back({{"name", "model.embed_tokens.weight"}, {"shape", {64, 8}}, {"dtype", "float32"}});
  for (int i = 0; i < 6; ++i) {
    const std::string l = "model.layers." + std::to_string(i);
    modules.push_back({{"name", l}, {"class", "Block"}});
    params.push_back({{"name", l + ".mlp.weight"}, {"shape", {32, 8}}, {"dtype", "float32"}});
  }
  params.push_back({{"name", "model.norm.weight"}, {"shape", {8}}, {"dtype", "float32"}});
  params.push_back({{"name", "lm_head.weight"}, {"shape", {64, 8}}, {"dtype", "float32"}});
  nlohmann::json j{{"modules", modules}, {"parameters", params}};
  if (tied) j["tied"] = nlohmann::json::array({nlohmann::json::array({"lm_head.weight", "model.embed_tokens.weight"})});
  return j.dump();
}

std::string plan_cmd(const accel_test::TempDir& dir, const std::string& args) {
  return "XDG_CACHE_HOME=" + quoted(dir / "cache") + " " +
         accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") + " --no-split Block " + args);
}
}  // namespace

TEST_CASE("accel plan --stages --json: stages balanced for time, ranks as grid_groups numbers them", "[cli][plan][stages]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton());
  const auto r = accel_test::run_command(plan_cmd(dir, "--stages 2 --replicas 3 --max-memory 0=1MiB,cpu=1MiB --json"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.output);
  CHECK(j["num_stages"] == 2);
  CHECK(j["num_replicas"] == 3);
  CHECK(j["ranks"] == 6);
  REQUIRE(j["stages"].size() == 2);
  // rank = replica * stages + stage
  CHECK(j["stages"][0]["ranks"] == nlohmann::json::array({0, 2, 4}));
  CHECK(j["stages"][1]["ranks"] == nlohmann::json::array({1, 3, 5}));
  // The embedding's rows are free: stage 0 takes it and four blocks (4 KiB read), stage 1 two blocks, norm and head.
  CHECK(j["stages"][0]["first"] == "model.embed_tokens");
  CHECK(j["stages"][0]["last"] == "model.layers.3");
  CHECK(j["stages"][1]["first"] == "model.layers.4");
  CHECK(j["stages"][1]["last"] == "lm_head");
  CHECK(j["stages"][0]["bytes"] == 6144);
  CHECK(j["stages"][0]["gpu_bytes"] == 6144);
  CHECK(j["stages"][0]["device_map"] == nlohmann::json::parse(R"({"model.embed_tokens":0,"model.layers.0":0,"model.layers.1":0,
                                                                  "model.layers.2":0,"model.layers.3":0})"));
  CHECK(j["parameter_split"]["bounds"] == nlohmann::json::array({0, 4, 9}));
  CHECK(j["imbalance"].get<double>() < j["parameter_split"]["imbalance"].get<double>());
  CHECK(j["parameter_split_kept"] == false);
  CHECK(j["rates"]["gpu_read"] == 2e12);
}

TEST_CASE("accel plan --stages: the text report, the tied copy in both end stages, and the SVG", "[cli][plan][stages]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton(true));
  const auto r = accel_test::run_command(
      plan_cmd(dir, "--stages 3 --max-memory 0=1MiB,cpu=1MiB --svg " + quoted(dir / "p.svg")));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, accel_test::contains("3 stages x 1 replica (3 ranks, rank = replica*3 + stage)"));
  CHECK_THAT(r.output, accel_test::contains("units: 9 in execution order"));
  CHECK_THAT(r.output, accel_test::contains("imbalance (slowest / mean): "));
  CHECK_THAT(r.output, accel_test::contains("; split by parameter count: "));
  CHECK_THAT(r.output, accel_test::contains("tied: stage 0 holds 'model.embed_tokens.weight' (tied to 'lm_head.weight' in stage 2): "
                                            "its own copy, counted in its bytes"));
  CHECK_THAT(r.output, accel_test::contains("tied: stage 2 holds 'lm_head.weight' (tied to 'model.embed_tokens.weight' in stage 0)"));
  CHECK_THAT(r.output, accel_test::contains("  stage 2: {"));
  const auto svg = read_text(dir / "p.svg");
  CHECK_THAT(svg, accel_test::contains("<svg"));
  CHECK_THAT(svg, accel_test::contains(">stage 2</text>"));
  CHECK_THAT(svg, accel_test::contains("holds a tied copy"));
  CHECK_THAT(svg, accel_test::contains("3 stages x 1 replica; imbalance (slowest / mean)"));
}

TEST_CASE("accel plan --stages: measured budgets per stage process from simulated GPUs, --process's ranks", "[cli][plan][stages]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton());
  // Four 4 GiB GPUs, two per process: two local processes; 2 stages x 2 replicas = ranks 0-3, so
  // local process 1 holds ranks 1 and 3 (stage 1 of replicas 0 and 1).
  const auto r = accel_test::run_command(
      plan_cmd(dir, "--stages 2 --replicas 2 --simulate-gpus 4GiB,4GiB,4GiB,4GiB --gpus_per_process 2 --process 1 --json"));
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.output);
  // Each group: two GPUs of 4 GiB less 1 GiB held back.
  CHECK_THAT(j["stages"][0]["budgets"].get<std::string>(), accel_test::contains("0=3.00 GiB, 1=3.00 GiB, cpu="));
  CHECK(j["process"]["local_process"] == 1);
  CHECK(j["process"]["holds"] == nlohmann::json::parse(R"([{"rank":1,"replica":0,"stage":1},{"rank":3,"replica":1,"stage":1}])"));
}

TEST_CASE("accel plan --stages: errors say what to give instead", "[cli][plan][stages]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton());
  auto fails = [&](const std::string& args, int status, const std::string& message) {
    const auto r = accel_test::run_command(plan_cmd(dir, args) + " 2>&1");
    INFO(args << "\n" << r.output);
    CHECK(r.status == status);
    CHECK_THAT(r.output, accel_test::contains(message));
  };
  fails("--stages 0 --max-memory 0=1MiB", 2, "--stages '0' is not a positive integer");
  fails("--stages 10 --max-memory 0=1MiB", 2,
        "plan_pipeline: 10 stages, but the model has only 9 units a stage boundary may fall between");
  // Each allows 65536, their product overflows an int: refused before any rank is numbered.
  fails("--stages 65536 --replicas 65536 --max-memory 0=1MiB", 2,
        "plan: 65536 stages x 65536 replicas make 4294967296 ranks, more than accel launch starts (65536); give fewer stages or replicas");
  fails("--stages 257 --replicas 256 --simulate-gpus 8GiB", 2, "plan: 257 stages x 256 replicas make 65792 ranks, more than");
  fails("--replicas 2 --max-memory 0=1MiB", 2, "--replicas gives the replicas of a pipeline; give its stages too (--stages S)");
  fails("--stages 2 --max-memory 0=1MiB --json-report", 2, "with --stages use --json");
  fails("--stages 2 --max-memory 0=2KiB,cpu=1KiB,disk=0", 5,
        "no split into 2 stages fits the budgets: split by parameter count, stage 0 (model.embed_tokens .. model.layers.2, 4 units) "
        "needs 5.00 KiB but its process holds 2.00 KiB on GPUs, 1.00 KiB on cpu and 0 B on disk");
  fails("--stages 2 --max-memory 0=1KiB,cpu=1KiB,disk=0", 5,
        "no split into 2 stages fits the budgets: unit model.embed_tokens (2.00 KiB) fits no stage's process on its own: ");
  fails("--stages 2 --simulate-gpus 8GiB,8GiB,8GiB --gpus_per_process 1 --process 2", 2,
        "--process 2 holds no rank: 2 stages x 1 replica make 2 ranks, held by local processes 0 to 1");
  fails("--stages 2 --simulate-gpus 8GiB,8GiB --gpus_per_process 1 --process 2", 2, "--process 2 is out of range");
}
