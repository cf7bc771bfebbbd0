#!/usr/bin/env bash
# The seed's tutorial as a test (issue 14 point 4), on a cluster of network
# namespaces (scripts/netns_cluster.sh): 5 hosts of v4-16 (2 hosts of 4 chips
# make a slice) in two pods, pod0 = h1, h2, h5 and pod1 = h3, h4, the links
# between pods shaped to 200 Mbit/s and checked (--check_links), each host
# with its own address. Then, in the controller's namespace:
#
#   gang      a 3-slice request cannot be placed (two pods of two hosts)
#             and holds no host while it waits; deleted.
#   tutorial  queued-resources create --node-count 2, list until ACTIVE;
#             each slice on one pod's hosts; ssh --node=all --worker=all:
#             every worker answers with its own host's address.
#   shardings run --tpu_prefix of `multislice shardings -dd 2 -if 8` (DCN
#             data parallelism, ICI FSDP over the 2 hosts of each slice):
#             every worker's loss equals the one-device run's (f32).
#   manual    the same shardings and a tiny training run started by hand,
#             one process per host namespace with the worker environment
#             alone (MEGASCALE_*, TPU_WORKER_ID, TPU_WORKER_HOSTNAMES,
#             MULTISLICE_ACCELERATOR_TYPE, MULTISLICE_RUN_ID): the same
#             loss, and the training's losses are the reference below.
#   job       `multislice job` training the same model on 2 slices; once
#             steps are in, `admin fail-host` of a pod0 host: the slice is
#             repaired on pod0's spare h5, every worker restarts (attempt
#             2), training resumes from its checkpoint, and every step's
#             loss equals the uninterrupted (manual) run's.
#
# Afterwards nothing may be left: no namespace, no process, no file.
# Exit 77 (CTest: skipped) with one line when not root or when network
# namespaces, htb or python3 are not available here. Every wait is bounded;
# the whole cluster runs under `timeout` (SIGTERM, so that netns_cluster.sh
# cleans up) well inside CTest's limit.
#
# Usage: cluster_tutorial_test.sh [MULTISLICE_BINARY]
# CLUSTER_TEST_PHASES="gang tutorial ..." runs only those phases (for
# debugging; CTest runs all of them).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prog=cluster_tutorial_test
# shellcheck source=cluster_test_lib.sh
source "$here/cluster_test_lib.sh"

