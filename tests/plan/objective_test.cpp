// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The speed objective: the row-read embedding, the reserve, packing, and its guarantees against
// the fit map, checked with an accounting written here independently of the planner's.
#include <accel/plan/objective.hpp>
#include <accel/plan/planner.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"

using accel::DType;
using accel::Placement;

namespace {

struct LlamaShape {
  int layers = 6;
  bool tied = false;
  bool split_blocks = false;  // each layer two linears (attn, mlp) under a Block
};

// A Llama-like tree in float32: embed_tokens 1024 B, layers of 512 B (blocks), norm 32 B, lm_head 1024 B.
accel::ModuleTree llama(const LlamaShape& s = {}) {
  accel::ModuleTree t;
  t.add_module("model", "Model");
  t.add_module("model.embed_tokens", "Embedding");
  t.add_parameter("model.embed_tokens.weight", DType::F32, {32, 8});
  for (int i = 0; i < s.layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i);
    t.add_module(l, "Block");
    if (s.split_blocks) {
      t.add_module(l + ".attn", "Linear");
      t.add_parameter(l + ".attn.weight", DType::F32, {8, 8});
      t.add_module(l + ".mlp", "Linear");
      t.add_parameter(l + ".mlp.weight", DType::F32, {8, 8});
    } else {
      t.add_module(l + ".mlp", "Linear");
      t.add_parameter(l + ".mlp.weight", DType::F32, {16, 8});
    }
  }
  t.add_module("model.norm", "RMSNorm");
  t.add_parameter("model.norm.weight", DType::F32, {8});
  t.add_module("lm_head", "Linear");
  if (s.tied) t.add_alias("lm_head.weight", "model.embed_tokens.weight");
  else t.add_parameter("lm_head.weight", DType::F32, {32, 8});
  return t;
}

accel::PlanOptions options(const char* budgets, std::vector<std::string> no_split = {"Block"}) {
  accel::PlanOptions o;
  o.max_memory = accel::parse_max_memory(budgets);
  o.no_split = std::move(no_split);
  o.auto_no_split = false;
  o.rules = accel::PlanRules::transformers;
  return o;
}

// The layer a pass fetches a tensor with: up to the first numeric component, else its module.
std::string layer_of(const std::string& tensor) {
  std::size_t start = 0;
  while (true) {
    const auto dot = tensor.find('.', start);
    if (dot == std::string::npos) return start ? tensor.substr(0, start - 1) : std::string();
    const auto part = tensor.substr(start, dot - start);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos) return tensor.substr(0, dot);
    start = dot + 1;
  }
}

// This test's own accounting of a map: bytes per device, what streams, the largest offloaded layer.
struct Accounting {
  std::map<Placement, std::uint64_t> placed;
  std::uint64_t streamed = 0;
  std::uint64_t largest_offloaded = 0;  // excluding row-read embeddings
  std::uint64_t largest_on_disk = 0;
};

Accounting account(const accel::ModuleTree& tree, const accel::PlanOptions& o, const accel::DeviceMap& map,
                   const std::vector<std::string>& row_read) {
  const auto sizes = accel::compute_module_sizes(tree, accel::size_options(o));
  const auto ix = tree.index();
  Accounting a;
  std::map<std::string, std::uint64_t> off, disk;
  bool gpu = false;
  for (const auto& [k, p] : map) gpu = gpu || p.is_gpu();
  for (std::size_t t = 0; t < tree.tensors().size(); ++t) {
    if (ix->canonical[t] != t) continue;
    const auto& name = tree.tensors()[t].name;
    const auto p = map.placement_of(name);
    REQUIRE(p);
    a.placed[*p] += sizes.tensor[t];
    if (p->is_gpu() || std::find(row_read.begin(), row_read.end(), name) != row_read.end()) continue;
    if (tree.tensors()[t].buffer && !o.offload_buffers) continue;  // stays resident on the execution GPU
    if (p->is_cpu() && !gpu) continue;
    a.streamed += sizes.tensor[t];
    a.largest_offloaded = std::max(a.largest_offloaded, off[layer_of(name)] += sizes.tensor[t]);
    if (p->is_disk()) a.largest_on_disk = std::max(a.largest_on_disk, disk[layer_of(name)] += sizes.tensor[t]);
  }
  return a;
}

