// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file communicator.hpp
/// @brief Communicator: the seam every backend (CPU over TCP, NCCL, in-process threads) implements.
///
/// A backend only implements one round, exchange(): every rank contributes a small header and a
/// payload and receives everyone's. This base class turns rounds into all_gather / broadcast /
/// barrier, runs the buffer collectives (run_buffer(): a checked round of descriptors, then the
/// backend's data step, by default rounds of raw bytes) and adds what must hold for every backend:
/// - a sequence check: each round carries its number and operation, so a collective called on only
///   some ranks, or different collectives on different ranks, is reported instead of hanging;
/// - failure markers: a rank whose local step failed still joins the round, flagged, so every
///   other rank throws a comm_error naming it while the failed rank rethrows its own error.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/comm/wire.hpp>
#include <accel/runtime/error.hpp>
#include <accel/comm/blobs.hpp>
#include <accel/comm/reduce.hpp>
#include <accel/comm/detail/p2p.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

/// @brief What each rank says about the round it joins.
struct RoundHeader {
  std::uint64_t seq = 0;
  std::string op;
  std::int32_t root = -1;
  bool failed = false;
  std::string failure;  ///< the local error's message when failed
};

inline std::vector<std::byte> encode_round_header(const RoundHeader& h) {
  WireWriter w;
  w.u64(h.seq).i32(h.root).u8(h.failed ? 1 : 0).str(h.op).str(h.failure);
  return w.take();
}

inline RoundHeader decode_round_header(std::span<const std::byte> b, int rank) {
  try {
    WireReader r(b);
    RoundHeader h;
    h.seq = r.u64(), h.root = r.i32(), h.failed = r.u8() != 0, h.op = r.str(), h.failure = r.str();
    r.expect_end();
    return h;
  } catch (const error& e) {
    throw_error<comm_error>("rank ", rank, " sent a malformed collective header (", e.what(), ")");
  }
}

inline std::string exception_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace detail

/// @brief The color of a rank that joins no group in split() (MPI_UNDEFINED): it gets null.
inline constexpr int no_group = -1;

/// @brief What a backend needs to make the communicator of this rank's group in a split
/// (Communicator::make_group()). Every rank of the parent gets one, no_group ranks included.
struct GroupSpec {
  std::uint64_t split_seq = 0;  ///< the parent's round number of the split: the same on every rank, new for each split
  int color = no_group;         ///< this rank's color; no_group: it joins no group
  int rank = -1;                ///< this rank's rank in its group (-1 for no_group)
  std::vector<int> members;     ///< the parent ranks of the group, in group rank order (empty for no_group)
  std::vector<int> job_ranks;   ///< the job ranks of the same members
};

namespace detail {

/// @brief What one rank says in a split's round.
struct SplitEntry {
  int color = no_group;
  int key = 0;
};

/// @brief This rank's group in a split (pure, MPI_Comm_split's rule): the ranks of its color,
/// ordered by key, ties by parent rank. `job_ranks` stays empty (the caller maps members).
inline GroupSpec plan_group(std::span<const SplitEntry> all, int me) {
  GroupSpec g;
  g.color = all[static_cast<std::size_t>(me)].color;
  if (g.color == no_group) return g;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].color == g.color) g.members.push_back(static_cast<int>(i));
  std::stable_sort(g.members.begin(), g.members.end(), [&](int a, int b) {
    return all[static_cast<std::size_t>(a)].key < all[static_cast<std::size_t>(b)].key;
  });
  g.rank = static_cast<int>(std::find(g.members.begin(), g.members.end(), me) - g.members.begin());
  return g;
}

}  // namespace detail

/// @brief What one rank contributes to a round: its bytes, in two pieces that travel as one
/// (`head` then `body`). The typed collectives put their encoding in `head` and point `body` at the
/// value's own memory when it is plain data, so a large payload is not copied before it is sent.
struct Payload {
  std::span<const std::byte> head;
  std::span<const std::byte> body;

  Payload() = default;
  /// @brief One contiguous piece.
  Payload(std::span<const std::byte> bytes) : head(bytes) {}  // NOLINT(google-explicit-constructor): bytes are a payload
  Payload(const std::vector<std::byte>& bytes) : head(bytes) {}  // NOLINT(google-explicit-constructor)
  Payload(std::span<const std::byte> h, std::span<const std::byte> b) : head(h), body(b) {}

