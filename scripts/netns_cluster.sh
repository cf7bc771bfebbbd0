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
       sudo scripts/netns_cluster.sh --slurm [options] -- COMMAND [ARGS...]

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
are made inside them, and the only files are under --workdir (and, with
--slurm, /etc/netns/<prefix>-*/hosts).

With --slurm the cluster is a real Slurm cluster instead (Debian 12's
slurmctld, slurmd, slurm-client and munge: scripts/install_deps.sh), and no
multislice controller or agent runs:

  munged         in <prefix>-ctl, one for the whole cluster (its nodes
                 share this machine's files): its key generated into
                 --workdir/munge/, its socket there (slurm.conf's
                 AuthInfo=socket=..., so every daemon and command uses it)
  slurmctld      in <prefix>-ctl (SlurmctldHost=ctl(10.201.0.1)), its
                 state, log and pid file in --workdir/slurm/
  slurmd         one per host namespace, NodeName hN, NodeAddr its address,
                 CPUs=1, its spool, log and pid file in --workdir/slurm/hN/
  slurm.conf     --workdir/slurm/slurm.conf: partition "all" (the default)
                 holding every node; ReturnToService=2 (a node whose slurmd
                 comes back is used again); SlurmdTimeout=5 and
                 MessageTimeout=5 (a crashed node is "not responding" about
                 8 s after the crash, DOWN about 16 s after);
                 ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
                 no cgroups used (PID 1 need not be systemd; slurmd 22.05
                 loads cgroup/v1, cgroup.conf, and never calls it);
                 SlurmUser=root;
                 AuthInfo cred_expire=5, Slurm's minimum (a requeued job
                 starts again 6 s after its requeue at the earliest:
                 cred_expire + 1)

Each daemon runs with its own host name (a UTS namespace: ctl, hN), and
every namespace resolves ctl and h1.. to their addresses: ip netns exec
bind-mounts /etc/netns/<namespace>/hosts, written here and removed at the
end. COMMAND starts once sinfo shows every node idle, in <prefix>-ctl with
hostname ctl, SLURM_CONF set (srun, sbatch, sinfo, squeue, scontrol work
as on any Slurm cluster), MULTISLICE_CLUSTER_HOSTS as above, and
MULTISLICE_SLURM_NODE, a script: "$MULTISLICE_SLURM_NODE crash hN" kills
everything on node hN (its slurmd, slurmstepd and tasks: a node failure),
"$MULTISLICE_SLURM_NODE start hN" starts its slurmd again. The daemons'
logs are in --workdir/slurm/ (--keep_workdir keeps them).

Options:
  --slurm                a Slurm cluster (see above)
  --hosts N              hosts (agents, or slurmd with --slurm); default 3
                         (2 slices and a spare)
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

Example (Slurm: 2 slices of v4-16 on 4 nodes, without a controller; the
job's rendezvous files and runs/ go to the submit directory, here a new
one; see README.md, "A Slurm cluster in network namespaces"):
  sudo scripts/netns_cluster.sh --slurm --hosts 4 --accelerator_type v4-16 \
    -- bash -c 'sinfo; srun -N 4 --ntasks-per-node 1 hostname -I
    cd "$(mktemp -d)" && srun -N 4 --ntasks-per-node 1 multislice train \
        "$0" --num_slices 2 --accelerator_type v4-16 steps=20 \
        per_device_batch_size=2' "$PWD/configs/gpt2-fortunes.yml"
EOF
}

hosts=3 type=cpu-1 hosts_per_slice="" dcn_mbit=1000 prefix=ms workdir=""
keep_workdir=0 check_links=0 slurm=0
while [ $# -gt 0 ]; do
  case "$1" in
    --slurm) slurm=1; shift ;;
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
if [ "$slurm" = 1 ]; then
  for tool in munged slurmctld slurmd srun sinfo unshare hostname; do
    command -v "$tool" >/dev/null || {
      echo "$prog: --slurm needs $tool (Debian's munge, slurmctld, slurmd," \
           "slurm-client: scripts/install_deps.sh)" >&2; exit 2; }
  done
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
if [ "$slurm" = 1 ] && [ -e "/etc/netns/$prefix-ctl" ]; then
  echo "$prog: /etc/netns/$prefix-ctl exists already (another cluster, or one" \
       "left by a killed run: rm -r /etc/netns/$prefix-*)" >&2
  exit 2
fi
made_workdir=0
if [ -z "$workdir" ]; then
  workdir="$(mktemp -d /tmp/multislice-cluster-XXXXXX)"
  made_workdir=1
