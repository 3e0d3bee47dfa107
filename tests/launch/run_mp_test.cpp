// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Real processes through the real `accel launch`: environment per rank, output merging, failure
// propagation, signal forwarding, and no orphans.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/spawn.hpp"

extern "C" char** environ;

using accel_test::contains;

namespace {

const std::string cli = ACCEL_TEST_CLI;
const std::string children = ACCEL_TEST_CHILD_DIR;

using accel_test::read_file;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string l; std::getline(s, l);) out.push_back(l);
  return out;
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

struct TempDir : accel_test::ScratchDir {
  TempDir() : ScratchDir("launch_mp") {}
};

/// `accel launch ...` started in the background with stdout/stderr captured in files.
struct Launcher {
  pid_t pid = -1;
  std::string out_file, err_file;
  std::optional<int> status;

  Launcher(const TempDir& dir, const std::vector<std::string>& args, const std::map<std::string, std::optional<std::string>>& env = {},
           const std::string& stdin_file = "/dev/null") {
    out_file = dir / "launcher.out";
    err_file = dir / "launcher.err";
    std::vector<std::string> argv = {cli, "launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      if (!env.count(entry.substr(0, entry.find('=')))) envs.push_back(entry);
    }
    for (const auto& [k, v] : env)
      if (v) envs.push_back(k + "=" + *v);
    pid = accel_test::spawn_redirected(argv, std::move(envs), stdin_file, out_file, err_file);
    REQUIRE(pid > 0);
  }
  Launcher(const Launcher&) = delete;
  ~Launcher() {
    if (!status) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  /// Waits for the launcher (a hung launcher fails the test instead of hanging it).
  int wait(int limit_s = 20) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
    while (!status) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        status = st;
        break;
      }
      if (std::chrono::steady_clock::now() > until) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        status = st;
        FAIL("accel launch did not finish within " << limit_s << " s; stderr:\n" << read_file(err_file));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
  }
  std::string out() const { return read_file(out_file); }
  std::string err() const { return read_file(err_file); }
};

