// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file device_memory.hpp
/// @brief The device-memory seam: allocate/free, pinned host memory, streams, events and
///        asynchronous host↔device copies, with a CUDA implementation and a host-simulated device
///        (capacity-limited, copies deferred until synchronised) for tests and CPU-only runs.
///
/// Everything that moves weights (the load executor and DispatchedModel) goes through
/// `DeviceMemory`, so the whole loader, including double-buffered staging and fetch/prefetch, runs
/// in CI against `HostSimulatedDevice`.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/cuda.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Opaque stream handle (a `cudaStream_t` for CUDA, an id for the simulated device).
using StreamHandle = void*;
/// @brief Opaque event handle (a `cudaEvent_t` for CUDA).
using EventHandle = void*;

/// @brief Free and total bytes of one device.
struct MemoryInfo {
  std::uint64_t free_bytes = 0;   ///< bytes still allocatable
  std::uint64_t total_bytes = 0;  ///< capacity
};

/// @brief cudaErrorMemoryAllocation's value: the `code()` of every out-of-memory cuda_error.
inline constexpr int cuda_out_of_memory_code = 2;

/// @brief One GPU (or a simulated one) as the loader sees it.
///
/// Pointers returned by allocate() are device pointers; allocate_pinned() returns page-locked host
/// memory usable as the source/target of asynchronous copies. Copies are asynchronous on a stream;
/// record_event/wait_event order the host against them.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  /// @brief "cuda:0", or "cuda:0 (host-simulated)".
  [[nodiscard]] virtual std::string name() const = 0;
  /// @brief The logical GPU index.
  [[nodiscard]] virtual int index() const noexcept = 0;
  /// @brief True when device pointers are host memory (the simulated device): tests read them directly.
  [[nodiscard]] virtual bool host_accessible() const noexcept = 0;
  /// @brief Free and total memory now.
  /// @throws accel::cuda_error when the query fails
  [[nodiscard]] virtual MemoryInfo memory_info() = 0;
  /// @brief Allocates `bytes` of device memory (256-byte aligned).
  /// @throws accel::cuda_error (code cuda_out_of_memory_code) naming the device, the requested,
  ///         free and total bytes when it does not fit
  [[nodiscard]] virtual void* allocate(std::uint64_t bytes) = 0;
  /// @brief Frees memory from allocate(); never throws (failures are logged).
  virtual void deallocate(void* ptr, std::uint64_t bytes) noexcept = 0;
  /// @brief Allocates page-locked host memory for asynchronous copies.
  /// @throws accel::cuda_error when the host cannot pin that much
  [[nodiscard]] virtual void* allocate_pinned(std::uint64_t bytes) = 0;
  /// @brief Frees memory from allocate_pinned().
  virtual void deallocate_pinned(void* ptr, std::uint64_t bytes) noexcept = 0;
  /// @brief A new non-blocking stream.
  [[nodiscard]] virtual StreamHandle create_stream() = 0;
  /// @brief Destroys a stream from create_stream().
  virtual void destroy_stream(StreamHandle stream) noexcept = 0;
  /// @brief A new event (timing disabled).
  [[nodiscard]] virtual EventHandle create_event() = 0;
  /// @brief Destroys an event from create_event().
  virtual void destroy_event(EventHandle event) noexcept = 0;
  /// @brief Enqueues a host→device copy; `src` must stay unchanged until the copy completes.
  virtual void copy_to_device_async(void* dst, const void* src, std::uint64_t bytes, StreamHandle stream) = 0;
  /// @brief Enqueues a device→host copy.
  virtual void copy_to_host_async(void* dst, const void* src, std::uint64_t bytes, StreamHandle stream) = 0;
  /// @brief Marks the current end of `stream`'s work.
  virtual void record_event(EventHandle event, StreamHandle stream) = 0;
  /// @brief Blocks the host until the work before the event's record point is done.
  /// @note blocking
  virtual void wait_event(EventHandle event) = 0;
  /// @brief Makes later work on `stream` wait for the event (the host does not block).
  virtual void stream_wait_event(StreamHandle stream, EventHandle event) = 0;
  /// @brief Blocks the host until all work on `stream` is done.
  /// @note blocking
  virtual void synchronize(StreamHandle stream) = 0;
};

