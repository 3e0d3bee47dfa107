// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file cpu.hpp
/// @brief CpuCommunicator: collectives for processes on CPU, over the job's store and shared memory.
///
/// Each round is one store exchange (one request per rank, one reply when the last rank arrives),
/// which also carries the sequence check and failure markers. Small payloads ride inside it. Large
/// payloads of ranks that share a machine go through POSIX shared memory: each rank writes its
/// payload once into its own segment (two, alternating between rounds, so a rank that races ahead
/// never overwrites what a slower one still reads) and every peer decodes it in place. Segments
/// stay mapped between rounds on both sides, so a steady stream of rounds faults in no pages. Across machines
/// (or with ACCEL_CPU_SHM=0) everything rides in the store exchange.
///
/// When every rank is on this machine, a round whose payloads all fit 256 KiB skips the store: it
/// goes through a shared-memory slot per rank (detail/shm_slots.hpp); a peer that left is still
/// named by the store.
/// Payloads through the store larger than a round's share (CpuCommOptions::store_round_bytes /
/// ranks) travel in pieces over several rounds (detail/store_chunks.hpp): no store frame and no
/// store memory grows with the payload, and payloads of 4 GiB and more go through like any other.
///
/// Buffer collectives (all_reduce and friends over spans) check their descriptors in one store
/// round, then move the data through a third segment per rank in pipelined chunks
/// (detail/shm_collectives.hpp); across machines the data rides in store rounds instead.
///
/// Point-to-point messages (p2p.hpp) between processes of one machine go through a shared-memory
/// channel per ordered pair, made on first use (detail/shm_p2p.hpp); across machines (or with
/// ACCEL_CPU_SHM=0) through store exchanges between the two processes (detail/p2p_store.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/comm/detail/shm.hpp>
#include <accel/comm/detail/shm_collectives.hpp>
#include <accel/comm/detail/p2p_store.hpp>
#include <accel/comm/detail/shm_p2p.hpp>
#include <accel/comm/detail/shm_slots.hpp>
#include <accel/comm/detail/store_chunks.hpp>
#include <accel/comm/wire.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/comm/store.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Settings of a CpuCommunicator.
struct CpuCommOptions {
  std::string name = "default";               ///< distinguishes several communicators of one job (same on every rank)
  std::size_t shm_threshold = 32 * 1024;      ///< payloads of at least this many bytes use shared memory
  bool use_shm = true;                        ///< false (or ACCEL_CPU_SHM=0): everything through the store
  std::size_t buffer_chunk_bytes = 1 << 20;   ///< buffer collectives: bytes per pipelined step (same on every rank; each
                                              ///< rank holds a segment of twice this)
  /// Rounds whose payloads all fit this go through per-rank shared-memory slots instead of the store
  /// (0: never). Each rank holds two slots, reserved and mapped in full when the communicator is made
  /// (a full /dev/shm is an error then, not in the middle of a round).
  /// Up to here a slot round (a copy in, one copy out per peer) beats a store round trip plus
  /// segment views (measured: a 64 KiB gather between 2 processes 18-20 us through slots, 62-75 us
  /// through the store; at 1 MiB the two are level). Jobs of more than 2 ranks use at most
  /// 1 MiB / (ranks - 1), and at least 64 KiB, since every rank copies out every peer's entry (so
  /// the default is lowered from 6 ranks on).
  std::size_t slot_payload_bytes = 256 * 1024;
  /// Payloads through the store (across machines, without shared memory, or too large for it):
  /// the most bytes one round carries for all ranks together; a payload larger than its share
  /// (this / ranks, at least 64 KiB) goes in pieces over several rounds. Same on every rank. The
  /// default keeps every buffer of a round under glibc's largest mmap threshold (32 MiB), so rounds
  /// reuse heap memory instead of faulting in fresh pages each time.
  std::size_t store_round_bytes = std::size_t{16} << 20;
  /// The most bytes a rank accepts to receive in pieces in one collective (0: as much as memory
  /// allows). Past it, or when the memory cannot be allocated, every rank throws comm_error naming
  /// the rank, the size and the limit, before the bulk of the data moves.
  std::size_t max_receive_bytes = 0;
};

