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
# shellcheck source=cluster_test_lib.sh
source "$here/cluster_test_lib.sh"

# ---------------------------------------------------------------------------
# Inside the cluster: COMMAND of netns_cluster.sh --slurm.
if [ "${1:-}" = "--inside" ]; then
  scratch="$2"
  phases="${SLURM_TEST_PHASES:-sinfo srun train requeue}"
  ms=multislice
  ms_path="$(command -v $ms)"
  cluster_workdir="$(dirname "$(dirname "$SLURM_CONF")")"
  echo "$cluster_workdir" > "$scratch/cluster_workdir"

  # fail (with Slurm's view), now, since, phase, phase_done, wants,
  # wait_until, address_of, losses, write_tiny_config: cluster_test_lib.sh.
  on_failure() { slurm_status; slurmctld_log_tail; }
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
  write_tiny_config "$scratch/code/tiny.yml" "$dataset" 16 4 \
    "ici_fsdp_parallelism: 8"
  train_args="tiny.yml --num_slices 2 --accelerator_type v4-16"
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
    # earliest (netns_cluster.sh's cred_expire=5: about 6 s).
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
require_root "network namespaces, Slurm daemons"
require_tools ip tc python3 bc timeout unshare
require_slurm_tools munged slurmctld slurmd srun sbatch sinfo scontrol
require_netns_veth_htb
make_scratch "${1:-$root/build/bin/multislice}" slurm-test s
note_slurm_daemons
run_cluster "cluster and tests" 400 --slurm --hosts 4 --accelerator_type v4-16
# Nothing left: namespaces, /etc/netns files, daemons, the cluster's files.
check_nothing_left --slurm
