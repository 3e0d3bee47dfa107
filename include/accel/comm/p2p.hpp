// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file p2p.hpp
/// @brief Point-to-point messages between two ranks: send / recv over typed spans (and their
///        *_async forms), send_object / recv_object for any value gather_object carries.
///
/// @code
///   accel::DistributedState state;
///   std::vector<float> activations(1024);
///   if (state.process_index() == 0) accel::send(state, std::span(activations), 1);
///   if (state.process_index() == 1) accel::recv(state, std::span(activations), 0);
/// @endcode
///
/// Semantics, on every backend:
/// - order: the n-th message rank a sends to rank b is the n-th that b receives from a;
/// - matching: both ends state what the message is (element type and length, or the object's
///   type); when they differ, both throw usage_error naming both ranks and what each passed, and
///   nothing is delivered into the receiver's memory (the payload's first piece, up to 256 KiB
///   through shared memory or one store piece, travels with the sender's descriptor and is dropped);
/// - a message that fails otherwise (a local error, a peer gone, a timeout) leaves that direction
///   between the two out of step: later calls that way throw comm_error at once naming the first
///   error; an end that fails midway tells its peer, which throws at once naming it;
/// - synchronous sends: send returns once the receiver took the message, so two ranks that both
///   send to each other first wait for each other (until the timeout): use send_async on one side,
///   or let one side receive first;
/// - the *_async calls return a CollectiveHandle at once and run in call order on a queue per
///   peer and direction; the spans must stay valid until wait(), which rethrows their error; a
///   plain call to the same peer in the same direction waits for them first;
/// - a peer that exits, dies or closes its communicator while this rank waits for it is a
///   comm_error naming it (by group rank and job rank in a group) within seconds; one that is
///   merely absent is a timeout_error after the communicator's timeout;
/// - in a group (accel::split, grid_groups) ranks are group ranks;
/// - sending to oneself or to a rank outside the communicator is a usage_error, and nothing moves.
///
/// How each backend moves the bytes is described at its p2p_send (cpu.hpp: shared memory between
/// processes of one machine, the store across machines; nccl.hpp: ncclSend/ncclRecv).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/comm/reduce.hpp>
#include <accel/comm/serialize.hpp>
#include <accel/runtime/distributed_state.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {
template <class T>
P2pDescriptor buffer_descriptor(std::size_t count) {
  P2pDescriptor d;
  d.kind = P2pKind::buffer;
  d.type = element_type_of<std::remove_const_t<T>>();
  d.count = count;
  return d;
}
template <class T>
P2pDescriptor object_descriptor(std::uint64_t bytes) {
  static const std::string name = type_name<T>();
  P2pDescriptor d;
  d.kind = P2pKind::object;
  d.count = bytes;
  d.object_type = name;
  return d;
}
}  // namespace detail

/// @name Point-to-point
/// Element types of the span forms: those of the buffer collectives (int8/uint8/int32/uint32/
/// int64/uint64, float, double, accel::half, accel::bfloat16); host memory on the CPU backend,
/// device memory under NCCL. Pass spans: `accel::send(comm, std::span(v), 1)`. Under NCCL the
/// stream-less span forms run on the communicator's own streams (one per direction) and have
/// finished when they return (the *_async forms: when wait() returns); the forms taking a
/// `cudaStream_t` enqueue on it instead (CUDA builds).
///@{