/// Waits until `path` exists (a child wrote it); fails the test after a while.
std::string await_file(const std::string& path, int limit_s = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  while (!exists(path)) {
    if (std::chrono::steady_clock::now() > until) FAIL("no " << path << " after " << limit_s << " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return read_file(path);
}

/// A pid is gone when /proc has no entry for it or it is a zombie nobody reaped yet.
bool process_gone(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

bool await_gone(pid_t pid, int limit_s = 5) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  while (!process_gone(pid)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::vector<std::string> environment() {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) out.emplace_back(*e);
  return out;
}

std::map<std::string, std::string> env_lines(const std::string& text) {
  std::map<std::string, std::string> m;
  for (const auto& l : lines_of(text)) {
    const auto eq = l.find('=');
    if (eq != std::string::npos) m[l.substr(0, eq)] = l.substr(eq + 1);
    else if (l.ends_with(" unset")) m[l.substr(0, l.size() - 6)] = "<unset>";
  }
  return m;
}

std::vector<pid_t> read_pids(const TempDir& dir, const std::string& prefix, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) pids.push_back(static_cast<pid_t>(std::stol(await_file(dir / (prefix + std::to_string(r))))));
  return pids;
}

}  // namespace

TEST_CASE("every rank gets its own rank environment and the program's arguments", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "3", "--log_dir", dir / "logs", "--timeout", "7", "--", children + "/print_env", "a",
                   "b c"},
             {{"SLURM_PROCID", "5"}, {"ACCEL_TEST_MARKER", "inherited"}, {"RANK", "9"}});
  REQUIRE(l.wait() == 0);
  CHECK_THAT(l.err(), !contains("accel launch"));  // --cpu: nothing to warn about, and a clean run says nothing
  std::string port, token;
  for (int r = 0; r < 3; ++r) {
    const auto e = env_lines(read_file(dir / ("logs/rank_" + std::to_string(r) + ".stdout.log")));
    CHECK(e.at("RANK") == std::to_string(r));
    CHECK(e.at("LOCAL_RANK") == std::to_string(r));
    CHECK(e.at("WORLD_SIZE") == "3");
    CHECK(e.at("LOCAL_WORLD_SIZE") == "3");
    CHECK(e.at("GROUP_RANK") == "0");
    CHECK(e.at("GROUP_WORLD_SIZE") == "1");
    CHECK(e.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(e.at("ACCEL_LAUNCHED") == "1");
    CHECK(e.at("ACCEL_TIMEOUT_S") == "7");
    CHECK(e.at("ACCEL_USE_CPU") == "1");
    CHECK(e.at("SLURM_PROCID") == "<unset>");           // another launcher's rank would contradict ours
    CHECK(e.at("ACCEL_TEST_MARKER") == "inherited");    // the rest of the environment passes through
    CHECK(e.at("arg1") == "a");
    CHECK(e.at("arg2") == "b c");
    const int p = std::stoi(e.at("MASTER_PORT"));
    CHECK(p > 0);
    CHECK(p <= 65535);
    CHECK(std::regex_match(e.at("ACCEL_JOB_TOKEN"), std::regex("[0-9a-f]{32}")));
    if (r == 0) {
      port = e.at("MASTER_PORT");
      token = e.at("ACCEL_JOB_TOKEN");
    }
    CHECK(e.at("MASTER_PORT") == port);
    CHECK(e.at("ACCEL_JOB_TOKEN") == token);
    CHECK(read_file(dir / ("logs/rank_" + std::to_string(r) + ".stderr.log")) == "stderr of rank " + std::to_string(r) + "\n");
  }
  // --log_dir also shows the output on the console (unprefixed without --tee).
  CHECK_THAT(l.out(), contains("\nRANK=2\n"));
  CHECK_THAT(l.err(), contains("stderr of rank 2\n"));
  CHECK_THAT(l.err(), !contains("[rank"));
}

TEST_CASE("the launcher hosts the job's store and every rank reaches it through ACCEL_STORE", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "3", "--tee", children + "/store_ping"});
  REQUIRE(l.wait() == 0);
  const std::string out = l.out();
  for (int r = 0; r < 3; ++r)
    CHECK_THAT(out, contains("[rank " + std::to_string(r) + "] rank " + std::to_string(r) + " store=127.0.0.1:"));
  CHECK_THAT(out, contains("[rank 0] rank 0 store=127.0.0.1:"));
  CHECK_THAT(out, contains("got 'hello from 1'"));
  CHECK_THAT(out, contains("got 'hello from 2'"));
  CHECK_THAT(out, contains("got 'hello from 0'"));
}

TEST_CASE("a job needing more open files than the soft limit raises it; its ranks start with the old one", "[launch][mp][nofile]") {
  TempDir dir;
  // 60 ranks with --tee: a pidfd, two pipes and two store connections each, far above 128.
  std::vector<std::string> args = {"--cpu", "--num_processes", "60", "--tee", children + "/store_ping"};
  args.insert(args.begin(), {"-c", "ulimit -Sn 128 && exec \"$0\" launch \"$@\"", cli});
  const std::string err_file = dir / "launcher.err";
  const pid_t pid = accel_test::spawn_redirected([&] {
    std::vector<std::string> argv = {"/bin/sh"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }(), environment(), "/dev/null", dir / "launcher.out", err_file);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO(read_file(err_file));
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK_THAT(read_file(err_file), contains("raised the open-file limit from 128 to"));
  const std::string out = read_file(dir / "launcher.out");
  for (int r = 0; r < 60; r += 59) CHECK_THAT(out, contains("[rank " + std::to_string(r) + "] rank " + std::to_string(r) + " store="));
  CHECK_THAT(out, contains("nofile 128\n"));
}

TEST_CASE("a job needing more open files than even the hard limit fails before any rank starts", "[launch][mp][nofile]") {
  TempDir dir;
  const std::string marker = dir / "started";
  const pid_t pid = accel_test::spawn_redirected(
      {"/bin/sh", "-c", "ulimit -n 128 && exec \"$0\" launch --cpu --num_processes 60 --tee /bin/sh -c \"touch $1\"", cli, marker},
      environment(), "/dev/null", dir / "launcher.out", dir / "launcher.err");
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  const std::string err = read_file(dir / "launcher.err");
  INFO(err);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 8));
  CHECK_THAT(err, contains("this job needs about"));
  CHECK_THAT(err, contains("(60 local processes) but its open-file limit is 128 (hard limit 128)"));
  CHECK_FALSE(exists(marker));
}

