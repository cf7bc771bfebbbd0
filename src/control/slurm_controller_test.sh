#!/usr/bin/env bash
# Issue 15 (points 1 and 2): the queued-resources controller on a real Slurm
# cluster (multislice controller --capacity slurm). scripts/netns_cluster.sh
# --slurm builds 3 nodes (h1..h3, CPUs=1 each), munged, slurmctld and a
# slurmd per node; in the controller's namespace the controller runs with
# --capacity slurm, and the queued-resources CLI drives it:
#
#   gang      a request of 4 x cpu-1 (4 nodes) on 3 nodes: Slurm holds the
#             job PENDING (PartitionConfig), the queued resource stays
#             WAITING_FOR_RESOURCES; delete cancels the job
#   active    2 x cpu-1: one Slurm job of 2 nodes, ACTIVE; each worker's
#             startup script ran once on its own node with the agents'
#             environment (MEGASCALE_SLICE_ID, TPU_WORKER_ID,
#             TPU_WORKER_HOSTNAMES, MEGASCALE_NUM_SLICES,
#             MULTISLICE_ATTEMPT=1, MULTISLICE_ACCELERATOR_TYPE);
#             queued-resources ssh --node=all runs on each worker's node as
#             a step of the job, and passes a worker's exit code on;
#             multislice run --qr a copies a script directory into each
#             worker's directory and writes each worker's output here (its
#             node, its environment, its folder); a failing worker's exit
#             code is passed on and the other worker's command stopped
#   deadline  a request that pends behind it past its valid_until: its job
#             cancelled, FAILED
#   repair    one of the job's nodes crashes (its slurmd, slurmstepd and
#             worker killed): the node on it goes REPAIRING, the job is
#             requeued away from it, and both slices run again as attempt 2
#             on the two nodes left
#   reset     queued-resources reset: the job is requeued, attempt 3 ACTIVE
#   delete    the job is cancelled and the queued resource gone
#   tiers     spot and reserved as partitions (spot preemptible by high):
#             a reserved request preempts an ACTIVE spot one, SUSPENDED by
#             the SERVICE, and becomes ACTIVE
#   quota     the controller restarted with --quota on-demand=2: a request
#             over the quota is not submitted and waits saying so, also
#             while a FAILED one holds the chips; deleting the holder lets
#             it run
#   train     multislice job: a training of 2 slices of cpu-1; a node of
#             its Slurm job crashes after a checkpoint; attempt 2 on the
#             spare resumes from it, the job ends by itself (exit 0), every
#             loss equals the local run's, goodput.json counts the failure;
#             prints the failure to the first step of attempt 2, split
#
# Afterwards nothing may be left (as slurm_cluster_test.sh). Exit 77 (CTest:
# skipped) with one line when not root or without network namespaces or
# Slurm. Every wait is bounded.
#
# Usage: slurm_controller_test.sh [MULTISLICE_BINARY]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prog=slurm_controller_test
# shellcheck source=cluster_test_lib.sh
source "$here/cluster_test_lib.sh"

