#!/usr/bin/env bash
# Issue 17's figures (docs/performance.md, "DiLoCo over a thin DCN"):
#
#   loss: DCN bytes per step and validation loss at equal tokens, the
#         quickstart model (configs/quickstart.yml, 2 local slices): (a) data
#         parallelism as configured, (b) DiLoCo with 2 replicas, H = 36 (or
#         --sync_period; outer lr, momentum and inner lr as given) and
#         an int8 wire, (c) the same with an f32 wire, (d) data parallelism
#         with its per-step all-reduce on an int8 wire. Per run: the mean
#         and total `dcn_bytes` of metrics.jsonl (what slice 0's process sent
#         over DCN), DP / run, the final val_loss and its difference from
#         DP's. When (b) is more than 3 % above DP's val_loss at the default
#         outer lr, (b) runs again at --retry_outer_lr (the paper's 0.7).
#   thin: throughput over a DCN shaped to 1/100 of R90, the rate at which
#         the plan (`multislice plan`, the 1-slice step measured here) puts
#         data parallelism at 90 % scaling efficiency, with
#         bench/dcn_netns.sh --workload train (root): DP at R90 (the check),
#         then DP, DiLoCo and Streaming DiLoCo at R90 / 100. Per run: the
#         mean wall time per counted step (a DiLoCo step that waits for a
#         sync counts in full: the median of dcn_netns.sh would hide it),
#         tokens/s per device against the two 1-slice trainings run at the
#         same time (the same CPU contention) and against the 1-slice run
#         alone, dcn_bytes per step.
#   plot: the loss against wall time of the thin runs, as an SVG
#         (bench/loss_time_plot.py).
#
# Run it when nothing else runs, under the machine's measurement lock, e.g.
#   flock /tmp/ms-slurm.lock bench/diloco_figures.sh --only loss --steps 550
#   sudo flock /tmp/ms-slurm.lock bench/diloco_figures.sh --only thin \
#     --svg docs/diloco_loss_vs_time.svg
# Before each run it waits until the 1-minute load average is below
# --max_load. Every command it runs is printed before its figures.
set -euo pipefail
cd "$(dirname "$0")/.."
prog=diloco_figures.sh

