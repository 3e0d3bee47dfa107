// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file dispatch.hpp
/// @brief load_checkpoint_and_dispatch: safetensors checkpoints onto GPUs, CPU and disk by device
///        map, and DispatchedModel with tensor lookup and fetch/prefetch of offloaded blocks.
///
/// Loading validates every shard header (resolve_checkpoint) and plans every tensor (plan_load)
/// before allocating. GPU tensors are read in file order through a ring of pinned staging buffers
/// with asynchronous copies, so the next disk read overlaps the current copy; each device-map block
/// gets one allocation (arena). A failure anywhere frees everything allocated so far.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/load/convert.hpp>
#include <accel/load/detail/mapped_file.hpp>
#include <accel/load/progress.hpp>
#include <accel/load/detail/staging.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/load/device_memory.hpp>
#include <accel/runtime/error.hpp>
#include <accel/load/load_plan.hpp>
#include <accel/load/offload.hpp>
#include <accel/model/safetensors.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief One loaded tensor.
struct TensorHandle {
  std::string name;                   ///< checkpoint name
  DType dtype = DType::F32;           ///< loaded dtype
  std::vector<std::int64_t> shape;    ///< dimensions
  std::uint64_t size_bytes = 0;       ///< bytes (loaded dtype)
  Placement placement;                ///< GPU, cpu or disk
  std::string block;                  ///< the device-map key that placed it
  Storage storage = Storage::device;  ///< what holds the bytes
  void* device_ptr = nullptr;         ///< device pointer (Storage::device), else nullptr
  std::span<const std::byte> host;    ///< host bytes (cpu/disk storage), else empty
};

/// @brief Bytes and tensors on one placement.
struct PlacementTotals {
  std::uint64_t bytes = 0;    ///< loaded bytes
  std::size_t tensors = 0;    ///< tensor count
};

/// @brief What a load did.
struct LoadReport {
  std::map<Placement, PlacementTotals> per_placement;  ///< GPUs ascending, cpu, disk
  std::uint64_t bytes_loaded = 0;       ///< bytes of every loaded tensor (loaded dtype)
  std::uint64_t bytes_copied = 0;       ///< checkpoint bytes actually read and copied (views excluded)
  double seconds = 0;                   ///< wall time of the whole call
  std::vector<std::string> unexpected;  ///< checkpoint tensors skipped
  std::vector<std::string> missing;     ///< expected tensors absent
  std::vector<std::string> unused_keys; ///< device-map keys covering nothing
  std::size_t offload_written = 0;      ///< offload-folder tensors written
  std::size_t offload_reused = 0;       ///< offload-folder tensors reused from an earlier run
  std::vector<std::string> warnings;    ///< what loading did differently from what was asked (e.g. fewer fetch buffers)
  /// @brief bytes_copied / seconds.
  [[nodiscard]] double copy_rate() const noexcept { return seconds > 0 ? static_cast<double>(bytes_copied) / seconds : 0; }
};

/// @brief A tensor of a fetched module, on the execution device.
struct FetchedTensor {
  const TensorHandle* handle = nullptr;  ///< the tensor's load record (name, dtype, shape)
  void* data = nullptr;                  ///< device pointer (host pointer when there is no GPU)
};

class DispatchedModel;