TEST_CASE("gpu_ids set CUDA_VISIBLE_DEVICES and the process count for every child", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--gpu_ids", "2,5", "--log_dir", dir / "logs", children + "/print_env"},
             {{"CUDA_VISIBLE_DEVICES", "9"}});  // hides any real GPU, so the ids are never checked against one
  REQUIRE(l.wait() == 0);
  CHECK_THAT(l.err(), contains("--gpu_ids 2,5 replaces CUDA_VISIBLE_DEVICES='9' for the children"));
  for (int r = 0; r < 2; ++r) {
    const auto e = env_lines(read_file(dir / ("logs/rank_" + std::to_string(r) + ".stdout.log")));
    CHECK(e.at("CUDA_VISIBLE_DEVICES") == "2,5");
    CHECK(e.at("WORLD_SIZE") == "2");
    CHECK(e.at("ACCEL_USE_CPU") == "<unset>");
  }
  CHECK_FALSE(exists(dir / "logs/rank_2.stdout.log"));
}

TEST_CASE("gpus_per_process reaches every child and counts K GPUs per process", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--gpu_ids", "2,5,3,7", "--gpus_per_process", "2", "--log_dir", dir / "logs", children + "/print_env"},
             {{"CUDA_VISIBLE_DEVICES", "9"}});  // hides any real GPU, so the ids are never checked against one
  REQUIRE(l.wait() == 0);
  for (int r = 0; r < 2; ++r) {
    const auto e = env_lines(read_file(dir / ("logs/rank_" + std::to_string(r) + ".stdout.log")));
    CHECK(e.at("ACCEL_GPUS_PER_PROCESS") == "2");
    CHECK(e.at("CUDA_VISIBLE_DEVICES") == "2,5,3,7");
    CHECK(e.at("WORLD_SIZE") == "2");
  }
  CHECK_FALSE(exists(dir / "logs/rank_2.stdout.log"));
  {
    Launcher bad(dir, {"--cpu", "--gpus_per_process", "2", children + "/print_env"});
    CHECK(bad.wait() == 2);
    CHECK_THAT(bad.err(), contains("[accel.usage] --cpu and --gpus_per_process 2 contradict each other"));
  }
  {
    Launcher bad(dir, {"--num_processes", "2", "--gpu_ids", "2,5,3", "--gpus_per_process", "2", children + "/print_env"},
                 {{"CUDA_VISIBLE_DEVICES", "9"}});
    CHECK(bad.wait() == 2);
    CHECK_THAT(bad.err(), contains("2 processes with 2 GPUs each need 4 GPUs but --gpu_ids 2,5,3 lists only 3 GPUs"));
  }
}

