// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/load/offload.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/catch.hpp"
#include "support/run_command.hpp"
#include "support/safetensors_writer.hpp"

namespace fs = std::filesystem;
using accel::DType;

namespace {

std::uint32_t fnv1a(std::span<const std::byte> data) {
  std::uint32_t h = 2166136261u;
  for (auto b : data) h = (h ^ static_cast<std::uint32_t>(b)) * 16777619u;
  return h;
}

bool python_with_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0;
  return ok;
}

std::string run_capture(const std::string& cmd) {
  const auto r = accel_test::run_command(cmd);
  REQUIRE(r.status == 0);
  return r.output;
}

const std::string script = std::string(ACCEL_TEST_SOURCE_DIR) + "/tests/compat/accelerate_offload.py";

using Sample = accel_test::TensorSpec;

std::vector<Sample> samples() {
  std::vector<Sample> s{{"model.embed.weight", DType::BF16, {7, 5}, {}}, {"model.layers.0.w", DType::F16, {3, 4}, {}},
                        {"model.layers.0.b", DType::F32, {9}, {}},        {"model.ids", DType::I64, {2, 3}, {}},
                        {"model.mask", DType::BOOL, {3}, {}},             {"model.scale", DType::F32, {}, {}},
                        {"model.empty", DType::F16, {0, 4}, {}}};
  for (auto& x : s) {
    x.data = accel_test::pattern_bytes(x.name, accel_test::spec_bytes(x));
    if (x.dtype == DType::BOOL)
      for (auto& b : x.data) b = static_cast<std::byte>(static_cast<unsigned>(b) & 1u);
  }
  return s;
}

}  // namespace

TEST_CASE("an offload folder round-trips every tensor byte for byte, scalars with shape []", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex index;
  for (const auto& s : samples()) accel::offload_weight(dir.path(), s.name, s.dtype, s.shape, s.data, index, "src:" + s.name);
  accel::write_offload_index(dir.path(), index);
  REQUIRE(fs::file_size(dir / "model.scale.dat") == 4);
  REQUIRE(fs::file_size(dir / "model.embed.weight.dat") == 70);
  const auto j = nlohmann::json::parse(std::ifstream(dir / "index.json"));
  REQUIRE(j["model.embed.weight"]["dtype"] == "bfloat16");
  REQUIRE(j["model.embed.weight"]["shape"] == nlohmann::json::array({7, 5}));
  REQUIRE(j["model.scale"]["shape"] == nlohmann::json::array());
  REQUIRE(j["model.ids"]["dtype"] == "int64");
  accel::OffloadFolder folder(dir.path());
  for (const auto& s : samples()) {
    auto v = folder.view(s.name);
    REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == s.data);
    REQUIRE(folder.index().at(s.name).dtype == s.dtype);
    REQUIRE(folder.index().at(s.name).shape == s.shape);
  }
  // nothing but the index and the .dat files is left (no temp files)
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  REQUIRE(files == samples().size() + 1);
}

TEST_CASE("writing the index merges with an existing one, keeping old keys", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex a, b;
  const std::vector<std::byte> four(4);
  accel::offload_weight(dir.path(), "x", DType::F32, {1}, four, a);
  accel::write_offload_index(dir.path(), a);
  accel::offload_weight(dir.path(), "y", DType::I32, {1}, four, b);
  accel::write_offload_index(dir.path(), b);
  const auto idx = accel::read_offload_index(dir.path());
  REQUIRE(idx.size() == 2);
  REQUIRE(idx.at("x").dtype == DType::F32);
  REQUIRE(idx.at("y").dtype == DType::I32);
}

TEST_CASE("an entry is reused only when dtype, shape, source and file size all still match", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex index;
  const std::vector<std::byte> data(24);
  accel::offload_weight(dir.path(), "w", DType::F16, {3, 4}, data, index, "shard.safetensors@128+24");
  accel::write_offload_index(dir.path(), index);
  const auto idx = accel::read_offload_index(dir.path());
  REQUIRE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {3, 4}, "shard.safetensors@128+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::BF16, {3, 4}, "shard.safetensors@128+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {4, 3}, "shard.safetensors@128+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {3, 4}, "other@0+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "v", DType::F16, {3, 4}, ""));
  fs::resize_file(dir / "w.dat", 10);  // truncated by a crash of some other writer
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {3, 4}, "shard.safetensors@128+24"));
}

