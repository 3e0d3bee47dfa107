// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file supervisor.hpp
/// @brief accel launch's effects: start the planned children, merge their output line by line,
/// forward signals, and stop everyone together when one fails. Used by launch/run.hpp.
#pragma once

#include <poll.h>
#include <sys/epoll.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/launch/detail/adoption.hpp>
#include <accel/launch/detail/blame.hpp>
#include <accel/launch/detail/process.hpp>
#include <accel/launch/launch_plan.hpp>

extern "C" char** environ;  // the process environment (POSIX; unistd.h declares it only with _GNU_SOURCE)

ACCEL_NAMESPACE_BEGIN
namespace launch {
namespace detail {

/// @brief Cuts a byte stream into whole lines. A line is kept whole however many reads it takes,
/// up to `max_line` bytes (16 MiB by default: far beyond any real log line, a JSON record or a
/// progress bar redrawn with '\r' included). Past that bound the line is emitted in pieces of
/// `max_line` bytes, each shown as a line of its own (with --tee, each with its rank prefix), so a
/// child that never writes a newline holds at most `max_line` bytes of the launcher's memory per stream.
class LineSplitter {
 public:
  static constexpr std::size_t default_max_line = std::size_t{16} << 20;
  explicit LineSplitter(std::size_t max_line = default_max_line) : max_line_(max_line) {}
  /// @brief Emits every complete line in `data` (without its '\n'); keeps the tail for later.
  template <class Emit>
  void feed(std::string_view data, Emit&& emit) {
    while (!data.empty()) {
      const auto nl = data.find('\n');
      if (nl == std::string_view::npos) {
        pending_.append(data);
        while (pending_.size() >= max_line_) {
          emit(std::string_view(pending_).substr(0, max_line_));
          pending_.erase(0, max_line_);
        }
        return;
      }
      if (pending_.empty()) emit(data.substr(0, nl));
      else {
        pending_.append(data.substr(0, nl));
        emit(std::string_view(pending_));
        pending_.clear();
      }
      data.remove_prefix(nl + 1);
    }
  }
  /// @brief Emits the unterminated last line, if any (the stream ended).
  template <class Emit>
  void finish(Emit&& emit) {
    if (!pending_.empty()) emit(std::string_view(pending_));
    pending_.clear();
  }

 private:
  std::string pending_;
  std::size_t max_line_;
};

/// @brief `mkdir -p`.
/// @throws launch_error naming the directory and the reason
inline void make_directories(const std::string& dir) {
  std::string partial;
  std::size_t pos = 0;
  while (pos <= dir.size()) {
    const auto slash = dir.find('/', pos);
    partial = dir.substr(0, slash);
    pos = slash == std::string::npos ? dir.size() + 1 : slash + 1;
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST)
      accel::detail::throw_error<launch_error>("cannot create the log directory '", dir, "' (", accel::detail::proc::errno_text(errno),
                                               " at '", partial, "'); choose another --log_dir");
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    accel::detail::throw_error<launch_error>("--log_dir '", dir, "' exists and is not a directory; choose another --log_dir");
}

/// @brief One output stream of one child, read through a pipe.
struct Stream {
  accel::detail::proc::UniqueFd pipe;  ///< read end; reset at end of stream
  accel::detail::proc::UniqueFd log;   ///< log file, or empty
  int rank = 0;
  int console = 1;               ///< launcher descriptor the lines go to (1 or 2)
  LineSplitter lines;
};

/// @brief One started rank.
struct Child {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  accel::detail::proc::UniqueFd pidfd;  ///< in the supervisor's exit watch; empty without pidfd support
  bool running = true;
  int status = 0;
  bool signalled = false;                  ///< the launcher sent it a signal (its end is then not its own)
  std::optional<SteadyTime> settle_until;  ///< left the store before another failed: stopped only at this time
  SteadyTime reaped{};                     ///< when its exit status was collected
};

/// @brief The supervision loop over started children (one thread, poll over a signalfd, the
/// children's exit watch and their output pipes). When the calling process is a child subreaper
/// (proc::ChildSubreaper), it also ends and reaps what the ranks left behind.
class Supervisor {
 public:
  /// @throws launch_error when the exit watch (an epoll set) cannot be created
  /// @param departures the ranks the job's store saw leave (LaunchHooks::store_departures), or empty
  Supervisor(accel::detail::proc::BlockedSignals& signals, double grace_s, bool tee,
             std::function<void(const std::string&)> say, std::function<std::vector<RankDeparture>()> departures = {})
      : signals_(signals), grace_(std::chrono::milliseconds(static_cast<long long>(grace_s * 1000.0))), tee_(tee),
        say_(std::move(say)), departures_(std::move(departures)), exits_(::epoll_create1(EPOLL_CLOEXEC)) {
    // Children this process had before the job are none of the job's business.
    for (const auto& p : accel::detail::proc::children_of(self_)) foreign_.push_back(p.pid);
    if (!exits_)
      accel::detail::throw_error<launch_error>("cannot create an epoll set to watch the processes (",
                                               accel::detail::proc::errno_text(errno), ")");
  }

