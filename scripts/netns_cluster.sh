#!/usr/bin/env bash
# A multislice cluster on one machine: hosts as network namespaces, each with
# its own address, links between hosts shaped as a data-center network.
# See --help and README.md ("A cluster in network namespaces").
set -euo pipefail

prog=netns_cluster.sh
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

usage() {
  cat <<'EOF'
Usage: sudo scripts/netns_cluster.sh [options] -- COMMAND [ARGS...]

Builds a cluster of network namespaces, runs COMMAND in the controller's
namespace with MULTISLICE_CONTROLLER and MULTISLICE_TOKEN_FILE set, and
removes everything it made when COMMAND ends (also on failure or Ctrl-C):

  <prefix>-sw    a switch: one bridge, nothing else
  <prefix>-ctl   10.201.0.1: multislice controller (and the Redis
                 coordinator it starts for agents on several addresses)
  <prefix>-h1..  10.201.1.1, 10.201.1.2, ...: one multislice agent each,
                 registered as a host of --accelerator_type in zone local-a

Each host's link to the switch is shaped with `tc tbf` to --dcn_mbit in both
directions (what a host sends and what it receives), so every byte between
hosts crosses a data-center network of that rate; the controller's link is
not shaped. Nothing outside the namespaces it creates is touched: the veth
pairs are made inside them, and the only files are under --workdir.

Options:
  --hosts N              hosts (agents); default 3 (2 slices and a spare)
  --accelerator_type T   the hosts' type; default cpu-1
  --dcn_mbit R           link rate between hosts, Mbit/s; default 1000;
                         0: not shaped
  --prefix P             namespace prefix; default ms
  --workdir DIR          controller and agents' files; default a new
                         directory under /tmp, removed at the end
  --keep_workdir         keep --workdir (logs) at the end
  -h, --help             this text

Example (the seed's tutorial on 2 slices over a 1 Gbit/s DCN, a spare host
for repairs):
  sudo scripts/netns_cluster.sh --hosts 3 -- bash -c '
    multislice queued-resources create qr --accelerator-type cpu-1 \
        --node-count 2 --zone local-a
    multislice queued-resources ssh qr --zone local-a --node=all \
        --worker=all --command "hostname -I"
    multislice queued-resources delete qr --zone local-a --force --quiet'
EOF
}

hosts=3 type=cpu-1 dcn_mbit=1000 prefix=ms workdir="" keep_workdir=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --accelerator_type|--accelerator-type) type="$2"; shift 2 ;;
    --dcn_mbit|--dcn-mbit) dcn_mbit="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --keep_workdir|--keep-workdir) keep_workdir=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "$prog: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "$prog: no COMMAND after -- (see --help)" >&2; exit 2; }
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || {
  echo "$prog: --hosts: '$hosts' is not a number from 1 to 200" >&2; exit 2; }
[[ "$dcn_mbit" =~ ^[0-9]+$ ]] || {
  echo "$prog: --dcn_mbit: '$dcn_mbit' is not a whole number" >&2; exit 2; }
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,5}$ ]] || {
  echo "$prog: --prefix: '$prefix' is not 1 to 6 lower-case letters and digits" >&2
  exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "$prog: needs root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || {
  echo "$prog: needs ip and tc (Debian's iproute2)" >&2; exit 2; }

bin="$root/build/bin/multislice"
[ -x "$bin" ] || { echo "$prog: $bin is missing: run scripts/build.sh" >&2; exit 2; }
for ns in "$prefix-sw" "$prefix-ctl"; do
  if ip netns list | grep -qw "$ns"; then
    echo "$prog: namespace $ns exists already (another cluster, or one" \
         "left by a killed run: ip netns del $ns)" >&2
    exit 2
  fi
done
made_workdir=0
if [ -z "$workdir" ]; then
  workdir="$(mktemp -d /tmp/multislice-cluster-XXXXXX)"
  made_workdir=1
fi
mkdir -p "$workdir"

