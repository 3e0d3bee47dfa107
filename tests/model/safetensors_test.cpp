// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/model/safetensors.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/plain_json.hpp"
#include "support/safetensors_writer.hpp"

using accel::DType;
using accel_test::TensorSpec;

namespace {
accel::SafetensorsHeader parse_bytes(const std::vector<std::byte>& b) {
  return accel::parse_safetensors_header(b, b.size(), "x.safetensors");
}
accel::SafetensorsHeader parse_header(const std::string& header, std::size_t data_bytes = 0) {
  return parse_bytes(accel_test::raw_safetensors(header, std::vector<std::byte>(data_bytes)));
}
const std::vector<TensorSpec> two = {{"b.weight", DType::F16, {2, 3}, {}}, {"a.bias", DType::I64, {4}, {}}};
}  // namespace

TEST_CASE("a valid file parses with tensors in offset order and a name lookup", "[safetensors]") {
  auto bytes = accel_test::safetensors_bytes(two, {{"format", "pt"}});
  auto h = parse_bytes(bytes);
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "b.weight");
  CHECK(h.tensors[0].dtype == DType::F16);
  CHECK(h.tensors[0].shape == std::vector<std::int64_t>{2, 3});
  CHECK(h.tensors[0].begin == 0);
  CHECK(h.tensors[0].end == 12);
  CHECK(h.tensors[1].begin == 12);
  CHECK(h.tensors[1].size_bytes() == 32);
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.data_offset == 8 + h.header_size);
  CHECK(h.header_size % 8 == 0);
  CHECK(h.file_size == bytes.size());
  REQUIRE(h.find("a.bias") != nullptr);
  CHECK(h.find("a.bias")->numel() == 4);
  CHECK(h.find("missing") == nullptr);
  CHECK(h.file_offset(h.tensors[1]) == h.data_offset + 12);
}

TEST_CASE("the empty file, scalars, empty tensors and whitespace padding are accepted", "[safetensors]") {
  CHECK(parse_header("{}      ").tensors.empty());
  auto h = parse_header(R"(  {"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                        R"("e":{"dtype":"BF16","shape":[0,7],"data_offsets":[4,4]},"__metadata__":null} )",
                        4);
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.find("s")->shape.empty());
  CHECK(h.find("e")->size_bytes() == 0);
  auto f4 = parse_header(R"({"q":{"dtype":"F4","shape":[6],"data_offsets":[0,3]}})", 3);
  CHECK(f4.tensors[0].dtype == DType::F4);
}

