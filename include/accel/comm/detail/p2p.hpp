// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file p2p.hpp
/// @brief What point-to-point messages are made of, backend-independent: the descriptor each end
///        states (element type and count, or the object's type), the check both ends run on the
///        same pair of descriptors, and the per-peer queues that run the *_async calls in order.
///
/// The check is a pure function of (sender's descriptor, receiver's descriptor, names, label), so
/// the two ends reach the same verdict and throw the same message without another round trip.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/reduce.hpp>
#include <accel/comm/wire.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief What a message carries: a typed buffer (send/recv over spans) or an encoded object
/// (send_object/recv_object).
enum class P2pKind : std::uint8_t { buffer = 1, object = 2 };

/// @brief What one end of a message states about it.
struct P2pDescriptor {
  P2pKind kind = P2pKind::buffer;
  ElementType type = ElementType::uint8;  ///< buffer: the element type
  std::uint64_t count = 0;                ///< buffer: elements; object: encoded bytes on the sender (0 on the receiver)
  std::string object_type;                ///< object: the value's type, as type_name<T>() spells it
  /// Sender only: non-empty when it failed before it had a message to send (its value did not
  /// encode); the error's text. The receiver then throws instead of waiting for a message that
  /// never comes, and nothing else travels.
  std::string failure;
};

/// @brief The longest descriptor a backend must carry (an object's type name and a failure's text
/// are cut to fit).
inline constexpr std::size_t p2p_descriptor_max_bytes = 2048;

/// @brief The part of an object's type name or a failure's text that a descriptor carries: the
/// first p2p_descriptor_max_bytes / 2 - 64 characters (pure). Both ends compare type names cut so.
[[nodiscard]] inline std::string_view p2p_descriptor_text(std::string_view s) noexcept {
  return s.substr(0, p2p_descriptor_max_bytes / 2 - 64);
}

inline std::vector<std::byte> encode_p2p_descriptor(const P2pDescriptor& d) {
  WireWriter w;
  const std::string type(p2p_descriptor_text(d.object_type));
  const std::string failure(p2p_descriptor_text(d.failure));
  w.u8(static_cast<std::uint8_t>(d.kind)).u8(static_cast<std::uint8_t>(d.type)).u64(d.count).str(type).str(failure);
  return w.take();
}

/// @throws comm_error naming `who` when the bytes are not a descriptor
inline P2pDescriptor decode_p2p_descriptor(std::span<const std::byte> b, const std::string& who) {
  try {
    WireReader r(b);
    P2pDescriptor d;
    const auto kind = r.u8(), type = r.u8();
    d.count = r.u64();
    d.object_type = r.str();
    d.failure = r.str();
    r.expect_end();
    if (kind != static_cast<std::uint8_t>(P2pKind::buffer) && kind != static_cast<std::uint8_t>(P2pKind::object))
      throw wire_error(concat("message kind ", static_cast<int>(kind)));
    if (type > static_cast<std::uint8_t>(ElementType::float64)) throw wire_error(concat("element type ", static_cast<int>(type)));
    d.kind = static_cast<P2pKind>(kind), d.type = static_cast<ElementType>(type);
    return d;
  } catch (const error& e) {
    throw_error<comm_error>(who, " sent a malformed point-to-point descriptor (", e.what(), ")");
  }
}

/// @brief Bytes of the payload a sender's descriptor announces (pure).
[[nodiscard]] inline std::uint64_t p2p_payload_bytes(const P2pDescriptor& d) noexcept {
  return d.kind == P2pKind::buffer ? d.count * element_size(d.type) : d.count;
}

/// @brief "4 float32 elements (send)", "an object of type std::string (12 encoded bytes, send_object)", … (pure).
inline std::string describe_p2p(const P2pDescriptor& d, bool sender) {
  if (d.kind == P2pKind::buffer)
    return concat(d.count, " ", element_type_name(d.type), d.count == 1 ? " element" : " elements", sender ? " (send)" : " (recv)");
  return sender ? concat("an object of type ", d.object_type, " (", d.count, " encoded bytes, send_object)")
                : concat("an object of type ", d.object_type, " (recv_object)");
}

