#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prepares, on a normal machine, the test-only dependencies the GPU check needs on a machine with
# no package registry: Catch2 and nlohmann/json (headers, CMake packages, Catch2's main library),
# copied from this machine's Debian packages into .offline-deps/ (ignored by git). Pass the folder
# along with the tree (e.g. the device runner's carry list); tests/gpu/run.sh finds it there.
# Usage: tools/prepare-offline-deps.sh [output folder]   (default: .offline-deps at the repository root)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/.offline-deps}
case "${1:-}" in -h|--help) sed -n '2,7p' "$0"; exit 0 ;; esac
"$root/tools/setup-deps.sh"
rm -rf "$out"
mkdir -p "$out/include" "$out/lib/cmake" "$out/share/cmake"
copy() {  # copy <what> <from> <to>: fails loudly when a package's file moved
  [[ -e "$2" ]] || { echo "prepare-offline-deps: $1 not found at $2" >&2; exit 1; }
  cp -a "$2" "$3"
}
copy "Catch2 headers" /usr/include/catch2 "$out/include/"
copy "Catch2 CMake package" /usr/lib/cmake/Catch2 "$out/lib/cmake/"
copy "Catch2 main library" /usr/lib/libCatch2WithMain.a "$out/lib/"
copy "nlohmann/json headers" /usr/include/nlohmann "$out/include/"
copy "nlohmann/json CMake package" /usr/share/cmake/nlohmann_json "$out/share/cmake/"
{
  echo "Prepared $(date -u +%Y-%m-%dT%H:%MZ) from Debian packages:"
  dpkg-query -W -f='  ${Package} ${Version}\n' catch2 nlohmann-json3-dev
} >"$out/VERSIONS"
du -sh "$out" | awk '{print "prepare-offline-deps: " $1 " in " $2}'