// Every budget holds, with room on the execution GPU for the layers that stream and on cpu for
// the largest layer on disk.
void require_within_budgets(const accel::ModuleTree& tree, const accel::PlanOptions& o, const accel::PlanResult& plan) {
  std::vector<std::string> row_read;
  if (plan.objectives) row_read = plan.objectives->row_read;
  const auto a = account(tree, o, plan.device_map, row_read);
  const auto& b = plan.budgets;
  bool exec_seen = false;
  for (const auto& [gpu, budget] : b.gpus) {
    auto placed = a.placed.count(Placement::gpu(gpu)) ? a.placed.at(Placement::gpu(gpu)) : 0;
    INFO("GPU " << gpu << " placed " << placed << " budget " << budget);
    if (placed > 0 && !exec_seen) {
      exec_seen = true;
      placed += a.largest_offloaded * o.gpu_reserve_layers;
    }
    CHECK(placed <= budget);
  }
  if (a.placed.count(Placement::cpu())) {
    REQUIRE(b.cpu);
    CHECK(a.placed.at(Placement::cpu()) + a.largest_on_disk <= *b.cpu);
  }
  if (b.disk && a.placed.count(Placement::disk())) CHECK(a.placed.at(Placement::disk()) <= *b.disk);
}

accel::PlanResult plan(const accel::ModuleTree& t, accel::PlanOptions o, accel::PlanObjective objective,
                       accel::DeviceMapMode mode = accel::DeviceMapMode::sequential) {
  o.objective = objective;
  return accel::plan_device_map(t, mode, o);
}

}  // namespace

TEST_CASE("row_read_embeddings: untied input embeddings only", "[objective]") {
  SECTION("an untied embed_tokens is read by rows") {
    const auto t = llama();
    const auto flags = accel::row_read_embeddings(t);
    CHECK(flags[*t.find_tensor("model.embed_tokens.weight")]);
    CHECK_FALSE(flags[*t.find_tensor("lm_head.weight")]);
  }
  SECTION("an embedding tied to the LM head is not") {
    const auto t = llama({.tied = true});
    const auto flags = accel::row_read_embeddings(t);
    CHECK_FALSE(flags[*t.find_tensor("model.embed_tokens.weight")]);
    CHECK_FALSE(flags[*t.find_tensor("lm_head.weight")]);
  }
  SECTION("input embeddings tied only to each other (mT5's shared, encoder and decoder) are") {
    accel::ModuleTree t;
    t.add_module("shared", "Embedding");
    t.add_parameter("shared.weight", DType::F32, {32, 8});
    t.add_module("encoder.embed_tokens", "Embedding");
    t.add_alias("encoder.embed_tokens.weight", "shared.weight");
    t.add_module("decoder.embed_tokens", "Embedding");
    t.add_alias("decoder.embed_tokens.weight", "shared.weight");
    t.add_parameter("lm_head.weight", DType::F32, {32, 8});
    const auto flags = accel::row_read_embeddings(t);
    CHECK(flags[*t.find_tensor("shared.weight")]);
    CHECK(flags[*t.find_tensor("decoder.embed_tokens.weight")]);
    t.tie({"shared.weight", "lm_head.weight"});  // T5: the head shares them too
    const auto tied = accel::row_read_embeddings(t);
    CHECK_FALSE(tied[*t.find_tensor("shared.weight")]);
  }
  SECTION("a module named like an embedding that is not one is not") {
    accel::ModuleTree t;
    t.add_module("wte", "Linear");
    t.add_parameter("wte.weight", DType::F32, {32, 8});
    t.add_parameter("word_embeddings.weight", DType::F32, {32});  // 1-D
    t.add_parameter("word_embeddings.bias", DType::F32, {32});
    const auto flags = accel::row_read_embeddings(t);
    CHECK_FALSE(flags[*t.find_tensor("wte.weight")]);
    CHECK_FALSE(flags[*t.find_tensor("word_embeddings.weight")]);
  }
}

TEST_CASE("the fit objective is the default and its plan carries no comparison", "[objective]") {
  const auto t = llama();
  accel::PlanOptions o = options("0=3000,cpu=100000");
  CHECK(o.objective == accel::PlanObjective::fit);
  const auto fit = accel::plan_device_map(t, accel::DeviceMapMode::sequential, o);
  CHECK_FALSE(fit.objectives);
  CHECK(fit.objective == accel::PlanObjective::fit);
  CHECK(accel::parse_plan_objective("speed") == accel::PlanObjective::speed);
  CHECK_THROWS_WITH(accel::parse_plan_objective("fast"), "[accel.usage] unknown plan objective 'fast'; use fit or speed");
}

