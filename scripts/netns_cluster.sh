#!/usr/bin/env bash
# A multislice cluster on one machine: hosts as network namespaces, each with
# its own address, grouped into pods whose hosts are joined by "ICI" (fast
# links) while links between pods are shaped as a data-center network.
# See --help and README.md ("A cluster in network namespaces").
set -euo pipefail

prog=netns_cluster.sh
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

usage() {
  cat <<'EOF'
Usage: sudo scripts/netns_cluster.sh [options] -- COMMAND [ARGS...]

Builds a cluster of network namespaces, runs COMMAND in the controller's
namespace with MULTISLICE_CONTROLLER and MULTISLICE_TOKEN_FILE set (and
MULTISLICE_CLUSTER_HOSTS: one "NAME NAMESPACE ADDRESS POD" line per host),
and removes everything it made when COMMAND ends (also on failure, Ctrl-C or
SIGTERM):

  <prefix>-sw    a switch: one bridge, nothing else
  <prefix>-ctl   10.201.0.1: multislice controller (and the Redis
                 coordinator it starts for agents on several addresses)
  <prefix>-h1..  one multislice agent each, registered as a host of
                 --accelerator_type in zone local-a with --ici-domain pod<P>

Hosts are grouped into pods of --hosts_per_slice hosts, pod P's hosts at
10.201.(10+P).N (host hN): h1..hH form pod0, the next H pod1, and so on;
hosts left over after the whole pods (spares) are dealt to the pods in
turn from pod0. So --hosts 5 --hosts_per_slice 2 gives pod0 = h1, h2, h5
(10.201.10.1, .2, .5) and pod1 = h3, h4 (10.201.11.3, .4). A pod is one
ICI domain: the controller puts each multi-host slice on one pod's hosts,
and repairs it on one pod's hosts too.

Links inside a pod and to the controller are not shaped. Traffic between
hosts of different pods is shaped with tc to --dcn_mbit in both directions:
each host's egress (eth0) and its ingress (its bridge port's egress) carry
an htb qdisc whose u32 filters send packets to or from another pod's subnet
through a class of that rate; everything else takes htb's direct, unshaped
path. Nothing outside the namespaces it creates is touched: the veth pairs
are made inside them, and the only files are under --workdir.

Options:
  --hosts N              hosts (agents); default 3 (2 slices and a spare)
  --accelerator_type T   the hosts' type; default cpu-1
  --hosts_per_slice H    hosts of a pod; default T's hosts per slice (v4-16:
                         2, v5litepod-16: 4, cpu-N: 1, so each cpu host is a
                         pod of its own and every link between hosts shaped)
  --dcn_mbit R           link rate between pods, Mbit/s; default 1000;
                         0: not shaped
  --check_links          before COMMAND, measure h1's link to a host of its
                         pod, to one of another pod and to the controller
                         (a TCP transfer timed by the receiver, python3);
                         exit 1 unless the cross-pod rate is within 60-115 %
                         of R and the others above 2 R
  --prefix P             namespace prefix; default ms
  --workdir DIR          controller and agents' files; default a new
                         directory under /tmp, removed at the end
  --keep_workdir         keep --workdir (logs) at the end
  -h, --help             this text

Environment: MULTISLICE_BINARY, the multislice binary to run (default
build/bin/multislice of this checkout); its folder goes first on COMMAND's
PATH.

Example (the seed's tutorial on 2 slices of v4-16, 2 hosts of 4 chips each,
over a 1 Gbit/s DCN, a spare host for repairs):
  sudo scripts/netns_cluster.sh --hosts 5 --accelerator_type v4-16 -- bash -c '
    multislice queued-resources create qr --accelerator-type v4-16 \
        --node-count 2 --zone local-a
    multislice queued-resources ssh qr --zone local-a --node=all \
        --worker=all --command "hostname -I"
    multislice queued-resources delete qr --zone local-a --force --quiet'
EOF
}

hosts=3 type=cpu-1 hosts_per_slice="" dcn_mbit=1000 prefix=ms workdir=""
keep_workdir=0 check_links=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="$2"; shift 2 ;;
    --accelerator_type|--accelerator-type) type="$2"; shift 2 ;;
    --hosts_per_slice|--hosts-per-slice) hosts_per_slice="$2"; shift 2 ;;
    --dcn_mbit|--dcn-mbit) dcn_mbit="$2"; shift 2 ;;
    --check_links|--check-links) check_links=1; shift ;;
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
if [ "$check_links" = 1 ] && ! command -v python3 >/dev/null; then
  echo "$prog: --check_links needs python3" >&2; exit 2
fi

