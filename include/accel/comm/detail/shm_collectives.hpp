// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file shm_collectives.hpp
/// @brief The CPU backend's data step for buffer collectives between processes of one machine:
///        chunked, pipelined copies and reductions through one shared-memory segment per rank.
///
/// Each rank owns a segment: a control block (counters `posted`, `reduced`, `consumed`, each a
/// step number, on its own cache line) and two slots of `chunk` bytes that alternate between
/// steps. A buffer is moved in steps of at most one chunk:
/// - all_reduce: every rank copies its chunk into its slot and posts; rank r reduces part r of the
///   chunk (every rank's slot, in rank order) in place in its own slot and posts `reduced`; every
///   rank copies the reduced parts into its buffer (a reduce-scatter then an all-gather);
/// - reduce_scatter: the slot holds the chunk of every destination's block, rank r reduces block r;
/// - all_gather / broadcast: copy in, post, peers copy out.
/// A rank writes a slot again two steps later only after every peer said `consumed` for the step
/// that used it, so a fast rank runs one chunk ahead of a slow one. Waits spin briefly, then sleep
/// on a futex (the poster wakes only when a peer says it sleeps); while asleep the waiter checks the
/// timeout, whether the peer's process still exists and whether the peer gave up (its `aborted`
/// flag), so a dead or failed peer is an error naming it, not a hang.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/reduce.hpp>
#include <accel/comm/detail/shm.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief One counter on its own cache line.
struct alignas(64) ShmCounter {
  std::atomic<std::uint32_t> v{0};
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && sizeof(std::atomic<std::uint32_t>) == 4,
              "the shared-memory counters must be plain 32-bit words (futexes)");

/// @brief The control block at the start of every rank's buffer segment (zero-filled on creation).
struct ShmControl {
  ShmCounter posted;    ///< this rank's chunk of step n is in its slot
  ShmCounter reduced;   ///< this rank's reduced part of step n is in its slot
  ShmCounter consumed;  ///< this rank read everything it needs of step n from every peer
  ShmCounter aborted;   ///< non-zero: this rank gave up mid-transfer
  ShmCounter sleeping;  ///< non-zero: this rank sleeps on a futex (posters then wake)
};
inline constexpr std::size_t shm_control_bytes = 4096;
static_assert(sizeof(ShmControl) <= shm_control_bytes);

/// @brief True when counter value `v` has reached step `step` (wrap-safe).
[[nodiscard]] constexpr bool reached(std::uint32_t v, std::uint32_t step) noexcept {
  return static_cast<std::int32_t>(v - step) >= 0;
}

/// @brief The elements [first, last) of an m-element chunk that rank r of p reduces (pure).
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> part_of(std::size_t m, int p, int r) noexcept {
  return {m * static_cast<std::size_t>(r) / static_cast<std::size_t>(p), m * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(p)};
}

/// @brief Elements per step for `kind` (pure): a slot of `chunk` bytes holds one chunk of the
/// buffer, or for reduce_scatter one chunk of each of the `world` destination blocks.
[[nodiscard]] constexpr std::size_t elements_per_step(BufferOp kind, std::size_t chunk, std::size_t element_bytes, int world) noexcept {
  const std::size_t per = chunk / element_bytes / (kind == BufferOp::reduce_scatter ? static_cast<std::size_t>(world) : 1);
  return per == 0 ? 1 : per;
}

inline void futex_sleep(const std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds limit) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(limit.count() / 1'000'000);
  ts.tv_nsec = static_cast<long>(limit.count() % 1'000'000) * 1000;
  ::syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}
