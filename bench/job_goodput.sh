#!/usr/bin/env bash
# Goodput of a self-healing training job that loses a host (issue 6): a
# local controller with 3 hosts (one spare), `multislice job` training the
# quickstart model on 2 slices, `multislice admin fail-host` on slice 1's
# host after FAIL_AFTER seconds; run twice, without and with in-memory
# recovery. Prints each job's goodput.json summary and the time from the
# host failure to the first step of the new attempt.
# Usage: bench/job_goodput.sh [STEPS] [FAIL_AFTER_SECONDS] [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ms=$PWD/build/bin/multislice
steps=${1:-5000}
fail_after=${2:-300}
out=${3:-$(mktemp -d /tmp/multislice-goodput-XXXXXX)}
mkdir -p "$out"
data=$out/controller

$ms controller --port 0 --data-dir "$data" --local-hosts 3 \
  --local-accelerator-type cpu-1 >"$out/controller.out" 2>&1 &
controller=$!
trap 'kill $controller 2>/dev/null; wait $controller 2>/dev/null || true' EXIT
until url=$(grep -o 'http://[0-9.:]*' "$out/controller.out" | head -1) &&
  [ -n "$url" ]; do sleep 0.1; done
sleep 2  # the agents register
conn=(--controller "$url" --token-file "$data/token")

run_job() {  # name, extra train keys
  local name=$1 extra=$2
  $ms job "${conn[@]}" --accelerator_type cpu-1 --num_slices 2 \
    --output_dir "$out/jobs" --run_name "$name" --script_dir "$PWD/configs" \
    --timeout_seconds 7200 --command "$ms train quickstart.yml \
      base_output_directory=\$MULTISLICE_OUTPUT_DIR \
      run_name=\$MULTISLICE_RUN_NAME steps=$steps eval_interval=500 \
      checkpoint_period=100 $extra" >"$out/$name.job.out" 2>&1 &
  local job=$!
  sleep "$fail_after"
  local host
  host=$(curl -s -H "Authorization: Bearer $(cat "$data/token")" \
    "$url/v2alpha1/projects/local/locations/local-a/queuedResources/job-$name" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][1]["hosts"][0])')
  local failed_at
  failed_at=$(date +%s.%N)
  $ms admin fail-host "$host" "${conn[@]}"
  wait $job || echo "job $name exited with $?"
  python3 - "$out/jobs/$name" "$failed_at" <<'EOF'
import json, sys
job_dir, failed_at = sys.argv[1], float(sys.argv[2])
g = json.load(open(job_dir + "/goodput.json"))
recs = [json.loads(l) for l in open(job_dir + "/metrics.jsonl") if l.strip()]
last = max(r["attempt"] for r in recs)
first = min(r["time"] - r["step_time_s"] for r in recs if r["attempt"] == last)
keys = ["wall_seconds", "training_seconds", "steps", "recomputed_steps",
        "recomputed_seconds", "failures", "detection_seconds",
        "repair_seconds", "restart_seconds", "other_seconds",
        "goodput_percent", "outcome"]
print(job_dir.rsplit("/", 1)[1] + ": " +
      ", ".join(f"{k} {g[k]:.2f}" if isinstance(g[k], float) else f"{k} {g[k]}"
                for k in keys))
print(f"  host failure to the first step of attempt {last}: "
      f"{first - failed_at:.2f} s")
EOF
  grep -h "restored step\|resumed from" "$out/jobs/$name"/main_command_log_slice_0_worker_0 || true
}

run_job checkpoint ""
run_job in-memory "enable_in_memory_recovery=true in_memory_replica_period=10"
echo "outputs in $out"