TEST_CASE("each safetensors rule violation names the file, the tensor and the rule", "[safetensors]") {
  using accel_test::contains;
  SECTION("a file shorter than the length field") {
    std::vector<std::byte> b(5);
    REQUIRE_THROWS_WITH(parse_bytes(b), contains("'x.safetensors': file is 5 bytes, shorter than the 8-byte header length"));
  }
  SECTION("a header longer than 100 MB") {
    auto b = accel_test::raw_safetensors("{}");
    b[3] = std::byte{0x10};  // length 0x10000002
    REQUIRE_THROWS_WITH(parse_bytes(b), contains("exceeds the limit of 100000000 bytes"));
  }
  SECTION("a header longer than the file") {
    auto b = accel_test::raw_safetensors("{}");
    b[0] = std::byte{9};
    REQUIRE_THROWS_WITH(parse_bytes(b), contains("header length 9 exceeds the 2 bytes after the length field"));
  }
  SECTION("a header that is not UTF-8") {
    REQUIRE_THROWS_WITH(parse_header("{\"\xff\":1}"), contains("header is not valid JSON"));
  }
  SECTION("a header that is not JSON") {
    REQUIRE_THROWS_WITH(parse_header("{not json"), contains("header is not valid JSON"));
  }
  SECTION("a header that is not an object") {
    REQUIRE_THROWS_WITH(parse_header("[1,2]"), contains("header is a JSON array, not an object"));
  }
  SECTION("duplicate tensor names") {
    REQUIRE_THROWS_WITH(parse_header(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                     R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                     2),
                        contains("duplicate key 'a'"));
  }
  SECTION("an unknown dtype") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,2]}})", 2),
                        contains("tensor 'w': unknown dtype 'F17'"));
  }
  SECTION("torch spelling is not a safetensors dtype") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"float16","shape":[1],"data_offsets":[0,2]}})", 2),
                        contains("unknown dtype 'float16'"));
  }
  SECTION("a missing dtype") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"shape":[1],"data_offsets":[0,2]}})", 2),
                        contains("tensor 'w': missing or non-string 'dtype'"));
  }
  SECTION("a negative dimension") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})"),
                        contains("shape entry -1 is not a non-negative integer"));
  }
  SECTION("a fractional dimension") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})"),
                        contains("shape entry 1.5 is not a non-negative integer"));
  }
  SECTION("a missing shape") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"U8","data_offsets":[0,0]}})"),
                        contains("missing or non-array 'shape'"));
  }
  SECTION("malformed data_offsets") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})"),
                        contains("'data_offsets' must be two non-negative integers"));
  }
  SECTION("end before begin") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}})"),
                        contains("end before begin"));
  }
  SECTION("a byte count that does not match the shape") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"I32","shape":[2,2],"data_offsets":[0,4]}})", 4),
                        contains("tensor 'w': data_offsets [0, 4] span 4 bytes but shape [2, 2] of I32 needs 16"));
  }
  SECTION("a shape whose size overflows") {
    REQUIRE_THROWS_WITH(
        parse_header(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"),
        contains("overflows 64 bits"));
  }
  SECTION("sub-byte tensors that do not fill whole bytes") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1),
                        contains("is 12 bits, not a whole number of bytes"));
  }
  SECTION("overlapping tensors") {
    REQUIRE_THROWS_WITH(parse_header(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                     R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                                     6),
                        contains("tensor 'b': data_offsets [2, 6] overlap the previous tensor ending at 4"));
  }
  SECTION("a gap between tensors") {
    REQUIRE_THROWS_WITH(parse_header(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                     R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                                     8),
                        contains("tensor 'b': data_offsets [6, 8] leave a gap after the previous tensor ending at 4"));
  }
  SECTION("a first tensor that does not start at 0") {
    REQUIRE_THROWS_WITH(parse_header(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6),
                        contains("leave a gap after the previous tensor ending at 0"));
  }
  SECTION("trailing bytes after the data") {
    REQUIRE_THROWS_WITH(parse_header(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 5),
                        contains("tensors cover 4 data bytes but the data section is 5 bytes (trailing bytes"));
  }
  SECTION("truncated data") {
    REQUIRE_THROWS_WITH(parse_header(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3),
                        contains("(truncated data"));
  }
  SECTION("metadata with a non-string value") {
    REQUIRE_THROWS_WITH(parse_header(R"({"__metadata__":{"n":1}})"),
                        contains("'__metadata__' value for 'n' is number, not a string"));
  }
  SECTION("metadata that is not an object") {
    REQUIRE_THROWS_WITH(parse_header(R"({"__metadata__":"x"})"), contains("'__metadata__' is not an object"));
  }
  SECTION("a tensor entry that is not an object") {
    REQUIRE_THROWS_WITH(parse_header(R"({"w":3})"), contains("tensor 'w': entry is number"));
  }
  SECTION("errors are checkpoint errors with the fix") {
    REQUIRE_THROWS_AS(parse_header("[]"), accel::checkpoint_error);
    REQUIRE_THROWS_WITH(parse_header("[]"), contains("[accel.checkpoint] invalid safetensors file 'x.safetensors'"));
    REQUIRE_THROWS_WITH(parse_header("[]"), contains("re-download or re-save it"));
  }
}

TEST_CASE("reading a header from a file reads only the header and names the path on errors", "[safetensors]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "m.safetensors", two);
  auto h = accel::read_safetensors_header(dir / "m.safetensors");
  CHECK(h.tensors.size() == 2);
  CHECK(h.file_size == std::filesystem::file_size(dir / "m.safetensors"));
  REQUIRE_THROWS_WITH(accel::read_safetensors_header(dir / "none.safetensors"),
                      accel_test::contains("cannot read safetensors file '" + (dir / "none.safetensors").string()));
  // Truncate the data: the header still parses, the coverage rule fails.
  auto bytes = accel_test::safetensors_bytes(two);
  bytes.resize(bytes.size() - 3);
  accel_test::write_bytes(dir / "t.safetensors", bytes);
  REQUIRE_THROWS_WITH(accel::read_safetensors_header(dir / "t.safetensors"),
                      accel_test::contains((dir / "t.safetensors").string() + "': tensors cover 44 data bytes"));
  accel_test::write_bytes(dir / "s.safetensors", std::vector<std::byte>(3));
  REQUIRE_THROWS_WITH(accel::read_safetensors_header(dir / "s.safetensors"), accel_test::contains("file is 3 bytes"));
  // Not a file: a folder, and a FIFO no one writes to (opening one to read would wait for a writer).
  std::filesystem::create_directory(dir / "d.safetensors");
  REQUIRE_THROWS_WITH(accel::read_safetensors_header(dir / "d.safetensors"),
                      accel_test::contains("cannot read safetensors file '" + (dir / "d.safetensors").string() + "': it is a folder, not a file"));
  REQUIRE(::mkfifo((dir / "f.safetensors").c_str(), 0600) == 0);
  REQUIRE_THROWS_WITH(accel::read_safetensors_header(dir / "f.safetensors"),
                      accel_test::contains("cannot read safetensors file '" + (dir / "f.safetensors").string() +
                                           "': it is a FIFO (named pipe), not a file"));
}

