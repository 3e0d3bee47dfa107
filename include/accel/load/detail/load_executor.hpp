// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file load_executor.hpp
/// @brief Loader internals: carries out a LoadPlan. Read sources (map the shards), allocate every
///        arena and fetch buffer, then per tensor in file order read → convert → place (GPU through
///        the staging ring, host memory, or the offload folder), and build the DispatchedModel.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <accel/runtime/text.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/load/convert.hpp>
#include <accel/load/device_memory.hpp>
#include <accel/load/dispatched_model.hpp>
#include <accel/load/load_plan.hpp>
#include <accel/load/offload.hpp>
#include <accel/load/progress.hpp>
#include <accel/load/detail/mapped_file.hpp>
#include <accel/load/detail/offload_writer.hpp>
#include <accel/runtime/parallel_for.hpp>
#include <accel/load/detail/staging.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Where an offload-folder entry's bytes came from: the shard's name, identity (device,
///        inode), size, mtime and header hash, and the tensor's name, offset, size and stored
///        dtype. An entry is reused only when all of these and its own dtype and shape match.
inline std::string offload_fingerprint(const MappedFile& shard, std::uint64_t header_hash, const PlannedTensor& t) {
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(header_hash));
  return concat(shard.path().filename().string(), "#", t.name, "@", t.file_offset, "+", t.stored_bytes, ":",
                safetensors_name(t.stored_dtype), ":size=", shard.size(), ":mtime=", shard.mtime_ns(), ":inode=",
                shard.device_id(), ".", shard.inode(), ":header=", hash);
}

/// @brief Carries out one LoadPlan; run() is the whole sequence, each step once.
///
/// Everything allocated lives in the ModelState from the start, so a failure at any step frees it.
class LoadExecutor {
 public:
  using Clock = std::chrono::steady_clock;

  /// @param checkpoint the checkpoint the plan was made from
  /// @param plan from plan_load for these devices
  /// @param devices the GPUs (index i = GPU i)
  /// @param options the options the plan was made with
  /// @param start when the load began (LoadReport::seconds counts from here)
  LoadExecutor(const Checkpoint& checkpoint, LoadPlan plan, std::vector<DeviceMemoryPtr> devices, const LoadOptions& options,
               Clock::time_point start)
      : checkpoint_(checkpoint), plan_(std::move(plan)), options_(options), start_(start),
        state_(std::make_unique<ModelState>()) {
    state_->devices = std::move(devices);
    state_->execution_gpu = plan_.execution_gpu;
  }

  /// @brief Loads every planned tensor and returns the model.
  /// @throws as load_checkpoint_and_dispatch (everything allocated is freed)
  [[nodiscard]] DispatchedModel run() && {
    open_sources();
    allocate_arenas();
    allocate_fetch_buffers();
    copy_tensors();
    finish_offload_folder();
    make_handles();
    finish_report();
    return DispatchedModel(std::move(state_));
  }

 private:
  // Read sources: map every shard and check it is still the file whose header was validated.
  // Bytes are then read with pread, never through the mapping, so a file truncated during the
  // load is a checkpoint_error rather than a SIGBUS (only mmap views hand out the mapping).
  void open_sources() {
    for (const auto& f : checkpoint_.shard_files) state_->shards.push_back(std::make_unique<MappedFile>(f));
    for (std::size_t s = 0; s < checkpoint_.headers.size(); ++s)
      if (state_->shards[s]->size() != checkpoint_.headers[s].file_size)
        throw_error<checkpoint_error>("'", checkpoint_.shard_files[s].string(), "' changed size from ",
                                      checkpoint_.headers[s].file_size, " to ", state_->shards[s]->size(),
                                      " bytes while loading; load it again");
  }