TEST_CASE("speed: the untied input embedding leaves the GPU first and layers take its room", "[objective]") {
  const auto t = llama();
  const auto o = options("0=3000,cpu=100000");
  const auto fit = plan(t, o, accel::PlanObjective::fit);
  const auto speed = plan(t, o, accel::PlanObjective::speed);
  REQUIRE(speed.objectives);
  const auto& c = *speed.objectives;
  CHECK(fit.device_map.placement_of("model.embed_tokens.weight") == Placement::gpu(0));
  CHECK(speed.device_map.placement_of("model.embed_tokens.weight") == Placement::cpu());
  CHECK(c.row_read == std::vector<std::string>{"model.embed_tokens.weight"});
  // fit: embedding + one layer on GPU 0 (room for lm_head kept); speed: lm_head, two layers, norm.
  CHECK(c.fit.streamed() == 3616);
  CHECK(c.speed.streamed() == 2048);
  CHECK(c.speed.row_read == 1024);
  CHECK(account(t, o, speed.device_map, c.row_read).streamed == c.speed.streamed());
  CHECK(speed.devices.front().reserve == 512);  // one layer of 512 B streams: its fetch buffer
  require_within_budgets(t, o, speed);
  const auto moved = std::find_if(c.moves.begin(), c.moves.end(), [](const auto& m) { return m.module == "model.embed_tokens"; });
  REQUIRE(moved != c.moves.end());
  CHECK(moved->from == Placement::gpu(0));
  CHECK(moved->to == Placement::cpu());
  CHECK(moved->why == "input embedding: rows are read, not the table");
  const auto layer = std::find_if(c.moves.begin(), c.moves.end(), [](const auto& m) { return m.to.is_gpu() && !m.from.is_gpu(); });
  REQUIRE(layer != c.moves.end());
  CHECK_THAT(layer->why, Catch::Matchers::StartsWith("room freed by 'model.embed_tokens' leaving the GPUs (1.00 KiB), the reserve on GPU 0 shrinking from "
                                                    "1.00 KiB to 512 B"));
}

TEST_CASE("speed: a tied embedding stays a streamed weight", "[objective]") {
  const auto t = llama({.tied = true});
  const auto o = options("0=3000,cpu=100000");
  const auto speed = plan(t, o, accel::PlanObjective::speed);
  REQUIRE(speed.objectives);
  CHECK(speed.objectives->row_read.empty());
  CHECK(speed.device_map.placement_of("model.embed_tokens.weight")->is_gpu());
  CHECK(speed.device_map.placement_of("lm_head.weight") == speed.device_map.placement_of("model.embed_tokens.weight"));
  for (const auto& m : speed.objectives->moves) CHECK(m.why != "input embedding: rows are read, not the table");
  require_within_budgets(t, o, speed);
}

TEST_CASE("speed: the reserve stays on the execution GPU only, so the others fill up", "[objective]") {
  const auto t = llama();
  const auto o = options("0=2100,1=1800,cpu=100000");
  const auto speed = plan(t, o, accel::PlanObjective::speed);
  REQUIRE(speed.objectives);
  CHECK(speed.objectives->speed.streamed() == 1024);  // two layers stream
  REQUIRE(speed.devices.size() >= 2);
  CHECK(speed.devices[1].device == Placement::gpu(1));
  CHECK(speed.devices[1].placed == 1536);  // three layers: more than 1800 B less a 512 B reserve holds
  CHECK(speed.devices[1].reserve == 0);
  CHECK(speed.devices[0].reserve == 512);
  require_within_budgets(t, o, speed);
}

TEST_CASE("speed: nothing streams once the embedding leaves and no reserve is needed", "[objective]") {
  const auto t = llama();
  const auto o = options("0=4200,cpu=2000");
  const auto fit = plan(t, o, accel::PlanObjective::fit);
  const auto speed = plan(t, o, accel::PlanObjective::speed);
  REQUIRE(speed.objectives);
  CHECK(speed.objectives->fit.streamed() > 0);
  CHECK(speed.objectives->speed.streamed() == 0);
  CHECK(speed.objectives->speed.seconds == 0);
  CHECK(speed.devices.front().reserve == 0);
  CHECK(speed.device_map.placement_of("model.embed_tokens.weight") == Placement::cpu());
  require_within_budgets(t, o, speed);
}