/// @brief Collectives over the job's store (and shared memory on one machine).
class CpuCommunicator final : public Communicator {
 public:
  /// @brief Joins the communicator. Collective: every rank constructs it with the same options.name.
  /// @param store the job's store (connect_job_store())
  /// @throws comm_error / timeout_error when a rank does not join within the store's timeout
  CpuCommunicator(std::shared_ptr<StoreClient> store, int rank, int size, CpuCommOptions options = {})
      : CpuCommunicator(std::move(store), rank, size, std::move(options), {}) {}

 private:
  // A group's communicator (make_group) names its members' job ranks, so the store watches them.
  CpuCommunicator(std::shared_ptr<StoreClient> store, int rank, int size, CpuCommOptions options, std::vector<int> members)
      : Communicator(rank, size, store->timeout()), store_(std::move(store)), options_(std::move(options)), members_(std::move(members)) {
    const char* env = std::getenv("ACCEL_CPU_SHM");
    if (env && (std::string(env) == "0" || std::string(env) == "false" || std::string(env) == "off")) options_.use_shm = false;
    // Rank 0 draws a generation number so a communicator re-created under the same name never
    // sees keys of an earlier one; the setup round hands it to everyone with the machine identities.
    // It also carries what the buffer collectives need: each rank's segment name, process id, PID
    // namespace and chunk size.
    ACCEL_EXPECTS(options_.buffer_chunk_bytes >= 4096 && options_.buffer_chunk_bytes % 64 == 0,
                  "CpuCommOptions::buffer_chunk_bytes must be a multiple of 64 and at least 4096, not ", options_.buffer_chunk_bytes);
    ACCEL_EXPECTS(options_.store_round_bytes > 0, "CpuCommOptions::store_round_bytes must be positive");
    const std::string me = detail::machine_identity();
    const std::string shm_prefix = detail::unique_shm_prefix();
    const std::uint64_t generation = rank == 0 ? static_cast<std::uint64_t>(store_->add(base_key() + "generation", 1)) : 0;
    detail::WireWriter w;
    w.str(me).u64(generation).str(shm_prefix + ".c").i64(static_cast<std::int64_t>(::getpid()));
    w.u64(detail::pid_namespace_id()).u64(options_.buffer_chunk_bytes).u64(options_.store_round_bytes);
    // Small rounds: each rank's slot segment exists before the setup round, so peers can map it after.
    if (options_.use_shm && options_.slot_payload_bytes > 0 && size > 1) {
      slots_ = std::make_unique<detail::ShmSlotExchange>(shm_prefix + ".s", detail::slot_payload_limit(options_.slot_payload_bytes, size),
                                                          timeout());
      if (!slots_->create()) slots_.reset();  // no shared memory here: the store carries every round
    }
    w.str(slots_ ? slots_->segment() : std::string());
    // Point-to-point channels to this rank are named <this>.<sender>, made by this rank: a
    // leftover of the same name (a process that had this pid died unswept) goes before anyone
    // learns the names, so no sender maps it (detail/shm_p2p.hpp).
    if (options_.use_shm)
      for (int r = 0; r < size; ++r) ::shm_unlink(detail::concat(shm_prefix, ".p.", r).c_str());
    w.str(shm_prefix + ".p");
    const Blobs all = store_exchange(base_key() + "setup", w.take(), "communicator setup (" + options_.name + ")");
    same_machine_ = true;
    std::vector<detail::ShmBufferEngine::Peer> peers;
    std::vector<std::uint64_t> chunks, round_bytes;
    std::vector<std::string> slot_segments;
    std::vector<std::uint64_t> namespaces;
    std::vector<std::string> p2p_prefixes;
    for (std::size_t i = 0; i < all.size(); ++i) {
      detail::WireReader rd(all[i]);
      same_machine_ = same_machine_ && rd.str() == me;
      const auto gen = rd.u64();
      if (i == 0) generation_ = gen, prefix_ = base_key() + std::to_string(gen) + "/";
      auto& p = peers.emplace_back();
      p.segment = rd.str();
      p.pid = rd.i64();
      p.pid_namespace = rd.u64();
      chunks.push_back(rd.u64());
      round_bytes.push_back(rd.u64());
      slot_segments.push_back(rd.str());
      p2p_prefixes.push_back(rd.str());
      namespaces.push_back(p.pid_namespace);
      peer_pids_.push_back(static_cast<pid_t>(p.pid));
    }
    // Point-to-point through shared-memory channels under the slots' conditions (one machine, one
    // PID namespace, so a dead peer is noticed through its pid); otherwise through the store.
    if (size > 1 && detail::slots_usable(same_machine_, options_.use_shm, p2p_prefixes, namespaces, detail::pid_namespace_id()))
      p2p_prefixes_ = std::move(p2p_prefixes);
    if (slots_ && detail::slots_usable(same_machine_, options_.use_shm, slot_segments, namespaces, detail::pid_namespace_id())) {
      std::vector<detail::ShmSlotExchange::Peer> slot_peers;
      for (std::size_t i = 0; i < peers.size(); ++i) slot_peers.push_back({slot_segments[i], peers[i].pid});
      slots_->connect(rank, std::move(slot_peers));
    } else {
      slots_.reset();
    }
    // An option every rank must pass alike: usage_error naming what each rank passed.
    const auto same_everywhere = [](const std::vector<std::uint64_t>& values, const char* option) {
      if (std::adjacent_find(values.begin(), values.end(), std::not_equal_to<>()) == values.end()) return;
      detail::throw_error<usage_error>("CpuCommOptions::", option, " differs across ranks: ",
                                       detail::ranks_by(values.size(), [&](std::size_t r) { return std::to_string(values[r]); }, "pass"),
                                       "; pass the same value on every rank");
    };
    same_everywhere(round_bytes, "store_round_bytes");
    if (same_machine_ && options_.use_shm) {
      same_everywhere(chunks, "buffer_chunk_bytes");
      if (rank == 0) detail::remove_stale_shm_segments();  // what killed processes left (every rank is on this machine)
      segments_.emplace_back(shm_prefix + ".a");
      segments_.emplace_back(shm_prefix + ".b");
      if (size > 1) buffers_ = std::make_unique<detail::ShmBufferEngine>(rank, std::move(peers), options_.buffer_chunk_bytes, timeout());
    }
  }