/// @brief Shared handle to a device (the loader and the model keep it alive).
using DeviceMemoryPtr = std::shared_ptr<DeviceMemory>;

namespace detail {
[[noreturn]] inline void throw_out_of_memory(const std::string& device, std::uint64_t requested, MemoryInfo info,
                                             std::string_view what = "device memory") {
  throw cuda_error(cuda_out_of_memory_code,
                   concat("out of ", what, " on ", device, ": requested ", requested, " bytes, ", info.free_bytes,
                          " free of ", info.total_bytes, " capacity; give this device less in the device map or "
                          "max_memory, or offload more to cpu/disk"));
}
}  // namespace detail

/// @name RAII owners
///@{

/// @brief Owns one device allocation (freed on destruction).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// @brief Allocates `bytes` on `device`.
  /// @throws accel::cuda_error when out of memory
  DeviceBuffer(DeviceMemoryPtr device, std::uint64_t bytes) : device_(std::move(device)), bytes_(bytes) {
    if (bytes_) ptr_ = device_->allocate(bytes_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer(std::move(o)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) device_->deallocate(ptr_, bytes_);
  }
  /// @brief The device pointer (nullptr when empty).
  [[nodiscard]] void* get() const noexcept { return ptr_; }
  /// @brief Size in bytes.
  [[nodiscard]] std::uint64_t size() const noexcept { return bytes_; }
  /// @brief The owning device.
  [[nodiscard]] const DeviceMemoryPtr& device() const noexcept { return device_; }
  void swap(DeviceBuffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }

 private:
  DeviceMemoryPtr device_;
  void* ptr_ = nullptr;
  std::uint64_t bytes_ = 0;
};

/// @brief Owns one pinned host allocation.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  /// @throws accel::cuda_error when the host cannot pin the memory
  PinnedBuffer(DeviceMemoryPtr device, std::uint64_t bytes) : device_(std::move(device)), bytes_(bytes) {
    if (bytes_) ptr_ = static_cast<std::byte*>(device_->allocate_pinned(bytes_));
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept { swap(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    PinnedBuffer(std::move(o)).swap(*this);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_) device_->deallocate_pinned(ptr_, bytes_);
  }
  [[nodiscard]] std::byte* data() const noexcept { return ptr_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return bytes_; }
  void swap(PinnedBuffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }

 private:
  DeviceMemoryPtr device_;
  std::byte* ptr_ = nullptr;
  std::uint64_t bytes_ = 0;
};

/// @brief Owns a stream.
class Stream {
 public:
  Stream() = default;
  explicit Stream(DeviceMemoryPtr device) : device_(std::move(device)), handle_(device_->create_stream()) {}
  Stream(Stream&& o) noexcept : device_(std::move(o.device_)), handle_(std::exchange(o.handle_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    Stream(std::move(o)).swap(*this);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (handle_) device_->destroy_stream(handle_);
  }
  [[nodiscard]] StreamHandle get() const noexcept { return handle_; }
  void swap(Stream& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(handle_, o.handle_);
  }

 private:
  DeviceMemoryPtr device_;
  StreamHandle handle_ = nullptr;
};

/// @brief Owns an event.
class Event {
 public:
  Event() = default;
  explicit Event(DeviceMemoryPtr device) : device_(std::move(device)), handle_(device_->create_event()) {}
  Event(Event&& o) noexcept : device_(std::move(o.device_)), handle_(std::exchange(o.handle_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    Event(std::move(o)).swap(*this);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (handle_) device_->destroy_event(handle_);
  }
  [[nodiscard]] EventHandle get() const noexcept { return handle_; }
  /// @brief Records on `stream`.
  void record(StreamHandle stream) { device_->record_event(handle_, stream); }
  /// @brief Blocks until the recorded work is done. @note blocking
  void wait() { device_->wait_event(handle_); }
  void swap(Event& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(handle_, o.handle_);
  }

 private:
  DeviceMemoryPtr device_;
  EventHandle handle_ = nullptr;
};
///@}

/// @brief Offsets of tensors packed into one allocation, each aligned.
struct ArenaLayout {
  std::vector<std::uint64_t> offsets;  ///< parallel to the input sizes
  std::uint64_t total = 0;             ///< bytes to allocate
};

/// @brief Packs `sizes` in order, each non-empty one at a multiple of `alignment` (a power of two).
[[nodiscard]] inline ArenaLayout arena_layout(const std::vector<std::uint64_t>& sizes, std::uint64_t alignment = 256) {
  ArenaLayout l;
  l.offsets.reserve(sizes.size());
  for (auto s : sizes) {
    if (s == 0) {  // empty tensors take no room (and no padding)
      l.offsets.push_back(l.total);
      continue;
    }
    l.total = (l.total + alignment - 1) & ~(alignment - 1);
    l.offsets.push_back(l.total);
    l.total += s;
  }
  return l;
}

/// @brief The host-simulated device: "device" memory is host memory with a capacity limit and
///        live-byte counters; copies are queued per stream and executed only when an event or the
///        stream is waited on, so code that reuses a staging buffer too early reads wrong data in
///        tests exactly as it would on a GPU.
class HostSimulatedDevice final : public DeviceMemory {
 public:
  /// @param index the GPU index it stands for
  /// @param capacity bytes of "device" memory
  /// @param deferred_copies queue copies until synchronised (true) or copy immediately
  explicit HostSimulatedDevice(int index, std::uint64_t capacity, bool deferred_copies = true)
      : index_(index), capacity_(capacity), deferred_(deferred_copies) {}
  ~HostSimulatedDevice() override {
    for (auto& [p, n] : live_) ::operator delete(reinterpret_cast<void*>(p), std::align_val_t{256});
  }