TEST_CASE("tee prefixes every line with its rank and never mixes partial lines", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "3", "--tee", children + "/chatter", "30"});
  REQUIRE(l.wait() == 0);
  const std::regex line(R"(\[rank ([0-2])\] rank ([0-2]) line ([0-9]+) a{40}b{40})");
  int per_rank[3] = {0, 0, 0};
  int tails = 0;
  for (const auto& s : lines_of(l.out())) {
    std::smatch m;
    if (std::regex_match(s, m, line)) {
      CHECK(m[1] == m[2]);
      ++per_rank[std::stoi(m[1])];
    } else if (std::regex_match(s, m, std::regex(R"(\[rank ([0-2])\] tail of rank ([0-2]))"))) {
      CHECK(m[1] == m[2]);
      ++tails;
    } else {
      FAIL("a mixed or unprefixed line: '" << s << "'");
    }
  }
  CHECK(per_rank[0] == 30);
  CHECK(per_rank[1] == 30);
  CHECK(per_rank[2] == 30);
  CHECK(tails == 3);
  for (int r = 0; r < 3; ++r) CHECK_THAT(l.err(), contains("[rank " + std::to_string(r) + "] to stderr from rank " + std::to_string(r) + "\n"));
}

TEST_CASE("a failing rank's exit code becomes the launcher's and the other ranks are stopped", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "3", children + "/fail_rank", dir.path, "--fail", "1", "exit:7"});
  const auto pids = read_pids(dir, "pid_", 3);
  REQUIRE(l.wait() == 7);
  const std::string err = l.err();
  CHECK_THAT(err, contains("rank 1 (local rank 1, pid " + std::to_string(pids[1]) + ") exited with code 7; stopping the other 2 processes (SIGTERM"));
  CHECK_THAT(err, contains("rank 0 (pid " + std::to_string(pids[0]) + ") stopped: was killed by signal 15 (SIGTERM)"));
  CHECK_THAT(err, contains("rank 2 (pid " + std::to_string(pids[2]) + ") stopped: was killed by signal 15 (SIGTERM)"));
  CHECK_THAT(err, contains("job failed: rank 1 exited with code 7; exit status 7"));
  for (pid_t p : pids) CHECK(process_gone(p));
}

TEST_CASE("a rank killed by a signal makes the launcher exit with 128 plus the signal", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "2", children + "/fail_rank", dir.path, "--fail", "0", "signal:6"});
  REQUIRE(l.wait() == 128 + SIGABRT);
  CHECK_THAT(l.err(), contains("rank 0 (local rank 0, pid "));
  CHECK_THAT(l.err(), contains("was killed by signal 6 (SIGABRT)"));
  CHECK_THAT(l.err(), contains("exit status 134"));
}

TEST_CASE("ranks that ignore SIGTERM are killed when the grace period ends", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "2", "--grace", "0.5", children + "/fail_rank", dir.path, "--fail", "1", "exit:3",
                   "--ignore-term"});
  const auto pids = read_pids(dir, "pid_", 2);
  REQUIRE(l.wait() == 3);
  CHECK_THAT(l.err(), contains("rank 0 (pid " + std::to_string(pids[0]) + ") did not stop within 0.5 s; sending SIGKILL"));
  CHECK_THAT(l.err(), contains("rank 0 (pid " + std::to_string(pids[0]) + ") stopped: was killed by signal 9 (SIGKILL)"));
  CHECK(process_gone(pids[0]));
}

TEST_CASE("SIGINT and SIGTERM sent to the launcher reach every rank", "[launch][mp]") {
  const int sig = GENERATE(SIGINT, SIGTERM);
  const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "3", children + "/fail_rank", dir.path, "--record-signals"});
  read_pids(dir, "pid_", 3);
  REQUIRE(::kill(l.pid, sig) == 0);
  REQUIRE(l.wait() == 128 + sig);
  for (int r = 0; r < 3; ++r) CHECK(await_file(dir / ("sig_" + std::to_string(r))) == name);
  CHECK_THAT(l.err(), contains("received " + name + ": forwarding it to 3 processes"));
  CHECK_THAT(l.err(), contains("job interrupted by " + name + "; exit status " + std::to_string(128 + sig)));
}