  [[nodiscard]] std::size_t size() const noexcept { return head.size() + body.size(); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  /// @brief Writes both pieces to `out` (size() bytes).
  void copy_to(std::byte* out) const noexcept {
    if (!head.empty()) std::memcpy(out, head.data(), head.size());
    if (!body.empty()) std::memcpy(out + head.size(), body.data(), body.size());
  }
  /// @brief Both pieces as one new vector.
  [[nodiscard]] std::vector<std::byte> joined() const {
    std::vector<std::byte> out(size());
    copy_to(out.data());
    return out;
  }
};

/// @brief A group of `size()` processes (or threads) that run collectives together.
///
/// @note Every public member function except the accessors is collective: every rank must call
/// it, in the same order, with the same operation name (and root).
class Communicator {
 public:
  virtual ~Communicator() { stop_p2p(); }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// @brief This member's rank, 0 .. size()-1.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// @brief Number of members.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// @brief The job rank of member `r`: `r` itself on the job's communicator, its place in the
  /// job on a group's (split()).
  [[nodiscard]] int job_rank(int r) const { return job_ranks_.empty() ? r : job_ranks_.at(static_cast<std::size_t>(r)); }
  /// @brief Whether this is a group's communicator (made by split()) rather than the job's.
  [[nodiscard]] bool is_group() const noexcept { return !job_ranks_.empty(); }
  /// @brief How messages name member `r`: "rank 2", or "group rank 1 (job rank 3)" in a group.
  [[nodiscard]] std::string rank_name(int r) const {
    return is_group() ? detail::concat("group rank ", r, " (job rank ", job_rank(r), ")") : detail::concat("rank ", r);
  }
  /// @brief Bound on every wait.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// @brief "cpu", "nccl", "solo", "threads".
  [[nodiscard]] virtual std::string backend() const = 0;
  /// @brief Number of collectives entered so far (the next one gets number collectives_entered()+1).
  [[nodiscard]] std::uint64_t collectives_entered() const noexcept { return seq_; }
  /// @brief The buffer the typed collectives encode into, reused between calls so large payloads
  /// do not fault in fresh pages each time (it keeps the largest payload's capacity).
  [[nodiscard]] std::vector<std::byte>& send_buffer() noexcept { return send_buffer_; }

  /// @brief Every rank's bytes, in rank order.
  /// @param op the operation's name, checked across ranks ("gather_object")
  /// @param failure non-null when this rank's local step failed: it joins flagged, with no data
  /// @throws comm_error naming the rank(s) when another rank failed, the ranks disagree on the
  ///         operation, or a rank died; timeout_error naming the missing ranks after timeout()
  /// @throws (the original exception) on the rank whose `failure` it is
  /// @note collective
  Blobs all_gather(std::string_view op, Payload data, std::exception_ptr failure = nullptr) {
    return round(op, data, -1, std::move(failure));
  }

