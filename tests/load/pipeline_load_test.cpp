// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Loading one pipeline stage (plan_pipeline_load, load_stage, the state form with
// AutoDispatchOptions::stages): a stage loads exactly its tensors onto its process's devices, a
// tie across stages is a copy in each, and the stages together are the whole model.
#include <accel/load/auto_dispatch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <span>

#include "support/catch.hpp"
#include "support/fake_devices.hpp"
#include "support/fake_env.hpp"
#include "support/models.hpp"
#include "support/safetensors_writer.hpp"

namespace fs = std::filesystem;
using accel::DType;
using accel::Placement;

namespace {

// The tiny Llama with real weights (bfloat16, 4 layers, untied head) that the forward tests run.
fs::path tiny_llama() { return fs::path(ACCEL_TEST_SOURCE_DIR) / "tests/compat/fixtures/forward/llama"; }

// A float32 Llama whose LM head is tied to the input embedding (absent from the file).
void write_tied_llama(const fs::path& dir) {
  std::vector<accel_test::TensorSpec> t{{"model.embed_tokens.weight", DType::F32, {32, 16}, {}}};
  for (int i = 0; i < 4; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "self_attn.q_proj.weight", DType::F32, {16, 16}, {}});
    t.push_back({p + "mlp.up_proj.weight", DType::F32, {32, 16}, {}});
  }
  t.push_back({"model.norm.weight", DType::F32, {16}, {}});
  accel_test::write_safetensors(dir / "model.safetensors", t);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
    "num_attention_heads": 2, "num_hidden_layers": 4, "tie_word_embeddings": true, "torch_dtype": "float32"})";
}

accel::AutoDispatchOptions stage_options(int stages, std::vector<accel::DeviceMemoryPtr> devices, const std::string& budgets) {
  accel::AutoDispatchOptions o;
  o.stages = stages;
  o.max_memory = accel::parse_max_memory(budgets);
  o.load.devices = std::move(devices);
  o.load.staging_bytes = 4096;
  o.load.progress = false;
  return o;
}

std::set<std::string> names_of(const accel::DispatchedModel& m) {
  std::set<std::string> out;
  for (const auto& t : m.tensors()) out.insert(t.name);
  return out;
}

std::span<const std::byte> host_bytes(const accel::DispatchedModel& m, const std::string& name) {
  const auto& t = m.at(name);
  REQUIRE(!t.host.empty());
  return t.host;
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

std::uint64_t live(const accel::DeviceMemoryPtr& d) { return static_cast<accel::HostSimulatedDevice&>(*d).live_bytes(); }

}  // namespace

TEST_CASE("each stage of the tiny Llama loads exactly its tensors onto its process's GPU, with its planned bytes",
          "[pipeline_load]") {
  const auto ckpt = accel::resolve_checkpoint(tiny_llama());
  const std::set<std::string> whole(ckpt.tensor_names.begin(), ckpt.tensor_names.end());
  for (const int stages : {2, 3}) {
    INFO(stages << " stages");
    std::set<std::string> seen;
    for (int s = 0; s < stages; ++s) {
      INFO("stage " << s);
      auto gpu = accel::host_simulated_devices({8 << 20});  // this stage's process: one GPU
      const auto plan = accel::plan_pipeline_load(ckpt, stage_options(stages, gpu, "0=4MiB,cpu=8MiB"));
      REQUIRE(plan.stages() == stages);
      const auto& st = plan.pipeline.stages[static_cast<std::size_t>(s)];
      const auto& map = plan.stage_map(s);
      auto m = accel::load_stage(ckpt, plan, s);

      // Exactly the checkpoint tensors its map covers, each where its map puts it.
      std::set<std::string> expected;
      for (const auto& n : whole)
        if (map.placement_of(n)) expected.insert(n);
      CHECK(!expected.empty());
      CHECK(names_of(m) == expected);
      for (const auto& t : m.tensors()) {
        INFO(t.name);
        CHECK(t.placement == Placement::gpu(0));
        CHECK(map.placement_of(t.name) == t.placement);
        CHECK(t.dtype == DType::BF16);
      }
      // Its resident bytes are its planned bytes (less the rotary frequencies the model computes).
      const auto& load = plan.stage_loads[static_cast<std::size_t>(s)];
      CHECK(m.report().bytes_loaded + load.computed_bytes == st.bytes);
      CHECK(m.report().per_placement.at(Placement::gpu(0)).bytes == st.gpu_bytes - load.computed_bytes);
      CHECK(live(gpu[0]) >= m.report().bytes_loaded);
      CHECK(m.report().unexpected.size() == whole.size() - expected.size());  // the other stages' tensors
      for (const auto& n : expected) CHECK(seen.insert(n).second);          // no tensor in two stages
    }
    CHECK(seen == whole);  // the stages together are the whole model
  }
}

