// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// load_checkpoint_and_dispatch and DispatchedModel against host-simulated GPUs (capacity-limited,
// copies deferred until synchronised), CPU memory and disk.
#include <accel/load/dispatch.hpp>

#include <chrono>
#include <cstring>
#include <thread>

#include "support/catch.hpp"
#include "support/safetensors_writer.hpp"

namespace fs = std::filesystem;
using accel::DType;
using accel::Placement;
using accel::Storage;
using accel_test::TensorSpec;

namespace {

// A small model over three shards: mixed dtypes, odd sizes, a scalar and an empty tensor.
std::vector<std::vector<TensorSpec>> model_shards() {
  return {
      {{"model.embed.weight", DType::BF16, {37, 11}, {}}, {"model.layers.0.w", DType::F32, {13, 7}, {}},
       {"model.layers.0.b", DType::F16, {13}, {}}, {"model.layers.0.ids", DType::I64, {5}, {}}},
      {{"model.layers.1.w", DType::F32, {301}, {}}, {"model.layers.1.mask", DType::BOOL, {9}, {}},
       {"model.layers.1.scale", DType::F32, {}, {}}, {"model.layers.2.w", DType::BF16, {17, 3}, {}},
       {"model.layers.2.q", DType::U8, {33}, {}}},
      {{"model.layers.3.w", DType::F16, {129}, {}}, {"model.layers.3.empty", DType::F32, {0, 4}, {}},
       {"model.norm.weight", DType::F32, {11}, {}}, {"lm_head.bias", DType::F32, {37}, {}}},
  };
}

accel::DeviceMap model_map() {
  return accel::DeviceMap::from_json(R"({"model.embed": 0, "model.layers.0": 0, "model.layers.1": 1,
    "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": 1, "lm_head": "cpu"})");
}

std::vector<std::byte> stored_bytes(const TensorSpec& t) { return accel_test::pattern_bytes(t.name, accel_test::spec_bytes(t)); }

std::vector<std::byte> device_bytes(void* ptr, std::uint64_t n, const accel::DeviceMemoryPtr& dev) {
  std::vector<std::byte> out(static_cast<std::size_t>(n));
  accel::Stream s(dev);
  dev->copy_to_host_async(out.data(), ptr, n, s.get());
  dev->synchronize(s.get());
  return out;
}

std::vector<std::byte> read_back(const accel::TensorHandle& h, const std::vector<accel::DeviceMemoryPtr>& devices) {
  if (h.storage != Storage::device) return {h.host.begin(), h.host.end()};
  if (h.size_bytes == 0) return {};
  return device_bytes(h.device_ptr, h.size_bytes, devices.at(static_cast<std::size_t>(h.placement.index)));
}

std::vector<std::byte> converted(const TensorSpec& t, DType to) {
  auto raw = stored_bytes(t);
  if (t.dtype == to || !accel::is_floating(t.dtype)) return raw;
  std::uint64_t n = 1;
  for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
  std::vector<std::byte> out(static_cast<std::size_t>(n * accel::element_size_bytes(to)));
  accel::convert_elements(t.dtype, to, raw.data(), out.data(), n);
  return out;
}

auto sim(std::uint64_t cap0, std::uint64_t cap1) { return accel::host_simulated_devices({cap0, cap1}); }

accel::HostSimulatedDevice& fake(const accel::DeviceMemoryPtr& d) { return static_cast<accel::HostSimulatedDevice&>(*d); }

accel::LoadOptions small_staging(std::vector<accel::DeviceMemoryPtr> devices) {
  accel::LoadOptions o;
  o.devices = std::move(devices);
  o.staging_bytes = 96;  // tiny: forces chunking, coalesced runs and buffer reuse on every path
  o.progress = false;
  return o;
}

}  // namespace

TEST_CASE("a sharded mixed-dtype checkpoint lands byte for byte on two fake GPUs, CPU and disk", "[dispatch]") {
  accel_test::TempDir dir;
  const auto shards = model_shards();
  accel_test::write_sharded(dir.path(), shards);
  auto devices = sim(1 << 20, 1 << 20);
  auto model = accel::load_checkpoint_and_dispatch(dir.path(), model_map(), small_staging(devices));
  std::size_t count = 0;
  for (const auto& shard : shards)
    for (const auto& spec : shard) {
      INFO(spec.name);
      const auto& h = model.at(spec.name);
      REQUIRE(h.dtype == spec.dtype);
      REQUIRE(h.shape == spec.shape);
      REQUIRE(read_back(h, devices) == stored_bytes(spec));
      ++count;
    }
  REQUIRE(model.tensors().size() == count);
  REQUIRE(model.at("model.layers.0.w").storage == Storage::device);
  REQUIRE(model.at("model.layers.0.w").placement == Placement::gpu(0));
  REQUIRE(model.at("model.layers.1.w").placement == Placement::gpu(1));
  REQUIRE(model.at("model.layers.2.w").storage == Storage::host_pageable);
  REQUIRE(model.at("model.layers.3.w").storage == Storage::mmap_view);  // disk + no conversion: a view, no copy
  const auto& r = model.report();
  REQUIRE(r.per_placement.at(Placement::gpu(0)).tensors == 4);
  REQUIRE(r.per_placement.at(Placement::gpu(1)).bytes == 301 * 4 + 9 + 4 + 11 * 4);
  REQUIRE(r.per_placement.at(Placement::disk()).tensors == 2);
  REQUIRE(r.unexpected.empty());
  REQUIRE(r.missing.empty());
  REQUIRE(r.bytes_copied == r.bytes_loaded - 129 * 2);  // everything but the disk view was read
  REQUIRE(model.execution_device() == 0);
  REQUIRE(fake(devices[0]).bad_frees() == 0);
}