# ---------------------------------------------------------------------------
# Inside the cluster: COMMAND of netns_cluster.sh --slurm.
if [ "${1:-}" = "--inside" ]; then
  scratch="$2"
  ms=multislice
  cluster_workdir="$(dirname "$(dirname "$SLURM_CONF")")"
  echo "$cluster_workdir" > "$scratch/cluster_workdir"
  zone=local-a
  ctl_dir="$scratch/ctl"
  mkdir -p "$ctl_dir"
  # fail (with Slurm's view and the controller's log), now, since, phase,
  # phase_done, wait_until, address_of, losses, write_tiny_config:
  # cluster_test_lib.sh.
  on_failure() {
    slurm_status
    echo "--- controller.log (tail):"
    tail -n 25 "$scratch/controller.log" || true
    slurmctld_log_tail
  }
  # Tiers as partitions: spot jobs in "spot", which jobs of "high"
  # (reserved) preempt (PreemptMode=CANCEL); "all" (on-demand) is never
  # preempted.
  sed -i '/^PartitionName=all /s/$/ PreemptMode=OFF/' "$SLURM_CONF"
  cat >> "$SLURM_CONF" <<EOF
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=spot Nodes=ALL PriorityTier=1 PreemptMode=CANCEL
PartitionName=high Nodes=ALL PriorityTier=10 PreemptMode=OFF
EOF
  timeout 10 scontrol reconfigure || fail "scontrol reconfigure"
  start_controller() {  # start_controller [FLAG...]: these flags added
    $ms controller --capacity slurm --bind 10.201.0.1 --port 8470 \
      --data-dir "$ctl_dir" --slurm-workdir "$scratch/work" \
      --slurm-tier-partition spot=spot --slurm-tier-partition reserved=high \
      "$@" >> "$scratch/controller.log" 2>&1 &
    ctl_pid=$!
  }
  start_controller
  trap 'kill "$ctl_pid" 2>/dev/null; wait "$ctl_pid" 2>/dev/null || true;
        timeout 10 scancel --user=root 2>/dev/null || true' EXIT
  export MULTISLICE_CONTROLLER=http://10.201.0.1:8470
  export MULTISLICE_TOKEN_FILE="$ctl_dir/token"
  wait_until 20 "the controller" $ms queued-resources list --zone $zone

  describe() { $ms queued-resources describe "$1" --zone $zone --format json; }
  field() {  # field QR PYTHON-EXPRESSION-OF-q
    describe "$1" 2>/dev/null | python3 -c "import json,sys; q=json.load(sys.stdin); print($2)"
  }
  is_state() { [ "$(field "$1" 'q["state"]["state"]')" = "$2" ]; }
  workers="$scratch/workers.txt"
  cat > "$scratch/startup.sh" <<EOF
