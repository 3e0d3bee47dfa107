// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file wire.hpp
/// @brief The store's wire format: length-prefixed frames, little-endian fields, request/reply codecs.
///
/// Frame = u32 body length (little-endian) + body. Body = u8 message type + fields. Integers are
/// little-endian fixed width; byte strings are u32 length + bytes. Everything here is pure (no I/O),
/// so the parser can be fuzzed on its own (tests/fuzz/store_frame_fuzz.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/bytes.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::uint32_t store_magic = 0x54534341u;  // "ACST" on the wire
inline constexpr std::uint32_t store_protocol_version = 2;
inline constexpr std::size_t frame_header_bytes = 4;

/// @brief Message types. Requests are below 64, replies from 64.
enum class Msg : std::uint8_t {
  hello = 1, set = 2, get = 3, add = 4, wait = 5, remove = 6, compare_set = 7, exchange = 8, bye = 9,
  ok = 64, value = 65, integer = 66, list = 67, failure = 68,
};

/// @brief Why the server refused a request (carried in a `failure` reply).
/// `other_job`: the hello reached a store that serves another job (another token, magic or protocol
/// version); a client looking for its store among several ports tries the next.
enum class FailureKind : std::uint8_t { refused = 1, timeout = 2, peer_gone = 3, protocol = 4, mismatch = 5, other_job = 6 };

/// @brief A frame or field that does not parse.
class wire_error : public comm_error {
 public:
  explicit wire_error(const std::string& what_arg) : comm_error(what_arg) {}
};

/// @brief Appends little-endian fields to a byte buffer.
class WireWriter {
 public:
  /// @brief Starts a frame: reserves the length prefix and writes the message type.
  explicit WireWriter(Msg type) { buf_.resize(frame_header_bytes), u8(static_cast<std::uint8_t>(type)); }
  /// @brief Starts a bare record (no frame prefix, no type); hand it over with take().
  WireWriter() = default;
  /// @brief The bytes written so far (bare records).
  std::vector<std::byte> take() { return std::move(buf_); }
  WireWriter& u8(std::uint8_t v) { return raw(&v, 1); }
  WireWriter& u32(std::uint32_t v) { return le(v); }
  WireWriter& u64(std::uint64_t v) { return le(v); }
  WireWriter& i32(std::int32_t v) { return le(static_cast<std::uint32_t>(v)); }
  WireWriter& i64(std::int64_t v) { return le(static_cast<std::uint64_t>(v)); }
  WireWriter& bytes(std::span<const std::byte> b) {
    if (b.size() > 0xFFFFFFFFu) throw_error<comm_error>("a store value of ", b.size(), " bytes exceeds the 4 GiB field limit");
    u32(static_cast<std::uint32_t>(b.size()));
    return raw(b.data(), b.size());
  }
  WireWriter& str(std::string_view s) { return bytes(std::as_bytes(std::span<const char>(s.data(), s.size()))); }
  /// @brief Finishes the frame (fills in the length prefix) and hands the bytes over.
  std::vector<std::byte> finish() {
    const std::size_t body = buf_.size() - frame_header_bytes;
    if (body > 0xFFFFFFFFu) throw_error<comm_error>("a store frame of ", body, " bytes exceeds the 4 GiB frame limit");
    store_le(buf_.data(), static_cast<std::uint32_t>(body));
    return std::move(buf_);
  }

 private:
  template <class U>
  WireWriter& le(U v) {
    append_le(buf_, v);
    return *this;
  }
  WireWriter& raw(const void* p, std::size_t n) {
    if (n == 0) return *this;
    const std::size_t at = buf_.size();
    buf_.resize(at + n);
    std::memcpy(buf_.data() + at, p, n);
    return *this;
  }
  std::vector<std::byte> buf_;
};