TEST_CASE("a target dtype converts floating tensors on every path and never touches integers", "[dispatch]") {
  accel_test::TempDir dir, offload;
  const auto shards = model_shards();
  accel_test::write_sharded(dir.path(), shards);
  auto devices = sim(1 << 20, 1 << 20);
  auto opts = small_staging(devices);
  opts.dtype = DType::F16;
  opts.keep_in_fp32 = {"model.layers.1"};
  opts.offload_folder = offload.path();
  auto model = accel::load_checkpoint_and_dispatch(dir / "model.safetensors.index.json", model_map(), opts);
  for (const auto& shard : shards)
    for (const auto& spec : shard) {
      INFO(spec.name);
      const auto& h = model.at(spec.name);
      const bool keep = spec.name.starts_with("model.layers.1.");
      const DType want = !accel::is_floating(spec.dtype) ? spec.dtype : keep ? DType::F32 : DType::F16;
      REQUIRE(h.dtype == want);
      REQUIRE(read_back(h, devices) == converted(spec, want));
    }
  REQUIRE(model.at("model.layers.3.w").storage == Storage::mmap_view);      // already F16: still a view
  REQUIRE(model.at("model.layers.3.empty").storage == Storage::offload_file);  // F32 -> F16 on disk
  REQUIRE(fs::exists(offload / "model.layers.3.empty.dat"));
  REQUIRE(model.report().offload_written == 1);
  REQUIRE(accel::read_offload_index(offload.path()).at("model.layers.3.empty").dtype == DType::F16);
}

TEST_CASE("converted values are the correctly rounded ones, across staging-chunk boundaries", "[dispatch]") {
  accel_test::TempDir dir;
  std::vector<float> values(1001);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = (static_cast<float>(i) - 500.0f) * 0.37f + 1e-3f;
  values[7] = 65520.0f;   // rounds to +Inf in F16
  values[8] = -1e-8f;     // rounds to -0 in F16
  values[9] = std::numeric_limits<float>::quiet_NaN();
  TensorSpec spec{"w", DType::F32, {1001}, {}};
  spec.data.resize(values.size() * 4);
  std::memcpy(spec.data.data(), values.data(), spec.data.size());
  accel_test::write_safetensors(dir / "model.safetensors", {spec});
  auto devices = sim(1 << 20, 1 << 20);
  for (DType to : {DType::F16, DType::BF16}) {
    for (const char* where : {R"({"": 0})", R"({"": "cpu"})"}) {
      auto opts = small_staging(devices);
      opts.dtype = to;
      auto model = accel::load_checkpoint_and_dispatch(dir / "model.safetensors", accel::DeviceMap::from_json(where), opts);
      const auto bytes = read_back(model.at("w"), devices);
      REQUIRE(bytes.size() == values.size() * 2);
      for (std::size_t i = 0; i < values.size(); ++i) {
        std::uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        const float back = to == DType::F16 ? accel::half_to_float(b) : accel::bf16_to_float(b);
        if (i == 9) {
          REQUIRE(std::isnan(back));
          continue;
        }
        // correctly rounded: no representable value lies strictly closer
        const double err = std::fabs(static_cast<double>(back) - values[i]);
        if (std::isinf(back)) REQUIRE(i == 7);
        else REQUIRE(err <= std::fabs(static_cast<double>(values[i])) * (to == DType::F16 ? 0x1p-11 : 0x1p-8) + 0x1p-25);
      }
      std::uint16_t neg_zero;
      std::memcpy(&neg_zero, bytes.data() + 16, 2);
      if (to == DType::F16) REQUIRE(neg_zero == 0x8000);
    }
  }
}

TEST_CASE("the offload folder is reused when still valid and rewritten when the checkpoint changed", "[dispatch][offload]") {
  accel_test::TempDir dir, offload;
  std::vector<TensorSpec> specs{{"a.w", DType::F32, {64}, {}}, {"b.w", DType::BF16, {40}, {}}};
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  const auto map = accel::DeviceMap::from_json(R"({"a": "disk", "b": "disk"})");
  accel::LoadOptions opts;
  opts.devices = std::vector<accel::DeviceMemoryPtr>{};
  opts.dtype = DType::F16;
  opts.offload_folder = offload.path();
  opts.progress = false;
  {
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), map, opts);
    REQUIRE(m.report().offload_written == 2);
    REQUIRE(read_back(m.at("a.w"), {}) == converted(specs[0], DType::F16));
  }
  {
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), map, opts);
    REQUIRE(m.report().offload_written == 0);
    REQUIRE(m.report().offload_reused == 2);
    REQUIRE(read_back(m.at("b.w"), {}) == converted(specs[1], DType::F16));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  specs[0].data = std::vector<std::byte>(256, std::byte{0x3c});  // same shape, new content
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), map, opts);
  REQUIRE(m.report().offload_written == 2);  // fingerprint changed: never trust a stale folder
  auto expect = specs[0];
  REQUIRE(read_back(m.at("a.w"), {}) == [&] {
    std::vector<std::byte> out(128);
    accel::convert_elements(DType::F32, DType::F16, expect.data.data(), out.data(), 64);
    return out;
  }());
}

TEST_CASE("disk tensors that change dtype without an offload folder are refused before loading", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{"a.w", DType::F32, {4}, {}}});
  accel::LoadOptions opts;
  opts.dtype = DType::F16;
  opts.devices = std::vector<accel::DeviceMemoryPtr>{};
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"": "disk"})"), opts),
                      accel_test::contains("tensor 'a.w' is placed on disk and converted from F32 to F16, which needs an "
                                           "offload folder"));
}

TEST_CASE("tied aliases resolve to their source and count as present", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{"model.embed.weight", DType::F16, {8, 4}, {}}});
  auto devices = sim(1 << 20, 1 << 20);
  auto opts = small_staging(devices);
  opts.expected_tensors = {"model.embed.weight", "lm_head.weight"};
  opts.tied = {{"lm_head.weight", "model.embed.weight"}};
  opts.strict = true;
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"model": 0, "lm_head": 0})"), opts);
  REQUIRE(m.find("lm_head.weight") == m.find("model.embed.weight"));
  REQUIRE(m.find("lm_head.weight")->device_ptr != nullptr);
  REQUIRE(m.report().missing.empty());
}

