#!/usr/bin/env bash
# Issue 15 (points 3 and 4): multislice on a real Slurm cluster, no
# controller. scripts/netns_cluster.sh --slurm builds 4 hosts of v4-16 in two
# pods (pod0 = h1, h2 and pod1 = h3, h4, the links between pods shaped),
# munged, slurmctld and one slurmd per host; then, in the controller's
# namespace:
#
#   sinfo     the 4 nodes idle in the partition
#   srun      srun -N 4 --ntasks-per-node 1 hostname -I: every node answers
#             with its own address (and its own host name, SLURMD_NODENAME)
#   train     `multislice train tiny.yml --num_slices 2 --accelerator_type
#             v4-16` run locally (4 worker processes on this machine) is the
#             reference; the same command under srun -N 4 --ntasks-per-node 1
#             forms the job from Slurm's variables (2 slices x 2 hosts, one
#             task per host): every step's loss equals the local run's
#   requeue   the same training as an sbatch --requeue script; once a
#             checkpoint is in, the batch host crashes (everything in its
#             namespace killed: slurmd, slurmstepd, the worker); Slurm marks
#             it down and requeues the job; the node's slurmd starts again
#             (ReturnToService=2), the job runs again (SLURM_RESTART_COUNT 1:
#             attempt 1), resumes from its checkpoint, and every step's loss
#             equals the local run's
#
# Afterwards nothing may be left: no namespace, no /etc/netns file, no
# daemon, no file. Exit 77 (CTest: skipped) with one line when not root or
# when network namespaces or the Slurm packages (scripts/install_deps.sh)
# are not there. Every wait is bounded; the cluster runs under `timeout`
# (SIGTERM, so that netns_cluster.sh cleans up) inside CTest's limit.
#
# Usage: slurm_cluster_test.sh [MULTISLICE_BINARY]
# SLURM_TEST_PHASES="sinfo srun ..." runs only those phases (debugging).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prog=slurm_cluster_test

# ---------------------------------------------------------------------------
# Inside the cluster: COMMAND of netns_cluster.sh --slurm.
if [ "${1:-}" = "--inside" ]; then
  scratch="$2"
  phases="${SLURM_TEST_PHASES:-sinfo srun train requeue}"
  ms=multislice
  ms_path="$(command -v $ms)"
  cluster_workdir="$(dirname "$(dirname "$SLURM_CONF")")"
  echo "$cluster_workdir" > "$scratch/cluster_workdir"

  fail() {
    echo "$prog: FAILED: $*" >&2
    echo "--- sinfo / squeue:" >&2
    timeout 5 sinfo -N >&2 || true
    timeout 5 squeue >&2 || true
    echo "--- slurmctld.log (tail):" >&2
    tail -n 15 "$cluster_workdir/slurm/slurmctld.log" >&2 || true
    exit 1
  }
  now() { date +%s.%N; }
  since() { printf '%.1f' "$(echo "$(now) - $1" | bc)"; }
  phase_start=0
  phase() { phase_name="$1"; phase_start=$(now); echo "== $prog: $1"; }
  phase_done() { echo "== $prog: $phase_name passed in $(since "$phase_start") s"; }
  wants() { [[ " $phases " == *" $1 "* ]]; }
  # wait_until SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s.
  wait_until() {
    local seconds="$1" what="$2"; shift 2
    local deadline
    deadline=$(echo "$(now) + $seconds" | bc)
    until "$@" >/dev/null 2>&1; do
      if [ "$(echo "$(now) > $deadline" | bc)" = 1 ]; then
        fail "$what: not within $seconds s"
      fi
      sleep 0.2
    done
  }
  address_of() { awk -v h="$1" '$1 == h { print $3 }' <<<"$MULTISLICE_CLUSTER_HOSTS"; }
  nodes="h1 h2 h3 h4"

  if wants sinfo; then
    phase sinfo
    timeout 10 sinfo
    got=$(timeout 10 sinfo -h -N -o '%N %t' | sort -u | tr '\n' ' ')
    [ "$got" = "h1 idle h2 idle h3 idle h4 idle " ] ||
      fail "sinfo -N: '$got', expected h1..h4 idle"
    phase_done
  fi

  if wants srun; then
    phase srun
    timeout 60 srun -N 4 --ntasks-per-node 1 -t 1 hostname -I \
      > "$scratch/hostname.out" || fail "srun hostname -I: exit $?"
    cat "$scratch/hostname.out"
    got=$(tr -d ' ' < "$scratch/hostname.out" | sort | tr '\n' ' ')
    expected=$(for n in $nodes; do address_of "$n"; done | sort | tr '\n' ' ')
    [ "$got" = "$expected" ] ||
      fail "srun hostname -I: '$got', expected each node's own address: '$expected'"
    # Which node answered what: its Slurm name, host name and address.
    timeout 60 srun -N 4 --ntasks-per-node 1 -t 1 \
      sh -c 'echo "$SLURMD_NODENAME $(hostname) $(hostname -I)"' \
      > "$scratch/nodes.out" || fail "srun (node names): exit $?"
    while read -r node name address; do
      [ "$name" = "$node" ] && [ "$address" = "$(address_of "$node")" ] ||
        fail "srun: node $node answered host name '$name' and address '$address'," \
             "expected $node and $(address_of "$node")"
    done < "$scratch/nodes.out"
    [ "$(wc -l < "$scratch/nodes.out")" -eq 4 ] ||
      fail "srun: $(wc -l < "$scratch/nodes.out") nodes answered, expected 4"
    phase_done
  fi

  # The tiny training of the train and requeue phases (cluster_tutorial_test's
  # model): 2 slices of v4-16, 16 devices, fsdp 8 inside a slice.
  mkdir -p "$scratch/code"
  dataset="$scratch/ds"
  [ -d "$dataset" ] || $ms data prepare --output "$dataset" > /dev/null
  cat > "$scratch/code/tiny.yml" <<EOF
