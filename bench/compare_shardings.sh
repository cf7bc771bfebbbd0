#!/usr/bin/env bash
# Runs the shardings training step with ours (`multislice shardings`) and with
# the PyTorch peer (bench/pytorch_shardings.py, DDP over Gloo) on the same
# sizes, dtype and device counts, one after the other, and prints a table with
# the ratio ours/peer of TFLOP/s per device. See bench/README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
PY=/usr/bin/python3  # Debian's Python, the one with Debian's python3-torch

usage() {
  cat <<EOF
Usage: bench/compare_shardings.sh [options]

Runs \`multislice shardings\` and the PyTorch peer (bench/pytorch_shardings.py)
on the same sizes and device counts; prints step times and TFLOP/s per device
of both and the ratio ours/peer of TFLOP/s per device (> 1: ours is faster).

Options (environment variable in brackets; a flag wins over the variable):
  -d, --embedding_dimension D  [EMBEDDING_DIMENSION]  default 1024
  -b, --batch_size B           rows per device [BATCH_SIZE]  default 2048
  -n, --num_layers L           [NUM_LAYERS]  default 4
  --dtype LIST                 bf16, f32 or both ("bf16,f32") [DTYPE]  default bf16
  --steps K                    timed steps after 1 warm-up [STEPS]  default 5
  --configs LIST               device configurations [CONFIGS]  default "1,2":
                                 N    one slice of N devices: ours -if N,
                                      peer --num_devices N
                                 SxN  S slices of N devices: ours -dd S -if N,
                                      peer --num_devices S*N
  --multislice PATH            our binary [MULTISLICE]  default build/bin/multislice
  --ours_args "ARGS"           extra arguments for ours [OURS_ARGS]
  --peer_args "ARGS"           extra arguments for the peer [PEER_ARGS]
  --timeout SECONDS            limit on each run [RUN_TIMEOUT]  default 900
  --logs DIR                   keep every run's output in DIR [LOGS]
  -h, --help                   this text

Exit status: 0 if every run succeeded, 1 if one failed, 2 on a usage error or
a missing binary or interpreter.
EOF
}

die() { echo "compare_shardings: $*" >&2; exit 2; }

d="${EMBEDDING_DIMENSION:-1024}"
b="${BATCH_SIZE:-2048}"
n="${NUM_LAYERS:-4}"
dtypes="${DTYPE:-bf16}"
steps="${STEPS:-5}"
configs="${CONFIGS:-1,2}"
ms="${MULTISLICE:-$root/build/bin/multislice}"
ours_args="${OURS_ARGS:-}"
peer_args="${PEER_ARGS:-}"
run_timeout="${RUN_TIMEOUT:-900}"
logs="${LOGS:-}"

need() { [ $# -ge 2 ] || die "option $1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    -d|--embedding_dimension) need "$@"; d="$2"; shift 2 ;;
    -b|--batch_size) need "$@"; b="$2"; shift 2 ;;
    -n|--num_layers) need "$@"; n="$2"; shift 2 ;;
    --dtype) need "$@"; dtypes="$2"; shift 2 ;;
    --steps) need "$@"; steps="$2"; shift 2 ;;
    --configs) need "$@"; configs="$2"; shift 2 ;;
    --multislice) need "$@"; ms="$2"; shift 2 ;;
    --ours_args) need "$@"; ours_args="$2"; shift 2 ;;
    --peer_args) need "$@"; peer_args="$2"; shift 2 ;;
    --timeout) need "$@"; run_timeout="$2"; shift 2 ;;
    --logs) need "$@"; logs="$2"; shift 2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

is_pos_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
for v in "$d" "$b" "$n" "$steps" "$run_timeout"; do
  is_pos_int "$v" || die "'$v' is not a positive integer"
done
dtypes="${dtypes//,/ }"
for t in $dtypes; do
  [ "$t" = bf16 ] || [ "$t" = f32 ] || die "dtype '$t' is not bf16 or f32"
done
configs="${configs//,/ }"
for c in $configs; do
  [[ "$c" =~ ^[1-9][0-9]*(x[1-9][0-9]*)?$ ]] || die "configuration '$c' is not N or SxN"
done
[ -n "${dtypes// /}" ] || die "no dtype given"
[ -n "${configs// /}" ] || die "no configuration given"

# Everything needed is checked before anything runs.
if [ ! -e "$ms" ]; then
  die "our binary $ms is missing: build it first (scripts/build.sh), or point --multislice / MULTISLICE at it"
fi
[ -x "$ms" ] || die "our binary $ms is not executable"
[ -x "$PY" ] || die "$PY is missing (Debian 12: apt-get install python3)"
"$PY" -c "import torch" 2>/dev/null || "$root/scripts/install_deps.sh" --peer
"$PY" -c "import torch" 2>/dev/null ||
  die "$PY cannot import torch: apt-get install python3-torch (and libopenblas0-pthread for f32)"
peer="$here/pytorch_shardings.py"
[ -f "$peer" ] || die "$peer is missing"

if [ -n "$logs" ]; then
  mkdir -p "$logs"
  tmp=""
else
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/compare_shardings.XXXXXX")"
  logs="$tmp"
fi
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT

# Prints "TFLOP/s-per-device median min max" (step times in seconds) from
# the JSON object (one line, possibly after a "[slice s worker w]" prefix) in
# a run's stdout; the first object that has tflops_per_device wins. The median
# is median_step_time_s or else step_time_s (the peer's step_time_s is its
# median; ours' is the seed's mean); min and max are step_time_min_s or
# min_step_time_s (and the same for max), "-" when absent. TFLOP/s per device
# is tflop_per_device / median where both are given, so both sides are rated
# on their median step; else the reported tflops_per_device. Exit 1 if there
# is no such object.
extract() {
  "$PY" - "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1], errors="replace"):
    i = line.find("{")
    if i < 0:
        continue
    try:
        o = json.loads(line[i:])
    except ValueError:
        continue
    if not isinstance(o, dict) or "tflops_per_device" not in o:
        continue
    def f(*keys):
        for k in keys:
            if o.get(k) is not None:
                return repr(float(o[k]))
        return "-"
    med = f("median_step_time_s", "step_time_s")
    rate = f("tflops_per_device")
    if o.get("tflop_per_device") is not None and med != "-" and float(med) > 0:
        rate = repr(float(o["tflop_per_device"]) / float(med))
    print(rate, med, f("step_time_min_s", "min_step_time_s"),
          f("step_time_max_s", "max_step_time_s"))
    sys.exit(0)
sys.exit(1)
EOF
}

# run NAME CMD...: runs one benchmark under `timeout`, output in
# $logs/NAME.{out,err}; sets `figures` to what extract prints, or to "failed"
# (the tail of the output goes to stderr). The command runs in the background
# so that INT/TERM reach the trap at once; the trap stops it (timeout passes
# the signal on to the command's whole process group).
current=""
run() {
  local name="$1"; shift
  echo "+ $*" >&2
  local rc=0
  timeout --kill-after=15 "$run_timeout" "$@" >"$logs/$name.out" 2>"$logs/$name.err" </dev/null &
  current=$!
  wait "$current" || rc=$?
  current=""
  figures=""
  if [ "$rc" -eq 0 ]; then
    figures="$(extract "$logs/$name.out")" || {
      echo "compare_shardings: $name printed no JSON object with tflops_per_device" >&2
      rc=1
    }
  fi
  if [ "$rc" -ne 0 ]; then
    {
      [ "$rc" -eq 124 ] && echo "compare_shardings: $name timed out after ${run_timeout}s"
      echo "compare_shardings: $name failed (exit $rc); the end of its output:"
      for f in err out; do
        [ -s "$logs/$name.$f" ] || continue
        echo "  std$f:"
        tail -n 5 "$logs/$name.$f" | sed 's/^/    /'
      done
    } >&2
    figures=failed
  fi
}
# shellcheck disable=SC2317  # called by the INT and TERM traps
stop() {
  if [ -n "$current" ]; then
    kill -TERM "$current" 2>/dev/null || true
    wait "$current" 2>/dev/null || true
  fi
  exit "$1"
}
trap 'stop 130' INT
trap 'stop 143' TERM

torch_version="$("$PY" -c 'import torch; print(torch.__version__)')"
mkldnn="$("$PY" -c 'import torch; print(torch.backends.mkldnn.is_available())')"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# shardings step: ours ($ms) vs PyTorch $torch_version (DDP over Gloo, mkldnn $mkldnn)"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, ${cpu:-unknown CPU}"
echo "# -d $d -b $b (per device) -n $n --steps $steps; step times: median (min-max) in seconds;"
echo "# TFLOP/s per device = TFLOP per device / median step time; ours/peer > 1: ours is faster"

rows=()
failed=0
for t in $dtypes; do
  for c in $configs; do
    if [[ "$c" == *x* ]]; then
      s="${c%x*}"; k="${c#*x}"
      mesh=(-dd "$s" -if "$k")
    else
      s=1; k="$c"
      mesh=(-if "$k")
    fi
    devices=$((s * k))
    # shellcheck disable=SC2206  # word splitting of the extra arguments is wanted
    ours=("$ms" shardings -d "$d" -b "$b" -n "$n" --dtype "$t" --steps "$steps"
          "${mesh[@]}" --json $ours_args)
    # shellcheck disable=SC2206
    theirs=("$PY" "$peer" -d "$d" -b "$b" -n "$n" --dtype "$t" --steps "$steps"
            --num_devices "$devices" --json $peer_args)
    run "ours_${c}_$t" "${ours[@]}"; o="$figures"
    run "peer_${c}_$t" "${theirs[@]}"; p="$figures"
    [ "$o" = failed ] && failed=1
    [ "$p" = failed ] && failed=1
    rows+=("$c|$devices|$t|$o|$p")
  done
done

"$PY" - "${rows[@]}" <<'EOF'
import sys
hdr = ("config", "devices", "dtype", "ours step s", "ours TFLOP/s/dev",
       "peer step s", "peer TFLOP/s/dev", "ours/peer")
out = [hdr]
def step(f):
    if f[1] == "-":
        return "-"
    s = f"{float(f[1]):.4f}"
    if f[2] != "-" and f[3] != "-":
        s += f" ({float(f[2]):.4f}-{float(f[3]):.4f})"
    return s
for row in sys.argv[1:]:
    c, n, t, o, p = row.split("|")
    o, p = o.split(), p.split()
    cells = [c, n, t]
    for f in (o, p):
        if f == ["failed"]:
            cells += ["failed", "failed"]
        else:
            cells += [step(f), f"{float(f[0]):.4f}"]
    if o != ["failed"] and p != ["failed"] and float(p[0]) > 0:
        cells.append(f"{float(o[0]) / float(p[0]):.3f}")
    else:
        cells.append("-")
    out.append(cells)
w = [max(len(r[i]) for r in out) for i in range(len(hdr))]
for i, r in enumerate(out):
    print("| " + " | ".join(x.ljust(w[j]) for j, x in enumerate(r)) + " |")
    if i == 0:
        print("|" + "|".join("-" * (x + 2) for x in w) + "|")
EOF

exit "$failed"