namespace detail {

struct FetchSlot {
  DeviceBuffer buffer;
  std::string module;
  Event ready, released;
  bool release_recorded = false;
  int holds = 0;
  std::uint64_t last_use = 0;
  std::vector<FetchedTensor> tensors;
};

struct ModelState {
  std::vector<DeviceMemoryPtr> devices;
  std::vector<std::unique_ptr<MappedFile>> shards;
  std::unique_ptr<OffloadFolder> offload;
  std::vector<DeviceBuffer> device_arenas;
  std::vector<PinnedBuffer> pinned_arenas;
  std::vector<HostBuffer> host_arenas;
  std::vector<std::unique_ptr<FetchSlot>> slots;
  std::uint64_t slot_bytes = 0;
  std::map<int, std::unique_ptr<Stager>> stagers;  // per GPU; their streams below
  std::map<int, Stream> streams;                   // destroyed first: pending copies finish before buffers go
  std::vector<TensorHandle> tensors;
  std::unordered_map<std::string, std::size_t> by_name;
  std::unordered_map<std::string, std::string> aliases;
  std::unordered_map<std::string, std::vector<std::size_t>> module_cache;
  std::optional<int> execution_gpu;
  std::uint64_t clock = 0;
  LoadReport report;
};

}  // namespace detail

/// @brief A fetched module: device pointers for its tensors, valid while this object lives (it
///        must not outlive its DispatchedModel).
///
/// Destroying it (or release()) records on the compute stream that the buffer may be reused, so a
/// later fetch/prefetch into the same buffer waits for the work already queued on that stream.
class FetchedModule {
 public:
  FetchedModule() = default;
  FetchedModule(FetchedModule&& o) noexcept
      : state_(std::exchange(o.state_, nullptr)), slot_(std::exchange(o.slot_, nullptr)), stream_(o.stream_),
        tensors_(std::move(o.tensors_)) {}
  FetchedModule& operator=(FetchedModule&& o) noexcept {
    if (this != &o) {
      release();
      state_ = std::exchange(o.state_, nullptr);
      slot_ = std::exchange(o.slot_, nullptr);
      stream_ = o.stream_;
      tensors_ = std::move(o.tensors_);
    }
    return *this;
  }
  FetchedModule(const FetchedModule&) = delete;
  FetchedModule& operator=(const FetchedModule&) = delete;
  ~FetchedModule() { release(); }

  /// @brief The module's tensors in checkpoint order.
  [[nodiscard]] const std::vector<FetchedTensor>& tensors() const noexcept { return tensors_; }
  /// @brief The tensor called `name`, or nullptr.
  [[nodiscard]] const FetchedTensor* find(std::string_view name) const noexcept {
    for (const auto& t : tensors_)
      if (t.handle->name == name) return &t;
    return nullptr;
  }
  /// @brief Gives the buffer back (idempotent).
  void release() noexcept {
    if (!slot_) return;
    if (stream_) {
      try {
        slot_->released.record(stream_);
        slot_->release_recorded = true;
      } catch (...) {
        std::fprintf(stderr, "[accel.cuda] recording a fetch-buffer release failed (ignored)\n");
      }
    }
    --slot_->holds;
    slot_ = nullptr;
    state_ = nullptr;
  }

 private:
  friend class DispatchedModel;
  detail::ModelState* state_ = nullptr;
  detail::FetchSlot* slot_ = nullptr;
  StreamHandle stream_ = nullptr;
  std::vector<FetchedTensor> tensors_;
};

/// @brief The loaded checkpoint: every tensor's location, and fetch/prefetch of offloaded blocks.
class DispatchedModel {
 public:
  DispatchedModel() = default;
  explicit DispatchedModel(std::unique_ptr<detail::ModelState> state) : s_(std::move(state)) {}