/// @brief Reads little-endian fields from one frame body; every read is bounds-checked.
class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> body) : body_(body) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(take(1)[0]); }
  std::uint32_t u32() { return le<std::uint32_t>(); }
  std::uint64_t u64() { return le<std::uint64_t>(); }
  std::int32_t i32() { return static_cast<std::int32_t>(le<std::uint32_t>()); }
  std::int64_t i64() { return static_cast<std::int64_t>(le<std::uint64_t>()); }
  /// @brief A length-prefixed byte string, as a view into the body (no copy).
  std::span<const std::byte> bytes() { return take(u32()); }
  std::string str() {
    auto b = bytes();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  /// @brief Offset of the next unread byte within the body.
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return body_.size() - pos_; }
  /// @brief Throws unless every byte was consumed (trailing garbage is malformed).
  void expect_end() const {
    if (pos_ != body_.size()) throw_error<wire_error>("malformed store frame: ", body_.size() - pos_, " unexpected trailing bytes");
  }

 private:
  std::span<const std::byte> take(std::size_t n) {
    if (n > body_.size() - pos_)
      throw_error<wire_error>("malformed store frame: a field of ", n, " bytes runs past the end of the ", body_.size(),
                              "-byte frame");
    auto out = body_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  template <class U>
  U le() {
    return load_le<U>(take(sizeof(U)).data());
  }
  std::span<const std::byte> body_;
  std::size_t pos_ = 0;
};

/// @brief Splits a byte stream into frames, enforcing a size limit before buffering a body.
///
/// In:  bytes as they arrive (any split). Out: complete frame bodies, in order.
class FrameAssembler {
 public:
  explicit FrameAssembler(std::size_t max_body) : max_body_(max_body) {}
  /// @brief Changes the limit (the server raises it after the handshake).
  void set_limit(std::size_t max_body) noexcept { max_body_ = max_body; }
  /// @brief Appends received bytes.
  void feed(std::span<const std::byte> data) {
    compact();
    if (pending_) buf_.reserve(frame_header_bytes + *pending_);
    buf_.insert(buf_.end(), data.begin(), data.end());
  }
  /// @brief The next complete frame body, or nullopt when more bytes are needed.
  /// @throws wire_error when the announced length exceeds the limit (the stream cannot be resynchronised)
  std::optional<std::vector<std::byte>> next() {
    const std::size_t avail = buf_.size() - start_;
    if (avail < frame_header_bytes) return std::nullopt;
    const auto len = load_le<std::uint32_t>(buf_.data() + start_);
    if (len > max_body_)
      throw_error<wire_error>("store frame of ", len, " bytes exceeds the limit of ", max_body_, " bytes");
    pending_ = len;
    if (avail < frame_header_bytes + len) return std::nullopt;
    const auto* b = buf_.data() + start_ + frame_header_bytes;
    std::vector<std::byte> body(b, b + len);
    start_ += frame_header_bytes + len;
    pending_.reset();
    // Everything handed out: a buffer that grew for a large frame is given back, so a connection
    // keeps no copy of the largest frame it ever carried (a store serving a 512 MiB gather would
    // otherwise hold world x 512 MiB until the connections close).
    if (start_ == buf_.size()) {
      start_ = 0;
      if (buf_.capacity() > retained_capacity) std::vector<std::byte>().swap(buf_);
      else buf_.clear();
    }
    return body;
  }
  /// @brief Bytes buffered but not yet returned as frames.
  [[nodiscard]] std::size_t buffered() const noexcept { return buf_.size() - start_; }
  /// @brief Bytes of memory the buffer holds (what it keeps between frames is at most
  /// retained_capacity once every frame has been handed out).
  [[nodiscard]] std::size_t capacity() const noexcept { return buf_.capacity(); }
  /// @brief The most buffer capacity kept after the last complete frame was handed out.
  static constexpr std::size_t retained_capacity = std::size_t{1} << 20;