  [[nodiscard]] std::string name() const override { return detail::concat("cuda:", index_, " (host-simulated)"); }
  [[nodiscard]] int index() const noexcept override { return index_; }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }
  [[nodiscard]] MemoryInfo memory_info() override {
    std::lock_guard lock(mutex_);
    return {capacity_ - live_bytes_, capacity_};
  }
  [[nodiscard]] void* allocate(std::uint64_t bytes) override {
    std::lock_guard lock(mutex_);
    if (bytes > capacity_ - live_bytes_) detail::throw_out_of_memory(name(), bytes, {capacity_ - live_bytes_, capacity_});
    void* p = ::operator new(std::max<std::uint64_t>(bytes, 1), std::align_val_t{256});
    live_.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
    live_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
    ++allocations_;
    return p;
  }
  void deallocate(void* ptr, std::uint64_t bytes) noexcept override {
    std::lock_guard lock(mutex_);
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == live_.end() || it->second != bytes) {
      ++bad_frees_;
      return;
    }
    live_bytes_ -= bytes;
    live_.erase(it);
    ::operator delete(ptr, std::align_val_t{256});
  }
  [[nodiscard]] void* allocate_pinned(std::uint64_t bytes) override {
    std::lock_guard lock(mutex_);
    void* p = ::operator new(std::max<std::uint64_t>(bytes, 1), std::align_val_t{4096});
    live_pinned_bytes_ += bytes;
    return p;
  }
  void deallocate_pinned(void* ptr, std::uint64_t bytes) noexcept override {
    std::lock_guard lock(mutex_);
    live_pinned_bytes_ -= bytes;
    ::operator delete(ptr, std::align_val_t{4096});
  }
  [[nodiscard]] StreamHandle create_stream() override {
    std::lock_guard lock(mutex_);
    auto s = std::make_unique<SimStream>();
    StreamHandle h = s.get();
    streams_.push_back(std::move(s));
    return h;
  }
  void destroy_stream(StreamHandle stream) noexcept override {
    std::lock_guard lock(mutex_);
    auto* s = static_cast<SimStream*>(stream);
    run_until(*s, s->executed + s->pending.size());
    std::erase_if(streams_, [&](const auto& p) { return p.get() == s; });
  }
  [[nodiscard]] EventHandle create_event() override {
    std::lock_guard lock(mutex_);
    auto e = std::make_unique<SimEvent>();
    EventHandle h = e.get();
    events_.push_back(std::move(e));
    return h;
  }
  void destroy_event(EventHandle event) noexcept override {
    std::lock_guard lock(mutex_);
    std::erase_if(events_, [&](const auto& p) { return p.get() == event; });
  }
  void copy_to_device_async(void* dst, const void* src, std::uint64_t bytes, StreamHandle stream) override {
    enqueue(dst, src, bytes, stream, true);
  }
  void copy_to_host_async(void* dst, const void* src, std::uint64_t bytes, StreamHandle stream) override {
    enqueue(dst, src, bytes, stream, false);
  }
  void record_event(EventHandle event, StreamHandle stream) override {
    std::lock_guard lock(mutex_);
    auto* e = static_cast<SimEvent*>(event);
    auto* s = static_cast<SimStream*>(stream);
    e->stream = s;
    e->position = s->executed + s->pending.size();
  }
  void wait_event(EventHandle event) override {
    std::lock_guard lock(mutex_);
    auto* e = static_cast<SimEvent*>(event);
    if (e->stream) run_until(*e->stream, e->position);
  }
  void stream_wait_event(StreamHandle, EventHandle event) override {
    // Running the awaited copies now is one valid order of the real device's execution.
    wait_event(event);
  }
  void synchronize(StreamHandle stream) override {
    std::lock_guard lock(mutex_);
    auto* s = static_cast<SimStream*>(stream);
    run_until(*s, s->executed + s->pending.size());
  }

