// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel load` through the built command, on host-simulated GPUs (--simulate-gpus).
#include <nlohmann/json.hpp>

#include <string>

#include "support/catch.hpp"
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
    CHECK(r.output.find("map.json' cannot be read: Too many levels of symbolic links") != std::string::npos);
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
