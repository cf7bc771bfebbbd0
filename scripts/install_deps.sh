#!/usr/bin/env bash
# Installs, with apt, the Debian 12 packages multislice needs to build, test
# and run, skipping those already installed. Safe to run again.
#   --peer  also OpenBLAS, for the f32 matmuls of the benchmarks' PyTorch
#           peer (bench/compare_shardings.sh)
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config   # build
  libgtest-dev                       # tests
  libgloo-dev libhiredis-dev         # DCN transport and its Redis store
  libcpp-httplib-dev libsqlite3-dev  # control plane: HTTP API, state store
  redis-server                       # the redis:// rendezvous store
  libcli11-dev nlohmann-json3-dev    # command line, JSON
  libdnnl-dev                        # matmul kernels (oneDNN)
  libyaml-cpp-dev                    # train configs (configs/*.yml)
  fortunes                           # the default training corpus
  openmpi-bin libopenmpi-dev         # the mpi-flat benchmark baseline
  chromium chromium-driver           # the console's browser test (headless)
  python3-torch                      # torch_ddp_test (DDP over 2 slices)
)

if [ "${1:-}" = "--peer" ]; then
  packages+=(libopenblas0-pthread)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || {
    echo "install_deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  }
  sudo="sudo"
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
