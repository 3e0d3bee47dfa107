// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Tests for devices.hpp: Device printing and CUDA_VISIBLE_DEVICES parsing.
#include <accel/runtime/devices.hpp>

#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using accel::parse_visible_devices;
using Ids = std::vector<std::string>;

TEST_CASE("a device prints as cuda:N or cpu", "[devices]") {
  CHECK(accel::Device::cuda(1).to_string() == "cuda:1");
  CHECK(accel::Device::cpu().to_string() == "cpu");
  CHECK(accel::Device::cuda(0) != accel::Device::cuda(1));
  CHECK(accel::Device().is_cpu());
}

TEST_CASE("an unset CUDA_VISIBLE_DEVICES shows every GPU and maps logical to physical 1:1", "[devices]") {
  const auto v = parse_visible_devices(std::nullopt);
  CHECK_FALSE(v.set);
  CHECK(v.diagnostics.empty());
  CHECK(v.physical(3) == "3");
}

TEST_CASE("indices are kept in their order and name the physical GPUs", "[devices]") {
  const auto v = parse_visible_devices("2,5");
  CHECK(v.ids == Ids{"2", "5"});
  CHECK(v.physical(0) == "2");
  CHECK(v.physical(1) == "5");
  CHECK(v.diagnostics.empty());
}

TEST_CASE("the empty string means no GPU, with a diagnostic", "[devices]") {
  const auto v = parse_visible_devices("");
  CHECK(v.set);
  CHECK(v.ids.empty());
  REQUIRE(v.diagnostics.size() == 1);
  CHECK_THAT(v.diagnostics[0], accel_test::contains("empty string: no GPU is visible"));
}

TEST_CASE("an invalid entry truncates the list, as the driver does", "[devices]") {
  SECTION("a negative entry") {
    const auto v = parse_visible_devices("0,2,-1,1");
    CHECK(v.ids == Ids{"0", "2"});
    CHECK(v.truncated);
    CHECK_THAT(v.diagnostics.at(0), accel_test::contains("'-1' is negative"));
  }
  SECTION("a word") {
    const auto v = parse_visible_devices("1,gpu3,2");
    CHECK(v.ids == Ids{"1"});
    CHECK_THAT(v.diagnostics.at(0), accel_test::contains("'gpu3' is not a GPU index"));
  }
  SECTION("a trailing comma leaves an empty entry") {
    const auto v = parse_visible_devices("0,1,");
    CHECK(v.ids == Ids{"0", "1"});
    CHECK(v.truncated);
  }
}

TEST_CASE("digits followed by other characters are read up to the first non-digit", "[devices]") {
  const auto v = parse_visible_devices("1gpu2,3");
  CHECK(v.ids == Ids{"1", "3"});
  CHECK_THAT(v.diagnostics.at(0), accel_test::contains("read as '1'"));
}

TEST_CASE("a duplicated GPU exposes no GPU at all", "[devices]") {
  const auto v = parse_visible_devices("1,0,1");
  CHECK(v.duplicated);
  CHECK(v.ids.empty());
  CHECK_THAT(v.diagnostics.at(0), accel_test::contains("'1' is listed twice"));
  SECTION("leading zeros name the same GPU") { CHECK(parse_visible_devices("5,05").duplicated); }
}

TEST_CASE("whitespace around entries is accepted and reported", "[devices]") {
  const auto v = parse_visible_devices(" 3, 4");
  CHECK(v.ids == Ids{"3", "4"});
  CHECK(v.diagnostics.size() == 2);
  CHECK_THAT(v.diagnostics[0], accel_test::contains("whitespace"));
  CHECK(parse_visible_devices("   ").ids.empty());
}

TEST_CASE("GPU and MIG UUIDs are kept as identifiers", "[devices]") {
  const auto v = parse_visible_devices("GPU-8932f937,MIG-aa11bb22");
  CHECK(v.uses_uuids);
  CHECK(v.ids == Ids{"GPU-8932f937", "MIG-aa11bb22"});
  CHECK(v.physical(1) == "MIG-aa11bb22");
  SECTION("an index inside a UUID list ends the list") {
    const auto w = parse_visible_devices("GPU-8932f937,2,GPU-11");
    CHECK(w.ids == Ids{"GPU-8932f937"});
    CHECK(w.truncated);
  }
}

TEST_CASE("the default device query reports zero GPUs without a driver instead of failing", "[devices]") {
  // The build machines have no driver: a CUDA build must say why, a CPU build that CUDA is off.
  const auto list = accel::default_device_query().list(true);
  if (list.gpus.empty()) {
    CHECK_FALSE(list.status.empty());
    CHECK(accel::visible_gpu_count() == 0);
  } else {
    CHECK(list.gpus[0].total_memory > 0);
  }
}

TEST_CASE("fake device queries report what tests ask for", "[devices]") {
  auto log = std::make_shared<accel_test::FakeDeviceLog>();
  const auto q = accel_test::fake_gpus(2, accel_test::operator""_GiB(40), log);
  const auto list = q.list(false);
  REQUIRE(list.gpus.size() == 2);
  CHECK(list.gpus[1].total_memory == (40ull << 30));
  CHECK(accel_test::no_driver().list(false).status == "insufficient driver");
}
