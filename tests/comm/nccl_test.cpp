// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The NCCL backend's parts that run without a GPU: padding layout, and clear refusals when NCCL is
// not compiled in or no GPU is visible. Real NCCL runs are in tests/gpu/nccl_test.cpp.
#include <accel/comm/nccl.hpp>

#include <cstdint>
#include <vector>

#include "support/catch.hpp"

TEST_CASE("nccl: variable payloads are padded to the largest, rounded up to 16 bytes", "[nccl]") {
  const std::vector<std::uint64_t> sizes = {3, 100, 0};
  const auto l = accel::detail::padded_layout(sizes);
  REQUIRE(l.chunk == 112);
  REQUIRE(l.total == 336);
  const std::vector<std::uint64_t> none = {0, 0};
  REQUIRE(accel::detail::padded_layout(none).chunk == 0);
  const std::vector<std::uint64_t> exact = {32};
  REQUIRE(accel::detail::padded_layout(exact).chunk == 32);
}

TEST_CASE("nccl: without NCCL or without a GPU the communicator refuses with how to fix it", "[nccl]") {
  if (!accel::nccl_enabled) {
    REQUIRE_THROWS_AS(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)), accel::unavailable_error);
    REQUIRE_THROWS_WITH(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)),
                        accel_test::contains("NCCL is not compiled in; build with -DACCEL_WITH_NCCL=ON"));
    return;
  }
  // This machine has the toolkit but no driver: zero devices.
  int count = 0;
#if ACCEL_HAS_CUDA()
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0, (void)cudaGetLastError();
#endif
  if (count > 0) return;  // a GPU machine: covered by tests/gpu/nccl_test.cpp
  REQUIRE_THROWS_AS(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)), accel::unavailable_error);
  REQUIRE_THROWS_WITH(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)),
                      accel_test::contains("NCCL needs a CUDA device but none is visible to this process; use the CPU backend"));
}