TEST_CASE("missing and unexpected tensors are reported, and strict mode refuses them by name", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors",
                                {{"model.a", DType::F32, {2}, {}}, {"model.b", DType::F32, {2}, {}}, {"extra.c", DType::F32, {2}, {}}});
  auto devices = sim(1 << 20, 1 << 20);
  auto opts = small_staging(devices);
  opts.expected_tensors = {"model.a", "model.b", "model.norm"};
  const auto map = accel::DeviceMap::from_json(R"({"model": 0, "unused.key": 1})");
  {
    auto m = accel::load_checkpoint_and_dispatch(dir.path(), map, opts);
    REQUIRE(m.report().missing == std::vector<std::string>{"model.norm"});
    REQUIRE(m.report().unexpected == std::vector<std::string>{"extra.c"});
    REQUIRE(m.report().unused_keys == std::vector<std::string>{"unused.key"});
    REQUIRE(m.find("extra.c") == nullptr);
    REQUIRE_THROWS_WITH(m.at("extra.c"), accel_test::contains("no tensor 'extra.c' was loaded"));
    REQUIRE(fake(devices[0]).live_bytes() > 0);
  }
  REQUIRE(fake(devices[0]).live_bytes() == 0);  // the model frees its arenas
  opts.strict = true;
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), map, opts),
                      accel_test::contains("strict loading failed: 1 missing tensor(s) ('model.norm') and 1 unexpected "
                                           "tensor(s) ('extra.c')"));
}

TEST_CASE("running out of GPU memory mid-load names the device and frees everything allocated", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_sharded(dir.path(), model_shards());
  auto devices = sim(1 << 20, 1000);  // layers.1 needs 1204 bytes (+ norm) on GPU 1
  auto opts = small_staging(devices);
  opts.cpu_memory = accel::CpuMemory::pinned;  // so CPU arenas are counted by the fake too
  try {
    (void)accel::load_checkpoint_and_dispatch(dir.path(), model_map(), opts);
    FAIL("expected an out-of-memory error");
  } catch (const accel::cuda_error& e) {
    REQUIRE(e.code() == accel::cuda_out_of_memory_code);
    REQUIRE_THAT(e.what(), accel_test::contains("out of device memory on cuda:1 (host-simulated): requested 1540 bytes, "
                                                "1000 free of 1000 capacity"));
  }
  for (const auto& d : devices) {
    REQUIRE(fake(d).live_bytes() == 0);
    REQUIRE(fake(d).live_pinned_bytes() == 0);
    REQUIRE(fake(d).bad_frees() == 0);
  }
  REQUIRE(fake(devices[0]).allocations() > 0);  // GPU 0's arenas were made, then freed
}

TEST_CASE("a device map naming an absent GPU is refused before any allocation", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{"a.w", DType::F32, {4}, {}}});
  auto devices = sim(1 << 20, 1 << 20);
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"a": 2})"), small_staging(devices)),
                      accel_test::contains("the device map places 'a' on GPU 2 but only 2 GPU(s) are visible"));
  REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"a": 0})"),
                                                        small_staging({})),
                    accel::unavailable_error);
  REQUIRE(fake(devices[0]).allocations() == 0);
}

TEST_CASE("truncated, overlapping and badly indexed checkpoints fail before any allocation, naming file and rule", "[dispatch]") {
  accel_test::TempDir dir;
  auto devices = sim(1 << 20, 1 << 20);
  const auto map = accel::DeviceMap::from_json(R"({"": 0})");
  SECTION("a shard truncated after its header") {
    auto bytes = accel_test::safetensors_bytes({{"a", DType::F32, {16}, {}}});
    bytes.resize(bytes.size() - 5);
    accel_test::write_bytes(dir / "model.safetensors", bytes);
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), map, small_staging(devices)),
                        accel_test::contains("model.safetensors") && accel_test::contains("truncated data"));
  }
  SECTION("two tensors overlapping") {
    accel_test::write_bytes(dir / "model.safetensors",
                            accel_test::raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                                        std::vector<std::byte>(12)));
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), map, small_staging(devices)),
                        accel_test::contains("tensor 'b'") && accel_test::contains("overlap"));
  }
  SECTION("an index naming a shard that does not exist") {
    accel_test::write_sharded(dir.path(), model_shards());
    fs::remove(dir / "model-00002-of-00003.safetensors");
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), map, small_staging(devices)),
                        accel_test::contains("names shard 'model-00002-of-00003.safetensors', which does not exist"));
  }
  SECTION("a header that is not JSON") {
    accel_test::write_bytes(dir / "model.safetensors", accel_test::raw_safetensors("{\"a\": [", {}));
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), map, small_staging(devices)),
                        accel_test::contains("header is not valid JSON"));
  }
  REQUIRE(fake(devices[0]).allocations() == 0);
}

TEST_CASE("zero-copy CPU placement gives views into the mapped shard", "[dispatch]") {
  accel_test::TempDir dir;
  std::vector<TensorSpec> specs{{"a.w", DType::F32, {100}, {}}, {"a.b", DType::BF16, {3}, {}}};
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  accel::LoadOptions opts;
  opts.devices = std::vector<accel::DeviceMemoryPtr>{};
  opts.cpu_memory = accel::CpuMemory::zero_copy;
  opts.progress = false;
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"": "cpu"})"), opts);
  REQUIRE(m.at("a.w").storage == Storage::mmap_view);
  REQUIRE(read_back(m.at("a.w"), {}) == stored_bytes(specs[0]));
  REQUIRE(m.report().bytes_copied == 0);
  opts.dtype = DType::F32;  // a conversion forces a copy for that tensor only
  auto c = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"": "cpu"})"), opts);
  REQUIRE(c.at("a.w").storage == Storage::mmap_view);
  REQUIRE(c.at("a.b").storage == Storage::host_pageable);
  REQUIRE(read_back(c.at("a.b"), {}) == converted(specs[1], DType::F32));
}

