// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child program of tests/comm/liveness_mp_test.cpp and benchmarks/failure_detection.sh: one rank of
// a job in which rank VICTIM leaves before its first collective while the others wait in one.
//   early_exit VICTIM HOW [MS [JOIN_S]]
// (JOIN_S: ACCEL_JOIN_TIMEOUT_S for this job, set here when a launcher does not pass it through.)
// Every rank creates its DistributedState (which joins the job). The victim then waits MS
// milliseconds (default 300: the others are inside gather_object by then) and
//   exit0   returns 0 from main (destructors run, so it says goodbye to the store)
//   exit3   returns 3 from main
//   _exit3  std::_Exit(3): no destructors, no goodbye
//   kill    raises SIGKILL
//   never   (no wait) exits 0 before creating its DistributedState: it never joins
//   last    takes part in every collective, then leaves at once (the others must all succeed)
//   shm-kill  every rank first gathers 512 KiB (more than a shared-memory slot holds, so each has
//           payload segments besides its slots) and
//           prints "pid <pid>"; once every rank has printed (a barrier), the victim raises SIGKILL
//           and the others gather again
//   leave7+L  destroys its DistributedState (goodbye), lingers L ms, then returns 7: a rank whose
//           failure reaches the others before its exit status is ready to reap
//   drop7+L   closes its sockets (the store connection, no goodbye), lingers L ms, then _Exits 7:
//           a crash whose connection closes before the process has ended
//   fork-kill forks a child that keeps running (no exec; it prints "child <pid>" and sleeps
//           30 s), then raises SIGKILL: the child must not keep the victim's membership alive
// The victim prints "left <unix ns>" on stdout just before it goes. The others gather (20 rounds
// with "last"); on failure they print "failed <unix ns>" on stdout and "rank R: <error>" on stderr
// and exit 2; on success rank 0 prints "ok".
#include <accel/comm/collectives.hpp>

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {
long long unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
void say_left() {
  std::printf("left %lld\n", unix_ns());
  std::fflush(stdout);
}
// Closes every socket this process holds, as the kernel does early in a process's exit.
void close_sockets() {
  std::vector<int> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) {
      struct stat st {};
      const int fd = std::atoi(e->d_name);
      if (e->d_name[0] != '.' && fd > 2 && ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) fds.push_back(fd);
    }
    ::closedir(d);
  }
  for (int fd : fds) ::close(fd);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: early_exit VICTIM exit0|exit3|_exit3|kill|never|last|shm-kill|leave7+L|drop7+L|fork-kill [MS [JOIN_S]]\n");
    return 64;
  }
  const int victim = std::atoi(argv[1]);
  const std::string how = argv[2];
  const int pause_ms = argc > 3 ? std::atoi(argv[3]) : 300;
  if (argc > 4) ::setenv("ACCEL_JOIN_TIMEOUT_S", argv[4], 1);
  if (how == "never" && accel::read_launch_env(accel::process_env()).rank == victim) {
    say_left();
    return 0;
  }
  const std::string base = how.substr(0, how.find('+'));
  const int linger_ms = how.find('+') == std::string::npos ? 0 : std::atoi(how.c_str() + how.find('+') + 1);
  int rank = -1;
  try {
    auto owned = std::make_unique<accel::DistributedState>();
    accel::DistributedState& state = *owned;
    rank = state.process_index();
    if (how == "shm-kill") {
      accel::gather_object(state, std::vector<std::uint8_t>(512 * 1024, static_cast<std::uint8_t>(rank)));
      std::printf("pid %d\n", static_cast<int>(::getpid()));
      std::fflush(stdout);
      accel::wait_for_everyone(state);  // no rank is stopped by the launcher before it printed
      if (rank == victim) {
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
        say_left();
        ::raise(SIGKILL);
      }
    }
    if (rank == victim && how != "last" && how != "shm-kill") {
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      say_left();
      if (how == "exit0") return 0;
      if (how == "exit3") return 3;
      if (how == "_exit3") std::_Exit(3);
      if (how == "kill") ::raise(SIGKILL);
      if (base == "leave7") {
        owned.reset();
        std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));
        return 7;
      }
      if (base == "drop7") {
        close_sockets();
        std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));
        std::_Exit(7);
      }
      if (how == "fork-kill") {
        const pid_t child = ::fork();
        if (child == 0) {
          std::this_thread::sleep_for(std::chrono::seconds(30));
          std::_Exit(0);
        }
        std::printf("child %d\n", static_cast<int>(child));
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      std::fprintf(stderr, "unknown mode %s\n", how.c_str());
      return 64;
    }
    const int rounds = how == "last" ? 20 : 1;
    for (int i = 0; i < rounds; ++i) {
      const auto all = accel::gather_object(state, std::string(static_cast<std::size_t>(i + rank), 'x'));
      if (all.size() != static_cast<std::size_t>(state.num_processes())) return 4;
    }
    if (how == "last" && rank == victim) {
      say_left();
      return 0;
    }
    if (how == "last") std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));  // the victim is gone by now
    accel::print(state, "ok");
    return 0;
  } catch (const accel::error& e) {
    std::printf("failed %lld\n", unix_ns());
    std::fflush(stdout);
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}