/// @brief Why a message described by `sent` cannot be received as `wanted` ("" when it can): the
/// kinds, element types and counts (buffers) or the object types must agree. Pure, so both ends
/// compute the same message.
/// @param label "message #3 from rank 0 to rank 1"
inline std::string p2p_mismatch(const P2pDescriptor& sent, const P2pDescriptor& wanted, const std::string& sender,
                                const std::string& receiver, const std::string& label) {
  bool same = sent.kind == wanted.kind;
  if (same && sent.kind == P2pKind::buffer) same = sent.type == wanted.type && sent.count == wanted.count;
  // The peer's name arrived cut to what a descriptor carries: compare as much of each.
  if (same && sent.kind == P2pKind::object) same = p2p_descriptor_text(sent.object_type) == p2p_descriptor_text(wanted.object_type);
  if (same) return {};
  return concat("send/recv mismatch in ", label, ": ", sender, " sends ", describe_p2p(sent, true), ", ", receiver, " expects ",
                describe_p2p(wanted, false),
                "; both ends must pass the same element type and length (send/recv), or the same type (send_object/recv_object)");
}

/// @brief What the receiver of a failure marker throws: the sender, the message and the sender's
/// own error (pure).
inline std::string p2p_failure(const std::string& sender, const std::string& label, const std::string& why) {
  return concat(sender, " failed before ", label, " and sent a failure marker instead, so there is nothing to receive (", sender, ": ",
                why, ")");
}

/// @brief How a peer left, as the store's failure message says it, reworded as the rest of a
/// sentence that starts with the peer's name (the store names the two ends of a point-to-point
/// exchange by their places in it, not their ranks); "" when the message is not about a peer that
/// left. Pure.
inline std::string how_peer_left(std::string_view store_message) {
  constexpr std::string_view crashed = "lost its connection to the store without saying goodbye";
  if (const auto at = store_message.find(crashed); at != std::string_view::npos) {
    const auto end = store_message.find(", so it cannot join", at);
    return std::string(store_message.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
  }
  if (store_message.find(" exited without joining ") != std::string_view::npos) return "exited";
  if (store_message.find(" never joined the job") != std::string_view::npos) return "never joined the job";
  return {};
}

/// @brief Copies bytes [at, at + n) of the two-piece payload (head, body) to `out` (both backends'
/// paths stream a Payload in pieces this way).
inline void copy_payload_range(std::byte* out, std::span<const std::byte> head, std::span<const std::byte> body, std::size_t at,
                               std::size_t n) noexcept {
  if (at < head.size()) {
    const std::size_t k = std::min(n, head.size() - at);
    std::memcpy(out, head.data() + at, k);
    out += k, at += k, n -= k;
  }
  if (n) std::memcpy(out, body.data() + (at - head.size()), n);
}

/// @brief The outcome of one queued point-to-point call: wait() blocks until it ran and rethrows
/// what it threw.
class P2pOutcome {
 public:
  void finish(std::exception_ptr e) {
    {
      std::lock_guard lock(m_);
      done_ = true;
      error_ = std::move(e);
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// @brief The calls of one direction to one peer (sends to rank 3, or receives from rank 3), run
/// one after another on a thread of their own, in the order they were queued. Sends and receives,
/// and different peers, have queues of their own, so a send_async that waits for its receiver
/// never holds up a receive queued after it.
class P2pQueue {
 public:
  P2pQueue() = default;
  P2pQueue(const P2pQueue&) = delete;
  P2pQueue& operator=(const P2pQueue&) = delete;
  ~P2pQueue() { stop(); }

  /// @brief Queues `fn`; its outcome says when it ran.
  /// @param label the call's message ("message #3 from rank 0 to rank 1"), named when the queue
  ///        stops before it ran
  std::shared_ptr<P2pOutcome> push(std::function<void()> fn, std::string label) {
    auto outcome = std::make_shared<P2pOutcome>();
    {
      std::lock_guard lock(m_);
      tasks_.push_back({std::move(fn), outcome, std::move(label)});
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
    return outcome;
  }
  /// @brief True when nothing is queued or running.
  [[nodiscard]] bool idle() {
    std::lock_guard lock(m_);
    return tasks_.empty() && !running_;
  }
  /// @brief Lets the running call finish (calls still queued fail), then ends the thread.
  void stop() noexcept {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<P2pOutcome> outcome;
    std::string label;
  };
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      Task t = std::move(tasks_.front());
      tasks_.pop_front();
      if (stopping_) {
        t.outcome->finish(std::make_exception_ptr(
            comm_error(concat(t.label, ": the communicator was destroyed before this point-to-point call ran (it waited behind earlier "
                              "calls to the same peer), so nothing of it moved"))));
        continue;
      }
      running_ = true;
      lock.unlock();
      std::exception_ptr e;
      try {
        t.fn();
      } catch (...) {
        e = std::current_exception();
      }
      t.outcome->finish(std::move(e));
      lock.lock();
      running_ = false;
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool running_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace detail
ACCEL_NAMESPACE_END
