// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel launch --num_machines 2` across two "machines": two network namespaces joined by a veth
// pair, each with its own addresses and ports, one `accel launch --machine_rank R` in each. Needs
// root and iproute2; where namespaces cannot be made the case says why and is skipped.
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/launchers.hpp"
#include "support/run_command.hpp"
#include "support/spawn.hpp"

using namespace std::chrono_literals;

namespace {

const std::string whoami = std::string(ACCEL_TEST_CHILD_DIR) + "/whoami";
const std::string p2p_child = std::string(ACCEL_TEST_CHILD_DIR) + "/p2p_child";

// Two network namespaces "<p>a" and "<p>b" with addresses 10.233.X.1 and .2 on a veth pair, X
// from this process's id so concurrent runs do not meet. Removed (with the pair) at the end.
struct TwoMachines {
  std::string ip;  ///< the iproute2 program
  std::string prefix, a, b, ip_a, ip_b;
  std::string failure;  ///< why they could not be made ("" when they were)

  TwoMachines() {
    if (const auto found = accel_test::find_program({"ip"})) ip = *found;
    for (const char* path : {"/usr/sbin/ip", "/sbin/ip"})
      if (ip.empty() && ::access(path, X_OK) == 0) ip = path;
    if (ip.empty()) {
      failure = "iproute2's ip is not installed (Debian: iproute2)";
      return;
    }
    const auto id = std::to_string(::getpid() % 100000);
    prefix = "accel" + id;
    a = prefix + "a";
    b = prefix + "b";
    const auto subnet = "10.233." + std::to_string(::getpid() % 250) + ".";
    ip_a = subnet + "1";
    ip_b = subnet + "2";
    const std::vector<std::string> steps = {
        "netns add " + a, "netns add " + b,
        "link add " + prefix + "x type veth peer name " + prefix + "y",
        "link set " + prefix + "x netns " + a, "link set " + prefix + "y netns " + b,
        "-n " + a + " addr add " + ip_a + "/24 dev " + prefix + "x",
        "-n " + b + " addr add " + ip_b + "/24 dev " + prefix + "y",
        "-n " + a + " link set " + prefix + "x up", "-n " + b + " link set " + prefix + "y up",
        "-n " + a + " link set lo up", "-n " + b + " link set lo up"};
    for (const auto& step : steps) {
      const auto r = accel_test::run_command(ip + " " + step + " 2>&1");
      if (r.status != 0) {
        failure = "'ip " + step + "' failed (" + r.output.substr(0, r.output.find('\n')) + "); network namespaces need root and iproute2";
        return;
      }
    }
  }
  TwoMachines(const TwoMachines&) = delete;
  TwoMachines& operator=(const TwoMachines&) = delete;
  ~TwoMachines() {
    if (ip.empty()) return;
    (void)accel_test::run_command(ip + " netns del " + a + " 2>/dev/null");
    (void)accel_test::run_command(ip + " netns del " + b + " 2>/dev/null");
  }

  // argv that runs accel launch as machine `rank` of 2 (4 processes, 2 per machine) in its namespace.
  std::vector<std::string> launch(int rank, const std::vector<std::string>& program) const {
    std::vector<std::string> argv = {ip, "netns", "exec", rank == 0 ? a : b, ACCEL_TEST_CLI, "launch", "--cpu",
                                     "--num_processes", "4", "--num_machines", "2", "--machine_rank", std::to_string(rank),
                                     "--main_process_ip", ip_a, "--main_process_port", "29500", "--timeout", "30"};
    argv.insert(argv.end(), program.begin(), program.end());
    return argv;
  }
};

// Runs machine 0 and machine 1 of one job at once; each one's exit code and output.
std::vector<accel_test::JobResult> run_two_machines(const TwoMachines& m, const std::vector<std::string>& program,
                                            const accel_test::ScratchDir& dir, const std::vector<std::string>& more_env = {}) {
  auto env = accel_test::launcher_environment();
  env.insert(env.end(), more_env.begin(), more_env.end());
  env.emplace_back("ACCEL_JOB_TOKEN=");  // the same on every machine (appended: GCC 12 -Warray-bounds)
  env.back().append("0123456789abcdef0123456789abcdef");
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const auto name = "machine" + std::to_string(r);
    pids.push_back(accel_test::spawn_redirected(m.launch(r, program), env, "/dev/null", dir / (name + ".out"), dir / (name + ".err")));
    REQUIRE(pids.back() > 0);
  }
  std::vector<accel_test::JobResult> out;
  const auto until = std::chrono::steady_clock::now() + 90s;
  for (int r = 0; r < 2; ++r) {
    const auto name = "machine" + std::to_string(r);
    accel_test::JobResult res;
    res.code = accel_test::wait_or_kill(pids[static_cast<std::size_t>(r)], until, 3s);
    res.out = accel_test::read_file(dir / (name + ".out"));
    res.err = accel_test::read_file(dir / (name + ".err"));
    out.push_back(res);
  }
  return out;
}

