// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file reduce.hpp
/// @brief What the buffer collectives (all_gather, all_reduce, broadcast, reduce_scatter over
///        spans) are made of: element types, reduction operators, the per-call descriptor every rank
///        checks against the others', the reduction kernels, and the handle of an async call.
///
/// The descriptor check is a pure function over every rank's descriptor, so all ranks reach the
/// same verdict and throw the same message ("element types differ across ranks: rank 0 passes
/// float32, rank 1 passes int32") instead of reinterpreting bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/half.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/wire.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief How all_reduce / reduce_scatter combine the ranks' elements.
///
/// avg is sum / world size: for integers the sum wraps (as NCCL's does) and the division
/// truncates; half and bfloat16 are reduced in float and rounded once.
enum class ReduceOp : std::uint8_t { sum, prod, min, max, avg };

/// @brief The element types the buffer collectives take (NCCL's set; 16-bit integers are not in it).
enum class ElementType : std::uint8_t { int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64 };

/// @brief "sum", "prod", "min", "max", "avg".
[[nodiscard]] constexpr std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

/// @brief "float32", "bfloat16", "int64", … (torch's spelling).
[[nodiscard]] constexpr std::string_view element_type_name(ElementType t) noexcept {
  switch (t) {
    case ElementType::int8: return "int8";
    case ElementType::uint8: return "uint8";
    case ElementType::int32: return "int32";
    case ElementType::uint32: return "uint32";
    case ElementType::int64: return "int64";
    case ElementType::uint64: return "uint64";
    case ElementType::float16: return "float16";
    case ElementType::bfloat16: return "bfloat16";
    case ElementType::float32: return "float32";
    case ElementType::float64: return "float64";
  }
  return "?";
}

/// @brief Bytes per element.
[[nodiscard]] constexpr std::size_t element_size(ElementType t) noexcept {
  switch (t) {
    case ElementType::int8:
    case ElementType::uint8: return 1;
    case ElementType::float16:
    case ElementType::bfloat16: return 2;
    case ElementType::int32:
    case ElementType::uint32:
    case ElementType::float32: return 4;
    case ElementType::int64:
    case ElementType::uint64:
    case ElementType::float64: return 8;
  }
  return 0;
}

/// @brief True for the element types of the buffer collectives: arithmetic types of 1, 4 or 8
/// bytes (bool excluded), accel::half and accel::bfloat16.
template <class T>
inline constexpr bool is_buffer_element_v =
    std::is_same_v<std::remove_cv_t<T>, half> || std::is_same_v<std::remove_cv_t<T>, bfloat16> ||
    (std::is_arithmetic_v<T> && !std::is_same_v<std::remove_cv_t<T>, bool> && !std::is_same_v<std::remove_cv_t<T>, long double> &&
     (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8));

/// @brief The ElementType of `T` (int and long of the same size map to the same type).
template <class T>
[[nodiscard]] constexpr ElementType element_type_of() noexcept {
  using U = std::remove_cv_t<T>;
  static_assert(is_buffer_element_v<U>, "buffer collectives take int8/uint8/int32/uint32/int64/uint64, float, double, accel::half "
                                        "or accel::bfloat16 elements (NCCL has no 16-bit integers or bool; widen to int32_t)");
  if constexpr (std::is_same_v<U, half>) return ElementType::float16;
  else if constexpr (std::is_same_v<U, bfloat16>) return ElementType::bfloat16;
  else if constexpr (std::is_floating_point_v<U>) return sizeof(U) == 4 ? ElementType::float32 : ElementType::float64;
  else if constexpr (std::is_signed_v<U>)
    return sizeof(U) == 1 ? ElementType::int8 : sizeof(U) == 4 ? ElementType::int32 : ElementType::int64;
  else return sizeof(U) == 1 ? ElementType::uint8 : sizeof(U) == 4 ? ElementType::uint32 : ElementType::uint64;
}

/// @brief The four buffer collectives.
enum class BufferOp : std::uint8_t { all_gather, all_reduce, broadcast, reduce_scatter };

/// @brief "all_gather", "all_reduce", "broadcast", "reduce_scatter".
[[nodiscard]] constexpr std::string_view buffer_op_name(BufferOp k) noexcept {
  switch (k) {
    case BufferOp::all_gather: return "all_gather";
    case BufferOp::all_reduce: return "all_reduce";
    case BufferOp::broadcast: return "broadcast";
    case BufferOp::reduce_scatter: return "reduce_scatter";
  }
  return "?";
}

/// @brief One rank's buffer collective, as a backend receives it.
///
/// all_reduce and broadcast work in place: `send` == `recv`, `send_count` == `recv_count`.
/// all_gather: `recv_count` == `send_count` × world size; reduce_scatter: `send_count` == `recv_count` × world size.
struct BufferCall {
  BufferOp kind = BufferOp::all_reduce;
  ElementType type = ElementType::float32;
  ReduceOp op = ReduceOp::sum;  ///< all_reduce, reduce_scatter
  int root = -1;                ///< broadcast
  const void* send = nullptr;
  std::size_t send_count = 0;   ///< elements
  void* recv = nullptr;
  std::size_t recv_count = 0;   ///< elements
  void* stream = nullptr;       ///< NCCL: the cudaStream_t to order the call on (null: the communicator's own)
  bool async = false;           ///< NCCL: return once enqueued; the handle waits
};

