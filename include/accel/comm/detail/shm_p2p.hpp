// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file shm_p2p.hpp
/// @brief The CPU backend's point-to-point messages between processes of one machine: a
///        shared-memory channel per ordered pair of ranks, with a ring of chunks that sender and
///        receiver copy through at the same time.
///
/// A channel (sender s, receiver d) is one segment named after d's prefix and s, created by d on
/// its first receive from s (O_EXCL; s waits for it to appear, as it would wait for d anyway),
/// unlinked by d's communicator when it ends (a killed d's is swept like its other segments, by
/// its pid). d's communicator removes leftovers of its channels' names before it tells anyone
/// the names, so neither end maps a stale segment, and a sender never makes one nobody unlinks. It holds
/// a control block (counters `posted`, `consumed`, `answered`, a `sleeping` and a `left` flag per
/// end, each on its own cache line), an offer area (the sender's descriptor, message number and
/// payload size), an answer area (the receiver's descriptor) and a ring of `slots` chunks.
///
/// Message n: the sender waits until the ring slot of its next step is free, writes the offer and
/// the payload's first chunk, posts the step, and waits for `answered` to reach n. The receiver
/// waits for the step, reads the offer, decides (the descriptors' check), writes its answer, posts
/// `answered`, copies the chunk out and posts `consumed`. If the check failed on both ends (it is
/// the same pure function of the same two descriptors), that was the message's only step;
/// otherwise the sender streams the remaining chunks into the ring while the receiver copies the
/// earlier ones out, so a large message costs about one copy's time, not two in a row; from
/// p2p_stream_min_bytes on the receiver copies out with streaming stores. A small message costs
/// one step each way and no system call when nobody sleeps.
///
/// Waits spin (with CPUs to spare), yield, then sleep on a futex in 20 ms steps (shm_slots.hpp's
/// await_step()); between sleeps the waiter checks that the peer's process still exists and
/// whether it closed its communicator or gave up mid-message (its `left` flag), and the timeout.
/// An end that fails mid-message says so in its `left` flag and refuses every later message on the
/// channel (the two ends' steps no longer line up).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>  // SSE2, part of every x86-64 CPU: streaming stores
#define ACCEL_DETAIL_STREAMING_STORES 1
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include <accel/runtime/bytes.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/detail/p2p.hpp>
#include <accel/comm/detail/shm.hpp>
#include <accel/comm/detail/shm_collectives.hpp>
#include <accel/comm/detail/shm_slots.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Bytes of one ring slot: a chunk that stays in the caches between the sender's copy in
/// and the receiver's copy out.
inline constexpr std::size_t p2p_chunk_bytes = std::size_t{256} << 10;
/// @brief Slots in a channel's ring (a power of two, so step numbers wrap onto the same slots).
inline constexpr std::uint32_t p2p_ring_slots = 4;
/// @brief Bytes of the control block, the offer area and the answer area, each.
inline constexpr std::size_t p2p_area_bytes = 4096;
static_assert(p2p_descriptor_max_bytes + 64 <= p2p_area_bytes);

/// @brief Messages from this size on leave the ring through copy_streaming(): their receiver's
/// buffer does not fit the caches anyway, and ordinary stores would first read every line of it
/// from memory. Measured on a 2-core VM (32 MiB L3, 256 KiB x 4 ring): a 16 MiB message took
/// about half the time, a 64 MiB one 0.7x; at 4 MiB and below ordinary copies were faster.
inline constexpr std::uint64_t p2p_stream_min_bytes = std::uint64_t{8} << 20;

/// @brief Copies `n` bytes from `src` to `dst` (not overlapping), as memcpy does, but where the
/// CPU has streaming stores (x86-64) writes `dst` around the caches: no read of each destination
/// line before it is written, and the caches keep what the other end of the channel uses. Every
/// byte is visible to other threads when it returns (a store fence).
inline void copy_streaming(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
#if ACCEL_DETAIL_STREAMING_STORES
  constexpr std::size_t line = 64;
  if (n < 4 * line) {
    std::memcpy(dst, src, n);
    return;
  }
  const std::size_t lead = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;  // streaming stores need 16-byte alignment
  std::memcpy(dst, src, lead);
  dst += lead, src += lead, n -= lead;
  for (; n >= line; n -= line, dst += line, src += line) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, n);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

