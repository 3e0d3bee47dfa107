// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Tests for env.hpp: every launcher convention, precedence, and malformed values.
#include <accel/runtime/env.hpp>

#include <cstdlib>

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

TEST_CASE("the SLURM helpers parse host lists and task counts", "[env]") {
  CHECK(accel::detail::slurm_first_host("node[01-04,07],gpu1") == "node01");
  CHECK(accel::detail::slurm_first_host("gpu1,node[2-5]") == "gpu1");
  CHECK(accel::detail::slurm_first_host("tux[12]") == "tux12");
  CHECK(accel::detail::slurm_expand_counts("2(x3),1", "X") == std::vector<int>{2, 2, 2, 1});
  REQUIRE_THROWS_AS(accel::detail::slurm_expand_counts("2(x0)", "X"), accel::config_error);
}

TEST_CASE("the process environment source reads real variables", "[env]") {
  ::setenv("ACCEL_TEST_PROBE_VAR", "42", 1);
  CHECK(accel::process_env()("ACCEL_TEST_PROBE_VAR") == "42");
  ::unsetenv("ACCEL_TEST_PROBE_VAR");
  CHECK_FALSE(accel::process_env()("ACCEL_TEST_PROBE_VAR").has_value());
}
