// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for launch tests: a failure cascade. Usage: cascade DIR DELAY_US
// Every rank writes DIR/pid_RANK and waits until every rank has. Rank 1 then exits with 3; rank 0
// waits until rank 1 has died (it watches /proc), sleeps DELAY_US microseconds and exits with 5, as
// a rank does when it notices that a peer is gone. Other ranks sleep (up to 30 s).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

static std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Dead means no /proc entry, or a zombie: the state letter after the command's closing ')'.
static bool dead(const std::string& pid) {
  const std::string stat = read_all("/proc/" + pid + "/stat");
  if (stat.empty()) return true;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

int main(int argc, char** argv) {
  if (argc != 3) return 64;
  const std::string dir = argv[1];
  const long delay_us = std::atol(argv[2]);
  const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
  const int world = std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1;
  {
    const std::string tmp = dir + "/.pid_" + rank;
    std::ofstream(tmp) << ::getpid();
    std::rename(tmp.c_str(), (dir + "/pid_" + rank).c_str());
  }
  for (int waited = 0; waited < 2000; ++waited) {
    int present = 0;
    for (int r = 0; r < world; ++r) present += ::access((dir + "/pid_" + std::to_string(r)).c_str(), F_OK) == 0;
    if (present == world) break;
    ::usleep(5000);
  }
  if (rank == "1") return 3;
  if (rank == "0") {
    const std::string peer = read_all(dir + "/pid_1");
    for (int polls = 0; polls < 300000 && !dead(peer); ++polls) ::usleep(100);
    if (delay_us > 0) ::usleep(static_cast<useconds_t>(delay_us));
    return 5;
  }
  for (int i = 0; i < 300; ++i) ::usleep(100000);
  return 0;
}
