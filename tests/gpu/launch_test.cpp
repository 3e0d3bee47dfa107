// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// GPU tests for accel launch's checklist against the real driver ([.gpu]: run by tests/gpu/run.sh only).
#include <accel/runtime/devices.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "support/catch.hpp"

namespace {

struct Result {
  int code = -1;
  std::string output;  // stdout and stderr together
};

/// Runs `accel launch <args>` through the shell with CUDA_VISIBLE_DEVICES unset.
Result launch(const std::string& args) {
  const std::string cmd = "env -u CUDA_VISIBLE_DEVICES '" + std::string(ACCEL_TEST_CLI) + "' launch " + args + " 2>&1";
  Result r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.output += buf;
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

TEST_CASE("accel launch starts one process per real GPU by default", "[.gpu][launch]") {
  const int n = accel::visible_gpu_count();
  REQUIRE(n >= 1);
  const auto r = launch("--tee -- sh -c 'echo world=$WORLD_SIZE'");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, accel_test::contains("[rank 0] world=" + std::to_string(n)));
  CHECK_THAT(r.output, !accel_test::contains("warning"));
}

TEST_CASE("accel launch refuses more processes than real GPUs", "[.gpu][launch]") {
  const int n = accel::visible_gpu_count();
  REQUIRE(n >= 1);
  const auto r = launch("--num_processes " + std::to_string(n + 1) + " -- true");
  CHECK(r.code == 3);
  CHECK_THAT(r.output, accel_test::contains(std::to_string(n + 1) + " processes but only " + std::to_string(n) + " GPU"));
}

TEST_CASE("accel launch refuses gpu_ids naming a GPU the machine does not have", "[.gpu][launch]") {
  const int n = accel::visible_gpu_count();
  REQUIRE(n >= 1);
  const auto r = launch("--gpu_ids " + std::to_string(n) + " -- true");
  CHECK(r.code == 3);
  CHECK_THAT(r.output, accel_test::contains("names GPU " + std::to_string(n) + ", but this machine has"));
}

TEST_CASE("accel launch passes gpu_ids 0 to the child as CUDA_VISIBLE_DEVICES", "[.gpu][launch]") {
  REQUIRE(accel::visible_gpu_count() >= 1);
  const auto r = launch("--gpu_ids 0 --tee -- sh -c 'echo cvd=$CUDA_VISIBLE_DEVICES'");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, accel_test::contains("[rank 0] cvd=0"));
  CHECK_THAT(r.output, !accel_test::contains("warning"));
}