/// @brief Sends `data` to rank `dst`, which receives it with recv() into a span of the same
/// element type and length.
///
/// In: rank 0 sends {1, 2, 3} to rank 1.   Out: rank 1's recv span holds {1, 2, 3}.
/// @param comm the communicator (a group's: dst is a group rank)
/// @param data the elements to send (host memory; device memory of this rank's GPU under NCCL)
/// @param dst the receiving rank
/// @throws usage_error when dst is this rank or not a rank (nothing is sent), or on both ends when
///         the receiver's span has another element type or length (naming both ranks)
/// @throws comm_error naming dst when it exits, dies or closes its communicator first;
///         timeout_error when it does not receive within the communicator's timeout
/// @note point-to-point: only this rank and dst call
template <class T>
void send(Communicator& comm, std::span<T> data, int dst) {
  comm.send_message(dst, detail::buffer_descriptor<T>(data.size()), Payload(std::as_bytes(data)));
}
/// @brief send, returning at once; `data` must stay valid until wait(), which rethrows its error.
/// Dropping the handle does not cancel the call: it still runs later and reads `data`, so keep the
/// handle and wait() before `data` goes (hence [[nodiscard]]).
/// @param comm the communicator; @param data what to send; @param dst the receiving rank
/// @return a handle whose wait() returns once the message was taken (rethrowing the send's error)
/// @throws usage_error at once when dst is this rank or not a rank
template <class T>
[[nodiscard]] CollectiveHandle send_async(Communicator& comm, std::span<T> data, int dst) {
  return comm.send_message_async(dst, detail::buffer_descriptor<T>(data.size()), Payload(std::as_bytes(data)));
}
/// @brief Receives the next message from rank `src` into `data` (sent with send() from a span of
/// the same element type and length).
/// @param comm the communicator; @param data where the message goes (its length must be the
///        sender's); @param src the sending rank
/// @throws as send(), with src for dst
template <class T>
void recv(Communicator& comm, std::span<T> data, int src) {
  static_assert(!std::is_const_v<T>, "accel::recv writes into its span: pass a span of non-const elements");
  comm.recv_message(src, detail::buffer_descriptor<T>(data.size()), [&](std::uint64_t) { return reinterpret_cast<std::byte*>(data.data()); });
}
/// @brief recv, returning at once; `data` must stay valid until wait(), which rethrows its error.
/// Dropping the handle does not cancel the call: it still runs later and writes `data`, so keep
/// the handle and wait() before `data` goes (hence [[nodiscard]]).
/// @param comm the communicator; @param data where the message goes; @param src the sending rank
/// @return a handle whose wait() returns once `data` holds the message (rethrowing the receive's error)
/// @throws usage_error at once when src is this rank or not a rank
template <class T>
[[nodiscard]] CollectiveHandle recv_async(Communicator& comm, std::span<T> data, int src) {
  static_assert(!std::is_const_v<T>, "accel::recv_async writes into its span: pass a span of non-const elements");
  return comm.recv_message_async(src, detail::buffer_descriptor<T>(data.size()),
                                 [data](std::uint64_t) { return reinterpret_cast<std::byte*>(data.data()); });
}

/// @brief Sends `value` (anything gather_object carries) to rank `dst`, which receives it with
/// recv_object<T>() of the same T.
/// @param comm the communicator; @param value what to send; @param dst the receiving rank
/// @throws serialization_error when the value does not encode: dst's recv_object then throws
///         comm_error naming this rank and the error instead of waiting (a failure marker takes
///         the message's place, so later messages stay in step); otherwise as send()
template <class T>
void send_object(Communicator& comm, const T& value, int dst) {
  std::vector<std::byte> head;
  std::span<const std::byte> body;
  try {
    body = encode_payload(head, value, comm.rank());
  } catch (const std::exception& e) {
    const auto failure = std::current_exception();
    comm.send_message_failed(dst, detail::object_descriptor<T>(0), e.what());
    std::rethrow_exception(failure);
  }
  const Payload data(head, body);
  comm.send_message(dst, detail::object_descriptor<T>(data.size()), data);
}
/// @brief The next value rank `src` sent with send_object() of the same T.
/// @param comm the communicator; @param src the sending rank
/// @return the value, decoded as T
/// @throws serialization_error naming src when its bytes do not decode as T; comm_error naming
///         src and its error when its value did not encode; otherwise as send()
template <class T>
T recv_object(Communicator& comm, int src) {
  std::vector<std::byte> bytes;
  comm.recv_message(src, detail::object_descriptor<T>(0), [&](std::uint64_t n) {
    detail::out_of_memory_as_error(comm, static_cast<std::size_t>(n), src, [&] { bytes.resize(static_cast<std::size_t>(n)); });
    return bytes.data();
  });
  std::optional<T> out;
  detail::out_of_memory_as_error(comm, bytes.size(), src, [&] { out.emplace(from_bytes<T>(bytes, src)); });
  return std::move(*out);
}

#if ACCEL_HAS_CUDA()
namespace detail {
// The stream a point-to-point call hands its backend: a device backend's (NCCL) own queue for it;
// host backends have none, so the stream's earlier work is waited for instead.
inline void* p2p_stream(Communicator& comm, cudaStream_t stream) {
  if (comm.device_buffers()) return static_cast<void*>(stream);
  ACCEL_CUDA_TRY(cudaStreamSynchronize(stream));
  return nullptr;
}
}  // namespace detail

