// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file shm_slots.hpp
/// @brief The CPU backend's rounds with small payloads between processes of one machine: one
///        shared-memory slot per rank and round, no store and no system call on the fast path.
///
/// Each rank owns a segment: a control block (its `posted` step, and flags `sleeping`, `aborted`,
/// `closed`, each on its own cache line) and two slots that alternate between rounds. In round s a
/// rank writes its entry (round header + payload, or a "too large" marker) into slot s % 2, posts
/// s, waits until every peer posted s and copies their entries out. A rank writes slot s % 2 again
/// in round s + 2 only after every peer posted s + 1, which each does after it copied round s out,
/// so two slots suffice and no acknowledgement is needed.
///
/// When any rank's entry did not fit its slot, every rank sees the marker and the round goes
/// through the store instead (so the decision is the same everywhere). Waits spin briefly (only
/// with CPUs to spare, see spin_plan()), yield, then sleep on a futex; the poster issues a
/// wake only when a peer says it sleeps. While asleep a waiter checks every peer that has not
/// posted: a process that is gone or a communicator that closed is a peer that left (the caller
/// then asks the store, which knows how it left); one that gave up is named; the timeout names
/// the ranks that have not arrived.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <accel/runtime/bytes.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/blobs.hpp>
#include <accel/comm/detail/shm.hpp>
#include <accel/comm/detail/shm_collectives.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief How a waiter spends the time before it sleeps on a futex.
struct SpinPlan {
  std::chrono::microseconds spin;   ///< busy-wait (pause instructions) for up to this long
  std::chrono::microseconds yield;  ///< then give the CPU away (sched_yield) for up to this long
};

/// @brief The waiting plan for `world` ranks on `cpus` usable CPUs (pure).
///
/// Spinning pays only when the awaited peer surely runs on another CPU; when it may share this
/// one (other work on the machine, or more ranks than CPUs) every microsecond spun is one it cannot
/// run. Measured with 2 ranks on a busy 2-CPU machine: a 1-5 us spin before yielding doubled the
/// median round, a 50 us spin made it 100 us whenever the two shared a CPU. So spin only with
/// CPUs to spare (twice the ranks), and otherwise yield at once: a yield hands the CPU to a peer
/// sharing it and returns at once when none is waiting. Yielding is kept short (a yield to a busy
/// process may cost a time slice, where a futex wake gets the CPU back sooner), then the waiter
/// sleeps on the futex.
[[nodiscard]] constexpr SpinPlan spin_plan(int world, int cpus) noexcept {
  if (2 * world <= cpus) return {std::chrono::microseconds(2), std::chrono::microseconds(100)};
  return {std::chrono::microseconds(0), std::chrono::microseconds(100)};
}

/// @brief CPUs this process may run on (at least 1).
inline int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

/// @brief Waits until `word` reached `step` following `plan`: spin, then yield, then
/// sleep_until_reached() (saying so in `sleeping`), calling `check()` between sleeps; check()
/// throws when a peer is gone or a deadline passed.
template <class Check>
void await_step(const std::atomic<std::uint32_t>& word, std::uint32_t step, const SpinPlan& plan, std::atomic<std::uint32_t>& sleeping,
                Check&& check) {
  if (reached(word.load(std::memory_order_acquire), step)) return;
  if (plan.spin.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + plan.spin;
    do {
      for (int i = 0; i < 64; ++i) {
        cpu_relax();
        if (reached(word.load(std::memory_order_acquire), step)) return;
      }
    } while (std::chrono::steady_clock::now() < until);
  }
  if (plan.yield.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + plan.yield;
    do {  // a yield that handed the CPU to other work may take a whole time slice: check the clock after each
      ::sched_yield();
      if (reached(word.load(std::memory_order_acquire), step)) return;
    } while (std::chrono::steady_clock::now() < until);
  }
  sleep_until_reached(word, step, sleeping, std::forward<Check>(check));
}

/// @brief Whether the small-payload slots can serve a communicator (pure): every rank on this
/// machine, shared memory allowed, more than one rank, every rank made a slot segment, and every
/// rank's process can be watched (the same PID namespace as this one, known), since a dead peer is
/// noticed through its pid.
[[nodiscard]] inline bool slots_usable(bool same_machine, bool use_shm, const std::vector<std::string>& segments,
                                       const std::vector<std::uint64_t>& pid_namespaces, std::uint64_t my_namespace) {
  if (!same_machine || !use_shm || segments.size() < 2 || pid_namespaces.size() != segments.size() || my_namespace == 0) return false;
  return std::none_of(segments.begin(), segments.end(), [](const std::string& s) { return s.empty(); }) &&
         std::all_of(pid_namespaces.begin(), pid_namespaces.end(), [&](std::uint64_t ns) { return ns == my_namespace; });
}