  /// @brief Every loaded tensor, checkpoint order.
  [[nodiscard]] const std::vector<TensorHandle>& tensors() const noexcept { return s_->tensors; }
  /// @brief The tensor `name` (tied aliases resolve to their source), or nullptr.
  [[nodiscard]] const TensorHandle* find(std::string_view name) const {
    std::string key(name);
    if (auto a = s_->aliases.find(key); a != s_->aliases.end()) key = a->second;
    auto it = s_->by_name.find(key);
    return it == s_->by_name.end() ? nullptr : &s_->tensors[it->second];
  }
  /// @brief As find(), but throws.
  /// @throws accel::usage_error naming the tensor when it was not loaded
  [[nodiscard]] const TensorHandle& at(std::string_view name) const {
    if (const auto* t = find(name)) return *t;
    detail::throw_error<usage_error>("no tensor '", name, "' was loaded (", s_->tensors.size(),
                                     " tensors are; check the name, or the report's unexpected list)");
  }
  /// @brief What the load did.
  [[nodiscard]] const LoadReport& report() const noexcept { return s_->report; }
  /// @brief The GPU fetch() copies to (the lowest GPU in the map), or nullopt (no GPU: host pointers).
  [[nodiscard]] std::optional<int> execution_device() const noexcept { return s_->execution_gpu; }
  /// @brief Size of each fetch buffer (the largest offloaded layer, see detail::fetch_unit).
  [[nodiscard]] std::uint64_t fetch_buffer_bytes() const noexcept { return s_->slot_bytes; }
  /// @brief Number of fetch buffers (LoadOptions::fetch_slots, or fewer when the device had no room:
  /// see LoadReport::warnings).
  [[nodiscard]] std::size_t fetch_buffer_count() const noexcept { return s_->slots.size(); }

  /// @brief Brings the tensors of `module` (a device-map key or any dotted prefix) to the execution
  ///        device. GPU-resident tensors are returned in place; cpu/disk ones are copied into a fetch
  ///        buffer (or found there when prefetched).
  /// @param module module or block name
  /// @param stream the compute stream that will use the tensors: it is made to wait for the copy
  ///        (the host does not block); nullptr: the host waits until the copy is done
  /// @return handles valid while the FetchedModule lives
  /// @throws accel::usage_error when the module has no tensors, its offloaded bytes exceed the fetch
  ///         buffer, or every fetch buffer is held
  /// @note not thread-safe; the host copies pageable/mmap sources into pinned staging itself
  /// @code
  /// auto layer = model.fetch("model.layers.7", stream);
  /// model.prefetch("model.layers.8");        // copies while layer 7 computes
  /// run_layer(layer.find("model.layers.7.mlp.up_proj.weight")->data, stream);
  /// @endcode
  [[nodiscard]] FetchedModule fetch(std::string_view module, StreamHandle stream = nullptr) {
    const auto& members = members_of(module);
    FetchedModule out;
    out.state_ = s_.get();
    out.stream_ = stream;
    detail::FetchSlot* slot = stage(module, members, /*for_prefetch=*/false);
    if (slot) {
      auto& dev = *s_->devices[static_cast<std::size_t>(*s_->execution_gpu)];
      if (stream) dev.stream_wait_event(stream, slot->ready.get());
      else slot->ready.wait();
      ++slot->holds;
      slot->last_use = ++s_->clock;
      out.slot_ = slot;
      out.tensors_ = slot->tensors;
    } else {
      for (auto i : members) out.tensors_.push_back(direct(i));
    }
    return out;
  }

  /// @brief Starts copying `module` into a free fetch buffer so a later fetch() finds it there.
  /// @throws accel::usage_error as fetch()
  /// @note returns once the copies are enqueued (for pageable/mmap sources, once the host has
  ///       staged them); a no-op without a GPU or when nothing of the module is offloaded
  void prefetch(std::string_view module) {
    const auto& members = members_of(module);
    (void)stage(module, members, /*for_prefetch=*/true);
  }

