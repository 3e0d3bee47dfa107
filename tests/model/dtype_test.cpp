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
