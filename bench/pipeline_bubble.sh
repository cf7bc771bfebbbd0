#!/usr/bin/env bash
# The measured pipeline bubble of GPipe and 1F1B against (p - 1) / (m + p - 1)
# (issue 16: "within 10 % of the formula, for the compute-bound part of the
# step"). One slice of cpu-P with ici_pipeline_parallelism=P, f32, a GPT of
# 8 layers of width 256 (the layers split evenly; the embeddings and the
# small head add little to the first and last stage), 128 rows of 64 tokens
# per pipeline, no checkpoints or evaluation. For each schedule and number
# of microbatches m it trains STEPS steps and reads each step's
# `pipeline_bubble` from metrics.jsonl (the part of the stage's
# forward/backward schedule it did not compute, as process 0's device, stage
# 0, measured it): the median over the steps after the first two, against
# the formula. Each stage needs a core of its own (a stage that waits frees
# its core for the others otherwise, and the bubble disappears into the
# contention), so P above the CPU count is skipped with a line saying so.
# Run it when nothing else is running.
# Usage: bench/pipeline_bubble.sh [STAGES [STEPS [OUTPUT_DIR]]]
#   e.g. bench/pipeline_bubble.sh 2 12; bench/pipeline_bubble.sh 4 12
set -euo pipefail
cd "$(dirname "$0")/.."
ms=build/bin/multislice
stages=${1:-2}
steps=${2:-12}
out=${3:-$(mktemp -d /tmp/multislice-pipeline-bubble-XXXXXX)}
mkdir -p "$out"
echo "# $(date -u +%FT%TZ), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $stages stages"
if [ "$(nproc)" -lt "$stages" ]; then
  echo "skipped: $stages stages need $stages CPUs (one per stage), this machine has $(nproc)"
  exit 0
fi
rows_per_device=$((128 / stages))
for schedule in GPipe 1F1B; do
  for m in 4 8; do
    run="$schedule-m$m"
    "$ms" train configs/base.yml base_output_directory="$out" "run_name=$run" \
      "steps=$steps" dtype=f32 emb_dim=256 num_heads=4 num_decoder_layers=8 \
      mlp_dim=1024 max_target_length=64 "per_device_batch_size=$rows_per_device" \
      "ici_pipeline_parallelism=$stages" ici_fsdp_parallelism=1 \
      dcn_data_parallelism=1 "num_pipeline_microbatches=$m" \
      "pipeline_parallel_schedule=$schedule" enable_checkpointing=false \
      eval_interval=100000 --num_slices 1 --accelerator_type "cpu-$stages" \
      --json >"$out/$run.out" 2>"$out/$run.err"
    python3 - "$out/$run/metrics.jsonl" "$schedule" "$stages" "$m" <<'PY'
import json, statistics, sys
path, schedule, p, m = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
records = [json.loads(line) for line in open(path)]
timed = records[2:]
bubble = statistics.median(r["pipeline_bubble"] for r in timed)
seconds = statistics.median(r["pipeline_seconds"] for r in timed)
formula = (p - 1) / (m + p - 1)
print(f"{schedule:5} p={p} m={m:2}: measured bubble {bubble:.3f} "
      f"(min {min(r['pipeline_bubble'] for r in timed):.3f}, max "
      f"{max(r['pipeline_bubble'] for r in timed):.3f}), formula {formula:.3f}, "
      f"measured / formula {bubble / formula:.2f}; schedule {seconds:.3f} s")
PY
  done
done
