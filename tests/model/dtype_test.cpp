// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/model/dtype.hpp>

#include "support/catch.hpp"

using accel::DType;

TEST_CASE("dtype names round-trip through torch and safetensors spellings", "[dtype]") {
  for (const auto& row : accel::detail::dtype_table) {
    CHECK(accel::dtype_from_string(row.safetensors) == row.dtype);
    CHECK(accel::dtype_from_string(row.torch) == row.dtype);
    CHECK(accel::dtype_from_string("torch." + std::string(row.torch)) == row.dtype);
    CHECK(accel::safetensors_name(row.dtype) == row.safetensors);
    CHECK(accel::torch_name(row.dtype) == row.torch);
  }
  CHECK(accel::dtype_from_string("half") == DType::F16);
  CHECK(accel::dtype_from_string("Float16") == DType::F16);
  CHECK(accel::dtype_from_string("float8_e4m3fn") == DType::F8_E4M3);
  CHECK(accel::numpy_name(DType::BF16) == "bfloat16");
}

TEST_CASE("an unknown dtype name is a usage error listing the accepted names", "[dtype]") {
  REQUIRE_THROWS_AS(accel::dtype_from_string("float17"), accel::usage_error);
  REQUIRE_THROWS_WITH(accel::dtype_from_string("float17"), accel_test::contains("unknown dtype 'float17'"));
  REQUIRE_THROWS_WITH(accel::dtype_from_string("f16"), accel_test::contains("bfloat16/BF16"));
}

TEST_CASE("element sizes follow the safetensors bit sizes with bool as one byte", "[dtype]") {
  CHECK(accel::element_size_bytes(DType::BOOL) == 1);
  CHECK(accel::element_size_bytes(DType::BF16) == 2);
  CHECK(accel::element_size_bytes(DType::F8_E5M2) == 1);
  CHECK(accel::element_size_bytes(DType::I64) == 8);
  CHECK(accel::element_size_bytes(DType::C64) == 8);
  REQUIRE_THROWS_WITH(accel::element_size_bytes(DType::F4), accel_test::contains("4 bits per element"));
  CHECK(accel::tensor_bytes(DType::F4, 6) == std::optional<std::uint64_t>(3));
  CHECK_FALSE(accel::tensor_bytes(DType::F4, 3).has_value());
  CHECK_FALSE(accel::tensor_bytes(DType::F64, UINT64_MAX / 4).has_value());
}

TEST_CASE("floating and integral classification matches torch", "[dtype]") {
  CHECK(accel::is_floating(DType::BF16));
  CHECK(accel::is_floating(DType::F8_E8M0));
  CHECK_FALSE(accel::is_floating(DType::I32));
  CHECK_FALSE(accel::is_floating(DType::C64));
  CHECK(accel::is_integral(DType::BOOL));
  CHECK(accel::is_integral(DType::U64));
  CHECK_FALSE(accel::is_integral(DType::C64));
}

TEST_CASE("keep-in-fp32 patterns match as transformers matches them: anywhere, * any run, . any character", "[dtype][load_dtype]") {
  CHECK(accel::keep_in_fp32_matches("wo", "decoder.block.0.layer.2.DenseReluDense.wo.weight"));
  CHECK(accel::keep_in_fp32_matches("lm_head", "lm_head.weight"));
  CHECK(accel::keep_in_fp32_matches("gate.weight", "model.layers.3.mlp.gate.weight"));
  CHECK(accel::keep_in_fp32_matches("layers.*.norm", "model.layers.12.post_norm.weight"));
  CHECK(accel::keep_in_fp32_matches("a.c", "xabcx"));  // '.' is any character, as in a regex
  CHECK(accel::keep_in_fp32_matches("", "anything"));
  CHECK_FALSE(accel::keep_in_fp32_matches("wo", "w.o"));
  CHECK_FALSE(accel::keep_in_fp32_matches("layers.*.norm", "model.layers.12.mlp"));
  CHECK_FALSE(accel::keep_in_fp32_matches("lm_head.weight", "lm_head"));
}

TEST_CASE("the load dtype: target up or down for floating tensors, float32 for kept ones, others unchanged", "[dtype][load_dtype]") {
  const std::vector<std::string> keep{"wo"};
  const accel::LoadDTypeRule to32{DType::F32, {}}, to16{DType::F16, keep}, none{};
  // The defect: a float32 target on a bfloat16 tensor was counted as min(target, stored) = 2 bytes.
  CHECK(accel::tensor_load_dtype(DType::BF16, "x.weight", to32) == DType::F32);
  CHECK(accel::tensor_load_dtype(DType::F32, "x.weight", to16) == DType::F16);
  CHECK(accel::tensor_load_dtype(DType::F32, "ff.wo.weight", to16) == DType::F32);
  CHECK(accel::tensor_load_dtype(DType::BF16, "ff.wo.weight", to16) == DType::F32);
  CHECK(accel::tensor_load_dtype(DType::BF16, "x.weight", none) == DType::BF16);
  CHECK(accel::tensor_load_dtype(DType::F8_E4M3, "x.weight", to16) == DType::F16);
  for (DType d : {DType::I64, DType::I32, DType::U8, DType::BOOL, DType::C64})
    CHECK(accel::tensor_load_dtype(d, "wo.position_ids", to16) == d);
}