echo "\$SLURMD_NODENAME \$MEGASCALE_SLICE_ID \$TPU_WORKER_ID \$TPU_WORKER_HOSTNAMES \$MEGASCALE_NUM_SLICES \$MULTISLICE_ATTEMPT \$MULTISLICE_ACCELERATOR_TYPE" >> "$workers"
exec sleep 1000
EOF
  # check_workers ATTEMPT: one line per slice of ATTEMPT, each on its own
  # node, with the environment of a worker of that slice.
  check_workers() {
    local attempt="$1" lines node slice worker hosts slices att type seen=""
    lines=$(awk -v a="$attempt" '$6 == a' "$workers")
    [ "$(wc -l <<<"$lines")" -eq 2 ] || fail "attempt $attempt: workers '$lines', expected 2"
    while read -r node slice worker hosts slices att type; do
      [ "$worker" = 0 ] && [ "$slices" = 2 ] && [ "$type" = cpu-1 ] ||
        fail "attempt $attempt: worker line '$node $slice $worker $hosts $slices $att $type'"
      [ "$hosts" = "$(address_of "$node")" ] ||
        fail "attempt $attempt: TPU_WORKER_HOSTNAMES=$hosts on $node ($(address_of "$node"))"
      seen+="$slice "
    done <<<"$lines"
    [ "$(tr ' ' '\n' <<<"$seen" | sort | tr '\n' ' ')" = " 0 1 " ] ||
      fail "attempt $attempt: slices '$seen', expected 0 and 1"
    echo "$prog: attempt $attempt ran on $(awk '{print $1}' <<<"$lines" | tr '\n' ' ')"
  }
  wait_lines() { [ -s "$workers" ] && [ "$(awk -v a="$1" '$6 == a' "$workers" | wc -l)" -ge 2 ]; }

  phase gang
  $ms queued-resources create big --accelerator-type cpu-1 --node-count 4 \
    --zone $zone --async > /dev/null || fail "create big"
  wait_until 30 "big WAITING_FOR_RESOURCES" is_state big WAITING_FOR_RESOURCES
  sleep 6  # beyond the controller's submit retry
  [ "$(field big 'q["state"]["state"]')" = WAITING_FOR_RESOURCES ] ||
    fail "big: $(field big 'q["state"]["state"]'), expected WAITING_FOR_RESOURCES"
  # Slurm holds the job pending (PartitionConfig: more nodes than the
  # partition has) or, with EnforcePartLimits, refuses it at sbatch.
  big_job=$(timeout 5 squeue -h -n big -o '%i %T %r')
  if [ -n "$big_job" ]; then
    [[ "$big_job" == *" PENDING "* ]] || fail "big: Slurm job '$big_job', expected PENDING"
    echo "$prog: big: Slurm job $big_job, the queued resource WAITING_FOR_RESOURCES"
  else
    grep "big: submit:" "$scratch/controller.log" | head -n 1
  fi
  $ms queued-resources delete big --zone $zone --force --quiet > /dev/null ||
    fail "delete big"
  big_gone() { ! describe big && [ -z "$(timeout 5 squeue -h -n big -o %i)" ]; }
  wait_until 30 "big deleted and its job cancelled" big_gone
  phase_done

  phase active
  start=$(now)
  $ms queued-resources create a --accelerator-type cpu-1 --node-count 2 \
    --zone $zone --metadata-from-file "startup-script=$scratch/startup.sh" \
    --async > /dev/null || fail "create a"
  wait_until 60 "a ACTIVE" is_state a ACTIVE
  echo "$prog: a ACTIVE after $(since "$start") s;" \
       "Slurm job $(timeout 5 squeue -h -n a -o '%i %T %N')"
  wait_until 20 "a's workers of attempt 1" wait_lines 1
  check_workers 1
  # queued-resources ssh: a step of the job on every worker's node.
  $ms queued-resources ssh a --zone $zone --node=all --worker=all \
    --command 'echo "$(hostname) $SLURM_JOB_ID"' > "$scratch/ssh.out" 2>&1 ||
    fail "ssh: exit $?: $(cat "$scratch/ssh.out")"
  cat "$scratch/ssh.out"
  job=$(timeout 5 squeue -h -n a -o %i)
  for i in 0 1; do
    grep -qx "\[node $i worker 0\] $(field a "q['nodes'][$i]['hosts'][0]") $job" \
      "$scratch/ssh.out" || fail "ssh: no line of node $i on its host in job $job"
  done
  code=0
  $ms queued-resources ssh a --zone $zone --node=1 --worker=all \
    --command 'exit 3' > /dev/null 2>&1 || code=$?
  [ "$code" = 3 ] || fail "ssh --command 'exit 3': exit $code, expected 3"
  # multislice run: steps of the job copy the scripts into RUN_NAME/ in each
  # worker's directory and run the command there with the startup script's
  # environment; each worker's output file here, a last line without a
  # newline kept.
  mkdir -p "$scratch/run_code"
  echo payload > "$scratch/run_code/data.txt"
  start=$(now)
  (cd "$scratch" && $ms run --qr a --script_dir "$scratch/run_code" --run_name r1 \
    --command 'echo "$SLURMD_NODENAME $MEGASCALE_SLICE_ID $TPU_WORKER_ID $TPU_WORKER_HOSTNAMES $MEGASCALE_NUM_SLICES $MULTISLICE_ATTEMPT $MULTISLICE_ACCELERATOR_TYPE $MULTISLICE_RUN_NAME $(cat data.txt) $PWD"; printf "no newline"') \
    > "$scratch/run.out" 2>&1 || fail "run: exit $?: $(cat "$scratch/run.out")"
  echo "$prog: run r1 on a's 2 workers: exit 0 after $(since "$start") s"
  for i in 0 1; do
    host=$(field a "q['nodes'][$i]['hosts'][0]")
    out="$scratch/runs/r1/output_slice_000${i}_worker_0000.txt"
    printf '%s %s 0 %s 2 1 cpu-1 r1 payload %s\nno newline' "$host" "$i" \
      "$(address_of "$host")" "$scratch/work/workers/a.$i.0/r1" > "$scratch/run.expected"
    cmp -s "$out" "$scratch/run.expected" ||
      fail "run: slice $i's output '$(cat "$out")', expected '$(cat "$scratch/run.expected")'"
  done
  head -n 1 "$scratch/runs/r1/output_slice_0001_worker_0000.txt"
  # A failing worker: its exit code, the other worker's command stopped.
  code=0
  start=$(now)
  (cd "$scratch" && $ms run --qr a --use_existing_folder --run_name r1 \
    --command '[ "$MEGASCALE_SLICE_ID" = 1 ] && exit 4; exec sleep 60') \
    > "$scratch/run_fail.out" 2>&1 || code=$?
  [ "$code" = 4 ] || fail "run with a failing worker: exit $code, expected 4: $(cat "$scratch/run_fail.out")"
  grep -q "slice 1 worker 0 failed with exit code 4; stopped the 1 other" "$scratch/run_fail.out" ||
    fail "run with a failing worker: $(cat "$scratch/run_fail.out")"
  left=$(timeout 5 squeue -h --steps --jobs="$job" -o %j | grep multislice-run/ || true)
  [ -z "$left" ] || fail "run: steps left in job $job: $left"
  echo "$prog: run with a failing worker: exit 4 after $(since "$start") s, the other stopped"
  phase_done

  phase deadline
  # late (2 nodes) pends behind a (2 of the 3): at its valid_until the job is
  # cancelled and the queued resource FAILED; a runs on.
  $ms queued-resources create late --accelerator-type cpu-1 --node-count 2 \
    --zone $zone --valid-until-duration 6s --async > /dev/null || fail "create late"
  wait_until 20 "late WAITING_FOR_RESOURCES" is_state late WAITING_FOR_RESOURCES
  late_job=$(timeout 5 squeue -h -n late -o '%i %T %r')
  [[ "$late_job" == *" PENDING "* ]] || fail "late: Slurm job '$late_job', expected PENDING"
  wait_until 30 "late FAILED at its valid_until" is_state late FAILED
  field late 'q["state"]["failedData"]["error"]["message"]'
  late_gone() { [ -z "$(timeout 5 squeue -h -n late -o %i)" ]; }
  wait_until 20 "late's job cancelled" late_gone
  is_state a ACTIVE || fail "a: $(field a 'q["state"]["state"]') after late's deadline"
  $ms queued-resources delete late --zone $zone --quiet > /dev/null || fail "delete late"
  phase_done

  phase repair
  victim=$(field a 'q["nodes"][0]["hosts"][0]')
  [ -n "$victim" ] || fail "a: no host on node 0"
  crash=$(now)
  "$MULTISLICE_SLURM_NODE" crash "$victim" || fail "crash $victim"
  echo "$prog: crashed $victim (node 0 of a)"
  repairing() { [ "$(field a '",".join(n["state"] for n in q["nodes"])')" != "READY,READY" ] &&
                field a '",".join(n["state"] for n in q["nodes"])' | grep -q REPAIRING; }
  wait_until 60 "a's node REPAIRING" repairing
  echo "$prog: a's node REPAIRING after $(since "$crash") s" \
       "($(field a '" ".join(n["state"] for n in q["nodes"])'))"
  attempt2() { is_state a ACTIVE && [ "$(field a 'q["attempt"]')" = 2 ]; }
  wait_until 120 "a ACTIVE as attempt 2" attempt2
  echo "$prog: a ACTIVE (attempt 2) after $(since "$crash") s"
  wait_until 20 "a's workers of attempt 2" wait_lines 2
  check_workers 2
  awk '$6 == 2 { print $1 }' "$workers" | grep -qx "$victim" &&
    fail "attempt 2 ran on the crashed node $victim"
  "$MULTISLICE_SLURM_NODE" start "$victim"
  node_back() { timeout 5 sinfo -h -n "$victim" -o '%t' | grep -Eq '^(idle|alloc|mix)'; }
  wait_until 60 "$victim back in service" node_back
  phase_done

  phase reset
  start=$(now)
  $ms queued-resources reset a --zone $zone --async > /dev/null || fail "reset a"
  attempt3() { is_state a ACTIVE && [ "$(field a 'q["attempt"]')" = 3 ]; }
  wait_until 120 "a ACTIVE as attempt 3" attempt3
  wait_until 20 "a's workers of attempt 3" wait_lines 3
  check_workers 3
  echo "$prog: reset: attempt 3 ACTIVE after $(since "$start") s"
  phase_done

  phase delete
  job=$(timeout 5 squeue -h -n a -o %i)
  $ms queued-resources delete a --zone $zone --force --quiet > /dev/null ||
    fail "delete a"
  gone() { ! describe a; }
  wait_until 60 "a deleted" gone
  no_job() { [ -z "$(timeout 5 squeue -h -n a -o %i)" ]; }
  wait_until 30 "Slurm job $job gone" no_job
  echo "$prog: a deleted, Slurm job $job cancelled"
  phase_done

  phase quota
  # The controller's quotas on Slurm, as on agents: restarted with --quota
  # on-demand=2 (same data directory), a 2-node QR of cpu-1 holds both
  # chips; a 1-chip request is not submitted (no Slurm job) and waits
  # saying so; qa's job cancelled outside the controller makes qa FAILED,
  # still holding its chips (the capacity answer says so); once qa is
  # deleted, qb is submitted and ACTIVE. The controller is restarted
  # without the quota afterwards. Needs nothing of the other phases but the
  # controller's start line and helpers (is_state, field, wait_until).
  restart_controller() {  # restart_controller [FLAG...]: the same flags plus these
    kill "$ctl_pid" 2>/dev/null; wait "$ctl_pid" 2>/dev/null || true
    start_controller "$@"
    wait_until 20 "the controller" $ms queued-resources list --zone $zone
  }
  on_demand() {  # on_demand KEY: the on-demand tier's KEY in the capacity answer
    curl -sf -H "Authorization: Bearer $(tr -d '\n' < "$MULTISLICE_TOKEN_FILE")" \
      "$MULTISLICE_CONTROLLER/internal/v1/capacity" |
      python3 -c "import json,sys; print(next(t['$1'] for t in json.load(sys.stdin)['tiers'] if t['tier'] == 'on-demand'))"
  }
  restart_controller --quota on-demand=2
  $ms queued-resources create qa --accelerator-type cpu-1 --node-count 2 \
    --zone $zone --async > /dev/null || fail "create qa"
  wait_until 60 "qa ACTIVE" is_state qa ACTIVE
  [ "$(field qa 'q["quotaHeldChips"]')" = 2 ] || fail "qa: quotaHeldChips $(field qa 'q["quotaHeldChips"]'), expected 2"
  $ms queued-resources create qb --accelerator-type cpu-1 --node-id qb-0 \
    --zone $zone --async > /dev/null || fail "create qb"
  wait_until 20 "qb WAITING_FOR_RESOURCES" is_state qb WAITING_FOR_RESOURCES
  sleep 2  # several polls and a submit retry's worth of ticks
  is_state qb WAITING_FOR_RESOURCES || fail "qb: $(field qb 'q["state"]["state"]') over quota"
  [ -z "$(timeout 5 squeue -h -n qb -o %i)" ] || fail "qb: submitted to Slurm over its quota"
  reason=$(field qb 'q.get("waitingReason", "")')
  [ "$reason" = "the on-demand quota: 2 of 2 chips in use, this request needs 1" ] ||
    fail "qb: waitingReason '$reason'"
  [ "$(on_demand usedChips)" = 2 ] && [ "$(on_demand quotaChips)" = 2 ] ||
    fail "capacity: on-demand usedChips $(on_demand usedChips), quotaChips $(on_demand quotaChips)"
  echo "$prog: qb waits, not submitted: $reason"
  # qa's job ends outside the controller: qa FAILED, its 2 chips still held.
  timeout 10 scancel "$(field qa 'q["clusterJob"]')" || fail "scancel qa's job"
  wait_until 30 "qa FAILED" is_state qa FAILED
  sleep 2
  is_state qb WAITING_FOR_RESOURCES && [ -z "$(timeout 5 squeue -h -n qb -o %i)" ] ||
    fail "qb: submitted while FAILED qa holds the quota"
  [ "$(on_demand usedChips)" = 2 ] && [ "$(on_demand heldByFailedOrSuspendedChips)" = 2 ] ||
    fail "capacity: on-demand usedChips $(on_demand usedChips), held by FAILED $(on_demand heldByFailedOrSuspendedChips)"
  start=$(now)
  $ms queued-resources delete qa --zone $zone --quiet > /dev/null || fail "delete qa"
  wait_until 60 "qb ACTIVE once qa is deleted" is_state qb ACTIVE
  [ -n "$(timeout 5 squeue -h -n qb -o %i)" ] || fail "qb: ACTIVE without a Slurm job"
  echo "$prog: qa deleted; qb submitted and ACTIVE after $(since "$start") s"
  [ "$(on_demand usedChips)" = 1 ] || fail "capacity: on-demand usedChips $(on_demand usedChips), expected 1"
  $ms queued-resources delete qb --zone $zone --force --quiet > /dev/null || fail "delete qb"
  qb_gone() { ! describe qb && [ -z "$(timeout 5 squeue -h -n qb -o %i)" ]; }
  wait_until 30 "qb deleted and its job cancelled" qb_gone
  restart_controller
  phase_done

  phase train
  # multislice job on Slurm (issue 15's repair test): a training of 2 slices
  # of cpu-1 started with `multislice job`; a node of its Slurm job crashes
  # after a checkpoint; the job is requeued away from it, attempt 2 on the
  # spare resumes from the checkpoint, `multislice job` ends by itself
  # (exit 0), every step's loss is the uninterrupted local run's, and
  # goodput.json accounts for the failure. Prints the node failure to the
  # first step of attempt 2, split by Slurm's own times (docs/performance.md,
  # "Node failure to the first step on Slurm").
  mkdir -p "$scratch/code"
  $ms data prepare --output "$scratch/ds" > /dev/null
  write_tiny_config "$scratch/code/tiny.yml" "$scratch/ds" 16 4
  (cd "$scratch/code" && timeout 120 $ms train tiny.yml --num_slices 2 \
    --accelerator_type cpu-1 base_output_directory="$scratch/local" run_name=ref) \
    > "$scratch/local.out" 2>&1 || fail "the local run: $(tail -n 5 "$scratch/local.out")"
  losses "$scratch/local/ref/metrics.jsonl" "$scratch/reference_losses"
  [ "$(wc -l < "$scratch/reference_losses")" -eq 16 ] || fail "the local run: not 16 steps"
  job_dir="$scratch/jobs/t"
  # shellcheck disable=SC2016  # expanded by each worker
  train='MULTISLICE_TEST_STEP_DELAY_MS=500 multislice train tiny.yml'
  train+=' base_output_directory=$MULTISLICE_OUTPUT_DIR run_name=$MULTISLICE_RUN_NAME'
  $ms job --zone $zone --accelerator_type cpu-1 --num_slices 2 \
    --output_dir "$scratch/jobs" --run_name t --script_dir "$scratch/code" \
    --timeout_seconds 240 --command "$train" > "$scratch/job.out" 2>&1 &
  job_pid=$!
  trap 'kill "$job_pid" "$ctl_pid" 2>/dev/null; wait "$ctl_pid" 2>/dev/null || true;
        timeout 10 scancel --user=root 2>/dev/null || true' EXIT
  metrics="$job_dir/metrics.jsonl"
  steps_in() { [ -s "$metrics" ] && [ "$(grep -c '"step"' "$metrics")" -ge "$1" ]; }
  checkpoint_in() { compgen -G "$job_dir/checkpoints/*" > /dev/null; }
  wait_until 60 "t's first 6 steps" steps_in 6
  wait_until 30 "t's first checkpoint" checkpoint_in
  victim=$(field job-t 'q["nodes"][1]["hosts"][0]')
  slurm_job=$(field job-t 'q["clusterJob"]')
  [ -n "$victim" ] && [ -n "$slurm_job" ] || fail "job-t: no host on node 1 or no Slurm job"
  echo "$prog: $(grep -c '"step"' "$metrics") steps in; crashing $victim" \
       "(node 1 of job-t, Slurm job $slurm_job)"
  crash=$(now)
  "$MULTISLICE_SLURM_NODE" crash "$victim" || fail "crash $victim"
  job_ended() { ! kill -0 "$job_pid"; }
  wait_until 150 "multislice job to end by itself" job_ended
  code=0
  wait "$job_pid" || code=$?
  cat "$scratch/job.out"
  [ "$code" = 0 ] || fail "multislice job: exit $code"
  grep -h "resumed from checkpoint step" "$job_dir/main_command_log_slice_0_worker_0" |
    tail -n 1 > "$scratch/resumed"
  [ -s "$scratch/resumed" ] || fail "t: attempt 2 did not resume from a checkpoint"
  cat "$scratch/resumed"
  losses "$metrics" "$scratch/t_losses"
  if ! cmp -s "$scratch/t_losses" "$scratch/reference_losses"; then
    diff "$scratch/reference_losses" "$scratch/t_losses" | head -n 10 >&2 || true
    fail "t: losses differ from the local run's (< local, > t)"
  fi
  echo "$prog: t: 16 steps across the repair, every loss the local run's"
  # goodput.json against the records themselves: one failure, attempt 2,
  # the steps of attempt 1 past the checkpoint recomputed; and the split of
  # the node failure to the first step of attempt 2 from Slurm's own log.
  python3 - "$job_dir/goodput.json" "$metrics" "$scratch/resumed" "$crash" \
    "$cluster_workdir/slurm/slurmctld.log" "$slurm_job" "$victim" <<'EOF' ||
