// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// GPU tests for load_checkpoint_and_dispatch and fetch/prefetch on the real CUDA device ([.gpu]:
// run by tests/gpu/run.sh only). Correctness is asserted; throughput and overlap are printed
// (goals: load >= 0.9x of the pinned cudaMemcpy peak; prefetch hides most of the copy time).
#include <accel/load/dispatch.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "support/catch.hpp"
#include "support/safetensors_writer.hpp"

using accel::DType;
using accel_test::TensorSpec;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::byte> to_host(const accel::DeviceMemoryPtr& dev, const void* ptr, std::uint64_t n) {
  std::vector<std::byte> out(static_cast<std::size_t>(n));
  accel::Stream s(dev);
  dev->copy_to_host_async(out.data(), ptr, n, s.get());
  dev->synchronize(s.get());
  return out;
}

// `layers` layers of one F16 [rows, 4096] matrix and an F32 bias, over two shards.
std::vector<std::vector<TensorSpec>> layer_shards(int layers, std::int64_t rows) {
  std::vector<std::vector<TensorSpec>> shards(2);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    shards[static_cast<std::size_t>(l * 2 / layers)].push_back({p + "w", DType::F16, {rows, 4096}, {}});
    shards[static_cast<std::size_t>(l * 2 / layers)].push_back({p + "b", DType::F32, {rows}, {}});
  }
  return shards;
}

double pinned_peak(const accel::DeviceMemoryPtr& dev) {
  const std::uint64_t n = 256ull << 20;
  accel::PinnedBuffer src(dev, n);
  std::memset(src.data(), 1, n);
  accel::DeviceBuffer dst(dev, n);
  accel::Stream s(dev);
  dev->copy_to_device_async(dst.get(), src.data(), n, s.get());  // warm-up
  dev->synchronize(s.get());
  const auto t0 = Clock::now();
  for (int k = 0; k < 8; ++k) dev->copy_to_device_async(dst.get(), src.data(), n, s.get());
  dev->synchronize(s.get());
  return 8.0 * static_cast<double>(n) / since(t0);
}

}  // namespace

TEST_CASE("a mixed checkpoint loads onto the real GPU byte for byte, with and without conversion", "[.gpu][dispatch]") {
  auto gpus = accel::cuda_device_memories();
  REQUIRE_FALSE(gpus.empty());
  accel_test::TempDir dir;
  std::vector<std::vector<TensorSpec>> shards{
      {{"a.w", DType::F32, {1000, 333}, {}}, {"a.ids", DType::I64, {77}, {}}, {"a.s", DType::BF16, {}, {}}},
      {{"b.w", DType::F16, {4096, 1025}, {}}, {"b.e", DType::F32, {0}, {}}, {"c.w", DType::BF16, {513, 3}, {}}}};
  accel_test::write_sharded(dir.path(), shards);
  for (bool convert : {false, true}) {
    accel::LoadOptions opts;
    opts.devices = gpus;
    opts.progress = false;
    opts.staging_bytes = 1 << 20;  // several chunks per large tensor
    if (convert) opts.dtype = DType::F16;
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"a": 0, "b": 0, "c": "cpu"})"), opts);
    for (const auto& shard : shards)
      for (const auto& spec : shard) {
        INFO(spec.name << (convert ? " (to F16)" : ""));
        const auto& h = m.at(spec.name);
        auto want = accel_test::pattern_bytes(spec.name, accel_test::spec_bytes(spec));
        if (convert && accel::is_floating(spec.dtype) && spec.dtype != DType::F16) {
          std::vector<std::byte> out(want.size() / accel::element_size_bytes(spec.dtype) * 2);
          accel::convert_elements(spec.dtype, DType::F16, want.data(), out.data(), want.size() / accel::element_size_bytes(spec.dtype));
          want = out;
        }
        if (h.storage == accel::Storage::device) REQUIRE(to_host(gpus[0], h.device_ptr, h.size_bytes) == want);
        else REQUIRE(std::vector<std::byte>(h.host.begin(), h.host.end()) == want);
      }
  }
}

