// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The one-call load (plan a device map with a strategy, then load) against host-simulated GPUs.
#include <accel/load/auto_dispatch.hpp>

#include <fstream>
#include <random>
#include <set>

#include "support/catch.hpp"
#include "support/fake_devices.hpp"
#include "support/fake_env.hpp"
#include "support/models.hpp"
#include "support/safetensors_writer.hpp"

namespace fs = std::filesystem;
using accel::DType;
using accel::Placement;
using accel_test::TensorSpec;

namespace {

constexpr int layers = 4;

// A Llama-shaped float32 checkpoint whose LM head is tied to the embedding (left out of the file).
std::vector<TensorSpec> llama_tensors() {
  std::vector<TensorSpec> out{{"model.embed_tokens.weight", DType::F32, {32, 16}, {}}};
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "self_attn.q_proj.weight", DType::F32, {16, 16}, {}});
    out.push_back({p + "mlp.up_proj.weight", DType::F32, {32, 16}, {}});
  }
  out.push_back({"model.norm.weight", DType::F32, {16}, {}});
  return out;
}

void write_llama(const fs::path& dir, bool with_config) {
  accel_test::write_safetensors(dir / "model.safetensors", llama_tensors());
  if (!with_config) return;
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
    "num_attention_heads": 2, "num_hidden_layers": 4, "tie_word_embeddings": true, "torch_dtype": "float16"})";
}

accel::AutoDispatchOptions options(std::vector<accel::DeviceMemoryPtr> devices, std::string mode, std::string budgets) {
  accel::AutoDispatchOptions o;
  o.device_map = std::move(mode);
  if (!budgets.empty()) o.max_memory = accel::parse_max_memory(budgets);
  o.load.devices = std::move(devices);
  o.load.staging_bytes = 4096;
  o.load.progress = false;
  return o;
}

std::set<Placement> placements(const accel::DispatchedModel& m) {
  std::set<Placement> out;
  for (const auto& t : m.tensors()) out.insert(t.placement);
  return out;
}

}  // namespace

TEST_CASE("one call plans with the catalog and config.json, then loads by that map", "[auto_dispatch]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  auto devices = accel::host_simulated_devices({1 << 20, 1 << 20});
  const auto opts = options(devices, "sequential", "0=4KiB,1=4KiB,cpu=1MiB");
  const auto planned = accel::plan_auto_dispatch(accel::resolve_checkpoint(dir.path()), opts);
  CHECK(planned.architecture.starts_with("LlamaForCausalLM"));
  CHECK(planned.load.dtype == DType::F16);  // the config's dtype, as from_pretrained(dtype="auto")

  auto m = accel::load_checkpoint_and_dispatch(dir.path(), opts);
  // Loaded by the planned map: every tensor where the map's key puts it, converted to float16.
  for (const auto& t : m.tensors()) {
    INFO(t.name);
    CHECK(t.dtype == DType::F16);
    CHECK(planned.plan.device_map.placement_of(t.name) == t.placement);
  }
  // Each decoder layer (the catalog's no-split class) stays on one device; budgets spill to cpu.
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    CHECK(m.at(p + "self_attn.q_proj.weight").placement == m.at(p + "mlp.up_proj.weight").placement);
  }
  CHECK(placements(m) == std::set<Placement>{Placement::gpu(0), Placement::gpu(1), Placement::cpu()});
  // The tied LM head resolves to the embedding, as the model transformers builds has it.
  CHECK(&m.at("lm_head.weight") == &m.at("model.embed_tokens.weight"));
}

TEST_CASE("balanced spreads the layers over every mocked GPU; sequential fills GPU 0 first", "[auto_dispatch]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  auto devices = accel::host_simulated_devices({1 << 20, 1 << 20});
  auto balanced = accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "balanced", "0=1MiB,1=1MiB"));
  CHECK(placements(balanced) == std::set<Placement>{Placement::gpu(0), Placement::gpu(1)});
  auto fresh = accel::host_simulated_devices({1 << 20, 1 << 20});
  auto sequential = accel::load_checkpoint_and_dispatch(dir.path(), options(fresh, "sequential", "0=1MiB,1=1MiB"));
  CHECK(placements(sequential) == std::set<Placement>{Placement::gpu(0)});
}