/// @brief Completion of a buffer collective: wait() returns once the result is in place (and
/// throws the collective's error if it failed). A default-constructed handle is complete.
///
/// @note The CPU and solo backends finish the work before the call returns; under NCCL the work
/// runs on the stream and wait() blocks the host until it is done (bounded by the timeout).
class CollectiveHandle {
 public:
  CollectiveHandle() = default;
  /// @param wait blocks until done; called at most once
  explicit CollectiveHandle(std::function<void()> wait) : wait_(std::move(wait)) {}
  /// @brief Blocks until the collective finished; a second call returns at once.
  void wait() {
    if (!wait_) return;
    auto w = std::move(wait_);
    wait_ = nullptr;
    w();
  }
  /// @brief True until wait() was called on a pending collective.
  [[nodiscard]] bool pending() const noexcept { return static_cast<bool>(wait_); }

 private:
  std::function<void()> wait_;
};

namespace detail {

/// @brief What each rank announces about its buffer collective (checked across ranks before any data moves).
struct BufferDescriptor {
  BufferOp kind = BufferOp::all_reduce;
  ElementType type = ElementType::float32;
  ReduceOp op = ReduceOp::sum;
  std::uint64_t send_count = 0;
  std::uint64_t recv_count = 0;
};

inline BufferDescriptor describe(const BufferCall& c) {
  return {c.kind, c.type, c.op, static_cast<std::uint64_t>(c.send_count), static_cast<std::uint64_t>(c.recv_count)};
}

inline std::vector<std::byte> encode_descriptor(const BufferDescriptor& d) {
  WireWriter w;
  w.u8(static_cast<std::uint8_t>(d.kind)).u8(static_cast<std::uint8_t>(d.type)).u8(static_cast<std::uint8_t>(d.op));
  w.u64(d.send_count).u64(d.recv_count);
  return w.take();
}

inline BufferDescriptor decode_descriptor(std::span<const std::byte> b, int rank) {
  try {
    WireReader r(b);
    BufferDescriptor d;
    const auto kind = r.u8(), type = r.u8(), op = r.u8();
    if (kind > 3 || type > 9 || op > 4) throw_error<wire_error>("unknown code");
    d.kind = static_cast<BufferOp>(kind), d.type = static_cast<ElementType>(type), d.op = static_cast<ReduceOp>(op);
    d.send_count = r.u64(), d.recv_count = r.u64();
    r.expect_end();
    return d;
  } catch (const wire_error& e) {
    throw_error<comm_error>("rank ", rank, " sent a malformed buffer-collective descriptor (", e.what(), ")");
  }
}

/// @brief "ranks 0, 2 pass float32, rank 1 passes int32": ranks grouped by what `value` says of them.
template <class F>
std::string ranks_by(std::size_t n, F value, std::string_view verb) {
  std::vector<std::pair<std::string, std::vector<std::size_t>>> groups;  // first-seen order
  for (std::size_t i = 0; i < n; ++i) {
    std::string v = value(i);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({std::move(v), {i}});
    else it->second.push_back(i);
  }
  std::string out;
  for (const auto& [v, ranks] : groups)
    out += concat(out.empty() ? "" : ", ", ranks.size() == 1 ? "rank " : "ranks ", text::join(ranks), " ", verb,
                  ranks.size() == 1 ? "es " : " ", v);
  return out;
}

/// @brief The verdict on every rank's descriptor (pure; the same on every rank).
/// @throws usage_error naming the ranks and their element types, operators or lengths when they differ
inline void check_descriptors(const std::vector<BufferDescriptor>& all, const std::string& label) {
  const std::size_t n = all.size();
  auto differ = [&](auto field) {
    for (const auto& d : all)
      if (field(d) != field(all.front())) return true;
    return false;
  };
  if (differ([](const BufferDescriptor& d) { return d.type; }))
    throw_error<usage_error>(label, ": element types differ across ranks: ",
                             ranks_by(n, [&](std::size_t i) { return std::string(element_type_name(all[i].type)); }, "pass"),
                             "; every rank must pass spans of the same element type (no bytes are reinterpreted)");
  if (differ([](const BufferDescriptor& d) { return d.op; }))
    throw_error<usage_error>(label, ": reduction operators differ across ranks: ",
                             ranks_by(n, [&](std::size_t i) { return std::string(reduce_op_name(all[i].op)); }, "pass"),
                             "; every rank must pass the same ReduceOp");
  const bool by_recv = all.front().kind == BufferOp::reduce_scatter;
  auto count = [&](const BufferDescriptor& d) { return by_recv ? d.recv_count : d.send_count; };
  if (differ(count)) {
    const char* what = all.front().kind == BufferOp::all_gather ? "send lengths" : by_recv ? "receive lengths" : "buffer lengths";
    throw_error<usage_error>(label, ": ", what, " differ across ranks: ",
                             ranks_by(
                                 n, [&](std::size_t i) { return concat(count(all[i]), " ", element_type_name(all[i].type), " elements"); },
                                 "pass"),
                             "; every rank must pass spans of the same length");
  }
}

/// @brief The local preconditions of `c` on a world of `world` ranks (empty when they hold).
inline std::string local_problem(const BufferCall& c, int world, int rank) {
  const auto name = buffer_op_name(c.kind);
  if (c.kind == BufferOp::all_gather && c.recv_count != c.send_count * static_cast<std::size_t>(world))
    return concat(name, ": rank ", rank, "'s receive span holds ", c.recv_count, " elements but it must hold send × world size = ",
                  c.send_count, " × ", world, " = ", c.send_count * static_cast<std::size_t>(world));
  if (c.kind == BufferOp::reduce_scatter && c.send_count != c.recv_count * static_cast<std::size_t>(world))
    return concat(name, ": rank ", rank, "'s send span holds ", c.send_count, " elements but it must hold receive × world size = ",
                  c.recv_count, " × ", world, " = ", c.recv_count * static_cast<std::size_t>(world));
  if (c.kind == BufferOp::broadcast && (c.root < 0 || c.root >= world))
    return concat(name, ": root ", c.root, " is not a rank of this ", world, "-process job");
  return {};
}

/// @name Reduction kernels: out[i] = in_0[i] op in_1[i] op … in rank order (so every rank and a
/// serial reference get the same bits).
///@{

template <class T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<half> {
  using type = float;
};
template <>
struct Accumulator<bfloat16> {
  using type = float;
};

template <class T>
typename Accumulator<T>::type widen(T v) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<float>(v);
  else return v;
}
template <class T>
T narrow(typename Accumulator<T>::type v) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return T(v);
  else return v;
}