  /// @brief Root's bytes, on every rank.
  /// @throws usage_error when root is not a rank; otherwise as all_gather()
  /// @note collective
  std::vector<std::byte> broadcast(std::string_view op, Payload data, int root, std::exception_ptr failure = nullptr) {
    ACCEL_EXPECTS(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of this ", size_, "-process job");
    Blobs all = round(op, rank_ == root ? data : Payload(), root, std::move(failure));
    const auto mine = all[static_cast<std::size_t>(root)];
    return {mine.begin(), mine.end()};
  }

  /// @brief Returns once every rank called it.
  /// @note collective
  void barrier(std::string_view op = "wait_for_everyone", std::exception_ptr failure = nullptr) {
    round(op, {}, -1, std::move(failure));
  }

  /// @brief A buffer collective (all_gather, all_reduce, broadcast, reduce_scatter over spans).
  ///
  /// First a round of descriptors (operation, element type, reduction, lengths) checked across
  /// ranks, then the backend's data step (buffer_data()).
  /// @throws usage_error on every rank when the ranks' element types, operators or lengths differ
  ///         (naming them), or on this rank when its spans do not fit the operation (the others
  ///         then throw comm_error naming it)
  /// @throws comm_error / timeout_error as all_gather()
  /// @note collective
  CollectiveHandle run_buffer(const BufferCall& call) {
    std::exception_ptr failure;
    try {
      if (auto problem = detail::local_problem(call, size_, rank_); !problem.empty()) detail::throw_error<usage_error>(problem);
      prepare_buffers(call);
    } catch (...) {
      failure = std::current_exception();
    }
    const auto mine = detail::encode_descriptor(detail::describe(call));
    const std::string op(buffer_op_name(call.kind));
    const Blobs all = round(op, failure ? Payload() : Payload(mine), call.kind == BufferOp::broadcast ? call.root : -1, failure);
    const std::string label = detail::concat(op, " #", seq_);
    std::vector<detail::BufferDescriptor> descriptors;
    for (std::size_t i = 0; i < all.size(); ++i) descriptors.push_back(detail::decode_descriptor(all[i], static_cast<int>(i)));
    detail::check_descriptors(descriptors, label);
    return buffer_data(call, label);
  }

  /// @name Point-to-point
  /// The seam under accel::send / recv / send_object / recv_object (p2p.hpp): one message from
  /// this rank to another, matched by order between the pair (the n-th message this rank sends to
  /// rank d is the n-th that rank d receives from it). Not collective: only the two ends call.
  ///
  /// Sends are synchronous: send_message returns once the receiver took the message (it has
  /// checked the descriptors; the payload is on its way or delivered), so two ranks that both send
  /// to each other first wait for each other until the timeout; use send_message_async on one side
  /// (or order the calls). The *_async forms run on a queue per peer and direction, in the order
  /// they were called; a plain call after them waits for them first.
  ///@{

  /// @brief Sends `data` (described by `d`) to rank `dst`.
  /// @param stream a device backend's stream (a `cudaStream_t`) to enqueue the transfer on,
  ///        returning once it is enqueued (the descriptors are checked first, on the host); null:
  ///        the backend's own, and the transfer has finished when this returns. Host backends
  ///        ignore it (callers synchronise it first).
  /// @throws usage_error when dst is this rank or not a rank (nothing is sent); on both ends when
  ///         the receiver expects another kind, element type, length or object type (naming both
  ///         ranks and what each passed)
  /// @throws comm_error naming dst when it died, exited or closed its communicator first;
  ///         timeout_error when it did not receive within timeout()
  void send_message(int dst, const detail::P2pDescriptor& d, Payload data, void* stream = nullptr) {
    check_peer("send", dst);
    const std::uint64_t n = ++p2p_sent_[dst];
    run_in_order(p2p_queue(false, dst), p2p_label(rank_, dst, n), [&] { settle(do_send(dst, n, d, data, stream), stream); });
  }
  /// @brief send_message, returning at once; `data` must stay valid until the handle's wait(),
  /// which rethrows what the send threw, and returns once the transfer finished (with a
  /// `stream`: once the work enqueued on it finished).
  /// @throws usage_error at once when dst is this rank or not a rank
  [[nodiscard]] CollectiveHandle send_message_async(int dst, detail::P2pDescriptor d, Payload data, void* stream = nullptr) {
    check_peer("send", dst);
    const std::uint64_t n = ++p2p_sent_[dst];
    auto device = std::make_shared<CollectiveHandle>();
    auto outcome = p2p_queue(false, dst).push([this, dst, n, d = std::move(d), data, stream, device] {
      *device = settle(do_send(dst, n, d, data, stream), stream);
    }, p2p_label(rank_, dst, n));
    return CollectiveHandle([outcome, device] {
      outcome->wait();
      device->wait();
    });
  }
  /// @brief Tells rank `dst` that this rank's next message to it failed before it could be sent
  /// (its value did not encode): `dst`'s matching receive throws comm_error naming this rank and
  /// `why` instead of waiting, and the pair's later messages stay in step. Blocks like
  /// send_message; a failure to deliver the marker is not reported (the caller rethrows its own).
  /// @param d what the message would have been (its type; the count is ignored)
  /// @throws usage_error when dst is this rank or not a rank
  void send_message_failed(int dst, detail::P2pDescriptor d, std::string why) {
    check_peer("send", dst);
    const std::uint64_t n = ++p2p_sent_[dst];
    d.count = 0, d.failure = why.empty() ? std::string("an unnamed error") : std::move(why);
    try {
      run_in_order(p2p_queue(false, dst), p2p_label(rank_, dst, n), [&] { settle(do_send(dst, n, d, Payload()), nullptr); });
    } catch (const error&) {  // the marker did not reach dst (gone, timed out): the caller's error says more
    }
  }
  /// @brief Receives the next message from rank `src`, which must match `d` (for an object,
  /// its type; its size is the sender's): `place(bytes)` gives where its payload goes.
  /// @throws as send_message, with src for dst
  void recv_message(int src, const detail::P2pDescriptor& d, const std::function<std::byte*(std::uint64_t)>& place,
                    void* stream = nullptr) {
    check_peer("recv", src);
    const std::uint64_t n = ++p2p_received_[src];
    run_in_order(p2p_queue(true, src), p2p_label(src, rank_, n), [&] { settle(do_recv(src, n, d, place, stream), stream); });
  }
  /// @brief recv_message, returning at once; `place` and what it returns must stay valid until the
  /// handle's wait(), which rethrows what the receive threw (see send_message_async for `stream`).
  [[nodiscard]] CollectiveHandle recv_message_async(int src, detail::P2pDescriptor d, std::function<std::byte*(std::uint64_t)> place,
                                      void* stream = nullptr) {
    check_peer("recv", src);
    const std::uint64_t n = ++p2p_received_[src];
    auto device = std::make_shared<CollectiveHandle>();
    auto outcome = p2p_queue(true, src).push([this, src, n, d = std::move(d), place = std::move(place), stream, device] {
      *device = settle(do_recv(src, n, d, place, stream), stream);
    }, p2p_label(src, rank_, n));
    return CollectiveHandle([outcome, device] {
      outcome->wait();
      device->wait();
    });
  }
  ///@}

  /// @brief True when the buffer collectives take device memory (NCCL), false for host memory.
  [[nodiscard]] virtual bool device_buffers() const noexcept { return false; }

  /// @brief The communicator of this rank's group (MPI_Comm_split): the ranks that pass the same
  /// `color` form a group, ordered by `key`, ties by rank here. One round hands every rank's
  /// (color, key) to everyone, then the backend makes the group's communicator, whose rounds and
  /// memory are its own: collectives of different groups (and of this communicator) never mix.
  /// @param color 0 or more; no_group: this rank joins no group and gets null
  /// @param key any number; orders the group
  /// @throws usage_error on every rank when a rank passes a negative color other than no_group
  ///         (on that rank; the others throw comm_error naming it)
  /// @throws comm_error / timeout_error as all_gather() (a rank calling another collective meanwhile
  ///         is a collective mismatch)
  /// @note collective over this communicator; the group's own setup is collective over the group
  std::shared_ptr<Communicator> split(int color, int key) {
    std::exception_ptr failure;
    try {
      if (color < 0 && color != no_group)
        detail::throw_error<usage_error>("split: color ", color, " is negative; pass a color of 0 or more, or accel::no_group (",
                                         no_group, ") on a rank that joins no group");
    } catch (...) {
      failure = std::current_exception();
    }
    detail::WireWriter w;
    w.i32(color).i32(key);
    const auto mine = w.take();
    const Blobs all = all_gather("split", failure ? Payload() : Payload(mine), failure);
    std::vector<detail::SplitEntry> entries;
    for (std::size_t i = 0; i < all.size(); ++i) {
      try {
        detail::WireReader rd(all[i]);
        detail::SplitEntry e{rd.i32(), rd.i32()};
        rd.expect_end();
        if (e.color < 0 && e.color != no_group) throw detail::wire_error(detail::concat("color ", e.color));
        entries.push_back(e);
      } catch (const detail::wire_error& e) {
        detail::throw_error<comm_error>(rank_name(static_cast<int>(i)), " sent a malformed split entry (", e.what(), ")");
      }
    }
    GroupSpec spec = detail::plan_group(entries, rank_);
    spec.split_seq = seq_;
    for (const int m : spec.members) spec.job_ranks.push_back(job_rank(m));
    std::shared_ptr<Communicator> group = make_group(spec);
    if (spec.color == no_group) return nullptr;
    const int want = static_cast<int>(spec.members.size());
    if (!group || group->rank() != spec.rank || group->size() != want)
      detail::throw_error<comm_error>(backend(), " backend made ", group ? detail::concat("rank ", group->rank(), " of ", group->size())
                                                                        : std::string("no communicator"),
                                      " for group rank ", spec.rank, " of ", want, " (color ", color, ")");
    group->job_ranks_ = spec.job_ranks;
    return group;
  }

 protected:
  /// @brief A message as the sending backend gets it (p2p_send()).
  struct P2pSend {
    int peer = -1;                                   ///< the receiver
    std::uint64_t number = 0;                        ///< 1, 2, … among this rank's messages to `peer`
    std::string label;                               ///< "message #2 from rank 0 to rank 1", for errors
    std::span<const std::byte> descriptor;           ///< this end's, encoded (at most p2p_descriptor_max_bytes)
    Payload data;                                    ///< the payload (its size follows from the descriptor)
    void* stream = nullptr;                          ///< device backends: the caller's stream (null: the backend's own)
    /// Called once with the receiver's descriptor: false when the two do not match (the backend then
    /// returns without sending the rest; the receiver reaches the same verdict and stops too).
    std::function<bool(std::span<const std::byte>)> accepts;
  };
  /// @brief A message as the receiving backend gets it (p2p_recv()).
  struct P2pRecv {
    int peer = -1;                                   ///< the sender
    std::uint64_t number = 0;                        ///< 1, 2, … among this rank's messages from `peer`
    std::string label;
    std::span<const std::byte> descriptor;           ///< this end's, encoded; the backend hands it to the sender
    void* stream = nullptr;                          ///< device backends: the caller's stream (null: the backend's own)
    /// Called once with the sender's descriptor and payload size: where the payload goes, or null
    /// when the two do not match (the backend then answers the sender and returns).
    std::function<std::byte*(std::span<const std::byte>, std::uint64_t)> place;
  };
  /// @brief The backend's send: hands `m.descriptor` to the receiver, gets its descriptor back,
  /// asks m.accepts() and, if it agrees, delivers the payload. Returns once the receiver has the
  /// descriptors (the payload may still be on its way, but `m.data` is no longer read), or, on a
  /// device backend, once the transfer is enqueued: the handle then waits for it (empty: done).
  /// @throws comm_error naming the peer when it left; timeout_error after timeout()
  virtual CollectiveHandle p2p_send(const P2pSend& m) {
    detail::throw_error<unavailable_error>("the ", backend(), " backend has no point-to-point messages (", m.label, ")");
  }
  /// @brief The backend's receive: gets the sender's descriptor, asks m.place(), answers with
  /// m.descriptor, and if place() gave memory, writes the payload there before returning (a device
  /// backend may return once the transfer is enqueued, with a handle that waits for it).
  virtual CollectiveHandle p2p_recv(const P2pRecv& m) {
    detail::throw_error<unavailable_error>("the ", backend(), " backend has no point-to-point messages (", m.label, ")");
  }
  /// @brief Ends the async point-to-point queues (the running call finishes, queued ones fail):
  /// a backend's destructor calls it first, before its own members go.
  void stop_p2p() noexcept {
    p2p_closing_ = true;
    for (auto& [key, q] : p2p_queues_) q->stop();
  }
  /// @brief True once the communicator is being destroyed (backends' waits may end early).
  [[nodiscard]] bool p2p_closing() const noexcept { return p2p_closing_; }

  /// @brief Makes the communicator of this rank's group in a split (called on every rank of this
  /// communicator, in step, right after the split's round). Returns null for a no_group rank (a
  /// backend whose split is collective over the parent, as NCCL's, takes part first); otherwise a
  /// communicator of rank spec.rank among spec.members.size() whose rounds use names, keys and
  /// memory of their own.
  virtual std::shared_ptr<Communicator> make_group(const GroupSpec& spec) = 0;

  /// @param rank this member's rank; @param size members; @param timeout bound on every wait
  /// @throws usage_error when rank is not in [0, size)
  Communicator(int rank, int size, std::chrono::milliseconds timeout) : rank_(rank), size_(size), timeout_(timeout) {
    ACCEL_EXPECTS(size > 0 && rank >= 0 && rank < size, "communicator: rank ", rank, " is not in [0, ", size, ")");
  }

  /// @brief One round's results: every rank's header and payload, in rank order.
  struct Round {
    Blobs headers;
    Blobs payloads;
  };

  /// @brief The backend's one primitive: contribute (header, payload), receive everyone's.
  /// @param seq the round's number (1, 2, …), equal on every rank that is in step
  /// @param label "gather_object #3", for messages
  /// @throws comm_error / timeout_error naming the rank(s) that died or did not arrive
  virtual Round exchange(std::uint64_t seq, const std::string& label, std::span<const std::byte> header, const Payload& payload) = 0;

  /// @brief This rank's preparation for a buffer collective, before the descriptor round (a
  /// backend creates what peers will open after it); what it throws travels as a failure marker.
  virtual void prepare_buffers(const BufferCall&) {}

  /// @brief The data step of a buffer collective whose descriptors matched on every rank.
  ///
  /// The default moves raw bytes in rounds (one all-gather; every rank reduces in rank order), so
  /// any backend has the buffer collectives; backends override it with a faster path.
  /// @param label "all_reduce #4", for messages
  virtual CollectiveHandle buffer_data(const BufferCall& c, const std::string& label) {
    const std::size_t es = element_size(c.type);
    const std::string op = detail::concat(buffer_op_name(c.kind), ".data");
    if (c.kind == BufferOp::broadcast) {
      const std::span<const std::byte> mine(static_cast<const std::byte*>(c.send), c.send_count * es);
      const auto got = broadcast(op, mine, c.root);
      expect_bytes(got.size(), mine.size(), c.root, label);
      if (rank_ != c.root && !got.empty()) std::memcpy(c.recv, got.data(), got.size());
      return {};
    }
    const Blobs all = all_gather(op, std::span<const std::byte>(static_cast<const std::byte*>(c.send), c.send_count * es));
    const std::size_t sent = c.send_count * es;
    for (std::size_t i = 0; i < all.size(); ++i) expect_bytes(all[i].size(), sent, static_cast<int>(i), label);
    if (c.kind == BufferOp::all_gather) {
      for (std::size_t i = 0; i < all.size(); ++i)
        if (sent) std::memcpy(static_cast<std::byte*>(c.recv) + i * sent, all[i].data(), sent);
      return {};
    }
    // all_reduce / reduce_scatter: reduce this rank's block (all of it for all_reduce) in rank order.
    const std::size_t block = c.recv_count * es;
    const std::size_t from = c.kind == BufferOp::reduce_scatter ? static_cast<std::size_t>(rank_) * block : 0;
    std::vector<std::vector<std::byte>> aligned;  // parts not aligned for their element type, copied
    std::vector<const void*> inputs;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const std::byte* p = all[i].data() + from;
      if (reinterpret_cast<std::uintptr_t>(p) % es != 0) p = aligned.emplace_back(p, p + block).data();
      inputs.push_back(p);
    }
    detail::reduce_bytes(c.type, c.recv, inputs, c.recv_count, c.op);
    return {};
  }