# ---------------------------------------------------------------------------
# Inside the cluster: COMMAND of netns_cluster.sh, in the controller's
# namespace.
if [ "${1:-}" = "--inside" ]; then
  scratch="$2"
  phases="${CLUSTER_TEST_PHASES:-gang tutorial shardings manual job}"
  zone=local-a
  ms=multislice
  cluster_workdir="$(dirname "$(dirname "$MULTISLICE_TOKEN_FILE")")"
  echo "$cluster_workdir" > "$scratch/cluster_workdir"

  # fail, phase, phase_done, wants, wait_until: cluster_test_lib.sh.
  qr_state() {
    $ms queued-resources describe "$1" --zone $zone --format json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["state"]["state"])'
  }
  is_state() { [ "$(qr_state "$1")" = "$2" ]; }
  # "HOST ADDRESS ICI_DOMAIN QR" per registered host (admin hosts' columns).
  hosts_table() {
    $ms admin hosts | awk 'NR > 1 { split($3, a, ":"); print $1, a[1], $4, $6 }'
  }
  # The hosts of QR's nodes: "NODE_INDEX WORKER HOST" lines.
  node_hosts() {
    $ms queued-resources describe "$1" --zone $zone --format json |
      python3 -c '
import json, sys
for i, n in enumerate(json.load(sys.stdin)["nodes"]):
    for w, h in enumerate(n.get("hosts", [])):
        print(i, w, h)'
  }
  host_domain() { hosts_table | awk -v h="$1" '$1 == h { print $3 }'; }
  host_address() { hosts_table | awk -v h="$1" '$1 == h { print $2 }'; }
  # The namespace of the host at ADDRESS (MULTISLICE_CLUSTER_HOSTS).
  namespace_of() {
    awk -v a="$1" '$3 == a { print $2 }' <<<"$MULTISLICE_CLUSTER_HOSTS"
  }
  # Every multi-host slice of QR is on one pod: prints "NODE DOMAIN" lines.
  check_slices_in_one_pod() {
    local qr="$1" node worker host domain
    declare -A node_domain=()
    while read -r node worker host; do
      domain=$(host_domain "$host")
      [ -n "$domain" ] || fail "$qr: host $host of node $node is not listed"
      if [ -z "${node_domain[$node]:-}" ]; then
        node_domain[$node]=$domain
      elif [ "${node_domain[$node]}" != "$domain" ]; then
        fail "$qr: node $node spans ICI domains ${node_domain[$node]} and $domain"
      fi
    done < <(node_hosts "$qr")
    for node in "${!node_domain[@]}"; do echo "$node ${node_domain[$node]}"; done
  }
  # The first-step loss of a shardings --json report (its last JSON line)
  # with the mesh it ran on: "LOSS NUM_DEVICES NUM_SLICES".
  shardings_report() {
    python3 -c '
import json, sys
lines = [l for l in open(sys.argv[1]) if l.lstrip().startswith("{")]
if not lines:
    sys.exit(sys.argv[1] + ": no JSON line")
r = json.loads(lines[-1])
print(r["first_step_loss"], r["num_devices"], r["num_slices"])' "$1"
  }
  # check_report WHAT FILE: 16 devices on 2 slices, the one-device loss.
  check_report() {
    local report loss devices slices
    report=$(shardings_report "$2") || fail "$1: $(tail -n 3 "$2")"
    read -r loss devices slices <<<"$report"
    echo "$prog: $1: loss $loss on $devices devices, $slices slices"
    [ "$devices" = 16 ] && [ "$slices" = 2 ] ||
      fail "$1: ran on $devices devices in $slices slices, expected 16 in 2"
    [ "$loss" = "$one_device_loss" ] ||
      fail "$1: loss $loss, the one-device run's is $one_device_loss"
  }

  # Every phase's sizes: the smallest that still run every path, on 2 cores.
  shard_flags="-d 64 -b 4 -n 2 --dtype f32 --steps 1 --json"
  one_device_loss=""
  one_device() {
    if [ -z "$one_device_loss" ]; then
      # 2 slices x 8 devices x 4 rows: 64 rows on one device.
      $ms shardings -d 64 -b 64 -n 2 --dtype f32 --steps 1 --json \
        > "$scratch/one_device.json" 2> "$scratch/one_device.err" ||
        fail "the one-device shardings run: $(tail -n 3 "$scratch/one_device.err")"
      one_device_loss=$(shardings_report "$scratch/one_device.json" |
                          awk '{ print $1 }')
      echo "$prog: one-device loss $one_device_loss"
    fi
  }

  if wants gang; then
    phase gang
    $ms queued-resources create gang --accelerator-type v4-16 --node-count 3 \
      --zone $zone --async > /dev/null
    wait_until 30 "gang WAITING_FOR_RESOURCES" is_state gang WAITING_FOR_RESOURCES
    sleep 1
    [ "$(qr_state gang)" = WAITING_FOR_RESOURCES ] ||
      fail "gang: $(qr_state gang), expected WAITING_FOR_RESOURCES (3 slices of 2 hosts need 6 hosts in pods of 2 or more; 5 are free)"
    held=$(hosts_table | awk '$4 != "-"' | wc -l)
    [ "$held" -eq 0 ] || fail "gang: $held hosts held by a request that waits"
    $ms queued-resources delete gang --zone $zone --force --quiet > /dev/null
    phase_done
  fi

  if wants tutorial || wants shardings; then
    phase tutorial
    $ms queued-resources create tut --accelerator-type v4-16 --node-count 2 \
      --zone $zone --runtime-version v2-alpha-tpuv4 --async > /dev/null
    wait_until 60 "tut ACTIVE in queued-resources list" \
      bash -c "$ms queued-resources list --zone $zone | grep -Eq '^tut .* ACTIVE'"
    $ms queued-resources list --zone $zone
    domains=$(check_slices_in_one_pod tut | sort)
    echo "$prog: slices on pods: $(tr '\n' ' ' <<<"$domains")"
    [ "$(awk '{ print $2 }' <<<"$domains" | sort -u | wc -l)" -eq 2 ] ||
      fail "tut: both slices on one pod ($domains)"
    $ms queued-resources ssh tut --zone $zone --node=all --worker=all \
      --command 'hostname -I' > "$scratch/ssh.out"
    cat "$scratch/ssh.out"
    answers=0
    while read -r node worker host; do
      expected=$(host_address "$host")
      got=$(sed -n "s/^\[node $node worker $worker\] //p" "$scratch/ssh.out" |
              tr -d ' ')
      [ "$got" = "$expected" ] ||
        fail "ssh: node $node worker $worker answered '$got', expected $expected (host $host)"
      answers=$((answers + 1))
    done < <(node_hosts tut)
    [ "$answers" -eq 4 ] || fail "ssh: $answers workers answered, expected 4"
    phase_done
  fi

  if wants shardings; then
    phase shardings
    one_device
    mkdir -p "$scratch/code"
    echo "the tutorial's code" > "$scratch/code/README"
    (cd "$scratch" &&
      timeout 120 $ms run --tpu_prefix tut --zone $zone --script_dir code \
        --run_name shard --command "$(command -v $ms) shardings -dd 2 -if 8 $shard_flags") \
      > "$scratch/run.out" 2>&1 || fail "run: $(tail -n 5 "$scratch/run.out")"
    outputs=("$scratch"/runs/shard/output_slice_*_worker_*.txt)
    [ "${#outputs[@]}" -eq 4 ] || fail "run: ${#outputs[@]} output files, expected 4"
    # Process 0 (slice 0 worker 0) reports for the job; run's exit 0 says
    # every worker finished.
    check_report "run" "$scratch/runs/shard/output_slice_0000_worker_0000.txt"
    phase_done
  fi
  if wants tutorial || wants shardings; then
    $ms queued-resources delete tut --zone $zone --force --quiet > /dev/null
  fi

  # The tiny training run of the manual and job phases (job_command_test's
  # model, smaller): 16 devices on 2 cores.
  dataset="$scratch/ds"
  $ms data prepare --output "$dataset" > /dev/null
  mkdir -p "$scratch/code"
  write_tiny_config "$scratch/code/tiny.yml" "$dataset" 24 6 \
    "ici_fsdp_parallelism: 8"
  train="$(command -v $ms) train tiny.yml"

  if wants manual; then
    phase manual
    one_device
    # Hosts by hand: slice 0 on h1, h2 (pod0), slice 1 on h3, h4 (pod1).
    slice_hosts=("$(address_of h1),$(address_of h2)"
                 "$(address_of h3),$(address_of h4)")
    # manual_run NAME COMMAND: one process per host, the environment alone;
    # waits for all (bounded) and fails naming the first that failed.
    manual_run() {
      local name="$1" command="$2" pids=() s w ns
      rm -rf "$scratch/manual-$name"
      mkdir -p "$scratch/manual-$name/store"
      for s in 0 1; do
        for w in 0 1; do
          IFS=, read -r -a hs <<<"${slice_hosts[$s]}"
          ns=$(namespace_of "${hs[$w]}")
          (cd "$scratch/code" && ip netns exec "$ns" env \
            MEGASCALE_COORDINATOR_ADDRESS="file://$scratch/manual-$name/store" \
            MEGASCALE_NUM_SLICES=2 MEGASCALE_SLICE_ID=$s \
            TPU_WORKER_ID=$w TPU_WORKER_HOSTNAMES="${slice_hosts[$s]}" \
            MULTISLICE_ACCELERATOR_TYPE=v4-16 MULTISLICE_RUN_ID="manual-$name" \
            timeout 150 bash -c "$command" \
            > "$scratch/manual-$name/slice$s-worker$w.txt" 2>&1) &
          pids+=($!)
        done
      done
      local i=0 code
      for s in 0 1; do
        for w in 0 1; do
          code=0
          wait "${pids[$i]}" || code=$?
          [ "$code" -eq 0 ] || fail "manual $name: slice $s worker $w exited $code:" \
            "$(tail -n 5 "$scratch/manual-$name/slice$s-worker$w.txt")"
          i=$((i + 1))
        done
      done
    }
    manual_run shardings "$(command -v $ms) shardings -dd 2 -if 8 $shard_flags"
    check_report "manual" "$scratch/manual-shardings/slice0-worker0.txt"
    manual_run train "$train base_output_directory=$scratch/manual-train/out run_name=ref"
    losses "$scratch/manual-train/out/ref/metrics.jsonl" \
      "$scratch/reference_losses" || fail "manual train: no metrics"
    [ "$(wc -l < "$scratch/reference_losses")" -eq 24 ] ||
      fail "manual train: $(wc -l < "$scratch/reference_losses") steps, expected 24"
    echo "$prog: manual training: 24 steps, last loss $(tail -n 1 "$scratch/reference_losses")"
    phase_done
  fi

  if wants job; then
    phase job
    [ -s "$scratch/reference_losses" ] || fail "job needs the manual phase's losses"
    out="$scratch/jobs"
    (cd "$scratch" && MULTISLICE_TEST_STEP_DELAY_MS=100 timeout 200 $ms job \
      --accelerator_type v4-16 --num_slices 2 --output_dir "$out" \
      --run_name heal --script_dir code --failure_grace_seconds 30 \
      --timeout_seconds 180 \
      --command "MULTISLICE_TEST_STEP_DELAY_MS=100 $train base_output_directory=\$MULTISLICE_OUTPUT_DIR run_name=\$MULTISLICE_RUN_NAME") \
      > "$scratch/job.out" 2>&1 &
    job=$!
    metrics="$out/heal/metrics.jsonl"
    steps_in() { [ -s "$metrics" ] && [ "$(grep -c '"step"' "$metrics")" -ge "$1" ]; }
    wait_until 120 "the job's first 8 steps" steps_in 8
    # A host of the slice on pod0, the pod with the spare (h5).
    victim="" victim_node=""
    while read -r node worker host; do
      if [ "$(host_domain "$host")" = pod0 ] && [ -z "$victim" ]; then
        victim=$host victim_node=$node
      fi
    done < <(node_hosts job-heal)
    [ -n "$victim" ] || fail "job: no slice on pod0"
    spare=$(hosts_table | awk '$3 == "pod0" && $4 == "-" { print $1 }')
    echo "$prog: failing $victim (node $victim_node, pod0); spare $spare"
    $ms admin fail-host "$victim"
    wait_until 60 "job-heal repaired (attempt 2, ACTIVE)" bash -c "
      $ms queued-resources describe job-heal --zone $zone --format json |
        python3 -c 'import json,sys; q=json.load(sys.stdin); sys.exit(not (q[\"attempt\"] >= 2 and q[\"state\"][\"state\"] == \"ACTIVE\"))'"
    repaired=$(node_hosts job-heal | awk -v n="$victim_node" '$1 == n { print $3 }' | tr '\n' ' ')
    echo "$prog: node $victim_node repaired on $repaired"
    [[ " $repaired " == *" $spare "* ]] ||
      fail "job: node $victim_node repaired on $repaired, not on the spare $spare"
    check_slices_in_one_pod job-heal > /dev/null
    code=0
    wait "$job" || code=$?
    [ "$code" -eq 0 ] || fail "job exited $code: $(tail -n 10 "$scratch/job.out")"
    python3 - "$metrics" "$scratch/reference_losses" <<'EOF' || fail "job: losses differ"
