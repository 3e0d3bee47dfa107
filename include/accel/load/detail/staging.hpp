// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file staging.hpp
/// @brief Loader internals: the chunked loop, pageable host buffers (anonymous mappings) and the
///        Stager, a ring of pinned buffers through which host data reaches a device with
///        asynchronous copies, so the host fills buffer i+1 (disk read, memcpy or dtype conversion)
///        while buffer i is copied.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/load/convert.hpp>
#include <accel/load/device_memory.hpp>
#include <accel/load/detail/mapped_file.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Calls `f(offset, n)` for consecutive chunks of at most `chunk` bytes (or elements)
///        covering [0, total); nothing for an empty range.
template <class F>
void for_each_chunk(std::uint64_t total, std::uint64_t chunk, F&& f) {
  for (std::uint64_t done = 0; done < total; done += chunk) f(done, std::min(chunk, total - done));
}

/// @brief Reads `count` elements of `from` at `offset` of `file` and writes them converted to `to`
///        at `out`, in pieces of at most 512 KiB of file bytes through `scratch`: each piece is read
///        with pread (a file that shrinks is an error, not a SIGBUS) while it still fits the
///        cache the conversion then reads it from.
inline void read_converted(const MappedFile& file, std::uint64_t offset, DType from, DType to, std::uint64_t count,
                           std::byte* out, std::vector<std::byte>& scratch) {
  const std::uint64_t in_size = element_size_bytes(from), out_size = element_size_bytes(to);
  const std::uint64_t piece = std::max<std::uint64_t>((std::uint64_t{512} << 10) / in_size, 1);
  if (scratch.size() < piece * in_size) scratch.resize(static_cast<std::size_t>(piece * in_size));
  for_each_chunk(count, piece, [&](std::uint64_t at, std::uint64_t n) {
    file.read_exact({scratch.data(), static_cast<std::size_t>(n * in_size)}, offset + at * in_size);
    convert_elements(from, to, scratch.data(), out + at * out_size, n);
  });
}

/// @brief Page-aligned pageable host memory from an anonymous mapping (transparent huge pages
///        requested, which halves page-fault time when a large checkpoint lands on the CPU).
class HostBuffer {
 public:
  HostBuffer() = default;
  /// @throws accel::cuda_error (code cuda_out_of_memory_code) naming the bytes when the host refuses
  explicit HostBuffer(std::uint64_t bytes) : bytes_(bytes) {
    if (!bytes_) return;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw_out_of_memory("the host (cpu)", bytes_, {}, "host memory");
#ifdef MADV_HUGEPAGE
    (void)::madvise(p, bytes_, MADV_HUGEPAGE);
#endif
    ptr_ = static_cast<std::byte*>(p);
  }
  HostBuffer(HostBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (ptr_) ::munmap(ptr_, bytes_);
  }
  [[nodiscard]] std::byte* data() const noexcept { return ptr_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return bytes_; }

 private:
  std::byte* ptr_ = nullptr;
  std::uint64_t bytes_ = 0;
};

/// @brief A ring of pinned staging buffers feeding asynchronous copies to one device on one stream.
class Stager {
 public:
  /// @param device the target device (its allocate_pinned makes the buffers)
  /// @param stream the copy stream on that device
  /// @param buffer_bytes size of each buffer
  /// @param count number of buffers (2 = double buffering)
  Stager(DeviceMemoryPtr device, StreamHandle stream, std::uint64_t buffer_bytes, int count)
      : device_(std::move(device)), stream_(stream) {
    for (int i = 0; i < std::max(count, 1); ++i) {
      buffers_.emplace_back(device_, buffer_bytes);
      events_.emplace_back(device_);
      used_.push_back(false);
    }
  }
  [[nodiscard]] std::uint64_t buffer_bytes() const noexcept { return buffers_.front().size(); }
  [[nodiscard]] const DeviceMemoryPtr& device() const noexcept { return device_; }
  [[nodiscard]] StreamHandle stream() const noexcept { return stream_; }

