// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for launch tests: prints the launcher's variables (NAME=value or NAME unset) and its arguments
// on stdout, one line to stderr, and whatever it reads from stdin when asked to.
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  const char* names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT", "ACCEL_LAUNCHED", "ACCEL_JOB_TOKEN", "ACCEL_TIMEOUT_S",
                         "ACCEL_USE_CPU", "ACCEL_GPUS_PER_PROCESS", "ACCEL_STORE", "CUDA_VISIBLE_DEVICES", "SLURM_PROCID", "ACCEL_TEST_MARKER"};
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v) std::printf("%s=%s\n", n, v);
    else std::printf("%s unset\n", n);
  }
  bool echo_stdin = false;
  for (int i = 1; i < argc; ++i) {
    std::printf("arg%d=%s\n", i, argv[i]);
    if (std::strcmp(argv[i], "--echo-stdin") == 0) echo_stdin = true;
  }
  if (echo_stdin) {
    char line[256];
    while (std::fgets(line, sizeof line, stdin)) std::printf("stdin: %s", line);
  }
  std::fprintf(stderr, "stderr of rank %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?");
  return 0;
}