// Integer sum and product wrap (two's complement) instead of overflowing into undefined behaviour.
template <class A>
A combine(A a, A b, ReduceOp op) noexcept {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ReduceOp::prod: return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
    }
    return a;
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return a + b;
      case ReduceOp::prod: return a * b;
      case ReduceOp::min: return b < a ? b : a;
      case ReduceOp::max: return a < b ? b : a;
    }
    return a;
  }
}

/// @brief out[i] = reduce over r of inputs[r][i], for i < n, in rank order; avg divides by inputs.size().
template <class T>
void reduce_into(T* out, const std::vector<const T*>& inputs, std::size_t n, ReduceOp op) noexcept {
  using A = typename Accumulator<T>::type;
  const std::size_t p = inputs.size();
  // Blocks keep the partial results in cache (and let the compiler vectorise the inner loops).
  constexpr std::size_t block = 1024;
  A acc[block];
  for (std::size_t at = 0; at < n; at += block) {
    const std::size_t m = std::min(block, n - at);
    const T* first = inputs[0] + at;
    for (std::size_t i = 0; i < m; ++i) acc[i] = widen(first[i]);
    for (std::size_t r = 1; r < p; ++r) {
      const T* in = inputs[r] + at;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          for (std::size_t i = 0; i < m; ++i) acc[i] = combine<A>(acc[i], widen(in[i]), ReduceOp::sum);
          break;
        case ReduceOp::prod:
          for (std::size_t i = 0; i < m; ++i) acc[i] = combine<A>(acc[i], widen(in[i]), ReduceOp::prod);
          break;
        case ReduceOp::min:
          for (std::size_t i = 0; i < m; ++i) acc[i] = combine<A>(acc[i], widen(in[i]), ReduceOp::min);
          break;
        case ReduceOp::max:
          for (std::size_t i = 0; i < m; ++i) acc[i] = combine<A>(acc[i], widen(in[i]), ReduceOp::max);
          break;
      }
    }
    if (op == ReduceOp::avg) {
      if constexpr (std::is_integral_v<A>)
        for (std::size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(acc[i] / static_cast<A>(p));
      else
        for (std::size_t i = 0; i < m; ++i) acc[i] = acc[i] / static_cast<A>(p);
    }
    T* o = out + at;
    for (std::size_t i = 0; i < m; ++i) o[i] = narrow<T>(acc[i]);
  }
}

/// @brief reduce_into for an element type known at run time (pointers to `type`'s elements).
inline void reduce_bytes(ElementType type, void* out, const std::vector<const void*>& inputs, std::size_t n, ReduceOp op) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> in;
    in.reserve(inputs.size());
    for (const void* p : inputs) in.push_back(static_cast<const T*>(p));
    reduce_into<T>(static_cast<T*>(out), in, n, op);
  };
  switch (type) {
    case ElementType::int8: return run(std::int8_t{});
    case ElementType::uint8: return run(std::uint8_t{});
    case ElementType::int32: return run(std::int32_t{});
    case ElementType::uint32: return run(std::uint32_t{});
    case ElementType::int64: return run(std::int64_t{});
    case ElementType::uint64: return run(std::uint64_t{});
    case ElementType::float16: return run(half{});
    case ElementType::bfloat16: return run(bfloat16{});
    case ElementType::float32: return run(float{});
    case ElementType::float64: return run(double{});
  }
}
///@}

}  // namespace detail
ACCEL_NAMESPACE_END