  /// @name Test observers
  ///@{
  [[nodiscard]] std::uint64_t live_bytes() const { std::lock_guard lock(mutex_); return live_bytes_; }
  [[nodiscard]] std::uint64_t peak_bytes() const { std::lock_guard lock(mutex_); return peak_bytes_; }
  [[nodiscard]] std::uint64_t live_pinned_bytes() const { std::lock_guard lock(mutex_); return live_pinned_bytes_; }
  [[nodiscard]] std::uint64_t allocations() const { std::lock_guard lock(mutex_); return allocations_; }
  [[nodiscard]] std::uint64_t copies() const { std::lock_guard lock(mutex_); return copies_; }
  [[nodiscard]] std::uint64_t bad_frees() const { std::lock_guard lock(mutex_); return bad_frees_; }
  ///@}

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::uint64_t bytes;
  };
  struct SimStream {
    std::deque<Copy> pending;
    std::uint64_t executed = 0;
  };
  struct SimEvent {
    SimStream* stream = nullptr;
    std::uint64_t position = 0;
  };

  // True when [p, p + n) lies inside one live allocation.
  bool inside_allocation(const void* p, std::uint64_t n) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second;
  }
  void enqueue(void* dst, const void* src, std::uint64_t bytes, StreamHandle stream, bool to_device) {
    std::lock_guard lock(mutex_);
    if (!inside_allocation(to_device ? dst : src, bytes))
      throw cuda_error(1, detail::concat("copy of ", bytes, " bytes ", to_device ? "to" : "from", " ", name(),
                                         " touches memory outside any live allocation (cudaErrorInvalidValue)"));
    ++copies_;
    auto* s = static_cast<SimStream*>(stream);
    s->pending.push_back({dst, src, bytes});
    if (!deferred_) run_until(*s, s->executed + s->pending.size());
  }
  static void run_until(SimStream& s, std::uint64_t position) noexcept {
    while (s.executed < position && !s.pending.empty()) {
      const Copy c = s.pending.front();
      s.pending.pop_front();
      if (c.bytes) std::memcpy(c.dst, c.src, c.bytes);
      ++s.executed;
    }
  }

  int index_;
  std::uint64_t capacity_;
  bool deferred_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::uint64_t> live_;
  std::uint64_t live_bytes_ = 0, peak_bytes_ = 0, live_pinned_bytes_ = 0, allocations_ = 0, copies_ = 0,
                bad_frees_ = 0;
  std::vector<std::unique_ptr<SimStream>> streams_;
  std::vector<std::unique_ptr<SimEvent>> events_;
};

/// @brief One host-simulated GPU per capacity (indexes 0, 1, ...).
[[nodiscard]] inline std::vector<DeviceMemoryPtr> host_simulated_devices(const std::vector<std::uint64_t>& capacities) {
  std::vector<DeviceMemoryPtr> out;
  for (std::size_t i = 0; i < capacities.size(); ++i)
    out.push_back(std::make_shared<HostSimulatedDevice>(static_cast<int>(i), capacities[i]));
  return out;
}

