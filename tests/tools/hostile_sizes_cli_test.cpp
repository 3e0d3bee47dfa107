// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Small inputs, valid by their formats' own limits, that took accel minutes: each is planned or
// refused, through the built command. (The library tests beside the code, sized so that the
// quadratic versions outlast the ctest TIMEOUT, are what fail deterministically before the fixes.)
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/catch.hpp"
#include "support/run_command.hpp"
#include "support/safetensors_writer.hpp"

namespace {
using accel_test::quoted;

// A safetensors file of `count` float32 tensors of one element, named by `name(i)`. The header is
// written here: the writer's ordered_json would itself take minutes for 160,000 keys.
template <class Name>
void write_scalars(const std::filesystem::path& file, std::size_t count, Name name) {
  std::string header = "{";
  for (std::size_t i = 0; i < count; ++i)
    header += (i ? ",\"" : "\"") + name(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) +
              "," + std::to_string(4 * i + 4) + "]}";
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  accel_test::write_bytes(file, accel_test::raw_safetensors(header, std::vector<std::byte>(4 * count)));
}
}  // namespace

TEST_CASE("accel plan refuses a tensor name of 80,000 dotted parts as a bad checkpoint, naming the limit", "[cli][plan][sizes]") {
  // 160 KB: every module keeps its whole name, so the tree of its 80,000 prefixes was 6 GB and 50 s.
  accel_test::TempDir dir;
  std::string name = "a";
  for (int i = 1; i < 80'000; ++i) name += ".a";
  write_scalars(dir / "model.safetensors", 1, [&](std::size_t) { return name; });
  const auto r = accel_test::run_command(
      accel_test::accel_cli("plan --checkpoint " + quoted(dir / "model.safetensors") + " --max-memory 0=1GiB,cpu=1GiB 2>&1"));
  CHECK(r.status == 6);
  CHECK_THAT(r.output, accel_test::contains("has 80000 dotted parts, more than the 64 a module path may have"));
  CHECK(r.output.size() < 2000);  // the name is shortened in the message
}

TEST_CASE("accel plan plans 160,000 tensors at the root (a 10 MB header)", "[cli][plan][sizes]") {
  // transformers' reserve took 22 s here, rescanning its list of largest layers per entry taken.
  accel_test::TempDir dir;
  write_scalars(dir / "model.safetensors", 160'000, [](std::size_t i) { return "t" + std::to_string(i); });
  const auto r = accel_test::run_command(
      accel_test::accel_cli("plan --checkpoint " + quoted(dir / "model.safetensors") + " --max-memory 0=1GiB,cpu=1GiB --json"));
  REQUIRE(r.status == 0);
  CHECK(nlohmann::json::parse(r.output) == nlohmann::json{{"", 0}});
}

TEST_CASE("accel load reads a device map of 200,000 keys (5.9 MB) and lists the keys that cover nothing", "[cli][load][sizes]") {
  // Read through nlohmann's ordered_json (a linear search per key) the map took minutes before
  // anything loaded.
  accel_test::TempDir dir;
  write_scalars(dir / "model.safetensors", 4, [](std::size_t i) { return "model.layers." + std::to_string(i) + ".w"; });
  std::string map = "{";
  for (std::size_t i = 0; i < 200'000; ++i)
    map.append(i ? ", \"model." : "\"model.").append(i < 4 ? "layers." : "extra.").append(std::to_string(i)).append(i < 4 ? "\": 0" : "\": \"cpu\"");
  accel_test::write_text(dir / "map.json", map + "}");
  const auto r = accel_test::run_command(accel_test::accel_cli("load --checkpoint " + quoted(dir / "model.safetensors") +
                                                               " --device-map " + quoted(dir / "map.json") +
                                                               " --simulate-gpus 1GiB --quiet 2>&1"));
  CHECK(r.status == 0);
  CHECK_THAT(r.output, accel_test::contains("199996 device-map key(s) cover no checkpoint tensor"));
}