import datetime, json, re, sys
goodput_path, metrics, resumed, crash, ctld_log, job, victim = sys.argv[1:]
crash = float(crash)
g = json.load(open(goodput_path))
records = [json.loads(l) for l in open(metrics)]
steps = [r for r in records if "step" in r]
resume_step = int(re.search(r"checkpoint step (\d+)", open(resumed).read()).group(1))
recomputed = sum(1 for r in steps if r.get("attempt") == 1 and r["step"] > resume_step)
errors = []
def expect(what, ok):
    if not ok:
        errors.append(what)
expect("exit_code 0", g.get("exit_code") == 0)
expect("failures 1", g.get("failures") == 1)
expect("the outcome at attempt 2", "(attempt 2)" in g.get("outcome", ""))
expect("the timeline reaches attempt 2",
       max(o["attempt"] for o in g["timeline"]) == 2)
for key in ("detection_seconds", "repair_seconds", "restart_seconds"):
    expect(key + " positive", g.get(key, 0) > 0)
expect("recomputed_steps %d (attempt 1's steps past checkpoint %d)"
       % (recomputed, resume_step), g.get("recomputed_steps") == recomputed)
expect("steps 16", g.get("steps") == 16)
if errors:
    print("goodput.json: expected " + "; ".join(errors) + ": " + json.dumps(g))
    sys.exit(1)
