// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Tests for env.hpp: every launcher convention, precedence, malformed values, and job identity.
#include <accel/runtime/env.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#include "support/catch.hpp"
#include "support/fake_env.hpp"

using accel::Launcher;
using accel_test::read;
using accel_test::Vars;
using accel_test::with;

TEST_CASE("no launcher variables at all means one process", "[env]") {
  const auto e = read({});
  CHECK(e.launcher == Launcher::none);
  CHECK(e.rank == 0);
  CHECK(e.world_size == 1);
  CHECK(e.local_rank == 0);
  CHECK(e.local_world_size == 1);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.timeout == std::chrono::seconds(300));
}

TEST_CASE("torchrun variables give ranks, machine and rendezvous", "[env]") {
  const auto e = read(accel_test::torchrun_vars(5, 8, 4));
  CHECK(e.launcher == Launcher::torchrun);
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 4);
  CHECK(e.group_rank == 1);
  CHECK(e.num_machines == 2);
  CHECK(e.master_port == 29511);
}

TEST_CASE("accel launch is recognised and its own variables are read", "[env]") {
  const auto e = read(with(accel_test::torchrun_vars(1, 2, 2), {{"ACCEL_LAUNCHED", "1"},
                                                                 {"ACCEL_STORE", "127.0.0.1:4567"},
                                                                 {"ACCEL_JOB_TOKEN", "abcd"},
                                                                 {"ACCEL_TIMEOUT_S", "2.5"}}));
  CHECK(e.launcher == Launcher::accel);
  CHECK(e.store_address == "127.0.0.1:4567");
  CHECK(e.job_token == "abcd");
  CHECK(e.timeout == std::chrono::milliseconds(2500));
}

TEST_CASE("the join timeout comes from ACCEL_JOIN_TIMEOUT_S, 60 s by default", "[env]") {
  CHECK(read(accel_test::torchrun_vars(0, 2, 2)).join_timeout == std::chrono::seconds(60));
  CHECK(read(with(accel_test::torchrun_vars(0, 2, 2), {{"ACCEL_JOIN_TIMEOUT_S", "0.5"}})).join_timeout == std::chrono::milliseconds(500));
  CHECK(accel::join_timeout_from(accel::map_env({{"ACCEL_JOIN_TIMEOUT_S", "120"}})) == std::chrono::seconds(120));
  REQUIRE_THROWS_WITH(read({{"ACCEL_JOIN_TIMEOUT_S", "0"}}),
                      accel_test::contains("ACCEL_JOIN_TIMEOUT_S='0' is not a positive number of seconds"));
}

