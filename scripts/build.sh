#!/usr/bin/env bash
# Configures and builds multislice into build/ (Ninja, RelWithDebInfo):
# everything, or only the targets named (e.g. `scripts/build.sh multislice`).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
