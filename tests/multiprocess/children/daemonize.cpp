// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for launch tests: every rank starts a daemon the way daemons start (fork, setsid, fork
// again, the middle process exits), so it leaves the rank's process group and session.
// Usage: daemonize DIR EXIT_CODE [--short | --stubborn]
// The daemon writes DIR/daemon_RANK (its pid) and runs `sleep 300`; with --short it exits with 9
// after 100 ms instead; with --stubborn it ignores SIGTERM. The rank waits for the daemon's pid
// file and (but with --short) for the daemon to be `sleep`, waits another 300 ms, then exits with
// EXIT_CODE.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) return 64;
  const std::string dir = argv[1];
  const int code = std::atoi(argv[2]);
  const bool short_lived = argc > 3 && std::strcmp(argv[3], "--short") == 0;
  const bool stubborn = argc > 3 && std::strcmp(argv[3], "--stubborn") == 0;
  const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
  const std::string file = dir + "/daemon_" + rank;
  const pid_t middle = ::fork();
  if (middle < 0) return 90;
  if (middle == 0) {
    ::setsid();
    const pid_t daemon = ::fork();
    if (daemon != 0) std::_Exit(daemon < 0 ? 91 : 0);
    // Close the launcher's pipes, as a daemon does, so only the process itself can keep it around.
    for (int fd = 0; fd < 3; ++fd) ::close(fd);
    if (stubborn) ::signal(SIGTERM, SIG_IGN);  // an ignored signal stays ignored across execve
    {
      const std::string tmp = file + ".tmp";
      std::ofstream(tmp) << ::getpid();
      std::rename(tmp.c_str(), file.c_str());
    }
    if (short_lived) {
      ::usleep(100000);
      std::_Exit(9);
    }
    ::execlp("sleep", "sleep", "300", static_cast<char*>(nullptr));
    std::_Exit(92);
  }
  int status = 0;
  ::waitpid(middle, &status, 0);
  for (int waited = 0; waited < 200 && ::access(file.c_str(), F_OK) != 0; ++waited) ::usleep(20000);
  if (!short_lived) {
    // A loaded machine may take a while to exec: the launcher must find the daemon named `sleep`.
    pid_t daemon = 0;
    std::ifstream(file) >> daemon;
    const std::string comm = "/proc/" + std::to_string(daemon) + "/comm";
    std::string name;
    for (int waited = 0; waited < 500 && name != "sleep"; ++waited) {
      name.clear();
      std::ifstream(comm) >> name;
      if (name != "sleep") ::usleep(20000);
    }
  }
  ::usleep(300000);
  return code;
}