namespaces=()
pids=()
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  for ns in "${namespaces[@]}"; do
    # Whatever still runs in it (a worker that left its group) goes too.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ "$made_workdir" = 1 ] && [ "$keep_workdir" = 0 ]; then
    rm -rf "$workdir"
  elif [ "$code" -ne 0 ]; then
    echo "$prog: logs in $workdir" >&2
  fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

add_ns() { ip netns add "$1"; namespaces+=("$1"); ip -n "$1" link set lo up; }

# The switch, then one namespace per member with a veth into the bridge.
sw="$prefix-sw"
add_ns "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up

# join NS PORT ADDRESS SHAPE: eth0 in NS, its peer PORT on the bridge.
join() {
  local ns="$1" port="$2" address="$3" shape="$4"
  ip -n "$sw" link add "$port" type veth peer name eth0 netns "$ns"
  ip -n "$sw" link set "$port" master br0 up
  ip -n "$ns" addr add "$address/16" dev eth0
  ip -n "$ns" link set eth0 up
  if [ "$shape" = 1 ] && [ "$dcn_mbit" -gt 0 ]; then
    # Both directions: the host's egress (eth0) and its ingress (the
    # bridge port's egress). Burst: 10 ms at the rate, at least 32 KiB.
    local burst=$(( dcn_mbit * 1000000 / 8 / 100 ))
    [ "$burst" -ge 32768 ] || burst=32768
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${dcn_mbit}mbit" \
      burst "$burst" latency 50ms
    ip netns exec "$sw" tc qdisc add dev "$port" root tbf rate "${dcn_mbit}mbit" \
      burst "$burst" latency 50ms
  fi
}

ctl="$prefix-ctl"
add_ns "$ctl"
join "$ctl" "p-ctl" 10.201.0.1 0
echo "$prog: controller at http://10.201.0.1:8470 in namespace $ctl, files in $workdir"
ip netns exec "$ctl" "$bin" controller --bind 10.201.0.1 --port 8470 \
  --data-dir "$workdir/controller" > "$workdir/controller.log" 2>&1 &
pids+=($!)
token="$workdir/controller/token"
for _ in $(seq 300); do
  [ -s "$workdir/controller/agent-token" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$workdir/controller.log" >&2; exit 1; }
  sleep 0.1
done
[ -s "$workdir/controller/agent-token" ] || {
  echo "$prog: the controller did not start within 30 s" >&2
  cat "$workdir/controller.log" >&2; exit 1; }

for h in $(seq "$hosts"); do
  ns="$prefix-h$h" address="10.201.1.$h"
  add_ns "$ns"
  join "$ns" "p-h$h" "$address" 1
  ip netns exec "$ns" "$bin" agent --controller http://10.201.0.1:8470 \
    --token-file "$workdir/controller/agent-token" --accelerator-type "$type" \
    --zone local-a --hostname "h$h" --bind "$address" \
    --workdir "$workdir/hosts/h$h" > "$workdir/agent-h$h.log" 2>&1 &
  pids+=($!)
done
echo "$prog: $hosts hosts ($type) at 10.201.1.1-$hosts in namespaces" \
     "$prefix-h1..$prefix-h$hosts, links shaped to $dcn_mbit Mbit/s"

export MULTISLICE_CONTROLLER=http://10.201.0.1:8470 MULTISLICE_TOKEN_FILE="$token"
export PATH="$root/build/bin:$PATH"
ip netns exec "$ctl" "$bin" admin wait-ready --timeout_seconds 30 >/dev/null
# Every agent registered before COMMAND runs.
for _ in $(seq 300); do
  registered=$(ip netns exec "$ctl" "$bin" admin hosts | grep -c ' OK ' || true)
  [ "$registered" -ge "$hosts" ] && break
  sleep 0.1
done
[ "$registered" -ge "$hosts" ] || {
  echo "$prog: only $registered of $hosts agents registered within 30 s" >&2
  tail -n 5 "$workdir"/agent-h*.log >&2; exit 1; }
set +e
ip netns exec "$ctl" "$@"
code=$?
set -e
exit "$code"
