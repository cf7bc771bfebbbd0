#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through CTest.
#
# The tests of compute/, model/ and train/ and the train and shardings command
# tests run three times: at this CPU's own ISA level, then (CTest names
# "Suite.Test@avx2" and "...@baseline", labels isa-avx2 and isa-baseline)
# under MULTISLICE_MAX_ISA=avx2 and =baseline, which make the project's
# kernels and oneDNN behave as on a CPU with only that level. So a machine
# with AVX-512 or AMX proves the AVX2 and x86-64 baseline paths on every run.
# cluster_tutorial_test (label cluster) builds network namespaces, and
# slurm_cluster_test (label slurm) a Slurm cluster in them: they run as root
# and are reported as skipped otherwise.
# Extra arguments go to ctest (e.g. -L isa-avx2, -LE cluster, or -R Gemm).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/install_npm_test_deps.sh || echo "test.sh: the npm packages are missing: google_clients_test will fail" >&2
cd build
ctest --output-on-failure --timeout 900 "$@"