TEST_CASE("a stage's tensors are byte-identical to the whole model's", "[pipeline_load]") {
  const auto ckpt = accel::resolve_checkpoint(tiny_llama());
  accel::AutoDispatchOptions whole_opts = stage_options(1, {}, "cpu=8MiB");
  const auto whole = accel::load_checkpoint_and_dispatch(tiny_llama(), whole_opts);
  const auto plan = accel::plan_pipeline_load(ckpt, stage_options(2, {}, "cpu=8MiB"));
  std::size_t compared = 0;
  for (int s = 0; s < 2; ++s) {
    const auto m = accel::load_stage(tiny_llama(), plan, s);
    for (const auto& t : m.tensors()) {
      INFO(t.name);
      CHECK(t.placement == Placement::cpu());
      CHECK(same_bytes(t.host, host_bytes(whole, t.name)));
      ++compared;
    }
  }
  CHECK(compared == whole.tensors().size());
}

TEST_CASE("an embedding tied to the LM head in another stage is loaded by each stage as its own copy", "[pipeline_load]") {
  accel_test::TempDir dir;
  write_tied_llama(dir.path());
  const auto ckpt = accel::resolve_checkpoint(dir.path());

  SECTION("two stages: the first holds the embedding, the last a copy under the head's name") {
    const auto plan = accel::plan_pipeline_load(ckpt, stage_options(2, {}, "cpu=1MiB"));
    REQUIRE(plan.stage_map(0).placement_of("model.embed_tokens.weight"));
    REQUIRE(plan.stage_map(1).placement_of("lm_head.weight"));
    REQUIRE(!plan.stage_map(0).placement_of("lm_head.weight"));
    CHECK(plan.stage_loads[1].tied_copies ==
          std::vector<std::pair<std::string, std::string>>{{"lm_head.weight", "model.embed_tokens.weight"}});
    CHECK(plan.stage_loads[0].tied_copies.empty());
    const auto first = accel::load_stage(ckpt, plan, 0);
    const auto last = accel::load_stage(ckpt, plan, 1);
    CHECK(first.find("lm_head.weight") == nullptr);
    CHECK(last.find("model.embed_tokens.weight") == nullptr);
    const auto& copy = last.at("lm_head.weight");
    CHECK(copy.shape == std::vector<std::int64_t>{32, 16});
    CHECK(copy.host.data() != first.at("model.embed_tokens.weight").host.data());
    CHECK(same_bytes(copy.host, host_bytes(first, "model.embed_tokens.weight")));
    // Each stage's planned bytes count its copy, and the load holds them.
    for (int s = 0; s < 2; ++s) {
      const auto& m = s == 0 ? first : last;
      CHECK(m.report().bytes_loaded + plan.stage_loads[static_cast<std::size_t>(s)].computed_bytes ==
            plan.pipeline.stages[static_cast<std::size_t>(s)].bytes);
    }
  }
  SECTION("one stage: the head is an alias of the embedding, loaded once") {
    const auto plan = accel::plan_pipeline_load(ckpt, stage_options(1, {}, "cpu=1MiB"));
    CHECK(plan.stage_loads[0].tied_copies.empty());
    const auto m = accel::load_stage(ckpt, plan, 0);
    CHECK(m.find("lm_head.weight") == &m.at("model.embed_tokens.weight"));
    CHECK(m.report().bytes_loaded + plan.stage_loads[0].computed_bytes == plan.pipeline.stages[0].bytes);
  }
}

