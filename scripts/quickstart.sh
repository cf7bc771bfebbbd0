#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on the local
# default: the seed's shardings workload on two slices (one CPU device
# each) of this machine, data-parallel across them over DCN. Extra
# arguments go to `multislice shardings` (see its --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
exec build/bin/multislice shardings --dcn_data_parallelism 2 "$@"