TEST_CASE("load to GPU throughput against the pinned cudaMemcpy peak", "[.gpu][dispatch][perf]") {
  auto gpus = accel::cuda_device_memories();
  REQUIRE_FALSE(gpus.empty());
  accel_test::TempDir dir;
  accel_test::write_sharded(dir.path(), layer_shards(32, 4096));  // 32 x 32 MiB = 1 GiB
  const double peak = pinned_peak(gpus[0]);
  accel::LoadOptions opts;
  opts.devices = gpus;
  opts.progress = false;
  opts.staging_bytes = 64ull << 20;
  opts.staging_buffers = 3;
  const auto map = accel::DeviceMap::from_json(R"({"": 0})");
  (void)accel::load_checkpoint_and_dispatch(dir.path(), map, opts);  // warm page cache and context
  double best = 0;
  std::uint64_t bytes = 0;
  for (int r = 0; r < 3; ++r) {
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), map, opts);
    bytes = m.report().bytes_copied;
    best = std::max(best, m.report().copy_rate());
  }
  std::printf("[dispatch.gpu] load to GPU 0: %.2f GiB/s (%.2f GiB, page cache hot); pinned cudaMemcpy peak %.2f GiB/s; "
              "ratio %.2f (goal >= 0.9)\n",
              best / double(1 << 30), static_cast<double>(bytes) / double(1 << 30), peak / double(1 << 30), best / peak);
  CHECK(bytes == 32ull * (4096 * 4096 * 2 + 4096 * 4));
}

TEST_CASE("prefetch overlaps the next block's copy with the current block's compute", "[.gpu][dispatch][fetch]") {
  auto gpus = accel::cuda_device_memories();
  REQUIRE_FALSE(gpus.empty());
  auto dev = gpus[0];
  accel_test::TempDir dir;
  const int layers = 8;
  const auto shards = layer_shards(layers, 8192);  // 64 MiB per layer
  accel_test::write_sharded(dir.path(), shards);
  accel::LoadOptions opts;
  opts.devices = gpus;
  opts.progress = false;
  opts.cpu_memory = accel::CpuMemory::pinned;
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"model": "cpu", "": 0})"), opts);
  REQUIRE(m.execution_device() == 0);
  accel::Stream compute(dev);
  auto stream = static_cast<cudaStream_t>(compute.get());
  accel::DeviceBuffer scratch(dev, 2ull << 30);
  auto fake_compute = [&](int reps) {
    for (int k = 0; k < reps; ++k) REQUIRE(cudaMemsetAsync(scratch.get(), k & 0xff, scratch.size(), stream) == cudaSuccess);
  };
  // correctness of what fetch delivers
  for (int l = 0; l < layers; ++l) {
    auto f = m.fetch("model.layers." + std::to_string(l), compute.get());
    dev->synchronize(compute.get());
    const auto* w = f.find("model.layers." + std::to_string(l) + ".w");
    REQUIRE(w != nullptr);
    REQUIRE(to_host(dev, w->data, w->handle->size_bytes) == accel_test::pattern_bytes(w->handle->name, w->handle->size_bytes));
  }
  // calibrate: compute reps so that compute ~ copy per layer
  auto t0 = Clock::now();
  fake_compute(4);
  dev->synchronize(compute.get());
  const double per_rep = since(t0) / 4;
  t0 = Clock::now();
  for (int l = 0; l < layers; ++l) (void)m.fetch("model.layers." + std::to_string(l), nullptr);
  const double copy_per_layer = since(t0) / layers;
  const int reps = std::max(1, static_cast<int>(copy_per_layer / per_rep + 0.5));
  auto run = [&](bool prefetch) {
    const auto start = Clock::now();
    for (int l = 0; l < layers; ++l) {
      auto f = m.fetch("model.layers." + std::to_string(l), compute.get());
      if (prefetch && l + 1 < layers) m.prefetch("model.layers." + std::to_string(l + 1));
      fake_compute(reps);
      if (!prefetch) dev->synchronize(compute.get());  // serial: copy, then compute, then the next copy
    }
    dev->synchronize(compute.get());
    return since(start);
  };
  (void)run(true);
  const double serial = run(false), overlapped = run(true);
  const double compute_only = per_rep * reps * layers, copy_only = copy_per_layer * layers;
  std::printf("[dispatch.gpu] fetch of %d x 64 MiB pinned blocks: copy %.1f ms, compute %.1f ms; serial %.1f ms, "
              "with prefetch %.1f ms; hidden %.0f%% of the shorter phase\n",
              layers, copy_only * 1e3, compute_only * 1e3, serial * 1e3, overlapped * 1e3,
              100.0 * (serial - overlapped) / std::min(copy_only, compute_only));
}