/// @brief A peer left without joining a round: its process is gone or its communicator closed.
/// The CPU backend then asks the store, which knows whether it exited, crashed or never came.
class shm_peer_left : public comm_error {
 public:
  shm_peer_left(int rank, const std::string& what_arg) : comm_error(what_arg), rank_(rank) {}
  [[nodiscard]] int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

/// @brief The control block at the start of every rank's slot segment (zero-filled on creation).
struct ShmSlotControl {
  ShmCounter posted;    ///< this rank's entry of step n is in slot n % 2
  ShmCounter sleeping;  ///< non-zero: this rank sleeps on a futex (posters then wake)
  ShmCounter aborted;   ///< non-zero: this rank gave up mid-round
  ShmCounter closed;    ///< non-zero: this rank's communicator is gone
  alignas(64) std::uint64_t slot_bytes = 0;  ///< bytes of each slot (set before the setup round, read by peers)
};
static_assert(sizeof(ShmSlotControl) <= shm_control_bytes);

/// @brief Framing at the start of a slot: header bytes, then payload bytes (too_large: no entry).
inline constexpr std::size_t slot_frame_bytes = 16;
inline constexpr std::uint64_t slot_too_large = ~std::uint64_t{0};
/// @brief Room in every slot for the round header (operation, sequence number, failure message).
inline constexpr std::size_t slot_header_room = 4096;

/// @brief Bytes of a slot that carries payloads up to `payload_bytes` (pure).
[[nodiscard]] constexpr std::size_t slot_bytes_for(std::size_t payload_bytes) noexcept {
  return slot_frame_bytes + slot_header_room + payload_bytes;
}

/// @brief Whether an entry of `header` + `payload` bytes fits a slot of `slot_bytes` (pure).
[[nodiscard]] constexpr bool fits_slot(std::size_t header, std::size_t payload, std::size_t slot_bytes) noexcept {
  return slot_bytes >= slot_frame_bytes && header <= slot_bytes - slot_frame_bytes &&
         payload <= slot_bytes - slot_frame_bytes - header;
}

/// @brief Whether this rank sends its entry through its slot (pure): payloads up to
/// `payload_bytes` do, with a round header of at most slot_header_room bytes.
[[nodiscard]] constexpr bool sends_in_slot(std::size_t header, std::size_t payload, std::size_t payload_bytes) noexcept {
  return header <= slot_header_room && payload <= payload_bytes;
}

/// @brief The payload bytes of a rank's slots in a `world`-rank job (pure). With one peer,
/// `requested`; with more, each rank's round copies every peer's entry out of its slot, so at most
/// the share of 1 MiB of such copies per peer, but never under 64 KiB (the store path, with its
/// round trip and in-place views, takes what is larger). The default 256 KiB is lowered from 6
/// ranks on.
[[nodiscard]] constexpr std::size_t slot_payload_limit(std::size_t requested, int world) noexcept {
  constexpr std::size_t round_copy = std::size_t{1} << 20, floor = std::size_t{64} << 10;
  if (world <= 2) return requested;
  return std::min(requested, std::max(round_copy / static_cast<std::size_t>(world - 1), floor));
}

/// @brief One rank's side of the small-payload rounds.
class ShmSlotExchange {
 public:
  /// @brief A peer: its slot segment's name and process id.
  struct Peer {
    std::string segment;
    std::int64_t pid = 0;
  };

  /// @param segment this rank's segment name
  /// @param payload_bytes the largest payload this rank sends through its slots (each slot holds
  ///        that, a round header of up to slot_header_room bytes and the framing)
  ShmSlotExchange(std::string segment, std::size_t payload_bytes, std::chrono::milliseconds timeout)
      : own_(std::move(segment)), payload_bytes_(payload_bytes), slot_bytes_(slot_bytes_for(payload_bytes)), timeout_(timeout) {}
  ShmSlotExchange(const ShmSlotExchange&) = delete;
  ShmSlotExchange& operator=(const ShmSlotExchange&) = delete;
  /// @brief Tells waiting peers this rank will post no more (they ask the store how it left).
  ~ShmSlotExchange() {
    if (!own_.mapping()) return;
    own_control().closed.v.store(1, std::memory_order_seq_cst);
    futex_wake(own_control().posted.v);
  }

  /// @brief Creates this rank's segment, before the setup round, so peers can open it after.
  /// @return false when shared memory is unavailable or full (the communicator then uses the store)
  bool create() noexcept {
    if (!own_.reserve(shm_control_bytes + 2 * slot_bytes_)) return false;
    own_control().slot_bytes = slot_bytes_;
    return true;
  }
  [[nodiscard]] const std::string& segment() const noexcept { return own_.name(); }