bin="${MULTISLICE_BINARY:-$root/build/bin/multislice}"
[ -x "$bin" ] || { echo "$prog: $bin is missing: run scripts/build.sh" >&2; exit 2; }
if [ -z "$hosts_per_slice" ]; then
  # The type's hosts per slice: the distinct hosts of its one-slice mesh.
  mesh_json=$("$bin" mesh --accelerator_type "$type" --ici_fsdp_parallelism -1 \
    --json 2>&1) || {
    echo "$prog: --accelerator_type: $mesh_json" >&2; exit 2; }
  hosts_per_slice=$(grep -o '"host":[0-9]*' <<<"$mesh_json" | sort -u | wc -l)
fi
[[ "$hosts_per_slice" =~ ^[0-9]+$ ]] && [ "$hosts_per_slice" -ge 1 ] &&
  [ "$hosts_per_slice" -le 200 ] || {
  echo "$prog: --hosts_per_slice: '$hosts_per_slice' is not a number from 1 to 200" >&2
  exit 2; }
pods=$(( hosts / hosts_per_slice ))
[ "$pods" -ge 1 ] || pods=1
[ "$pods" -le 200 ] || {
  echo "$prog: --hosts $hosts makes $pods pods of $hosts_per_slice; at most 200" >&2
  exit 2; }

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
pids=()  # started in this order; stopped in the reverse one
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  local i pid
  # COMMAND first, then the agents (each stops its workers), the controller
  # last.
  for (( i=${#pids[@]}-1; i>=0; i-- )); do
    pid=${pids[$i]}
    kill -TERM "$pid" 2>/dev/null || continue
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

# pod_of H: the pod of host hH (see --help).
pod_of() {
  local i=$(( $1 - 1 ))
  if [ "$i" -lt $(( pods * hosts_per_slice )) ]; then
    echo $(( i / hosts_per_slice ))
  else
    echo $(( (i - pods * hosts_per_slice) % pods ))
  fi
}

# shape NS DEV MATCH POD: DEV's egress in NS sends packets whose MATCH
# address ("dst" for what a host sends, "src" for what it receives) is in
# another pod's subnet through a class of --dcn_mbit; its own pod's subnet
# and the controller's take htb's direct path (classid 1:0), as does
# whatever no filter classifies (ARP). 10.201.0.0/24 is the controller's.
shape() {
  local ns="$1" dev="$2" match="$3" pod="$4"
  # Burst: 10 ms at the rate, at least 32 KiB.
  local burst=$(( dcn_mbit * 1000000 / 8 / 100 ))
  [ "$burst" -ge 32768 ] || burst=32768
  ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb
  ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:2 htb \
    rate "${dcn_mbit}mbit" ceil "${dcn_mbit}mbit" burst "$burst" \
    cburst "$burst" quantum 60000
  ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 1 \
    u32 match ip "$match" "10.201.$((10 + pod)).0/24" flowid 1:0
  ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 2 \
    u32 match ip "$match" 10.201.0.0/24 flowid 1:0
  ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 3 \
    u32 match ip "$match" 10.201.0.0/16 flowid 1:2
}

# join NS PORT ADDRESS POD: eth0 in NS, its peer PORT on the bridge; POD
# (-1 for the controller: not shaped) picks what is shaped.
join() {
  local ns="$1" port="$2" address="$3" pod="$4"
  ip -n "$sw" link add "$port" type veth peer name eth0 netns "$ns"
  ip -n "$sw" link set "$port" master br0 up
  ip -n "$ns" addr add "$address/16" dev eth0
  ip -n "$ns" link set eth0 up
  if [ "$pod" -ge 0 ] && [ "$dcn_mbit" -gt 0 ] && [ "$pods" -gt 1 ]; then
    shape "$ns" eth0 dst "$pod"      # what the host sends
    shape "$sw" "$port" src "$pod"   # what it receives
  fi
}

ctl="$prefix-ctl"
add_ns "$ctl"
join "$ctl" "p-ctl" 10.201.0.1 -1
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

cluster_hosts=""
declare -A address_of pod_members
for h in $(seq "$hosts"); do
  pod=$(pod_of "$h")
  ns="$prefix-h$h" address="10.201.$((10 + pod)).$h"
  address_of[$h]=$address
  pod_members[$pod]="${pod_members[$pod]:-}${pod_members[$pod]:+,}h$h"
  cluster_hosts+="h$h $ns $address pod$pod"$'\n'
  add_ns "$ns"
  join "$ns" "p-h$h" "$address" "$pod"
  ip netns exec "$ns" "$bin" agent --controller http://10.201.0.1:8470 \
    --token-file "$workdir/controller/agent-token" --accelerator-type "$type" \
    --zone local-a --ici-domain "pod$pod" --hostname "h$h" --bind "$address" \
    --workdir "$workdir/hosts/h$h" > "$workdir/agent-h$h.log" 2>&1 &
  pids+=($!)
done
pod_list=""
for p in $(seq 0 $(( pods - 1 ))); do pod_list+=" pod$p=${pod_members[$p]:-}"; done
if [ "$pods" -gt 1 ] && [ "$dcn_mbit" -gt 0 ]; then
  shaping="links between pods shaped to $dcn_mbit Mbit/s"
else
  shaping="no link shaped"
fi
echo "$prog: $hosts hosts ($type, $hosts_per_slice per slice) in namespaces" \
     "$prefix-h1..$prefix-h$hosts; pods (ICI domains):$pod_list; $shaping"

export MULTISLICE_CONTROLLER=http://10.201.0.1:8470 MULTISLICE_TOKEN_FILE="$token"
export MULTISLICE_CLUSTER_HOSTS="$cluster_hosts"
export PATH="$(dirname "$bin"):$PATH"
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

# measure SRC_NS DST_NS DST_ADDRESS BYTES: prints the rate in Mbit/s (the
# server, if the sender failed, is killed with its namespace at the end).
measure() {
  local ready="$workdir/link-ready"
  rm -f "$ready"
  ip netns exec "$2" timeout 60 python3 "$here/netns_link_rate.py" serve "$3" \
    5301 "$ready" &
  local server=$!
  for _ in $(seq 100); do [ -e "$ready" ] && break; sleep 0.05; done
  ip netns exec "$1" timeout 60 python3 "$here/netns_link_rate.py" send "$3" \
    5301 "$4" || return 1
  wait "$server"
}
if [ "$check_links" = 1 ]; then
  inside="" across=""
  for h in $(seq 2 "$hosts"); do
    if [ "$(pod_of "$h")" = "$(pod_of 1)" ]; then
      [ -n "$inside" ] || inside=$h
    else
      [ -n "$across" ] || across=$h
    fi
  done
  # Shaped transfers last about 1 s; the fast ones 64 MiB.
  fast_bytes=$(( 64 << 20 ))
  shaped_bytes=$(( dcn_mbit * 1000000 / 8 ))
  [ "$shaped_bytes" -ge $(( 4 << 20 )) ] || shaped_bytes=$(( 4 << 20 ))
  failures=()
  check() {  # check NAME RATE LOW HIGH
    local verdict=ok
    if [ "$2" -lt "$3" ] || { [ -n "$4" ] && [ "$2" -gt "$4" ]; }; then
      verdict="expected ${3}${4:+-$4}"
      failures+=("$1: $2 Mbit/s, $verdict")
    fi
    echo "$prog: link $1: $2 Mbit/s ($verdict)"
  }
  rate=$(measure "$prefix-h1" "$ctl" 10.201.0.1 "$fast_bytes") || exit 1
  check "h1 -> controller (not shaped)" "$rate" $(( 2 * dcn_mbit )) ""
  if [ -n "$inside" ]; then
    rate=$(measure "$prefix-h1" "$prefix-h$inside" "${address_of[$inside]}" \
      "$fast_bytes") || exit 1
    check "h1 -> h$inside (inside pod$(pod_of 1))" "$rate" $(( 2 * dcn_mbit )) ""
  fi
  if [ -n "$across" ]; then
    if [ "$dcn_mbit" -gt 0 ]; then
      rate=$(measure "$prefix-h1" "$prefix-h$across" "${address_of[$across]}" \
        "$shaped_bytes") || exit 1
      check "h1 -> h$across (pod$(pod_of 1) to pod$(pod_of "$across"), shaped to $dcn_mbit)" \
        "$rate" $(( dcn_mbit * 60 / 100 )) $(( dcn_mbit * 115 / 100 ))
      rate=$(measure "$prefix-h$across" "$prefix-h1" "${address_of[1]}" \
        "$shaped_bytes") || exit 1
      check "h$across -> h1 (shaped to $dcn_mbit)" \
        "$rate" $(( dcn_mbit * 60 / 100 )) $(( dcn_mbit * 115 / 100 ))
    fi
  fi
  if [ "${#failures[@]}" -gt 0 ]; then
    echo "$prog: --check_links: ${failures[*]}" >&2
    exit 1
  fi
fi

# COMMAND in the background, so that a signal to this script runs the
# cleanup at once (bash runs traps only between commands); fd 3 keeps its
# standard input (a background job's would be /dev/null).
exec 3<&0
ip netns exec "$ctl" "$@" <&3 &
pids+=($!)
set +e
wait "${pids[-1]}"
code=$?
set -e
exit "$code"