# Slurm's times, from slurmctld's log (local time, milliseconds).
def stamp(line):
    t = datetime.datetime.strptime(line[1:24], "%Y-%m-%dT%H:%M:%S.%f")
    return t.timestamp()
requeue = allocate = down = None
for line in open(ctld_log):
    if not line.startswith("[") or stamp(line) < crash:
        continue
    # Ours (the exclusion set between requeuehold and release) or Slurm's.
    if requeue is None and re.search(
            r"setting exc_nodes to \S+ for JobId=%s\b|Requeuing JobId=%s\b"
            % (job, job), line):
        requeue = stamp(line)
    if re.search(r"sched: Allocate JobId=%s " % job, line):
        allocate = stamp(line)
    if down is None and re.search(r"Nodes? .*%s.* not responding, setting DOWN" % victim, line):
        down = stamp(line)
timeline = sorted(g["timeline"], key=lambda o: o["time"])
left = next(o["time"] for o in timeline if o["time"] > crash and o["state"] != "ACTIVE")
back = next(o["time"] for o in timeline if o["time"] > left and o["state"] == "ACTIVE")
first = min(r["time"] - r["step_time_s"] for r in steps if r.get("attempt") == 2)
if requeue is None or allocate is None or not (requeue < allocate < back):
    print("slurmctld.log: no requeue then allocation of job %s between the crash "
          "and ACTIVE (requeue %s, allocate %s)" % (job, requeue, allocate))
    sys.exit(1)