TEST_CASE("sharded checkpoints resolve through the index, a folder or a single file", "[safetensors]") {
  accel_test::TempDir dir;
  auto index = accel_test::write_sharded(
      dir.path(), {{{"model.embed.weight", DType::BF16, {8, 4}, {}}, {"model.layers.0.w", DType::BF16, {4, 4}, {}}},
                   {{"model.layers.1.w", DType::BF16, {4, 4}, {}}, {"lm_head.weight", DType::F32, {8, 4}, {}}}});
  accel_test::write_text(dir / "config.json", "{}");
  for (const auto& p : {index, dir.path()}) {
    auto c = accel::resolve_checkpoint(p);
    REQUIRE(c.shard_files.size() == 2);
    CHECK(c.index_file == index);
    CHECK(c.config_file == dir / "config.json");
    CHECK(c.tensor_names == std::vector<std::string_view>{"model.embed.weight", "model.layers.0.w", "model.layers.1.w", "lm_head.weight"});
    REQUIRE(c.find("lm_head.weight") != nullptr);
    CHECK(c.find("lm_head.weight")->shard == 1);
    CHECK(c.entry(*c.find("lm_head.weight")).dtype == DType::F32);
    CHECK(c.total_bytes() == 64 + 32 + 32 + 128);
  }
  auto single = accel::resolve_checkpoint(dir / "model-00001-of-00002.safetensors");
  CHECK(single.shard_files.size() == 1);
  CHECK_FALSE(single.index_file.has_value());
}

TEST_CASE("a folder without an index uses every safetensors file in name order", "[safetensors]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "b.safetensors", {{"y", DType::U8, {1}, {}}});
  accel_test::write_safetensors(dir / "a.safetensors", {{"x", DType::U8, {1}, {}}});
  auto c = accel::resolve_checkpoint(dir.path());
  CHECK(c.tensor_names == std::vector<std::string_view>{"x", "y"});
  CHECK_FALSE(c.config_file.has_value());
  accel_test::write_safetensors(dir / "c.safetensors", {{"x", DType::U8, {1}, {}}});
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), accel_test::contains("tensor 'x' is stored twice"));
}

