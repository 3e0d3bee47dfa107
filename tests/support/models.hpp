// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file models.hpp
/// @brief Small model trees shared by the module-tree and planner tests.
#pragma once

#include <accel/model/module_tree.hpp>

namespace accel_test {

/// @brief accelerate's ModelForTest: Linear(3,4), BatchNorm1d(4), Linear(4,5), float32.
inline accel::ModuleTree model_for_test() {
  using accel::DType;
  accel::ModuleTree t;
  t.add_parameter("linear1.weight", DType::F32, {4, 3});
  t.add_parameter("linear1.bias", DType::F32, {4});
  t.add_parameter("batchnorm.weight", DType::F32, {4});
  t.add_parameter("batchnorm.bias", DType::F32, {4});
  t.add_buffer("batchnorm.running_mean", DType::F32, {4});
  t.add_buffer("batchnorm.running_var", DType::F32, {4});
  t.add_buffer("batchnorm.num_batches_tracked", DType::I64, {});
  t.add_parameter("linear2.weight", DType::F32, {5, 4});
  t.add_parameter("linear2.bias", DType::F32, {5});
  return t;
}

}  // namespace accel_test