#if ACCEL_HAS_CUDA()
/// @brief A real GPU through the CUDA runtime; every call makes the device current first.
class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int index) : index_(index) {}
  [[nodiscard]] std::string name() const override { return detail::concat("cuda:", index_); }
  [[nodiscard]] int index() const noexcept override { return index_; }
  [[nodiscard]] bool host_accessible() const noexcept override { return false; }
  [[nodiscard]] MemoryInfo memory_info() override {
    const detail::ScopedCudaDevice on_device(index_);
    std::size_t free_b = 0, total_b = 0;
    ACCEL_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    return {free_b, total_b};
  }
  [[nodiscard]] void* allocate(std::uint64_t bytes) override {
    const detail::ScopedCudaDevice on_device(index_);
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      MemoryInfo info;
      std::size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) info = {free_b, total_b};
      (void)cudaGetLastError();
      detail::throw_out_of_memory(name(), bytes, info);
    }
    if (rc != cudaSuccess) detail::cuda_fail(rc, "cudaMalloc(&p, bytes)", __FILE__, __LINE__, "on " + name());
    return p;
  }
  void deallocate(void* ptr, std::uint64_t) noexcept override {
    const detail::ScopedCudaDevice on_device(index_, std::nothrow);
    ACCEL_CUDA_TRY_NO_THROW(cudaFree(ptr));
  }
  [[nodiscard]] void* allocate_pinned(std::uint64_t bytes) override {
    const detail::ScopedCudaDevice on_device(index_);
    void* p = nullptr;
    const cudaError_t rc = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      detail::throw_out_of_memory("the host (pinned)", bytes, {}, "pinned host memory");
    }
    if (rc != cudaSuccess) detail::cuda_fail(rc, "cudaHostAlloc(&p, bytes, cudaHostAllocPortable)", __FILE__, __LINE__);
    return p;
  }
  void deallocate_pinned(void* ptr, std::uint64_t) noexcept override { ACCEL_CUDA_TRY_NO_THROW(cudaFreeHost(ptr)); }
  [[nodiscard]] StreamHandle create_stream() override {
    const detail::ScopedCudaDevice on_device(index_);
    cudaStream_t s = nullptr;
    ACCEL_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  void destroy_stream(StreamHandle stream) noexcept override {
    ACCEL_CUDA_TRY_NO_THROW(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    ACCEL_CUDA_TRY_NO_THROW(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
  }
  [[nodiscard]] EventHandle create_event() override {
    const detail::ScopedCudaDevice on_device(index_);
    cudaEvent_t e = nullptr;
    ACCEL_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy_event(EventHandle event) noexcept override {
    ACCEL_CUDA_TRY_NO_THROW(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
  }
  void copy_to_device_async(void* dst, const void* src, std::uint64_t bytes, StreamHandle stream) override {
    const detail::ScopedCudaDevice on_device(index_);
    ACCEL_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
  }
  void copy_to_host_async(void* dst, const void* src, std::uint64_t bytes, StreamHandle stream) override {
    const detail::ScopedCudaDevice on_device(index_);
    ACCEL_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)));
  }
  void record_event(EventHandle event, StreamHandle stream) override {
    const detail::ScopedCudaDevice on_device(index_);
    ACCEL_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
  }
  void wait_event(EventHandle event) override { ACCEL_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); }
  void stream_wait_event(StreamHandle stream, EventHandle event) override {
    const detail::ScopedCudaDevice on_device(index_);
    ACCEL_CUDA_TRY(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
  }
  void synchronize(StreamHandle stream) override {
    ACCEL_CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }

 private:
  int index_;
};
#endif

/// @brief One DeviceMemory per visible GPU through the CUDA runtime; empty without CUDA, without a
///        driver or without a device (no GPU is data, not an error).
/// @throws accel::cuda_error when the runtime fails for another reason
[[nodiscard]] inline std::vector<DeviceMemoryPtr> cuda_device_memories() {
  std::vector<DeviceMemoryPtr> out;
#if ACCEL_HAS_CUDA()
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    return out;
  }
  if (rc != cudaSuccess) detail::cuda_fail(rc, "cudaGetDeviceCount(&count)", __FILE__, __LINE__);
  for (int i = 0; i < count; ++i) out.push_back(std::make_shared<CudaDeviceMemory>(i));
#endif
  return out;
}

ACCEL_NAMESPACE_END