/// @brief The control block at the start of every channel (zero-filled on creation).
struct ShmP2pControl {
  ShmCounter posted;       ///< sender: steps posted (step s's chunk is in slot s % slots)
  ShmCounter consumed;     ///< receiver: steps copied out (their slots are free again)
  ShmCounter answered;     ///< receiver: the (32-bit) number of the last message it answered
  ShmCounter sleeping[2];  ///< [0] sender, [1] receiver: non-zero while it sleeps on a futex
  ShmCounter left[2];      ///< [0] sender, [1] receiver: 1 closed its communicator, 2 gave up mid-message
};
static_assert(sizeof(ShmP2pControl) <= p2p_area_bytes);

/// @brief Bytes of a channel (pure).
[[nodiscard]] constexpr std::size_t p2p_channel_bytes() noexcept { return 3 * p2p_area_bytes + p2p_ring_slots * p2p_chunk_bytes; }

/// @brief The steps a message of `bytes` takes: one per chunk, at least one (pure).
[[nodiscard]] constexpr std::uint64_t p2p_steps(std::uint64_t bytes) noexcept {
  return bytes == 0 ? 1 : (bytes + p2p_chunk_bytes - 1) / p2p_chunk_bytes;
}

/// @brief One end of one channel.
class ShmP2pChannel {
 public:
  /// @brief The other end: its rank, its name in messages ("rank 1", "group rank 1 (job rank 3)")
  /// and its process id (0: not watched, as for a process of another PID namespace).
  struct Peer {
    int rank = -1;
    std::string name;
    pid_t pid = 0;
  };

  /// @param segment the channel's name
  /// @param sending true at the sender's end
  /// @param closing true once this end's communicator is being destroyed (waits then end)
  /// @param peer_closed asked at most every half second of a wait: true when the peer's
  ///        communicator has ended (it may have ended before this end opened the channel, so the
  ///        channel's own flag cannot tell)
  ShmP2pChannel(std::string segment, bool sending, Peer peer, std::chrono::milliseconds timeout, std::function<bool()> closing,
                std::function<bool()> peer_closed)
      : segment_(std::move(segment)), me_(sending ? 0 : 1), peer_(std::move(peer)), timeout_(timeout), closing_(std::move(closing)),
        peer_closed_(std::move(peer_closed)), plan_(spin_plan(2, usable_cpus())) {}
  ShmP2pChannel(const ShmP2pChannel&) = delete;
  ShmP2pChannel& operator=(const ShmP2pChannel&) = delete;
  /// @brief Tells a waiting peer this end is gone.
  ~ShmP2pChannel() {
    if (!map_) return;
    std::uint32_t open = 0;
    control().left[me_].v.compare_exchange_strong(open, 1);
    wake_all();
  }