 public:
  /// @brief Says this rank is done; if its last round went through shared memory, first waits
  /// (bounded) until every rank is done too, so nobody is left reading a segment being unlinked.
  ~CpuCommunicator() override {
    store_p2p_.abandon();  // a queued send or receive waiting in the store ends now
    stop_p2p();
    {
      std::lock_guard lock(p2p_mutex_);
      channels_.clear();  // tells peers waiting on a channel that this end closed
    }
    store_p2p_.release().reset();  // outside p2p_mutex_: its watcher asks closed(), which takes it
    {
      std::lock_guard lock(p2p_mutex_);
      watch_store_.reset();
    }
    if (!p2p_prefixes_.empty())
      for (int r = 0; r < size(); ++r)
        if (r != rank()) ::shm_unlink(channel_name(r, rank()).c_str());  // the channels to this rank that it made
    try {
      store_->set(key("closed/" + std::to_string(rank())), std::string_view("1"));
      if (!segments_.empty() && last_shm_round_ != 0 && last_shm_round_ == collectives_entered()) {
        std::vector<std::string> keys;
        for (int r = 0; r < size(); ++r) keys.push_back(key("closed/" + std::to_string(r)));
        store_->wait(keys, std::min(timeout(), std::chrono::milliseconds(30'000)));
      }
    } catch (...) {  // a dead peer or store: nobody is left to read the segments
    }
  }

  [[nodiscard]] std::string backend() const override { return "cpu"; }
  /// @brief Whether large payloads go through shared memory (every rank on this machine, not disabled).
  [[nodiscard]] bool uses_shared_memory() const noexcept { return !segments_.empty(); }
  /// @brief Whether rounds with small payloads go through shared-memory slots instead of the store.
  [[nodiscard]] bool uses_shared_memory_slots() const noexcept { return slots_ != nullptr; }
  /// @brief Whether point-to-point messages go through shared-memory channels (else through the store).
  [[nodiscard]] bool uses_shared_memory_p2p() const noexcept { return !p2p_prefixes_.empty(); }
  /// @brief The store this communicator runs on.
  [[nodiscard]] StoreClient& store() const noexcept { return *store_; }

 protected:
  /// A CpuCommunicator on the same store, named after this one (its instance) and the split, so
  /// its keys and shared-memory segments are its own.
  std::shared_ptr<Communicator> make_group(const GroupSpec& spec) override {
    if (spec.color == no_group) return nullptr;
    CpuCommOptions o = options_;
    o.name = detail::concat(options_.name, "/", generation_, "/split", spec.split_seq, "/", spec.color);
    return std::shared_ptr<CpuCommunicator>(
        new CpuCommunicator(store_, spec.rank, static_cast<int>(spec.members.size()), std::move(o), spec.job_ranks));
  }

  void prepare_buffers(const BufferCall&) override {
    if (buffers_) buffers_->prepare();
  }

  CollectiveHandle buffer_data(const BufferCall& c, const std::string& label) override {
    if (!buffers_) return Communicator::buffer_data(c, label);
    last_shm_round_ = collectives_entered();  // peers may still open our segment after we return: the destructor waits
    buffers_->run(c, label);
    return {};
  }

  /// Point-to-point. Between processes of one machine (one PID namespace, shared memory allowed):
  /// a shared-memory channel per ordered pair, made on first use (detail/shm_p2p.hpp). Otherwise
  /// (across machines, ACCEL_CPU_SHM=0): through the store, one exchange between the two ranks per
  /// message (the sender's descriptor and first piece, the receiver's descriptor), then one per
  /// further piece of at most half of CpuCommOptions::store_round_bytes, so the store holds at most
  /// one piece per message in flight. Each peer and direction uses a store connection of its own,
  /// so a send waiting for its receiver never holds up another message of this process.
  CollectiveHandle p2p_send(const P2pSend& m) override {
    if (!p2p_prefixes_.empty()) {
      try {
        channel(true, m.peer, m.label).send(m.number, m.label, m.descriptor, m.data.head, m.data.body, m.accepts);
      } catch (const detail::shm_peer_left& e) {
        peer_left(m.peer, m.label, e.what());
      }
      return {};
    }
    store_p2p().send(m.peer, m.number, m.label, m.descriptor, m.data.head, m.data.body, m.accepts);
    return {};
  }

  CollectiveHandle p2p_recv(const P2pRecv& m) override {
    if (!p2p_prefixes_.empty()) {
      try {
        channel(false, m.peer, m.label).recv(m.number, m.label, m.descriptor, m.place);
      } catch (const detail::shm_peer_left& e) {
        peer_left(m.peer, m.label, e.what());
      }
      return {};
    }
    store_p2p().recv(m.peer, m.number, m.label, m.descriptor, m.place);
    return {};
  }

  Round exchange(std::uint64_t seq, const std::string& label, std::span<const std::byte> header, const Payload& payload) override {
    if (slots_) {
      Round r;
      try {
        if (slots_->run(label, header, payload.head, payload.body, r.headers, r.payloads)) return r;
      } catch (const detail::shm_peer_left&) {
        // The peer never joins this round's store key either: the store says how it left
        // (exited, crashed, never joined), as it does for rounds that travel through it.
        store_exchange(key(std::to_string(seq)), std::span<const std::byte>(), label);
        throw;
      }
    }
    // Entry: u32 header size, header, u8 transport, then the payload (0: inline), a segment
    // reference (1), or the payload's size and first piece (2: the rest follows in more rounds).
    detail::WireWriter w;
    w.bytes(header);
    detail::ShmSegment* seg = nullptr;  // our segment, when this round's payload went into it
    if (!segments_.empty() && payload.size() >= options_.shm_threshold && segments_[seq % 2].write(payload.head, payload.body)) {
      seg = &segments_[seq % 2];
      w.u8(1).str(seg->name()).u64(payload.size()), last_shm_round_ = seq;
    }
    const std::size_t piece = detail::store_piece_bytes(size(), options_.store_round_bytes);
    std::vector<std::byte> scratch;
    if (!seg && payload.size() <= piece)
      w.u8(0).bytes(payload.size() == payload.head.size() ? payload.head : std::span<const std::byte>(payload.joined()));
    else if (!seg)
      w.u8(2).u64(payload.size()).bytes(slice(payload, 0, piece, scratch));
    const auto entry = w.take();
    Blobs all = store_exchange(key(std::to_string(seq)), entry, label);

    Round r;
    struct Part {
      std::span<const std::byte> inline_data;  ///< the payload, or its first piece
      std::string segment;
      std::uint64_t size = 0;
      bool pieces = false;
    };
    std::vector<Part> parts(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      try {
        detail::WireReader rd(all[i]);
        r.headers.push_back(rd.bytes());
        const auto transport = rd.u8();
        if (transport == 0) {
          parts[i].inline_data = rd.bytes();
          parts[i].size = parts[i].inline_data.size();
        } else if (transport == 2) {
          parts[i].pieces = true;
          parts[i].size = rd.u64();
          parts[i].inline_data = rd.bytes();
          if (parts[i].size <= piece || parts[i].inline_data.size() != piece)
            throw detail::wire_error(detail::concat("a ", parts[i].size, "-byte payload announced with a first piece of ",
                                                    parts[i].inline_data.size(), " bytes, ", piece, " expected"));
        } else {
          parts[i].segment = rd.str();
          parts[i].size = rd.u64();
          if (parts[i].size > SIZE_MAX) throw detail::wire_error("a shared-memory payload larger than the address space");
        }
        rd.expect_end();
      } catch (const detail::wire_error& e) {
        detail::throw_error<comm_error>("rank ", i, " sent a malformed entry for ", label, " (", e.what(), ")");
      }
    }
    // Payloads in pieces: the other rounds, into one buffer for all of them.
    std::vector<std::uint64_t> piece_sizes(parts.size(), 0);
    std::vector<std::span<const std::byte>> first_pieces(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (parts[i].pieces) piece_sizes[i] = parts[i].size, first_pieces[i] = parts[i].inline_data;
    const std::shared_ptr<std::byte[]> pieced =
        detail::continuation_rounds(piece_sizes, piece) == 0
            ? nullptr
            : receive_pieces(seq, label, payload.size() > piece && !seg ? payload : Payload(), piece_sizes, first_pieces, piece, scratch);
    // Inline parts are copied next to each other; shared-memory parts (our own included) are
    // viewed in place through mappings kept between rounds, so a large payload is copied once,
    // by the decoder.
    std::size_t inline_total = 0;
    for (const auto& p : parts)
      if (p.segment.empty() && !p.pieces) inline_total += p.size;
    r.payloads.buffer.reserve(inline_total);
    std::size_t pieced_at = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const bool mine = static_cast<int>(i) == rank();
      if (parts[i].pieces) {
        const auto n = static_cast<std::size_t>(parts[i].size);
        r.payloads.push_external(std::span<const std::byte>(pieced.get() + pieced_at, n), std::shared_ptr<const void>(pieced, pieced.get()));
        pieced_at += n;
      } else if (!parts[i].segment.empty() && mine && seg) {
        r.payloads.push_external(std::span<const std::byte>(seg->mapping().get(), parts[i].size), seg->mapping());
      } else if (!parts[i].segment.empty()) {
        auto [view, owner] = peer_maps_.view(parts[i].segment, static_cast<std::size_t>(parts[i].size), static_cast<int>(i));
        r.payloads.push_external(view, std::move(owner));
      } else if (mine) {
        r.payloads.push_back(payload.head);
        r.payloads.append_to_last(payload.body);
      } else {
        r.payloads.push_back(parts[i].inline_data);
      }
    }
    return r;
  }

 private:
  // Bytes [first, first + length) of a payload: a view when they lie in one of its two pieces,
  // else copied into `scratch`.
  static std::span<const std::byte> slice(const Payload& p, std::uint64_t first, std::uint64_t length, std::vector<std::byte>& scratch) {
    const auto at = static_cast<std::size_t>(first), n = static_cast<std::size_t>(length);
    if (at + n <= p.head.size()) return p.head.subspan(at, n);
    if (at >= p.head.size()) return p.body.subspan(at - p.head.size(), n);
    scratch.resize(n);
    const std::size_t from_head = p.head.size() - at;
    std::memcpy(scratch.data(), p.head.data() + at, from_head);
    std::memcpy(scratch.data() + from_head, p.body.data(), n - from_head);
    return scratch;
  }

  // The rounds after the first of a collective whose payloads (sizes: those sent in pieces, 0 for
  // the others) did not fit one round: round k carries piece k of each, copied into one buffer
  // holding them back to back in rank order. Round 1 also carries whether each rank could make
  // room (the limit, the allocation), so a rank that cannot fails every rank before the bulk of
  // the data moves, and no rank is left waiting in a later round.
  // @param mine this rank's payload when it goes in pieces, else empty
  // @throws comm_error on every rank naming the rank(s) that cannot receive, and why
  std::shared_ptr<std::byte[]> receive_pieces(std::uint64_t seq, const std::string& label, const Payload& mine,
                                              const std::vector<std::uint64_t>& sizes, const std::vector<std::span<const std::byte>>& first,
                                              std::size_t piece, std::vector<std::byte>& scratch) {
    std::uint64_t total = 0;
    for (const auto s : sizes) total += s;
    std::string problem;
    std::shared_ptr<std::byte[]> buffer;
    if (options_.max_receive_bytes != 0 && total > options_.max_receive_bytes) {
      problem = detail::concat("rank ", rank(), " would receive ", text::format_bytes(total), " in ", label, ", over its limit of ",
                               text::format_bytes(options_.max_receive_bytes), " (CpuCommOptions::max_receive_bytes)");
    } else {
      try {
        if (total > SIZE_MAX) throw std::bad_alloc();
        buffer.reset(new std::byte[static_cast<std::size_t>(total)]);  // uninitialised: every byte is written below
      } catch (const std::bad_alloc&) {
        problem = detail::concat("rank ", rank(), " cannot allocate the ", text::format_bytes(total), " it would receive in ", label,
                                 " (out of memory); gather less per call");
      }
    }
    std::vector<std::size_t> offset(sizes.size(), 0);
    for (std::size_t i = 1; i < sizes.size(); ++i) offset[i] = offset[i - 1] + static_cast<std::size_t>(sizes[i - 1]);
    if (buffer)
      for (std::size_t i = 0; i < sizes.size(); ++i)
        if (sizes[i]) std::memcpy(buffer.get() + offset[i], first[i].data(), first[i].size());
    const std::uint64_t rounds = detail::continuation_rounds(sizes, piece);
    for (std::uint64_t k = 1; k <= rounds; ++k) {
      const auto [from, length] = detail::piece_range(mine.size(), k, piece);
      detail::WireWriter w;
      w.u8(problem.empty() ? 0 : 1).str(problem);
      w.bytes(problem.empty() ? slice(mine, from, length, scratch) : std::span<const std::byte>());
      const std::string what = detail::concat(label, ", piece ", k + 1, " of ", rounds + 1);
      const Blobs all = store_exchange(key(detail::concat(seq, ".", k)), w.take(), what);
      std::vector<std::string> problems;
      std::vector<std::span<const std::byte>> got(all.size());
      for (std::size_t i = 0; i < all.size(); ++i) {
        try {
          detail::WireReader rd(all[i]);
          const bool failed = rd.u8() != 0;
          const std::string why = rd.str();
          got[i] = rd.bytes();
          rd.expect_end();
          if (failed) problems.push_back(why);
        } catch (const detail::wire_error& e) {
          detail::throw_error<comm_error>("rank ", i, " sent a malformed piece for ", what, " (", e.what(), ")");
        }
      }
      if (!problems.empty())
        detail::throw_error<comm_error>(text::join(problems, "; "), "; no rank returns a result from ", label);
      for (std::size_t i = 0; i < all.size(); ++i) {
        const auto [at, n] = detail::piece_range(sizes[i], k, piece);
        if (got[i].size() != n)
          detail::throw_error<comm_error>("rank ", i, " sent ", got[i].size(), " bytes for ", what, ", ", n, " expected");
        if (n) std::memcpy(buffer.get() + offset[i] + at, got[i].data(), got[i].size());
      }
    }
    return buffer;
  }

  // Point-to-point: the channel name of messages from `from` to `to` (made in `to`'s name).
  std::string channel_name(int from, int to) const { return detail::concat(p2p_prefixes_[static_cast<std::size_t>(to)], ".", from); }

  // This end of the channel to (sending) or from `peer`, opened on first use. Opened outside
  // p2p_mutex_: a sender waits there for its receiver to make the channel, asking closed() (which
  // takes the mutex) meanwhile, and other peers' messages must not wait for it. Only one call per
  // direction and peer runs at a time (the Communicator's queues), so no two threads open one.
  detail::ShmP2pChannel& channel(bool sending, int peer, const std::string& label) {
    detail::ShmP2pChannel* ch = nullptr;
    {
      std::lock_guard lock(p2p_mutex_);
      auto& made = channels_[{sending, peer}];
      if (!made) {
        const pid_t pid = peer_pids_[static_cast<std::size_t>(peer)];
        made = std::make_unique<detail::ShmP2pChannel>(sending ? channel_name(rank(), peer) : channel_name(peer, rank()), sending,
                                                       detail::ShmP2pChannel::Peer{peer, rank_name(peer), pid}, timeout(),
                                                       [this] { return p2p_closing(); }, [this, peer] { return closed(peer); });
      }
      ch = made.get();
    }
    if (!ch->is_open()) ch->open(label);
    return *ch;
  }

  // The store path of point-to-point messages, made on first use.
  detail::StoreP2p& store_p2p() {
    return store_p2p_.get(*this, store_, key(""), options_.store_round_bytes, [this](int r) { return closed(r); });
  }

  // The connection for questions about peers while messages wait on channels (not the main
  // one: a collective may hold it while it waits for a peer that waits for this message).
  // Connected outside p2p_mutex_ (connecting may take a while; channels and other questions
  // must not wait for it); two threads that both find none connect twice, and one is kept.
  StoreClient& watch_store() {
    {
      std::lock_guard lock(p2p_mutex_);
      if (watch_store_) return *watch_store_;
    }
    std::shared_ptr<StoreClient> made = store_->connect_again();
    std::lock_guard lock(p2p_mutex_);
    if (!watch_store_) watch_store_ = std::move(made);
    return *watch_store_;
  }

  // Whether `peer`'s communicator has ended (its destructor sets the key); false when unsure.
  bool closed(int peer) {
    try {
      watch_store().wait({key("closed/" + std::to_string(peer))}, std::chrono::milliseconds(1));
      return true;
    } catch (const comm_error&) {  // not set (timeout_error), or the store cannot say now
      return false;
    }
  }

  // A peer's process ended while this rank waited for it on a channel: the store says how it left
  // (a short inquiry: one exchange the peer never joins), else the channel's own words.
  [[noreturn]] void peer_left(int peer, const std::string& label, const std::string& local) {
    const int lo = std::min(rank(), peer), hi = std::max(rank(), peer);
    const int members[2] = {job_rank(lo), job_rank(hi)};
    std::string how;
    try {
      watch_store().exchange(key(detail::concat("p2p/left/", lo, "-", hi, "/", rank(), ".", ++p2p_inquiries_)), rank() == lo ? 0 : 1, 2,
                             {}, label, std::chrono::milliseconds(2000), members);
    } catch (const timeout_error&) {
    } catch (const comm_error& e) {
      how = detail::how_peer_left(e.what());
    }
    if (how.empty()) detail::throw_error<comm_error>(local);
    const pid_t pid = peer_pids_[static_cast<std::size_t>(peer)];
    detail::throw_error<comm_error>(rank_name(peer), " (pid ", pid, ") ", how, " during ", label);
  }

  // One round among this communicator's ranks through the store (a group's names its job ranks).
  Blobs store_exchange(const std::string& k, std::span<const std::byte> value, std::string_view label) {
    return store_->exchange(k, rank(), size(), value, label, std::nullopt, members_);
  }
  std::string base_key() const { return "accel/comm/" + options_.name + "/"; }
  std::string key(const std::string& what) const { return prefix_ + what; }

  std::shared_ptr<StoreClient> store_;
  CpuCommOptions options_;
  std::vector<int> members_;  ///< a group's: the job rank of each rank (empty: the job's ranks)
  std::uint64_t generation_ = 0;  ///< this instance's number among communicators of its name
  std::string prefix_;  ///< store key prefix of this communicator instance
  bool same_machine_ = false;
  std::uint64_t last_shm_round_ = 0;  ///< the latest round whose payload went through our segments
  std::vector<detail::ShmSegment> segments_;
  detail::ShmPeerMappings peer_maps_;
  std::unique_ptr<detail::ShmBufferEngine> buffers_;  ///< null: buffer collectives travel in store rounds
  std::unique_ptr<detail::ShmSlotExchange> slots_;       ///< null: every round travels through the store
  std::vector<pid_t> peer_pids_;                          ///< every rank's process id
  std::vector<std::string> p2p_prefixes_;                 ///< every rank's channel prefix; empty: messages go through the store
  std::mutex p2p_mutex_;                                  ///< guards channels_, watch_store_ (async calls run on queue threads)
  std::map<std::pair<bool, int>, std::unique_ptr<detail::ShmP2pChannel>> channels_;  ///< (sending?, peer)
  detail::StoreP2pSlot store_p2p_;                                                    ///< see store_p2p()
  std::shared_ptr<StoreClient> watch_store_;  ///< see watch_store()
  std::atomic<std::uint64_t> p2p_inquiries_{0};
};

ACCEL_NAMESPACE_END
