// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for the model skeleton JSON: any text either builds a ModuleTree that writes
// back to a skeleton reading as the same tree (the same modules, and tensors of the same names,
// shapes and dtypes: the writer lists parameters before buffers, so an alias registered after the
// buffers may come back in another position), or throws accel::config_error; nothing else.
#include <accel/model/skeleton.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto tree = accel::skeleton_from_json(text, "fuzz");
    const auto again = accel::skeleton_from_json(accel::to_skeleton_json(tree), "round trip");
    accel_fuzz::check(again.modules().size() == tree.modules().size());
    accel_fuzz::check(again.tensors().size() == tree.tensors().size());
    std::map<std::string, const accel::Tensor*> by_name;
    for (const auto& t : again.tensors()) by_name.emplace(t.name, &t);
    for (const auto& t : tree.tensors()) {
      const auto it = by_name.find(t.name);
      accel_fuzz::check(it != by_name.end() && it->second->shape == t.shape && it->second->dtype == t.dtype);
    }
  } catch (const accel::config_error&) {
  }
  return 0;
}