TEST_CASE("a second signal to the launcher kills the ranks at once", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "2", "--grace", "60", children + "/fail_rank", dir.path, "--ignore-term"});
  const auto pids = read_pids(dir, "pid_", 2);
  REQUIRE(::kill(l.pid, SIGTERM) == 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (l.err().find("forwarding it to 2 processes") == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE_THAT(l.err(), contains("received SIGTERM: forwarding it to 2 processes (SIGKILL after 60 s"));
  REQUIRE(::kill(l.pid, SIGTERM) == 0);
  REQUIRE(l.wait() == 128 + SIGTERM);  // well before the 60 s grace period
  CHECK_THAT(l.err(), contains("received SIGTERM while stopping: killing 2 processes now"));
  CHECK_THAT(l.err(), contains("stopped: was killed by signal 9 (SIGKILL)"));
  for (pid_t p : pids) CHECK(process_gone(p));
}

TEST_CASE("a rank's own child processes are stopped with it", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "2", children + "/fail_rank", dir.path, "--fail", "1", "exit:4", "--grandchild"});
  const auto grandchildren = read_pids(dir, "gpid_", 2);
  REQUIRE(l.wait() == 4);
  for (pid_t p : grandchildren) CHECK(await_gone(p));
}

TEST_CASE("no rank survives a launcher killed with SIGKILL", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "3", children + "/fail_rank", dir.path});
  const auto pids = read_pids(dir, "pid_", 3);
  for (pid_t p : pids) REQUIRE_FALSE(process_gone(p));
  REQUIRE(::kill(l.pid, SIGKILL) == 0);
  CHECK(l.wait() == 128 + SIGKILL);
  for (pid_t p : pids) CHECK(await_gone(p));
}

TEST_CASE("standard input reaches local rank 0 when it is a file", "[launch][mp]") {
  TempDir dir;
  { std::ofstream(dir / "input.txt") << "hello from stdin\n"; }
  Launcher l(dir, {"--cpu", "--num_processes", "2", "--log_dir", dir / "logs", children + "/print_env", "--echo-stdin"}, {},
             dir / "input.txt");
  REQUIRE(l.wait() == 0);
  CHECK_THAT(read_file(dir / "logs/rank_0.stdout.log"), contains("stdin: hello from stdin"));
  CHECK_THAT(read_file(dir / "logs/rank_1.stdout.log"), !contains("stdin:"));
}

TEST_CASE("a program that cannot be found or executed is a launch error with exit code 8", "[launch][mp]") {
  TempDir dir;
  {
    Launcher l(dir, {"--cpu", "no-such-program-accel"});
    CHECK(l.wait() == 8);
    CHECK_THAT(l.err(), contains("[accel.launch] cannot find the program 'no-such-program-accel' on PATH"));
  }
  {
    Launcher l(dir, {"--cpu", dir / "missing"});
    CHECK(l.wait() == 8);
    CHECK_THAT(l.err(), contains("no file at that path"));
  }
  {
    const std::string junk = dir / "junk";
    { std::ofstream(junk) << "\x7f" "garbage"; }
    ::chmod(junk.c_str(), 0755);
    Launcher l(dir, {"--cpu", junk});
    CHECK(l.wait() == 8);
    CHECK_THAT(l.err(), contains("cannot start '" + junk + "': Exec format error (not an executable format"));
  }
  {
    { std::ofstream(dir / "file") << "x"; }
    Launcher l(dir, {"--cpu", "--log_dir", dir / "file/logs", children + "/print_env"});
    CHECK(l.wait() == 8);
    CHECK_THAT(l.err(), contains("cannot create the log directory '" + dir / "file/logs" + "'"));
  }
}

