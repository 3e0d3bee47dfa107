// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file p2p_store.hpp
/// @brief Point-to-point messages through the job's store: the CPU backend's path across machines
///        (and with ACCEL_CPU_SHM=0), and the NCCL backend's descriptor check and objects.
///
/// Message n from s to d is one store exchange between the two (a group exchange of the two job
/// ranks, so the store fails it at once, naming the peer, when the other end died or exited): the
/// sender contributes its descriptor, the payload's size and its first piece, the receiver its
/// descriptor; both then run the same check on the same two descriptors. Further pieces (at most
/// half a store round's budget each) follow in one exchange each, so neither a store frame nor the
/// store's memory grows with the message. Each peer and direction has a connection of its own: a
/// request holds its connection until answered, and a send waiting for its receiver must not hold
/// up a receive of the same process.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/blobs.hpp>
#include <accel/comm/store.hpp>
#include <accel/comm/wire.hpp>
#include <accel/comm/detail/p2p.hpp>
#include <accel/comm/detail/store_chunks.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief One rank's point-to-point messages through the store.
class StoreP2p {
 public:
  /// @brief How the communicator names its ranks: "rank 1" / "group rank 1 (job rank 3)", and
  /// each rank's job rank (the store watches job ranks).
  struct Names {
    std::function<std::string(int)> name;
    std::function<int(int)> job_rank;
    /// Whether a rank's communicator has ended (false when unsure; null: never asked). Asked
    /// about a waited-for peer every half second: a peer that closed its communicator but lives on
    /// keeps its store connection, so the store itself cannot tell that it will never come.
    std::function<bool(int)> closed;
  };