TEST_CASE("bad checkpoint paths and stale or malformed indexes are checkpoint errors", "[safetensors]") {
  using accel_test::contains;
  accel_test::TempDir dir;
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir / "nope"), contains("does not exist"));
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("holds no .safetensors file"));
  accel_test::write_safetensors(dir / "s1.safetensors", {{"x", DType::U8, {1}, {}}});
  auto idx = dir / "model.safetensors.index.json";
  accel_test::write_text(idx, R"({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("names shard 's2.safetensors', which does not exist"));
  accel_test::write_text(idx, R"({"weight_map": {"x": "s1.safetensors", "y": "s1.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("places tensor 'y' in 's1.safetensors', which does not hold it"));
  accel_test::write_safetensors(dir / "s1.safetensors", {{"x", DType::U8, {1}, {}}, {"z", DType::U8, {1}, {}}});
  accel_test::write_text(idx, R"({"weight_map": {"x": "s1.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("shard 's1.safetensors' holds tensor 'z', which checkpoint index"));
  accel_test::write_text(idx, R"({"weight_map": {"x": "../s1.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("which is not a file name relative to the index's folder"));
  accel_test::write_text(idx, R"({"metadata": {"total_size": "big"}, "weight_map": {}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("'metadata.total_size' is \"big\""));
  // An out-of-range float used to be cast (undefined behaviour) instead of refused.
  for (const char* size : {"1e30", "-1", "1.5", "18446744073709551616", "\"big\""}) {
    accel_test::write_text(idx, std::string(R"({"metadata": {"total_size": )") + size + R"(}, "weight_map": {"x": "s1.safetensors"}})");
    INFO(size);
    REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("'metadata.total_size' is"));
  }
  accel_test::write_text(idx, R"({"metadata": {"total_size": 1e3}, "weight_map": {"x": "s1.safetensors", "z": "s1.safetensors"}})");
  CHECK(accel::read_safetensors_index(idx).total_size == 1000u);
  accel_test::write_text(idx, "{\"weight_map\": " + std::string(100'000, '[') + std::string(100'000, ']') + "}");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("nested deeper than 256 levels"));
  accel_test::write_text(idx, R"({"weight": {}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("missing or non-object 'weight_map'"));
  accel_test::write_text(idx, R"({"weight_map": {"x": 3}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("weight_map entry 'x' is number"));
  accel_test::write_text(idx, "{");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(idx), contains("invalid checkpoint index"));
  accel_test::write_text(dir / "other.safetensors.index.json", "{}");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("holds 2 checkpoint indexes"));
  REQUIRE_THROWS_AS(accel::resolve_checkpoint(dir.path()), accel::checkpoint_error);
}

TEST_CASE("an index that lists as many pairs as its shards hold, but not the same ones, is stale", "[safetensors]") {
  // The common index is only summarized (shards and a fingerprint of its pairs); a mismatch of any
  // kind sends it to the exact comparison, which names the tensor.
  using accel_test::contains;
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "s1.safetensors", {{"x", DType::U8, {1}, {}}});
  accel_test::write_safetensors(dir / "s2.safetensors", {{"y", DType::U8, {1}, {}}});
  const auto idx = dir / "model.safetensors.index.json";
  accel_test::write_text(idx, R"({"weight_map": {"y": "s2.safetensors", "x": "s1.safetensors"}})");
  CHECK(accel::resolve_checkpoint(dir.path()).tensor_names == std::vector<std::string_view>{"x", "y"});
  accel_test::write_text(idx, R"({"weight_map": {"x": "s2.safetensors", "y": "s1.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()),
                      contains("places tensor 'x' in 's2.safetensors', which does not hold it (it is in 's1.safetensors')"));
  accel_test::write_text(idx, R"({"weight_map": {"x": "s1.safetensors", "w": "s2.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("places tensor 'w' in 's2.safetensors', which does not hold it"));
  accel_test::write_text(idx, R"({"weight_map": {"x": "s1.safetensors", "x": "s1.safetensors", "y": "s2.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("duplicate key 'x'"));
  accel_test::write_safetensors(dir / "s2.safetensors", {{"y", DType::U8, {1}, {}}, {"x", DType::U8, {1}, {}}});
  accel_test::write_text(idx, R"({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})");
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("tensor 'x' is stored twice"));
}

TEST_CASE("a folder of many shards is read while its index is summarized, and only what the index lists counts", "[safetensors]") {
  // From eight .safetensors files on, a folder's headers are read beside the index's summary and
  // kept when the index lists exactly those files; anything else is decided as for a few shards.
  using accel_test::contains;
  accel_test::TempDir dir;
  std::vector<std::vector<TensorSpec>> shards;
  for (int i = 0; i < 9; ++i) shards.push_back({{"t" + std::to_string(i), DType::U8, {1}, {}}});
  const auto idx = accel_test::write_sharded(dir.path(), shards);
  const auto all = accel::resolve_checkpoint(dir.path());
  REQUIRE(all.tensor_names.size() == 9);
  REQUIRE(all.shard_files.size() == 9);
  REQUIRE(all.tensor_names == accel::resolve_checkpoint(idx).tensor_names);
  // A broken file the index does not list is not part of the checkpoint, read early or not.
  accel_test::write_text(dir / "zz-broken.safetensors", "not a safetensors file");
  REQUIRE(accel::resolve_checkpoint(dir.path()).tensor_names == all.tensor_names);
  std::filesystem::remove(dir / "zz-broken.safetensors");
  // A file the index does not list is left out, even a valid one.
  accel_test::write_safetensors(dir / "extra.safetensors", {{"extra", DType::U8, {1}, {}}});
  const auto listed = accel::resolve_checkpoint(dir.path());
  REQUIRE(listed.tensor_names == all.tensor_names);
  REQUIRE(listed.shard_files.size() == 9);
  std::filesystem::remove(dir / "extra.safetensors");
  // A listed shard that is broken fails, naming the first such shard in order.
  accel_test::write_text(dir / "model-00007-of-00009.safetensors", "broken");
  accel_test::write_text(dir / "model-00004-of-00009.safetensors", "broken");
  REQUIRE_THROWS_AS(accel::resolve_checkpoint(dir.path()), accel::checkpoint_error);
  REQUIRE_THROWS_WITH(accel::resolve_checkpoint(dir.path()), contains("model-00004-of-00009.safetensors"));
  // An index the fast reader declines (an escape in a name) is still read whole and checked.
  accel_test::write_safetensors(dir / "model-00004-of-00009.safetensors", shards[3]);
  accel_test::write_safetensors(dir / "model-00007-of-00009.safetensors", shards[6]);
  std::string text = accel::read_text_file(idx, "index");
  text.replace(text.find("\"t0\""), 4, "\"\\u0074" "0\"");
  accel_test::write_text(idx, text);
  REQUIRE(accel::resolve_checkpoint(dir.path()).tensor_names == all.tensor_names);
}

