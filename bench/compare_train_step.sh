#!/usr/bin/env bash
# One device's training step, ours against PyTorch's, in the same run.
#
# Alternates `build/bin/train_step_bench --json` (forward, backward, clipping
# and AdamW of src/model/decoder.h, with the 2048^3 matmul peak of the step's
# dtype measured just before) and the peer: bench/pytorch_gpt_step.py (GPT-2,
# f32) or, with --decoder_block llama2|gemma, bench/pytorch_llama_step.py (the
# same block in f32, or bf16 under autocast with --dtype bfloat16), in
# Debian's PyTorch 1.13 on one thread with OpenBLAS on one thread, for
# --repeats rounds, and prints each round and the medians: our step time, the
# peer's, their ratio (peer / ours: > 1 means ours is faster) and our MFU.
#
# MULTISLICE_MAX_ISA=avx2 caps both sides at AVX2 (ours through our kernels
# and oneDNN; the peer through ATEN_CPU_CAPABILITY, DNNL_MAX_CPU_ISA and
# OPENBLAS_CORETYPE=HASWELL), which is how an AVX2-only CPU is measured on an
# AVX-512 machine.
#
#   bench/compare_train_step.sh                        # quickstart model, float32
#   MULTISLICE_MAX_ISA=avx2 bench/compare_train_step.sh --repeats 5
#   bench/compare_train_step.sh --size 8,128,256,4,1024,4 --dtype bfloat16
#   bench/compare_train_step.sh --decoder_block llama2 --dtype bfloat16
#       (the Llama quickstart model: --size 16,64,384,6,1024,2 --kv_heads 2
#        --head_dim 64 --vocab 8192 unless given)
#
# Needs: build/bin/train_step_bench (scripts/build.sh) and the peer's packages
# (python3-torch, libopenblas0-pthread), which it installs with
# scripts/install_deps.sh --peer when torch is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

size=  # B,T,C,NH,mlp,L; default: the quickstart model on one device
dtype=float32
repeats=5
steps=10
block=gpt3 kv_heads= head_dim= vocab=

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  echo "flags: --size B,T,C,NH,mlp,L  --dtype float32|bfloat16  --repeats N  --steps N"
  echo "       --decoder_block gpt3|llama2|gemma  --kv_heads N  --head_dim N  --vocab V"
}
while [ $# -gt 0 ]; do
  case $1 in
    --size) size=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --decoder_block) block=$2; shift 2 ;;
    --kv_heads) kv_heads=$2; shift 2 ;;
    --head_dim) head_dim=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare_train_step.sh: unknown flag '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $dtype in
  float32|f32) ours_dtype=--f32 ;;
  bfloat16|bf16) ours_dtype= ;;
  *) echo "compare_train_step.sh: --dtype: '$dtype' is not float32 or bfloat16" >&2; exit 2 ;;
esac
case $block in
  gpt3) size=${size:-16,64,384,6,1536,2} vocab=${vocab:-256} ;;
  llama2|gemma) size=${size:-16,64,384,6,1024,2} kv_heads=${kv_heads:-2}
                head_dim=${head_dim:-64} vocab=${vocab:-8192} ;;
  *) echo "compare_train_step.sh: --decoder_block: '$block' is not gpt3, llama2 or gemma" >&2; exit 2 ;;
esac
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "compare_train_step.sh: --repeats: expected a positive integer, got '$repeats'" >&2; exit 2; }
IFS=, read -r B T C NH MLP L <<<"$size"
[ -n "${L:-}" ] || { echo "compare_train_step.sh: --size: expected B,T,C,NH,mlp,L, got '$size'" >&2; exit 2; }
[ -x build/bin/train_step_bench ] || { echo "compare_train_step.sh: build/bin/train_step_bench is missing: run scripts/build.sh" >&2; exit 2; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || scripts/install_deps.sh --peer
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "compare_train_step.sh: /usr/bin/python3 cannot import torch: run scripts/install_deps.sh --peer" >&2; exit 2; }

field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }

if [ "$block" = gpt3 ]; then
  ours_model=(--vocab "$vocab")
  peer_cmd=(bench/pytorch_gpt_step.py --vocab "$vocab")
  echo "GPT-2 step B=$B T=$T C=$C NH=$NH mlp=$MLP L=$L V=$vocab, $dtype (peer: float32), MULTISLICE_MAX_ISA=${MULTISLICE_MAX_ISA:-unset}"
else
  ours_model=(--decoder_block "$block" --kv_heads "$kv_heads" --head_dim "$head_dim" --vocab "$vocab")
  peer_cmd=(bench/pytorch_llama_step.py --block "$block" --kv_heads "$kv_heads" --head_dim "$head_dim" --vocab "$vocab" --dtype "$dtype")
  echo "$block step B=$B T=$T C=$C heads=$NH/$kv_heads x $head_dim mlp=$MLP L=$L V=$vocab, $dtype (peer too), MULTISLICE_MAX_ISA=${MULTISLICE_MAX_ISA:-unset}"
fi
printf '%5s %10s %10s %8s %7s  %s\n' round ours_ms peer_ms peer/ours MFU "ours: matmul route | peer: BLAS"
ours_all=() peer_all=() ratio_all=() mfu_all=()
for r in $(seq 1 "$repeats"); do
  ours=$(build/bin/train_step_bench --only "$size" "${ours_model[@]}" $ours_dtype --steps "$steps" --json)
  peer=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "${peer_cmd[@]}" \
    --batch "$B" --seq "$T" --emb "$C" --heads "$NH" --mlp "$MLP" --layers "$L" \
    --steps "$steps" --json)
  o=$(field step_time_s <<<"$ours"); p=$(field step_time_s <<<"$peer")
  m=$(field mfu <<<"$ours")
  ratio=$(/usr/bin/python3 -c "print($p / $o)")
  ours_all+=("$o"); peer_all+=("$p"); ratio_all+=("$ratio"); mfu_all+=("$m")
  printf '%5d %10.2f %10.2f %8.3f %6.1f%%  %s | %s\n' "$r" \
    "$(/usr/bin/python3 -c "print($o*1e3)")" "$(/usr/bin/python3 -c "print($p*1e3)")" \
    "$ratio" "$(/usr/bin/python3 -c "print($m*100)")" \
    "$(field matmul <<<"$ours")" "$(field blas <<<"$peer")"
done
/usr/bin/python3 - "${ours_all[*]}" "${peer_all[*]}" "${ratio_all[*]}" "${mfu_all[*]}" <<'EOF'
import statistics, sys
ours, peer, ratio, mfu = ([float(x) for x in a.split()] for a in sys.argv[1:5])
med = statistics.median
print(f"median: ours {med(ours)*1e3:.2f} ms [{min(ours)*1e3:.2f}, {max(ours)*1e3:.2f}], "
      f"peer {med(peer)*1e3:.2f} ms [{min(peer)*1e3:.2f}, {max(peer)*1e3:.2f}], "
      f"peer/ours {med(ratio):.3f} [{min(ratio):.3f}, {max(ratio):.3f}], "
      f"MFU {med(mfu)*100:.1f}% [{min(mfu)*100:.1f}, {max(mfu)*100:.1f}]")
EOF
