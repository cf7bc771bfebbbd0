#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on the local
# default: two slices of two CPU devices on this machine. Until the
# `shardings` workload lands, the main job is the collectives benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec build/bin/multislice bench collectives --num_slices 2 \
  --accelerator_type cpu-2 --maxbytes 64M "$@"