emb_dim: 32
num_heads: 2
num_decoder_layers: 1
mlp_dim: 64
max_target_length: 16
dtype: f32
warmup_steps: 2
learning_rate: 3.0e-3
eval_interval: 1000
steps: 16
checkpoint_period: 4
per_device_batch_size: 1
ici_fsdp_parallelism: 8
dcn_data_parallelism: 2
dataset_path: $dataset
EOF
  train_args="tiny.yml --num_slices 2 --accelerator_type v4-16"
  # losses METRICS OUT: "STEP LOSS" per step (the last record of a step wins:
  # a step run again after a restart replaces the first).
  losses() {
    python3 - "$1" > "$2" <<'EOF'
import json, sys
losses = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "step" in r:
        losses[r["step"]] = r["loss"]
for step in sorted(losses):
    print(step, repr(losses[step]))
EOF
  }
  reference() {
    [ -s "$scratch/reference_losses" ] && return
    local start
    start=$(now)
    (cd "$scratch/code" && timeout 150 $ms train $train_args \
      base_output_directory="$scratch/local" run_name=ref) \
      > "$scratch/local.out" 2>&1 ||
      fail "the local run: $(tail -n 5 "$scratch/local.out")"
    losses "$scratch/local/ref/metrics.jsonl" "$scratch/reference_losses" ||
      fail "the local run: no metrics"
    [ "$(wc -l < "$scratch/reference_losses")" -eq 16 ] ||
      fail "the local run: $(wc -l < "$scratch/reference_losses") steps, expected 16"
    echo "$prog: local run (no Slurm): 16 steps in $(since "$start") s," \
         "last loss $(tail -n 1 "$scratch/reference_losses" | awk '{ print $2 }')"
  }
  # same_losses WHAT FILE: FILE's losses are the reference's, step for step.
  same_losses() {
    if ! cmp -s "$2" "$scratch/reference_losses"; then
      diff "$scratch/reference_losses" "$2" | head -n 10 >&2 || true
      fail "$1: losses differ from the local run's (< local, > $1)"
    fi
    echo "$prog: $1: 16 steps, every loss the local run's"
  }

  if wants train; then
    phase train
    reference
    start=$(now)
    (cd "$scratch/code" && timeout 180 srun -N 4 --ntasks-per-node 1 -t 3 \
      --kill-on-bad-exit=1 "$ms_path" train $train_args \
      base_output_directory="$scratch/srun" run_name=srun) \
      > "$scratch/srun.out" 2>&1 || fail "srun train: $(tail -n 8 "$scratch/srun.out")"
    echo "$prog: srun -N 4 train: $(since "$start") s"
    losses "$scratch/srun/srun/metrics.jsonl" "$scratch/srun_losses" ||
      fail "srun train: no metrics"
    same_losses "srun train" "$scratch/srun_losses"
    phase_done
  fi

  if wants requeue; then
    phase requeue
    reference
    out="$scratch/batch"
    cat > "$scratch/code/train.sbatch" <<EOF