TEST_CASE("fetch brings an offloaded block into a fetch buffer and prefetch fills the other one", "[dispatch][fetch]") {
  accel_test::TempDir dir;
  const auto shards = model_shards();
  accel_test::write_sharded(dir.path(), shards);
  auto devices = sim(1 << 20, 1 << 20);
  auto opts = small_staging(devices);
  opts.cpu_memory = accel::CpuMemory::pinned;
  auto model = accel::load_checkpoint_and_dispatch(dir.path(), model_map(), opts);
  // largest offloaded layer: layers.2 (102 bytes BF16 + 33 U8, aligned) vs layers.3 (258 + 0) vs lm_head (148)
  REQUIRE(model.fetch_buffer_bytes() == accel::arena_layout({17 * 3 * 2, 33}).total);
  auto& dev = fake(devices[0]);
  accel::Stream compute(devices[0]);
  {
    auto l2 = model.fetch("model.layers.2", compute.get());
    REQUIRE(l2.tensors().size() == 2);
    const auto* w = l2.find("model.layers.2.w");
    REQUIRE(w != nullptr);
    REQUIRE(device_bytes(w->data, w->handle->size_bytes, devices[0]) == stored_bytes(shards[1][3]));
    const auto copies_before = dev.copies();
    model.prefetch("model.layers.3");  // disk (mmap) source: staged through pinned buffers
    REQUIRE(dev.copies() > copies_before);
    const auto copies_after_prefetch = dev.copies();
    auto l3 = model.fetch("model.layers.3", compute.get());
    REQUIRE(dev.copies() == copies_after_prefetch);  // found in the prefetched buffer: no new copy
    const auto* w3 = l3.find("model.layers.3.w");
    REQUIRE(device_bytes(w3->data, w3->handle->size_bytes, devices[0]) == stored_bytes(shards[2][0]));
    REQUIRE_THROWS_WITH(model.prefetch("lm_head"), accel_test::contains("all 2 fetch buffers are held"));
  }
  {
    auto head = model.fetch("lm_head");  // both buffers free again; host waits (no stream)
    REQUIRE(device_bytes(head.tensors()[0].data, 37 * 4, devices[0]) == stored_bytes(shards[2][3]));
    auto gpu = model.fetch("model.layers.0");  // GPU-resident: returned in place
    REQUIRE(gpu.find("model.layers.0.w")->data == model.at("model.layers.0.w").device_ptr);
  }
  REQUIRE_THROWS_WITH(model.fetch("model"), accel_test::contains("each fetch buffer holds"));
  REQUIRE_THROWS_WITH(model.fetch("nothing.here"), accel_test::contains("no loaded tensor is named 'nothing.here'"));
}

TEST_CASE("a GPU with room for fewer fetch buffers than asked loads with what fits and says so", "[dispatch][fetch]") {
  accel_test::TempDir dir;
  const auto shards = model_shards();
  accel_test::write_sharded(dir.path(), shards);
  std::uint64_t full = 0, slot = 0;
  {
    auto devices = sim(1 << 20, 1 << 20);
    auto model = accel::load_checkpoint_and_dispatch(dir.path(), model_map(), small_staging(devices));
    REQUIRE(model.fetch_buffer_count() == 2);
    REQUIRE(model.report().warnings.empty());
    full = fake(devices[0]).live_bytes();  // arenas + two fetch buffers
    slot = model.fetch_buffer_bytes();
  }
  // Room for the arenas and one and a half buffers: one buffer, a warning that says how to get two.
  auto devices = sim(full - slot / 2, 1 << 20);
  auto model = accel::load_checkpoint_and_dispatch(dir.path(), model_map(), small_staging(devices));
  REQUIRE(model.fetch_buffer_count() == 1);
  REQUIRE(model.report().warnings.size() == 1);
  CHECK_THAT(model.report().warnings[0], accel_test::contains("has room for 1 of the 2 fetch buffers"));
  CHECK_THAT(model.report().warnings[0], accel_test::contains("gpu_reserve_layers = 2"));
  auto l2 = model.fetch("model.layers.2");
  REQUIRE(device_bytes(l2.find("model.layers.2.w")->data, l2.find("model.layers.2.w")->handle->size_bytes, devices[0]) ==
          stored_bytes(shards[1][3]));
  // Without room for even one buffer, loading fails naming the device, and frees everything.
  auto tiny = sim(full - slot - slot / 2, 1 << 20);
  REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), model_map(), small_staging(tiny)), accel::cuda_error);
  REQUIRE(fake(tiny[0]).live_bytes() == 0);
}

TEST_CASE("without a GPU, fetch returns host views and prefetch does nothing", "[dispatch][fetch]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{"a.w", DType::F32, {8}, {}}, {"b.w", DType::F16, {8}, {}}});
  accel::LoadOptions opts;
  opts.devices = std::vector<accel::DeviceMemoryPtr>{};
  opts.progress = false;
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"a": "cpu", "b": "disk"})"), opts);
  REQUIRE_FALSE(m.execution_device().has_value());
  m.prefetch("b");
  auto b = m.fetch("b");
  REQUIRE(b.tensors()[0].data == m.at("b.w").host.data());
}

namespace {
// Rows `rows` of `bytes` (a row-major tensor of `count` rows), one after another.
std::vector<std::byte> rows_of(const std::vector<std::byte>& bytes, std::size_t count, const std::vector<std::int64_t>& rows) {
  const std::size_t row = bytes.size() / count;
  std::vector<std::byte> out;
  for (auto r : rows) out.insert(out.end(), bytes.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * row),
                                 bytes.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(r) + 1) * row));
  return out;
}
}  // namespace