TEST_CASE("property: corrupted headers either parse or throw checkpoint_error, never anything else", "[safetensors][property]") {
  const auto good = accel_test::safetensors_bytes(
      {{"a.weight", DType::F16, {3, 5}, {}}, {"b", DType::I64, {2}, {}}, {"c", DType::BOOL, {7}, {}}}, {{"format", "pt"}});
  std::mt19937 rng(99);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto bytes = good;
    const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int e = 0; e < edits; ++e) {
      const auto pos = std::uniform_int_distribution<std::size_t>(0, std::min<std::size_t>(bytes.size() - 1, 200))(rng);
      bytes[pos] = static_cast<std::byte>(std::uniform_int_distribution<int>(0, 255)(rng));
    }
    if (iter % 10 == 0) bytes.resize(std::uniform_int_distribution<std::size_t>(0, bytes.size())(rng));
    try {
      auto h = accel::parse_safetensors_header(bytes, bytes.size(), "fuzz");
      std::uint64_t end = 0;
      for (const auto& t : h.tensors) end = std::max(end, t.end);
      REQUIRE(h.data_offset + end == bytes.size());
    } catch (const accel::checkpoint_error&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

namespace {
// A header or index text as tools write them, with random names, spacing, key order and values,
// sometimes with what the fast path leaves to the strict parser (escapes, non-ASCII, duplicates,
// floats, unknown fields).
struct TextMaker {
  std::mt19937_64 rng;
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); }
  std::string ws() { return std::string(pick(3), " \n\t"[pick(3)]); }
  std::string name() {
    static const char* parts[] = {"model", "layers", "0", "17", "self_attn", "q_proj", "weight", "bias", "a", "x\\u00e9", "\xc3\xa9", "n\\\"q"};
    std::string n;
    for (std::size_t i = 0, k = 1 + pick(4); i < k; ++i) n += (i ? "." : "") + std::string(parts[pick(rare() ? 12 : 9)]);
    return n;
  }
  bool rare() { return pick(8) == 0; }
  std::string number(std::uint64_t v) { return rare() ? std::to_string(v) + ".0" : std::to_string(v); }
  std::string header() {
    static const std::pair<const char*, int> dtypes[] = {{"F16", 2}, {"BF16", 2}, {"F32", 4}, {"I64", 8}, {"BOOL", 1}, {"F99", 1}};
    std::string t = "{" + ws();
    std::uint64_t offset = 0;
    bool first = true;
    for (std::size_t i = 0, n = pick(6); i < n; ++i) {
      const auto [dtype, size] = dtypes[pick(rare() ? 6 : 5)];
      std::vector<std::uint64_t> shape(pick(3));
      std::uint64_t bytes = static_cast<std::uint64_t>(size);
      for (auto& d : shape) bytes *= (d = pick(5));
      const std::uint64_t end = offset + bytes + (rare() ? 1 : 0);
      std::vector<std::string> fields{"\"dtype\":" + ws() + "\"" + dtype + "\"", "\"data_offsets\":[" + number(offset) + "," + ws() + number(end) + "]"};
      std::string s = "\"shape\":[";
      for (std::size_t k = 0; k < shape.size(); ++k) s += (k ? "," : "") + number(shape[k]);
      fields.push_back(s + "]");
      if (rare()) fields.push_back("\"extra\":1");
      std::shuffle(fields.begin(), fields.end(), rng);
      std::string entry = "{";
      for (std::size_t k = 0; k < fields.size(); ++k) entry += (k ? "," + ws() : "") + fields[k];
      t += (first ? "" : "," + ws()) + "\"" + name() + "\":" + ws() + entry + "}";
      first = false;
      offset = end;
    }
    if (!rare()) t += std::string(first ? "" : ",") + "\"__metadata__\":{\"format\":\"pt\"" + (rare() ? ",\"n\":1" : "") + "}";
    return t + ws() + "}";
  }
  std::string index() {
    std::string t = "{\"metadata\":{\"total_size\":" + number(pick(1000)) + "}," + ws() + "\"weight_map\":{";
    for (std::size_t i = 0, n = 1 + pick(6); i < n; ++i)
      t += (i ? "," : "") + ("\"" + name() + "\":\"") + (rare() ? "../x" : "model-0000" + std::to_string(pick(3))) + ".safetensors\"";
    return t + "}}" + ws();
  }
  // Damage of the kinds that change meaning: a byte dropped, doubled or replaced by a JSON character.
  std::string mutate(std::string t) {
    if (t.empty()) return t;
    const std::size_t at = pick(t.size());
    switch (pick(3)) {
      case 0: t.erase(at, 1); break;
      case 1: t.insert(at, 1, t[at]); break;
      default: t[at] = "{}[]:,\"0-9e.\\ nul"[pick(19)];
    }
    return t;
  }
};
}  // namespace