TEST_CASE("without max_memory the budgets are measured from the devices given", "[auto_dispatch]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  // 2 GiB each: free less max(1 GiB, 10 % of total) leaves 1 GiB per GPU, room for the whole model.
  auto devices = accel::host_simulated_devices({2ull << 30, 2ull << 30});
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "sequential", ""));
  CHECK(placements(m) == std::set<Placement>{Placement::gpu(0)});
  // A 1 GiB GPU keeps nothing after the reserve: the model goes to the cpu budget (available RAM).
  auto small = accel::host_simulated_devices({1ull << 30});
  auto c = accel::load_checkpoint_and_dispatch(dir.path(), options(small, "auto", ""));
  CHECK(placements(c) == std::set<Placement>{Placement::cpu()});
}

TEST_CASE("without config.json tensors keep their dtype and numbered children are the blocks", "[auto_dispatch]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), false);
  auto devices = accel::host_simulated_devices({1 << 20});
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "sequential", "0=12KiB,cpu=1MiB"));
  for (const auto& t : m.tensors()) CHECK(t.dtype == DType::F32);
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    CHECK(m.at(p + "self_attn.q_proj.weight").placement == m.at(p + "mlp.up_proj.weight").placement);
  }
  CHECK(placements(m) == std::set<Placement>{Placement::gpu(0), Placement::cpu()});
}

TEST_CASE("the one-call load refuses bad strategies, budgets and blocks by name before allocating", "[auto_dispatch]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  auto devices = accel::host_simulated_devices({1 << 20, 1 << 20});
  auto& gpu0 = static_cast<accel::HostSimulatedDevice&>(*devices[0]);
  SECTION("unknown strategy") {
    REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "fastest", "0=1MiB")), accel::usage_error);
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "fastest", "0=1MiB")),
                        accel_test::contains("unknown device map mode 'fastest'; use auto, balanced, balanced_low_0 or sequential"));
  }
  SECTION("a budget for a GPU that is not there") {
    REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "auto", "2=1MiB,cpu=1MiB")),
                      accel::unavailable_error);
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "auto", "2=1MiB,cpu=1MiB")),
                        accel_test::contains("max_memory gives GPU 2 a budget (") &&
                            accel_test::contains("but only 2 GPUs (0-1) are visible; budget only GPUs that exist"));
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), options({}, "auto", "0=1MiB")),
                        accel_test::contains("max_memory gives GPU 0 a budget (") && accel_test::contains("but no GPU is visible"));
  }
  SECTION("one GPU") {
    auto one = accel::host_simulated_devices({1 << 20});
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), options(one, "auto", "1=1MiB,cpu=1MiB")),
                        accel_test::contains("but only GPU 0 is visible; budget only GPUs that exist"));
  }
  SECTION("budgets too small with disk forbidden") {
    REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), options(devices, "sequential", "0=100,1=100,cpu=100,disk=0")),
                      accel::planning_error);
  }
  SECTION("a no-split spec that matches nothing") {
    auto o = options(devices, "auto", "0=1MiB,1=1MiB");
    o.no_split = {"LlamaDecoderLayr"};
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), o),
                        accel_test::contains("no-split 'LlamaDecoderLayr' matches no module") &&
                            accel_test::contains("did you mean 'LlamaDecoderLayer'?"));
  }
  CHECK(gpu0.allocations() == 0);
}

TEST_CASE("the one-call form reads as the README writes it (designated initializers)", "[auto_dispatch]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  auto model = accel::load_checkpoint_and_dispatch(dir.path(), accel::AutoDispatchOptions{
      .device_map = "balanced",
      .max_memory = accel::parse_max_memory("0=1MiB,1=1MiB,cpu=1MiB"),
      .load = {.dtype = DType::BF16, .devices = accel::host_simulated_devices({1 << 20, 1 << 20}), .progress = false}});
  CHECK(model.at("model.layers.3.mlp.up_proj.weight").dtype == DType::BF16);
  CHECK(placements(model) == std::set<Placement>{Placement::gpu(0), Placement::gpu(1)});
}