TEST_CASE("read_rows copies chosen rows of cpu and disk tensors to the execution GPU, or to the host without one",
          "[dispatch][rows]") {
  accel_test::TempDir dir;
  // 22-byte rows (four per 96-byte staging buffer) and 200-byte rows (larger than a staging buffer).
  const std::vector<TensorSpec> specs{{"embed.weight", DType::BF16, {37, 11}, {}}, {"wide.weight", DType::F32, {3, 50}, {}},
                                      {"gpu.weight", DType::F32, {4, 4}, {}}, {"scalar", DType::F32, {}, {}}};
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  const std::vector<std::int64_t> ids{36, 0, 5, 5, 17, 2, 36, 9, 1};  // unordered, repeated, > one buffer
  const std::vector<std::int64_t> wide_ids{2, 0, 2};
  for (auto memory : {accel::CpuMemory::pageable, accel::CpuMemory::pinned, accel::CpuMemory::zero_copy}) {
    for (const char* where : {"cpu", "disk"}) {
      INFO(where << " memory " << static_cast<int>(memory));
      auto devices = sim(1 << 20, 1 << 20);
      auto opts = small_staging(devices);
      opts.cpu_memory = memory;
      const auto map = accel::DeviceMap::from_json(std::string(R"({"gpu": 0, "scalar": 0, "embed": ")") + where +
                                                   R"(", "wide": ")" + where + "\"}");
      auto model = accel::load_checkpoint_and_dispatch(dir.path(), map, opts);
      accel::DeviceBuffer out(devices[0], 22 * ids.size());
      accel::Stream compute(devices[0]);
      model.read_rows("embed.weight", ids, out.get(), compute.get());
      REQUIRE(device_bytes(out.get(), 22 * ids.size(), devices[0]) == rows_of(stored_bytes(specs[0]), 37, ids));
      accel::DeviceBuffer wide(devices[0], 200 * wide_ids.size());
      model.read_rows("wide.weight", wide_ids, wide.get());  // host waits
      REQUIRE(device_bytes(wide.get(), 600, devices[0]) == rows_of(stored_bytes(specs[1]), 3, wide_ids));
    }
  }
  SECTION("without a GPU the rows land in host memory") {
    accel::LoadOptions opts;
    opts.devices = std::vector<accel::DeviceMemoryPtr>{};
    opts.progress = false;
    auto model = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"": "disk"})"), opts);
    std::vector<std::byte> out(22 * ids.size());
    model.read_rows("embed.weight", ids, out.data());
    REQUIRE(out == rows_of(stored_bytes(specs[0]), 37, ids));
  }
  SECTION("bad requests are refused by name before anything is copied") {
    auto devices = sim(1 << 20, 1 << 20);
    auto model = accel::load_checkpoint_and_dispatch(
        dir.path(), accel::DeviceMap::from_json(R"({"gpu": 0, "scalar": "cpu", "embed": "cpu", "wide": "cpu"})"),
        small_staging(devices));
    accel::DeviceBuffer out(devices[0], 22 * 2);
    const std::vector<std::int64_t> bad{3, 37};
    const auto copies = fake(devices[0]).copies();
    REQUIRE_THROWS_WITH(model.read_rows("embed.weight", bad, out.get()), accel_test::contains("row 37 is out of range (the tensor has 37 rows)"));
    const std::vector<std::int64_t> negative{-1};
    REQUIRE_THROWS_WITH(model.read_rows("embed.weight", negative, out.get()), accel_test::contains("row -1 is out of range"));
    REQUIRE(fake(devices[0]).copies() == copies);
    REQUIRE_THROWS_WITH(model.read_rows("gpu.weight", ids, out.get()), accel_test::contains("lives on GPU 0; read its rows there"));
    REQUIRE_THROWS_WITH(model.read_rows("scalar", ids, out.get()), accel_test::contains("is a scalar"));
    REQUIRE_THROWS_WITH(model.read_rows("nope.weight", ids, out.get()), accel_test::contains("no tensor 'nope.weight' was loaded"));
  }
  SECTION("a disk tensor whose shard shrank is a checkpoint error") {
    auto devices = sim(1 << 20, 1 << 20);
    auto model = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"": "disk"})"),
                                                     small_staging(devices));
    fs::resize_file(dir / "model.safetensors", 100);
    accel::DeviceBuffer out(devices[0], 22 * ids.size());
    REQUIRE_THROWS_AS(model.read_rows("embed.weight", ids, out.get()), accel::checkpoint_error);
  }
}

TEST_CASE("tensors listed as read by rows do not size the fetch buffers", "[dispatch][rows][fetch]") {
  accel_test::TempDir dir;
  const std::vector<TensorSpec> specs{{"embed.weight", DType::BF16, {37, 11}, {}}, {"layers.0.w", DType::F32, {20}, {}},
                                      {"gpu.weight", DType::F32, {4, 4}, {}}};
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  const auto map = accel::DeviceMap::from_json(R"({"gpu": 0, "embed": "cpu", "layers": "cpu"})");
  {
    auto model = accel::load_checkpoint_and_dispatch(dir.path(), map, small_staging(sim(1 << 20, 1 << 20)));
    REQUIRE(model.fetch_buffer_bytes() == accel::arena_layout({37 * 11 * 2}).total);  // the table sizes them
  }
  auto devices = sim(1 << 20, 1 << 20);
  auto opts = small_staging(devices);
  opts.row_read_tensors = {"embed.weight"};
  auto model = accel::load_checkpoint_and_dispatch(dir.path(), map, opts);
  REQUIRE(model.fetch_buffer_bytes() == accel::arena_layout({20 * 4}).total);
  REQUIRE(model.fetch_buffer_count() == 2);
  const std::vector<std::int64_t> ids{4, 36};
  accel::DeviceBuffer out(devices[0], 44);
  model.read_rows("embed.weight", ids, out.get());
  REQUIRE(device_bytes(out.get(), 44, devices[0]) == rows_of(stored_bytes(specs[0]), 37, ids));
  REQUIRE(device_bytes(model.fetch("layers.0").tensors()[0].data, 80, devices[0]) == stored_bytes(specs[1]));
  REQUIRE_THROWS_WITH(model.fetch("embed"), accel_test::contains("'embed.weight' was loaded to be read by rows") &&
                                               accel_test::contains("use read_rows"));
  SECTION("with nothing else offloaded, no fetch buffer is made at all") {
    auto exact = sim(accel::arena_layout({64}).total + accel::arena_layout({80}).total, 1 << 20);  // the arenas, no more
    auto o = small_staging(exact);
    o.row_read_tensors = {"embed.weight"};
    auto only_rows = accel::load_checkpoint_and_dispatch(
        dir.path(), accel::DeviceMap::from_json(R"({"gpu": 0, "embed": "cpu", "layers": 0})"), o);
    REQUIRE(only_rows.fetch_buffer_count() == 0);
    REQUIRE(only_rows.fetch_buffer_bytes() == 0);
  }
}

