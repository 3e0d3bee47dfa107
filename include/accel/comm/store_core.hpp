// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file store_core.hpp
/// @brief The store server's state machine, without sockets: bytes in, reply bytes out.
///
/// StoreServer (comm/store.hpp) owns the sockets and calls this from its single I/O thread, so no
/// locking is needed here. Keeping I/O out makes every protocol rule testable and fuzzable.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/comm/wire.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief How a rank left the job's store (StoreServerOptions::on_rank_gone).
enum class RankGone {
  said_goodbye,  ///< its last connection closed after a goodbye (its DistributedState was destroyed)
  disconnected,  ///< its last connection closed without a goodbye (crashed, killed, or ended without destroying its state)
  never_joined,  ///< it did not connect within the join timeout
};

/// @brief A rank the store saw leave: which, how, and when (on the steady clock).
struct RankDeparture {
  int rank = -1;
  RankGone how = RankGone::disconnected;
  std::chrono::steady_clock::time_point when{};
};

namespace detail {

using StoreClock = std::chrono::steady_clock;

/// @brief Settings of the store state machine.
struct StoreCoreOptions {
  std::string job_token;                           ///< required in every hello ("" accepts only "")
  std::size_t max_frame_bytes = std::size_t{1} << 30;  ///< largest request body after the handshake
  std::size_t max_handshake_bytes = 4096;          ///< largest body before the handshake succeeded
  int world_size = 0;                              ///< expected ranks (0 = learn from the first hello)
  std::function<void(const std::string&)> log;     ///< server-side events (refusals, deaths)
  /// A connection that has not completed its hello this long after connecting is closed.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Largest world size (and rank + 1) a hello or an exchange may name when the job's world size
  /// is not known; once it is, nothing beyond it is accepted.
  int max_world_size = 1 << 20;
  std::string job_id;  ///< the job this store serves, named when another job's process is refused
  /// Every rank of the job must say hello within this long of the first connection; the ranks
  /// that did not are then declared never joined, which fails every exchange and wait that needs
  /// them (0: no join deadline, a missing rank is only reported when a wait times out).
  std::chrono::milliseconds join_timeout{0};
  /// Told of every rank that leaves the store, in the order the store sees it, when it does (the
  /// launcher that hosts the store uses it to blame the first failure, not its consequences).
  std::function<void(const RankDeparture&)> on_rank_gone;
};

/// @brief Lets one log line through per period and counts the ones held back, so a flood of
/// identical events (idle connections, descriptor exhaustion) costs a line a minute, not one each.
class LogThrottle {
 public:
  /// @return the text to append to the line (" (N more since ...)" or "") when it should be
  /// logged now; nullopt when it is held back
  std::optional<std::string> admit(StoreClock::time_point now, StoreClock::duration period = std::chrono::minutes(1)) {
    if (last_ && now - *last_ < period) {
      ++held_;
      return std::nullopt;
    }
    std::string suffix = held_ ? concat(" (", held_, " more since the last report)") : std::string();
    last_ = now, held_ = 0;
    return suffix;
  }

 private:
  std::optional<StoreClock::time_point> last_;
  std::uint64_t held_ = 0;
};

/// @brief Keys, waiters, collective exchanges and rank liveness of one store.
class StoreCore {
 public:
  using ConnId = std::uint64_t;
  using Chunk = std::shared_ptr<const std::vector<std::byte>>;

  /// @brief One client connection as the core sees it.
  struct Conn {
    Conn(std::string p, std::size_t limit, StoreClock::time_point hello_by)
        : peer(std::move(p)), in(limit), handshake_deadline(hello_by) {}
    std::string peer;
    FrameAssembler in;
    StoreClock::time_point handshake_deadline;  ///< closed if not authenticated by then
    std::deque<Chunk> out;          ///< reply frames not yet written
    std::size_t out_offset = 0;     ///< bytes of out.front() already written
    bool authenticated = false;
    bool said_bye = false;
    bool busy = false;              ///< a get/wait/exchange is pending; later frames wait their turn
    bool close_after_flush = false; ///< refused or broke the protocol: close once replies are out
    bool drop = false;              ///< close now, unflushed: its handshake deadline passed with output stuck
    int rank = -1;
  };

