// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel plan --objective`, `--bandwidth`, `--json-report`, `accel env --measure-bandwidth` and
// `accel load --objective` through the built command; the bandwidth arithmetic and cache directly.
#include "../tools/commands/bandwidth.hpp"

#include <accel/plan/objective.hpp>

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

// A Llama-like skeleton in float32: embed_tokens 1024 B, six 512 B blocks, norm 32 B, lm_head 1024 B.
std::string llama_skeleton() {
  nlohmann::json modules = nlohmann::json::array(), params = nlohmann::json::array();
  modules.push_back({{"name", ""}});
  modules.push_back({{"name", "model.embed_tokens"}, {"class", "Embedding"}});
  params.push_back({{"name", "model.embed_tokens.weight"}, {"shape", {32, 8}}, {"dtype", "float32"}});
  for (int i = 0; i < 6; ++i) {
    const std::string l = "model.layers." + std::to_string(i);
    modules.push_back({{"name", l}, {"class", "Block"}});
    params.push_back({{"name", l + ".mlp.weight"}, {"shape", {16, 8}}, {"dtype", "float32"}});
  }
  params.push_back({{"name", "model.norm.weight"}, {"shape", {8}}, {"dtype", "float32"}});
  params.push_back({{"name", "lm_head.weight"}, {"shape", {32, 8}}, {"dtype", "float32"}});
  return nlohmann::json{{"modules", modules}, {"parameters", params}}.dump();
}

// Every run gets its own empty cache folder, so a measured cache on the machine changes nothing.
std::string plan_cmd(const accel_test::TempDir& dir, const std::string& args) {
  return "XDG_CACHE_HOME=" + quoted(dir / "cache") + " " +
         accel_test::accel_cli("plan --skeleton " + quoted(dir / "m.json") + " --no-split Block --device-map sequential " + args);
}
}  // namespace

TEST_CASE("accel plan --objective speed moves the input embedding off the GPU and streams less", "[cli][plan][objective]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton());
  const auto fit = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --json-report"));
  const auto speed = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --json-report --objective speed"));
  INFO(fit.output << speed.output);
  REQUIRE(fit.status == 0);
  REQUIRE(speed.status == 0);
  const auto f = nlohmann::json::parse(fit.output), s = nlohmann::json::parse(speed.output);
  CHECK(f["objective"] == "fit");
  CHECK(s["objective"] == "speed");
  CHECK(f["streamed_per_forward_pass"]["fit"]["bytes"] == 3616);
  CHECK(f["streamed_per_forward_pass"]["speed"]["bytes"] == 2048);  // the fit report shows both
  CHECK(s["streamed_per_forward_pass"] == f["streamed_per_forward_pass"]);
  CHECK(f["device_map"]["model.embed_tokens"] == 0);
  CHECK(s["device_map"]["model.embed_tokens"] == "cpu");
  CHECK(s["moves"][0] == nlohmann::json{{"module", "model.embed_tokens"}, {"from", 0}, {"to", "cpu"},
                                        {"why", "input embedding: rows are read, not the table"}});
  CHECK(s["bandwidths"]["source"] == "default rates; measure with accel env --measure-bandwidth");
  // --json stays the bare map (what from_pretrained takes), for either objective.
  const auto map = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --json --objective speed"));
  REQUIRE(map.status == 0);
  CHECK(nlohmann::json::parse(map.output) == s["device_map"]);
}