usage() {
  cat <<'EOF'
Usage: bench/diloco_figures.sh [options]

  --only PARTS          comma-separated: loss, thin, plot (default loss,thin,plot;
                        thin needs root; plot reads the thin runs of --out)
  --out DIR             where runs and logs go; default a new /tmp directory
  --multislice PATH     default build/bin/multislice (copied first)
  --max_load L          wait for a 1-minute load average below L; default 0.6
  --load_wait S         longest wait for it, then measure anyway (said); default 900

loss:
  --steps K             training steps of every run; default 550 (the config's)
  --outer_lr X          diloco_outer_lr of (b) and (c); default 0.3 (MaxText's)
  --outer_momentum X    diloco_outer_momentum of (b) and (c); default 0.9
  --sync_period H       diloco_sync_period of (b) and (c); default 36
  --inner_lr X          learning_rate of every loss run (DP's too); default the config's
  --retry_outer_lr X    (b) again at X when it misses 3 % of DP; default 0.7 (0 = never)
  --loss_runs LIST      comma-separated subset of dp,diloco_int8,diloco_f32,dp_int8,
                        and diloco_int8_hH (diloco_int8 with sync period H)

thin:
  -d D, -n L, -b B      the model and batch (emb_dim D, L layers, B sequences of 64
                        tokens per device); default 128, 4, 16
  --r90_mbit R          R90 in Mbit/s instead of the plan's (then no probe run)
  --dp_steps K          counted steps of DP at R90 / 100; default 3 (after 1 skipped)
  --diloco_steps K      counted steps of the DiLoCo runs; default 72 (2 periods, after 2)
  --thin_runs LIST      comma-separated subset of r90_dp,thin_dp,thin_diloco,
                        thin_streaming_f2,thin_streaming_f4 (f4 needs L % 4 == 0)
  --svg FILE            where plot writes; default OUT/diloco_loss_vs_time.svg
  -h, --help            this text
EOF
}
usage_error() { echo "$prog: $*" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }

only=loss,thin,plot out="" multislice=build/bin/multislice max_load=0.6 load_wait=900
steps=550 outer_lr=0.3 outer_momentum=0.9 sync_period=36 inner_lr=""
retry_outer_lr=0.7 loss_runs=dp,diloco_int8,diloco_f32,dp_int8
d=128 n=4 b=16 r90_mbit="" dp_steps=3 diloco_steps=72 svg=""
thin_runs=r90_dp,thin_dp,thin_diloco,thin_streaming_f2,thin_streaming_f4
need() { [ $# -ge 2 ] || usage_error "option $1 needs a value (see --help)"; }
# Every option takes a value and sets the variable of its name (-d sets d).
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    -d|-n|-b|--only|--out|--multislice|--max_load|--load_wait|--steps|--outer_lr| \
    --outer_momentum|--sync_period|--inner_lr| \
    --retry_outer_lr|--loss_runs|--r90_mbit|--dp_steps|--diloco_steps|--thin_runs|--svg)
      need "$@"
      name="${1#-}"
      printf -v "${name#-}" '%s' "$2"
      shift 2 ;;
    *) usage_error "unknown argument '$1' (see --help)" ;;
  esac
done
for part in ${only//,/ }; do
  case "$part" in loss|thin|plot) ;; *) usage_error "--only: '$part' is not loss, thin or plot" ;; esac
done
has() { [[ ",$1," == *",$2,"* ]]; }
for pair in "steps:$steps" "sync_period:$sync_period" "d:$d" "n:$n" "b:$b" "dp_steps:$dp_steps" "diloco_steps:$diloco_steps" "load_wait:$load_wait"; do
  [[ "${pair#*:}" =~ ^[0-9]+$ ]] || usage_error "--${pair%%:*} '${pair#*:}' is not a whole number"
done
[ -x "$multislice" ] || fail "$multislice is missing: flock /tmp/ms-build.lock ninja -C build multislice"
if has "$only" thin && [ "$(id -u)" -ne 0 ]; then
  fail "--only thin runs bench/dcn_netns.sh, which must run as root"
fi
out="${out:-$(mktemp -d /tmp/multislice-diloco-figures-XXXXXX)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$out/multislice"
if has "$only" loss || has "$only" thin; then cp "$multislice" "$bin"; fi
svg="${svg:-$out/diloco_loss_vs_time.svg}"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

say() { printf '%s\n' "$*"; }
# wait_load: until the 1-minute load average is below --max_load.
wait_load() {
  local start=$SECONDS load
  while :; do
    load="$(cut -d' ' -f1 /proc/loadavg)"
    python3 -c "import sys; sys.exit(0 if $load < $max_load else 1)" && break
    if [ $((SECONDS - start)) -ge "$load_wait" ]; then
      say "# warning: load average still $load after ${load_wait}s; measuring anyway"
      break
    fi
    sleep 15
  done
  say "# $(date -u +%H:%M:%SZ) load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
# show ARGS...: prints the command (on the script's stdout, fd 3, whatever
# the command's own output is redirected to), then runs it.
exec 3>&1
show() { printf '$ %s\n' "$*" >&3; "$@"; }

say "# $prog: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, ${cpu:-unknown CPU}, kernel $(uname -r), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); outputs in $out"

# ---------------------------------------------------------------- loss
loss_keys() {  # loss_keys NAME: the key=value overrides of one loss run
  local diloco="dcn_diloco_parallelism=2 dcn_data_parallelism=1 enable_diloco=true"
  diloco+=" diloco_sync_period=$sync_period diloco_outer_momentum=$outer_momentum"
  local lr=""
  if [ -n "$inner_lr" ]; then lr="learning_rate=$inner_lr"; fi
  case "$1" in
    dp) echo "$lr" ;;
    diloco_int8) echo "$lr $diloco diloco_outer_lr=$outer_lr diloco_wire_dtype=int8" ;;
    diloco_f32) echo "$lr $diloco diloco_outer_lr=$outer_lr diloco_wire_dtype=f32" ;;
    diloco_int8_lr*) echo "$lr $diloco diloco_outer_lr=${1#diloco_int8_lr} diloco_wire_dtype=int8" ;;
    diloco_int8_h*)  # another sync period (the later key wins)
      echo "$lr $diloco diloco_sync_period=${1#diloco_int8_h} diloco_outer_lr=$outer_lr diloco_wire_dtype=int8" ;;
    dp_int8) echo "$lr dcn_gradient_wire_dtype=int8" ;;
    *) usage_error "--loss_runs: '$1' is not dp, diloco_int8, diloco_f32, diloco_int8_hH or dp_int8" ;;
  esac
}
loss_run() {  # loss_run NAME: one quickstart training, its --json in NAME.json
  local name="$1" keys
  keys="$(loss_keys "$name")"
  wait_load
  # shellcheck disable=SC2086  # the keys are words
  show "$bin" train configs/quickstart.yml base_output_directory="$out/loss" \
    "run_name=$name" "steps=$steps" enable_checkpointing=false $keys --json \
    >"$out/loss/$name.json" 2>"$out/loss/$name.err" ||
    fail "run $name failed: $(tail -n 2 "$out/loss/$name.err")"
}
# loss_summary NAMES...: the table of figure 1 (dp first, the reference).
loss_summary() {
  python3 - "$out/loss" "$@" <<'EOF'
import json, sys
root, names = sys.argv[1], sys.argv[2:]
rows = {}
for name in names:
    recs = [json.loads(l) for l in open(f"{root}/{name}/metrics.jsonl") if l.strip()]
    recs = [r for r in recs if "step" in r]
    summary = json.loads(open(f"{root}/{name}.json").read().strip().splitlines()[-1])
    b = [r["dcn_bytes"] for r in recs]
    vals = [r["val_loss"] for r in recs if "val_loss" in r]
    wall = recs[-1]["time"] - (recs[0]["time"] - recs[0]["step_time_s"])
    rows[name] = dict(steps=len(recs), mean=sum(b) / len(b), total=sum(b),
                      sync_steps=sum(1 for x in b if x > 0.5 * max(b)), val=vals[-1],
                      loss=recs[-1]["loss"], wall=wall, step=summary["mean_step_time_s"],
                      platform=summary["platform"])
ref = rows.get("dp")
p = next(iter(rows.values()))["platform"]
print(f"# ISA: {p.get('isa')} (oneDNN {p.get('onednn_isa')}; {p.get('matmul')}), CPU {p.get('cpu')}")
print("| run | steps | mean dcn_bytes per step | total dcn_bytes | DP / run | steps with the most bytes | final val_loss | vs DP | mean step | wall |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, r in rows.items():
    ratio = f"{ref['mean'] / r['mean']:.1f}" if ref and r["mean"] > 0 else "-"
    diff = f"{100 * (r['val'] - ref['val']) / ref['val']:+.2f} %" if ref else "-"
    print(f"| {name} | {r['steps']} | {r['mean']:,.0f} | {r['total']:,.0f} | {ratio} | "
          f"{r['sync_steps']} | {r['val']:.4f} | {diff} | {r['step']:.3f} s | {r['wall']:.0f} s |")
EOF
}
# val_diff NAME: (NAME's final val_loss - dp's) / dp's, in %.
val_diff() {
  python3 - "$out/loss" "$1" <<'EOF'
import json, sys
def val(name):
    recs = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}/metrics.jsonl") if l.strip()]
    return [r["val_loss"] for r in recs if "val_loss" in r][-1]
print(100 * (val(sys.argv[2]) - val("dp")) / val("dp"))
EOF
}