TEST_CASE("progress is reported up to the total of copied bytes", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_sharded(dir.path(), model_shards());
  auto devices = sim(1 << 20, 1 << 20);
  auto opts = small_staging(devices);
  std::uint64_t last = 0, total = 0;
  int calls = 0;
  opts.on_progress = [&](std::uint64_t d, std::uint64_t t) {
    REQUIRE(d >= last);
    last = d;
    total = t;
    ++calls;
  };
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), model_map(), opts);
  REQUIRE(calls > 3);
  REQUIRE(last == total);
  REQUIRE(total == m.report().bytes_copied);
}

TEST_CASE("the progress line shows bytes, rate and ETA", "[dispatch]") {
  const auto line = accel::format_progress(512ull << 20, 2048ull << 20, 2.0, 8);
  REQUIRE(line == "loading [##......]  25%  512 MiB / 2.00 GiB  256 MiB/s  ETA 6s");
  REQUIRE(accel::format_progress(10, 10, 1.0, 4) == "loading [####] 100%  10 B / 10 B  10 B/s  ETA 0s");
}

TEST_CASE("plan_load puts each block in one arena with aligned offsets and finds the execution GPU", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_sharded(dir.path(), model_shards());
  const auto ckpt = accel::resolve_checkpoint(dir.path());
  accel::LoadOptions opts;
  const auto plan = accel::plan_load(ckpt, model_map(), opts, 2);
  REQUIRE(plan.execution_gpu == 0);
  std::map<std::string, std::size_t> arena_of;
  for (const auto& t : plan.tensors) {
    if (t.arena == static_cast<std::size_t>(-1) || t.bytes == 0) continue;
    REQUIRE(t.arena_offset % 256 == 0);
    auto [it, fresh] = arena_of.emplace(t.block, t.arena);
    REQUIRE(it->second == t.arena);  // one arena per block
  }
  REQUIRE(plan.arenas.size() == 6);  // embed, layers.0, layers.1, layers.2 (cpu), norm, lm_head (cpu); disk has none
}

TEST_CASE("fetch buffers are sized per layer, even where the map merged layers into one key", "[dispatch][fetch]") {
  using accel::detail::fetch_unit;
  CHECK(fetch_unit("model.layers.3.mlp.up.weight", "model.layers") == "model.layers.3");
  CHECK(fetch_unit("model.layers.3.experts.17.w1", "") == "model.layers.3");
  CHECK(fetch_unit("lm_head.weight", "") == "lm_head");
  CHECK(fetch_unit("model.norm.weight", "model") == "model.norm");
  CHECK(fetch_unit("bias", "") == "");
  CHECK(fetch_unit("model.layers.3.mlp.up.weight", "model.layers.3.mlp") == "model.layers.3.mlp");  // a deeper key wins
  CHECK(fetch_unit("h.10.attn.weight", "h.10.attn.weight") == "h.10.attn.weight");
}

TEST_CASE("a shard truncated while it is being loaded is a checkpoint error naming both sizes, never a SIGBUS",
          "[dispatch][truncation]") {
  accel_test::TempDir dir, offload;
  const std::vector<TensorSpec> specs{{"m.a", DType::F32, {4096}, {}}, {"m.b", DType::F32, {4096}, {}}};
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  const auto full = fs::file_size(dir / "model.safetensors");
  auto opts = small_staging(sim(1 << 20, 1 << 20));
  opts.offload_folder = offload.path();
  // The first progress report comes after the first chunk was read: the file shrinks to its header.
  opts.on_progress = [&, truncated = false](std::uint64_t, std::uint64_t) mutable {
    if (!truncated) fs::resize_file(dir / "model.safetensors", 200);
    truncated = true;
  };
  std::string map;
  SECTION("cpu, converted") {
    map = R"({"m": "cpu"})";
    opts.dtype = DType::F16;
    opts.host_threads = 1;  // so the first report (m.a read) comes before m.b is read
  }
  SECTION("cpu, raw") {
    map = R"({"m": "cpu"})";
    opts.host_threads = 1;
  }
  SECTION("disk, converted into the offload folder") {
    map = R"({"m": "disk"})";
    opts.dtype = DType::BF16;
  }
  SECTION("gpu, converted through the staging ring") {
    map = R"({"m": 0})";
    opts.dtype = DType::F16;
  }
  SECTION("gpu, raw through the staging ring") { map = R"({"m": 1})"; }
  INFO(map);
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(map), opts),
                      accel_test::contains((dir / "model.safetensors").string() + "' shrank while it was being read: it was " +
                                           std::to_string(full) + " bytes when its header was checked and is now 200 bytes"));
}