 private:
  void check_peer(const char* op, int peer) const {
    if (peer == rank_)
      detail::throw_error<usage_error>(op, ": ", rank_name(rank_), " cannot ", std::string_view(op) == "send" ? "send to" : "receive from",
                                       " itself; pass another rank of this ", size_, "-rank communicator");
    if (peer < 0 || peer >= size_)
      detail::throw_error<usage_error>(op, ": ", peer, " is not a rank of this ", size_, "-rank communicator (ranks 0 to ", size_ - 1, ")");
  }
  detail::P2pQueue& p2p_queue(bool receive, int peer) {
    auto& q = p2p_queues_[{receive, peer}];
    if (!q) q = std::make_unique<detail::P2pQueue>();
    return *q;
  }
  // A plain call runs here unless async calls of its queue are pending: then after them, in order.
  template <class Fn>
  static void run_in_order(detail::P2pQueue& q, std::string label, Fn&& fn) {
    if (q.idle()) return fn();
    q.push(std::function<void()>(std::forward<Fn>(fn)), std::move(label))->wait();
  }
  std::string p2p_label(int from, int to, std::uint64_t n) const {
    return detail::concat("message #", n, " from ", rank_name(from), " to ", rank_name(to));
  }
  // A finished call's device work: waited for without a caller's stream (the plain calls' promise),
  // else left to run on that stream (the handle, for *_async).
  static CollectiveHandle settle(CollectiveHandle h, void* stream) {
    if (!stream) h.wait();
    return h;
  }
  CollectiveHandle do_send(int dst, std::uint64_t n, const detail::P2pDescriptor& d, const Payload& data, void* stream = nullptr) {
    const auto mine = detail::encode_p2p_descriptor(d);
    std::string mismatch;
    P2pSend m;
    m.peer = dst, m.number = n, m.label = p2p_label(rank_, dst, n), m.descriptor = mine, m.data = data, m.stream = stream;
    m.accepts = [&](std::span<const std::byte> theirs) {
      if (!d.failure.empty()) return false;  // a failure marker: the receiver throws, nothing else moves
      mismatch = detail::p2p_mismatch(d, detail::decode_p2p_descriptor(theirs, rank_name(dst)), rank_name(rank_), rank_name(dst), m.label);
      return mismatch.empty();
    };
    CollectiveHandle h = in_step(false, dst, m.label, [&] { return p2p_send(m); });
    if (!mismatch.empty()) detail::throw_error<usage_error>(mismatch);
    return h;
  }
  CollectiveHandle do_recv(int src, std::uint64_t n, const detail::P2pDescriptor& d, const std::function<std::byte*(std::uint64_t)>& place,
                           void* stream = nullptr) {
    const auto mine = detail::encode_p2p_descriptor(d);
    std::string mismatch, failed;
    P2pRecv m;
    m.peer = src, m.number = n, m.label = p2p_label(src, rank_, n), m.descriptor = mine, m.stream = stream;
    m.place = [&](std::span<const std::byte> theirs, std::uint64_t bytes) -> std::byte* {
      const auto sent = detail::decode_p2p_descriptor(theirs, rank_name(src));
      if (!sent.failure.empty()) {
        failed = detail::p2p_failure(rank_name(src), m.label, sent.failure);
        return nullptr;
      }
      mismatch = detail::p2p_mismatch(sent, d, rank_name(src), rank_name(rank_), m.label);
      if (!mismatch.empty()) return nullptr;
      if (bytes != detail::p2p_payload_bytes(sent))
        detail::throw_error<comm_error>(rank_name(src), " announced ", bytes, " payload bytes for ", m.label, " but its descriptor says ",
                                        detail::p2p_payload_bytes(sent));
      static std::byte nothing{};  // an empty payload's place (null would mean "refused")
      std::byte* at = place(bytes);
      return at ? at : &nothing;
    };
    CollectiveHandle h = in_step(true, src, m.label, [&] { return p2p_recv(m); });
    if (!failed.empty()) detail::throw_error<comm_error>(failed);
    if (!mismatch.empty()) detail::throw_error<usage_error>(mismatch);
    return h;
  }