 private:
  const std::vector<std::size_t>& members_of(std::string_view module) {
    auto [it, fresh] = s_->module_cache.try_emplace(std::string(module));
    if (fresh) {
      for (std::size_t i = 0; i < s_->tensors.size(); ++i)
        if (detail::matches_prefix(s_->tensors[i].name, module)) it->second.push_back(i);
      if (it->second.empty()) {
        s_->module_cache.erase(it);
        detail::throw_error<usage_error>("fetch('", module, "'): no loaded tensor is named '", module,
                                         "' or lies below it; pass a device-map key or module name");
      }
    }
    return it->second;
  }
  FetchedTensor direct(std::size_t i) const {
    auto& t = s_->tensors[i];
    return {&t, t.storage == Storage::device ? t.device_ptr : const_cast<std::byte*>(t.host.data())};
  }
  // Finds or fills the slot for `module`; nullptr when nothing needs copying (no GPU, or all resident).
  detail::FetchSlot* stage(std::string_view module, const std::vector<std::size_t>& members, bool for_prefetch) {
    if (!s_->execution_gpu) return nullptr;
    // A slot only ever holds a module that had offloaded tensors: a hit needs no other work.
    for (auto& slot : s_->slots)
      if (slot->module == module) return slot.get();
    std::vector<std::uint64_t> sizes;
    for (auto i : members)
      if (s_->tensors[i].storage != Storage::device) sizes.push_back(s_->tensors[i].size_bytes);
    if (sizes.empty()) return nullptr;
    const auto layout = arena_layout(sizes);
    if (layout.total > s_->slot_bytes)
      detail::throw_error<usage_error>("fetch('", module, "'): its offloaded tensors need ", layout.total,
                                       " bytes but each fetch buffer holds ", s_->slot_bytes,
                                       " (the largest offloaded layer); fetch its layers one at a time");
    detail::FetchSlot* slot = nullptr;
    for (auto& c : s_->slots)
      if (c->holds == 0 && (!slot || c->last_use < slot->last_use)) slot = c.get();
    if (!slot)
      detail::throw_error<usage_error>(for_prefetch ? "prefetch('" : "fetch('", module, "'): all ", s_->slots.size(),
                                       " fetch buffers are held by live FetchedModule objects; release one first "
                                       "(or load with more fetch_slots)");
    const int gpu = *s_->execution_gpu;
    auto& dev = *s_->devices[static_cast<std::size_t>(gpu)];
    auto& stager = *s_->stagers.at(gpu);
    if (slot->release_recorded) dev.stream_wait_event(stager.stream(), slot->released.get());
    slot->release_recorded = false;
    slot->module = std::string(module);
    slot->tensors.clear();
    slot->last_use = ++s_->clock;
    std::size_t k = 0;
    for (auto i : members) {
      auto& t = s_->tensors[i];
      if (t.storage == Storage::device) {
        slot->tensors.push_back(direct(i));
        continue;
      }
      auto* dst = static_cast<std::byte*>(slot->buffer.get()) + layout.offsets[k++];
      if (t.storage == Storage::host_pinned) dev.copy_to_device_async(dst, t.host.data(), t.size_bytes, stager.stream());
      else stager.copy(dst, t.host.data(), t.size_bytes, [](std::uint64_t) {});
      slot->tensors.push_back({&t, dst});
    }
    slot->ready.record(stager.stream());
    return slot;
  }

  std::unique_ptr<detail::ModelState> s_;
};

namespace detail {

inline std::string offload_fingerprint(const MappedFile& shard, std::uint64_t offset, const PlannedTensor& t) {
  return concat(shard.path().filename().string(), "@", offset, "+", t.stored_bytes, ":", safetensors_name(t.stored_dtype),
                ":size=", shard.size(), ":mtime=", shard.mtime_ns());
}

}  // namespace detail