if has "$only" loss; then
  mkdir -p "$out/loss"
  say "== 1. DCN bytes and val_loss at equal tokens: configs/quickstart.yml, steps=$steps, 2 local slices"
  names=()
  for name in ${loss_runs//,/ }; do
    loss_run "$name"
    names+=("$name")
  done
  if has "$loss_runs" dp && has "$loss_runs" diloco_int8 && [ "$retry_outer_lr" != 0 ]; then
    miss="$(val_diff diloco_int8)"
    if python3 -c "import sys; sys.exit(0 if $miss > 3 else 1)"; then
      say "# diloco_int8 at outer lr $outer_lr is $(printf '%.2f' "$miss") % above DP (bar 3 %): again at outer lr $retry_outer_lr"
      loss_run "diloco_int8_lr$retry_outer_lr"
      names+=("diloco_int8_lr$retry_outer_lr")
    fi
  fi
  loss_summary "${names[@]}" | tee "$out/loss/summary.md"
fi

# ---------------------------------------------------------------- thin
vocab=256 seq_len=64
# The trainer's parameter count, as bench/dcn_netns.sh counts it.
params=$((vocab * d + seq_len * d + n * (4 * d * d + 2 * d * 4 * d + 9 * d + 4 * d) + 2 * d))
tokens=$((b * seq_len))
thin_keys() {  # thin_keys NAME: dcn_netns.sh's --dcn_keys of one thin run
  local diloco="dcn_data_parallelism=1 dcn_diloco_parallelism=2 enable_diloco=true diloco_sync_period=36 diloco_wire_dtype=int8"
  case "$1" in
    r90_dp|thin_dp) echo "dcn_data_parallelism=2" ;;
    thin_diloco) echo "$diloco" ;;
    thin_streaming_f2) echo "$diloco enable_streaming_diloco=true num_diloco_fragments=2 num_communication_overlapping_steps=17" ;;
    thin_streaming_f4) echo "$diloco enable_streaming_diloco=true num_diloco_fragments=4 num_communication_overlapping_steps=8" ;;
    *) usage_error "--thin_runs: '$1' is not r90_dp, thin_dp, thin_diloco, thin_streaming_f2 or thin_streaming_f4" ;;
  esac
}
thin_counts() {  # thin_counts NAME: "SKIPPED COUNTED" steps of one thin run
  case "$1" in
    r90_dp) echo "2 10" ;;
    thin_dp) echo "1 $dp_steps" ;;
    *) echo "2 $diloco_steps" ;;
  esac
}