fi
mkdir -p "$workdir"

namespaces=()
netns_etc=()     # /etc/netns/NS folders written here (--slurm)
made_netns_etc=0
pids=()  # started in this order; stopped in the reverse one
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  local i pid
  # COMMAND first, then the agents (each stops its workers), the controller
  # last; with --slurm the slurmds, slurmctld, then munged.
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
  for dir in "${netns_etc[@]}"; do rm -rf "$dir"; done
  [ "$made_netns_etc" = 0 ] || rmdir /etc/netns 2>/dev/null || true
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
if [ "$slurm" = 0 ]; then
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
fi

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
  [ "$slurm" = 0 ] || continue
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

export MULTISLICE_CLUSTER_HOSTS="$cluster_hosts"
export PATH="$(dirname "$bin"):$PATH"
if [ "$slurm" = 0 ]; then
export MULTISLICE_CONTROLLER=http://10.201.0.1:8470 MULTISLICE_TOKEN_FILE="$token"
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
fi

# --slurm: munged, slurmctld and one slurmd per host (see --help).
if [ "$slurm" = 1 ]; then
  munge_dir="$workdir/munge" slurm_dir="$workdir/slurm"
  conf="$slurm_dir/slurm.conf"
  # munged wants its socket's folder, and the folders above it, searchable
  # by everyone (its clients may be any user); the key stays 0600.
  chmod a+x "$workdir"
  mkdir -p -m 0755 "$munge_dir"
  mkdir -p "$slurm_dir/ctld-state"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile "$munge_dir/munge.key" --bits 1024
  else
    (umask 077 && head -c 128 /dev/urandom > "$munge_dir/munge.key")
  fi

  # Name resolution inside the namespaces: ctl and every hN, in each
  # namespace's own /etc/hosts (ip netns exec bind-mounts
  # /etc/netns/NS/hosts over /etc/hosts).
  hosts_file="127.0.0.1 localhost"$'\n'"::1 localhost ip6-localhost ip6-loopback"$'\n'
  hosts_file+="10.201.0.1 ctl"$'\n'
  for h in $(seq "$hosts"); do hosts_file+="${address_of[$h]} h$h"$'\n'; done
  [ -d /etc/netns ] || { mkdir /etc/netns; made_netns_etc=1; }
  for ns in "$ctl" $(for h in $(seq "$hosts"); do echo "$prefix-h$h"; done); do
    mkdir "/etc/netns/$ns"
    netns_etc+=("/etc/netns/$ns")
    printf '%s' "$hosts_file" > "/etc/netns/$ns/hosts"
  done

  : > "$slurm_dir/plugstack.conf"
  # slurmd 22.05 loads a cgroup plugin whatever the proctrack and task
  # plugins are; autodetect would look for /sys/fs/cgroup, which
  # ip netns exec hides (it mounts the namespace's own /sys). cgroup/v1 is
  # loaded and never used (proctrack/linuxproc, task/none).
  echo "CgroupPlugin=cgroup/v1" > "$slurm_dir/cgroup.conf"
  {
    cat <<EOF
# Written by netns_cluster.sh --slurm; removed with its workdir.
ClusterName=multislice
SlurmctldHost=ctl(10.201.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_dir/munge.socket,cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
PlugStackConfig=$slurm_dir/plugstack.conf
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=5
MessageTimeout=5
SlurmctldTimeout=10
InactiveLimit=0
KillWait=5
Waittime=0
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$slurm_dir/ctld-state
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmctldDebug=info
SlurmdSpoolDir=$slurm_dir/%n/spool
SlurmdPidFile=$slurm_dir/%n/slurmd.pid
SlurmdLogFile=$slurm_dir/%n/slurmd.log
SlurmdDebug=info
MailProg=/bin/true
EOF
    for h in $(seq "$hosts"); do
      echo "NodeName=h$h NodeAddr=${address_of[$h]} CPUs=1 State=UNKNOWN"
    done
    echo "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } > "$conf"
  export SLURM_CONF="$conf"

  # The node helper for COMMAND: crash (kill -9 everything in the node's
  # namespace) and start (its slurmd again).
  node_helper="$slurm_dir/node"
  cat > "$node_helper" <<EOF
#!/bin/sh
# Written by netns_cluster.sh --slurm. Usage: node crash|start hN
set -eu
prefix='$prefix' conf='$conf' dir='$slurm_dir' hosts='$hosts'
EOF
  cat >> "$node_helper" <<'EOF'
usage() { echo "usage: $0 crash|start h1..h$hosts" >&2; exit 2; }
[ $# -eq 2 ] || usage
case "$2" in h[0-9]*) ;; *) usage ;; esac
n=${2#h}
case "$n" in *[!0-9]*) usage ;; esac
[ "$n" -ge 1 ] && [ "$n" -le "$hosts" ] || usage
ns="$prefix-$2"
case "$1" in
  crash)
    for _ in $(seq 50); do
      pids=$(ip netns pids "$ns")
      [ -n "$pids" ] || exit 0
      kill -KILL $pids 2>/dev/null || true
      sleep 0.1
    done
    echo "$0: processes of $2 still alive after 5 s: $(ip netns pids "$ns")" >&2
    exit 1 ;;
  start)
    mkdir -p "$dir/$2"
    ip netns exec "$ns" unshare --uts sh -c \
      'hostname "$1" && exec slurmd -D -N "$1" -f "$2"' sh "$2" "$conf" \
      >> "$dir/$2/slurmd.out" 2>&1 < /dev/null &
    ;;
  *) usage ;;