TEST_CASE("a shard truncated before the parallel host copy is one checkpoint error from the copy threads, never a SIGBUS",
          "[dispatch][truncation]") {
  accel_test::TempDir dir;
  std::vector<TensorSpec> specs{{"a.w", DType::F32, {4096}, {}}};
  for (int i = 0; i < 8; ++i) specs.push_back({"b." + std::to_string(i), DType::F32, {4096}, {}});
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  auto opts = small_staging(sim(1 << 20, 1 << 20));
  opts.host_threads = 4;
  opts.dtype = GENERATE(std::optional<DType>{}, std::optional<DType>{DType::BF16});
  // The first report is a.w's staged GPU read, flushed just before the host copy starts.
  opts.on_progress = [&, truncated = false](std::uint64_t, std::uint64_t) mutable {
    if (!truncated) fs::resize_file(dir / "model.safetensors", 200);
    truncated = true;
  };
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"a": 0, "b": "cpu"})"), opts),
                      accel_test::contains("model.safetensors' shrank while it was being read") &&
                          accel_test::contains("is now 200 bytes"));
}

TEST_CASE("cpu tensors spanning several copy pieces land byte for byte on any number of copy threads", "[dispatch][threads]") {
  accel_test::TempDir dir;
  // Each large tensor spans two 8 MiB pieces with an odd tail; the small one sits between them.
  const std::vector<TensorSpec> specs{{"m.h", DType::F16, {(4 << 20) + 524288 + 3}, {}},
                                      {"m.small", DType::BF16, {5}, {}},
                                      {"m.f", DType::F32, {(2 << 20) + 3}, {}}};
  accel_test::write_safetensors(dir / "model.safetensors", specs);
  const unsigned threads = GENERATE(1u, 2u, 3u);
  const bool to_f32 = GENERATE(false, true);
  auto opts = small_staging({});
  opts.host_threads = threads;
  if (to_f32) opts.dtype = DType::F32;
  INFO("threads " << threads << (to_f32 ? ", converted to F32" : ", raw"));
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"": "cpu"})"), opts);
  for (const auto& t : specs) {
    const auto& h = m.at(t.name);
    REQUIRE(h.storage == Storage::host_pageable);
    REQUIRE(read_back(h, {}) == converted(t, to_f32 ? DType::F32 : t.dtype));
  }
  std::uint64_t stored = 0;
  for (const auto& t : specs) stored += accel_test::spec_bytes(t);
  REQUIRE(m.report().bytes_copied == stored);
}

TEST_CASE("a device map whose keys cover one tensor twice, on different devices, is refused naming both keys",
          "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_sharded(dir.path(), model_shards());
  const auto overlapping = accel::DeviceMap::from_json(R"({"model": 0, "model.layers.1": "cpu", "lm_head": "cpu"})");
  REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir.path(), overlapping, small_staging(sim(1 << 20, 1 << 20))),
                    accel::config_error);
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), overlapping, small_staging(sim(1 << 20, 1 << 20))),
                      accel_test::contains("device map keys 'model' (0) and 'model.layers.1' (cpu) both cover tensor "
                                           "'model.layers.1.w'"));
  // The same device twice is only redundant: the inner key decides the block.
  const auto nested = accel::DeviceMap::from_json(R"({"": "cpu", "model.layers.1": "cpu"})");
  auto m = accel::load_checkpoint_and_dispatch(dir.path(), nested, small_staging(sim(1 << 20, 1 << 20)));
  REQUIRE(m.at("model.layers.1.w").block == "model.layers.1");
}

TEST_CASE("an index with an empty weight_map is refused, through the folder and the index file", "[dispatch]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "model.safetensors.index.json", R"({"metadata": {"total_size": 0}, "weight_map": {}})");
  const auto map = accel::DeviceMap::from_json(R"({"": "cpu"})");
  for (const auto& path : {dir.path(), dir / "model.safetensors.index.json"}) {
    INFO(path);
    REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(path, map, small_staging({})),
                        accel_test::contains("'weight_map' is empty, so the index lists no tensor and no shard"));
  }
}

TEST_CASE("a symbolic link loop as the checkpoint or inside its folder is a checkpoint error that says so", "[dispatch]") {
  accel_test::TempDir dir;
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  const auto map = accel::DeviceMap::from_json(R"({"": "cpu"})");
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir / "loop_a", map, small_staging({})),
                      accel_test::contains("cannot be resolved: Too many levels of symbolic links (a symbolic link loop)"));
  fs::create_directory(dir / "ckpt");
  fs::create_symlink(dir / "loop_a", dir / "ckpt" / "model.safetensors");
  REQUIRE_THROWS_AS(accel::load_checkpoint_and_dispatch(dir / "ckpt", map, small_staging({})), accel::checkpoint_error);
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir / "ckpt", map, small_staging({})),
                      accel_test::contains("model.safetensors' cannot be resolved: Too many levels of symbolic links"));
}

TEST_CASE("fetching a disk block whose shard was truncated after loading is a checkpoint error, not a SIGBUS",
          "[dispatch][fetch][truncation]") {
  accel_test::TempDir dir;
  const auto shards = model_shards();
  accel_test::write_sharded(dir.path(), shards);
  auto devices = sim(1 << 20, 1 << 20);
  auto model = accel::load_checkpoint_and_dispatch(dir.path(), model_map(), small_staging(devices));
  REQUIRE(model.at("model.layers.3.w").storage == Storage::mmap_view);
  fs::resize_file(dir / "model-00003-of-00003.safetensors", 100);
  REQUIRE_THROWS_WITH(model.fetch("model.layers.3"),
                      accel_test::contains("model-00003-of-00003.safetensors' shrank while it was being read") &&
                          accel_test::contains("is now 100 bytes"));
}