std::string expected_lines() {
  std::string s;
  for (int r = 0; r < 4; ++r)
    s += "process=" + std::to_string(r) + "/4 local=" + std::to_string(r % 2) + "/2 device=cpu launcher=accel launch job=yes\n";
  return s;
}

// Runs `program` as one job on the two machines, or says why it cannot (then the case is skipped).
std::optional<std::vector<accel_test::JobResult>> run_on_two_machines(const std::vector<std::string>& program,
                                                                       const std::vector<std::string>& more_env = {}) {
  TwoMachines machines;
  if (!machines.failure.empty()) {
    WARN("test skipped: " << machines.failure);
    return std::nullopt;
  }
  accel_test::ScratchDir dir("multi_machine");
  return run_two_machines(machines, program, dir, more_env);
}

}  // namespace

TEST_CASE("accel launch on two machines (network namespaces) runs one job of 4 ranks", "[launch][mp][multinode]") {
  const auto r = run_on_two_machines({whoami});
  if (!r) return;
  INFO("machine 0 stderr:\n" << (*r)[0].err << "\nmachine 1 stderr:\n" << (*r)[1].err);
  CHECK((*r)[0].code == 0);
  CHECK((*r)[1].code == 0);
  CHECK((*r)[0].out == expected_lines());  // rank 0, on machine 0, prints every rank's line
  CHECK((*r)[1].out.empty());
}

TEST_CASE("on two machines, a rank of machine 1 that exits with 7 fails machine 1's accel launch with 7", "[launch][mp][multinode]") {
  const auto r = run_on_two_machines({whoami, "3", "7"});
  if (!r) return;
  INFO("machine 0 stderr:\n" << (*r)[0].err << "\nmachine 1 stderr:\n" << (*r)[1].err);
  CHECK((*r)[0].code == 0);
  CHECK((*r)[1].code == 7);
  CHECK((*r)[0].out == expected_lines());
  CHECK((*r)[1].err.find("rank 3") != std::string::npos);
}

TEST_CASE("on two machines, point-to-point messages run with shared memory allowed and through the store",
          "[launch][mp][multinode][p2p]") {
  // The two namespaces share /dev/shm, the PID namespace and the machine identity, so with shared
  // memory allowed every rank sees one machine and uses shared-memory channels: no message crosses
  // the veth pair then (a job that truly spans machines sends every message through the store).
  // With ACCEL_CPU_SHM=0 every message crosses the veth pair through the store. Each rank's line
  // says which way its messages went.
  for (const char* shm : {"ACCEL_CPU_SHM=1", "ACCEL_CPU_SHM=0"}) {
    INFO(shm);
    const auto r = run_on_two_machines({p2p_child, "ring", "path"}, {shm});
    if (!r) return;
    INFO("machine 0 stderr:\n" << (*r)[0].err << "\nmachine 1 stderr:\n" << (*r)[1].err);
    CHECK((*r)[0].code == 0);
    CHECK((*r)[1].code == 0);
    const std::string path = std::string(shm) == "ACCEL_CPU_SHM=1" ? " (shared memory)\n" : " (store)\n";
    CHECK((*r)[0].out == "rank 0 got 'hello from rank 3'" + path + "rank 1 got 'hello from rank 0'" + path +
                             "rank 2 got 'hello from rank 1'" + path + "rank 3 got 'hello from rank 2'" + path);
    const auto g = run_on_two_machines({p2p_child, "grid"}, {shm});
    REQUIRE(g);
    INFO("grid: machine 0 stderr:\n" << (*g)[0].err << "\nmachine 1 stderr:\n" << (*g)[1].err);
    CHECK((*g)[0].code == 0);
    CHECK((*g)[1].code == 0);
    CHECK((*g)[0].out.find("rank 3 replica 1 stage 1: usage_error") != std::string::npos);
  }
}