TEST_CASE("the speed objective moves an untied embedding off the GPUs and loads it without a fetch buffer",
          "[auto_dispatch][objective]") {
  accel_test::TempDir dir;
  auto tensors = llama_tensors();
  tensors.push_back({"lm_head.weight", DType::F32, {32, 16}, {}});
  accel_test::write_safetensors(dir / "model.safetensors", tensors);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
    "num_attention_heads": 2, "num_hidden_layers": 4, "tie_word_embeddings": false, "torch_dtype": "float16"})";
  // float16: embedding and head 1024 bytes each, a layer 1536, the norm 32. GPU 0's budget holds
  // everything but the embedding (7200 bytes), with no room for a reserve.
  const auto checkpoint = accel::resolve_checkpoint(dir.path());
  auto devices = accel::host_simulated_devices({7200 + 64});  // the map, and the two rows read below
  auto o = options(devices, "sequential", "0=7200,cpu=4096");
  const auto fit = accel::plan_auto_dispatch(checkpoint, o);
  REQUIRE(fit.load.row_read_tensors.empty());
  REQUIRE(fit.plan.device_map.placement_of("model.layers.3.mlp.up_proj.weight") != Placement::gpu(0));  // fit streams
  o.objective = accel::PlanObjective::speed;
  const auto speed = accel::plan_auto_dispatch(checkpoint, o);
  REQUIRE(speed.plan.device_map.placement_of("model.embed_tokens.weight") == Placement::cpu());
  for (const auto& t : tensors)
    if (t.name != "model.embed_tokens.weight") REQUIRE(speed.plan.device_map.placement_of(t.name) == Placement::gpu(0));
  REQUIRE(speed.load.row_read_tensors == std::vector<std::string>{"model.embed_tokens.weight"});

  // A fetch buffer for the embedding (1024 bytes) would not fit beside the map: none is made.
  auto model = accel::load_checkpoint_and_dispatch(checkpoint, speed.plan.device_map, speed.load);
  REQUIRE(model.fetch_buffer_count() == 0);
  const auto& table = model.at("model.embed_tokens.weight");
  REQUIRE(table.dtype == DType::F16);
  const std::vector<std::int64_t> ids{31, 2};
  accel::DeviceBuffer rows(devices[0], 64);
  model.read_rows(table.name, ids, rows.get());
  std::vector<std::byte> got(64), want;
  accel::Stream s(devices[0]);
  devices[0]->copy_to_host_async(got.data(), rows.get(), 64, s.get());
  devices[0]->synchronize(s.get());
  for (auto r : ids) want.insert(want.end(), table.host.begin() + r * 32, table.host.begin() + (r + 1) * 32);
  REQUIRE(got == want);
  REQUIRE_THROWS_WITH(model.fetch("model.embed_tokens"), accel_test::contains("use read_rows"));
}