/// @brief The stream-ordered forms (CUDA builds). Under NCCL: the descriptors are checked with
/// the peer first (on the host, so the call blocks until the peer has called its side), then
/// ncclSend / ncclRecv is enqueued on `stream` and the call returns without waiting for it; the
/// *_async forms return at once, and their wait() blocks until the transfer has finished. On
/// host backends `stream` is synchronised first and the call behaves as the stream-less one.
/// @note stream order is the caller's: a send and a receive between the same two ranks on one
///       stream run one after the other, so give each direction its own stream when both may be
///       in flight at once (the stream-less forms do so themselves)
/// @throws as send(Communicator&, std::span<T>, int); cuda_error when synchronising `stream` fails
template <class T>
void send(Communicator& comm, std::span<T> data, int dst, cudaStream_t stream) {
  comm.send_message(dst, detail::buffer_descriptor<T>(data.size()), Payload(std::as_bytes(data)), detail::p2p_stream(comm, stream));
}
/// @copydoc send(Communicator&, std::span<T>, int, cudaStream_t)
template <class T>
[[nodiscard]] CollectiveHandle send_async(Communicator& comm, std::span<T> data, int dst, cudaStream_t stream) {
  return comm.send_message_async(dst, detail::buffer_descriptor<T>(data.size()), Payload(std::as_bytes(data)),
                                 detail::p2p_stream(comm, stream));
}
/// @copydoc send(Communicator&, std::span<T>, int, cudaStream_t)
template <class T>
void recv(Communicator& comm, std::span<T> data, int src, cudaStream_t stream) {
  static_assert(!std::is_const_v<T>, "accel::recv writes into its span: pass a span of non-const elements");
  comm.recv_message(src, detail::buffer_descriptor<T>(data.size()), [&](std::uint64_t) { return reinterpret_cast<std::byte*>(data.data()); },
                    detail::p2p_stream(comm, stream));
}
/// @copydoc send(Communicator&, std::span<T>, int, cudaStream_t)
template <class T>
[[nodiscard]] CollectiveHandle recv_async(Communicator& comm, std::span<T> data, int src, cudaStream_t stream) {
  static_assert(!std::is_const_v<T>, "accel::recv_async writes into its span: pass a span of non-const elements");
  return comm.recv_message_async(src, detail::buffer_descriptor<T>(data.size()),
                                 [data](std::uint64_t) { return reinterpret_cast<std::byte*>(data.data()); },
                                 detail::p2p_stream(comm, stream));
}
/// @copydoc send(Communicator&, std::span<T>, int, cudaStream_t)
template <class T>
void send(DistributedState& state, std::span<T> data, int dst, cudaStream_t stream) {
  send(communicator(state), data, dst, stream);
}
/// @copydoc send(Communicator&, std::span<T>, int, cudaStream_t)
template <class T>
[[nodiscard]] CollectiveHandle send_async(DistributedState& state, std::span<T> data, int dst, cudaStream_t stream) {
  return send_async(communicator(state), data, dst, stream);
}
/// @copydoc send(Communicator&, std::span<T>, int, cudaStream_t)
template <class T>
void recv(DistributedState& state, std::span<T> data, int src, cudaStream_t stream) {
  recv(communicator(state), data, src, stream);
}
/// @copydoc send(Communicator&, std::span<T>, int, cudaStream_t)
template <class T>
[[nodiscard]] CollectiveHandle recv_async(DistributedState& state, std::span<T> data, int src, cudaStream_t stream) {
  return recv_async(communicator(state), data, src, stream);
}
#endif

/// @copydoc send(Communicator&, std::span<T>, int)
template <class T>
void send(DistributedState& state, std::span<T> data, int dst) {
  send(communicator(state), data, dst);
}
/// @copydoc send_async(Communicator&, std::span<T>, int)
template <class T>
[[nodiscard]] CollectiveHandle send_async(DistributedState& state, std::span<T> data, int dst) {
  return send_async(communicator(state), data, dst);
}
/// @copydoc recv(Communicator&, std::span<T>, int)
template <class T>
void recv(DistributedState& state, std::span<T> data, int src) {
  recv(communicator(state), data, src);
}
/// @copydoc recv_async(Communicator&, std::span<T>, int)
template <class T>
[[nodiscard]] CollectiveHandle recv_async(DistributedState& state, std::span<T> data, int src) {
  return recv_async(communicator(state), data, src);
}
/// @copydoc send_object(Communicator&, const T&, int)
template <class T>
void send_object(DistributedState& state, const T& value, int dst) {
  send_object(communicator(state), value, dst);
}
/// @copydoc recv_object(Communicator&, int)
template <class T>
T recv_object(DistributedState& state, int src) {
  return recv_object<T>(communicator(state), src);
}
///@}

ACCEL_NAMESPACE_END