  std::vector<Child> children;
  std::vector<Stream> streams;

  /// @brief The epoll set children's pidfds join when they start (SpawnRequest::exit_watch).
  [[nodiscard]] int exit_watch() const noexcept { return exits_.get(); }

  /// @brief SIGKILLs every started child's process group and reaps the children (start-up failed).
  void abort_start() noexcept {
    for (auto& c : children)
      if (c.running) {
        ::kill(-c.pid, SIGKILL);
        while (::waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR) {
        }
        c.running = false;
      }
  }

  /// @brief Runs until every child has ended, what the job left running has been ended and reaped,
  /// and the output is drained (or the drain deadline passed).
  void supervise() {
    using clock = std::chrono::steady_clock;
    std::optional<clock::time_point> drain_until;
    while (true) {
      const bool any_running = std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; });
      const bool any_open = std::any_of(streams.begin(), streams.end(), [](const Stream& s) { return bool(s.pipe); });
      if (!any_running && !drain_until) {
        // Descendants left in the children's groups would hold the pipes open and outlive the job.
        for (const auto& c : children) ::kill(-c.pid, SIGKILL);
        drain_until = clock::now() + std::chrono::seconds(2);
      }
      const bool any_adopted = !any_running && end_adopted();
      if (!any_running && !any_open && !any_adopted) break;
      const auto now = clock::now();
      if (drain_until && now >= *drain_until && !any_adopted) break;  // something that left the group still holds a pipe
      long long wait_ms = 250;  // also reaps when a SIGCHLD went to a thread that does not block it
      if (kill_at_ && !killed_)
        wait_ms = std::min<long long>(wait_ms, std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at_ - now).count() + 1);
      if (drain_until)
        wait_ms = std::min<long long>(wait_ms, std::chrono::duration_cast<std::chrono::milliseconds>(*drain_until - now).count() + 1);
      if (any_adopted) wait_ms = std::min<long long>(wait_ms, 20);  // an adopted process's own children show up unannounced
      for (const auto& c : children)
        if (c.running && c.settle_until)
          wait_ms = std::min<long long>(wait_ms, std::chrono::duration_cast<std::chrono::milliseconds>(*c.settle_until - now).count() + 1);
      std::vector<pollfd> fds;
      fds.push_back({signals_.fd(), POLLIN, 0});
      fds.push_back({exits_.get(), POLLIN, 0});  // reap() reads it
      std::vector<Stream*> polled;
      for (auto& s : streams)
        if (s.pipe) {
          fds.push_back({s.pipe.get(), POLLIN, 0});
          polled.push_back(&s);
        }
      const int ready = ::poll(fds.data(), static_cast<nfds_t>(fds.size()), static_cast<int>(std::max<long long>(wait_ms, 0)));
      if (ready < 0 && errno != EINTR)
        accel::detail::throw_error<launch_error>("poll failed while supervising (", accel::detail::proc::errno_text(errno), ")");
      if (ready > 0)
        for (std::size_t i = 0; i < polled.size(); ++i)
          if (fds[i + 2].revents != 0) read_stream(*polled[i]);
      reap();  // reads the signals too
      stop_settled();
      if (kill_at_ && !killed_ && clock::now() >= *kill_at_) {
        for (const auto& c : children)
          if (c.running)
            say_(accel::detail::concat("rank ", c.rank, " (pid ", c.pid, ") did not stop within ", grace_seconds(),
                                       " s; sending SIGKILL"));
        kill_running(SIGKILL);
        killed_ = true;
      }
    }
    for (auto& s : streams) close_stream(s);
    reap_adopted();
  }

  /// @brief Says how the job ended and returns the status the launcher should exit with: the
  /// first rank to fail on its own is blamed (blame_first_failure), the others that failed on
  /// their own after it are named as its consequences.
  int report() {
    namespace proc = accel::detail::proc;
    using accel::detail::concat;
    if (failed_) {
      const std::vector<RankDeparture> gone = departures_ ? departures_() : std::vector<RankDeparture>{};
      std::vector<const Child*> ended;
      for (const auto& c : children)
        if (!c.running) ended.push_back(&c);
      std::stable_sort(ended.begin(), ended.end(), [](const Child* a, const Child* b) { return a->reaped < b->reaped; });
      std::vector<RankEnd> ends;
      for (const Child* c : ended) {
        const auto left = departure_of(gone, c->rank);
        ends.push_back({c->rank, !proc::succeeded(c->status), !c->signalled, c->reaped,
                        left ? std::optional<SteadyTime>(left->when) : std::nullopt});
      }
      const Blame blame = blame_first_failure(ends);
      const Child& f = blame.culprit ? *ended[*blame.culprit] : children[*failed_];
      const int code = proc::exit_code_of(f.status);
      say_(concat("job failed: rank ", f.rank, " ", proc::describe_wait_status(f.status), "; exit status ", code));
      for (std::size_t i : blame.consequences) {
        const Child& c = *ended[i];
        say_(concat("rank ", c.rank, " ", proc::describe_wait_status(c.status), " after rank ", f.rank, " ",
                    departure_of(gone, f.rank) ? "left the job: a" : "ended: most likely a", " consequence of rank ", f.rank, "'s failure"));
      }
      return code;
    }
    if (interrupt_) {
      say_(accel::detail::concat("job interrupted by ", accel::detail::proc::signal_name(*interrupt_), "; exit status ", 128 + *interrupt_));
      return 128 + *interrupt_;
    }
    return 0;
  }

 private:
  double grace_seconds() const noexcept { return static_cast<double>(grace_.count()) / 1000.0; }
  // Signals every running child's process group; `spare_settling` leaves out the ones given time
  // to end on their own (Child::settle_until).
  void kill_running(int sig, bool spare_settling = false) noexcept {
    for (auto& c : children)
      if (c.running && !(spare_settling && c.settle_until)) {
        ::kill(-c.pid, sig);
        c.signalled = true;
        c.settle_until.reset();
      }
  }
  // Stops the children whose time to end on their own is over.
  void stop_settled() noexcept {
    const auto now = std::chrono::steady_clock::now();
    for (auto& c : children)
      if (c.running && c.settle_until && now >= *c.settle_until) {
        ::kill(-c.pid, SIGTERM);
        c.signalled = true;
        c.settle_until.reset();
      }
  }
  int count_running() const noexcept {
    return static_cast<int>(std::count_if(children.begin(), children.end(), [](const Child& c) { return c.running; }));
  }
  std::string stop_plan() const {
    return accel::detail::concat("SIGKILL after ", grace_seconds(), " s");
  }
  void begin_stop() {
    stopping_ = true;
    kill_at_ = std::chrono::steady_clock::now() + grace_;
  }

  void on_signal(int sig) {
    const int n = count_running();
    if (stopping_) {
      say_(accel::detail::concat("received ", accel::detail::proc::signal_name(sig), " while stopping: killing ", n,
                                 n == 1 ? " process" : " processes", " now"));
      kill_running(SIGKILL);
      killed_ = true;
      if (!interrupt_) interrupt_ = sig;
      return;
    }
    interrupt_ = sig;
    say_(accel::detail::concat("received ", accel::detail::proc::signal_name(sig), ": forwarding it to ", n,
                               n == 1 ? " process" : " processes", " (", stop_plan(), "; send it again to kill them now)"));
    kill_running(sig);
    begin_stop();
  }

  // Reads the pending signals and reaps the children that ended, in the order they died, so the
  // first failure is the one blamed.
  //
  // Rank order is wrong: waitpid(WNOHANG) rank by rank, or waitpid(-1), finds zombies in rank (or
  // fork) order, and when rank 1 failed and rank 0 failed a few ms later because of it, both are
  // often zombies by the time we look (about 1 run in 30 blamed rank 0). Threads blocked in waitid
  // would record the order they were scheduled in, not the order of death. Two kernel facts give
  // the order instead:
  //  1. SIGCHLD is exact for the first death since we last read it: the kernel sends it when the
  //     child turns into a zombie, under the lock that serialises exits, and a standard signal
  //     does not queue, so while one is pending later ones are dropped and the pending one (its
  //     ssi_pid) names the earliest. We read it before reaping anything else, so the rank that
  //     starts a cascade is always reaped, and blamed, first. (An adopted process's death counts
  //     here too; ranks that die in its shadow are ordered by point 2.)
  //  2. Children that died after that one, before we looked (their SIGCHLD was dropped), come in
  //     the order their pidfds woke: every rank's pidfd sits in one epoll set from before its
  //     program starts, epoll hands out entries in wake-up order, and EPOLLONESHOT keeps a reported
  //     entry from being queued again. The wake-up happens just after the death, outside that lock,
  //     so two deaths microseconds apart can come reversed (measured: about 1 in 1000 back-to-back
  //     pairs); that matters only when a rank exited with 0 just before two others failed.
  // Children without a pidfd (a kernel older than 5.3) fall back to rank order after point 1.
  void reap() {
    read_signals();
    epoll_event ended{};
    while (::epoll_wait(exits_.get(), &ended, 1, 0) == 1) {
      read_signals();  // one that died since the last read is named there first
      if (Child* c = running_child(static_cast<pid_t>(ended.data.u64)); c && c->pidfd && !collect(*c)) rearm(*c);
    }
    for (auto& c : children)
      if (c.running && !c.pidfd) collect(c);
  }

  // Acts on every pending signal; a SIGCHLD reaps the child it names first (see reap()), or the
  // adopted processes that ended when it names none of the ranks.
  void read_signals() {
    pid_t sender = 0;
    while (const int sig = signals_.next(&sender)) {
      if (sig != SIGCHLD) on_signal(sig);
      else if (Child* c = running_child(sender)) collect(*c);
      else reap_adopted();
    }
  }

  Child* running_child(pid_t pid) noexcept {
    for (auto& c : children)
      if (c.running && c.pid == pid) return &c;
    return nullptr;
  }

  /// @name Adopted processes
  /// As a child subreaper the launcher inherits every descendant of a rank whose parent died: a
  /// daemon that left the rank's process group and session with setsid, a rank's child that
  /// outlived it. They are told apart from ranks by pid (a rank that ended is reaped by pid, and
  /// stays in `children` until then), their exit status counts for nothing, and the children this
  /// process had before the job are never touched.
  ///@{

  // Our children that are neither a rank still to be reaped nor a child from before the job.
  std::vector<accel::detail::proc::ProcessEntry> adopted_now() {
    auto all = accel::detail::proc::children_of(self_);
    std::erase_if(all, [&](const accel::detail::proc::ProcessEntry& p) {
      return running_child(p.pid) != nullptr || std::find(foreign_.begin(), foreign_.end(), p.pid) != foreign_.end();
    });
    return all;
  }

  // Reaps the adopted processes that ended.
  void reap_adopted() {
    for (const auto& p : adopted_now())
      if (p.state == 'Z') ::waitpid(p.pid, nullptr, WNOHANG);
  }

  // Once every rank has ended: sends SIGTERM to what the job left running, SIGKILL after the grace
  // period, and reaps it. Processes of a rank's group are not announced: they got SIGKILL with the
  // group. Returns whether some are still there.
  bool end_adopted() {
    using clock = std::chrono::steady_clock;
    namespace proc = accel::detail::proc;
    reap_adopted();
    std::vector<proc::ProcessEntry> live = adopted_now(), fresh;
    std::erase_if(live, [](const proc::ProcessEntry& p) { return p.state == 'Z'; });
    const auto now = clock::now();
    for (const auto& p : live) {
      const bool in_rank_group = std::any_of(children.begin(), children.end(), [&](const Child& c) { return c.pid == p.pgid; });
      const bool known = std::any_of(adopted_.begin(), adopted_.end(), [&](const proc::ProcessEntry& a) { return a.pid == p.pid; });
      if (in_rank_group) ::kill(p.pid, SIGKILL);
      else if (!known) fresh.push_back(p);
    }
    if (!fresh.empty()) {
      if (!adopted_kill_at_) adopted_kill_at_ = now + grace_;
      std::string list;
      for (const auto& p : fresh) list += accel::detail::concat(list.empty() ? "" : ", ", "pid ", p.pid, " ", p.name);
      const bool one = fresh.size() == 1;
      say_(accel::detail::concat("the job left ", fresh.size(), one ? " process" : " processes", " running (", list, "): ending ",
                                 one ? "it" : "them", adopted_killed_ ? " (SIGKILL)" : accel::detail::concat(" (SIGTERM, ", stop_plan(), ")")));
      for (const auto& p : fresh) ::kill(p.pid, adopted_killed_ ? SIGKILL : SIGTERM);
    }
    adopted_ = live;
    if (adopted_.empty()) return false;
    if (adopted_kill_at_ && !adopted_killed_ && now >= *adopted_kill_at_) {
      for (const auto& p : adopted_) {
        say_(accel::detail::concat("process ", p.pid, " (", p.name, ") did not stop within ", grace_seconds(), " s; sending SIGKILL"));
        ::kill(p.pid, SIGKILL);
      }
      adopted_killed_ = true;
    }
    // SIGKILL ends a process unless it is stuck in the kernel (state D); do not wait for one forever.
    if (adopted_killed_ && now >= *adopted_kill_at_ + std::chrono::seconds(5)) {
      for (const auto& p : adopted_) say_(accel::detail::concat("process ", p.pid, " (", p.name, ") is still there 5 s after SIGKILL; leaving it"));
      adopted_.clear();
      return false;
    }
    return true;
  }
  ///@}

  // Watches `c` again: its pidfd woke up but waitpid found nothing to reap yet.
  void rearm(const Child& c) noexcept {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u64 = static_cast<std::uint64_t>(c.pid);
    ::epoll_ctl(exits_.get(), EPOLL_CTL_MOD, c.pidfd.get(), &ev);
  }

  // Reaps `c` if it ended: records its status, says how it ended, and when it is the job's first
  // failure stops the others. Returns whether it had ended.
  bool collect(Child& c) {
    using accel::detail::concat;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) != c.pid) return false;
    c.running = false;
    c.status = status;
    c.pidfd.reset();
    c.reaped = std::chrono::steady_clock::now();
    c.settle_until.reset();
    const std::string how = accel::detail::proc::describe_wait_status(status);
    if (stopping_) {
      if (accel::detail::proc::succeeded(status)) return true;
      if (c.signalled) say_(concat("rank ", c.rank, " (pid ", c.pid, ") stopped: ", how));
      else say_(concat("rank ", c.rank, " (local rank ", c.local_rank, ", pid ", c.pid, ") ", how));  // its own end
      return true;
    }
    if (accel::detail::proc::succeeded(status)) return true;
    failed_ = static_cast<std::size_t>(&c - children.data());
    // The ranks the store saw leave before this one failed may be the cause, still on their way
    // out: they get a moment to end on their own, so that their own exit status is known.
    std::vector<int> settling;
    if (departures_) {
      const std::vector<RankDeparture> gone = departures_();
      const auto settle = std::min<std::chrono::milliseconds>(departed_settle, grace_);
      for (auto& other : children)
        if (other.running && departure_of(gone, other.rank)) {
          other.settle_until = c.reaped + settle;
          settling.push_back(other.rank);
        }
    }
    const int others = count_running() - static_cast<int>(settling.size());
    std::string plan;
    if (others > 0) plan += concat("; stopping the other ", others, others == 1 ? " process" : " processes", " (SIGTERM, ", stop_plan(), ")");
    if (!settling.empty()) {
      const bool one = settling.size() == 1;
      plan += concat("; ", one ? "rank " : "ranks ", accel::text::join(settling), one ? " has" : " have",
                     " already left the job's store and may have failed first: waiting up to ",
                     static_cast<double>(std::min<std::chrono::milliseconds>(departed_settle, grace_).count()) / 1000.0, " s for ",
                     one ? "it" : "them", " to end before SIGTERM");
    }
    say_(concat("rank ", c.rank, " (local rank ", c.local_rank, ", pid ", c.pid, ") ", how, plan));
    kill_running(SIGTERM, true);
    begin_stop();
    return true;
  }

  // Whole lines, prefixed, are appended to `batch_` and written with one write_all() per read: the
  // supervisor is the only writer of the console, so lines of different ranks never interleave, and
  // one call per 64 KiB read stays cheap.
  void add_line(const Stream& s, std::string_view line) {
    if (tee_) batch_.append("[rank ").append(std::to_string(s.rank)).append("] ");
    batch_.append(line).push_back('\n');
  }
  void flush_batch(const Stream& s) {
    bool& dead = console_dead_[s.console == 2 ? 1 : 0];
    if (!dead && !batch_.empty() && !accel::detail::proc::write_all(s.console, batch_)) dead = true;  // closed console: keep draining
    batch_.clear();
  }

  void read_stream(Stream& s) {
    char buf[64 * 1024];
    const ssize_t n = ::read(s.pipe.get(), buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_stream(s);
      return;
    }
    const std::string_view data(buf, static_cast<std::size_t>(n));
    if (s.log && !accel::detail::proc::write_all(s.log.get(), data)) {
      say_(accel::detail::concat("cannot write the log of rank ", s.rank, " (", accel::detail::proc::errno_text(errno),
                                 "); its output still goes to the console"));
      s.log.reset();
    }
    s.lines.feed(data, [&](std::string_view line) { add_line(s, line); });
    flush_batch(s);
  }

  void close_stream(Stream& s) {
    if (!s.pipe) return;
    s.lines.finish([&](std::string_view line) { add_line(s, line); });
    flush_batch(s);
    s.pipe.reset();
    s.log.reset();
  }

  accel::detail::proc::BlockedSignals& signals_;
  std::chrono::milliseconds grace_;
  bool tee_;
  std::function<void(const std::string&)> say_;
  std::function<std::vector<RankDeparture>()> departures_;
  bool stopping_ = false;
  bool killed_ = false;
  bool console_dead_[2] = {false, false};
  std::string batch_;
  std::optional<std::chrono::steady_clock::time_point> kill_at_;
  std::optional<std::size_t> failed_;
  std::optional<int> interrupt_;
  accel::detail::proc::UniqueFd exits_;  // epoll set of the children's pidfds: the exit watch
  pid_t self_ = ::getpid();
  std::vector<pid_t> foreign_;                           // our children from before the job
  std::vector<accel::detail::proc::ProcessEntry> adopted_;  // left running by the job, being ended
  std::optional<std::chrono::steady_clock::time_point> adopted_kill_at_;
  bool adopted_killed_ = false;
};

}  // namespace detail

}  // namespace launch
ACCEL_NAMESPACE_END
