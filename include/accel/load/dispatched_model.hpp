// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file dispatched_model.hpp
/// @brief What load_checkpoint_and_dispatch returns: DispatchedModel (every tensor's location, the
///        load report) with fetch/prefetch of offloaded blocks into fetch buffers on the execution GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/model/dtype.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/load/device_memory.hpp>
#include <accel/load/load_plan.hpp>
#include <accel/load/offload.hpp>
#include <accel/load/detail/mapped_file.hpp>
#include <accel/load/detail/staging.hpp>

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
  // Per tensor: for a view into a shard (Storage::mmap_view), the shard and file offset, which
  // fetch() reads with pread, so a shard truncated after loading is an error, not a SIGBUS.
  struct ShardSpan {
    std::size_t shard = 0;
    std::uint64_t offset = 0;
  };
  std::vector<ShardSpan> shard_spans;
  std::unordered_map<std::string, std::size_t> by_name;
  std::unordered_map<std::string, std::string> aliases;
  std::unordered_map<std::string, std::vector<std::size_t>> module_cache;
  std::unordered_set<std::string> row_read;  // LoadOptions::row_read_tensors: not in the fetch buffers' size
  std::optional<int> execution_gpu;
  std::unique_ptr<Event> rows_ready;  // read_rows' copies, recorded on the execution GPU's staging stream
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
  /// @brief The GPU fetch() copies to (the plan's execution GPU, LoadOptions::execution; without a
  ///        plan the lowest GPU in the map), or nullopt (no GPU holds weights: host pointers).
  [[nodiscard]] std::optional<int> execution_device() const noexcept { return s_->execution_gpu; }
  /// @brief Size of each fetch buffer (the largest offloaded layer, see detail::fetch_unit).
  [[nodiscard]] std::uint64_t fetch_buffer_bytes() const noexcept { return s_->slot_bytes; }
  /// @brief Number of fetch buffers (the plan's ExecutionPlan::fetch_slots, else LoadOptions::fetch_slots;
  /// fewer when the device had no room: see LoadReport::warnings).
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

  /// @brief Copies rows of a host-resident (cpu or disk) tensor to the execution device: what an
  ///        input embedding left off the GPUs costs a forward pass is the rows of its token ids, not
  ///        the table.
  /// @param tensor the tensor's name (tied aliases resolve); its first dimension indexes the rows
  /// @param rows row indexes, any order, repeats allowed; row `rows[k]` lands at `dst + k × row bytes`
  /// @param dst `rows.size()` × row bytes (TensorHandle::size_bytes / shape[0]) on the execution
  ///        device, or host memory when there is none (execution_device() is nullopt)
  /// @param stream as fetch(): the compute stream is made to wait for the copies (the host does not
  ///        block); nullptr: the host waits until they are done
  /// @throws accel::usage_error naming the tensor when it is not loaded, is a scalar, or lives on a
  ///         GPU (index it there), or naming the first row out of range (before anything is copied)
  /// @throws accel::checkpoint_error when a disk tensor's shard shrank after loading
  /// @note rows are gathered on the host into pinned staging buffers and copied in as few transfers
  ///       as those buffers allow; not thread-safe (shares fetch's staging)
  /// @code
  /// std::vector<std::int64_t> ids{1, 15043, 29871};
  /// model.read_rows("model.embed_tokens.weight", ids, hidden_states, stream);
  /// @endcode
  void read_rows(std::string_view tensor, std::span<const std::int64_t> rows, void* dst, StreamHandle stream = nullptr) {
    const TensorHandle& t = at(tensor);
    if (t.shape.empty())
      detail::throw_error<usage_error>("read_rows('", tensor, "'): the tensor is a scalar; it has no rows");
    if (t.storage == Storage::device)
      detail::throw_error<usage_error>("read_rows('", tensor, "'): the tensor lives on GPU ", t.placement.index,
                                       "; read its rows there (TensorHandle::device_ptr) instead");
    const auto count = static_cast<std::uint64_t>(t.shape[0]);
    for (const auto r : rows)
      if (r < 0 || static_cast<std::uint64_t>(r) >= count)
        detail::throw_error<usage_error>("read_rows('", tensor, "'): row ", r, " is out of range (the tensor has ",
                                         count, " rows)");
    const std::uint64_t row_bytes = count ? t.size_bytes / count : 0;
    const auto index = static_cast<std::size_t>(&t - s_->tensors.data());
    // Bytes [from, from + n) of row r into out: from the shard with pread for a disk view (a shrunken
    // file is an error, not a SIGBUS), else from the tensor's host memory.
    auto copy_row = [&](std::int64_t r, std::uint64_t from, std::uint64_t n, std::byte* out) {
      const std::uint64_t at = static_cast<std::uint64_t>(r) * row_bytes + from;
      if (t.storage == Storage::mmap_view && index < s_->shard_spans.size()) {
        const auto& span = s_->shard_spans[index];
        s_->shards[span.shard]->read_exact({out, static_cast<std::size_t>(n)}, span.offset + at);
      } else {
        std::memcpy(out, t.host.data() + at, n);
      }
    };
    auto* out = static_cast<std::byte*>(dst);
    if (!s_->execution_gpu) {
      for (std::size_t k = 0; k < rows.size(); ++k) copy_row(rows[k], 0, row_bytes, out + k * row_bytes);
      return;
    }
    const int gpu = *s_->execution_gpu;
    auto& stager = *s_->stagers.at(gpu);
    if (row_bytes > 0 && row_bytes <= stager.buffer_bytes()) {
      // Whole rows gathered into each staging buffer: one transfer per buffer, not per row.
      stager.stage(dst, rows.size() * row_bytes, row_bytes, [&](std::byte* buf, std::uint64_t at, std::uint64_t n) {
        for (std::uint64_t k = 0; k < n / row_bytes; ++k)
          copy_row(rows[static_cast<std::size_t>(at / row_bytes + k)], 0, row_bytes, buf + k * row_bytes);
        return n;
      }, [](std::uint64_t) {});
    } else {
      for (std::size_t k = 0; k < rows.size() && row_bytes > 0; ++k)  // rows larger than a staging buffer
        stager.stage(out + k * row_bytes, row_bytes, 1, [&](std::byte* buf, std::uint64_t at, std::uint64_t n) {
          copy_row(rows[k], at, n, buf);
          return n;
        }, [](std::uint64_t) {});
    }
    if (!s_->rows_ready) s_->rows_ready = std::make_unique<Event>(s_->devices[static_cast<std::size_t>(gpu)]);
    s_->rows_ready->record(stager.stream());
    if (stream) s_->devices[static_cast<std::size_t>(gpu)]->stream_wait_event(stream, s_->rows_ready->get());
    else s_->rows_ready->wait();
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
    if (layout.total > s_->slot_bytes) {
      for (auto i : members)
        if (s_->row_read.count(s_->tensors[i].name))
          detail::throw_error<usage_error>("fetch('", module, "'): '", s_->tensors[i].name, "' was loaded to be read by rows "
                                           "(LoadOptions::row_read_tensors), so no fetch buffer holds it whole; use "
                                           "read_rows, or load without listing it");
      detail::throw_error<usage_error>("fetch('", module, "'): its offloaded tensors need ", layout.total,
                                       " bytes but each fetch buffer holds ", s_->slot_bytes,
                                       " (the largest offloaded layer); fetch its layers one at a time");
    }
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
      if (t.storage == Storage::host_pinned) {
        dev.copy_to_device_async(dst, t.host.data(), t.size_bytes, stager.stream());
      } else if (t.storage == Storage::mmap_view && i < s_->shard_spans.size()) {
        const auto& span = s_->shard_spans[i];
        stager.read(dst, *s_->shards[span.shard], span.offset, t.size_bytes, [](std::uint64_t) {});
      } else {
        stager.copy(dst, t.host.data(), t.size_bytes, [](std::uint64_t) {});
      }
      slot->tensors.push_back({&t, dst});
    }
    slot->ready.record(stager.stream());
    return slot;
  }

  std::unique_ptr<detail::ModelState> s_;
};

ACCEL_NAMESPACE_END