import json, sys
final, attempts = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "step" in r:
        final[r["step"]] = r["loss"]
        attempts.setdefault(r.get("attempt", 0), 0)
        attempts[r.get("attempt", 0)] += 1
reference = {}
for line in open(sys.argv[2]):
    step, loss = line.split()
    reference[int(step)] = float(loss)
if len(attempts) < 2:
    sys.exit(f"metrics of attempts {sorted(attempts)}: expected a restart")
if sorted(final) != sorted(reference):
    sys.exit(f"steps {sorted(final)} != {sorted(reference)}")
bad = [s for s in final if final[s] != reference[s]]
if bad:
    sys.exit(f"steps {bad}: losses {[final[s] for s in bad]} != "
             f"{[reference[s] for s in bad]}")
print(f"cluster_tutorial_test: job: {len(final)} steps over attempts "
      f"{sorted(attempts)} ({attempts}), every loss the uninterrupted run's")
EOF
    # Every worker restarted: each of the 4 startup-script logs has attempt 2.
    restarted=0
    for log in "$cluster_workdir"/hosts/h*/workers/job-heal.*/startup-script.log; do
      [ -e "$log" ] || continue
      grep -q "=== attempt 2 ===" "$log" && restarted=$((restarted + 1))
    done
    [ "$restarted" -ge 4 ] || fail "job: $restarted workers ran attempt 2, expected 4"
    grep -q "resumed from checkpoint step" "$out"/heal/main_command_log_slice_0_worker_0 ||
      fail "job: slice 0 worker 0 did not resume from a checkpoint"
    phase_done
  fi
  exit 0
fi

# ---------------------------------------------------------------------------
# Outside: skip when this machine cannot run it, build the cluster, check
# that nothing is left.
require_root "network namespaces"
require_tools ip tc python3 bc timeout
require_netns_veth_htb
make_scratch "${1:-$root/build/bin/multislice}" cluster-test t
run_cluster "cluster and tutorial" 250 --hosts 5 --accelerator_type v4-16 \
  --dcn_mbit 200 --check_links
# Nothing left: namespaces, processes, the cluster's files.
check_nothing_left