TEST_CASE("speed: when the fit map streams nothing it is kept as it is", "[objective]") {
  const auto t = llama();
  const auto o = options("0=6000,1=6000,cpu=2000");
  const auto fit = plan(t, o, accel::PlanObjective::fit, accel::DeviceMapMode::balanced);
  const auto speed = plan(t, o, accel::PlanObjective::speed, accel::DeviceMapMode::balanced);
  REQUIRE(speed.objectives);
  CHECK_FALSE(speed.objectives->speed_map_differs);
  CHECK(speed.objectives->moves.empty());
  CHECK(speed.device_map.to_json_string() == fit.device_map.to_json_string());
}

TEST_CASE("speed: host before disk", "[objective]") {
  const auto t = llama({.layers = 12});
  const auto o = options("0=3000,cpu=1700");
  const auto speed = plan(t, o, accel::PlanObjective::speed);
  REQUIRE(speed.objectives);
  const auto& c = *speed.objectives;
  CHECK(c.speed.from_disk > 0);
  CHECK(c.speed.from_cpu > 0);
  require_within_budgets(t, o, speed);
  // No layer on disk would have fitted in what cpu has left beside its reserve for a disk layer.
  const auto a = account(t, o, speed.device_map, c.row_read);
  const std::uint64_t cpu_left = 1700 - a.placed.at(Placement::cpu()) - a.largest_on_disk;
  for (int i = 0; i < 12; ++i) {
    const std::string w = "model.layers." + std::to_string(i) + ".mlp.weight";
    if (speed.device_map.placement_of(w) == Placement::disk()) CHECK(cpu_left < 512);
  }
  // With cpu room for everything the GPUs leave, nothing goes to disk.
  const auto roomy = plan(t, options("0=3000,cpu=100000"), accel::PlanObjective::speed);
  CHECK(roomy.objectives->speed.from_disk == 0);
}

TEST_CASE("speed without a GPU: cpu holds the layers read whole, the row-read embedding goes to disk first", "[objective]") {
  const auto t = llama();
  const auto o = options("cpu=3700");
  const auto fit = plan(t, o, accel::PlanObjective::fit);
  const auto speed = plan(t, o, accel::PlanObjective::speed);
  REQUIRE(speed.objectives);
  const auto& c = *speed.objectives;
  // fit (transformers' order): the embedding and the first layers fill cpu, the rest goes to disk
  // and is read from there on every pass.
  CHECK(fit.device_map.placement_of("model.embed_tokens.weight") == Placement::cpu());
  CHECK(c.fit.from_disk > 0);
  // speed: the embedding, read by rows wherever it is, leaves cpu room to a layer read whole.
  CHECK(speed.device_map.placement_of("model.embed_tokens.weight") == Placement::disk());
  CHECK(c.speed.from_cpu == 0);  // no GPU: what is in host memory is not streamed
  CHECK(c.speed.from_disk < c.fit.from_disk);
  CHECK(account(t, o, speed.device_map, c.row_read).streamed == c.speed.streamed());
  require_within_budgets(t, o, speed);
  const auto moved = std::find_if(c.moves.begin(), c.moves.end(), [](const auto& m) { return m.module == "model.embed_tokens"; });
  REQUIRE(moved != c.moves.end());
  CHECK(moved->from == Placement::cpu());
  CHECK(moved->to == Placement::disk());
  CHECK(moved->why == "input embedding: rows are read, not the table");
  // cpu keeps room for the largest layer on disk, not for the largest of all: no layer on disk
  // would have fitted in what it has left.
  const auto a = account(t, o, speed.device_map, c.row_read);
  const std::uint64_t cpu_left = 3700 - a.placed.at(Placement::cpu()) - a.largest_on_disk;
  int on_disk = 0;
  for (int i = 0; i < 6; ++i)
    if (speed.device_map.placement_of("model.layers." + std::to_string(i) + ".mlp.weight") == Placement::disk()) {
      ++on_disk;
      CHECK(cpu_left < 512);
    }
  CHECK(on_disk == 2);
  // With room for everything, nothing moves.
  const auto roomy = plan(t, options("cpu=100000"), accel::PlanObjective::speed);
  CHECK_FALSE(roomy.objectives->speed_map_differs);
}