TEST_CASE("a .dat file whose size disagrees with index.json is reported with both sizes", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex index;
  accel::offload_weight(dir.path(), "w", DType::F32, {4}, std::vector<std::byte>(16), index);
  accel::write_offload_index(dir.path(), index);
  fs::resize_file(dir / "w.dat", 12);
  accel::OffloadFolder folder(dir.path());
  REQUIRE_THROWS_WITH(folder.view("w"), accel_test::contains("is 12 bytes but index.json says float32 [4] = 16 bytes"));
  REQUIRE_THROWS_WITH(folder.view("nope"), accel_test::contains("has no tensor 'nope' in its index.json"));
}

TEST_CASE("malformed offload indexes are rejected naming the entry", "[offload]") {
  REQUIRE_THROWS_WITH(accel::parse_offload_index("{", "i"), accel_test::contains("invalid offload index 'i': not valid JSON"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index("[]", "i"), accel_test::contains("a JSON array, not an object"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float99", "shape": []}})", "i"),
                      accel_test::contains("entry 'a' has unknown dtype 'float99'"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float16"}})", "i"),
                      accel_test::contains("entry 'a' has no 'shape' list"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float16", "shape": [-1]}})", "i"),
                      accel_test::contains("entry 'a' has shape element -1"));
  REQUIRE_THROWS_WITH(accel::offload_file("/x", "a/b"), accel_test::contains("without '/'"));
}

TEST_CASE("a write into an unusable folder fails naming the file and the system error", "[offload]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "not_a_folder", "x");
  accel::OffloadIndex index;
  REQUIRE_THROWS_WITH(accel::offload_weight(dir / "not_a_folder", "w", DType::F32, {1}, std::vector<std::byte>(4), index),
                      accel_test::contains("cannot create offload folder"));
  REQUIRE(index.empty());
}

TEST_CASE("a transformers-style entry is read straight from its safetensors shard", "[offload]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{"a", DType::F16, {2, 2}, {}}, {"b", DType::F32, {3}, {}}});
  accel_test::write_text(dir / "index.json",
                         R"({"b": {"safetensors_file": "model.safetensors", "weight_name": "b", "dtype": "float32"}})");
  accel::OffloadFolder folder(dir.path());
  auto v = folder.view("b");
  REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == accel_test::pattern_bytes("b", 12));
}

TEST_CASE("accelerate's reader loads accel's offload folder and accel reads accelerate's", "[offload][python]") {
  if (!python_with_torch()) {
    WARN("/usr/bin/python3 with torch and numpy not importable: compatibility not checked");
    return;
  }
  accel_test::TempDir ours, theirs;
  accel::OffloadIndex index;
  auto all = samples();
  all.pop_back();  // numpy cannot memmap an empty file, so accelerate can neither write nor read 0-element tensors
  for (const auto& s : all) accel::offload_weight(ours.path(), s.name, s.dtype, s.shape, s.data, index, "src");
  accel::write_offload_index(ours.path(), index);
  const auto read = nlohmann::json::parse(run_capture("/usr/bin/python3 " + script + " read " + ours.path().string()));
  for (const auto& s : all) {
    INFO(s.name);
    REQUIRE(read.at(s.name)["dtype"] == std::string(accel::torch_name(s.dtype)));
    REQUIRE(read.at(s.name)["shape"] == nlohmann::json(s.shape));
    REQUIRE(read.at(s.name)["fnv"] == fnv1a(s.data));
  }
  const auto written = nlohmann::json::parse(run_capture("/usr/bin/python3 " + script + " write " + theirs.path().string()));
  accel::OffloadFolder folder(theirs.path());
  REQUIRE(folder.index().size() == written.size());
  for (const auto& [name, info] : written.items()) {
    INFO(name);
    const auto& e = folder.index().at(name);
    REQUIRE(std::string(accel::torch_name(e.dtype)) == info["dtype"].get<std::string>());
    REQUIRE(nlohmann::json(e.shape) == info["shape"]);
    REQUIRE(fnv1a(folder.view(name)) == info["fnv"].get<std::uint32_t>());
  }
}
