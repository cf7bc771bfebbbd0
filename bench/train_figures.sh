#!/usr/bin/env bash
# The figures of `multislice train` recorded in docs/performance.md, measured
# in one run on this machine (run it when nothing else is running):
#   1. MFU of the training step on 1 device, quickstart model size;
#   2. mean step time with a checkpoint every 10 steps vs without (2 slices);
#   3. a synchronous save vs the disk's sequential write bandwidth;
#   4. kill -9 of a worker, then the time from restarting the same command
#      to its first new step.
# Usage: bench/train_figures.sh [OUTPUT_DIR]   (default: a temporary dir)
set -euo pipefail
cd "$(dirname "$0")/.."
ms=build/bin/multislice
config=configs/quickstart.yml
out=${1:-$(mktemp -d /tmp/multislice-train-figures-XXXXXX)}
mkdir -p "$out"
common=(base_output_directory="$out" eval_interval=100000)
json() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print($1)"; }

echo "== 1. MFU on one device (quickstart model, 60 steps)"
$ms train $config "${common[@]}" run_name=mfu steps=60 \
  enable_checkpointing=false dcn_data_parallelism=1 --num_slices 1 --json |
  json '"mean step %.4f s, %.0f tokens/s, MFU %.1f%% of %.3f TFLOP/s (step %.4f TFLOP)" % (d["mean_step_time_s"], d["tokens_per_s"], 100*d["mean_mfu"], d["peak_tflops_per_device"], d["step_tflop_per_device"])'

echo "== 2. checkpoint every 10 steps vs none (2 slices, 150 steps each, twice)"
# Wall time per step between the first and the last step's end (metrics.jsonl
# "time"), so that everything a save costs the loop counts: the blocking copy
# out of the buffers and the background writer competing for the cores.
wall_per_step() {
  python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print((r[-1]["time"]-r[0]["time"])/(len(r)-1))' "$out/$1/metrics.jsonl"
}
for rep in 1 2; do
  $ms train $config "${common[@]}" run_name=none$rep steps=150 \
    enable_checkpointing=false --json >/dev/null
  $ms train $config "${common[@]}" run_name=ckpt$rep steps=150 \
    checkpoint_period=10 --json >/dev/null
  none=$(wall_per_step none$rep)
  ckpt=$(wall_per_step ckpt$rep)
  saves=$(ls -d "$out/ckpt$rep"/checkpoints/*/ | wc -l)
  python3 -c "print('rep $rep: without %.4f s/step, with checkpoint_period=10 %.4f s/step (15 saves, %d kept), ratio %.3f' % ($none, $ckpt, $saves, $ckpt/$none))"
done

echo "== 3. synchronous save vs sequential write (same directory: $out)"
$ms bench checkpoint --config $config --directory "$out" --reps 5

echo "== 4. kill -9 of a worker after a checkpoint, then restart"
run=resume
$ms train $config "${common[@]}" run_name=$run steps=400 checkpoint_period=20 \
  --json >"$out/first.out" 2>"$out/first.err" &
launcher=$!
while [ ! -e "$out/$run/checkpoints/60/COMMITTED" ]; do sleep 0.05; done
worker=$(cat /proc/$launcher/task/$launcher/children | awk '{print $2}')
kill -9 "$worker"
wait $launcher || true
before=$(wc -l <"$out/$run/metrics.jsonl")
start=$(date +%s.%N)
$ms train $config "${common[@]}" run_name=$run steps=400 checkpoint_period=20 \
  >"$out/second.out" 2>"$out/second.err" &
second=$!
while [ "$(wc -l <"$out/$run/metrics.jsonl")" -le "$before" ]; do sleep 0.01; done
end=$(date +%s.%N)
kill $second 2>/dev/null || true
wait $second 2>/dev/null || true
restored=$(grep -o 'resumed from checkpoint step [0-9]*' "$out/second.out" || true)
python3 -c "print('restart to first new step: %.2f s (%s; %d steps had been trained before the kill)' % ($end - $start, '$restored', $before))"
echo "outputs in $out"