namespace {

// One draw of the sweep below: 1-3 GPUs of 512 KiB - 7.5 MiB (8-120 MiB for the full-size model),
// sometimes a cpu budget, a dtype and an objective; the mode cycles through the four.
struct SweepCase {
  std::vector<std::uint64_t> gpus;
  std::optional<std::uint64_t> cpu;
  DType dtype = DType::BF16;
  accel::PlanObjective objective = accel::PlanObjective::fit;
  std::string mode;
  [[nodiscard]] std::string budgets() const {
    std::string out;
    for (std::size_t i = 0; i < gpus.size(); ++i) out += (i ? "," : "") + std::to_string(i) + "=" + std::to_string(gpus[i]);
    return cpu ? out + ",cpu=" + std::to_string(*cpu) : out;
  }
  [[nodiscard]] std::string describe() const {
    return "--device-map " + mode + " --max-memory " + budgets() + " --dtype " + std::string(accel::torch_name(dtype)) +
           " --objective " + std::string(accel::plan_objective_name(objective));
  }
};

// Drawn from mt19937's raw output (specified by the standard, unlike its distributions), so every
// platform draws the same cases.
std::vector<SweepCase> sweep_cases(std::size_t count) {
  std::mt19937 rng(20240917);
  auto draw = [&](std::uint64_t lo, std::uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  const DType dtypes[] = {DType::BF16, DType::F16, DType::F32};
  const char* modes[] = {"auto", "balanced", "balanced_low_0", "sequential"};
  std::vector<SweepCase> out;
  for (std::size_t k = 0; k < count; ++k) {
    SweepCase c;
    const auto n = draw(1, 3);
    for (std::uint64_t g = 0; g < n; ++g) c.gpus.push_back(draw(512, 7680) << 10);
    if (draw(0, 9) < 7) c.cpu = draw(0, 7680) << 10;
    c.dtype = dtypes[draw(0, 2)];
    c.objective = draw(0, 1) ? accel::PlanObjective::speed : accel::PlanObjective::fit;
    c.mode = modes[k % 4];
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

TEST_CASE("every map the one-call load plans loads on GPUs exactly as large as their budgets, or is refused before "
          "anything is allocated",
          "[auto_dispatch][execution]") {
  accel_test::TempDir dir;
  accel_test::write_scaled_llama(dir.path());
  const auto checkpoint = accel::resolve_checkpoint(dir.path());
  std::size_t loaded = 0, refused = 0, idle_execution_gpu = 0;
  for (const auto& c : sweep_cases(120)) {
    INFO(c.describe());
    auto devices = accel::host_simulated_devices(c.gpus);
    accel::AutoDispatchOptions o = options(devices, c.mode, c.budgets());
    o.objective = c.objective;
    o.load.dtype = c.dtype;
    o.load.offload_folder = dir / "offload";
    o.load.staging_bytes = 64 << 10;
    std::optional<accel::DispatchedModel> model;
    try {
      model.emplace(accel::load_checkpoint_and_dispatch(dir.path(), o));
    } catch (const accel::planning_error& e) {
      // Refused up front: naming the layer and each GPU's room, with nothing allocated anywhere.
      CHECK_THAT(e.what(), accel_test::contains("no GPU has room for a fetch buffer of '"));
      for (const auto& d : devices) CHECK(static_cast<accel::HostSimulatedDevice&>(*d).allocations() == 0);
      ++refused;
      continue;
    } catch (const accel::cuda_error& e) {
      FAIL_CHECK("the load of its own plan failed while allocating: " << e.what());
      continue;
    }
    ++loaded;
    // The load used what the plan says, and its buffers hold every offloaded layer.
    const auto planned = accel::plan_auto_dispatch(checkpoint, o);
    const auto& e = planned.plan.execution;
    REQUIRE(e.loadable());
    CHECK(model->execution_device() == e.gpu);
    CHECK(model->fetch_buffer_count() == (e.fetch_buffer_bytes ? e.fetch_slots : 0));
    CHECK(model->fetch_buffer_bytes() <= e.fetch_buffer_bytes);
    std::set<std::string> offloaded;
    for (const auto& t : model->tensors()) {
      CHECK(planned.plan.device_map.placement_of(t.name) == t.placement);
      const auto& rows = planned.load.row_read_tensors;
      if (!t.placement.is_gpu() && std::find(rows.begin(), rows.end(), t.name) == rows.end())
        offloaded.insert(std::string(accel::layer_of(t.name)));
    }
    for (const auto& layer : offloaded) CHECK(model->fetch(layer).tensors().size() > 0);
    const bool holds_weights = std::any_of(model->tensors().begin(), model->tensors().end(),
                                           [&](const auto& t) { return t.placement.is_gpu() && t.placement.index == e.gpu; });
    if (e.gpu && !holds_weights && !offloaded.empty()) ++idle_execution_gpu;
  }
  // The sweep covers what went wrong: fetch buffers on an execution GPU that holds no weights.
  CHECK(idle_execution_gpu > 0);
  CHECK(loaded + refused == 120);
  CHECK(refused < 12);
}

namespace {

// Local process `local_rank` of two on a machine with four GPUs, two GPUs each (as under
// `accel launch --gpus_per_process 2`), from injected sources: it owns cuda:2r and cuda:2r+1.
accel::DistributedState group_state(int local_rank, const accel_test::Vars& extra = {}) {
  return accel::DistributedState(accel::map_env(accel_test::with(accel_test::torchrun_vars(local_rank, 2, 2), extra)),
                                 accel_test::fake_gpus(4), {.gpus_per_process = 2, .make_current = false});
}

std::uint64_t live(const accel::DeviceMemoryPtr& d) { return static_cast<accel::HostSimulatedDevice&>(*d).live_bytes(); }

}  // namespace

TEST_CASE("two processes of two GPUs each plan and load their own copies on their own GPUs only", "[auto_dispatch][group]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  for (int r = 0; r < 2; ++r) {
    INFO("local process " << r);
    const auto state = group_state(r);
    REQUIRE(state.devices() == std::vector<accel::Device>{accel::Device::cuda(2 * r), accel::Device::cuda(2 * r + 1)});
    auto visible = accel::host_simulated_devices({1 << 20, 1 << 20, 1 << 20, 1 << 20});  // what each process sees
    const auto opts = options(visible, "balanced", "0=1MiB,1=1MiB");
    const auto planned = accel::plan_auto_dispatch(accel::resolve_checkpoint(dir.path()), state, opts);
    // The map's GPU keys index the group; the load places them on the group's GPUs, in order.
    for (const auto& [key, where] : planned.plan.device_map) CHECK((where == Placement::gpu(0) || where == Placement::gpu(1)));
    REQUIRE(planned.load.devices->size() == 2);
    CHECK((*planned.load.devices)[0] == visible[2 * r]);
    CHECK((*planned.load.devices)[1] == visible[2 * r + 1]);

    auto m = accel::load_checkpoint_and_dispatch(dir.path(), state, opts);
    CHECK(placements(m) == std::set<Placement>{Placement::gpu(0), Placement::gpu(1)});
    CHECK(live(visible[2 * r]) > 0);
    CHECK(live(visible[2 * r + 1]) > 0);
    CHECK(live(visible[2 - 2 * r]) == 0);  // the other process's GPUs stay empty
    CHECK(live(visible[3 - 2 * r]) == 0);
  }
}

TEST_CASE("a group's max_memory keys index the group and a key past it is refused naming the group", "[auto_dispatch][group]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  const auto state = group_state(1, {{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}});
  auto visible = accel::host_simulated_devices({1 << 20, 1 << 20, 1 << 20, 1 << 20});
  SECTION("key 0 is the group's first GPU (cuda:2), key 1 its second (cuda:3)") {
    // Key 0 too small for a layer: sequential fills the group's second GPU instead.
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), state, options(visible, "sequential", "0=1KiB,1=1MiB,cpu=1MiB"));
    CHECK(placements(m).count(Placement::gpu(1)) == 1);
    CHECK(live(visible[3]) > 0);
    CHECK(live(visible[0]) + live(visible[1]) == 0);
  }
  SECTION("key 2 is past a group of two") {
    const auto opts = options(visible, "auto", "0=1MiB,2=1MiB,cpu=1MiB");
    REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), state, opts), accel::usage_error);
    REQUIRE_THROWS_WITH(accel::plan_auto_dispatch(accel::resolve_checkpoint(dir.path()), state, opts),
                        accel_test::contains("max_memory gives GPU 2 a budget (1.00 MiB) but this process's group has 2 GPUs: "
                                             "cuda:2,cuda:3 (physical GPUs 6,7); GPU keys index the group: 0 to 1"));
    for (const auto& d : visible) CHECK(live(d) == 0);  // refused before anything is allocated
  }
  SECTION("a process on the CPU has no GPU to budget") {
    const accel::DistributedState cpu(accel::map_env(accel_test::torchrun_vars(1, 2, 2)), accel_test::fake_gpus(4),
                                      {.cpu = true, .gpus_per_process = 2});
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), cpu, options(visible, "auto", "0=1MiB,cpu=1MiB")),
                        accel_test::contains("but this process's group has no GPU (it runs on the CPU); budget only cpu and disk"));
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), cpu, options(visible, "auto", "cpu=1MiB"));
    CHECK(placements(m) == std::set<Placement>{Placement::cpu()});
  }
  SECTION("without a state, keys still name the visible GPUs") {
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), options(visible, "sequential", "2=1MiB,cpu=1MiB"));
    CHECK(placements(m) == std::set<Placement>{Placement::gpu(2)});
    CHECK(live(visible[2]) > 0);
  }
}