  // A hash of each shard's header bytes as they are now (part of the offload fingerprint).
  std::uint64_t header_hash(std::size_t shard) {
    if (header_hashes_.empty()) {
      for (std::size_t s = 0; s < checkpoint_.headers.size(); ++s) {
        std::string bytes(static_cast<std::size_t>(checkpoint_.headers[s].data_offset), '\0');
        state_->shards[s]->read_exact({reinterpret_cast<std::byte*>(bytes.data()), bytes.size()}, 0);
        header_hashes_.push_back(text::fnv1a(bytes));
      }
    }
    return header_hashes_[shard];
  }

  // Every allocation comes before any read: one arena per planned block and storage kind.
  void allocate_arenas() {
    const DeviceMemoryPtr pinned_source =
        state_->devices.empty() ? nullptr : state_->devices[static_cast<std::size_t>(plan_.execution_gpu.value_or(0))];
    arena_base_.assign(plan_.arenas.size(), nullptr);
    for (std::size_t a = 0; a < plan_.arenas.size(); ++a) {
      const auto& ar = plan_.arenas[a];
      if (ar.storage == Storage::device) {
        state_->device_arenas.emplace_back(state_->devices[static_cast<std::size_t>(ar.placement.index)], ar.bytes);
        arena_base_[a] = static_cast<std::byte*>(state_->device_arenas.back().get());
      } else if (ar.storage == Storage::host_pinned) {
        state_->pinned_arenas.emplace_back(pinned_source, ar.bytes);
        arena_base_[a] = state_->pinned_arenas.back().data();
      } else {
        state_->host_arenas.emplace_back(ar.bytes);
        arena_base_[a] = state_->host_arenas.back().data();
      }
    }
  }

  // Fetch buffers on the execution GPU, each the size of the largest offloaded layer: as many as the
  // plan kept room for (LoadOptions::execution), else fetch_slots.
  void allocate_fetch_buffers() {
    state_->row_read.insert(options_.row_read_tensors.begin(), options_.row_read_tensors.end());
    if (!plan_.execution_gpu) return;
    // read_rows() copies through the execution GPU's staging ring, which may hold no weight.
    if (!state_->row_read.empty()) (void)stager(*plan_.execution_gpu);
    if (plan_.largest_offloaded_layer == 0 || plan_.fetch_slots == 0) return;
    auto dev = state_->devices[static_cast<std::size_t>(*plan_.execution_gpu)];
    state_->slot_bytes = plan_.largest_offloaded_layer;
    const int wanted = plan_.fetch_slots;
    if (const int asked = std::max(options_.fetch_slots, 1); options_.execution && wanted < asked)
      state_->report.warnings.push_back(concat("the plan kept room for ", wanted, " of the ", asked, " fetch buffers asked for on ",
                                               dev->name(), " ('", plan_.largest_offloaded_unit, "', ", state_->slot_bytes,
                                               " bytes each), so prefetch() overlaps less; raise a GPU's budget to keep "
                                               "room for all"));
    for (int i = 0; i < wanted; ++i) {
      auto slot = std::make_unique<FetchSlot>();
      try {
        slot->buffer = DeviceBuffer(dev, state_->slot_bytes);
      } catch (const cuda_error& e) {
        // The first buffer is required; later ones only let prefetch() overlap a copy with compute.
        // A plan made with accelerate's reserve (one largest layer) leaves room for one.
        if (i == 0 || e.code() != cuda_out_of_memory_code) throw;
        state_->report.warnings.push_back(concat(
            dev->name(), " has room for ", i, " of the ", wanted, " fetch buffers asked for (", state_->slot_bytes,
            " bytes each), so prefetch() overlaps less; plan with PlanOptions::gpu_reserve_layers = ", wanted,
            " (accel plan --gpu-reserve-layers ", wanted, ") or lower the first GPU's budget"));
        break;
      }
      slot->ready = Event(dev);
      slot->released = Event(dev);
      state_->slots.push_back(std::move(slot));
    }
    if (!state_->slots.empty()) (void)stager(*plan_.execution_gpu);  // fetch() copies through it
  }