  // Runs the backend's part of a message between this rank and `peer` in one direction. A message
  // the backend fails (a local error before anything left, a peer gone, a timeout) may have been
  // used up on one end only, so the pair's later message numbers no longer line up: every later
  // call that way fails at once naming the first error, instead of waiting out the timeout or
  // reading another message's data. (A mismatch or failure marker is not a backend failure: both
  // ends see it, and the pair stays in step.)
  template <class Fn>
  CollectiveHandle in_step(bool receive, int peer, const std::string& label, Fn&& fn) {
    {
      std::lock_guard lock(p2p_broken_mutex_);
      if (const auto it = p2p_broken_.find({receive, peer}); it != p2p_broken_.end())
        detail::throw_error<comm_error>(label, ": ", it->second, ", so the messages ", receive ? "from " : "to ", rank_name(peer),
                                        " are out of step; create a new communicator");
    }
    try {
      return fn();
    } catch (const std::exception& e) {
      std::lock_guard lock(p2p_broken_mutex_);
      p2p_broken_.emplace(std::pair{receive, peer}, detail::concat("an earlier ", label, " failed (", e.what(), ")"));
      throw;
    }
  }

  void expect_bytes(std::size_t got, std::size_t want, int from, const std::string& label) const {
    if (got != want)
      detail::throw_error<comm_error>(backend(), " backend delivered ", got, " bytes from rank ", from, " for ", label, ", ", want,
                                      " expected");
  }

