// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// What `accel plan`, `accel estimate-memory` and `accel load` know about the model from their
// arguments: the tree (checkpoint headers + config.json + the architecture catalog, or a skeleton),
// the no-split blocks, and the dtype each tensor is loaded in. One copy, so a map planned by
// `accel plan` and the load `accel load` carries out are decided from the same knowledge.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <accel/model/checkpoint_tree.hpp>
#include <accel/model/dtype.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/model/skeleton.hpp>
#include <accel/runtime/env.hpp>
#include <accel/runtime/text.hpp>

#include "args.hpp"

namespace accel_cli {

struct LoadedModel {
  accel::ModuleTree tree;
  std::string label;
  std::optional<accel::CheckpointModel> checkpoint{};  // for --checkpoint: config, catalog entry (tree moved out)
};

// The dtype argument: nullopt = not given; "auto" = auto.
inline std::optional<accel::DType> explicit_dtype(const ParsedArgs& a) {
  auto d = a.value("dtype");
  if (!d || *d == "auto") return std::nullopt;
  return accel::dtype_from_string(*d);
}

// The model of an already resolved checkpoint, with `--config FILE` when given. `load_dtype`: the
// dtype the model is loaded in, when given (buffers created in the model's dtype follow it).
inline LoadedModel model_of_checkpoint(const accel::Checkpoint& checkpoint, std::string label, const ParsedArgs& a,
                                       std::optional<accel::DType> load_dtype) {
  accel::CheckpointTreeOptions topts;
  if (auto c = a.value("config")) topts.config_file = *c;
  topts.use_catalog = !a.has("no-catalog");
  if (auto c = a.value("catalog")) topts.catalog_file = *c;
  else if (auto env = accel::process_env()("ACCEL_CATALOG"); env && !env->empty()) topts.catalog_file = *env;
  topts.load_dtype = load_dtype;
  auto m = accel::model_from_checkpoint(checkpoint, topts);
  LoadedModel out{std::move(m.tree), std::move(label), std::nullopt};
  out.checkpoint = std::move(m);
  return out;
}

inline LoadedModel load_model(const ParsedArgs& a, const char* command, std::optional<accel::DType> load_dtype = {}) {
  const bool ck = a.has("checkpoint"), sk = a.has("skeleton");
  if (ck == sk)
    throw accel::usage_error(std::string(command) + ": give exactly one of --checkpoint PATH or --skeleton FILE");
  if (ck) return model_of_checkpoint(accel::resolve_checkpoint(*a.value("checkpoint")), *a.value("checkpoint"), a, load_dtype);
  if (a.has("config")) throw accel::usage_error(std::string(command) + ": --config goes with --checkpoint");
  return {accel::read_skeleton(*a.value("skeleton")), *a.value("skeleton"), std::nullopt};
}

// The no-split blocks: given classes/names/globs (each must match), 'none', or the catalog's
// classes (`catalog_blocks`), else numbered children. Returns (specs, automatic, description).
struct BlockChoice {
  std::vector<std::string> specs;
  bool automatic = true;
  std::string note;
};
inline BlockChoice choose_blocks(const ParsedArgs& a, const LoadedModel& model, bool catalog_blocks, const char* command) {
  BlockChoice b{a.values("no-split"), true, {}};
  const auto* arch = model.checkpoint ? model.checkpoint->architecture : nullptr;
  if (std::find(b.specs.begin(), b.specs.end(), "none") != b.specs.end()) {
    if (b.specs.size() > 1)
      throw accel::usage_error(std::string(command) + ": --no-split none cannot be combined with other --no-split values");
    b = {{}, false, "none (--no-split none)"};
  } else if (!b.specs.empty()) {
    accel::check_no_split_specs(model.tree, b.specs);
    b.automatic = false;
    b.note = accel::text::join(b.specs) + " (--no-split)";
  } else if (arch && catalog_blocks) {
    b = {model.checkpoint->no_split_classes(), false, {}};
    b.note = (b.specs.empty() ? std::string("none") : accel::text::join(b.specs)) + " (catalog)";
  } else {
    b.note = "numbered children (automatic: architecture unknown)";
  }
  return b;
}

// The inputs of tensor_load_dtype, decided once for planning (sizes) and loading (conversion):
// the target dtype for floating tensors and the keep-in-fp32 patterns.
struct DTypeChoice {
  std::optional<accel::DType> dtype;      // unset: every tensor as stored
  std::vector<std::string> keep_in_fp32;  // --keep-in-fp32, then the catalog's for that dtype
  std::string note;                       // for the reports: "bfloat16 (auto: config.json)"
};

// --dtype given; `auto` (the default with a config.json, as from_pretrained) = the config's
// dtype, else the checkpoint's first floating dtype; without either, tensors keep their own.
// The catalog's keep-in-fp32 modules for that dtype join the --keep-in-fp32 patterns.
inline DTypeChoice choose_dtype(const ParsedArgs& a, const LoadedModel& model) {
  DTypeChoice c{explicit_dtype(a), a.values("keep-in-fp32"), {}};
  const auto& ck = model.checkpoint;
  const bool automatic = a.value("dtype") == "auto" || (!a.has("dtype") && ck && ck->config);
  if (automatic && ck) c.dtype = ck->auto_dtype;
  if (ck)
    for (auto& k : ck->keep_in_fp32(c.dtype)) c.keep_in_fp32.push_back(std::move(k));
  c.note = c.dtype ? std::string(accel::torch_name(*c.dtype)) : std::string("as stored");
  if (automatic && ck && c.dtype)
    c.note += ck->config && ck->config->dtype ? " (auto: config.json)" : " (auto: the checkpoint's first floating dtype)";
  return c;
}

}  // namespace accel_cli