TEST_CASE("accel plan's text report adds one streamed-per-pass line for fit and the moves for speed", "[cli][plan][objective]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton());
  const auto fit = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --svg " + quoted(dir / "p.svg")));
  INFO(fit.output);
  REQUIRE(fit.status == 0);
  CHECK_THAT(fit.output, accel_test::contains("streamed per forward pass: fit 3.53 KiB"));
  CHECK_THAT(fit.output, accel_test::contains(", speed 2.00 KiB"));
  CHECK_THAT(fit.output, accel_test::contains("this map: fit; at 25.0 GB/s host-to-GPU, 2.0 GB/s disk (default rates"));
  CHECK(fit.output.find("moved relative to the fit map") == std::string::npos);
  std::ifstream svg(dir / "p.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, accel_test::contains("streamed per forward pass: fit 3.53 KiB"));
  const auto speed = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --objective speed --bandwidth cpu=10GB/s"));
  INFO(speed.output);
  REQUIRE(speed.status == 0);
  CHECK_THAT(speed.output, accel_test::contains("this map: speed; at 10.0 GB/s host-to-GPU, 2.0 GB/s disk (rates from --bandwidth)"));
  CHECK_THAT(speed.output, accel_test::contains("moved relative to the fit map:\n  model.embed_tokens: GPU 0 -> cpu "
                                                "(input embedding: rows are read, not the table)"));
  CHECK_THAT(speed.output, accel_test::contains("-> GPU 0 (room freed by 'model.embed_tokens' leaving the GPUs"));
}

TEST_CASE("accel plan --bandwidth and --objective refuse malformed values, naming the piece", "[cli][plan][objective]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton());
  const auto unit = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --bandwidth cpu=25GB,disk=3GB/s 2>&1"));
  CHECK(unit.status == 3);
  CHECK_THAT(unit.output, accel_test::contains("bandwidth 'cpu=25GB' in 'cpu=25GB,disk=3GB/s' has no unit GB/s, GiB/s, MB/s or MiB/s"));
  const auto both = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000 --bandwidth cpu=1GB/s --h2d-bandwidth 1GB 2>&1"));
  CHECK(both.status == 2);
  const auto objective = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000 --objective fast 2>&1"));
  CHECK(objective.status == 2);
  CHECK_THAT(objective.output, accel_test::contains("unknown plan objective 'fast'; use fit or speed"));
  CHECK_THAT(accel_test::run_command(accel_test::accel_cli("plan --help")).output, accel_test::contains("--objective WHAT"));
}

TEST_CASE("accel env --measure-bandwidth caches rates that accel plan then uses", "[cli][objective]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "m.json", llama_skeleton());
  std::filesystem::create_directories(dir / "disk");
  const auto m = accel_test::run_command("XDG_CACHE_HOME=" + quoted(dir / "cache") + " " +
                                         accel_test::accel_cli("env --measure-bandwidth --disk-dir " + quoted(dir / "disk")));
  INFO(m.output);
  REQUIRE(m.status == 0);
  CHECK_THAT(m.output, accel_test::contains("host to GPU: "));
  CHECK_THAT(m.output, accel_test::contains("disk read:   "));
  const auto cache = dir / "cache" / "accel" / "bandwidth.json";
  REQUIRE(std::filesystem::exists(cache));
  CHECK(std::filesystem::is_empty(dir / "disk"));  // the temporary file is gone
  const auto rates = accel_cli::parse_bandwidth_cache(read_text(cache), cache.string()).rates;
  CHECK(rates.host_to_device > 1e6);
  CHECK(rates.disk_read > 1e6);
  const auto plan = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --json-report"));
  REQUIRE(plan.status == 0);
  const auto j = nlohmann::json::parse(plan.output);
  CHECK(j["bandwidths"]["source"] == "rates measured, from " + cache.string());
  CHECK(j["bandwidths"]["host_to_device"].get<double>() == rates.host_to_device);
  accel_test::write_text(cache, "{\"host_to_device_bytes_per_second\": -1, \"disk_read_bytes_per_second\": 1}");
  const auto bad = accel_test::run_command(plan_cmd(dir, "--max-memory 0=3000,cpu=100000 --json-report"));
  REQUIRE(bad.status == 0);
  CHECK_THAT(nlohmann::json::parse(bad.output)["bandwidths"]["source"].get<std::string>(),
             accel_test::contains("default rates; cache ignored: [accel.config] bandwidth cache"));
}

TEST_CASE("bandwidth measurement: the fastest sample, through the probe seam", "[objective]") {
  CHECK(accel_cli::rate_of(1000, {2.0, 1.0, 4.0}) == 1000.0);
  CHECK_THROWS_AS(accel_cli::rate_of(1000, {0.0}), accel::unavailable_error);
  int copies = 0;
  accel_cli::BandwidthProbe probe;
  probe.host_to_device = [&](std::uint64_t bytes) {
    ++copies;
    return static_cast<double>(bytes) / (copies == 2 ? 20e9 : 10e9);
  };
  probe.disk_read = [](const std::filesystem::path&, std::uint64_t bytes) { return static_cast<double>(bytes) / 3e9; };
  probe.host_source = "fake";
  const auto m = accel_cli::measure_bandwidths(probe, ".", 1 << 20, 1 << 20);
  CHECK(copies == 3);
  CHECK(m.rates.host_to_device == Approx(20e9));
  CHECK(m.rates.disk_read == Approx(3e9));
  const auto back = accel_cli::parse_bandwidth_cache(accel_cli::bandwidth_cache_json(m), "c.json");
  CHECK(back.rates.host_to_device == m.rates.host_to_device);
  CHECK(back.host_source == "fake");
  CHECK(accel_cli::bandwidth_cache_path(accel::map_env({{"XDG_CACHE_HOME", "/x"}, {"HOME", "/h"}})) ==
        std::filesystem::path("/x/accel/bandwidth.json"));
  CHECK(accel_cli::bandwidth_cache_path(accel::map_env({{"HOME", "/h"}})) == std::filesystem::path("/h/.cache/accel/bandwidth.json"));
  CHECK_FALSE(accel_cli::bandwidth_cache_path(accel::map_env({})));
}

TEST_CASE("parse_bandwidths: units, defaults for a missing key, and errors naming the piece", "[objective]") {
  const auto b = accel::parse_bandwidths("cpu=25GB/s, disk=1.5GiB/s");
  CHECK(b.host_to_device == 25e9);
  CHECK(b.disk_read == 1.5 * 1073741824.0);
  CHECK(accel::parse_bandwidths("disk=800MB/s").host_to_device == 25e9);
  CHECK(accel::parse_bandwidths("cpu=512MiB/s").host_to_device == 512.0 * 1048576.0);
  CHECK_THROWS_WITH(accel::parse_bandwidths("gpu=1GB/s"),
                    "[accel.config] bandwidth 'gpu=1GB/s' in 'gpu=1GB/s' names neither cpu nor disk; write cpu=RATE,disk=RATE "
                    "with RATE like 25GB/s, 3.5GiB/s or 800MB/s");
  CHECK_THROWS_WITH(accel::parse_bandwidths("cpu=0GB/s"), Catch::Matchers::Contains("'cpu=0GB/s' in 'cpu=0GB/s' is not a positive number"));
  CHECK_THROWS_WITH(accel::parse_bandwidths("cpu=1GB/s,cpu=2GB/s"), Catch::Matchers::Contains("'cpu=2GB/s'") &&
                                                                         Catch::Matchers::Contains("repeats a key"));
  CHECK_THROWS_WITH(accel::parse_bandwidths("cpu"), Catch::Matchers::Contains("has no '='"));
  CHECK_THROWS_WITH(accel::parse_bandwidths(""), Catch::Matchers::Contains("is empty"));
}

TEST_CASE("accel load --objective plans for speed, and refuses it beside a given map", "[cli][objective]") {
  const auto help = accel_test::run_command(accel_test::accel_cli("load --help"));
  CHECK_THAT(help.output, accel_test::contains("--objective WHAT"));
  const auto bad = accel_test::run_command(accel_test::accel_cli("load --checkpoint /nonexistent --device-map '{\"\":0}' --objective speed 2>&1"));
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, accel_test::contains("--objective plans a map; it has no effect with a given --device-map"));
}