  /// @brief Opens the channel. The receiver creates it (O_EXCL: a segment of that name is a
  /// leftover, which the receiver's communicator removed before it told anyone the name, so only
  /// a same-named segment made since can be there); the sender waits for it to appear, sized, as
  /// it would wait for the receiver in its first message. So no sender ever makes a segment that
  /// nobody unlinks (a receiver whose communicator already ended made none), and no end maps a
  /// stale one.
  /// @param label the first message's, for errors
  /// @throws comm_error when shared memory is unavailable or full, or (sender) as send() when the
  ///         receiver leaves or closes first; timeout_error after the timeout
  void open(const std::string& label) {
    const std::size_t bytes = p2p_channel_bytes();
    if (me_ == 0) return open_existing(bytes, label);
    Fd fd(::shm_open(segment_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    if (!fd && errno == EEXIST) {  // made since by something else under this name: not ours to trust
      ::shm_unlink(segment_.c_str());
      fd.reset(::shm_open(segment_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    }
    if (!fd) open_failed(bytes, errno);
    int err = 0;
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) err = errno;
    else if (const int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); rc != 0) err = rc;  // returns, not errno
    if (!err) {
      map_ = map_shared(fd.get(), bytes, true);
      if (!map_) err = errno;
    }
    if (err) {
      ::shm_unlink(segment_.c_str());
      open_failed(bytes, err);
    }
  }
  /// @brief Whether open() succeeded.
  [[nodiscard]] bool is_open() const noexcept { return static_cast<bool>(map_); }
  [[nodiscard]] const std::string& segment() const noexcept { return segment_; }
  /// @brief What open() throws when the channel cannot be made: `err` is the OS error number (for
  /// posix_fallocate, its return value, which it does not store in errno).
  [[noreturn]] void open_failed(std::size_t bytes, int err) const {
    throw_error<comm_error>("cannot create the ", text::format_bytes(bytes), " shared-memory channel ", segment_, " to ", peer_.name, ": ",
                            os_error_text(err), " (is /dev/shm full?); set ACCEL_CPU_SHM=0 to send messages through the store instead");
  }

  /// @brief Sends message `number` (see the file's notes); returns once the receiver answered and
  /// the whole payload is in the ring, or when accepts() said no.
  /// @throws shm_peer_left when the receiver's process is gone; comm_error when it closed its
  ///         communicator or gave up; timeout_error after the timeout (each wait)
  void send(std::uint64_t number, const std::string& label, std::span<const std::byte> descriptor, std::span<const std::byte> head,
            std::span<const std::byte> body, const std::function<bool(std::span<const std::byte>)>& accepts) {
    guard(label);
    try {
      const std::uint64_t total = head.size() + body.size();
      std::uint32_t s = ++step_;
      wait_free(s, label);
      std::byte* offer = map_.get() + p2p_area_bytes;
      store_le<std::uint64_t>(offer, number);
      store_le<std::uint64_t>(offer + 8, total);
      store_le<std::uint32_t>(offer + 16, static_cast<std::uint32_t>(descriptor.size()));
      if (!descriptor.empty()) std::memcpy(offer + 20, descriptor.data(), descriptor.size());
      std::size_t at = static_cast<std::size_t>(std::min<std::uint64_t>(total, p2p_chunk_bytes));
      copy_payload_range(slot(s), head, body, 0, at);
      post(control().posted.v, s);
      await(control().answered.v, static_cast<std::uint32_t>(number), label, "receive it");
      const std::byte* answer = map_.get() + 2 * p2p_area_bytes;
      const auto answered = load_le<std::uint64_t>(answer);
      const auto length = load_le<std::uint32_t>(answer + 8);
      if (answered != number || length > p2p_descriptor_max_bytes)
        throw_error<comm_error>(peer_.name, " answered message #", answered, " with a ", length, "-byte descriptor during ", label);
      if (!accepts(std::span<const std::byte>(answer + 12, length))) return;
      while (at < total) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(total - at, p2p_chunk_bytes));
        s = ++step_;
        wait_free(s, label);
        copy_payload_range(slot(s), head, body, at, n);
        post(control().posted.v, s);
        at += n;
      }
    } catch (const std::exception& e) {
      give_up(e.what());
      throw;
    }
  }

  /// @brief Receives message `number`: place(sender's descriptor, payload bytes) says where the
  /// payload goes (null: the descriptors do not match, nothing more moves); answers with
  /// `descriptor` either way.
  /// @throws as send()
  void recv(std::uint64_t number, const std::string& label, std::span<const std::byte> descriptor,
            const std::function<std::byte*(std::span<const std::byte>, std::uint64_t)>& place) {
    guard(label);
    try {
      std::uint32_t s = ++step_;
      await(control().posted.v, s, label, "send it");
      const std::byte* offer = map_.get() + p2p_area_bytes;
      const auto offered = load_le<std::uint64_t>(offer);
      const auto total = load_le<std::uint64_t>(offer + 8);
      const auto length = load_le<std::uint32_t>(offer + 16);
      if (offered != number || length > p2p_descriptor_max_bytes || total > SIZE_MAX)
        throw_error<comm_error>(peer_.name, " offered message #", offered, " (", total, " bytes, a ", length, "-byte descriptor) during ",
                                label);
      std::byte* out = place(std::span<const std::byte>(offer + 20, length), total);
      std::byte* answer = map_.get() + 2 * p2p_area_bytes;
      store_le<std::uint64_t>(answer, number);
      store_le<std::uint32_t>(answer + 8, static_cast<std::uint32_t>(descriptor.size()));
      if (!descriptor.empty()) std::memcpy(answer + 12, descriptor.data(), descriptor.size());
      post(control().answered.v, static_cast<std::uint32_t>(number));
      std::size_t at = 0;
      const bool streaming = total >= p2p_stream_min_bytes;
      for (;;) {
        const std::size_t n = out ? static_cast<std::size_t>(std::min<std::uint64_t>(total - at, p2p_chunk_bytes)) : 0;
        if (n && streaming) copy_streaming(out + at, slot(s), n);
        else if (n) std::memcpy(out + at, slot(s), n);
        post(control().consumed.v, s);
        at += n;
        if (!out || at >= total) return;
        s = ++step_;
        await(control().posted.v, s, label, "send the rest of it");
      }
    } catch (const std::exception& e) {
      give_up(e.what());
      throw;
    }
  }

