// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file thread_world.hpp
/// @brief Ranks as threads (gloo's spawnThreads): an in-process communicator over shared buffers.
///
/// run_world(n, fn) starts n threads, each calling fn(comm) with its own ThreadCommunicator, and
/// returns each rank's exception (null when it returned normally). A rank that returns or throws
/// is "gone": ranks still waiting for it in a round get a comm_error naming it, as with real
/// processes, so failure propagation is tested without sockets. split() makes groups whose rounds
/// are their own (a hub per group), and a gone rank is named in every group it belongs to.
#pragma once

#include <accel/comm/communicator.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace accel_test {

/// @brief The shared state of one thread world, or of one group of it (split()): a group's hub
/// shares the world's lock and knows which ranks are gone by their job ranks.
class ThreadHub {
  struct World {
    explicit World(int n) : gone(static_cast<std::size_t>(n)) {}
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::optional<std::string>> gone;                 ///< by job rank
    std::map<std::string, std::shared_ptr<ThreadHub>> groups;     ///< by parent hub, split and color
  };

 public:
  explicit ThreadHub(int n) : world_(std::make_shared<World>(n)), n_(n) {}
  ThreadHub(std::shared_ptr<World> world, std::vector<int> members)
      : world_(std::move(world)), n_(static_cast<int>(members.size())), members_(std::move(members)) {}

  /// @brief Marks a job rank as finished (returned or threw) and wakes every waiter, in every group.
  void leave(int rank, std::string how) {
    std::lock_guard lock(world_->m);
    world_->gone[static_cast<std::size_t>(rank)] = std::move(how);
    world_->cv.notify_all();
  }

  /// @brief The hub of one group of a split of this hub: the first of its members to ask makes it.
  std::shared_ptr<ThreadHub> group(std::uint64_t split_seq, int color, const std::vector<int>& job_ranks) {
    std::lock_guard lock(world_->m);
    auto& hub = world_->groups[accel::detail::concat(static_cast<const void*>(this), "/", split_seq, "/", color)];
    if (!hub) hub = std::make_shared<ThreadHub>(world_, job_ranks);
    return hub;
  }

  /// @brief Point-to-point, sending side: leaves message `n` from `src` to `dst` (descriptor and
  /// a copy of the payload) and waits for the receiver's descriptor.
  std::vector<std::byte> post_message(int src, int dst, std::uint64_t n, std::vector<std::byte> descriptor, std::vector<std::byte> payload,
                                      const std::string& label, std::chrono::milliseconds timeout) {
    std::unique_lock lock(world_->m);
    Mail& mail = mail_[{src, dst}][n];
    mail.descriptor = std::move(descriptor), mail.payload = std::move(payload), mail.posted = true;
    world_->cv.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      Mail& m = mail_[{src, dst}][n];
      if (m.answer) {
        auto answer = std::move(*m.answer);
        mail_[{src, dst}].erase(n);
        return answer;
      }
      if (const auto& gone = world_->gone[static_cast<std::size_t>(job_rank(dst))])
        accel::detail::throw_error<accel::comm_error>(name(dst), " ", *gone, " before receiving ", label);
      if (world_->cv.wait_until(lock, deadline) == std::cv_status::timeout && !mail_[{src, dst}][n].answer)
        accel::detail::throw_error<accel::timeout_error>("timed out in ", label, ": ", name(dst), " did not receive it");
    }
  }

  /// @brief Point-to-point, receiving side: waits for message `n` from `src` to `dst`, hands its
  /// descriptor and payload to `take` (under the world's lock), then answers with `descriptor`.
  template <class Take>
  void take_message(int src, int dst, std::uint64_t n, const std::vector<std::byte>& descriptor, const std::string& label,
                    std::chrono::milliseconds timeout, Take&& take) {
    std::unique_lock lock(world_->m);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      Mail& m = mail_[{src, dst}][n];
      if (m.posted) break;
      if (const auto& gone = world_->gone[static_cast<std::size_t>(job_rank(src))])
        accel::detail::throw_error<accel::comm_error>(name(src), " ", *gone, " before sending ", label);
      if (world_->cv.wait_until(lock, deadline) == std::cv_status::timeout && !mail_[{src, dst}][n].posted)
        accel::detail::throw_error<accel::timeout_error>("timed out in ", label, ": ", name(src), " did not send it");
    }
    Mail& m = mail_[{src, dst}][n];
    take(std::span<const std::byte>(m.descriptor), std::span<const std::byte>(m.payload));
    m.answer = descriptor;
    world_->cv.notify_all();
  }

  accel::Blobs deposit_and_wait(int rank, std::uint64_t seq, std::vector<std::byte> entry, const std::string& label,
                                std::chrono::milliseconds timeout) {
    std::unique_lock lock(world_->m);
    Slot& s = slots_[seq];
    if (s.entries.empty()) s.entries.resize(static_cast<std::size_t>(n_));
    s.entries[static_cast<std::size_t>(rank)] = std::move(entry);
    ++s.arrived;
    world_->cv.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      Slot& slot = slots_[seq];
      if (slot.arrived == n_) break;
      for (int r = 0; r < n_; ++r)
        if (const auto& gone = world_->gone[static_cast<std::size_t>(job_rank(r))]; !slot.entries[static_cast<std::size_t>(r)] && gone)
          accel::detail::throw_error<accel::comm_error>(name(r), " ", *gone, " without joining ", label);
      if (world_->cv.wait_until(lock, deadline) == std::cv_status::timeout && slots_[seq].arrived < n_) {
        std::string missing;
        for (int r = 0; r < n_; ++r)
          if (!slots_[seq].entries[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        accel::detail::throw_error<accel::timeout_error>("timed out in ", label, ": ranks ", missing, " have not arrived");
      }
    }
    Slot& done = slots_[seq];
    accel::Blobs out;
    for (const auto& e : done.entries) out.push_back(*e);
    if (++done.collected == n_) slots_.erase(seq);
    return out;
  }

 private:
  struct Mail {
    bool posted = false;
    std::vector<std::byte> descriptor, payload;
    std::optional<std::vector<std::byte>> answer;  ///< the receiver's descriptor, once it took the message
  };
  struct Slot {
    std::vector<std::optional<std::vector<std::byte>>> entries;
    int arrived = 0;
    int collected = 0;
  };
  int job_rank(int r) const { return members_.empty() ? r : members_[static_cast<std::size_t>(r)]; }
  std::string name(int r) const {
    return members_.empty() ? accel::detail::concat("rank ", r) : accel::detail::concat("group rank ", r, " (job rank ", job_rank(r), ")");
  }
  std::shared_ptr<World> world_;
  int n_;
  std::vector<int> members_;  ///< a group's: the job rank of each of its ranks (empty: the world's)
  std::map<std::uint64_t, Slot> slots_;  ///< guarded by world_->m
  std::map<std::pair<int, int>, std::map<std::uint64_t, Mail>> mail_;  ///< (sender, receiver) -> message number; guarded by world_->m
};