  /// @brief Learns the peers (after the setup round); their segments are mapped in the first round.
  /// @param peers every rank, this one included, in rank order
  void connect(int rank, std::vector<Peer> peers) {
    rank_ = rank;
    world_ = static_cast<int>(peers.size());
    peers_ = std::move(peers);
    plan_ = spin_plan(world_, usable_cpus());
    peer_slot_bytes_.assign(peers_.size(), slot_bytes_);
  }

  /// @brief One round: every rank's (header, payload), in rank order, appended to `headers` and `payloads`.
  /// @return false when some rank's entry did not fit its slot (every rank returns false for this
  ///         round, which then goes through the store); nothing is appended then
  /// @throws shm_peer_left when a peer that has not posted left; comm_error when one gave up or
  ///         sent a malformed entry; timeout_error naming the ranks that did not arrive; after any
  ///         of these every later round throws (the ranks' rounds no longer line up)
  bool run(const std::string& label, std::span<const std::byte> header, std::span<const std::byte> head,
           std::span<const std::byte> body, Blobs& headers, Blobs& payloads) {
    if (broken_)
      throw_error<comm_error>(label, ": an earlier collective on this communicator failed mid-round (", broken_reason_,
                              "); create a new communicator");
    try {
      if (maps_.empty()) map_peers(label);
      return round(label, header, head, body, headers, payloads);
    } catch (const std::exception& e) {
      give_up(e.what());
      throw;
    }
  }