esac
EOF
  chmod +x "$node_helper"
  export MULTISLICE_SLURM_NODE="$node_helper"

  ip netns exec "$ctl" munged --foreground --socket="$munge_dir/munge.socket" \
    --key-file="$munge_dir/munge.key" --pid-file="$munge_dir/munged.pid" \
    --seed-file="$munge_dir/munged.seed" --origin=10.201.0.1 \
    > "$munge_dir/munged.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [ -S "$munge_dir/munge.socket" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  [ -S "$munge_dir/munge.socket" ] || {
    echo "$prog: munged did not start within 10 s:" >&2
    tail -n 5 "$munge_dir/munged.log" >&2; exit 1; }
  # slurmctld checks that its host name is SlurmctldHost's: a UTS namespace
  # named ctl; each slurmd is named after its node the same way.
  ip netns exec "$ctl" unshare --uts sh -c \
    'hostname ctl && exec slurmctld -D -c -f "$1"' sh "$conf" \
    > "$slurm_dir/slurmctld.out" 2>&1 &
  pids+=($!)
  ctld_pid=${pids[-1]}
  slurmd_pids=()
  for h in $(seq "$hosts"); do
    mkdir -p "$slurm_dir/h$h/spool"
    ip netns exec "$prefix-h$h" unshare --uts sh -c \
      'hostname "$1" && exec slurmd -D -N "$1" -f "$2"' sh "h$h" "$conf" \
      > "$slurm_dir/h$h/slurmd.out" 2>&1 &
    pids+=($!)
    slurmd_pids+=($!)
  done
  # Every node idle before COMMAND runs.
  idle=0
  for _ in $(seq 120); do
    kill -0 "$ctld_pid" 2>/dev/null || {
      echo "$prog: slurmctld exited:" >&2
      tail -n 5 "$slurm_dir/slurmctld.out" "$slurm_dir/slurmctld.log" >&2
      exit 1; }
    for i in "${!slurmd_pids[@]}"; do
      kill -0 "${slurmd_pids[$i]}" 2>/dev/null || {
        echo "$prog: the slurmd of h$((i + 1)) exited:" >&2
        tail -n 5 "$slurm_dir/h$((i + 1))/slurmd.out" \
          "$slurm_dir/h$((i + 1))/slurmd.log" >&2 || true
        exit 1; }
    done
    idle=$(ip netns exec "$ctl" timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null |
             awk '$2 == "idle"' | sort -u | wc -l || true)
    [ "$idle" -ge "$hosts" ] && break
    sleep 0.5
  done
  [ "$idle" -ge "$hosts" ] || {
    echo "$prog: only $idle of $hosts Slurm nodes idle within 60 s:" >&2
    ip netns exec "$ctl" timeout 5 sinfo -N >&2 || true
    tail -n 5 "$slurm_dir/slurmctld.log" "$slurm_dir"/h*/slurmd.log >&2 || true
    exit 1; }
  echo "$prog: Slurm: slurmctld at ctl (10.201.0.1), $hosts nodes idle" \
       "(h1..h$hosts) in partition all; SLURM_CONF=$conf"
fi

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
if [ "$slurm" = 1 ]; then
  ip netns exec "$ctl" unshare --uts sh -c 'hostname ctl && exec "$@"' sh "$@" <&3 &
else
  ip netns exec "$ctl" "$@" <&3 &
fi
pids+=($!)
set +e
wait "${pids[-1]}"
code=$?
set -e
exit "$code"