TEST_CASE("a map in the model's names loads a Hub-format folder, as a map in its own names does", "[dispatch][names]") {
  accel_test::TempDir dir;
  const std::vector<TensorSpec> specs{{"gpt_neox.embed_in.weight", DType::F32, {16, 4}, {}},
                                      {"gpt_neox.layers.0.mlp.dense_h_to_4h.weight", DType::F32, {8, 4}, {}},
                                      {"gpt_neox.final_layer_norm.weight", DType::F32, {4}, {}},
                                      {"embed_out.weight", DType::F32, {16, 4}, {}}};
  accel_test::write_safetensors(dir.path() / "model.safetensors", specs);
  accel_test::write_text(dir.path() / "config.json", R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox"})");
  auto devices = sim(1 << 20, 1 << 20);
  // lm_head is the model's name of embed_out.
  auto by_model = accel::load_checkpoint_and_dispatch(
      dir.path(), accel::DeviceMap::from_json(R"({"gpt_neox": 0, "lm_head": 1})"), small_staging(devices));
  CHECK(by_model.at("embed_out.weight").placement == Placement::gpu(1));
  CHECK(by_model.at("gpt_neox.final_layer_norm.weight").placement == Placement::gpu(0));
  CHECK(by_model.report().unexpected.empty());
  CHECK(by_model.report().unused_keys.empty());
  CHECK(read_back(by_model.at("embed_out.weight"), devices) == stored_bytes(specs[3]));
  auto by_checkpoint = accel::load_checkpoint_and_dispatch(
      dir.path(), accel::DeviceMap::from_json(R"({"gpt_neox": 0, "embed_out": 1})"), small_staging(sim(1 << 20, 1 << 20)));
  CHECK(by_checkpoint.at("embed_out.weight").placement == Placement::gpu(1));
  SECTION("with config.json elsewhere, LoadOptions::config_file names it (accel load --config)") {
    accel_test::TempDir bare, cfg;
    accel_test::write_safetensors(bare.path() / "model.safetensors", specs);
    fs::copy_file(dir.path() / "config.json", cfg.path() / "config.json");
    auto o = small_staging(sim(1 << 20, 1 << 20));
    const auto map = accel::DeviceMap::from_json(R"({"gpt_neox": 0, "lm_head": 1})");
    CHECK(accel::load_checkpoint_and_dispatch(bare.path(), map, o).report().unexpected == std::vector<std::string>{"embed_out.weight"});
    o.config_file = cfg.path() / "config.json";
    CHECK(accel::load_checkpoint_and_dispatch(bare.path(), map, o).at("embed_out.weight").placement == Placement::gpu(1));
  }
  CHECK_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), accel::DeviceMap::from_json(R"({"lm_head": 0, "embed_out": 1, "gpt_neox": 0})"),
                                                        small_staging(sim(1 << 20, 1 << 20))),
                    accel_test::contains("mixes model names ('lm_head') and checkpoint names ('embed_out')"));
}

TEST_CASE("a quantized checkpoint loads byte-exact: float8 weights and float32 scales as stored, the rest at --dtype", "[dispatch][quantization]") {
  accel_test::TempDir dir, offload;
  const std::vector<TensorSpec> specs{{"model.embed_tokens.weight", DType::F32, {16, 128}, {}},
                                      {"model.layers.0.mlp.up_proj.weight", DType::F8_E4M3, {160, 128}, {}},
                                      {"model.layers.0.mlp.up_proj.weight_scale_inv", DType::F32, {2, 1}, {}},
                                      {"model.layers.0.post_attention_layernorm.weight", DType::F32, {128}, {}},
                                      {"model.layers.1.mlp.up_proj.weight", DType::F8_E4M3, {160, 128}, {}},
                                      {"model.layers.1.mlp.up_proj.weight_scale_inv", DType::F32, {2, 1}, {}},
                                      {"lm_head.weight", DType::F32, {16, 128}, {}}};
  accel_test::write_safetensors(dir.path() / "model.safetensors", specs);
  accel_test::write_text(dir.path() / "config.json", R"({"architectures":["LlamaForCausalLM"],"model_type":"llama",
    "quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}})");
  auto devices = sim(1 << 20, 1 << 20);
  auto options = small_staging(devices);
  options.dtype = DType::BF16;
  options.offload_folder = offload.path();
  const auto map = accel::DeviceMap::from_json(R"({"model.embed_tokens": 0, "model.layers.0": 1, "model.layers.1": "disk", "lm_head": "cpu"})");
  auto model = accel::load_checkpoint_and_dispatch(dir.path(), map, options);
  for (const auto& spec : specs) {
    INFO(spec.name);
    const auto& h = model.at(spec.name);
    const bool quantized = spec.name.find("up_proj") != std::string::npos;
    REQUIRE(h.dtype == (quantized ? spec.dtype : DType::BF16));
    REQUIRE(read_back(h, devices) == (quantized ? stored_bytes(spec) : converted(spec, DType::BF16)));
  }
  REQUIRE(model.at("model.layers.1.mlp.up_proj.weight").storage == Storage::mmap_view);  // as stored: a view, no offload file

  // A map splitting a weight from its scale is refused before anything is allocated.
  const auto split = accel::DeviceMap::from_json(R"({"model.embed_tokens": 0, "model.layers.0.mlp.up_proj.weight": 1,
    "model.layers.0.mlp.up_proj.weight_scale_inv": "cpu", "model.layers.0.post_attention_layernorm": 1, "model.layers.1": 1, "lm_head": 0})");
  const auto allocations = fake(devices[1]).allocations();
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), split, options),
                      accel_test::contains("puts 'model.layers.0.mlp.up_proj.weight' on 1 and 'model.layers.0.mlp.up_proj.weight_scale_inv' "
                                           "on cpu; a quantized weight and its scales must share a device"));
  REQUIRE(fake(devices[1]).allocations() == allocations);

  // Before: the float8 weight was converted like any floating tensor, and refused.
  auto dense = options;
  accel_test::write_text(dir.path() / "config.json", R"({"architectures":["LlamaForCausalLM"],"model_type":"llama"})");
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(dir.path(), map, dense),
                      accel_test::contains("is F8_E4M3 and cannot be loaded as BF16"));
}