  // Read → convert → place, in file order. Consecutive raw tensors bound for one GPU share a read;
  // consecutive host tensors are read (and converted) by several threads at once.
  void copy_tensors() {
    std::uint64_t to_copy = 0;
    for (const auto& t : plan_.tensors)
      if (t.storage != Storage::mmap_view) to_copy += t.stored_bytes;
    bar_.emplace(to_copy, options_.progress);
    to_copy_ = to_copy;
    prepare_offload_folder();
    for (const auto& t : plan_.tensors) {
      if (t.bytes && (t.storage == Storage::host_pageable || t.storage == Storage::host_pinned)) {
        queue_host_copy(t);
        continue;
      }
      flush_host_copies();
      copy_tensor(t);
    }
    flush_host_copies();
    flush_run();
    for (auto& [gpu, st] : state_->stagers) st->drain();
  }

  // A host tensor's file bytes in pieces of at most 8 MiB, the unit a copy thread takes at a time.
  void queue_host_copy(const PlannedTensor& t) {
    const std::uint64_t piece = std::max<std::uint64_t>(host_piece_bytes / element_size_bytes(t.stored_dtype), 1);
    for_each_chunk(t.numel(), piece, [&](std::uint64_t at, std::uint64_t n) { host_pieces_.push_back({&t, at, n}); });
  }

  // Reads the queued pieces straight into their tensors' host memory with pread on several
  // threads, converting on the way when the dtype changes: a fresh page's first-touch fault and
  // zeroing then run on every thread instead of one, which is what bounds a load into new memory.
  void flush_host_copies() {
    if (host_pieces_.empty()) return;
    flush_run();
    const unsigned threads = copy_threads(options_.host_threads, host_pieces_.size());
    if (host_scratch_.size() < threads) host_scratch_.resize(threads);
    parallel_for(
        host_pieces_.size(), threads,
        [&](std::size_t i, unsigned worker) {
          const auto& [t, first, count] = host_pieces_[i];
          const MappedFile& file = source(*t);
          const std::uint64_t in_size = element_size_bytes(t->stored_dtype), out_size = element_size_bytes(t->dtype);
          const std::uint64_t offset = t->file_offset + first * in_size, bytes = count * in_size;
          file.advise_sequential(offset, bytes);
          std::byte* out = destination(*t) + first * out_size;
          if (t->converts()) read_converted(file, offset, t->stored_dtype, t->dtype, count, out, host_scratch_[worker]);
          else file.read_exact({out, static_cast<std::size_t>(bytes)}, offset);
          return bytes;
        },
        [&](std::uint64_t n) { progressed(n); });
    host_pieces_.clear();
  }

  void copy_tensor(const PlannedTensor& t) {
    if (t.bytes == 0 && t.storage != Storage::offload_file) return;  // empty tensors: nothing to copy
    if (t.storage == Storage::device && !t.converts()) {
      read_to_device(t);
      return;
    }
    flush_run();
    if (t.stored_bytes) source(t).advise_sequential(t.file_offset, t.stored_bytes);
    switch (t.storage) {
      case Storage::device: convert_to_device(t); break;
      case Storage::host_pinned:
      case Storage::host_pageable: break;  // copy_tensors queues these for flush_host_copies
      case Storage::offload_file: write_to_offload_folder(t); break;
      case Storage::mmap_view: break;  // a view of the shard: the readahead above is all it needs
    }
  }

  // A raw GPU tensor joins the pending run when it continues it in the file and fits a staging
  // buffer; one larger than a buffer is read in chunks of its own.
  void read_to_device(const PlannedTensor& t) {
    auto& st = stager(t.placement.index);
    if (!run_.parts.empty() && (run_.gpu != t.placement.index || run_.shard != t.location.shard ||
                                run_.end != t.file_offset || run_.end - run_.begin + t.bytes > st.buffer_bytes()))
      flush_run();
    if (t.bytes > st.buffer_bytes()) {
      st.read(destination(t), source(t), t.file_offset, t.bytes, progress());
      return;
    }
    if (run_.parts.empty()) run_ = {t.placement.index, t.location.shard, t.file_offset, t.file_offset, {}};
    run_.parts.emplace_back(destination(t), &t);
    run_.end = t.file_offset + t.bytes;
  }