  explicit StoreCore(StoreCoreOptions options) : options_(std::move(options)), world_(options_.world_size) {}

  /// @brief A client connected from `peer` at `now`; it has the handshake timeout to say hello.
  /// Ids must grow with time (oldest_pending() relies on it).
  void open(ConnId id, std::string peer, StoreClock::time_point now = StoreClock::now()) {
    if (!join_deadline_ && options_.join_timeout.count() > 0) join_deadline_ = now + options_.join_timeout;
    conns_.emplace(id, Conn(std::move(peer), options_.max_handshake_bytes, now + options_.handshake_timeout));
    pending_.insert(id);
  }

  /// @brief Bytes arrived on a connection. Never throws for any byte sequence.
  void receive(ConnId id, std::span<const std::byte> data, StoreClock::time_point now) {
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.close_after_flush) return;
    it->second.in.feed(data);
    process(id, now);
  }

  /// @brief The connection closed (by the peer, by an error, or after a refusal was flushed).
  void closed(ConnId id, StoreClock::time_point now) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    const Conn c = std::move(it->second);
    conns_.erase(it);
    pending_.erase(id);
    std::erase_if(waiters_, [&](const Waiter& w) { return w.conn == id; });
    for (auto& [key, ex] : exchanges_)
      for (auto& slot : ex.slots)
        if (slot.conn == id) slot.conn = 0;
    if (!c.authenticated || c.rank < 0) return;
    RankInfo& info = ranks_[c.rank];
    if (--info.live > 0) return;
    if (c.said_bye) {
      if (info.status != RankStatus::died) info.status = RankStatus::left;
      tell_gone(c.rank, RankGone::said_goodbye, now);
      on_rank_gone(c.rank, false);
    } else {
      info.status = RankStatus::died;
      log(concat("rank ", c.rank, " (", c.peer, ") ", gone_text(RankStatus::died)));
      tell_gone(c.rank, RankGone::disconnected, now);
      on_rank_gone(c.rank, true);
    }
  }

  /// @brief Fails every wait whose deadline has passed and closes connections that did not say
  /// hello in time.
  void tick(StoreClock::time_point now) {
    check_join_deadline(now);
    for (ConnId id : pending_) {
      Conn& c = conns_.at(id);
      if (c.handshake_deadline > now || c.drop) continue;
      // The reply is one small frame, so it normally leaves at once; a peer that does not read
      // even that is cut off at the next tick.
      if (c.close_after_flush) {
        c.drop = true;
        continue;
      }
      const std::string why = concat("no hello within ", text::format_ms(static_cast<std::uint64_t>(options_.handshake_timeout.count())),
                                     " of connecting; closing the connection");
      if (auto more = idle_log_.admit(now)) log(concat("closed ", c.peer, ": ", why, *more));
      send(id, encode_failure(FailureKind::refused, why));
      c.close_after_flush = true;
    }
    std::vector<Waiter> expired;
    std::erase_if(waiters_, [&](const Waiter& w) { return w.deadline <= now && (expired.push_back(w), true); });
    for (const auto& w : expired) {
      std::vector<std::string> missing;
      for (const auto& k : w.keys)
        if (!kv_.count(k)) missing.push_back("'" + k + "'");
      fail(w.conn, FailureKind::timeout,
           concat("timed out after ", text::format_ms(w.timeout_ms), " waiting for store key(s) ", text::join(missing), "; ",
                  ranks_summary()));
    }
    std::vector<std::pair<std::string, std::uint64_t>> expired_ex;
    for (auto& [key, ex] : exchanges_)
      if (ex.abandoned.empty())
        for (const auto& s : ex.slots)
          if (s.present && s.conn != 0 && s.deadline <= now) {
            expired_ex.emplace_back(key, s.timeout_ms);
            break;
          }
    for (const auto& [key, ms] : expired_ex) {
      Exchange& ex = exchanges_[key];
      abandon(key, FailureKind::timeout,
              concat("timed out after ", text::format_ms(ms), " in ", ex.label, ": ", missing_ranks(ex), " not arrived"));
    }
  }

  /// @brief The earliest deadline of any pending wait (the I/O loop's poll timeout).
  [[nodiscard]] std::optional<StoreClock::time_point> next_deadline() const {
    std::optional<StoreClock::time_point> best;
    auto take = [&](StoreClock::time_point t) { best = best ? std::min(*best, t) : t; };
    for (const auto& w : waiters_) take(w.deadline);
    if (join_deadline_ && !join_checked_) take(*join_deadline_);
    for (ConnId id : pending_)
      if (const Conn& c = conns_.at(id); !c.drop) take(c.handshake_deadline);
    for (const auto& [key, ex] : exchanges_)
      if (ex.abandoned.empty())
        for (const auto& s : ex.slots)
          if (s.present && s.conn != 0) take(s.deadline);
    return best;
  }

  /// @brief Connections and their pending output (the I/O loop writes `out` and honours `close_after_flush`).
  std::map<ConnId, Conn>& connections() noexcept { return conns_; }
  /// @brief Number of connections that have not completed a hello (including refused ones not yet closed).
  [[nodiscard]] std::size_t pending() const noexcept { return pending_.size(); }
  /// @brief The longest-connected of those, if any.
  [[nodiscard]] std::optional<ConnId> oldest_pending() const {
    if (pending_.empty()) return std::nullopt;
    return *pending_.begin();
  }
  /// @brief Number of pending get/wait requests (tests).
  [[nodiscard]] std::size_t waiting() const noexcept { return waiters_.size(); }
  /// @brief Whether a key is present (tests).
  [[nodiscard]] bool contains(const std::string& key) const { return kv_.count(key) != 0; }
  /// @brief Bytes of payload memory the store holds: key values, exchange contributions not yet
  /// sent back, queued replies and the connections' receive buffers (what a finished collective
  /// must not leave behind).
  [[nodiscard]] std::size_t retained_bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& [key, value] : kv_) n += key.size() + value.capacity();
    for (const auto& [key, ex] : exchanges_)
      for (const auto& s : ex.slots) n += s.value.capacity();
    for (const auto& [id, c] : conns_) {
      n += c.in.capacity();
      for (const auto& chunk : c.out) n += chunk->size();
    }
    return n;
  }

 private:
  enum class RankStatus { connected, left, died, never_joined };
  struct RankInfo {
    int live = 0;
    RankStatus status = RankStatus::connected;
    std::uint64_t process = 0;  ///< the hello's process number of the rank's first connection; 0: unknown
    std::string peer;           ///< that connection's address, named when another process claims the rank
  };
  struct Waiter {
    ConnId conn;
    Msg type;
    std::vector<std::string> keys;
    StoreClock::time_point deadline;
    std::uint64_t timeout_ms;
  };
  struct Slot {
    bool present = false;
    ConnId conn = 0;  ///< 0 once the contributor's connection is gone
    std::vector<std::byte> value;
    StoreClock::time_point deadline{};
    std::uint64_t timeout_ms = 0;
  };
  struct Exchange {
    std::string label;
    std::vector<Slot> slots;
    std::vector<std::int32_t> members;  ///< job rank of each slot (a group's exchange); empty: slot r is rank r
    int arrived = 0;
    std::string abandoned;  ///< why it can never complete ("" while it can)
    FailureKind abandoned_kind = FailureKind::peer_gone;
  };

  void log(const std::string& msg) const {
    if (options_.log) options_.log(msg);
  }

  void send(ConnId id, Chunk chunk) {
    auto it = conns_.find(id);
    if (it != conns_.end()) it->second.out.push_back(std::move(chunk));
  }
  void send(ConnId id, std::vector<std::byte> frame) { send(id, std::make_shared<const std::vector<std::byte>>(std::move(frame))); }
  // Sends the reply that ends the connection's pending request; its queued frames run next.
  void finish(ConnId id, Chunk chunk) {
    send(id, std::move(chunk));
    auto it = conns_.find(id);
    if (it != conns_.end() && it->second.busy) it->second.busy = false, pending_resume_.push_back(id);
  }
  void finish(ConnId id, std::vector<std::byte> frame) { finish(id, std::make_shared<const std::vector<std::byte>>(std::move(frame))); }
  void fail(ConnId id, FailureKind kind, const std::string& msg) { finish(id, encode_failure(kind, msg)); }
  void refuse(ConnId id, FailureKind kind, const std::string& msg, bool quiet = false) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    if (!quiet) log(concat("refused ", it->second.peer, ": ", msg));
    send(id, encode_failure(kind, msg));
    it->second.close_after_flush = true;
  }

  std::string rank_state(int r) const {
    auto it = ranks_.find(r);
    if (it == ranks_.end()) return "never connected";
    switch (it->second.status) {
      case RankStatus::connected: return "connected";
      case RankStatus::left: return "exited";
      case RankStatus::died: return "disconnected";
      case RankStatus::never_joined: return "never joined";
    }
    return "?";
  }
  // What happened to a rank that is gone, as the rest of a sentence that starts "rank N ".
  std::string gone_text(RankStatus status) const {
    switch (status) {
      case RankStatus::left: return "exited";
      case RankStatus::died:
        // A rank's client says goodbye when its DistributedState (or store client) is destroyed;
        // a plain exit code alone does not tell whether destructors ran, so no cause is claimed.
        return "lost its connection to the store without saying goodbye (the process crashed, was killed, or ended "
               "without destroying its DistributedState)";
      case RankStatus::never_joined:
        return concat("never joined the job: it did not connect to the store within ",
                      text::format_ms(static_cast<std::uint64_t>(options_.join_timeout.count())),
                      " (ACCEL_JOIN_TIMEOUT_S) of the first rank; it did not start, or exited or hung before creating its "
                      "DistributedState");
      case RankStatus::connected: break;
    }
    return "is connected";
  }
  std::string ranks_summary() const {
    std::vector<int> up, down;
    const int n = world_ > 0 ? world_ : (ranks_.empty() ? 0 : ranks_.rbegin()->first + 1);
    for (int r = 0; r < n; ++r) (rank_state(r) == "connected" ? up : down).push_back(r);
    std::string s = concat("ranks connected: ", up.empty() ? "none" : text::join(up), " of world size ", n);
    for (int r : down) s += concat("; rank ", r, " ", rank_state(r));
    return s;
  }
  std::string missing_ranks(const Exchange& ex) const {
    std::string s;
    int count = 0;
    for (std::size_t r = 0; r < ex.slots.size(); ++r)
      if (!ex.slots[r].present) {
        const int job = job_rank(ex, r);
        s += ex.members.empty() ? concat(count++ ? ", " : "", r, " (", rank_state(job), ")")
                                : concat(count++ ? ", " : "", r, " (job rank ", job, ", ", rank_state(job), ")");
      }
    return concat(ex.members.empty() ? "" : "group ", count == 1 ? "rank " : "ranks ", s, count == 1 ? " has" : " have");
  }
  // The job rank behind an exchange's slot: the slot itself, or its member in a group's exchange.
  static int job_rank(const Exchange& ex, std::size_t slot) {
    return ex.members.empty() ? static_cast<int>(slot) : static_cast<int>(ex.members[slot]);
  }
  // "rank 3", or "group rank 1 (job rank 3)" in a group's exchange.
  static std::string slot_name(const Exchange& ex, std::size_t slot) {
    return ex.members.empty() ? concat("rank ", slot) : concat("group rank ", slot, " (job rank ", ex.members[slot], ")");
  }

  void process(ConnId id, StoreClock::time_point now) {
    for (;;) {
      auto it = conns_.find(id);
      if (it == conns_.end() || it->second.busy || it->second.close_after_flush) return;
      std::optional<std::vector<std::byte>> body;
      try {
        body = it->second.in.next();
      } catch (const error& e) {
        refuse(id, FailureKind::protocol, e.what());
        return;
      }
      if (!body) return;
      try {
        handle(id, parse_request(*body), now);
      } catch (const error& e) {
        refuse(id, FailureKind::protocol, e.what());
        return;
      } catch (const std::exception& e) {
        // Not the client's fault (memory exhausted, or a bug here): end this connection and say why.
        log(concat("internal error while serving ", it->second.peer, ": ", e.what()));
        refuse(id, FailureKind::protocol, concat("the store failed on this request: ", e.what()));
        return;
      }
    }
  }

  void handle(ConnId id, StoreRequest q, StoreClock::time_point now) {
    Conn& c = conns_.at(id);
    if (!c.authenticated) return handshake(id, c, q);
    if (q.type == Msg::hello) throw_error<wire_error>("a second hello on an established store connection");
    const auto deadline = now + std::chrono::milliseconds(std::min<std::uint64_t>(q.timeout_ms, 1ull << 40));
    switch (q.type) {
      case Msg::set:
        kv_[q.key] = std::move(q.value);
        finish(id, WireWriter(Msg::ok).finish());
        notify(q.key);
        break;
      case Msg::get:
      case Msg::wait: {
        if (q.type == Msg::get) q.keys = {q.key};
        c.busy = true;
        waiters_.push_back({id, q.type, std::move(q.keys), deadline, q.timeout_ms});
        if (!try_wake(waiters_.back())) {
          if (auto dead = first_dead()) {
            waiters_.pop_back();
            fail(id, FailureKind::peer_gone,
                 concat("rank ", *dead, " ", gone_text(ranks_.at(*dead).status), " earlier, so the awaited store key may never be set"));
          }
        } else {
          waiters_.pop_back();
        }
        break;
      }
      case Msg::add: {
        std::int64_t v = 0;
        if (auto it = kv_.find(q.key); it != kv_.end()) {
          const auto old = text::parse_integer<std::int64_t>(
              std::string_view(reinterpret_cast<const char*>(it->second.data()), it->second.size()));
          if (!old) {
            finish(id, encode_failure(FailureKind::mismatch, concat("store key '", q.key, "' does not hold an integer, cannot add to it")));
            break;
          }
          v = *old;
        }
        v = static_cast<std::int64_t>(static_cast<std::uint64_t>(v) + static_cast<std::uint64_t>(q.delta));
        const std::string digits = std::to_string(v);
        kv_[q.key] = to_vector(std::as_bytes(std::span<const char>(digits.data(), digits.size())));
        finish(id, WireWriter(Msg::integer).i64(v).finish());
        notify(q.key);
        break;
      }
      case Msg::remove: finish(id, WireWriter(Msg::integer).i64(kv_.erase(q.key) ? 1 : 0).finish()); break;
      case Msg::compare_set: {
        auto it = kv_.find(q.key);
        const bool swap = it == kv_.end() ? q.expected.empty() : it->second == q.expected;
        if (swap) kv_[q.key] = q.value;
        const auto& result = swap ? q.value : (it == kv_.end() ? q.expected : it->second);
        finish(id, WireWriter(Msg::value).bytes(result).finish());
        if (swap) notify(q.key);
        break;
      }
      case Msg::exchange: c.busy = true, join_exchange(id, std::move(q), deadline); break;
      case Msg::bye: c.said_bye = true; break;
      default: throw_error<wire_error>("store request type ", static_cast<int>(q.type), " is not valid here");
    }
  }

  void handshake(ConnId id, Conn& c, const StoreRequest& q) {
    if (q.type != Msg::hello) return refuse(id, FailureKind::protocol, "the first store message must be a hello");
    // A client probing the ports derived from its job id is told quietly that this store is not its own.
    const bool quiet = q.probing;
    if (q.magic != store_magic)
      return refuse(id, FailureKind::other_job, "not an accel store client (bad magic number)", quiet);
    if (q.version != store_protocol_version)
      return refuse(id, FailureKind::other_job,
                    concat("store protocol version ", q.version, " is not the server's version ", store_protocol_version,
                           "; build every process of the job with the same accel version"),
                    quiet);
    if (!token_equal(q.token, options_.job_token)) return refuse(id, FailureKind::other_job, wrong_token(q.job_id), quiet);
    if (q.world > 0 && world_ > 0 && q.world != world_)
      return refuse(id, FailureKind::refused, concat("world size ", q.world, " does not match the job's world size ", world_));
    // Both bound what later messages build per rank (rank lists, exchange slots).
    if (q.world > options_.max_world_size)
      return refuse(id, FailureKind::refused,
                    concat("world size ", q.world, " exceeds the store's limit of ", options_.max_world_size, " ranks"));
    if (world_ > 0 && q.rank >= world_)
      return refuse(id, FailureKind::refused, concat("rank ", q.rank, " is outside the job's world size ", world_));
    if (q.rank >= options_.max_world_size)
      return refuse(id, FailureKind::refused,
                    concat("rank ", q.rank, " exceeds the store's limit of ", options_.max_world_size, " ranks"));
    if (auto late = ranks_.find(q.rank); late != ranks_.end() && late->second.status == RankStatus::never_joined)
      return refuse(id, FailureKind::refused,
                    concat("rank ", q.rank, " arrived after the join timeout (",
                           text::format_ms(static_cast<std::uint64_t>(options_.join_timeout.count())),
                           ", ACCEL_JOIN_TIMEOUT_S) and the other ranks were already told it never joined; start every rank "
                           "within the join timeout, create the DistributedState first thing in main, or raise ACCEL_JOIN_TIMEOUT_S"));
    // Every connection of one process carries the same number: another number for a rank already
    // taken (even one that has since ended) is a second process claiming it, never a reconnection.
    if (auto held = ranks_.find(q.rank); q.rank >= 0 && q.process != 0 && held != ranks_.end() && held->second.process != 0 &&
                                         held->second.process != q.process)
      return refuse(id, FailureKind::refused,
                    concat("rank ", q.rank, " is already taken in this job by another process (", held->second.peer, ", ",
                           rank_state(q.rank), "): two jobs share this store's address (give each job its own MASTER_PORT, "
                           "or start it with a launcher) or the launcher gave rank ", q.rank, " to two processes"));
    if (q.world > 0) world_ = q.world;
    c.authenticated = true;
    pending_.erase(id);
    c.rank = q.rank;
    c.in.set_limit(options_.max_frame_bytes);
    if (q.rank >= 0) {
      RankInfo& info = ranks_[q.rank];
      ++info.live;
      info.status = RankStatus::connected;
      if (q.process != 0 && info.process == 0) info.process = q.process, info.peer = c.peer;
    }
    send(id, WireWriter(Msg::ok).finish());
  }

  // Names both jobs when both are known, so two jobs that met at one address say which they are.
  std::string wrong_token(const std::string& client_job) const {
    const std::string& mine = options_.job_id;
    if (mine.empty() || client_job.empty())
      return "wrong job token: this store serves another job, or ACCEL_JOB_TOKEN differs between processes";
    if (mine == client_job)
      return concat("wrong job token for job ", mine, ": the tokens differ (ACCEL_JOB_TOKEN differs between the job's processes, "
                    "or two jobs share this id)");
    return concat("wrong job token: this store serves job ", mine, " but this process belongs to job ", text::excerpt(client_job),
                  "; two jobs chose the same store address (give each its own MASTER_PORT)");
  }

  static bool token_equal(const std::string& a, const std::string& b) {
    // Constant time in the content, so response timing does not reveal a token prefix.
    unsigned diff = a.size() == b.size() ? 0u : 1u;
    for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
    return diff == 0;
  }

  std::optional<int> first_dead() const {
    for (const auto& [r, info] : ranks_)
      if (info.status == RankStatus::died || info.status == RankStatus::never_joined) return r;
    return std::nullopt;
  }

  // At the join deadline, every rank of the job that never said hello is declared never joined.
  void check_join_deadline(StoreClock::time_point now) {
    if (!join_deadline_ || join_checked_ || now < *join_deadline_) return;
    join_checked_ = true;  // once: with the world size still unknown there is nobody to name
    std::vector<int> missing;
    for (int r = 0; r < world_; ++r)
      if (!ranks_.count(r)) missing.push_back(r);
    if (missing.empty()) return;
    for (int r : missing) ranks_[r].status = RankStatus::never_joined;
    log(concat(missing.size() == 1 ? "rank " : "ranks ", text::join(missing), " never connected within ",
               text::format_ms(static_cast<std::uint64_t>(options_.join_timeout.count())),
               " (ACCEL_JOIN_TIMEOUT_S); failing the collectives that wait for ", missing.size() == 1 ? "it" : "them"));
    for (int r : missing) tell_gone(r, RankGone::never_joined, now);
    for (int r : missing) on_rank_gone(r, true);
  }

  void tell_gone(int rank, RankGone how, StoreClock::time_point when) const {
    if (options_.on_rank_gone) options_.on_rank_gone(RankDeparture{rank, how, when});
  }

  bool try_wake(const Waiter& w) {
    for (const auto& k : w.keys)
      if (!kv_.count(k)) return false;
    if (w.type == Msg::get) finish(w.conn, WireWriter(Msg::value).bytes(kv_[w.keys.front()]).finish());
    else finish(w.conn, WireWriter(Msg::ok).finish());
    return true;
  }
  void notify(const std::string& key) {
    std::vector<Waiter> ready;
    std::erase_if(waiters_, [&](const Waiter& w) {
      return std::find(w.keys.begin(), w.keys.end(), key) != w.keys.end() &&
             std::all_of(w.keys.begin(), w.keys.end(), [&](const std::string& k) { return kv_.count(k) != 0; }) &&
             (ready.push_back(w), true);
    });
    for (const auto& w : ready) try_wake(w);
  }

  void join_exchange(ConnId id, StoreRequest q, StoreClock::time_point deadline) {
    // The exchange holds a slot per rank: its size must come from the job, not from one frame.
    if (world_ > 0 && q.world > world_)
      return fail(id, FailureKind::mismatch,
                  concat("rank ", q.rank, " joined ", q.label, " with world size ", q.world, ", but the job's world size is ", world_));
    if (q.world > options_.max_world_size)
      return fail(id, FailureKind::mismatch,
                  concat("rank ", q.rank, " joined ", q.label, " with world size ", q.world, ", over the store's limit of ",
                         options_.max_world_size, " ranks"));
    auto [it, fresh] = exchanges_.try_emplace(q.key);
    Exchange& ex = it->second;
    if (fresh) ex.label = q.label, ex.slots.resize(static_cast<std::size_t>(q.world)), ex.members = q.members;
    if (!ex.abandoned.empty()) return fail(id, ex.abandoned_kind, ex.abandoned);
    const auto r = static_cast<std::size_t>(q.rank);
    // A group's exchange: every member names the same job ranks, and its own is the one it registered.
    if (ex.members != q.members || (!q.members.empty() && world_ > 0 && *std::max_element(q.members.begin(), q.members.end()) >= world_)) {
      const std::string why = concat("rank ", q.rank, " joined ", q.label, " with members [", text::join(q.members), "] but ",
                                     fresh ? concat("the job has ", world_, " ranks") : concat("others use [", text::join(ex.members), "]"));
      fail(id, FailureKind::mismatch, why);
      return abandon(q.key, FailureKind::mismatch, why);
    }
    if (const int registered = conns_.at(id).rank; !q.members.empty() && registered >= 0 && q.members[r] != registered) {
      const std::string why = concat("job rank ", registered, " joined ", q.label, " as group rank ", q.rank, ", which is job rank ",
                                     q.members[r], "'s place");
      fail(id, FailureKind::mismatch, why);
      return abandon(q.key, FailureKind::mismatch, why);
    }
    if (ex.slots.size() != static_cast<std::size_t>(q.world) || ex.slots[r].present) {
      const std::string why = ex.slots.size() != static_cast<std::size_t>(q.world)
                                  ? concat("rank ", q.rank, " joined ", q.label, " with world size ", q.world, " but others use ", ex.slots.size())
                                  : concat("rank ", q.rank, " joined ", ex.label, " twice (two processes with the same rank?)");
      fail(id, FailureKind::mismatch, why);
      return abandon(q.key, FailureKind::mismatch, why);
    }
    ex.slots[r] = Slot{true, id, std::move(q.value), deadline, q.timeout_ms};
    if (++ex.arrived == static_cast<int>(ex.slots.size())) return complete(q.key);
    check_exchange(q.key);
  }

  void complete(const std::string& key) {
    Exchange& ex = exchanges_[key];
    WireWriter w(Msg::list);
    w.u32(static_cast<std::uint32_t>(ex.slots.size()));
    for (const auto& s : ex.slots) w.bytes(s.value);
    auto chunk = std::make_shared<const std::vector<std::byte>>(w.finish());
    std::vector<ConnId> waiting;
    for (const auto& s : ex.slots)
      if (s.conn != 0) waiting.push_back(s.conn);
    exchanges_.erase(key);
    for (ConnId c : waiting) finish(c, chunk);
  }

  // Fails the exchange if a rank that has not arrived is gone.
  void check_exchange(const std::string& key) {
    Exchange& ex = exchanges_[key];
    for (std::size_t r = 0; r < ex.slots.size(); ++r) {
      if (ex.slots[r].present) continue;
      auto info = ranks_.find(job_rank(ex, r));
      if (info == ranks_.end() || info->second.status == RankStatus::connected) continue;
      const RankStatus status = info->second.status;
      return abandon(key, FailureKind::peer_gone,
                     status == RankStatus::left
                         ? concat(slot_name(ex, r), " exited without joining ", ex.label,
                                  " (was the collective called on only some ranks, e.g. inside if (is_main_process())?)")
                         : concat(slot_name(ex, r), " ", gone_text(status), ", so it cannot join ", ex.label));
    }
  }

  void abandon(const std::string& key, FailureKind kind, const std::string& why) {
    Exchange& ex = exchanges_[key];
    if (!ex.abandoned.empty()) return;
    ex.abandoned = why;
    ex.abandoned_kind = kind;
    for (auto& s : ex.slots)
      if (s.present && s.conn != 0) fail(s.conn, kind, why), s.conn = 0;
  }

  // A rank that died or never joined may be the one that would have set any awaited key, so
  // every wait fails; one that exited cleanly fails only the exchanges it is missing from.
  void on_rank_gone(int rank, bool died) {
    if (died) {
      std::vector<Waiter> failed;
      std::swap(failed, waiters_);
      for (const auto& w : failed)
        fail(w.conn, FailureKind::peer_gone,
             concat("rank ", rank, " ", gone_text(ranks_.at(rank).status), " while this process waited for store key '",
                    w.keys.front(), "'"));
    }
    std::vector<std::string> keys;
    for (const auto& [key, ex] : exchanges_)
      if (ex.abandoned.empty()) keys.push_back(key);
    for (const auto& k : keys) check_exchange(k);
  }

 public:
  /// @brief Connections whose pending request just finished and that may have queued frames.
  /// The I/O loop calls this after every event so pipelined requests are not left waiting.
  void resume(StoreClock::time_point now) {
    while (!pending_resume_.empty()) {
      const ConnId c = pending_resume_.front();
      pending_resume_.pop_front();
      process(c, now);
    }
  }

 private:
  StoreCoreOptions options_;
  int world_;
  std::map<ConnId, Conn> conns_;
  std::map<std::string, std::vector<std::byte>> kv_;
  std::vector<Waiter> waiters_;
  std::map<std::string, Exchange> exchanges_;
  std::map<int, RankInfo> ranks_;
  std::deque<ConnId> pending_resume_;
  std::set<ConnId> pending_;  ///< connections without a completed hello, oldest (lowest id) first
  LogThrottle idle_log_;
  std::optional<StoreClock::time_point> join_deadline_;  ///< first connection + join timeout
  bool join_checked_ = false;                             ///< the join deadline has been applied
};

}  // namespace detail
ACCEL_NAMESPACE_END