  /// @param store the communicator's store (further connections are made from it)
  /// @param prefix store keys of this communicator instance
  /// @param round_bytes CpuCommOptions::store_round_bytes: each piece is at most half of it
  StoreP2p(std::shared_ptr<StoreClient> store, std::string prefix, std::size_t round_bytes, int rank, std::chrono::milliseconds timeout,
           Names names)
      : store_(std::move(store)), prefix_(std::move(prefix)), piece_(store_piece_bytes(2, round_bytes)), rank_(rank), timeout_(timeout),
        names_(std::move(names)) {}
  StoreP2p(const StoreP2p&) = delete;
  StoreP2p& operator=(const StoreP2p&) = delete;
  /// @brief Ends the watcher (exchanges still waiting end with their own connections' failures).
  ~StoreP2p() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (watcher_.joinable()) watcher_.join();
  }

  /// @brief Ends every exchange in progress (each throws comm_error at once) and refuses later
  /// ones: the communicator is being destroyed, and its queue threads must not wait out the
  /// timeout for a peer that never comes.
  void abandon() noexcept {
    std::lock_guard lock(mutex_);
    abandoned_ = true;
    for (Waiting* w : waiting_) w->connection->interrupt();
  }

  /// @brief One exchange of `value` with `peer` under key `what` (of this communicator's), on the
  /// connection of that direction, so abandon() and a peer that leaves end it as they end a
  /// message's (the NCCL backend hands a pair communicator's unique id over this way).
  /// @return both entries, the sender's first
  Blobs handshake(int peer, bool sending, const std::string& what, std::span<const std::byte> value, const std::string& label) {
    return exchange(connection(sending, peer), concat(prefix_, what), peer, sending, value, label);
  }

  /// @brief Sends message `number` to `peer`; with `with_payload` false only the descriptors travel
  /// (the caller moves the data itself once accepts() agreed).
  /// @return accepts()'s verdict
  bool send(int peer, std::uint64_t number, const std::string& label, std::span<const std::byte> descriptor,
            std::span<const std::byte> head, std::span<const std::byte> body, const std::function<bool(std::span<const std::byte>)>& accepts,
            bool with_payload = true) {
    StoreClient& st = connection(true, peer);
    const std::string k = concat(prefix_, "p2p/", rank_, ">", peer, "/", number);
    const std::uint64_t total = head.size() + body.size();
    const auto first = with_payload ? static_cast<std::size_t>(std::min<std::uint64_t>(total, piece_)) : 0;
    std::vector<std::byte> buffer(first);
    if (first) copy_payload_range(buffer.data(), head, body, 0, first);
    WireWriter w;
    w.bytes(descriptor).u64(total).bytes(buffer);
    const Blobs both = exchange(st, k, peer, true, w.take(), label);
    std::span<const std::byte> theirs;
    try {
      WireReader rd(both[1]);
      theirs = rd.bytes();
      rd.expect_end();
    } catch (const wire_error& e) {
      throw_error<comm_error>(names_.name(peer), " sent a malformed answer for ", label, " (", e.what(), ")");
    }
    const std::uint64_t pieces = with_payload ? (total + piece_ - 1) / piece_ : 0;
    try {
      if (!accepts(theirs)) return false;
    } catch (const std::exception& e) {
      give_up(st, k, 1, pieces, peer, true, e.what(), label);
      throw;
    }
    for (std::uint64_t i = 1; i < pieces; ++i) {
      const auto [from, length] = piece_range(total, i, piece_);
      buffer.resize(1 + static_cast<std::size_t>(length));
      buffer[0] = std::byte{0};  // a piece (1: this end gave up, its error follows)
      copy_payload_range(buffer.data() + 1, head, body, static_cast<std::size_t>(from), buffer.size() - 1);
      const Blobs got = exchange(st, concat(k, ".", i), peer, true, buffer, concat(label, ", piece ", i + 1, " of ", pieces));
      if (!got[1].empty()) peer_gave_up(peer, got[1], label);
    }
    return true;
  }

  /// @brief Receives message `number` from `peer`: place(sender's descriptor, payload bytes) says
  /// where the payload goes (null: the descriptors do not match); with `with_payload` false only the
  /// descriptors travel.
  /// @return what place() returned
  std::byte* recv(int peer, std::uint64_t number, const std::string& label, std::span<const std::byte> descriptor,
                  const std::function<std::byte*(std::span<const std::byte>, std::uint64_t)>& place, bool with_payload = true) {
    StoreClient& st = connection(false, peer);
    const std::string k = concat(prefix_, "p2p/", peer, ">", rank_, "/", number);
    WireWriter w;
    w.bytes(descriptor);
    const Blobs both = exchange(st, k, peer, false, w.take(), label);
    std::span<const std::byte> theirs, first;
    std::uint64_t total = 0;
    try {
      WireReader rd(both[0]);
      theirs = rd.bytes();
      total = rd.u64();
      first = rd.bytes();
      rd.expect_end();
      if (first.size() != (with_payload ? std::min<std::uint64_t>(total, piece_) : 0))
        throw wire_error(concat("a first piece of ", first.size(), " bytes for ", total));
    } catch (const wire_error& e) {
      throw_error<comm_error>(names_.name(peer), " sent a malformed message for ", label, " (", e.what(), ")");
    }
    const std::uint64_t pieces = with_payload ? (total + piece_ - 1) / piece_ : 0;
    std::byte* out = nullptr;
    try {
      out = place(theirs, total);
    } catch (const std::exception& e) {  // the sender, if it accepted, waits for piece 2
      give_up(st, k, 1, pieces, peer, false, e.what(), label);
      throw;
    }
    if (!out || !with_payload) return out;
    if (!first.empty()) std::memcpy(out, first.data(), first.size());
    for (std::uint64_t i = 1; i < pieces; ++i) {
      const auto [from, length] = piece_range(total, i, piece_);
      const std::string what = concat(label, ", piece ", i + 1, " of ", pieces);
      const Blobs got = exchange(st, concat(k, ".", i), peer, false, {}, what);
      const std::span<const std::byte> piece = got[0];
      if (!piece.empty() && piece[0] == std::byte{1}) peer_gave_up(peer, piece.subspan(1), label);
      if (piece.size() != 1 + length) {
        const std::string why = concat(names_.name(peer), " sent ", piece.size() ? piece.size() - 1 : 0, " bytes for ", what, ", ", length, " expected");
        give_up(st, k, i + 1, pieces, peer, false, why, label);
        throw_error<comm_error>(why);
      }
      std::memcpy(out + from, piece.data() + 1, length);
    }
    return out;
  }

  /// @brief How long an end that gave up mid-message waits for its peer to collect the marker.
  static constexpr std::chrono::milliseconds give_up_wait{5000};

 private:
  // This end failed after the pair agreed on message `k` and before piece `next` (of `pieces`):
  // the peer, waiting in piece `next`'s exchange, gets this end's error there instead of waiting
  // out the timeout (the sender's entry is tagged 1 and carries the error; the receiver's is
  // non-empty, which a piece's answer never is). Best effort, and bounded: a peer that is not
  // there (it failed too, or stopped after the descriptors) is not waited for long.
  void give_up(StoreClient& st, const std::string& k, std::uint64_t next, std::uint64_t pieces, int peer, bool sending,
               const std::string& why, const std::string& label) noexcept {
    if (next >= pieces) return;
    try {
      WireWriter w;
      if (sending) w.u8(1);
      w.str(why);
      exchange(st, concat(k, ".", next), peer, sending, w.take(), concat(label, " (giving up)"), give_up_wait);
    } catch (...) {  // the caller throws its own error
    }
  }
  [[noreturn]] void peer_gave_up(int peer, std::span<const std::byte> marker, const std::string& label) {
    std::string why;
    try {
      WireReader rd(marker);
      why = rd.str();
    } catch (const wire_error& e) {
      why = concat("a malformed marker: ", e.what());
    }
    throw_error<comm_error>(names_.name(peer), " gave up on ", label, " midway (", names_.name(peer), ": ", why, ")");
  }

  // The connection of messages to (sending) or from `peer`, made on first use. Made outside
  // mutex_: connecting may take a while, and the exchanges of other peers (and the watcher)
  // must not wait for it. Only one call per direction and peer runs at a time, so nobody else
  // makes the same one meanwhile.
  StoreClient& connection(bool sending, int peer) {
    {
      std::lock_guard lock(mutex_);
      if (const auto it = connections_.find({sending, peer}); it != connections_.end() && it->second) return *it->second;
    }
    std::shared_ptr<StoreClient> made = store_->connect_again();
    std::lock_guard lock(mutex_);
    auto& st = connections_[{sending, peer}];
    if (!st) st = std::move(made);
    return *st;
  }

  // An exchange in progress, for the watcher: whose it is, and whether the watcher ended it.
  struct Waiting {
    StoreClient* connection;
    int peer;
    bool peer_closed = false;
  };

  // Every half second: ends the exchanges whose peer has closed its communicator.
  void watch() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, std::chrono::milliseconds(500));
      if (stopping_) return;
      std::vector<int> peers;
      for (const Waiting* w : waiting_) peers.push_back(w->peer);
      lock.unlock();  // the question is a store request: other exchanges must not wait for it
      std::vector<int> gone;
      for (const int p : peers)
        if (names_.closed(p)) gone.push_back(p);
      lock.lock();
      for (Waiting* w : waiting_)
        if (std::find(gone.begin(), gone.end(), w->peer) != gone.end()) w->peer_closed = true, w->connection->interrupt();
    }
  }

  // One exchange between this rank and `peer`, the sender's entry first. The store names the two
  // by their places in it ("group rank 1"): its errors are reworded with the peer's name here.
  Blobs exchange(StoreClient& st, const std::string& k, int peer, bool sending, std::span<const std::byte> value, const std::string& label,
                 std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    const int sender = sending ? rank_ : peer, receiver = sending ? peer : rank_;
    const int members[2] = {names_.job_rank(sender), names_.job_rank(receiver)};
    Waiting me{&st, peer};
    struct Unlisted {  // leaves waiting_ on every path out
      StoreP2p& p;
      Waiting* w;
      ~Unlisted() {
        std::lock_guard lock(p.mutex_);
        std::erase(p.waiting_, w);
      }
    };
    {
      std::lock_guard lock(mutex_);
      if (abandoned_) throw_error<comm_error>(label, ": the communicator is being destroyed");
      waiting_.push_back(&me);
      if (names_.closed && !watcher_.joinable()) watcher_ = std::thread([this] { watch(); });
    }
    Unlisted unlisted{*this, &me};
    try {
      return st.exchange(k, sending ? 0 : 1, 2, value, label, timeout, members);
    } catch (const comm_error& e) {
      bool closed = false;
      {
        std::lock_guard lock(mutex_);
        if (abandoned_) throw_error<comm_error>(label, ": the communicator is being destroyed");
        closed = me.peer_closed;
        if (closed) connections_.erase({sending, peer});  // interrupted for good; the next message connects again
      }
      if (closed) throw_error<comm_error>(names_.name(peer), " closed its communicator without taking part in ", label);
      if (dynamic_cast<const timeout_error*>(&e))
        throw_error<timeout_error>("timed out after ", text::format_ms(static_cast<std::uint64_t>(timeout_.count())), " in ", label, ": ",
                                   names_.name(peer), " did not ", sending ? "receive it" : "send it");
      const std::string how = how_peer_left(e.what());
      if (how.empty()) throw;  // not about the peer (the store itself is gone, …)
      throw_error<comm_error>(names_.name(peer), " ", how, " during ", label);
    }
  }

  std::shared_ptr<StoreClient> store_;
  std::string prefix_;
  std::size_t piece_;
  int rank_;
  std::chrono::milliseconds timeout_;
  Names names_;
  std::mutex mutex_;  ///< guards connections_, waiting_, stopping_, abandoned_
  std::map<std::pair<bool, int>, std::shared_ptr<StoreClient>> connections_;  ///< (sending?, peer)
  std::vector<Waiting*> waiting_;  ///< the exchanges in progress (see watch())
  bool stopping_ = false;
  bool abandoned_ = false;  ///< see abandon()
  std::condition_variable wake_;
  std::thread watcher_;  ///< started with the first exchange when Names::closed is given
};