  Blobs round(std::string_view op, Payload data, int root, std::exception_ptr failure) {
    detail::RoundHeader h;
    h.seq = ++seq_;
    h.op = std::string(op);
    h.root = root;
    h.failed = failure != nullptr;
    if (failure) h.failure = detail::exception_message(failure), data = {};
    const std::string label = detail::concat(op, " #", h.seq);
    Round r;
    try {
      r = exchange(h.seq, label, detail::encode_round_header(h), data);
    } catch (...) {
      if (failure) std::rethrow_exception(failure);  // this rank's own error says more than the aftermath
      throw;
    }
    if (r.headers.size() != static_cast<std::size_t>(size_) || r.payloads.size() != static_cast<std::size_t>(size_))
      detail::throw_error<comm_error>(backend(), " backend returned ", r.headers.size(), " parts for ", label, " among ", size_, " ranks");
    std::vector<detail::RoundHeader> all;
    all.reserve(r.headers.size());
    for (std::size_t i = 0; i < r.headers.size(); ++i) all.push_back(detail::decode_round_header(r.headers[i], static_cast<int>(i)));
    check_in_step(all, h, label);
    std::string failed_ranks, messages;
    int failures = 0;
    for (std::size_t i = 0; i < all.size(); ++i)
      if (all[i].failed) {
        failed_ranks += detail::concat(failures ? ", " : "", i, is_group() ? detail::concat(" (job rank ", job_rank(static_cast<int>(i)), ")") : "");
        messages += detail::concat(failures++ ? "; " : "", rank_name(static_cast<int>(i)), ": ", all[i].failure);
      }
    if (failure) std::rethrow_exception(failure);
    if (failures)
      detail::throw_error<comm_error>(is_group() ? "group " : "", failures == 1 ? "rank " : "ranks ", failed_ranks, " failed before ", label,
                                      " and joined it with a failure marker, so no result can be returned (", messages, ")");
    return std::move(r.payloads);
  }