TEST_CASE("the DOM-free header and index readers decline or agree with the strict parser on any text", "[safetensors][fast]") {
  TextMaker make{std::mt19937_64(20261203)};
  std::map<std::string, int> headers, indexes, summaries;
  for (int i = 0; i < 4000; ++i) {
    const auto h = make.header();
    const auto x = make.index();
    for (const auto& text : {h, make.mutate(h), make.mutate(make.mutate(h))}) {
      const auto verdict = accel_test::plain_header_verdict(text);
      INFO(text);
      REQUIRE((verdict == "declined" || verdict == "agrees"));
      ++headers[verdict];
    }
    for (const auto& text : {x, make.mutate(x), make.mutate(make.mutate(x))}) {
      const auto verdict = accel_test::plain_index_verdict(text);
      INFO(text);
      REQUIRE((verdict == "declined" || verdict == "agrees"));
      ++indexes[verdict];
      const auto summary = accel_test::index_summary_verdict(text);
      REQUIRE((summary == "declined" || summary == "agrees"));
      ++summaries[summary];
    }
  }
  // Both outcomes are common: the fast path serves ordinary files and leaves the rest alone.
  CHECK(headers["agrees"] > 1000);
  CHECK(headers["declined"] > 2000);
  CHECK(indexes["agrees"] > 2000);
  CHECK(indexes["declined"] > 2000);
  CHECK(summaries["agrees"] > 2000);
  CHECK(summaries["declined"] > 2000);
}

TEST_CASE("files the fast path declines still parse, or fail with the strict parser's words", "[safetensors][fast]") {
  // An escaped name, an unknown field and a float offset: the fast path declines all three.
  const std::string escaped = R"({"a\u0062":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  CHECK(accel_test::plain_header_verdict(escaped) == "declined");
  CHECK(parse_header(escaped, 4).tensors.at(0).name == "ab");
  const std::string unknown_field = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[]}})";
  CHECK(accel_test::plain_header_verdict(unknown_field) == "declined");
  CHECK(parse_header(unknown_field, 4).tensors.size() == 1);
  REQUIRE_THROWS_WITH(parse_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", 4),
                      accel_test::contains("'data_offsets' must be two non-negative integers"));
  // Ties at one offset come out in name order whichever reader ran.
  const std::string empties = R"({"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  const std::string empties_escaped = R"({"\u0062":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  for (const auto& text : {empties, empties_escaped}) {
    const auto h = parse_header(text);
    REQUIRE(h.tensors.size() == 2);
    CHECK(h.tensors[0].name == "a");
    CHECK(h.find("b") == &h.tensors[1]);
  }
}