 private:
  ShmP2pControl& control() noexcept { return *reinterpret_cast<ShmP2pControl*>(map_.get()); }
  // The sender's open(): the segment once the receiver made and sized it (the receiver sizes it
  // right after creating it; its pages are reserved before it maps them).
  void open_existing(std::size_t bytes, const std::string& label) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (auto pause = std::chrono::microseconds(50);; pause = std::min(pause * 2, std::chrono::microseconds(20'000))) {
      Fd fd(::shm_open(segment_.c_str(), O_RDWR | O_CLOEXEC, 0600));
      if (!fd && errno != ENOENT) open_failed(bytes, errno);
      struct stat st {};
      if (fd && ::fstat(fd.get(), &st) != 0) open_failed(bytes, errno);
      if (fd && static_cast<std::size_t>(st.st_size) >= bytes) {
        map_ = map_shared(fd.get(), bytes, true);
        if (!map_) open_failed(bytes, errno);
        return;
      }
      check(label, "receive it", deadline, false);  // no control block to read yet
      std::this_thread::sleep_for(pause);
    }
  }
  std::byte* slot(std::uint32_t step) noexcept { return map_.get() + 3 * p2p_area_bytes + (step % p2p_ring_slots) * p2p_chunk_bytes; }
  int them() const noexcept { return 1 - me_; }

  void guard(const std::string& label) const {
    if (broken_)
      throw_error<comm_error>(label, ": an earlier message on the channel to ", peer_.name, " failed midway (", broken_reason_,
                              "); create a new communicator");
  }

  void post(std::atomic<std::uint32_t>& word, std::uint32_t value) noexcept {
    post_step(word, value, 2, me_, [&](int) -> auto& { return control().sleeping[them()].v; });
  }
  void wake_all() noexcept {
    for (auto* w : {&control().posted.v, &control().consumed.v, &control().answered.v}) futex_wake(*w);
  }

  // Before writing the slot of step s, the receiver must have copied out the step that used it last.
  void wait_free(std::uint32_t s, const std::string& label) { await(control().consumed.v, s - p2p_ring_slots, label, "take the earlier chunks"); }

  void await(const std::atomic<std::uint32_t>& word, std::uint32_t value, const std::string& label, const char* what) {
    if (reached(word.load(std::memory_order_acquire), value)) return;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    await_step(word, value, plan_, control().sleeping[me_].v, [&] { check(label, what, deadline); });
  }

  // The peer is named first when it is gone, closed or gave up; then the deadline. `opened`: the
  // channel exists (a sender waiting for the receiver to make it has no control block to read).
  void check(const std::string& label, const char* what, std::chrono::steady_clock::time_point deadline, bool opened = true) {
    if (closing_ && closing_()) throw_error<comm_error>(label, ": the communicator is being destroyed");
    if (peer_.pid > 0 && peer_.pid != ::getpid() && process_gone(peer_.pid))
      throw shm_peer_left(peer_.rank, concat(peer_.name, " (pid ", peer_.pid, ") exited or died during ", label));
    const auto left = opened ? control().left[them()].v.load(std::memory_order_acquire) : 0;
    if (left == 1) throw_error<comm_error>(peer_.name, " closed its communicator during ", label);
    if (left != 0)
      throw_error<comm_error>(peer_.name, " gave up on the channel during ", label, " or an earlier message (its own error says why)");
    const auto now = std::chrono::steady_clock::now();
    if (peer_closed_ && now - last_probe_ >= std::chrono::milliseconds(500)) {
      last_probe_ = now;
      if (peer_closed_()) throw_error<comm_error>(peer_.name, " closed its communicator without taking part in ", label);
    }
    if (now >= deadline)
      throw_error<timeout_error>("timed out after ", text::format_ms(static_cast<std::uint64_t>(timeout_.count())), " in ", label, ": ",
                                 peer_.name, " did not ", what);
  }

  void give_up(const char* why) noexcept {
    broken_ = true;
    try {
      broken_reason_ = why;
    } catch (...) {  // no memory for the reason: the flag still says it
    }
    if (!map_) return;
    control().left[me_].v.store(2, std::memory_order_seq_cst);
    wake_all();
  }

  std::string segment_;
  int me_;
  Peer peer_;
  std::chrono::milliseconds timeout_;
  std::function<bool()> closing_;
  std::function<bool()> peer_closed_;
  std::chrono::steady_clock::time_point last_probe_ = std::chrono::steady_clock::now();
  SpinPlan plan_;
  ShmMapping map_;
  std::uint32_t step_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace detail
ACCEL_NAMESPACE_END