print("slurm_controller_test: figure: node failure -> first step of attempt 2: "
      "%.2f s = detection %.2f (crash -> the QR out of ACTIVE: %s not responding, "
      "job %s requeued; slurmctld: requeue at +%.2f, the node DOWN %s) + "
      "allocation %.2f (-> the requeued job allocated on the spare, slurmctld's "
      "log) + workers %.2f (-> their step, the QR ACTIVE) + restart %.2f (-> the "
      "first step of attempt 2 began, metrics.jsonl); goodput.json: %.1f %% "
      "goodput, detection %.2f s (from the last step), repair %.2f s, restart "
      "%.2f s, %d recomputed step(s)"
      % (first - crash, left - crash, victim, job, requeue - crash,
         "at +%.2f" % (down - crash) if down else "not by then",
         allocate - left, back - allocate, first - back, g["goodput_percent"],
         g["detection_seconds"], g["repair_seconds"], g["restart_seconds"],
         g["recomputed_steps"]))
EOF
    fail "t: goodput.json or Slurm's times"
  gone_t() { ! describe job-t && [ -z "$(timeout 5 squeue -h -n job-t -o %i)" ]; }
  wait_until 30 "job-t deleted and its Slurm job cancelled" gone_t
  trap 'kill "$ctl_pid" 2>/dev/null; wait "$ctl_pid" 2>/dev/null || true;
        timeout 10 scancel --user=root 2>/dev/null || true' EXIT
  phase_done

  phase tiers
  # A reserved request preempts a spot one: its job is cancelled by Slurm
  # (PREEMPTED), the spot queued resource SUSPENDED by the SERVICE.
  $ms queued-resources create s --accelerator-type cpu-1 --node-count 2 \
    --zone $zone --spot --async > /dev/null || fail "create s"
  wait_until 60 "s ACTIVE" is_state s ACTIVE
  [ "$(timeout 5 squeue -h -n s -o %P)" = spot ] || fail "s: not in partition spot"
  start=$(now)
  $ms queued-resources create r --accelerator-type cpu-1 --node-count 2 \
    --zone $zone --reserved --async > /dev/null || fail "create r"
  wait_until 60 "s SUSPENDED" is_state s SUSPENDED
  [ "$(field s 'q["state"]["stateInitiator"]')" = SERVICE ] ||
    fail "s: suspended by $(field s 'q["state"]["stateInitiator"]'), expected SERVICE"
  wait_until 60 "r ACTIVE" is_state r ACTIVE
  [ "$(timeout 5 squeue -h -n r -o %P)" = high ] || fail "r: not in partition high"
  echo "$prog: reserved r ACTIVE after $(since "$start") s; spot s SUSPENDED (SERVICE)"
  $ms queued-resources delete s --zone $zone --quiet > /dev/null || fail "delete s"
  $ms queued-resources delete r --zone $zone --force --quiet > /dev/null || fail "delete r"
  phase_done
  exit 0
fi

# ---------------------------------------------------------------------------
# Outside: skip when this machine cannot run it, build the cluster, check
# that nothing is left.
require_root "network namespaces, Slurm daemons"
require_tools ip tc python3 bc timeout unshare
require_slurm_tools munged slurmctld slurmd srun sbatch sinfo scontrol squeue scancel
require_netns_veth_htb
make_scratch "${1:-$root/build/bin/multislice}" slurmctl-test c
note_slurm_daemons
run_cluster "cluster and tests" 400 --slurm --hosts 3 --accelerator_type cpu-1
# Nothing left (as slurm_cluster_test.sh).
check_nothing_left --slurm