  /// @brief The next buffer to fill, once the copies that last read it are done.
  /// @note blocks while the device still reads that buffer
  [[nodiscard]] std::byte* acquire() {
    const std::size_t i = next_ % buffers_.size();
    if (used_[i]) events_[i].wait();
    used_[i] = false;
    return buffers_[i].data();
  }
  /// @brief Marks the buffer from the last acquire() as read by the copies just enqueued.
  void submit() {
    const std::size_t i = next_ % buffers_.size();
    events_[i].record(stream_);
    used_[i] = true;
    ++next_;
  }
  /// @brief The one staging loop: `bytes` for `dst` go through the ring in chunks (each a multiple
  ///        of `unit` bytes, as large as a buffer allows); `fill(buffer, offset, n)` puts the chunk's
  ///        `n` bytes into the buffer and returns how many source bytes it consumed, which
  ///        `on_chunk` receives once the chunk's copy is enqueued.
  template <class Fill, class OnChunk>
  void stage(void* dst, std::uint64_t bytes, std::uint64_t unit, Fill&& fill, OnChunk&& on_chunk) {
    const std::uint64_t chunk = std::max<std::uint64_t>(buffer_bytes() / unit, 1) * unit;
    for_each_chunk(bytes, chunk, [&](std::uint64_t at, std::uint64_t n) {
      std::byte* buf = acquire();
      const std::uint64_t consumed = fill(buf, at, n);
      device_->copy_to_device_async(static_cast<std::byte*>(dst) + at, buf, n, stream_);
      submit();
      on_chunk(consumed);
    });
  }
  /// @brief Copies pageable host bytes to the device through the ring.
  template <class OnChunk>
  void copy(void* dst, const std::byte* src, std::uint64_t bytes, OnChunk&& on_chunk) {
    stage(dst, bytes, 1, [&](std::byte* buf, std::uint64_t at, std::uint64_t n) {
      std::memcpy(buf, src + at, n);
      return n;
    }, on_chunk);
  }
  /// @brief Reads `bytes` of `file` from `offset` into the ring and copies them to the device.
  template <class OnChunk>
  void read(void* dst, const MappedFile& file, std::uint64_t offset, std::uint64_t bytes, OnChunk&& on_chunk) {
    stage(dst, bytes, 1, [&](std::byte* buf, std::uint64_t at, std::uint64_t n) {
      file.read_exact({buf, static_cast<std::size_t>(n)}, offset + at);
      return n;
    }, on_chunk);
  }
  /// @brief Reads `count` elements of `from` at `offset` of `file` (pread, in pieces) and copies
  ///        them converted to `to` through the ring to the device.
  template <class OnChunk>
  void convert(void* dst, const MappedFile& file, std::uint64_t offset, DType from, DType to, std::uint64_t count,
               OnChunk&& on_chunk) {
    const std::uint64_t in_size = element_size_bytes(from), out_size = element_size_bytes(to);
    stage(dst, count * out_size, out_size, [&](std::byte* buf, std::uint64_t at, std::uint64_t n) {
      const std::uint64_t elements = n / out_size, first = at / out_size;
      read_converted(file, offset + first * in_size, from, to, elements, buf, scratch_);
      return elements * in_size;
    }, on_chunk);
  }
  /// @brief Waits for every copy enqueued so far. @note blocking
  void drain() {
    device_->synchronize(stream_);
    std::fill(used_.begin(), used_.end(), false);
  }

 private:
  DeviceMemoryPtr device_;
  StreamHandle stream_;
  std::vector<PinnedBuffer> buffers_;
  std::vector<Event> events_;
  std::vector<bool> used_;
  std::size_t next_ = 0;
  std::vector<std::byte> scratch_;  // file bytes read for a conversion
};

}  // namespace detail
ACCEL_NAMESPACE_END