inline void futex_wake(const std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// @brief Stores `step` in `word`, then wakes its sleepers, a system call made only when some peer
/// q (of `world`, not `rank`) says it sleeps (`sleeping_of(q)`, an atomic word).
template <class SleepingOf>
void post_step(std::atomic<std::uint32_t>& word, std::uint32_t step, int world, int rank, SleepingOf&& sleeping_of) noexcept {
  word.store(step, std::memory_order_seq_cst);
  for (int q = 0; q < world; ++q)
    if (q != rank && sleeping_of(q).load(std::memory_order_seq_cst) != 0) {
      futex_wake(word);
      return;
    }
}

/// @brief The last stage of every wait, once spinning and yielding are over: says so in
/// `sleeping` (so posters wake it), re-reads `word`, sleeps on it for at most 20 ms, and between
/// sleeps calls `check()`, which throws when a peer is gone or the deadline passed.
template <class Check>
void sleep_until_reached(const std::atomic<std::uint32_t>& word, std::uint32_t step, std::atomic<std::uint32_t>& sleeping, Check&& check) {
  for (;;) {
    sleeping.store(1, std::memory_order_seq_cst);
    const std::uint32_t seen = word.load(std::memory_order_seq_cst);
    if (!reached(seen, step)) futex_sleep(word, seen, std::chrono::milliseconds(20));
    sleeping.store(0, std::memory_order_relaxed);
    if (reached(word.load(std::memory_order_acquire), step)) return;
    check();
  }
}

/// @brief True when process `pid` (of this PID namespace) has ended: it no longer exists, or it is
/// a zombie its parent has not reaped yet (a supervisor that waits for its children in order
/// reaps a dead rank only after the ones before it have exited).
inline bool process_gone(pid_t pid) noexcept {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  Fd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return false;  // no /proc: only kill() can tell
  char buf[512];
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return false;
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');  // "pid (command) S ...": the command may hold anything
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

/// @brief One rank's side of the shared-memory buffer collectives.
class ShmBufferEngine {
 public:
  /// @brief A rank as this engine knows it: its segment's name, its process id and PID namespace
  /// (the pid is only checked for liveness when the namespace is this process's).
  struct Peer {
    std::string segment;
    std::int64_t pid = 0;
    std::uint64_t pid_namespace = 0;
  };

  /// @param peers every rank (this one included), in rank order
  /// @param chunk bytes per slot (the same on every rank)
  ShmBufferEngine(int rank, std::vector<Peer> peers, std::size_t chunk, std::chrono::milliseconds timeout)
      : rank_(rank), world_(static_cast<int>(peers.size())), peers_(std::move(peers)), chunk_(chunk), timeout_(timeout),
        own_(peers_[static_cast<std::size_t>(rank)].segment) {}

  ShmBufferEngine(const ShmBufferEngine&) = delete;
  ShmBufferEngine& operator=(const ShmBufferEngine&) = delete;

  /// @brief Bytes of each rank's segment.
  [[nodiscard]] std::size_t segment_bytes() const noexcept { return shm_control_bytes + 2 * chunk_; }

  /// @brief Creates this rank's segment (before the descriptor round, so peers find it after).
  /// @throws comm_error when shared memory is unavailable or full
  void prepare() {
    if (own_.capacity() >= segment_bytes()) return;
    if (!own_.reserve(segment_bytes()))
      throw_error<comm_error>("cannot create the ", text::format_bytes(segment_bytes()), " shared-memory segment ", own_.name(),
                              " for buffer collectives: ", os_error_text(errno),
                              " (is /dev/shm full?); set ACCEL_CPU_SHM=0 to send buffers over TCP instead");
  }

  /// @brief Moves the data of `c`, whose descriptors matched on every rank.
  /// @throws comm_error naming a peer that died or gave up; timeout_error naming one that did not
  ///         arrive in time; after either, every later call throws (the ranks' steps no longer line up)
  void run(const BufferCall& c, const std::string& label) {
    if (broken_)
      throw_error<comm_error>(label, ": an earlier buffer collective on this communicator failed mid-transfer (", broken_reason_,
                              "); create a new communicator");
    label_ = &label;
    try {
      map_peers();
      switch (c.kind) {
        case BufferOp::all_reduce: all_reduce(c); break;
        case BufferOp::all_gather: all_gather(c); break;
        case BufferOp::broadcast: broadcast(c); break;
        case BufferOp::reduce_scatter: reduce_scatter(c); break;
      }
    } catch (const std::exception& e) {
      give_up(e.what());
      throw;
    }
  }

 private:
  ShmControl& own_control() noexcept { return *reinterpret_cast<ShmControl*>(own_.mapping().get()); }
  ShmControl& control(int r) noexcept { return *reinterpret_cast<ShmControl*>(base(r)); }
  std::byte* base(int r) noexcept { return r == rank_ ? own_.mapping().get() : maps_[static_cast<std::size_t>(r)].get(); }
  std::byte* slot(int r, std::uint32_t step) noexcept { return base(r) + shm_control_bytes + (step % 2) * chunk_; }

  void map_peers() {
    if (!maps_.empty()) return;
    std::vector<ShmMapping> maps(static_cast<std::size_t>(world_));
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const auto& p = peers_[static_cast<std::size_t>(r)];
      Fd fd(::shm_open(p.segment.c_str(), O_RDWR | O_CLOEXEC, 0));
      if (!fd)
        throw_error<comm_error>("cannot open rank ", r, "'s buffer segment ", p.segment, ": ", os_error_text(errno),
                                "; set ACCEL_CPU_SHM=0 to send buffers over TCP instead");
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) < segment_bytes())
        throw_error<comm_error>("rank ", r, "'s buffer segment ", p.segment, " holds ", st.st_size, " bytes, ", segment_bytes(),
                                " expected (do all ranks use the same CpuCommOptions::buffer_chunk_bytes?)");
      maps[static_cast<std::size_t>(r)] = map_shared(fd.get(), segment_bytes(), true);
      if (!maps[static_cast<std::size_t>(r)])
        throw_error<comm_error>("cannot map rank ", r, "'s buffer segment ", p.segment, ": ", os_error_text(errno));
    }
    maps_ = std::move(maps);
  }

  using Which = ShmCounter ShmControl::*;

  void post(Which which, std::uint32_t step) noexcept {
    post_step((own_control().*which).v, step, world_, rank_, [&](int q) -> auto& { return control(q).sleeping.v; });
  }

  // Waits until rank r's counter `which` reached `step`.
  void await(int r, Which which, std::uint32_t step, const char* what) {
    const auto& word = (control(r).*which).v;
    if (reached(word.load(std::memory_order_acquire), step)) return;
    for (int i = 0; i < 256; ++i) {
      cpu_relax();
      if (reached(word.load(std::memory_order_acquire), step)) return;
    }
    for (int i = 0; i < 8; ++i) {
      ::sched_yield();
      if (reached(word.load(std::memory_order_acquire), step)) return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    sleep_until_reached(word, step, own_control().sleeping.v, [&] { check_peer(r, what, deadline); });
  }

  // A dead peer is named first (whoever waits on whom), then one that gave up (the one awaited first).
  void check_peer(int r, const char* what, std::chrono::steady_clock::time_point deadline) {
    static const std::uint64_t my_namespace = pid_namespace_id();
    for (int q = 0; q < world_; ++q) {
      const auto& peer = peers_[static_cast<std::size_t>(q)];
      const auto pid = static_cast<pid_t>(peer.pid);
      if (q != rank_ && pid > 0 && pid != ::getpid() && peer.pid_namespace == my_namespace && my_namespace != 0 && process_gone(pid))
        throw_error<comm_error>("rank ", q, " (pid ", pid, ") exited or died during ", *label_, "; this rank was waiting for rank ", r,
                                "'s ", what);
    }
    auto gave_up = [&](int p) { return p != rank_ && control(p).aborted.v.load(std::memory_order_acquire) != 0; };
    int culprit = gave_up(r) ? r : -1;
    for (int p = 0; culprit < 0 && p < world_; ++p)
      if (gave_up(p)) culprit = p;
    if (culprit >= 0)
      throw_error<comm_error>("rank ", culprit, " gave up during ", *label_, " (its own error says why); this rank was waiting for rank ",
                              r, "'s ", what);
    if (std::chrono::steady_clock::now() > deadline)
      throw_error<timeout_error>("timed out after ", text::format_ms(static_cast<std::uint64_t>(timeout_.count())), " in ", *label_,
                                 ": rank ", r, " did not deliver its ", what);
  }

  void give_up(const std::string& why) noexcept {
    broken_ = true;
    broken_reason_ = why;
    if (!own_.mapping()) return;
    auto& c = own_control();
    c.aborted.v.store(1, std::memory_order_seq_cst);
    for (Which w : {&ShmControl::posted, &ShmControl::reduced, &ShmControl::consumed}) futex_wake((c.*w).v);
  }

  // Before writing our slot for `step`, every peer must have finished with the step that used it last.
  void free_slot(std::uint32_t step) {
    if (step <= 2 && step_wrapped_ == 0) return;
    for (int r = 0; r < world_; ++r)
      if (r != rank_) await(r, &ShmControl::consumed, step - 2, "release of an earlier chunk");
  }
  std::uint32_t next_step() noexcept {
    if (++step_ == 0) ++step_wrapped_, ++step_;  // 0 is "nothing yet" in a fresh segment
    return step_;
  }

  void all_reduce(const BufferCall& c) {
    const std::size_t es = element_size(c.type);
    auto* data = static_cast<std::byte*>(c.recv);
    const std::size_t per = elements_per_step(c.kind, chunk_, es, world_);
    std::vector<const void*> inputs(static_cast<std::size_t>(world_));
    for (std::size_t off = 0; off < c.recv_count; off += per) {
      const std::size_t m = std::min(per, c.recv_count - off);
      const std::uint32_t s = next_step();
      free_slot(s);
      std::byte* mine = slot(rank_, s);
      std::memcpy(mine, data + off * es, m * es);
      post(&ShmControl::posted, s);
      for (int r = 0; r < world_; ++r)
        if (r != rank_) await(r, &ShmControl::posted, s, "chunk");
      const auto [lo, hi] = part_of(m, world_, rank_);
      for (int r = 0; r < world_; ++r) inputs[static_cast<std::size_t>(r)] = slot(r, s) + lo * es;
      reduce_bytes(c.type, mine + lo * es, inputs, hi - lo, c.op);
      post(&ShmControl::reduced, s);
      std::memcpy(data + (off + lo) * es, mine + lo * es, (hi - lo) * es);
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        await(r, &ShmControl::reduced, s, "reduced part");
        const auto [a, b] = part_of(m, world_, r);
        std::memcpy(data + (off + a) * es, slot(r, s) + a * es, (b - a) * es);
      }
      post(&ShmControl::consumed, s);
    }
  }

  void all_gather(const BufferCall& c) {
    const std::size_t es = element_size(c.type), n = c.send_count;
    const auto* send = static_cast<const std::byte*>(c.send);
    auto* recv = static_cast<std::byte*>(c.recv);
    const std::size_t per = elements_per_step(c.kind, chunk_, es, world_);
    for (std::size_t off = 0; off < n; off += per) {
      const std::size_t m = std::min(per, n - off);
      const std::uint32_t s = next_step();
      free_slot(s);
      std::memcpy(slot(rank_, s), send + off * es, m * es);
      post(&ShmControl::posted, s);
      std::memmove(recv + (static_cast<std::size_t>(rank_) * n + off) * es, send + off * es, m * es);  // may be in place
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        await(r, &ShmControl::posted, s, "chunk");
        std::memcpy(recv + (static_cast<std::size_t>(r) * n + off) * es, slot(r, s), m * es);
      }
      post(&ShmControl::consumed, s);
    }
  }

  void broadcast(const BufferCall& c) {
    const std::size_t es = element_size(c.type);
    auto* data = static_cast<std::byte*>(c.recv);
    const std::size_t per = elements_per_step(c.kind, chunk_, es, world_);
    for (std::size_t off = 0; off < c.recv_count; off += per) {
      const std::size_t m = std::min(per, c.recv_count - off);
      const std::uint32_t s = next_step();
      if (rank_ == c.root) {
        free_slot(s);
        std::memcpy(slot(rank_, s), data + off * es, m * es);
        post(&ShmControl::posted, s);
      } else {
        await(c.root, &ShmControl::posted, s, "chunk");
        std::memcpy(data + off * es, slot(c.root, s), m * es);
      }
      post(&ShmControl::consumed, s);
    }
  }

  void reduce_scatter(const BufferCall& c) {
    const std::size_t es = element_size(c.type), n = c.recv_count;
    const auto* send = static_cast<const std::byte*>(c.send);
    auto* recv = static_cast<std::byte*>(c.recv);
    const std::size_t per = elements_per_step(c.kind, chunk_, es, world_);
    std::vector<const void*> inputs(static_cast<std::size_t>(world_));
    for (std::size_t off = 0; off < n; off += per) {
      const std::size_t m = std::min(per, n - off);
      const std::uint32_t s = next_step();
      free_slot(s);
      std::byte* mine = slot(rank_, s);
      for (int j = 0; j < world_; ++j)
        std::memcpy(mine + static_cast<std::size_t>(j) * m * es, send + (static_cast<std::size_t>(j) * n + off) * es, m * es);
      post(&ShmControl::posted, s);
      for (int r = 0; r < world_; ++r)
        if (r != rank_) await(r, &ShmControl::posted, s, "chunk");
      for (int r = 0; r < world_; ++r) inputs[static_cast<std::size_t>(r)] = slot(r, s) + static_cast<std::size_t>(rank_) * m * es;
      reduce_bytes(c.type, recv + off * es, inputs, m, c.op);
      post(&ShmControl::consumed, s);
    }
  }

  int rank_;
  int world_;
  std::vector<Peer> peers_;
  std::size_t chunk_;
  std::chrono::milliseconds timeout_;
  ShmSegment own_;
  std::vector<ShmMapping> maps_;  ///< peers' segments (empty until the first run)
  std::uint32_t step_ = 0;
  std::uint32_t step_wrapped_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
  const std::string* label_ = nullptr;
};

}  // namespace detail
ACCEL_NAMESPACE_END