#!/bin/bash
#SBATCH --nodes 4 --ntasks-per-node 1 --requeue --time 5
#SBATCH --output $scratch/batch-%j.out --open-mode append
echo "batch on \$(hostname), restart \${SLURM_RESTART_COUNT:-0}"
exec srun --kill-on-bad-exit=1 "$ms_path" train $train_args \\
  base_output_directory="$out" run_name=requeue
EOF
    # Slower steps, so that the crash lands mid-run.
    job=$(cd "$scratch/code" && MULTISLICE_TEST_STEP_DELAY_MS=250 \
            timeout 10 sbatch --parsable train.sbatch) || fail "sbatch: exit $?"
    job=${job%%;*}
    echo "$prog: submitted job $job"
    metrics="$out/requeue/metrics.jsonl"
    job_field() {  # job_field NAME: NAME=VALUE of scontrol show job
      timeout 5 scontrol show job "$job" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
    }
    steps_in() { [ -s "$metrics" ] && [ "$(grep -c '"step"' "$metrics")" -ge "$1" ]; }
    checkpoint_in() { compgen -G "$out/requeue/checkpoints/*" > /dev/null; }
    wait_until 120 "job $job's first 6 steps" steps_in 6
    wait_until 30 "job $job's first checkpoint" checkpoint_in
    victim=$(job_field BatchHost)
    [ -n "$victim" ] || fail "job $job: no BatchHost"
    echo "$prog: $(grep -c '"step"' "$metrics") steps in; crashing $victim," \
         "the batch host (slurmd, slurmstepd and the worker killed)"
    crash=$(now)
    "$MULTISLICE_SLURM_NODE" crash "$victim" || fail "crash $victim"
    node_down() { timeout 5 sinfo -h -n "$victim" -o '%t' | grep -q '^down'; }
    wait_until 60 "$victim down" node_down
    echo "$prog: $victim down after $(since "$crash") s"
    requeued() {
      [ "$(job_field Restarts)" -ge 1 ] &&
        [[ "$(job_field JobState)" =~ ^(PENDING|REQUEUED|REQUEUE_HOLD)$ ]]
    }
    wait_until 60 "job $job requeued" requeued
    echo "$prog: job $job requeued after $(since "$crash") s" \
         "(state $(job_field JobState), reason $(job_field Reason))"
    "$MULTISLICE_SLURM_NODE" start "$victim"
    node_back() { timeout 5 sinfo -h -n "$victim" -o '%t' | grep -Eq '^(idle|alloc|mix)'; }
    wait_until 60 "$victim back in service" node_back
    echo "$prog: $victim back after $(since "$crash") s"
    running() { [ "$(job_field JobState)" = RUNNING ]; }
    # A requeued job starts cred_expire + 1 s after its requeue at the
    # earliest (netns_cluster.sh: 16 s).
    wait_until 90 "job $job running again" running
    echo "$prog: job $job running again after $(since "$crash") s" \
         "(restart $(job_field Restarts))"
    completed() { [[ "$(job_field JobState)" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)$ ]]; }
    wait_until 180 "job $job finished" completed
    state=$(job_field JobState)
    echo "$prog: job $job $state after $(since "$crash") s; exit $(job_field ExitCode)"
    [ "$state" = COMPLETED ] ||
      fail "job $job $state: $(tail -n 8 "$scratch/batch-$job.out")"
    [ "$(job_field Restarts)" = 1 ] ||
      fail "job $job restarted $(job_field Restarts) times, expected 1"
    python3 - "$metrics" <<'EOF' || fail "requeue: not two attempts in the metrics"
import json, sys
attempts = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "step" in r:
        attempts[r.get("attempt", 0)] = attempts.get(r.get("attempt", 0), 0) + 1
print(f"slurm_cluster_test: steps per attempt: {attempts}")
sys.exit(sorted(attempts) != [0, 1])
EOF
    grep -h "resumed from checkpoint step" "$scratch/batch-$job.out" | head -n 1 ||
      fail "job $job: the restarted run did not resume from a checkpoint"
    losses "$metrics" "$scratch/requeue_losses" || fail "requeue: no metrics"
    same_losses "sbatch --requeue" "$scratch/requeue_losses"
    phase_done
  fi
  exit 0