TEST_CASE("the checklist stops a job before anything starts", "[launch][mp]") {
  TempDir dir;
  {
    Launcher l(dir, {"--num_processes", "2", children + "/fail_rank", dir.path}, {{"CUDA_VISIBLE_DEVICES", ""}});
    CHECK(l.wait() == 3);
    CHECK_THAT(l.err(), contains("[accel.config] CUDA_VISIBLE_DEVICES is set to '', so no GPU is visible"));
  }
  {
    Launcher l(dir, {"--num_processes", "2", children + "/fail_rank", dir.path}, {{"CUDA_VISIBLE_DEVICES", "1,1"}});
    CHECK(l.wait() == 3);
    CHECK_THAT(l.err(), contains("is listed twice"));
  }
  {
    Launcher l(dir, {"--num_processes", "3", "--num_machines", "2", "--machine_rank", "0", "--main_process_ip", "h",
                     "--main_process_port", "1", "--cpu", children + "/fail_rank", dir.path});
    CHECK(l.wait() == 2);
    CHECK_THAT(l.err(), contains("--num_processes 3 is not divisible by --num_machines 2"));
  }
  {
    Launcher l(dir, {"--num_processes", "x", "prog"});
    CHECK(l.wait() == 2);
    CHECK_THAT(l.err(), contains("[accel.usage] --num_processes 'x' is not a positive integer"));
  }
  CHECK_FALSE(exists(dir / "pid_0"));
}

TEST_CASE("no visible GPU without --cpu is a warning and the job still runs", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--num_processes", "2", "--tee", children + "/print_env"},
             {{"CUDA_VISIBLE_DEVICES", "9"}});  // no GPU 9 anywhere: zero GPUs even on a GPU machine
  REQUIRE(l.wait() == 0);
  CHECK_THAT(l.err(), contains("accel launch: warning: no GPU is visible"));
  CHECK_THAT(l.out(), contains("[rank 1] RANK=1"));
}

TEST_CASE("accel launch help documents options and environment and exit status", "[launch][mp]") {
  TempDir dir;
  Launcher l(dir, {"--help"});
  REQUIRE(l.wait() == 0);
  const std::string out = l.out();
  for (const char* s : {"--num_processes", "--gpu_ids", "--cpu", "--num_machines", "--machine_rank", "--main_process_ip",
                        "--main_process_port", "--tee", "--log_dir", "--timeout", "--grace", "--gpus_per_process", "ACCEL_GPUS_PER_PROCESS",
                        "ACCEL_JOB_TOKEN", "exit status",
                        "all machines together"})
    CHECK_THAT(out, contains(s));
}

TEST_CASE("the first rank to fail is blamed even when another fails a moment later", "[launch][mp][blame]") {
  // Rank 1 exits with 3; rank 0 notices and exits with 5 right after (at once, or 2 to 5 ms later),
  // as ranks do when a peer's connection closes. Both are often dead by the time the launcher looks.
  for (int run = 0; run < 40; ++run) {
    const int delay_us = run % 2 == 0 ? 0 : 2000 + run * 397 % 3000;
    TempDir dir;
    Launcher l(dir, {"--cpu", "--num_processes", "2", children + "/cascade", dir.path, std::to_string(delay_us)});
    const int status = l.wait();
    const std::string err = l.err();
    INFO("run " << run << ": rank 0 exits " << delay_us << " us after rank 1; launcher stderr:\n" << err);
    REQUIRE(status == 3);
    REQUIRE_THAT(err, contains("rank 1 (local rank 1, pid "));
    REQUIRE_THAT(err, contains(") exited with code 3; stopping the other 1 process"));
    REQUIRE_THAT(err, contains("job failed: rank 1 exited with code 3; exit status 3"));
  }
}

namespace {

/// Every line of the launcher's own that tells how a process ended says "exited with code N" or
/// "was killed by signal N (NAME)", and none guesses at a crash.
void check_wording(const std::string& err) {
  for (const auto& line : lines_of(err)) {
    if (!line.starts_with("accel launch: ")) continue;
    INFO(line);
    CHECK_THAT(line, !contains("crash"));
    if (line.find("killed") != std::string::npos) CHECK(std::regex_search(line, std::regex(R"(was killed by signal [0-9]+ \(SIG[A-Z0-9]+\))")));
  }
}

}  // namespace

