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
  libsentencepiece-dev               # tokenizers (data prepare, generate)
  python3-sentencepiece              # tokenizer tests: the reference library
  fortunes                           # the default training corpus
  openmpi-bin libopenmpi-dev         # the mpi-flat benchmark baseline
  chromium chromium-driver           # the console's browser test (headless)
  python3-torch                      # torch_ddp_test (DDP over 2 slices),
                                     # export_command_test (the HF reference)
  openssh-server openssh-client      # each host's sshd, run by its agent
                                     # (gcloud tpu-vm ssh/scp), and the ssh
                                     # that gcloud runs
)
# Daemons that the project's tests start themselves, never as services of
# this machine: a real Slurm cluster (netns_cluster.sh --slurm,
# slurm_cluster_test), a Prometheus server scraping the controller
# (metrics_scrape_test) and sshd (each agent runs its own, on its host's
# address).
slurm_packages=(slurmctld slurmd slurm-client munge)
packages+=("${slurm_packages[@]}" prometheus)
# The packages among them whose install starts a service, and those daemons'
# process names (pgrep -x takes one name, of at most 15 characters).
service_packages=(munge slurmctld slurmd prometheus openssh-server)
service_daemons=(munged slurmctld slurmd prometheus sshd)
is_service_package() { [[ " ${service_packages[*]} " == *" $1 "* ]]; }

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

# The postinst scripts of the service packages start their daemons
# (invoke-rc.d) where the init system allows it. When one of them is to be
# installed: a policy-rc.d that denies every start for the time of the
# install, unless one is there already (container images ship one); and
# whatever started all the same is stopped.
installs_service=0
for p in "${missing[@]}"; do
  if is_service_package "$p"; then installs_service=1; fi
done
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ "$installs_service" = 1 ] && [ ! -e "$policy" ]; then
  trap '$sudo rm -f "$policy"' EXIT
  printf '#!/bin/sh\n# install_deps.sh: no service starts while it installs\nexit 101\n' |
    $sudo tee "$policy" > /dev/null
  $sudo chmod 755 "$policy"
  made_policy=1
fi
service_daemon_pids() {
  local name
  for name in "${service_daemons[@]}"; do pgrep -x "$name" || true; done
}
daemons_before=$(service_daemon_pids)
code=0
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}" || code=$?
if [ "$made_policy" = 1 ]; then
  $sudo rm -f "$policy"
  trap - EXIT
fi
for pid in $(service_daemon_pids); do
  # Only what this install started, not a daemon that ran before.
  if ! grep -qx "$pid" <<<"$daemons_before"; then
    echo "install_deps: stopping $(ps -o comm= -p "$pid") (pid $pid), started by its package"
    $sudo kill -TERM "$pid" 2>/dev/null || true
  fi
done
# Where systemd runs them, the services that this install enabled stay off.
if [ -d /run/systemd/system ] && command -v systemctl > /dev/null; then
  for p in "${missing[@]}"; do
    if is_service_package "$p"; then
      unit=$p
      [ "$p" = openssh-server ] && unit=ssh   # its unit's name
      $sudo systemctl disable --now "$unit" > /dev/null 2>&1 || true
    fi
  done
fi
exit "$code"
