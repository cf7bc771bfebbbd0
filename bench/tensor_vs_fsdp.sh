#!/usr/bin/env bash
# Tensor parallelism against FSDP on the same two devices (issue 16: "tensor
# parallelism 2 inside a slice: step time within 1.3x of fsdp 2 for the
# quickstart model"). One slice of cpu-2, the quickstart model and batch
# (per_device_batch_size 16 x 64 tokens, global batch 32 rows either way),
# no checkpoints or evaluation; the two meshes alternate for ROUNDS rounds
# of STEPS steps, and each round's mean step time (steps after the first,
# multislice train --json) is kept. Prints the medians and their ratio.
# Run it when nothing else is running.
# Usage: bench/tensor_vs_fsdp.sh [ROUNDS [STEPS [OUTPUT_DIR]]]
set -euo pipefail
cd "$(dirname "$0")/.."
ms=build/bin/multislice
rounds=${1:-3}
steps=${2:-30}
out=${3:-$(mktemp -d /tmp/multislice-tensor-vs-fsdp-XXXXXX)}
mkdir -p "$out"
common=(configs/quickstart.yml base_output_directory="$out" "steps=$steps"
  eval_interval=100000 enable_checkpointing=false dcn_data_parallelism=1
  --num_slices 1 --accelerator_type cpu-2 --json)
step_time() {  # step_time RUN ARGS...: one round's mean step time in seconds
  "$ms" train "${common[@]}" "run_name=$1" "${@:2}" |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["mean_step_time_s"])'
}
echo "# $(date -u +%FT%TZ), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
fsdp=() tensor=()
for r in $(seq 1 "$rounds"); do
  fsdp+=("$(step_time "fsdp$r" ici_fsdp_parallelism=2 ici_tensor_parallelism=1)")
  tensor+=("$(step_time "tensor$r" ici_fsdp_parallelism=1 ici_tensor_parallelism=2)")
  echo "round $r: fsdp 2 ${fsdp[-1]} s, tensor 2 ${tensor[-1]} s"
done
python3 - "${fsdp[*]}" "${tensor[*]}" <<'PY'
import statistics, sys
f = [float(x) for x in sys.argv[1].split()]
t = [float(x) for x in sys.argv[2].split()]
mf, mt = statistics.median(f), statistics.median(t)
print(f"median step: fsdp 2 {mf:.4f} s, tensor 2 {mt:.4f} s; tensor / fsdp = {mt / mf:.3f} (limit 1.3)")
PY