TEST_CASE("MPICH / Intel MPI variables are read", "[env]") {
  const auto e = read({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  CHECK(e.launcher == Launcher::mpich);
  CHECK(e.rank == 3);
  CHECK(e.local_rank == 1);
  CHECK(e.group_rank == 1);
  CHECK(e.num_machines == 2);
}

TEST_CASE("Open MPI variables are read", "[env]") {
  const auto e = read({{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "3"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  CHECK(e.launcher == Launcher::openmpi);
  CHECK(e.rank == 2);
  CHECK(e.local_rank == 2);
  CHECK(e.num_machines == 1);
}

TEST_CASE("MVAPICH2 variables are read", "[env]") {
  const auto e = read({{"MV2_COMM_WORLD_RANK", "1"},
                       {"MV2_COMM_WORLD_SIZE", "2"},
                       {"MV2_COMM_WORLD_LOCAL_RANK", "0"},
                       {"MV2_COMM_WORLD_LOCAL_SIZE", "1"}});
  CHECK(e.launcher == Launcher::mvapich);
  CHECK(e.rank == 1);
  CHECK(e.group_rank == 1);
}

TEST_CASE("SLURM srun variables are read, with compressed task counts and the node list", "[env]") {
  const Vars slurm{{"SLURM_JOB_ID", "77"},          {"SLURM_STEP_ID", "0"},    {"SLURM_PROCID", "5"},
                   {"SLURM_NTASKS", "7"},           {"SLURM_LOCALID", "1"},    {"SLURM_NODEID", "2"},
                   {"SLURM_TASKS_PER_NODE", "3(x2),1"}, {"SLURM_STEP_NODELIST", "gpu[07-09]"}, {"SLURM_NNODES", "3"}};
  SECTION("the compressed per-node counts pick this node's count") {
    const auto e = read(with(slurm, {{"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "0"}}));
    CHECK(e.launcher == Launcher::slurm);
    CHECK(e.rank == 6);
    CHECK(e.world_size == 7);
    CHECK(e.local_world_size == 1);
    CHECK(e.group_rank == 2);
    CHECK(e.num_machines == 3);
    CHECK(e.master_addr == "gpu07");
  }
  SECTION("SLURM_NTASKS_PER_NODE, when requested, applies to every node") {
    const auto e = read(with(slurm, {{"SLURM_NTASKS", "6"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_NODEID", "2"}}));
    CHECK(e.local_world_size == 2);
  }
  SECTION("a bare sbatch script (no job step) is one process") {
    Vars batch = slurm;
    batch.erase("SLURM_STEP_ID");
    const auto e = read(batch);
    CHECK(e.launcher == Launcher::none);
    CHECK(e.world_size == 1);
  }
  SECTION("a malformed task count is named") {
    REQUIRE_THROWS_WITH(read(with(slurm, {{"SLURM_TASKS_PER_NODE", "3(x2,1"}})),
                        accel_test::contains("SLURM_TASKS_PER_NODE='3(x2,1' is malformed"));
  }
}

TEST_CASE("the first present convention wins: torchrun over MPI over SLURM", "[env]") {
  SECTION("srun starting torchrun: torchrun's ranks are the job's") {
    auto v = with(accel_test::torchrun_vars(3, 8, 8), {{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
    CHECK(read(v).launcher == Launcher::torchrun);
    CHECK(read(v).rank == 3);
  }
  SECTION("PMI before Open MPI") {
    const auto e = read({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
    CHECK(e.launcher == Launcher::mpich);
  }
}

TEST_CASE("conventions that disagree on the rank of the same world are a config error", "[env]") {
  auto v = with(accel_test::torchrun_vars(1, 2, 2), {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  REQUIRE_THROWS_AS(read(v), accel::config_error);
  REQUIRE_THROWS_WITH(read(v), accel_test::contains("conflicting launcher variables: RANK=1 (torchrun) but "
                                                    "OMPI_COMM_WORLD_RANK=0 (Open MPI)"));
}

TEST_CASE("malformed values are config errors naming the variable and the value", "[env]") {
  SECTION("RANK=abc") {
    REQUIRE_THROWS_WITH(read(with(accel_test::torchrun_vars(0, 2, 2), {{"RANK", "abc"}})),
                        "[accel.config] RANK='abc' is not a non-negative integer; fix or unset RANK");
  }
  SECTION("a negative rank") {
    REQUIRE_THROWS_WITH(read(with(accel_test::torchrun_vars(0, 2, 2), {{"RANK", "-1"}})), accel_test::contains("RANK='-1'"));
  }
  SECTION("WORLD_SIZE=0") {
    REQUIRE_THROWS_WITH(read(with(accel_test::torchrun_vars(0, 2, 2), {{"WORLD_SIZE", "0"}})),
                        accel_test::contains("WORLD_SIZE='0' is not a positive integer"));
  }
  SECTION("rank not below the world size") {
    REQUIRE_THROWS_WITH(read(with(accel_test::torchrun_vars(0, 2, 2), {{"RANK", "2"}})),
                        accel_test::contains("RANK=2 is not below WORLD_SIZE=2"));
  }
  SECTION("LOCAL_RANK not below LOCAL_WORLD_SIZE") {
    REQUIRE_THROWS_WITH(read(with(accel_test::torchrun_vars(0, 4, 2), {{"LOCAL_RANK", "2"}})),
                        accel_test::contains("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  }
  SECTION("more local processes than the job") {
    REQUIRE_THROWS_WITH(read(with(accel_test::torchrun_vars(0, 2, 2), {{"LOCAL_WORLD_SIZE", "4"}})),
                        accel_test::contains("LOCAL_WORLD_SIZE=4 exceeds WORLD_SIZE=2"));
  }
  SECTION("RANK without WORLD_SIZE") {
    REQUIRE_THROWS_WITH(read({{"RANK", "0"}}), accel_test::contains("RANK=0 is set but WORLD_SIZE is not"));
  }
  SECTION("a bad port") {
    REQUIRE_THROWS_WITH(read({{"MASTER_PORT", "70000"}}), accel_test::contains("MASTER_PORT='70000' is not a TCP port"));
    REQUIRE_THROWS_WITH(read({{"MASTER_PORT", "http"}}), accel_test::contains("MASTER_PORT='http'"));
  }
  SECTION("a bad store address") {
    REQUIRE_THROWS_WITH(read({{"ACCEL_STORE", "localhost"}}), accel_test::contains("ACCEL_STORE='localhost' is not host:port"));
  }
  SECTION("a bad timeout") {
    REQUIRE_THROWS_WITH(read({{"ACCEL_TIMEOUT_S", "soon"}}), accel_test::contains("ACCEL_TIMEOUT_S='soon'"));
    REQUIRE_THROWS_WITH(read({{"ACCEL_TIMEOUT_S", "-3"}}), accel_test::contains("ACCEL_TIMEOUT_S='-3'"));
  }
  SECTION("a bad boolean") {
    REQUIRE_THROWS_WITH(read({{"ACCEL_USE_CPU", "maybe"}}), accel_test::contains("ACCEL_USE_CPU='maybe' is not a boolean"));
  }
  SECTION("GROUP_RANK beyond the machines") {
    REQUIRE_THROWS_WITH(read(with(accel_test::torchrun_vars(0, 2, 2), {{"GROUP_RANK", "1"}})),
                        accel_test::contains("machine index 1 is not below the number of machines 1"));
  }
}

TEST_CASE("missing local variables are assumed from a single machine and reported", "[env]") {
  const auto e = read({{"RANK", "1"}, {"WORLD_SIZE", "3"}});
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 3);
  CHECK(e.diagnostics.size() == 2);
}

TEST_CASE("a multi-machine job without MASTER_ADDR is diagnosed", "[env]") {
  auto v = accel_test::torchrun_vars(0, 4, 2);
  v.erase("MASTER_ADDR");
  const auto e = read(v);
  CHECK(e.master_addr.empty());
  CHECK_THAT(e.diagnostics.back(), accel_test::contains("MASTER_ADDR is unset"));
}

TEST_CASE("SLURM: rank 0's host is the first of the step's node list, else the job's", "[env]") {
  const Vars base = {{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"},
                     {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "2"}};
  CHECK(read(with(base, {{"SLURM_STEP_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_NODELIST", "gpu[01-08]"}})).master_addr == "gpu07");
  CHECK(read(with(base, {{"SLURM_JOB_NODELIST", "rack[2-3]-gpu[05,9]"}})).master_addr == "rack2-gpu05");
  CHECK(read(with(base, {{"SLURM_NODELIST", "tux,tux2"}})).master_addr == "tux");
  CHECK(read(with(base, {{"MASTER_ADDR", "10.0.0.1"}, {"SLURM_JOB_NODELIST", "gpu1"}})).master_addr == "10.0.0.1");
  REQUIRE_THROWS_WITH(read(with(base, {{"SLURM_JOB_NODELIST", "gpu[1-"}})), accel_test::contains("SLURM node list 'gpu[1-' has an unclosed '['"));
}

TEST_CASE("a bare sbatch script (a SLURM job without an srun step) gets a one-line hint", "[env]") {
  const auto e = read({{"SLURM_JOB_ID", "42"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "n[1-2]"}});
  CHECK(e.launcher == Launcher::none);
  CHECK(e.world_size == 1);
  REQUIRE(e.diagnostics.size() == 1);
  CHECK_THAT(e.diagnostics[0], accel_test::contains("SLURM_JOB_ID=42 is set but this is no srun step (SLURM_STEP_ID is unset): this batch "
                                                    "script runs as one process; start the ranks with `srun ./program` inside it"));
  CHECK(read({{"SLURM_JOB_ID", "42"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).diagnostics.empty());
  // mpirun inside an sbatch script: its own ranks, no hint.
  CHECK(read({{"SLURM_JOB_ID", "42"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}).diagnostics.empty());
}

TEST_CASE("MPICH: only a local rank variable set is a config error naming it, not a crash", "[env]") {
  REQUIRE_THROWS_WITH(read({{"MPI_LOCALRANKID", "0"}}),
                      accel_test::contains("MPI_LOCALRANKID=0 is set but neither PMI_RANK nor PMI_SIZE is (MPICH/Intel MPI sets all of "
                                           "them); set PMI_RANK and PMI_SIZE or unset MPI_LOCALRANKID"));
  REQUIRE_THROWS_WITH(read({{"MPI_LOCALNRANKS", "2"}}), accel_test::contains("MPI_LOCALNRANKS=2 is set but neither PMI_RANK nor PMI_SIZE"));
  REQUIRE_THROWS_WITH(read({{"LOCAL_RANK", "0"}}), accel_test::contains("LOCAL_RANK=0 is set but neither RANK nor WORLD_SIZE"));
}

TEST_CASE("the SLURM helpers parse host lists and task counts", "[env]") {
  CHECK(accel::detail::slurm_first_host("node[01-04,07],gpu1") == "node01");
  CHECK(accel::detail::slurm_first_host("gpu1,node[2-5]") == "gpu1");
  CHECK(accel::detail::slurm_first_host("tux[12]") == "tux12");
  CHECK(accel::detail::slurm_first_host("a[1-2]-b[3-4]") == "a1-b3");
  CHECK(accel::detail::slurm_first_host("rack[7,2]-n[08-10]") == "rack7-n08");
  CHECK(accel::detail::slurm_expand_hosts("node[01-03,7],gpu1") == std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu1"});
  CHECK(accel::detail::slurm_expand_hosts("n[8-11]") == std::vector<std::string>{"n8", "n9", "n10", "n11"});
  CHECK(accel::detail::slurm_expand_hosts("n[098-101]") == std::vector<std::string>{"n098", "n099", "n100", "n101"});
  CHECK(accel::detail::slurm_expand_hosts("a[1-2]-b[3-4]") == std::vector<std::string>{"a1-b3", "a1-b4", "a2-b3", "a2-b4"});
  CHECK(accel::detail::slurm_expand_hosts("x[1-1000000]", 3) == std::vector<std::string>{"x1", "x2", "x3"});
  for (const char* bad : {"", "node[01-03", "node]1", "a,,b", "n[]", "n[3-1]", "n[a-b]", "n[1-]", "n[[1]]"})
    REQUIRE_THROWS_AS(accel::detail::slurm_expand_hosts(bad), accel::config_error);
  REQUIRE_THROWS_WITH(accel::detail::slurm_first_host("n[3-1]"), accel_test::contains("SLURM node list 'n[3-1]' has a malformed range '3-1'"));
  CHECK(accel::detail::slurm_expand_counts("2(x3),1", "X") == std::vector<int>{2, 2, 2, 1});
  REQUIRE_THROWS_AS(accel::detail::slurm_expand_counts("2(x0)", "X"), accel::config_error);
}

TEST_CASE("the process environment source reads real variables", "[env]") {
  ::setenv("ACCEL_TEST_PROBE_VAR", "42", 1);
  CHECK(accel::process_env()("ACCEL_TEST_PROBE_VAR") == "42");
  ::unsetenv("ACCEL_TEST_PROBE_VAR");
  CHECK_FALSE(accel::process_env()("ACCEL_TEST_PROBE_VAR").has_value());
}

// ---------------------------------------------------------------------------------------------
// Job identity, from the variables the real launchers set (tests/compat/fixtures/launcher_env.txt).

namespace {

// Open MPI 4.1.4 mpirun -np 2, rank `rank` of a job with id `jobid` and precondition key `key`.
Vars openmpi_job(int rank, const std::string& jobid, const std::string& key) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
          {"OMPI_MCA_ess_base_jobid", jobid},
          {"OMPI_MCA_orte_precondition_transports", key},
          {"PMIX_NAMESPACE", jobid},
          {"PMIX_RANK", std::to_string(rank)}};
}

// MPICH 4.0.2 (Hydra) mpiexec -n 2: no identity among the variables at all.
Vars hydra_job(int rank) {
  return {{"PMI_RANK", std::to_string(rank)}, {"PMI_SIZE", "2"}, {"PMI_FD", rank == 0 ? "6" : "8"},
          {"MPI_LOCALRANKID", std::to_string(rank)}, {"MPI_LOCALNRANKS", "2"}, {"HYDI_CONTROL_FD", "7"}};
}

// SLURM 22.05.8 srun -n 2 (job `job`, step 0); pmi2 adds srun --mpi=pmi2's PMI variables.
Vars slurm_job(int rank, const std::string& job, bool pmi2 = false) {
  Vars v{{"SLURM_JOB_ID", job},     {"SLURM_JOBID", job},          {"SLURM_STEP_ID", "0"},          {"SLURM_STEPID", "0"},
         {"SLURM_PROCID", std::to_string(rank)}, {"SLURM_LOCALID", std::to_string(rank)}, {"SLURM_NTASKS", "2"},
         {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_STEP_NODELIST", "vm"}};
  if (pmi2) v = with(v, {{"PMI_RANK", std::to_string(rank)}, {"PMI_SIZE", "2"}, {"PMI_FD", rank == 0 ? "11" : "13"}, {"PMI_JOBID", job + ".0"}});
  return v;
}

// torch 1.13 torchrun --nproc_per_node 2: --standalone (a run id and a free port) or static (run id "none").
Vars torchrun_job(int rank, const std::string& run_id, const std::string& port, bool agent_store) {
  return with(accel_test::torchrun_vars(rank, 2, 2), {{"MASTER_PORT", port},
                                                      {"GROUP_WORLD_SIZE", "1"},
                                                      {"TORCHELASTIC_RUN_ID", run_id},
                                                      {"TORCHELASTIC_USE_AGENT_STORE", agent_store ? "True" : "False"}});
}

// Hydra's proxy as SO_PEERCRED names it, one per job: PMI_FD 6 and 8 of one job lead to one proxy.
accel::LauncherQuery hydra_proxy(const std::string& peer) {
  return {[peer](int fd) -> std::optional<std::string> {
    if (fd != 6 && fd != 8) return std::nullopt;
    return peer;
  }};
}

accel::LauncherQuery must_not_ask() {
  return {[](int) -> std::optional<std::string> {
    FAIL("the launcher query was asked although the variables name the job");
    return std::nullopt;
  }};
}

accel::LaunchEnv read_with(const Vars& v, const accel::LauncherQuery& q) { return accel::read_launch_env(accel::map_env(v), q); }

}  // namespace

TEST_CASE("Open MPI: the job id names the job; the token adds mpirun's per-job key; the port derives from the id", "[env][job]") {
  const auto r0 = read(openmpi_job(0, "1682178049", "9204d33e21c1a35d-e698b64070d9d2f7"));
  const auto r1 = read(openmpi_job(1, "1682178049", "9204d33e21c1a35d-e698b64070d9d2f7"));
  CHECK(r0.job_id == "openmpi:1682178049");
  CHECK(r0.job_token == "openmpi:1682178049/9204d33e21c1a35d-e698b64070d9d2f7");
  CHECK(r0.master_port == accel::job_port("openmpi:1682178049"));
  CHECK(r0.master_port_derived);
  CHECK(r0.rendezvous_warning.empty());
  CHECK((r1.job_id == r0.job_id && r1.job_token == r0.job_token && r1.master_port == r0.master_port));
  const auto other = read(openmpi_job(0, "1681195009", "39551f887e70fa54-578687d42be2435d"));
  CHECK(other.job_id == "openmpi:1681195009");
  CHECK(other.master_port != r0.master_port);
  CHECK(other.job_token != r0.job_token);
  SECTION("two jobs whose ids collide still differ in token") {
    CHECK(read(openmpi_job(0, "1682178049", "39551f887e70fa54-578687d42be2435d")).job_token != r0.job_token);
  }
  SECTION("Open MPI 5 names the job by its PMIx namespace only") {
    auto v = openmpi_job(0, "prterun-vm-4242@1", "");
    v.erase("OMPI_MCA_ess_base_jobid");
    v.erase("OMPI_MCA_orte_precondition_transports");
    CHECK(read(v).job_id == "openmpi:prterun-vm-4242@1");
    CHECK(read(v).job_token == "openmpi:prterun-vm-4242@1");
  }
}

TEST_CASE("MPICH Hydra: the job is named by its proxy on this machine, asked of PMI_FD's peer", "[env][job]") {
  const auto r0 = read_with(hydra_job(0), hydra_proxy("vm/17194"));
  const auto r1 = read_with(hydra_job(1), hydra_proxy("vm/17194"));
  CHECK(r0.launcher == Launcher::mpich);
  CHECK(r0.job_id == "mpich:vm/17194");
  CHECK(r0.job_token == "mpich:vm/17194");
  CHECK(r0.master_port == accel::job_port("mpich:vm/17194"));
  CHECK((r1.job_id == r0.job_id && r1.master_port == r0.master_port));
  const auto other = read_with(hydra_job(0), hydra_proxy("vm/17293"));
  CHECK((other.master_port != r0.master_port && other.job_token != r0.job_token));
  SECTION("without the query, or with a PMI_FD that is no socket, there is no identity and one warning") {
    for (const auto& e : {read(hydra_job(0)), read_with(with(hydra_job(0), {{"PMI_FD", "99"}}), hydra_proxy("vm/1"))}) {
      CHECK(e.job_id.empty());
      CHECK(e.job_token.empty());
      CHECK(e.master_port == 29500);
      CHECK_FALSE(e.master_port_derived);
      CHECK_THAT(e.rendezvous_warning, accel_test::contains("no job identity (MPICH/Intel MPI: PMI_FD="));
      CHECK_THAT(e.rendezvous_warning, accel_test::contains(" is not a socket to Hydra's proxy) and MASTER_PORT is unset"));
    }
  }
  SECTION("a job on several machines has one proxy per machine, so no identity") {
    const auto e = read_with(with(hydra_job(1), {{"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}}), hydra_proxy("vm/17194"));
    CHECK(e.job_id.empty());
    CHECK_THAT(e.rendezvous_warning, accel_test::contains("this job spans machines"));
  }
  SECTION("srun --mpi=pmi2 gives PMI_JOBID, which is used without asking anything") {
    const auto e = read_with(slurm_job(1, "23", true), must_not_ask());
    CHECK(e.launcher == Launcher::mpich);
    CHECK(e.job_id == "pmi:23.0");
    CHECK(e.master_port == accel::job_port("pmi:23.0"));
    CHECK(read_with(slurm_job(0, "24", true), must_not_ask()).master_port != e.master_port);
  }
}

TEST_CASE("SLURM: the job is its job id and step; the port derives from them", "[env][job]") {
  const auto r0 = read(slurm_job(0, "21"));
  const auto r1 = read(slurm_job(1, "21"));
  CHECK(r0.launcher == Launcher::slurm);
  CHECK(r0.job_id == "slurm:21.0");
  CHECK(r0.job_token == "slurm:21.0");
  CHECK(r0.master_addr == "vm");
  CHECK(r0.master_port == accel::job_port("slurm:21.0"));
  CHECK((r1.job_id == r0.job_id && r1.master_port == r0.master_port));
  CHECK(read(slurm_job(0, "22")).master_port != r0.master_port);
  SECTION("a second step of the same allocation is another job") {
    CHECK(read(with(slurm_job(0, "21"), {{"SLURM_STEP_ID", "1"}, {"SLURM_STEPID", "1"}})).job_id == "slurm:21.1");
  }
  SECTION("older SLURM spells the step SLURM_STEPID only") {
    auto v = slurm_job(0, "21");
    v.erase("SLURM_STEP_ID");
    CHECK(read(v).job_id == "slurm:21.0");
  }
  SECTION("MASTER_PORT, when given, wins over the derived port") {
    const auto e = read(with(slurm_job(0, "21"), {{"MASTER_PORT", "29555"}}));
    CHECK(e.master_port == 29555);
    CHECK_FALSE(e.master_port_derived);
    CHECK(e.job_id == "slurm:21.0");
  }
}

TEST_CASE("torchrun: its run id names the job; its MASTER_PORT is kept", "[env][job]") {
  const auto e = read(torchrun_job(1, "de07ab22-eee7-47f9-9a39-5e799cd0934e", "37457", false));
  CHECK(e.job_id == "torchrun:de07ab22-eee7-47f9-9a39-5e799cd0934e");
  CHECK(e.job_token == e.job_id);
  CHECK(e.master_port == 37457);
  CHECK_FALSE(e.master_port_derived);
  SECTION("the static rendezvous calls every run 'none': no identity, but no warning either (MASTER_PORT is set)") {
    const auto s = read(torchrun_job(0, "none", "29500", true));
    CHECK(s.job_id.empty());
    CHECK(s.job_token.empty());
    CHECK(s.master_port == 29500);
    CHECK(s.rendezvous_warning.empty());
  }
}

TEST_CASE("accel launch: the token is the rendezvous token, and only its fingerprint names the job", "[env][job]") {
  const auto token = std::string("6f1d0c9e8b7a65443322110fedcba987");
  const auto e = read(with(accel_test::torchrun_vars(1, 2, 2), {{"ACCEL_LAUNCHED", "1"}, {"ACCEL_JOB_TOKEN", token}}));
  CHECK(e.launcher == Launcher::accel);
  CHECK(e.job_token == token);
  CHECK(e.job_id == accel::token_job_id(token));
  CHECK(e.job_id.rfind("accel:", 0) == 0);
  CHECK(e.job_id.size() == 14);
  CHECK(e.job_id.find(token.substr(0, 8)) == std::string::npos);
  CHECK(e.master_port == 29511);  // accel launch's MASTER_PORT
  CHECK(accel::token_job_id("another token") != e.job_id);
}

TEST_CASE("a job without identity and without MASTER_PORT gets one warning saying how to make it unique", "[env][job]") {
  const Vars mvapich{{"MV2_COMM_WORLD_RANK", "0"}, {"MV2_COMM_WORLD_SIZE", "2"}, {"MV2_COMM_WORLD_LOCAL_RANK", "0"},
                     {"MV2_COMM_WORLD_LOCAL_SIZE", "2"}};
  const auto e = read(mvapich);
  CHECK(e.job_id.empty());
  CHECK(e.job_token.empty());
  CHECK(e.master_port == 29500);
  CHECK(e.diagnostics.empty());
  CHECK(e.rendezvous_warning ==
        "no job identity (MVAPICH2: MVAPICH2 sets no job identity) and MASTER_PORT is unset, so every such job on 127.0.0.1 meets "
        "at port 29500 and two running at once would mix their ranks; give each job its own MASTER_PORT, or its own "
        "ACCEL_JOB_TOKEN (the port is then derived from it)");
  SECTION("MASTER_PORT silences it") { CHECK(read(with(mvapich, {{"MASTER_PORT", "31000"}})).rendezvous_warning.empty()); }
  SECTION("a single process needs no store and gets no warning") {
    CHECK(read(with(mvapich, {{"MV2_COMM_WORLD_SIZE", "1"}, {"MV2_COMM_WORLD_LOCAL_SIZE", "1"}})).rendezvous_warning.empty());
  }
  SECTION("ACCEL_JOB_TOKEN gives the job a name, a token and a port of its own") {
    const auto t = read(with(mvapich, {{"ACCEL_JOB_TOKEN", "job-a-secret"}}));
    CHECK(t.job_id == accel::token_job_id("job-a-secret", "token"));
    CHECK(t.job_token == "job-a-secret");
    CHECK(t.master_port == accel::job_port(t.job_id));
    CHECK(t.rendezvous_warning.empty());
    CHECK(read(with(mvapich, {{"ACCEL_JOB_TOKEN", "job-b-secret"}})).master_port != t.master_port);
  }
  SECTION("an identity adds ACCEL_JOB_TOKEN to the token when both are there") {
    CHECK(read(with(slurm_job(0, "21"), {{"ACCEL_JOB_TOKEN", "s3"}})).job_token == "slurm:21.0/s3");
  }
}

TEST_CASE("derived ports are deterministic, in range, and spread out", "[env][job]") {
  std::set<int> ports;
  for (int i = 0; i < 2000; ++i) {
    const int p = accel::job_port("slurm:" + std::to_string(1000 + i) + ".0");
    REQUIRE((p >= accel::job_port_first && p <= accel::job_port_last));
    ports.insert(p);
  }
  CHECK(ports.size() > 1900);  // 2000 draws from 31500 ports: about 63 collide
  CHECK(accel::job_port("openmpi:1682178049") == accel::job_port(std::string("openmpi:") + "1682178049"));
  static_assert(accel::job_port("slurm:1.0") == accel::job_port("slurm:1.0"));
}

TEST_CASE("the process launcher query names the peer of a Unix socket and ignores anything else", "[env][job]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  const auto query = accel::process_launcher_query();
  CHECK(query.pmi_fd_peer(sv[0]) == std::string(host) + "/" + std::to_string(::getpid()));
  ::close(sv[0]);
  ::close(sv[1]);
  CHECK_FALSE(query.pmi_fd_peer(sv[0]).has_value());  // closed
  CHECK_FALSE(query.pmi_fd_peer(-1).has_value());
  const int file = ::open("/dev/null", O_RDONLY);
  CHECK_FALSE(query.pmi_fd_peer(file).has_value());  // not a socket: never touched
  ::close(file);
}