TEST_CASE("under a job, each rank loads the stage rank % S, all computing the same plan", "[pipeline_load][state]") {
  const auto ckpt = accel::resolve_checkpoint(tiny_llama());
  const auto alone = accel::plan_pipeline_load(ckpt, stage_options(2, {}, "cpu=8MiB"));
  for (int rank = 0; rank < 4; ++rank) {  // 2 replicas x 2 stages, on the CPU
    INFO("rank " << rank);
    const accel::DistributedState state(accel::map_env(accel_test::torchrun_vars(rank, 4, 4)), accel_test::fake_gpus(0),
                                        {.cpu = true});
    const auto opts = stage_options(2, {}, "cpu=8MiB");
    const auto plan = accel::plan_pipeline_load(ckpt, state, opts);
    for (int s = 0; s < 2; ++s) CHECK(plan.stage_map(s).to_json_string() == alone.stage_map(s).to_json_string());
    const auto m = accel::load_checkpoint_and_dispatch(tiny_llama(), state, opts);
    CHECK(names_of(m) == names_of(accel::load_stage(ckpt, alone, rank % 2)));
  }
}

TEST_CASE("stage loads refuse a stage out of range, another checkpoint's plan and a job they cannot split", "[pipeline_load]") {
  const auto ckpt = accel::resolve_checkpoint(tiny_llama());
  const auto plan = accel::plan_pipeline_load(ckpt, stage_options(2, {}, "cpu=8MiB"));
  SECTION("a stage out of range") {
    REQUIRE_THROWS_AS(accel::load_stage(ckpt, plan, 2), accel::usage_error);
    REQUIRE_THROWS_WITH(accel::load_stage(ckpt, plan, -1), accel_test::contains("stage -1 of a plan with 2 stages; a stage is 0 to 1"));
  }
  SECTION("a plan made for another checkpoint") {
    accel_test::TempDir dir;
    write_tied_llama(dir.path());
    REQUIRE_THROWS_WITH(accel::load_stage(dir.path(), plan, 0),
                        accel_test::contains("the plan was made for another checkpoint (39 tensors, this one has 10; tensor 1 is "
                                             "'model.layers.0.input_layernorm.weight' there and "
                                             "'model.layers.0.self_attn.q_proj.weight' here)"));
  }
  SECTION("stages without a process or a stage to pick") {
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(tiny_llama(), stage_options(2, {}, "cpu=8MiB")),
                        accel_test::contains("AutoDispatchOptions::stages is 2: a pipeline load plans every stage"));
  }
  SECTION("a job that is not whole replicas of the stages, or without budgets") {
    const accel::DistributedState three(accel::map_env(accel_test::torchrun_vars(0, 3, 3)), accel_test::fake_gpus(0), {.cpu = true});
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(tiny_llama(), three, stage_options(2, {}, "cpu=8MiB")),
                        accel_test::contains("stages is 2 but the job has 3 processes, not a whole number of replicas"));
    auto unbudgeted = stage_options(3, {}, "cpu=8MiB");
    unbudgeted.max_memory.reset();
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(tiny_llama(), three, unbudgeted),
                        accel_test::contains("needs the budgets of a stage's process (AutoDispatchOptions::max_memory)"));
  }
  SECTION("a tied copy whose source the checkpoint lacks") {
    accel::LoadOptions o = plan.stage_options(0);
    o.tied_copies = {{"model.layers.0.mlp.up_proj.weight", "no.such.weight"}};
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(ckpt, plan.stage_map(0), o),
                        accel_test::contains("tied copy 'model.layers.0.mlp.up_proj.weight' is to be loaded from 'no.such.weight', "
                                             "which the checkpoint lacks"));
  }
}