  // One read of the run's file range into a staging buffer, one copy per tensor out of it.
  void flush_run() {
    if (run_.parts.empty()) return;
    auto& st = stager(run_.gpu);
    std::byte* buf = st.acquire();
    state_->shards[run_.shard]->read_exact({buf, static_cast<std::size_t>(run_.end - run_.begin)}, run_.begin);
    for (const auto& [dst, t] : run_.parts)
      st.device()->copy_to_device_async(dst, buf + (t->file_offset - run_.begin), t->bytes, st.stream());
    st.submit();
    progressed(run_.end - run_.begin);
    run_.parts.clear();
  }

  void convert_to_device(const PlannedTensor& t) {
    stager(t.placement.index).convert(destination(t), source(t), t.file_offset, t.stored_dtype, t.dtype, t.numel(), progress());
  }

  // Converts `t` into `out` (t.bytes long), reading the file with pread in 8 MiB chunks (one
  // progress report each).
  void convert_from_file(const PlannedTensor& t, std::byte* out) {
    const std::uint64_t in_size = element_size_bytes(t.stored_dtype), out_size = element_size_bytes(t.dtype);
    const std::uint64_t chunk = std::max<std::uint64_t>((std::uint64_t{8} << 20) / in_size, 1);
    for_each_chunk(t.numel(), chunk, [&](std::uint64_t at, std::uint64_t n) {
      read_converted(source(t), t.file_offset + at * in_size, t.stored_dtype, t.dtype, n, out + at * out_size, scratch_);
      progressed(n * in_size);
    });
  }

  // The folder's requests (what every offloaded tensor should be stored as, and from where),
  // decided before any byte is copied: reuse, or drop from the index and rewrite.
  void prepare_offload_folder() {
    for (std::size_t i = 0; i < plan_.tensors.size(); ++i) {
      const auto& t = plan_.tensors[i];
      if (t.storage != Storage::offload_file) continue;
      offload_requests_.emplace(i, OffloadRequest{t.name, OffloadEntry{t.dtype, t.shape,
                                                                       offload_fingerprint(source(t), header_hash(t.location.shard), t),
                                                                       {}, {}}});
    }
    if (offload_requests_.empty()) return;
    offload_.emplace(options_.offload_folder);
    std::vector<OffloadRequest> requests;
    for (const auto& [i, r] : offload_requests_) requests.push_back(r);
    offload_->prepare(requests);
    if (const auto n = offload_->cleared().temporaries)
      state_->report.warnings.push_back(concat("removed ", text::plural(static_cast<long long>(n), "temporary file"),
                                               " left in offload folder '", options_.offload_folder.string(),
                                               "' by an interrupted load"));
    if (auto warning = offload_->cleared().links_warning(options_.offload_folder); !warning.empty())
      state_->report.warnings.push_back(std::move(warning));
  }

  void write_to_offload_folder(const PlannedTensor& t) {
    const auto& request = offload_requests_.at(static_cast<std::size_t>(&t - plan_.tensors.data()));
    if (offload_->reusable(t.name)) {
      ++state_->report.offload_reused;
      progressed(t.stored_bytes);
      return;
    }
    std::vector<std::byte> converted(static_cast<std::size_t>(t.bytes));
    convert_from_file(t, converted.data());
    offload_->write(request, converted);
    ++state_->report.offload_written;
  }

  void finish_offload_folder() {
    if (!offload_) return;
    const bool used = state_->report.offload_written + state_->report.offload_reused > 0;
    state_->offload = std::move(*offload_).finish(used);
  }