 private:
  // Maps every peer's segment, in the first round and before this rank posts: no peer can have
  // finished that round yet, so a segment that is gone belongs to a peer that left without it (a
  // peer may create its communicator, do nothing and destroy it before this one got here).
  void map_peers(const std::string& label) {
    std::vector<ShmMapping> maps(peers_.size());
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const auto& p = peers_[static_cast<std::size_t>(r)];
      Fd fd(::shm_open(p.segment.c_str(), O_RDWR | O_CLOEXEC, 0));
      if (!fd && errno == ENOENT)
        throw shm_peer_left(r, concat("rank ", r, "'s slot segment ", p.segment, " is gone: it closed its communicator without joining ",
                                      label, ", or the processes do not share /dev/shm (then set ACCEL_CPU_SHM=0)"));
      if (!fd)
        throw_error<comm_error>("cannot open rank ", r, "'s slot segment ", p.segment, ": ", os_error_text(errno),
                                "; set ACCEL_CPU_SHM=0 to send everything over TCP instead");
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) < shm_control_bytes + 2 * slot_frame_bytes)
        throw_error<comm_error>("rank ", r, "'s slot segment ", p.segment, " holds ", st.st_size, " bytes, too few for its slots");
      const auto size = static_cast<std::size_t>(st.st_size);
      ShmMapping m = map_shared(fd.get(), size, true);
      if (!m) throw_error<comm_error>("cannot map rank ", r, "'s slot segment ", p.segment, ": ", os_error_text(errno));
      const auto slot_bytes = reinterpret_cast<const ShmSlotControl*>(m.get())->slot_bytes;
      if (slot_bytes < slot_frame_bytes || slot_bytes > (size - shm_control_bytes) / 2)
        throw_error<comm_error>("rank ", r, "'s slot segment ", p.segment, " of ", size, " bytes claims slots of ", slot_bytes, " bytes");
      peer_slot_bytes_[static_cast<std::size_t>(r)] = static_cast<std::size_t>(slot_bytes);
      maps[static_cast<std::size_t>(r)] = std::move(m);
    }
    maps_ = std::move(maps);
  }

  ShmSlotControl& own_control() noexcept { return *reinterpret_cast<ShmSlotControl*>(own_.mapping().get()); }
  std::byte* base(int r) noexcept { return r == rank_ ? own_.mapping().get() : maps_[static_cast<std::size_t>(r)].get(); }
  ShmSlotControl& control(int r) noexcept { return *reinterpret_cast<ShmSlotControl*>(base(r)); }
  std::byte* slot(int r, std::uint32_t step) noexcept {
    return base(r) + shm_control_bytes + (step % 2) * peer_slot_bytes_[static_cast<std::size_t>(r)];
  }

  bool round(const std::string& label, std::span<const std::byte> header, std::span<const std::byte> head,
             std::span<const std::byte> body, Blobs& headers, Blobs& payloads) {
    // Steps start at 1 (a fresh segment says 0) and wrap at 2^32 keeping their parity, so the slots
    // still alternate; reached() compares wrap-safe.
    const std::uint32_t s = ++step_;
    const std::size_t payload = head.size() + body.size();
    const bool fits = sends_in_slot(header.size(), payload, payload_bytes_);
    std::byte* mine = slot(rank_, s);
    store_le<std::uint64_t>(mine, fits ? header.size() : slot_too_large);
    store_le<std::uint64_t>(mine + 8, fits ? payload : slot_too_large);
    if (fits) {
      std::byte* out = mine + slot_frame_bytes;
      if (!header.empty()) std::memcpy(out, header.data(), header.size());
      if (!head.empty()) std::memcpy(out + header.size(), head.data(), head.size());
      if (!body.empty()) std::memcpy(out + header.size() + head.size(), body.data(), body.size());
    }
    post(s);
    for (int r = 0; r < world_; ++r)
      if (r != rank_) await(r, s, label);

    // Every entry is readable now; all ranks see the same markers, so they decide alike.
    bool all_fit = fits;
    std::size_t header_total = 0, payload_total = 0;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const std::byte* e = slot(r, s);
      const auto h = load_le<std::uint64_t>(e), p = load_le<std::uint64_t>(e + 8);
      if (h == slot_too_large) {
        all_fit = false;
        continue;
      }
      if (!fits_slot(h, p, peer_slot_bytes_[static_cast<std::size_t>(r)]))
        throw_error<comm_error>("rank ", r, " sent a malformed entry for ", label, " (", h, " header and ", p,
                                " payload bytes in a slot of ", peer_slot_bytes_[static_cast<std::size_t>(r)], ")");
      header_total += h, payload_total += p;
    }
    if (!all_fit) return false;
    headers.buffer.reserve(headers.buffer.size() + header_total + header.size());
    payloads.buffer.reserve(payloads.buffer.size() + payload_total + payload);
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) {
        headers.push_back(header);
        payloads.push_back(head);
        payloads.append_to_last(body);
        continue;
      }
      const std::byte* e = slot(r, s);
      const auto h = static_cast<std::size_t>(load_le<std::uint64_t>(e)), p = static_cast<std::size_t>(load_le<std::uint64_t>(e + 8));
      headers.push_back(std::span<const std::byte>(e + slot_frame_bytes, h));
      payloads.push_back(std::span<const std::byte>(e + slot_frame_bytes + h, p));
    }
    return true;
  }

  // Publishes step s; a system call only when some peer sleeps.
  void post(std::uint32_t s) noexcept {
    post_step(own_control().posted.v, s, world_, rank_, [&](int q) -> auto& { return control(q).sleeping.v; });
  }

  // Waits until rank r posted step s: spin, yield, then sleep in short futex waits, checking peers.
  void await(int r, std::uint32_t s, const std::string& label) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    await_step(control(r).posted.v, s, plan_, own_control().sleeping.v, [&] { check_peers(s, label, deadline); });
  }

  // Only a peer that has not posted step s can hold this round up; a gone one is named first,
  // then one that gave up, then (at the deadline) every one still missing.
  void check_peers(std::uint32_t s, const std::string& label, std::chrono::steady_clock::time_point deadline) {
    auto missing = [&](int q) { return q != rank_ && !reached(control(q).posted.v.load(std::memory_order_acquire), s); };
    for (int q = 0; q < world_; ++q) {
      if (!missing(q)) continue;
      const auto pid = static_cast<pid_t>(peers_[static_cast<std::size_t>(q)].pid);
      if (pid > 0 && pid != ::getpid() && process_gone(pid))
        throw shm_peer_left(q, concat("rank ", q, " (pid ", pid, ") exited or died without joining ", label));
      if (control(q).closed.v.load(std::memory_order_acquire) != 0)
        throw shm_peer_left(q, concat("rank ", q, " closed its communicator without joining ", label));
    }
    for (int q = 0; q < world_; ++q)
      if (missing(q) && control(q).aborted.v.load(std::memory_order_acquire) != 0)
        throw_error<comm_error>("rank ", q, " gave up during an earlier round (its own error says why), so it cannot join ", label);
    if (std::chrono::steady_clock::now() < deadline) return;
    std::vector<std::string> late;
    for (int q = 0; q < world_; ++q)
      if (missing(q)) late.push_back(std::to_string(q));
    if (late.empty()) return;  // everyone arrived just now
    throw_error<timeout_error>("timed out after ", text::format_ms(static_cast<std::uint64_t>(timeout_.count())), " in ", label, ": ",
                               late.size() == 1 ? "rank " : "ranks ", text::join(late), late.size() == 1 ? " has" : " have",
                               " not arrived (still running, but not in this collective)");
  }

  void give_up(const std::string& why) noexcept {
    broken_ = true;
    broken_reason_ = why;
    if (!own_.mapping()) return;
    own_control().aborted.v.store(1, std::memory_order_seq_cst);
    futex_wake(own_control().posted.v);
  }

  ShmSegment own_;
  std::size_t payload_bytes_;
  std::size_t slot_bytes_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0;
  int world_ = 1;
  std::vector<Peer> peers_;
  std::vector<ShmMapping> maps_;  ///< peers' segments (empty until the first round)
  std::vector<std::size_t> peer_slot_bytes_;
  SpinPlan plan_{};
  std::uint32_t step_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
};

}  // namespace detail
ACCEL_NAMESPACE_END