TEST_CASE("unset budgets are measured on the group's GPUs only", "[auto_dispatch][group]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  // GPUs 0-1 keep nothing after the 1 GiB reserve; GPUs 2-3 keep 1 GiB each.
  const std::vector<std::uint64_t> sizes{1ull << 30, 1ull << 30, 2ull << 30, 2ull << 30};
  auto second = accel::host_simulated_devices(sizes);
  const auto planned = accel::plan_auto_dispatch(accel::resolve_checkpoint(dir.path()), group_state(1), options(second, "sequential", ""));
  CHECK(planned.plan.device_map.placement_of("model.layers.0.mlp.up_proj.weight") == Placement::gpu(0));  // the group's first: cuda:2
  auto first = accel::host_simulated_devices(sizes);
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), group_state(0), options(first, "sequential", ""));
  CHECK(placements(m) == std::set<Placement>{Placement::cpu()});  // its own GPUs have no room left
}

TEST_CASE("a group naming a GPU the load was not given is refused", "[auto_dispatch][group]") {
  accel_test::TempDir dir;
  write_llama(dir.path(), true);
  auto two = accel::host_simulated_devices({1 << 20, 1 << 20});
  REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), group_state(1), options(two, "auto", "0=1MiB")),
                    accel::unavailable_error);
  REQUIRE_THROWS_WITH(accel::group_device_memories(group_state(1), two),
                      accel_test::contains("process 1's group is cuda:2,cuda:3 (physical GPUs 2,3) but only 2 GPUs (cuda:0-1) "
                                           "are given to load on"));
}