/// @brief One rank's communicator in a thread world.
class ThreadCommunicator final : public accel::Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadHub> hub, int rank, int size, std::chrono::milliseconds timeout)
      : Communicator(rank, size, timeout), hub_(std::move(hub)) {}
  [[nodiscard]] std::string backend() const override { return "threads"; }
  ~ThreadCommunicator() override { stop_p2p(); }

 protected:
  accel::CollectiveHandle p2p_send(const P2pSend& m) override {
    const auto answer = hub_->post_message(rank(), m.peer, m.number, {m.descriptor.begin(), m.descriptor.end()}, m.data.joined(), m.label,
                                           timeout());
    m.accepts(answer);
    return {};
  }
  accel::CollectiveHandle p2p_recv(const P2pRecv& m) override {
    hub_->take_message(m.peer, rank(), m.number, {m.descriptor.begin(), m.descriptor.end()}, m.label, timeout(),
                       [&](std::span<const std::byte> descriptor, std::span<const std::byte> payload) {
                         if (std::byte* at = m.place(descriptor, payload.size()); at && !payload.empty())
                           std::memcpy(at, payload.data(), payload.size());
                       });
    return {};
  }

  std::shared_ptr<accel::Communicator> make_group(const accel::GroupSpec& spec) override {
    if (spec.color == accel::no_group) return nullptr;
    return std::make_shared<ThreadCommunicator>(hub_->group(spec.split_seq, spec.color, spec.job_ranks), spec.rank,
                                                static_cast<int>(spec.members.size()), timeout());
  }

  Round exchange(std::uint64_t seq, const std::string& label, std::span<const std::byte> header,
                 const accel::Payload& payload) override {
    // Entry = u32 header size, header, payload (the same framing idea as the CPU backend).
    std::vector<std::byte> entry(4 + header.size() + payload.size());
    const auto hs = static_cast<std::uint32_t>(header.size());
    std::memcpy(entry.data(), &hs, 4);
    std::copy(header.begin(), header.end(), entry.begin() + 4);
    payload.copy_to(entry.data() + 4 + header.size());
    accel::Blobs all = hub_->deposit_and_wait(rank(), seq, std::move(entry), label, timeout());
    Round r;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto e = all[i];
      std::uint32_t n = 0;
      std::memcpy(&n, e.data(), 4);
      r.headers.push_back(e.subspan(4, n));
      r.payloads.push_back(e.subspan(4 + n));
    }
    return r;
  }

 private:
  std::shared_ptr<ThreadHub> hub_;
};

/// @brief Runs fn(comm) on n threads, one per rank; returns each rank's exception (null if none).
template <class Fn>
std::vector<std::exception_ptr> run_world(int n, Fn fn, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto hub = std::make_shared<ThreadHub>(n);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(hub, r, n, timeout);
      try {
        fn(comm);
        hub->leave(r, "returned");
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        hub->leave(r, "threw (" + accel::detail::exception_message(std::current_exception()) + ")");
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

/// @brief run_world, rethrowing the first rank's exception.
template <class Fn>
void run_world_ok(int n, Fn fn, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  for (auto& e : run_world(n, std::move(fn), timeout))
    if (e) std::rethrow_exception(e);
}

/// @brief The message of a rank's exception ("" when it returned normally).
inline std::string message(const std::exception_ptr& e) { return e ? accel::detail::exception_message(e) : std::string(); }

/// @brief World sizes the collectives are tested at (gloo's 1, 2, 4, 7 plus 3 for odd remainders).
inline const std::vector<int> world_sizes = {1, 2, 3, 4, 7};

}  // namespace accel_test

/// @brief Catch2 assertions are not thread-safe: rank threads check with this and throw instead,
/// and the test asserts on the collected exceptions from the main thread.
#define ACCEL_TEST_ENSURE(...)                                                                                   \
  do {                                                                                                           \
    if (!(__VA_ARGS__)) throw std::runtime_error("ensure failed: " #__VA_ARGS__ " (line " + std::to_string(__LINE__) + ")"); \
  } while (false)