if has "$only" thin; then
  mkdir -p "$out/thin"
  say "== 2. throughput over a DCN shaped to R90 / 100: emb_dim $d, $n layers, 4 heads, mlp $((4 * d)), vocabulary $vocab, $b x $seq_len = $tokens tokens per device and step, N = $params parameters"
  if [ -z "$r90_mbit" ]; then
    # R90 from the plan: the 1-slice step measured now gives the achieved
    # FLOP/s (6 N tokens / step, --mfu 1), and a bisection over the link
    # rate finds where data parallelism of 2 slices is at 90 %.
    wait_load
    show "$bin" train configs/base.yml base_output_directory="$out/thin" run_name=probe steps=22 \
      "per_device_batch_size=$b" "max_target_length=$seq_len" "emb_dim=$d" num_heads=4 \
      "mlp_dim=$((4 * d))" "num_decoder_layers=$n" "vocab_size=$vocab" ici_fsdp_parallelism=-1 \
      dcn_data_parallelism=1 enable_checkpointing=false eval_interval=100000 --num_slices 1 --json \
      >"$out/thin/probe.json" 2>"$out/thin/probe.err" || fail "the probe run failed: $(tail -n 2 "$out/thin/probe.err")"
    step1="$(python3 -c 'import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(statistics.median(x["step_time_s"] for x in r if x["step"] > 2))' "$out/thin/probe/metrics.jsonl")"
    achieved="$(python3 -c "print(6 * $params * $tokens / $step1)")"
    plan_eff() {
      "$bin" plan --accelerator_type cpu-1 --num_slices 2 --parameters "$params" \
        --tokens_per_slice "$tokens" --peak_flops_per_chip "$achieved" --mfu 1 \
        --dcn_gbps_per_host "$1" --gradient_dtype f32 --dcn_volume ring --strategy dcn_data --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["estimate"]["scaling_efficiency"])'
    }
    lo=0.0001 hi=100
    for _ in $(seq 1 40); do
      mid="$(python3 -c "import math; print(math.sqrt($lo * $hi))")"
      if python3 -c "import sys; sys.exit(0 if $(plan_eff "$mid") < 0.9 else 1)"; then lo="$mid"; else hi="$mid"; fi
    done
    r90_mbit="$(python3 -c "print(round($hi * 1e3, 3))")"
    say "# 1-slice step $(printf '%.4f' "$step1") s (median of steps 3-22) = $(python3 -c "print(round($achieved / 1e9, 2))") GFLOP/s achieved (6 N tokens / step)"
    say "# R90 = $r90_mbit Mbit/s: multislice plan --accelerator_type cpu-1 --num_slices 2 --parameters $params --tokens_per_slice $tokens --peak_flops_per_chip $achieved --mfu 1 --gradient_dtype f32 --dcn_volume ring --strategy dcn_data --dcn_gbps_per_host $hi gives scaling_efficiency $(plan_eff "$hi")"
  fi
  thin_mbit="$(python3 -c "print(round($r90_mbit / 100, 4))")"
  say "# R90 $r90_mbit Mbit/s, R90 / 100 = $thin_mbit Mbit/s each way"
  echo "$r90_mbit $thin_mbit $d $n $b $params" >"$out/thin/rates"
  for name in ${thin_runs//,/ }; do
    if [ "$name" = thin_streaming_f4 ] && [ $((n % 4)) -ne 0 ]; then
      say "# $name skipped: 4 fragments of whole layers need a multiple of 4 layers, not $n"
      continue
    fi
    read -r skip count <<<"$(thin_counts "$name")"
    rate="$thin_mbit" extra=(--no_linkcheck) timeout=900
    [ "$name" != r90_dp ] || { rate="$r90_mbit" extra=() timeout=300; }
    rm -rf "$out/thin/$name-runs" "$out/thin/$name-logs"
    wait_load
    show bench/dcn_netns.sh --workload train -d "$d" -n "$n" -b "$b" --heads 4 \
      --rate_mbit "$rate" --skip_steps "$skip" --steps "$count" --repeats 1 \
      --dcn_keys "$(thin_keys "$name")" "${extra[@]}" --timeout "$timeout" \
      --multislice "$bin" --runs_dir "$out/thin/$name-runs" --logs "$out/thin/$name-logs" \
      >"$out/thin/$name.txt" 2>&1 || fail "bench/dcn_netns.sh for $name failed: $(tail -n 3 "$out/thin/$name.txt")"
    grep -E '^(ISA|device peak|step,|measured scaling|predicted|link check|DCN bytes)' "$out/thin/$name.txt" | sed 's/^/  /'
    echo "$name $skip $count" >>"$out/thin/done"
  done
  # The figures: mean wall time per counted step from each training's
  # metrics.jsonl (from the start of the first counted step to the end of
  # the last), so a step that waited for a sync counts in full.
  python3 - "$out/thin" "$tokens" <<'EOF' | tee "$out/thin/summary.md"
import glob, json, os, statistics, sys
root, tokens = sys.argv[1], int(sys.argv[2])
def steps(path, first, last):
    r = {x["step"]: x for x in (json.loads(l) for l in open(path) if l.strip()) if "step" in x}
    return [r[k] for k in range(first, last + 1)], r
def mean_wall(path, first, last):
    s, _ = steps(path, first, last)
    return (s[-1]["time"] - (s[0]["time"] - s[0]["step_time_s"])) / len(s)
def last_run(d, prefix):  # the kept run: dcn_netns.sh keeps the last of a discarded series
    runs = sorted(glob.glob(f"{d}/{prefix}[0-9]*"), key=lambda p: int(p.rsplit(prefix, 1)[1].split("-")[0]))
    return runs[-1]
print("| run | link | counted steps | mean step, 2 slices | median step | 2 x 1-slice at once: mean step | 1 slice alone | tokens/s per device | vs 2 x 1-slice | vs 1 slice alone | mean dcn_bytes per counted step | final loss | val_loss |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for line in open(f"{root}/done"):
    name, skip, count = line.split()
    first, last = int(skip) + 1, int(skip) + int(count)
    d = f"{root}/{name}-runs"
    link = [l for l in open(f"{root}/{name}.txt") if l.startswith("# link:")][0].split("tbf rate ")[1].split(" each")[0]
    dcn = last_run(d, "dcn")
    m = mean_wall(f"{dcn}/metrics.jsonl", first, last)
    s, allr = steps(f"{dcn}/metrics.jsonl", first, last)
    med = statistics.median(x["step_time_s"] for x in s)
    skip_dir = last_run(d, "skip").rsplit("-slice", 1)[0]
    base = statistics.mean(mean_wall(f"{skip_dir}-slice{k}/metrics.jsonl", first, last) for k in (0, 1))
    one = mean_wall(f"{d}/one/metrics.jsonl", first, last)
    dcn_bytes = statistics.mean(x["dcn_bytes"] for x in s)
    final = allr[max(allr)]
    print(f"| {name} | {link} | {first}-{last} | {m:.4f} s | {med:.4f} s | {base:.4f} s | {one:.4f} s | "
          f"{tokens / m:,.0f} | **{100 * base / m:.1f} %** | {100 * one / m:.1f} % | {dcn_bytes:,.0f} | "
          f"{final['loss']:.4f} | {final.get('val_loss', float('nan')):.4f} |")
EOF
fi

# ---------------------------------------------------------------- plot
if has "$only" plot; then
  [ -f "$out/thin/done" ] || fail "no thin runs in $out/thin to plot (run --only thin first)"
  read -r r90_mbit thin_mbit d n b params <"$out/thin/rates"
  curves=()
  while read -r name _ _; do
    [ "$name" != r90_dp ] || continue
    dcn="$(find "$out/thin/$name-runs" -maxdepth 1 -name 'dcn[0-9]*' | sort -V | tail -n 1)"
    case "$name" in
      thin_dp) label="data parallelism (all-reduce every step, f32)" ;;
      thin_diloco) label="DiLoCo H=36, int8" ;;
      thin_streaming_f2) label="Streaming DiLoCo H=36, 2 fragments, overlap 17, int8" ;;
      thin_streaming_f4) label="Streaming DiLoCo H=36, 4 fragments, overlap 8, int8" ;;
      *) label="$name" ;;
    esac
    curves+=("$label=$dcn/metrics.jsonl")
  done <"$out/thin/done"
  show python3 bench/loss_time_plot.py --out "$svg" \
    --title "2 slices over a DCN of $thin_mbit Mbit/s each way (R90 / 100)" \
    --subtitle "GPT emb_dim $d, $n layers, $params parameters, $b x 64 tokens per slice and step; ${cpu:-CPU}, 1 core per slice" \
    "${curves[@]}"
  say "# wrote $svg"
fi
