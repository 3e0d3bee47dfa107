// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/load/device_memory.hpp>
#include <accel/runtime/devices.hpp>

#include <cstring>
#include <vector>

#include "support/catch.hpp"

using accel::DeviceBuffer;
using accel::HostSimulatedDevice;

TEST_CASE("the host-simulated device counts live bytes and frees them when buffers go away", "[device_memory]") {
  auto dev = std::make_shared<HostSimulatedDevice>(0, 1000);
  {
    DeviceBuffer a(dev, 300), b(dev, 200);
    REQUIRE(dev->live_bytes() == 500);
    REQUIRE(dev->memory_info().free_bytes == 500);
    REQUIRE(dev->memory_info().total_bytes == 1000);
    DeviceBuffer c = std::move(a);
    REQUIRE(dev->live_bytes() == 500);
    REQUIRE(a.get() == nullptr);
  }
  REQUIRE(dev->live_bytes() == 0);
  REQUIRE(dev->peak_bytes() == 500);
  REQUIRE(dev->bad_frees() == 0);
}

TEST_CASE("running out of simulated device memory names the device and the bytes", "[device_memory]") {
  auto dev = std::make_shared<HostSimulatedDevice>(1, 1000);
  DeviceBuffer a(dev, 700);
  REQUIRE_THROWS_WITH(DeviceBuffer(dev, 400),
                      accel_test::contains("[accel.cuda] out of device memory on cuda:1 (host-simulated): requested 400 "
                                           "bytes, 300 free of 1000 capacity"));
  try {
    DeviceBuffer b(dev, 400);
  } catch (const accel::cuda_error& e) {
    REQUIRE(e.code() == accel::cuda_out_of_memory_code);
  }
  REQUIRE(dev->live_bytes() == 700);
}

TEST_CASE("simulated copies run only when their event or stream is waited on", "[device_memory]") {
  auto dev = std::make_shared<HostSimulatedDevice>(0, 1 << 20);
  DeviceBuffer d(dev, 64);
  accel::PinnedBuffer staging(dev, 64);
  accel::Stream stream(dev);
  accel::Event done(dev);
  std::memset(staging.data(), 1, 64);
  std::memset(d.get(), 0, 64);
  dev->copy_to_device_async(d.get(), staging.data(), 64, stream.get());
  done.record(stream.get());
  // Overwriting the source before waiting is a bug the simulated device makes visible.
  std::memset(staging.data(), 2, 64);
  REQUIRE(static_cast<unsigned char*>(d.get())[0] == 0);
  done.wait();
  REQUIRE(static_cast<unsigned char*>(d.get())[0] == 2);
  std::vector<unsigned char> back(64, 9);
  dev->copy_to_host_async(back.data(), d.get(), 64, stream.get());
  dev->synchronize(stream.get());
  REQUIRE(back[63] == 2);
  REQUIRE(dev->copies() == 2);
  REQUIRE(dev->live_pinned_bytes() == 64);
}

TEST_CASE("a simulated copy outside every live allocation is refused", "[device_memory]") {
  auto dev = std::make_shared<HostSimulatedDevice>(0, 1 << 20);
  DeviceBuffer d(dev, 64);
  accel::Stream stream(dev);
  std::vector<std::byte> src(128);
  REQUIRE_THROWS_WITH(dev->copy_to_device_async(d.get(), src.data(), 128, stream.get()),
                      accel_test::contains("touches memory outside any live allocation"));
}

TEST_CASE("arena_layout packs sizes at aligned offsets", "[device_memory]") {
  auto l = accel::arena_layout({10, 256, 0, 1}, 256);
  REQUIRE(l.offsets == std::vector<std::uint64_t>{0, 256, 512, 512});
  REQUIRE(l.total == 513);
  REQUIRE(accel::arena_layout({}, 256).total == 0);
}

TEST_CASE("without a usable GPU the CUDA device list is empty rather than an error", "[device_memory]") {
  // This machine class has no driver; on a GPU machine the list has one entry per device.
  auto devs = accel::cuda_device_memories();
  REQUIRE(devs.size() == static_cast<std::size_t>(accel::visible_gpu_count()));
  for (std::size_t i = 0; i < devs.size(); ++i) REQUIRE(devs[i]->index() == static_cast<int>(i));
  if (!accel::cuda_enabled) REQUIRE(devs.empty());
}