 private:
  void compact() {
    if (start_ == 0) return;
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  std::size_t max_body_;
  std::vector<std::byte> buf_;
  std::size_t start_ = 0;
  std::optional<std::size_t> pending_;
};

/// @brief One decoded client request (fields unused by a type stay empty).
struct StoreRequest {
  Msg type = Msg::bye;
  std::string key;
  std::vector<std::byte> value;     ///< set/exchange value, compare_set desired
  std::vector<std::byte> expected;  ///< compare_set expected
  std::vector<std::string> keys;    ///< wait
  std::string label;                ///< exchange: what the collective is, for messages
  /// exchange, optional last field: the job rank of each slot, for a group's exchange (split());
  /// empty: slot r is job rank r
  std::vector<std::int32_t> members;
  std::string token;                ///< hello
  std::string job_id;               ///< hello, optional field: the client's job, named in refusals
  bool probing = false;             ///< hello, optional field: the client looks for its store among several ports
  /// hello, optional last field: a number drawn once per client process, so the store tells a
  /// process's further connections (same number) from another process claiming its rank; 0: unknown
  std::uint64_t process = 0;
  std::uint32_t magic = 0, version = 0;
  std::int64_t delta = 0;           ///< add
  std::int32_t rank = -1, world = 0;
  std::uint64_t timeout_ms = 0;
};

inline std::vector<std::byte> to_vector(std::span<const std::byte> b) { return {b.begin(), b.end()}; }

/// @brief An exchange's member list: `world` distinct job ranks, each at least 0.
inline std::vector<std::int32_t> parse_members(WireReader& r, std::int32_t world) {
  const std::uint32_t n = r.u32();
  if (n != static_cast<std::uint32_t>(world)) throw_error<wire_error>("malformed exchange: ", n, " members for world size ", world);
  if (n > r.remaining() / 4) throw_error<wire_error>("malformed exchange: ", n, " members announced in ", r.remaining(), " bytes");
  std::vector<std::int32_t> members(n);
  for (auto& m : members) m = r.i32();
  std::vector<std::int32_t> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw_error<wire_error>("malformed exchange: the members are not distinct job ranks");
  return members;
}

/// @brief Decodes one request body. Pure; the fuzz target's entry point.
/// @throws wire_error on an unknown type, a truncated field, trailing bytes or out-of-range values
inline StoreRequest parse_request(std::span<const std::byte> body) {
  WireReader r(body);
  StoreRequest q;
  const auto t = r.u8();
  q.type = static_cast<Msg>(t);
  switch (q.type) {
    case Msg::hello:
      q.magic = r.u32(), q.version = r.u32(), q.token = r.str(), q.rank = r.i32(), q.world = r.i32();
      if (r.remaining() > 0) q.job_id = r.str();
      if (r.remaining() > 0) q.probing = r.u8() != 0;
      if (r.remaining() > 0) q.process = r.u64();
      if (q.rank < -1 || q.world < 0 || (q.rank >= 0 && q.world > 0 && q.rank >= q.world))
        throw_error<wire_error>("malformed hello: rank ", q.rank, " of world size ", q.world);
      break;
    case Msg::set: q.key = r.str(), q.value = to_vector(r.bytes()); break;
    case Msg::get: q.key = r.str(), q.timeout_ms = r.u64(); break;
    case Msg::add: q.key = r.str(), q.delta = r.i64(); break;
    case Msg::wait: {
      const std::uint32_t n = r.u32();
      // Each key needs at least its 4-byte length, so a huge count in a small frame is malformed.
      if (n > r.remaining() / 4) throw_error<wire_error>("malformed wait: ", n, " keys announced in a ", body.size(), "-byte frame");
      q.keys.reserve(n);
      for (std::uint32_t i = 0; i < n; ++i) q.keys.push_back(r.str());
      q.timeout_ms = r.u64();
      break;
    }
    case Msg::remove: q.key = r.str(); break;
    case Msg::compare_set: q.key = r.str(), q.expected = to_vector(r.bytes()), q.value = to_vector(r.bytes()); break;
    case Msg::exchange:
      q.key = r.str(), q.rank = r.i32(), q.world = r.i32(), q.timeout_ms = r.u64(), q.label = r.str(),
      q.value = to_vector(r.bytes());
      if (q.world <= 0 || q.rank < 0 || q.rank >= q.world)
        throw_error<wire_error>("malformed exchange: rank ", q.rank, " of world size ", q.world);
      if (r.remaining() > 0) q.members = parse_members(r, q.world);
      break;
    case Msg::bye: break;
    default: throw_error<wire_error>("unknown store request type ", static_cast<int>(t));
  }
  r.expect_end();
  return q;
}

/// @name Request encoders (client side)
///@{
inline std::vector<std::byte> encode_hello(std::string_view token, int rank, int world, std::string_view job_id = {}, bool probing = false,
                                          std::uint64_t process = 0) {
  return WireWriter(Msg::hello)
      .u32(store_magic)
      .u32(store_protocol_version)
      .str(token)
      .i32(rank)
      .i32(world)
      .str(job_id)
      .u8(probing ? 1 : 0)
      .u64(process)
      .finish();
}
inline std::vector<std::byte> encode_failure(FailureKind kind, std::string_view message) {
  return WireWriter(Msg::failure).u8(static_cast<std::uint8_t>(kind)).str(message).finish();
}
///@}

}  // namespace detail
ACCEL_NAMESPACE_END