  void check_in_step(const std::vector<detail::RoundHeader>& all, const detail::RoundHeader& mine, const std::string& label) const {
    bool same = true;
    for (const auto& h : all) same = same && h.seq == mine.seq && h.op == mine.op && h.root == mine.root;
    if (same) return;
    std::string calls;
    for (std::size_t i = 0; i < all.size(); ++i)
      calls += detail::concat(i ? ", " : "", rank_name(static_cast<int>(i)), " called ", all[i].op, " #", all[i].seq,
                              all[i].root >= 0 ? detail::concat(" (root ", all[i].root, ")") : std::string());
    detail::throw_error<comm_error>("collective mismatch at ", label, ": ", calls,
                                    "; every rank must call the same collectives in the same order (a collective inside "
                                    "if (state.is_main_process()) is the usual cause)");
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::uint64_t seq_ = 0;
  std::vector<std::byte> send_buffer_;
  std::vector<int> job_ranks_;  ///< a group's: the job rank of each member (empty on the job's communicator)
  std::map<int, std::uint64_t> p2p_sent_;      ///< messages sent to each peer so far
  std::map<int, std::uint64_t> p2p_received_;  ///< messages received from each peer so far
  std::map<std::pair<bool, int>, std::unique_ptr<detail::P2pQueue>> p2p_queues_;  ///< (receive?, peer): the async calls' queues
  std::atomic<bool> p2p_closing_{false};
  std::mutex p2p_broken_mutex_;                               ///< guards p2p_broken_ (queue threads of different peers)
  std::map<std::pair<bool, int>, std::string> p2p_broken_;  ///< (receive?, peer): the first failure that put the pair out of step
};

/// @brief The communicator of a one-process job: every collective returns this process's own data.
class SoloCommunicator final : public Communicator {
 public:
  explicit SoloCommunicator(std::chrono::milliseconds timeout = std::chrono::seconds(300)) : Communicator(0, 1, timeout) {}
  [[nodiscard]] std::string backend() const override { return "solo"; }

 protected:
  /// A group of one: a communicator of its own, which behaves as this one.
  std::shared_ptr<Communicator> make_group(const GroupSpec& spec) override {
    if (spec.color == no_group) return nullptr;
    return std::make_shared<SoloCommunicator>(timeout());
  }

  Round exchange(std::uint64_t, const std::string&, std::span<const std::byte> header, const Payload& payload) override {
    Round r;
    r.headers.push_back(header);
    r.payloads.push_back(payload.head);
    r.payloads.append_to_last(payload.body);
    return r;
  }
};

ACCEL_NAMESPACE_END