/// @brief A backend's store path, made on first use, abandoned when its communicator is being
/// destroyed (the CPU and NCCL backends each hold one).
class StoreP2pSlot {
 public:
  /// @brief The store path, made on the first call.
  /// @param comm the communicator (names its ranks; its rank and timeout)
  /// @param prefix store keys of the communicator instance; @param round_bytes see StoreP2p
  /// @param closed StoreP2p::Names::closed (null: peers that close are not watched for)
  /// @throws comm_error once abandon() ran
  template <class Comm>
  StoreP2p& get(const Comm& comm, const std::shared_ptr<StoreClient>& store, const std::string& prefix, std::size_t round_bytes,
                std::function<bool(int)> closed) {
    std::lock_guard lock(m_);
    if (abandoned_) throw_error<comm_error>("point-to-point: the communicator is being destroyed");
    if (!p_)
      p_ = std::make_unique<StoreP2p>(store, prefix, round_bytes, comm.rank(), comm.timeout(),
                                      StoreP2p::Names{[&comm](int r) { return comm.rank_name(r); }, [&comm](int r) { return comm.job_rank(r); },
                                                      std::move(closed)});
    return *p_;
  }
  /// @brief Ends the exchanges in progress and refuses later ones (StoreP2p::abandon), and makes
  /// no store path any more: the first step of the communicator's destructor.
  void abandon() noexcept {
    std::lock_guard lock(m_);
    abandoned_ = true;
    if (p_) p_->abandon();
  }
  /// @brief Hands the store path over (once no call uses it), for the caller to destroy outside
  /// its own locks (the watcher may take them).
  std::unique_ptr<StoreP2p> release() noexcept {
    std::lock_guard lock(m_);
    return std::move(p_);
  }

 private:
  std::mutex m_;  ///< guards p_, abandoned_
  std::unique_ptr<StoreP2p> p_;
  bool abandoned_ = false;
};

}  // namespace detail
ACCEL_NAMESPACE_END
