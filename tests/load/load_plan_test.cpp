// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The planner and the loader decide each tensor's load dtype with one function (tensor_load_dtype),
// so the bytes a plan counts are the bytes a load converts to: checked for every architecture of
// the catalog, every load dtype, with the catalog's keep-in-fp32 modules.
#include <accel/load/load_plan.hpp>
#include <accel/model/checkpoint_tree.hpp>
#include <accel/plan/planner.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/safetensors_writer.hpp"

using accel::DType;

namespace {
// Every parameter the catalog lists for an architecture, numbered parts as 0, stored as `stored`
// (plus an int64 tensor, which no dtype converts).
std::vector<accel_test::TensorSpec> catalog_tensors(const accel::Architecture& arch, DType stored) {
  std::vector<accel_test::TensorSpec> out;
  for (const auto& m : arch.modules) {
    std::string path;
    for (std::size_t i = 0; i < m.path.size(); ++i) {
      if (m.path[i] == '{') {
        path += '0';
        i = m.path.find('}', i);
      } else {
        path += m.path[i];
      }
    }
    for (const auto& p : m.parameters) {
      const std::string name = path.empty() ? p : path + "." + p;
      const bool seen = std::any_of(out.begin(), out.end(), [&](const auto& t) { return t.name == name; });
      if (!seen) out.push_back({name, stored, {3, 5}, {}});
    }
  }
  out.push_back({"extra.ids", DType::I64, {7}, {}});
  return out;
}
}  // namespace

TEST_CASE("plan and load agree on every tensor's bytes for every catalog architecture and load dtype", "[load_plan][dtype]") {
  std::size_t checked = 0, kept_fp32 = 0;
  std::set<std::string> lacking;
  for (const auto& arch : accel::architecture_catalog().architectures) {
    for (DType stored : {DType::BF16, DType::F32}) {
      accel_test::TempDir dir;
      accel_test::write_safetensors(dir / "model.safetensors", catalog_tensors(arch, stored));
      accel_test::write_text(dir / "config.json", R"({"architectures": [")" + arch.name + R"("], "model_type": ")" +
                                                      arch.model_type + R"(", "num_hidden_layers": 1,
            "text_config": {"max_position_embeddings": 8, "num_hidden_layers": 1},
            "vision_config": {"image_size": 8, "patch_size": 4, "num_hidden_layers": 1}})");
      const auto ckpt = accel::resolve_checkpoint(dir.path());
      for (DType load : {DType::F16, DType::BF16, DType::F32}) {
        INFO(arch.name << " stored " << accel::torch_name(stored) << " loaded as " << accel::torch_name(load));
        std::optional<accel::CheckpointModel> built;
        try {
          built.emplace(accel::model_from_checkpoint(ckpt, {.load_dtype = load}));
        } catch (const accel::checkpoint_error& e) {
          // This small config.json lacks a key a buffer's shape reads and its class has no default
          // for (a real config.json has every key): said, and counted below.
          REQUIRE_THAT(e.what(), accel_test::contains("model config lacks what buffer"));
          lacking.insert(arch.name);
          continue;
        }
        const auto& model = *built;
        accel::PlanOptions popts;
        popts.dtype = load;
        popts.keep_in_fp32 = model.keep_in_fp32(load);
        const auto sizes = accel::compute_module_sizes(model.tree, accel::size_options(popts));
        accel::LoadOptions lopts;
        lopts.dtype = load;
        lopts.keep_in_fp32 = popts.keep_in_fp32;
        const auto plan = accel::plan_load(ckpt, accel::DeviceMap::from_json(R"({"": "cpu"})"), lopts, 0);
        const auto ix = model.tree.index();
        for (const auto& t : plan.tensors) {
          INFO(t.name);
          const auto id = model.tree.find_tensor(t.name);
          REQUIRE(id);
          if (ix->canonical[*id] != *id) continue;  // a tied copy: counted under its source
          REQUIRE(sizes.tensor[*id] == t.bytes);
          REQUIRE(accel::tensor_load_dtype(t.stored_dtype, t.name, {popts.dtype, popts.keep_in_fp32}) == t.dtype);
          kept_fp32 += accel::is_floating(t.stored_dtype) && load != DType::F32 && t.dtype == DType::F32;
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 1000);
  CHECK(lacking.size() * 50 < accel::architecture_catalog().architectures.size());  // under 2 % of the entries
  CHECK(kept_fp32 > 0);  // T5's `wo` and DeepSeek-V3's router gate were kept in float32 on both sides
}

TEST_CASE("a load takes its execution GPU and fetch buffers from the plan, and refuses one sized for less",
          "[load_plan][execution]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{"a.w", DType::F32, {50}, {}},
                                                            {"b.w", DType::F32, {25}, {}},
                                                            {"c.w", DType::F32, {100}, {}}});
  const auto checkpoint = accel::resolve_checkpoint(dir.path());
  const auto map = accel::DeviceMap::from_json(R"({"a": 1, "b": 1, "c": "cpu"})");
  // Without a plan: the lowest GPU of the map, fetch_slots buffers.
  const auto bare = accel::plan_load(checkpoint, map, {}, 2);
  CHECK(bare.execution_gpu == 1);
  CHECK(bare.fetch_slots == 2);
  CHECK(bare.largest_offloaded_layer == 400);
  CHECK(bare.largest_offloaded_unit == "c");
  // With the plan's: its GPU (holding no weight) and its count.
  accel::LoadOptions planned;
  planned.execution = accel::ExecutionPlan{0, 1, 400, "c"};
  const auto plan = accel::plan_load(checkpoint, map, planned, 2);
  CHECK(plan.execution_gpu == 0);
  CHECK(plan.fetch_slots == 1);
  // A plan that kept room for less than this load offloads, or none, is refused before anything is allocated.
  planned.execution = accel::ExecutionPlan{0, 2, 399, "c"};
  REQUIRE_THROWS_AS(accel::plan_load(checkpoint, map, planned, 2), accel::planning_error);
  REQUIRE_THROWS_WITH(accel::plan_load(checkpoint, map, planned, 2),
                      accel_test::contains("layer 'c' is loaded off the GPUs and needs a fetch buffer of 400 bytes") &&
                          accel_test::contains("on execution GPU 0, but the plan kept room for 2 of 399 bytes"));
  planned.execution = accel::ExecutionPlan{0, 0, 400, "c"};
  REQUIRE_THROWS_WITH(accel::plan_load(checkpoint, map, planned, 2),
                      accel_test::contains("the plan kept room for none (no GPU has room for its largest offloaded layer 'c')"));
  planned.execution = accel::ExecutionPlan{3, 1, 400, "c"};
  REQUIRE_THROWS_AS(accel::plan_load(checkpoint, map, planned, 2), accel::unavailable_error);
}