TEST_CASE("an exit is reported as an exit and only a signal as a kill", "[launch][mp][wording]") {
  TempDir dir;
  SECTION("a plain exit(7)") {
    Launcher l(dir, {"--cpu", "--num_processes", "2", children + "/fail_rank", dir.path, "--fail", "1", "exit:7"});
    const auto pids = read_pids(dir, "pid_", 2);
    REQUIRE(l.wait() == 7);
    const std::string err = l.err();
    CHECK_THAT(err, contains("rank 1 (local rank 1, pid " + std::to_string(pids[1]) + ") exited with code 7; stopping"));
    CHECK_THAT(err, contains("job failed: rank 1 exited with code 7; exit status 7\n"));
    CHECK_THAT(err, contains("rank 0 (pid " + std::to_string(pids[0]) + ") stopped: was killed by signal 15 (SIGTERM)"));
    for (const auto& line : lines_of(err))
      if (line.find("rank 1 ") != std::string::npos) CHECK_THAT(line, !contains("killed") && !contains("signal"));
    check_wording(err);
  }
  SECTION("a SIGKILL from outside") {
    Launcher l(dir, {"--cpu", "--num_processes", "2", children + "/fail_rank", dir.path});
    const auto pids = read_pids(dir, "pid_", 2);
    REQUIRE(::kill(pids[1], SIGKILL) == 0);
    REQUIRE(l.wait() == 128 + SIGKILL);
    const std::string err = l.err();
    CHECK_THAT(err, contains("rank 1 (local rank 1, pid " + std::to_string(pids[1]) + ") was killed by signal 9 (SIGKILL); stopping"));
    CHECK_THAT(err, contains("job failed: rank 1 was killed by signal 9 (SIGKILL); exit status 137\n"));
    CHECK_THAT(err, !contains("exited with code"));
    check_wording(err);
  }
}

namespace {

/// Kills `pid` if it is still one of our `sleep 300` daemons, so a failed test leaves nothing behind.
void kill_stray_sleep(pid_t pid) {
  using namespace std::string_view_literals;
  if (!process_gone(pid) && read_file("/proc/" + std::to_string(pid) + "/cmdline").starts_with("sleep\0"sv)) ::kill(pid, SIGKILL);
}

}  // namespace

TEST_CASE("daemons the ranks started are ended with the job and never blamed", "[launch][mp][orphans]") {
  const int code = GENERATE(0, 4);
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "2", "--grace", "2", children + "/daemonize", dir.path, std::to_string(code)});
  const auto daemons = read_pids(dir, "daemon_", 2);
  const int status = l.wait();
  bool gone[2];
  for (int r = 0; r < 2; ++r) {
    gone[r] = process_gone(daemons[r]);
    kill_stray_sleep(daemons[r]);
  }
  const std::string err = l.err();
  INFO("launcher stderr:\n" << err);
  CHECK(gone[0]);
  CHECK(gone[1]);
  CHECK(status == code);
  CHECK_THAT(err, contains("the job left 2 processes running (pid "));
  CHECK_THAT(err, contains("sleep): ending them (SIGTERM, SIGKILL after 2 s)"));
  if (code == 0) CHECK_THAT(err, !contains("job failed"));
  else CHECK(std::regex_search(err, std::regex("job failed: rank [01] exited with code 4; exit status 4\n")));
  // The daemons' SIGTERM is nobody's failure: their pids appear in the line about them only.
  for (const auto& line : lines_of(err))
    for (pid_t d : daemons)
      if (line.find("pid " + std::to_string(d) + ")") != std::string::npos || line.find("pid " + std::to_string(d) + " ") != std::string::npos)
        CHECK_THAT(line, contains("the job left 2 processes running"));
}

