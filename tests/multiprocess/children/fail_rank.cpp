// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for launch tests. Usage: fail_rank DIR [--fail RANK exit:N|signal:N] [--ignore-term]
//   [--record-signals] [--grandchild]
// Every rank writes DIR/pid_RANK; with --grandchild it also forks a child that writes DIR/gpid_RANK
// and sleeps. The failing rank waits until every rank has written its pid, then exits with N or
// kills itself with signal N. The others sleep (up to 30 s). --record-signals writes the name of
// a received SIGINT/SIGTERM/SIGHUP/SIGQUIT to DIR/sig_RANK and exits 0.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

static std::string g_dir, g_rank;

static void write_file(const std::string& name, const std::string& text) {
  const std::string tmp = g_dir + "/." + name + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) std::_Exit(90);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), (g_dir + "/" + name).c_str());
}

static char g_sig_path[4096];  // filled before the handlers are installed

static void on_signal(int sig) {  // async-signal-safe calls only
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGQUIT";
  const int fd = ::open(g_sig_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!::write(fd, name, std::strlen(name));
    ::close(fd);
  }
  ::_exit(0);
}

static void sleep_seconds(int s) {
  for (int i = 0; i < s * 10; ++i) ::usleep(100000);
}

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  g_dir = argv[1];
  g_rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
  const int world = std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1;
  int fail_rank = -1;
  std::string how;
  bool ignore_term = false, record = false, grandchild = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fail") == 0 && i + 2 < argc) {
      fail_rank = std::atoi(argv[++i]);
      how = argv[++i];
    } else if (std::strcmp(argv[i], "--ignore-term") == 0) ignore_term = true;
    else if (std::strcmp(argv[i], "--record-signals") == 0) record = true;
    else if (std::strcmp(argv[i], "--grandchild") == 0) grandchild = true;
    else return 64;
  }
  if (grandchild) {
    const pid_t g = ::fork();
    if (g == 0) {
      write_file("gpid_" + g_rank, std::to_string(::getpid()));
      sleep_seconds(30);
      std::_Exit(0);
    }
    // Announce ourselves only once the grandchild exists, so the test can always find it.
    for (int waited = 0; waited < 100 && ::access((g_dir + "/gpid_" + g_rank).c_str(), F_OK) != 0; ++waited) ::usleep(50000);
  }
  if (ignore_term) ::signal(SIGTERM, SIG_IGN);
  std::snprintf(g_sig_path, sizeof g_sig_path, "%s/sig_%s", g_dir.c_str(), g_rank.c_str());
  if (record)
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::signal(s, on_signal);
  write_file("pid_" + g_rank, std::to_string(::getpid()));
  if (std::atoi(g_rank.c_str()) == fail_rank) {
    for (int waited = 0; waited < 100; ++waited) {
      int present = 0;
      for (int r = 0; r < world; ++r) present += ::access((g_dir + "/pid_" + std::to_string(r)).c_str(), F_OK) == 0;
      if (present == world) break;
      ::usleep(100000);
    }
    std::fprintf(stderr, "rank %s fails now (%s)\n", g_rank.c_str(), how.c_str());
    if (how.rfind("exit:", 0) == 0) return std::atoi(how.c_str() + 5);
    const int sig = std::atoi(how.c_str() + 7);
    ::signal(sig, SIG_DFL);
    ::kill(::getpid(), sig);
    return 99;
  }
  sleep_seconds(30);
  return 0;
}