  // One handle per planned tensor, pointing where copy_tensors() put its bytes.
  void make_handles() {
    state_->tensors.reserve(plan_.tensors.size());
    state_->shard_spans.reserve(plan_.tensors.size());
    for (const auto& t : plan_.tensors) {
      TensorHandle h{t.name, t.dtype, t.shape, t.bytes, t.placement, t.block, t.storage, nullptr, {}};
      switch (t.storage) {
        case Storage::device: h.device_ptr = destination(t); break;
        case Storage::host_pinned:
        case Storage::host_pageable: h.host = {destination(t), static_cast<std::size_t>(t.bytes)}; break;
        case Storage::mmap_view: h.host = source(t).bytes().subspan(t.file_offset, static_cast<std::size_t>(t.bytes)); break;
        case Storage::offload_file: h.host = state_->offload->view(t.name); break;
      }
      auto& totals = state_->report.per_placement[t.placement];
      totals.bytes += t.bytes;
      ++totals.tensors;
      state_->by_name.emplace(t.name, state_->tensors.size());
      state_->tensors.push_back(std::move(h));
      state_->shard_spans.push_back({t.location.shard, t.file_offset});
    }
    for (const auto& [alias, target] : options_.tied)
      if (!state_->by_name.count(alias)) state_->aliases.emplace(alias, target);
  }

  void finish_report() {
    bar_->finish();
    auto& r = state_->report;
    r.bytes_loaded = plan_.total_bytes;
    r.unexpected = std::move(plan_.unexpected);
    r.missing = std::move(plan_.missing);
    r.unused_keys = std::move(plan_.unused_keys);
    r.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  }

  // The staging ring (and its stream) of one GPU, made on first use.
  Stager& stager(int gpu) {
    if (auto it = state_->stagers.find(gpu); it != state_->stagers.end()) return *it->second;
    auto dev = state_->devices[static_cast<std::size_t>(gpu)];
    auto& stream = state_->streams.emplace(gpu, Stream(dev)).first->second;
    auto ring = std::make_unique<Stager>(dev, stream.get(), options_.staging_bytes, options_.staging_buffers);
    return *state_->stagers.emplace(gpu, std::move(ring)).first->second;
  }
  const MappedFile& source(const PlannedTensor& t) const { return *state_->shards[t.location.shard]; }
  std::byte* destination(const PlannedTensor& t) const {
    return t.arena < arena_base_.size() ? arena_base_[t.arena] + t.arena_offset : nullptr;
  }
  void progressed(std::uint64_t n) {
    bar_->add(n);
    state_->report.bytes_copied += n;
    if (options_.on_progress) options_.on_progress(bar_->done(), to_copy_);
  }
  // What the staging loops report each chunk's source bytes to.
  struct Progress {
    LoadExecutor* self;
    void operator()(std::uint64_t n) const { self->progressed(n); }
  };
  Progress progress() { return {this}; }

  // Part of a host tensor waiting for flush_host_copies: `count` elements from element `first`.
  struct HostPiece {
    const PlannedTensor* tensor;
    std::uint64_t first, count;
  };
  static constexpr std::uint64_t host_piece_bytes = std::uint64_t{8} << 20;

  // Raw GPU tensors adjacent in one shard, waiting to be read together.
  struct Run {
    int gpu = -1;
    std::size_t shard = 0;
    std::uint64_t begin = 0, end = 0;  // file range
    std::vector<std::pair<std::byte*, const PlannedTensor*>> parts;
  };

  const Checkpoint& checkpoint_;
  LoadPlan plan_;
  const LoadOptions& options_;
  Clock::time_point start_;
  std::unique_ptr<ModelState> state_;
  std::vector<std::byte*> arena_base_;
  std::optional<ProgressBar> bar_;
  std::uint64_t to_copy_ = 0;
  std::optional<OffloadFolderWriter> offload_;
  std::map<std::size_t, OffloadRequest> offload_requests_;  // by index into plan_.tensors
  std::vector<std::uint64_t> header_hashes_;
  std::vector<std::byte> scratch_;                         // file bytes read for a conversion
  std::vector<HostPiece> host_pieces_;
  std::vector<std::vector<std::byte>> host_scratch_;       // per copy thread, for conversions
  Run run_;
};

}  // namespace detail
ACCEL_NAMESPACE_END