/// @brief Loads a safetensors checkpoint onto the devices of a device map.
/// @param checkpoint a `.safetensors` file, a `*.safetensors.index.json`, or a folder holding them
/// @param map module/tensor → GPU index, "cpu" or "disk" (HF device map)
/// @param options dtype, keep-in-fp32, strictness, cpu memory kind, offload folder, devices, staging
/// @return the dispatched model
/// @throws accel::checkpoint_error for any invalid header/index (before any allocation), a file
///         that changes under the loader, or strict-mode missing/unexpected tensors
/// @throws accel::unavailable_error when the map names an absent GPU
/// @throws accel::cuda_error when a device runs out of memory (everything allocated is freed)
/// @throws accel::usage_error for unsupported dtype changes or a missing offload folder
/// @note blocking; draws a progress bar on stderr when it is a terminal and options.progress is set
/// @code
/// auto map = accel::DeviceMap::from_json(R"({"model.embed": 0, "model.layers": 0, "lm_head": "cpu"})");
/// auto model = accel::load_checkpoint_and_dispatch("ckpt/", map, {.dtype = accel::DType::F16});
/// const auto& w = model.at("model.layers.0.mlp.up_proj.weight");   // w.device_ptr on GPU 0
/// @endcode
[[nodiscard]] inline DispatchedModel load_checkpoint_and_dispatch(const std::filesystem::path& checkpoint,
                                                                 const DeviceMap& map, const LoadOptions& options = {}) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const Checkpoint ckpt = resolve_checkpoint(checkpoint);
  auto state = std::make_unique<detail::ModelState>();
  state->devices = options.devices ? *options.devices : cuda_device_memories();
  LoadPlan plan = plan_load(ckpt, map, options, state->devices.size());
  state->execution_gpu = plan.execution_gpu;
  for (const auto& f : ckpt.shard_files) state->shards.push_back(std::make_unique<detail::MappedFile>(f));
  for (std::size_t s = 0; s < ckpt.headers.size(); ++s)
    if (state->shards[s]->size() != ckpt.headers[s].file_size)
      detail::throw_error<checkpoint_error>("'", ckpt.shard_files[s].string(), "' changed size from ", ckpt.headers[s].file_size,
                                            " to ", state->shards[s]->size(), " bytes while loading; load it again");

  // 1. Every allocation, before reading anything: arenas, then fetch buffers.
  const DeviceMemoryPtr pinned_source =
      state->devices.empty() ? nullptr : state->devices[static_cast<std::size_t>(plan.execution_gpu.value_or(0))];
  std::vector<std::byte*> arena_base(plan.arenas.size(), nullptr);
  for (std::size_t a = 0; a < plan.arenas.size(); ++a) {
    const auto& ar = plan.arenas[a];
    if (ar.storage == Storage::device) {
      state->device_arenas.emplace_back(state->devices[static_cast<std::size_t>(ar.placement.index)], ar.bytes);
      arena_base[a] = static_cast<std::byte*>(state->device_arenas.back().get());
    } else if (ar.storage == Storage::host_pinned) {
      state->pinned_arenas.emplace_back(pinned_source, ar.bytes);
      arena_base[a] = state->pinned_arenas.back().data();
    } else {
      state->host_arenas.emplace_back(ar.bytes);
      arena_base[a] = state->host_arenas.back().data();
    }
  }
  if (plan.execution_gpu && plan.largest_offloaded_layer > 0) {
    auto dev = state->devices[static_cast<std::size_t>(*plan.execution_gpu)];
    state->slot_bytes = plan.largest_offloaded_layer;
    const int wanted = std::max(options.fetch_slots, 1);
    for (int i = 0; i < wanted; ++i) {
      auto slot = std::make_unique<detail::FetchSlot>();
      try {
        slot->buffer = DeviceBuffer(dev, state->slot_bytes);
      } catch (const cuda_error& e) {
        // The first buffer is required; later ones only let prefetch() overlap a copy with compute.
        // A plan made with accelerate's reserve (one largest layer) leaves room for one.
        if (i == 0 || e.code() != cuda_out_of_memory_code) throw;
        state->report.warnings.push_back(detail::concat(
            dev->name(), " has room for ", i, " of the ", wanted, " fetch buffers asked for (", state->slot_bytes,
            " bytes each), so prefetch() overlaps less; plan with PlanOptions::gpu_reserve_layers = ", wanted,
            " (accel plan --gpu-reserve-layers ", wanted, ") or lower the first GPU's budget"));
        break;
      }
      slot->ready = Event(dev);
      slot->released = Event(dev);
      state->slots.push_back(std::move(slot));
    }
  }
  auto stager_for = [&](int gpu) -> detail::Stager& {
    auto it = state->stagers.find(gpu);
    if (it != state->stagers.end()) return *it->second;
    auto dev = state->devices[static_cast<std::size_t>(gpu)];
    auto& stream = state->streams.emplace(gpu, Stream(dev)).first->second;
    return *state->stagers.emplace(gpu, std::make_unique<detail::Stager>(dev, stream.get(), options.staging_bytes,
                                                                          options.staging_buffers))
                .first->second;
  };
  if (plan.execution_gpu && !state->slots.empty()) (void)stager_for(*plan.execution_gpu);

  // 2. Copy in file order. Consecutive raw tensors bound for the same GPU share one staging read.
  std::uint64_t to_copy = 0;
  for (const auto& t : plan.tensors)
    if (t.storage != Storage::mmap_view) to_copy += t.stored_bytes;
  ProgressBar bar(to_copy, options.progress);
  auto progressed = [&](std::uint64_t n) {
    bar.add(n);
    state->report.bytes_copied += n;
    if (options.on_progress) options.on_progress(bar.done(), to_copy);
  };
  OffloadIndex offload_index, offload_written;
  if (!options.offload_folder.empty()) offload_index = read_offload_index(options.offload_folder);
  struct Run {
    int gpu = -1;
    std::size_t shard = 0;
    std::uint64_t begin = 0, end = 0;  // file range
    std::vector<std::pair<std::byte*, const PlannedTensor*>> parts;
  } run;
  auto flush = [&] {
    if (run.parts.empty()) return;
    auto& st = stager_for(run.gpu);
    std::byte* buf = st.acquire();
    const auto& shard = *state->shards[run.shard];
    detail::pread_exact(shard.fd(), {buf, static_cast<std::size_t>(run.end - run.begin)}, run.begin, shard.path());
    for (const auto& [dst, t] : run.parts)
      st.device()->copy_to_device_async(dst, buf + (ckpt.headers[run.shard].file_offset(ckpt.entry(t->location)) - run.begin),
                                        t->bytes, st.stream());
    st.submit();
    progressed(run.end - run.begin);
    run.parts.clear();
  };
  for (const auto& t : plan.tensors) {
    if (t.bytes == 0 && t.storage != Storage::offload_file) continue;  // empty tensors: nothing to copy
    const auto& shard = *state->shards[t.location.shard];
    const std::uint64_t offset = ckpt.headers[t.location.shard].file_offset(ckpt.entry(t.location));
    const std::byte* src = shard.data() + offset;
    std::byte* dst = t.arena < arena_base.size() ? arena_base[t.arena] + t.arena_offset : nullptr;
    if (t.storage == Storage::device && !t.converts()) {
      auto& st = stager_for(t.placement.index);
      if (!run.parts.empty() && (run.gpu != t.placement.index || run.shard != t.location.shard || run.end != offset ||
                                 run.end - run.begin + t.bytes > st.buffer_bytes()))
        flush();
      if (t.bytes > st.buffer_bytes()) {  // larger than a staging buffer: its own chunked reads
        for (std::uint64_t done = 0; done < t.bytes;) {
          const std::uint64_t n = std::min(t.bytes - done, st.buffer_bytes());
          std::byte* buf = st.acquire();
          detail::pread_exact(shard.fd(), {buf, static_cast<std::size_t>(n)}, offset + done, shard.path());
          st.device()->copy_to_device_async(dst + done, buf, n, st.stream());
          st.submit();
          progressed(n);
          done += n;
        }
        continue;
      }
      if (run.parts.empty()) run = {t.placement.index, t.location.shard, offset, offset, {}};
      run.parts.emplace_back(dst, &t);
      run.end = offset + t.bytes;
      continue;
    }
    flush();
    if (t.stored_bytes) shard.advise_sequential(offset, t.stored_bytes);
    if (t.storage == Storage::device) {
      stager_for(t.placement.index).convert(dst, src, t.stored_dtype, t.dtype, ckpt.entry(t.location).numel(), progressed);
    } else if (t.storage == Storage::host_pinned || t.storage == Storage::host_pageable) {
      if (t.converts()) {
        const std::uint64_t numel = ckpt.entry(t.location).numel(), chunk = std::uint64_t{8} << 20;
        const std::uint64_t in = element_size_bytes(t.stored_dtype), out = element_size_bytes(t.dtype);
        for (std::uint64_t done = 0; done < numel; done += chunk) {
          const std::uint64_t n = std::min(chunk, numel - done);
          convert_elements(t.stored_dtype, t.dtype, src + done * in, dst + done * out, n);
          progressed(n * in);
        }
      } else {
        for (std::uint64_t done = 0; done < t.bytes;) {
          const std::uint64_t n = std::min(t.bytes - done, std::uint64_t{64} << 20);
          detail::pread_exact(shard.fd(), {dst + done, static_cast<std::size_t>(n)}, offset + done, shard.path());
          progressed(n);
          done += n;
        }
      }
    } else if (t.storage == Storage::offload_file) {
      const auto source = detail::offload_fingerprint(shard, offset, t);
      if (offload_entry_reusable(options.offload_folder, offload_index, t.name, t.dtype, t.shape, source)) {
        ++state->report.offload_reused;
      } else {
        std::vector<std::byte> converted(static_cast<std::size_t>(t.bytes));
        convert_elements(t.stored_dtype, t.dtype, src, converted.data(), ckpt.entry(t.location).numel());
        offload_weight(options.offload_folder, t.name, t.dtype, t.shape, converted, offload_written, source);
        ++state->report.offload_written;
      }
      progressed(t.stored_bytes);
    }
  }
  flush();
  for (auto& [gpu, st] : state->stagers) st->drain();
  if (!offload_written.empty()) write_offload_index(options.offload_folder, offload_written);
  if (state->report.offload_written + state->report.offload_reused > 0)
    state->offload = std::make_unique<OffloadFolder>(options.offload_folder);

  // 3. Handles.
  state->tensors.reserve(plan.tensors.size());
  for (const auto& t : plan.tensors) {
    TensorHandle h{t.name, t.dtype, t.shape, t.bytes, t.placement, t.block, t.storage, nullptr, {}};
    const auto& shard = *state->shards[t.location.shard];
    const std::uint64_t offset = ckpt.headers[t.location.shard].file_offset(ckpt.entry(t.location));
    std::byte* base = t.arena < arena_base.size() ? arena_base[t.arena] + t.arena_offset : nullptr;
    switch (t.storage) {
      case Storage::device: h.device_ptr = base; break;
      case Storage::host_pinned:
      case Storage::host_pageable: h.host = {base, static_cast<std::size_t>(t.bytes)}; break;
      case Storage::mmap_view: h.host = shard.bytes().subspan(offset, static_cast<std::size_t>(t.bytes)); break;
      case Storage::offload_file: h.host = state->offload->view(t.name); break;
    }
    auto& totals = state->report.per_placement[t.placement];
    totals.bytes += t.bytes;
    ++totals.tensors;
    state->by_name.emplace(t.name, state->tensors.size());
    state->tensors.push_back(std::move(h));
  }
  for (const auto& [alias, source] : options.tied)
    if (!state->by_name.count(alias)) state->aliases.emplace(alias, source);
  bar.finish();
  auto& r = state->report;
  r.bytes_loaded = plan.total_bytes;
  r.unexpected = std::move(plan.unexpected);
  r.missing = std::move(plan.missing);
  r.unused_keys = std::move(plan.unused_keys);
  r.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return DispatchedModel(std::move(state));
}

ACCEL_NAMESPACE_END