TEST_CASE("speed: no-split blocks stay whole and tied tensors together", "[objective]") {
  auto t = llama({.layers = 8, .split_blocks = true});
  t.tie({"model.layers.0.attn.weight", "model.layers.7.attn.weight"});
  for (const char* budgets : {"0=2300,cpu=100000", "0=1500,1=1300,cpu=1200", "0=2600,cpu=900"}) {
    const auto o = options(budgets);
    const auto speed = plan(t, o, accel::PlanObjective::speed);
    REQUIRE(speed.objectives);
    INFO(budgets << ": " << speed.device_map.to_json_string());
    for (int i = 0; i < 8; ++i) {
      const std::string l = "model.layers." + std::to_string(i);
      CHECK(speed.device_map.placement_of(l + ".attn.weight") == speed.device_map.placement_of(l + ".mlp.weight"));
    }
    CHECK(speed.device_map.placement_of("model.layers.0.mlp.weight") == speed.device_map.placement_of("model.layers.7.mlp.weight"));
    require_within_budgets(t, o, speed);
    CHECK(speed.objectives->speed.streamed() <= speed.objectives->fit.streamed());
  }
}

TEST_CASE("speed on random models: never more streamed than fit, never over a budget, every tensor mapped once",
          "[objective]") {
  std::mt19937 rng(20240521);
  int better = 0, cases = 0;
  for (int round = 0; round < 300; ++round) {
    accel::ModuleTree t;
    const bool tied = rng() % 3 == 0;
    const int width = 4 + static_cast<int>(rng() % 6);
    t.add_module("model.embed_tokens", "Embedding");
    t.add_parameter("model.embed_tokens.weight", DType::F32, {32 + static_cast<int>(rng() % 64), width});
    const int layers = 2 + static_cast<int>(rng() % 10);
    std::uint64_t total = 0;
    for (int i = 0; i < layers; ++i) {
      const std::string l = "model.layers." + std::to_string(i);
      t.add_module(l, "Block");
      t.add_parameter(l + ".a.weight", DType::F32, {width, 4 + static_cast<int>(rng() % 12)});
      t.add_parameter(l + ".b.weight", DType::F32, {width, 4 + static_cast<int>(rng() % 12)});
      if (rng() % 4 == 0) t.add_buffer(l + ".b.stat", DType::F32, {width});
    }
    t.add_parameter("model.norm.weight", DType::F32, {width});
    if (tied) t.add_alias("lm_head.weight", "model.embed_tokens.weight");
    else t.add_parameter("lm_head.weight", DType::F32, {16 + static_cast<int>(rng() % 64), width});
    total = accel::compute_module_sizes(t).total();
    const int gpus = static_cast<int>(rng() % 4);  // 0: a process without a GPU
    const double share = 0.2 + 0.8 * static_cast<double>(rng() % 100) / 100.0;
    std::string budgets;
    for (int g = 0; g < gpus; ++g) budgets += std::to_string(g) + "=" + std::to_string(static_cast<std::uint64_t>(static_cast<double>(total) * share / gpus)) + ",";
    budgets += "cpu=" + std::to_string(total * (rng() % 60) / 100);
    if (rng() % 3 == 0) budgets += ",disk=" + std::to_string(total);
    auto o = options(budgets.c_str());
    o.gpu_reserve_layers = 1 + rng() % 2;
    o.offload_buffers = rng() % 2 == 0;
    const auto mode = rng() % 2 ? accel::DeviceMapMode::sequential : accel::DeviceMapMode::automatic;
    accel::PlanResult fit, speed;
    try {
      fit = plan(t, o, accel::PlanObjective::fit, mode);
    } catch (const accel::planning_error&) {
      CHECK_THROWS_AS(plan(t, o, accel::PlanObjective::speed, mode), accel::planning_error);
      continue;
    }
    speed = plan(t, o, accel::PlanObjective::speed, mode);
    INFO("round " << round << " budgets " << budgets << "\nfit   " << fit.device_map.to_json_string() << "\nspeed "
                  << speed.device_map.to_json_string());
    REQUIRE(speed.objectives);
    const auto& c = *speed.objectives;
    const auto fit_account = account(t, o, fit.device_map, c.row_read);
    const auto speed_account = account(t, o, speed.device_map, c.row_read);
    CHECK(fit_account.streamed == c.fit.streamed());
    CHECK(speed_account.streamed == c.speed.streamed());
    CHECK(speed_account.streamed <= fit_account.streamed);
    CHECK(c.speed.seconds <= c.fit.seconds * (1 + 1e-9));
    CHECK(accel::check_device_map(t, speed.device_map).warnings.empty());
    if (c.speed_map_differs) require_within_budgets(t, o, speed);
    ++cases;
    better += c.speed.streamed() < c.fit.streamed();
  }
  CHECK(cases > 100);
  CHECK(better > cases / 10);  // the objective changes something, not only in hand-made cases
}
