#!/usr/bin/env bash
# Goodput of a DiLoCo job that loses a slice (issue 17, point 4): 3 local
# slices of cpu-1, one DiLoCo replica each, a small model; after step KILL
# the script SIGKILLs slice 2's worker (found by its MEGASCALE_SLICE_ID).
#   rejoin: diloco_continue_on_failure=true: the other two go on, and the
#        launcher starts slice 2 again, which rejoins at the next sync.
#   on:  diloco_continue_on_failure=true diloco_max_slice_restarts=0: the
#        other two go on to the end without it.
#   off: the job stops; the script starts the same command again at once
#        (what `multislice job` does after a repair, without the repair's
#        wait), which resumes from the in-memory replicas and then trains
#        on 3 slices again.
# Per mode: the wall time from the first start to the end, the productive
# step time (the steps kept in the final model: a step trained twice counts
# once), goodput = productive / wall, the longest step (where the loss was
# noticed) against the median step, and the tokens trained.
# Usage: bench/diloco_lost_slice.sh [STEPS] [KILL] [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ms=$PWD/build/bin/multislice
steps=${1:-300}
kill_after=${2:-100}
out=${3:-$(mktemp -d /tmp/multislice-lost-slice-XXXXXX)}
mkdir -p "$out"
echo "# diloco_lost_slice.sh: $(date -u +%FT%TZ), $(nproc) CPUs," \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "commit $(git rev-parse --short HEAD); outputs in $out"
[ -d "$out/ds" ] || $ms data prepare --output "$out/ds" >/dev/null

train_args=(train configs/quickstart.yml "dataset_path=$out/ds"
  "base_output_directory=$out/runs" steps="$steps" emb_dim=128
  num_decoder_layers=4 num_heads=4 mlp_dim=512 max_target_length=64
  per_device_batch_size=8 eval_interval=100000 checkpoint_period=100000
  enable_checkpointing=false enable_in_memory_recovery=true
  in_memory_replica_period=10 enable_diloco=true diloco_sync_period=12
  diloco_wire_dtype=int8 dcn_diloco_parallelism=3 dcn_data_parallelism=1
  ici_fsdp_parallelism=1 ici_data_parallelism=1
  --num_slices 3 --accelerator_type cpu-1)

# Kills slice 2's worker once metrics.jsonl has step $kill_after (or gives
# up when the job `pid` has ended).
kill_at_step() {
  local metrics=$1 pid=$2
  until [ -f "$metrics" ] && python3 - "$metrics" "$kill_after" <<'EOF'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if l.strip()]
sys.exit(0 if steps and max(steps) >= int(sys.argv[2]) else 1)
EOF
  do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
  for p in $(pgrep -f "$ms train" || true); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null |
      grep -qx 'MEGASCALE_SLICE_ID=2'; then
      kill -9 "$p"
      echo "  killed slice 2's worker (pid $p) after step $kill_after"
    fi
  done
}

run_mode() {  # name, continue_on_failure, more keys...
  local name=$1 keep=$2 start end
  shift 2
  local keys=("diloco_continue_on_failure=$keep" "$@")
  rm -rf "/dev/shm/multislice-$(id -u)"/local-slice*/"$name"
  echo "== $name: ${keys[*]}, $steps steps, slice 2 killed after step" \
    "$kill_after"
  echo "\$ $ms ${train_args[*]} ${keys[*]} run_name=$name"
  start=$(date +%s.%N)
  $ms "${train_args[@]}" "${keys[@]}" "run_name=$name" \
    >"$out/$name.1.out" 2>"$out/$name.1.err" &
  local job=$!
  kill_at_step "$out/runs/$name/metrics.jsonl" $job
  local code=0
  wait $job || code=$?
  echo "  first run exited with $code"
  if [ "$code" != 0 ]; then
    $ms "${train_args[@]}" "${keys[@]}" \
      "run_name=$name" >"$out/$name.2.out" 2>"$out/$name.2.err" ||
      echo "  second run exited with $?"
  fi
  end=$(date +%s.%N)
  grep -ho "slice 2 rejoined after step [0-9]*" "$out/$name.1.err" |
    sed 's/^/  /' || true
  python3 - "$out/runs/$name/metrics.jsonl" "$start" "$end" <<'EOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
wall = float(sys.argv[3]) - float(sys.argv[2])
kept = {}
for r in recs:  # the last record of a step is the one the model kept
    kept[r["step"]] = r
productive = sum(r["step_time_s"] for r in kept.values())
times = [r["step_time_s"] for r in kept.values()]
med = statistics.median(times)
worst = max(kept.values(), key=lambda r: r["step_time_s"])
recomputed = len(recs) - len(kept)
tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in kept.values())
print(f"  wall {wall:.2f} s, steps {len(kept)}, recomputed {recomputed}, "
      f"productive step time {productive:.2f} s, goodput "
      f"{100 * productive / wall:.1f} %")
print(f"  median step {med * 1000:.1f} ms, longest step {worst['step']} "
      f"{worst['step_time_s'] * 1000:.1f} ms, starts "
      f"{len(set(r['resume'] for r in recs))}, tokens trained {tokens:.0f}")
full = max(r["tokens_per_s"] * r["step_time_s"] for r in recs)
fewer = [r for r in kept.values()
         if r["tokens_per_s"] * r["step_time_s"] < 0.99 * full]
if fewer:
    first = min(fewer, key=lambda r: r["step"])
    before = [r["step_time_s"] for r in kept.values() if r["step"] < first["step"]]
    after = [r["step_time_s"] for r in fewer if r["step"] > first["step"]]
    after_text = (f"{statistics.median(after) * 1000:.1f} ms" if after
                  else "none")
    print(f"  the loss noticed at step {first['step']}: that step "
          f"{first['step_time_s'] * 1000:.1f} ms; median step before "
          f"{statistics.median(before) * 1000:.1f} ms, after {after_text} "
          f"with {first['tokens_per_s'] * first['step_time_s'] / full:.3f} "
          f"of the batch")
    last = max(r["step"] for r in fewer)
    if last < max(kept):
        back = [r["step_time_s"] for r in kept.values() if r["step"] > last + 1]
        print(f"  {len(fewer)} steps with fewer rows; the whole batch again "
              f"from step {last + 1} ({kept[last + 1]['step_time_s'] * 1000:.1f}"
              f" ms), median step after it {statistics.median(back) * 1000:.1f} ms")
EOF
}

run_mode rejoin true
run_mode lost-on true diloco_max_slice_restarts=0
run_mode lost-off false
