// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Tests for the accel command's dispatch and `accel env`, through the real binary.
#include <accel/runtime/version.hpp>

#include "support/catch.hpp"
#include "support/run_command.hpp"

using accel_test::accel_cli;
using accel_test::run_command;

TEST_CASE("accel --help lists the commands and exits 0", "[cli]") {
  const auto r = run_command(accel_cli("--help"));
  CHECK(r.status == 0);
  CHECK_THAT(r.output, accel_test::contains("usage: accel <command>"));
  CHECK_THAT(r.output, accel_test::contains("  env "));
}

TEST_CASE("accel without a command or with an unknown one is a usage error (exit 2)", "[cli]") {
  CHECK(run_command(accel_cli("2>/dev/null")).status == 2);
  const auto r = run_command(accel_cli("frobnicate 2>&1"));
  CHECK(r.status == 2);
  CHECK_THAT(r.output, accel_test::contains("accel: unknown command 'frobnicate'"));
}

TEST_CASE("every accel command has --help", "[cli]") {
  for (const std::string command : {"version", "launch", "env", "plan", "estimate-memory", "load"}) {
    INFO(command);
    const auto r = run_command(accel_cli(command + " --help"));
    CHECK(r.status == 0);
    CHECK_THAT(r.output, accel_test::contains("usage: accel " + command));
  }
}

TEST_CASE("accel --version prints the version", "[cli]") {
  const auto r = run_command(accel_cli("--version"));
  CHECK(r.status == 0);
  CHECK(r.output == std::string("accel ") + ACCEL_VERSION_STRING + "\n");
}

TEST_CASE("accel env describes a plain process and its CUDA_VISIBLE_DEVICES", "[cli]") {
  const auto r = run_command("env -u RANK -u WORLD_SIZE CUDA_VISIBLE_DEVICES=3,3 " + accel_cli("env"));
  CHECK(r.status == 0);
  CHECK_THAT(r.output, accel_test::contains("launcher: none (single process)"));
  CHECK_THAT(r.output, accel_test::contains("'3' is listed twice"));
  CHECK_THAT(r.output, accel_test::contains("this process: process=0/1 local=0/1 device=cpu"));
}

TEST_CASE("accel env reads torchrun variables and reports malformed ones with exit 3", "[cli]") {
  const auto ok = run_command("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 " + accel_cli("env"));
  CHECK_THAT(ok.output, accel_test::contains("launcher: torchrun"));
  CHECK_THAT(ok.output, accel_test::contains("rank 1 of 2, local rank 1 of 2"));
  CHECK_THAT(ok.output, accel_test::contains("store: 127.0.0.1:29500, hosted by rank 0"));
  const auto bad = run_command("RANK=abc WORLD_SIZE=2 " + accel_cli("env"));
  CHECK(bad.status == 3);
  CHECK_THAT(bad.output, accel_test::contains("[accel.config] RANK='abc' is not a non-negative integer"));
}

TEST_CASE("accel env under torchrun shows the store's effective port, one above torchrun's agent store", "[cli]") {
  const auto r = run_command("env -u ACCEL_STORE RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
                             "MASTER_PORT=29650 TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RUN_ID=none ACCEL_JOIN_TIMEOUT_S=7 " +
                             accel_cli("env"));
  CHECK(r.status == 0);
  CHECK_THAT(r.output, accel_test::contains("rendezvous: 127.0.0.1:29650"));
  CHECK_THAT(r.output, accel_test::contains("store: 127.0.0.1:29651, hosted by rank 0 (MASTER_PORT+1: torchrun's agent store holds "
                                            "MASTER_PORT)"));
  CHECK_THAT(r.output, accel_test::contains("join timeout: 7.0 s (ACCEL_JOIN_TIMEOUT_S)"));
}

TEST_CASE("accel env --help explains itself and rejects unknown options", "[cli]") {
  CHECK_THAT(run_command(accel_cli("env --help")).output, accel_test::contains("usage: accel env"));
  const auto r = run_command(accel_cli("env --bogus 2>&1"));
  CHECK(r.status == 2);
  CHECK_THAT(r.output, accel_test::contains("unknown option '--bogus'"));
}
