#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what building and testing accel needs, from Debian packages, when it is missing
# (clang is for the libFuzzer harnesses, which the test suite runs briefly; openmpi-bin, mpich,
# SLURM (munge, slurmctld, slurmd, slurm-client) and python3-torch (torchrun) for the tests that run
# jobs under the real launchers: the test suite starts a private one-host SLURM cluster itself).
# Usage: tools/setup-deps.sh [--bench]   (--bench adds google benchmark and numpy)
set -euo pipefail
pkgs=(cmake g++ make python3 nlohmann-json3-dev catch2 clang libclang-rt-14-dev openmpi-bin mpich
      munge slurmctld slurmd slurm-client python3-torch iproute2)
if [[ "${1:-}" == "--bench" ]]; then pkgs+=(libbenchmark-dev python3-numpy); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "accel setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