TEST_CASE("daemons that ignore SIGTERM are killed when the grace period ends", "[launch][mp][orphans]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "1", "--grace", "0.5", children + "/daemonize", dir.path, "0", "--stubborn"});
  const pid_t daemon = read_pids(dir, "daemon_", 1)[0];
  const int status = l.wait();
  const bool gone = process_gone(daemon);
  kill_stray_sleep(daemon);
  CHECK(gone);
  CHECK(status == 0);
  CHECK_THAT(l.err(), contains("the job left 1 process running (pid " + std::to_string(daemon) + " sleep): ending it (SIGTERM, SIGKILL after 0.5 s)"));
  CHECK_THAT(l.err(), contains("process " + std::to_string(daemon) + " (sleep) did not stop within 0.5 s; sending SIGKILL"));
}

TEST_CASE("a daemon that fails while the job runs is reaped and never blamed", "[launch][mp][orphans]") {
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "2", children + "/daemonize", dir.path, "0", "--short"});
  const auto daemons = read_pids(dir, "daemon_", 2);
  REQUIRE(l.wait() == 0);
  for (pid_t p : daemons) CHECK(process_gone(p));
  CHECK_THAT(l.err(), !contains("code 9"));
  CHECK_THAT(l.err(), !contains("job failed"));
}

TEST_CASE("tee keeps a line longer than 64 KiB whole, with one rank prefix", "[launch][mp][tee]") {
  const std::size_t bytes = 200 * 1024;
  TempDir dir;
  Launcher l(dir, {"--cpu", "--num_processes", "2", "--tee", children + "/long_line", std::to_string(bytes)});
  REQUIRE(l.wait() == 0);
  const auto lines = lines_of(l.out());
  CHECK(lines.size() == 6);
  for (const std::string rank : {"0", "1"}) {
    const std::string prefix = "[rank " + rank + "] ";
    std::string expected = prefix;
    for (std::size_t i = 0; i < bytes; ++i) expected += static_cast<char>('a' + (i * 7 + static_cast<unsigned char>(rank[0])) % 26);
    int begin = 0, whole = 0, end = 0;
    for (const auto& s : lines) {
      begin += s == prefix + "rank " + rank + " begin";
      whole += s == expected;
      end += s == prefix + "rank " + rank + " end";
    }
    CHECK(begin == 1);
    CHECK(whole == 1);
    CHECK(end == 1);
  }
}

TEST_CASE("the rank that failed first is blamed even when a rank that failed because of it ends first", "[launch][mp][blame]") {
  // Rank 1 leaves the job before the first collective (its DistributedState says goodbye, or its
  // connection just closes as in a crash), lingers L ms, and exits with 7. Rank 0's collective
  // fails at once because of it and rank 0 exits with 2: with L > 0 always before rank 1 has ended,
  // with L = 0 about as often as not. The store accel launch hosts saw rank 1 leave first.
  const char* lingers[] = {"0", "20", "300"};
  for (int run = 0; run < 30; ++run) {
    const std::string how = std::string(run % 2 == 0 ? "leave7+" : "drop7+") + lingers[run % 3];
    TempDir dir;
    Launcher l(dir, {"--cpu", "--num_processes", "2", children + "/early_exit", "1", how, "200"});
    const int status = l.wait();
    const std::string err = l.err();
    INFO("run " << run << ": rank 1 " << how << "; launcher stderr:\n" << err);
    REQUIRE(status == 7);
    REQUIRE_THAT(err, contains("job failed: rank 1 exited with code 7; exit status 7\n"));
    REQUIRE_THAT(err, !contains("job failed: rank 0"));
    // Rank 0 either ended first (it failed on its own: a consequence) or was stopped by the launcher.
    if (err.find("rank 0 (local rank 0, pid ") != std::string::npos)
      REQUIRE_THAT(err, contains("rank 0 exited with code 2 after rank 1 left the job: a consequence of rank 1's failure\n"));
  }
}