fi

# ---------------------------------------------------------------------------
# Outside: skip when this machine cannot run it, build the cluster, check
# that nothing is left.
skip() { echo "$prog: SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, Slurm daemons)"
for tool in ip tc python3 bc timeout unshare; do
  command -v "$tool" > /dev/null || skip "needs $tool"
done
for tool in munged slurmctld slurmd srun sbatch sinfo scontrol; do
  command -v "$tool" > /dev/null ||
    skip "needs $tool (Debian's munge, slurmctld, slurmd, slurm-client: scripts/install_deps.sh)"
done
probe="msprobe$$"
if ! ip netns add "$probe" 2> /dev/null; then
  skip "ip netns is not available here (ip netns add failed)"
fi
probe_ok=1
ip -n "$probe" link add p0 type veth peer name p1 2> /dev/null &&
  ip netns exec "$probe" tc qdisc add dev p0 root handle 1: htb 2> /dev/null ||
  probe_ok=0
ip netns del "$probe"
[ "$probe_ok" = 1 ] || skip "this kernel has no veth or htb qdisc"

binary="${1:-$root/build/bin/multislice}"
[ -x "$binary" ] || { echo "$prog: $binary is missing" >&2; exit 1; }
scratch="$(mktemp -d /tmp/multislice-slurm-test-XXXXXX)"
prefix="s$(( $$ % 100000 ))"
trap 'rm -rf "$scratch"' EXIT
# A copy: a build that relinks the binary meanwhile must not change it under
# the cluster's processes.
mkdir "$scratch/bin"
cp "$binary" "$scratch/bin/multislice"
export MULTISLICE_BINARY="$scratch/bin/multislice"
# The Slurm and munge daemons running now (pgrep -x takes one name of at
# most 15 characters); not zombies, which PID 1 reaps when it will.
slurm_daemons() {
  local name pid state
  for name in munged slurmctld slurmd slurmstepd; do
    for pid in $(pgrep -x "$name" || true); do
      state=$(ps -o stat= -p "$pid" 2> /dev/null | cut -c1 || true)
      [ -z "$state" ] || [ "$state" = Z ] || echo "$pid"
    done
  done | sort
}
daemons_before=$(slurm_daemons)
start=$(date +%s.%N)
code=0
timeout -s TERM -k 30 400 "$root/scripts/netns_cluster.sh" --slurm --hosts 4 \
  --accelerator_type v4-16 --prefix "$prefix" \
  -- bash "$here/slurm_cluster_test.sh" --inside "$scratch" || code=$?
printf '%s: cluster and tests: %.1f s, exit %d\n' "$prog" \
  "$(echo "$(date +%s.%N) - $start" | bc)" "$code"

# Nothing left: namespaces, /etc/netns files, daemons, the cluster's files.
left=$(ip netns list | awk -v p="$prefix-" 'index($1, p) == 1 { print $1 }')
[ -z "$left" ] || { echo "$prog: FAILED: namespaces left: $left" >&2; code=1; }
etc_left=$(compgen -G "/etc/netns/$prefix-*" || true)
[ -z "$etc_left" ] || { echo "$prog: FAILED: left: $etc_left" >&2; code=1; }
cluster_workdir=$(cat "$scratch/cluster_workdir" 2> /dev/null || true)
if [ -n "$cluster_workdir" ]; then
  [ ! -e "$cluster_workdir" ] ||
    { echo "$prog: FAILED: $cluster_workdir is left" >&2; code=1; }
  procs=$(pgrep -f -- "$cluster_workdir" || true)
  [ -z "$procs" ] ||
    { echo "$prog: FAILED: processes left: $(ps -o pid=,args= -p $procs)" >&2; code=1; }
fi
procs=$(pgrep -f -- "$scratch" || true)
[ -z "$procs" ] ||
  { echo "$prog: FAILED: processes left: $(ps -o pid=,args= -p $procs)" >&2; code=1; }
daemons_after=$(slurm_daemons)
new_daemons=$(comm -13 <(echo "$daemons_before") <(echo "$daemons_after") | grep . || true)
[ -z "$new_daemons" ] ||
  { echo "$prog: FAILED: daemons left: $(ps -o pid=,args= -p $new_daemons)" >&2; code=1; }
[ "$code" -eq 0 ] && echo "$prog: PASSED (nothing left behind)"
exit "$code"
