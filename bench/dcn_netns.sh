#!/usr/bin/env bash
# Emulates a data-center network between two slices on one machine and checks
# the performance model against it: each slice runs in its own network
# namespace, the two joined by a veth pair shaped with `tc tbf` in both
# directions so that device FLOP/s over DCN bit/s is the seed's TPU v4 figure
# (22,000 FLOP/bit) or a chosen one. Measures the scaling efficiency of
# `multislice shardings -dd 2` or of `multislice train` with
# dcn_data_parallelism=2 (--workload train), and the CPU time the workers
# spend per step with and without DCN traffic (bench/cpu_sample.py), and
# prints them next to what `multislice plan` predicts for the same workload
# and link, and its extrapolation to 256 slices. For train, the 2-slice keys
# can be any (--dcn_keys, e.g. a pipeline of 2 stages across DCN), and
# --compare_pipeline M also trains the same global batch as a pipeline of
# depth 2 across DCN (M microbatches) after each data-parallel run, printing
# both strategies' step time and tokens/s next to the plan's per-strategy
# predictions (--emb_dim: the activations between stages counted);
# --no_baseline skips the runs of step 3. See --help and docs/performance.md
# ("DCN under a shaped link", "Slices over a DCN at the seed's ratio",
# "Pipeline across DCN against data parallelism (issue 16)").
set -euo pipefail

prog=dcn_netns.sh
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

usage() {
  cat <<'EOF'
Usage: bench/dcn_netns.sh [options]        (root only)

Puts two slices of one CPU device each (cpu-1) in two network namespaces
joined by a veth pair whose both directions are shaped with `tc tbf` to
  R = devices_per_host x device_peak / ratio   bit/s   (default ratio 22,000)
and measures, with the same per-device batch, one of two workloads:

--workload shardings (the default):
  1. `multislice shardings` on 1 slice (its own machine: gives the device's
     bf16/f32 peak, measured by the same binary, which sets R);
  2. a DCN all-reduce of the gradients' size between the namespaces
     (`multislice bench collectives --paths dcn`): the link rate a collective
     really gets (TCP/IP headers, ACKs, the ring's two phases);
  3. `multislice shardings -dd 2 --skip_dcn` in the namespaces: the baseline,
     two slices computing on the two cores exactly as in 4. but with nothing
     crossing DCN, so the CPU contention is the same as in 4.;
  4. `multislice shardings -dd 2` in the namespaces, one worker per namespace
     started by hand with the worker environment (MEGASCALE_*, TPU_WORKER_*).

--workload train: the same with `multislice train` (configs/base.yml and
  key=value overrides: a GPT of width -d, -n layers, vocabulary 256, batch
  -b sequences of --seq_len tokens per device, no checkpoints, one
  evaluation at the end):
  1. one training on 1 slice (its own machine; the trainer's start-up matmul
     peak sets R);
  2. the link check with the gradients' size: the trainer all-reduces its
     N gradients in f32 whatever the matmul dtype, so 4N bytes;
  3. baseline: two independent 1-slice trainings at once, one per namespace
     (dcn_data_parallelism=1, each its own job of the worker environment);
  4. one training of 2 slices (dcn_data_parallelism=2, or the keys of
     --dcn_keys), a worker per namespace started by hand with the worker
     environment; with --compare_pipeline M, after each of these runs one
     training of the same global batch (per_device_batch_size x 2 devices)
     as a pipeline of depth 2 across DCN: dcn_pipeline_parallelism=2
     dcn_data_parallelism=1 num_pipeline_microbatches=M
     pipeline_parallel_schedule=--pipeline_schedule (the layers split over
     the 2 slices; each microbatch's activation [rows, seq_len, D] in f32
     crosses DCN forward and its gradient back), with --pipeline_steps
     counted steps.
  Step times come from the run directory's metrics.jsonl: steps 1 to
  --skip_steps are not counted, the next --steps are, and one last step
  (which also evaluates) runs after them, uncounted. The baseline counts the
  steps of both trainings that ran while the other was still running.
  With --compare_pipeline, a last table: for step 4's keys and for the
  pipeline, the median step time (min, max), tokens/s = global tokens /
  median step (global tokens = 2 x batch x seq_len), the pipeline's measured
  bubble (metrics.jsonl pipeline_bubble), and the plan's predicted step and
  tokens/s of each strategy (`multislice plan --emb_dim -d
  --pipeline_microbatches M --json`, its "strategies" array; the peak and
  link as for the efficiency below), measured/plan of each, the ratio
  pipeline / step 4 in tokens/s measured and predicted, and what the plan
  recommends.

Both: 3. and 4. alternate --repeats times; step times are pooled over the
repeats and reported as median (min, max); a pair during which other work
used the CPUs (--max_other) is discarded and run again. Every worker of
2.-4. runs under bench/cpu_sample.py, which samples its CPU time (user +
sys, all threads, from /proc), its threads', the system's softirq time and
the namespace's network bytes;
over the timed steps this gives the CPU seconds per step of each worker in
3. and in 4.: the difference is what the DCN streams cost on the devices'
cores (no NIC offload here), printed with the share of the step it is and
the share of the step-time gap it could explain. Before each run it waits (up
to --quiet_wait s) until the CPUs are idle, and it warns when a run's own
matmul peak came out well below the 1-slice run's or its steps vary by more
than 25 % (someone else was using the CPUs: run it again).
Then runs `multislice plan` for the same workload (shardings: parameters
2*4*d*d*n, tokens per slice = batch, gradient dtype = --dtype; train: the
model's N parameters, tokens per slice = batch x seq_len, f32 gradients;
both: --mfu 1 with the baseline's achieved 6 N tokens / step as the peak,
ring volume) with the measured link rate, and again with the nominal R, and
prints

  measured efficiency = median step(baseline) / median step(2 slices)

next to the predicted scaling efficiency and their ratio (within 15 %: agree),
and the plan for 256 slices with the same per-slice numbers. For shardings a
last line, not from the plan, replays the step at the granularity of
matmuls (DCN starts when the first gradient is ready, gradients queue on the
link) to show what the plan's forward + max(backward, DCN) leaves out; for
train the same with the trainer's gradient buckets (a layer each; the first
layer's and the embeddings' is final only when the backward ends), and the
plan's step without overlap.

Options:
  --workload W                 shardings (default) or train
  -d, --embedding_dimension D  default 256 (train: 128); shardings D_FF = 4 D
  -n, --num_layers L           default 2
  -b, --batch_size B           shardings: rows per device = tokens per slice,
                               default 65536; train: sequences per device,
                               default 2752 (x 64 tokens = 176,128 tokens per
                               slice, the minimum at 22,000 FLOP/bit with f32
                               gradients: 22,000 x 32 / 4 = 176,000)
  --dtype T                    matmul dtype bf16 or f32; default bf16
  --steps K                    timed steps; default 10 (train: 6); shardings
                               runs 1 warm-up step before them
  --repeats N                  runs of 3. and of 4., alternating; default 2
  --seq_len T                  train: max_target_length; default 64
  --heads H                    train: num_heads; default 4
  --mlp_dim M                  train: mlp_dim; default 4 D
  --skip_steps K               train: first steps not counted; default 2
  --dcn_keys "K=V ..."         train: the keys of the 2-slice training of 4.;
                               default "dcn_data_parallelism=2" (e.g.
                               "dcn_pipeline_parallelism=2 dcn_data_parallelism=1
                               num_pipeline_microbatches=8"); the plan then
                               predicts that strategy (dcn_data, dcn_fsdp or a
                               pipeline of depth 2)
  --compare_pipeline M         train: after each run of 4., a pipeline of
                               depth 2 across DCN with M microbatches (M
                               divides 2 x batch) on the same global batch,
                               and the comparison table (see above)
  --pipeline_schedule S        train: 1F1B (default) or GPipe for
                               --compare_pipeline
  --pipeline_steps K           train: counted steps of the --compare_pipeline
                               runs (after --skip_steps, then one more with
                               the evaluation); default --steps. A pipeline
                               step at a large batch can take minutes
  --no_baseline                skip 3. (train only): the efficiency is then
                               against the 1-slice run of 1. (--baseline
                               one_slice), without the CPU figures that need
                               the baseline; the plan's peak is what the
                               1-slice run achieved
  --sample_interval S          seconds between CPU samples; default 0.25
  --max_other PCT              a pair of runs (3. and 4.) during which other
                               work (the system's busy time less the workers'
                               and softirq) took more than PCT % of the CPUs
                               is discarded and run again; default 5
  --retries N                  at most N such re-runs; default --repeats
  --ratio X                    target FLOP/bit (device peak / link bit/s);
                               default 22000 (the seed's TPU v4 figure)
  --peak_gflops G              device peak in GFLOP/s instead of the one the
                               1-slice run measures (sets R)
  --rate_mbit M                shape to M Mbit/s instead of peak / ratio
  --baseline B                 skip_dcn (default: 3., the same CPU
                               contention) or one_slice (1.): which run the
                               efficiency and the plan's one-slice step use
  --no_linkcheck               skip step 2; the plan then uses the nominal R
  --mtu BYTES                  veth MTU; default 9000 (jumbo frames, as on
                               data-center networks; at 1500 TCP loses 6-15 %
                               of the link to headers and the other way's ACKs)
  --tbf_latency_ms MS          tbf queue limit in time; default 20
  --tbf_burst BYTES            tbf bucket; default max(32 KiB, 4 MTUs, 2 ms at R)
  --subnet A.B.C               private /24 used inside the namespaces only;
                               default 10.213.7 (addresses .1 and .2)
  --multislice PATH            the binary; default build/bin/multislice (it is
                               copied first, so a rebuild during the run is
                               harmless)
  --timeout SECONDS            limit on each run; default 300
  --quiet_wait SECONDS         longest wait for idle CPUs before a run
                               (0: do not wait); default 120
  --logs DIR                   keep every run's output in DIR
  --runs_dir DIR               train: keep the trainings' run directories
                               (metrics.jsonl of every step: loss, time,
                               dcn_bytes) in DIR, absent or empty, instead of
                               a temporary directory removed on exit
  -h, --help                   this text

Examples (about 2 minutes, 4, and 8, on a 2-core machine):
  sudo bench/dcn_netns.sh
  sudo bench/dcn_netns.sh -b 131072 --ratio 44000 --logs /tmp/dcn-logs
  sudo bench/dcn_netns.sh --workload train --repeats 3
  sudo bench/dcn_netns.sh --workload train -n 8 -b 16 --compare_pipeline 8

Exit status: 0 when every run completed (whether or not the figures agree),
1 when not root, a tool is missing or a run failed, 2 on a usage error.
Everything it creates (namespaces, veth pair, temporary files, workers) is
removed on exit, including on error or Ctrl-C.
EOF
}

usage_error() { echo "$prog: $*" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }

workload=shardings
d="" n="" b="" dtype=bf16 steps="" ratio=22000 peak_gflops="" rate_mbit=""
repeats=2 quiet_wait=120 max_other=5 retries="" seq_len=64 heads=4 mlp_dim="" skip_steps=2
sample_interval=0.25
dcn_keys=dcn_data_parallelism=2 compare_pipeline="" pipeline_schedule=1F1B pipeline_steps=""
run_baseline=1 dcn_kind=dcn_data dcn_microbatches=2
baseline="" linkcheck=1 mtu=9000 tbf_latency_ms=20 tbf_burst=""
subnet=10.213.7 ms="$root/build/bin/multislice" run_timeout=300 logs="" runs_dir=""

need() { [ $# -ge 2 ] || usage_error "option $1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --workload) need "$@"; workload="$2"; shift 2 ;;
    --seq_len) need "$@"; seq_len="$2"; shift 2 ;;
    --heads) need "$@"; heads="$2"; shift 2 ;;
    --mlp_dim) need "$@"; mlp_dim="$2"; shift 2 ;;
    --skip_steps) need "$@"; skip_steps="$2"; shift 2 ;;
    --dcn_keys) need "$@"; dcn_keys="$2"; shift 2 ;;
    --compare_pipeline) need "$@"; compare_pipeline="$2"; shift 2 ;;
    --pipeline_schedule) need "$@"; pipeline_schedule="$2"; shift 2 ;;
    --pipeline_steps) need "$@"; pipeline_steps="$2"; shift 2 ;;
    --no_baseline) run_baseline=0; shift ;;
    --sample_interval) need "$@"; sample_interval="$2"; shift 2 ;;
    --max_other) need "$@"; max_other="$2"; shift 2 ;;
    --retries) need "$@"; retries="$2"; shift 2 ;;
    -d|--embedding_dimension) need "$@"; d="$2"; shift 2 ;;
    -n|--num_layers) need "$@"; n="$2"; shift 2 ;;
    -b|--batch_size) need "$@"; b="$2"; shift 2 ;;
    --dtype) need "$@"; dtype="$2"; shift 2 ;;
    --steps) need "$@"; steps="$2"; shift 2 ;;
    --repeats) need "$@"; repeats="$2"; shift 2 ;;
    --quiet_wait) need "$@"; quiet_wait="$2"; shift 2 ;;
    --ratio) need "$@"; ratio="$2"; shift 2 ;;
    --peak_gflops) need "$@"; peak_gflops="$2"; shift 2 ;;
    --rate_mbit) need "$@"; rate_mbit="$2"; shift 2 ;;
    --baseline) need "$@"; baseline="$2"; shift 2 ;;
    --no_linkcheck) linkcheck=0; shift ;;
    --mtu) need "$@"; mtu="$2"; shift 2 ;;
    --tbf_latency_ms) need "$@"; tbf_latency_ms="$2"; shift 2 ;;
    --tbf_burst) need "$@"; tbf_burst="$2"; shift 2 ;;
    --subnet) need "$@"; subnet="$2"; shift 2 ;;
    --multislice) need "$@"; ms="$2"; shift 2 ;;
    --timeout) need "$@"; run_timeout="$2"; shift 2 ;;
    --logs) need "$@"; logs="$2"; shift 2 ;;
    --runs_dir) need "$@"; runs_dir="$2"; shift 2 ;;
    *) usage_error "unknown argument '$1' (see --help)" ;;
  esac
done

case "$workload" in
  shardings) d="${d:-256}" n="${n:-2}" b="${b:-65536}" steps="${steps:-10}" ;;
  train) d="${d:-128}" n="${n:-2}" b="${b:-2752}" steps="${steps:-6}" ;;
  *) usage_error "--workload '$workload' is not shardings or train" ;;
esac

is_pos_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
is_pos_num() { [[ "$1" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$ ]] && [[ "$1" =~ [1-9] ]]; }
for pair in "embedding_dimension:$d" "num_layers:$n" "batch_size:$b" \
            "steps:$steps" "repeats:$repeats" "mtu:$mtu" "timeout:$run_timeout"; do
  is_pos_int "${pair#*:}" || usage_error "--${pair%%:*} '${pair#*:}' is not a positive integer"
done
if [ "$workload" = train ]; then
  mlp_dim="${mlp_dim:-$((4 * d))}"
  for pair in "seq_len:$seq_len" "heads:$heads" "mlp_dim:$mlp_dim"; do
    is_pos_int "${pair#*:}" || usage_error "--${pair%%:*} '${pair#*:}' is not a positive integer"
  done
  [[ "$skip_steps" =~ ^[0-9]+$ ]] || usage_error "--skip_steps '$skip_steps' is not a whole number"
  [ $((d % heads)) -eq 0 ] || usage_error "-d $d is not a multiple of --heads $heads"
  for kv in $dcn_keys; do
    [[ "$kv" =~ ^[a-z_]+=[^=]+$ ]] || usage_error "--dcn_keys: '$kv' is not key=value"
  done
  [ -n "${dcn_keys// /}" ] || usage_error "--dcn_keys is empty"
  pipeline_steps="${pipeline_steps:-$steps}"
  is_pos_int "$pipeline_steps" || usage_error "--pipeline_steps '$pipeline_steps' is not a positive integer"
  if [ -n "$compare_pipeline" ]; then
    is_pos_int "$compare_pipeline" || usage_error "--compare_pipeline '$compare_pipeline' is not a positive integer"
    [ $((2 * b % compare_pipeline)) -eq 0 ] ||
      usage_error "--compare_pipeline $compare_pipeline does not divide the pipeline's 2 x $b rows per step"
    [ $((n % 2)) -eq 0 ] || usage_error "--compare_pipeline needs an even -n (the layers split over 2 stages), not $n"
  fi
  [ "$pipeline_schedule" = 1F1B ] || [ "$pipeline_schedule" = GPipe ] ||
    usage_error "--pipeline_schedule '$pipeline_schedule' is not 1F1B or GPipe"
  # The strategy of 4.'s keys, for the plan: a pipeline of depth 2 when they
  # set dcn_pipeline_parallelism=2 (its microbatches, -1 = one per stage),
  # FSDP when dcn_fsdp_parallelism=2, else data parallelism.
  dcn_kind=dcn_data dcn_microbatches=2
  for kv in $dcn_keys; do
    case "$kv" in
      dcn_pipeline_parallelism=2) dcn_kind=pipeline ;;
      dcn_fsdp_parallelism=2) [ "$dcn_kind" = pipeline ] || dcn_kind=dcn_fsdp ;;
      num_pipeline_microbatches=-1) dcn_microbatches=2 ;;
      num_pipeline_microbatches=*) dcn_microbatches="${kv#*=}" ;;
    esac
  done
else
  if [ "$dcn_keys" != dcn_data_parallelism=2 ] || [ -n "$compare_pipeline" ] || [ -n "$pipeline_steps" ] ||
     [ "$run_baseline" -eq 0 ] || [ -n "$runs_dir" ]; then
    usage_error "--dcn_keys, --compare_pipeline, --pipeline_steps, --no_baseline and --runs_dir are for --workload train"
  fi
fi
if [ "$run_baseline" -eq 0 ]; then
  [ "${baseline:-one_slice}" = one_slice ] || usage_error "--no_baseline leaves no skip_dcn baseline: --baseline one_slice only"
  baseline=one_slice
fi
baseline="${baseline:-skip_dcn}"
retries="${retries:-$repeats}"
[[ "$retries" =~ ^[0-9]+$ ]] || usage_error "--retries '$retries' is not a whole number"
for pair in "ratio:$ratio" "tbf_latency_ms:$tbf_latency_ms" "sample_interval:$sample_interval" "max_other:$max_other"; do
  is_pos_num "${pair#*:}" || usage_error "--${pair%%:*} '${pair#*:}' is not a positive number"
done
[ -z "$peak_gflops" ] || is_pos_num "$peak_gflops" || usage_error "--peak_gflops '$peak_gflops' is not a positive number"
[ -z "$rate_mbit" ] || is_pos_num "$rate_mbit" || usage_error "--rate_mbit '$rate_mbit' is not a positive number"
[ -z "$tbf_burst" ] || is_pos_int "$tbf_burst" || usage_error "--tbf_burst '$tbf_burst' is not a positive integer"
[[ "$quiet_wait" =~ ^[0-9]+$ ]] || usage_error "--quiet_wait '$quiet_wait' is not a whole number of seconds"
[ "$dtype" = bf16 ] || [ "$dtype" = f32 ] || usage_error "--dtype '$dtype' is not bf16 or f32"
[ "$baseline" = skip_dcn ] || [ "$baseline" = one_slice ] || usage_error "--baseline '$baseline' is not skip_dcn or one_slice"
{ [ "$mtu" -ge 576 ] && [ "$mtu" -le 65535 ]; } || usage_error "--mtu $mtu is not in 576..65535"
[[ "$subnet" =~ ^(10\.[0-9]{1,3}\.[0-9]{1,3}|172\.(1[6-9]|2[0-9]|3[01])\.[0-9]{1,3}|192\.168\.[0-9]{1,3})$ ]] ||
  usage_error "--subnet '$subnet' is not the first three octets of a private /24 (10.x.y, 172.16-31.y, 192.168.y)"
for o in ${subnet//./ }; do [ "$o" -le 255 ] || usage_error "--subnet '$subnet' has an octet above 255"; done
# A run directory that already holds a run of the same name would have its
# metrics.jsonl appended to, so only a new or empty one.
if [ -n "$runs_dir" ] && [ -e "$runs_dir" ] && [ -n "$(ls -A "$runs_dir" 2>/dev/null)" ]; then
  usage_error "--runs_dir '$runs_dir' is not empty (the trainings' metrics.jsonl would be appended to)"
fi

[ "$(id -u)" -eq 0 ] || fail "must run as root (it creates network namespaces and tc qdiscs)"
for tool in ip tc timeout python3 ps; do
  command -v "$tool" >/dev/null || fail "'$tool' is missing (Debian 12: apt-get install iproute2 coreutils python3 procps)"
done
[ -x "$ms" ] || fail "$ms is missing or not executable: build it first (scripts/build.sh) or pass --multislice"
PY="$(command -v python3)"

# ---------------------------------------------------------------- cleanup
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ms-dcn.XXXXXX")"
ns=("ms-dcn-$$-0" "ms-dcn-$$-1")
veth=("msd$$a" "msd$$b")
addr=("$subnet.1" "$subnet.2")
created_ns=()
pids=()

# Stops one background job started under `timeout` (its own process group)
# by its id: TERM (timeout passes it on to the command), then KILL to the
# group if it has not ended within 10 s; then reaps it.
stop_job() {
  local pid="$1" i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  local pid name
  for pid in "${pids[@]}"; do stop_job "$pid"; done
  for name in "${created_ns[@]}"; do ip netns del "$name" 2>/dev/null; done
  # A veth that was created but not yet moved into a namespace.
  ip link del "${veth[0]}" 2>/dev/null
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "$prog: interrupted" >&2; exit 130' INT
trap 'echo "$prog: terminated" >&2; exit 143' TERM

# A private copy: other people rebuilding build/ cannot swap it mid-run.
bin="$tmp/multislice"
cp "$ms" "$bin"
[ -f "$here/cpu_sample.py" ] || fail "$here/cpu_sample.py is missing"
sampler="$tmp/cpu_sample.py"
cp "$here/cpu_sample.py" "$sampler"
[ -z "$logs" ] || mkdir -p "$logs"
log_dir="${logs:-$tmp}"

# ---------------------------------------------------------------- helpers
# json FILE EXPR: evaluates EXPR (Python, the object is `j`) on the first line
# of FILE that parses as a JSON object (the text may follow a prefix).
json() {
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
path, expr = sys.argv[1], sys.argv[2]
text = open(path, errors="replace").read()
objs = []
for line in text.splitlines():
    i = line.find("{")
    if i >= 0:
        try:
            objs.append(json.loads(line[i:]))
        except ValueError:
            pass
if not objs:
    try:
        objs.append(json.loads(text))
    except ValueError:
        sys.exit("no JSON object in " + path)
# null (a figure the plan has not, e.g. a pipeline's operational intensity
# without data parallelism) reads as nan, which every format prints.
def no_null(o):
    if isinstance(o, dict):
        return {k: no_null(v) for k, v in o.items()}
    if isinstance(o, list):
        return [no_null(v) for v in o]
    return float("nan") if o is None else o
j = no_null(objs[0])
print(eval(expr))
EOF
}
calc() { "$PY" -c "from math import *; print($1)"; }

last_line() {
  local l
  l="$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-300)" || true
  echo "${l:-(no output on stderr)}"
}

# run_one NAME ARGS...: `multislice ARGS` on this machine, no namespace.
run_one() {
  local name="$1"; shift
  local rc=0
  timeout -k 10 "$run_timeout" env -u MEGASCALE_COORDINATOR_ADDRESS \
    -u MEGASCALE_NUM_SLICES -u MEGASCALE_SLICE_ID -u TPU_WORKER_ID \
    -u TPU_WORKER_HOSTNAMES -u MULTISLICE_ACCELERATOR_TYPE -u MULTISLICE_RUN_ID \
    -u MULTISLICE_ATTEMPT "$bin" "$@" \
    >"$log_dir/$name.0.out" 2>"$log_dir/$name.0.err" </dev/null &
  pids=($!)
  wait "${pids[0]}" || rc=$?
  pids=()
  if [ "$rc" -ne 0 ]; then
    local why="exit $rc"
    [ "$rc" -eq 124 ] && why="timed out after ${run_timeout}s"
    fail "run '$name' (multislice $1) failed ($why): $(last_line "$log_dir/$name.0.err")"
  fi
}

# run_pair NAME SLICES ARGS...: `multislice ARGS` as two workers started by
# hand, slice s in namespace s, each under bench/cpu_sample.py (samples in
# NAME.s.cpu). SLICES 2: one job of two slices, rendezvous in a file:// store
# both can see. SLICES 1: two independent jobs of one slice each (their own
# store and run id), at the same time; "@SLICE@" in ARGS becomes s.
run_pair() {
  local name="$1" slices="$2"; shift 2
  local s rc store run_id
  pids=()
  for s in 0 1; do
    if [ "$slices" -eq 2 ]; then
      store="$tmp/store-$name" run_id="dcn-netns-$$-$name"
    else
      store="$tmp/store-$name-$s" run_id="dcn-netns-$$-$name-$s"
    fi
    mkdir -p "$store"
    timeout -k 10 "$run_timeout" ip netns exec "${ns[s]}" env \
      -u MULTISLICE_ATTEMPT -u MEGASCALE_PORT \
      MEGASCALE_COORDINATOR_ADDRESS="file://$store" \
      MEGASCALE_NUM_SLICES="$slices" MEGASCALE_SLICE_ID="$((slices == 2 ? s : 0))" \
      TPU_WORKER_ID=0 TPU_WORKER_HOSTNAMES="${addr[s]}" \
      MULTISLICE_ACCELERATOR_TYPE=cpu-1 MULTISLICE_RUN_ID="$run_id" \
      "$PY" "$sampler" run --out "$log_dir/$name.$s.cpu" --interval "$sample_interval" -- \
      "$bin" "${@//@SLICE@/$s}" >"$log_dir/$name.$s.out" 2>"$log_dir/$name.$s.err" </dev/null &
    pids+=($!)
  done
  local rcs=()
  for s in 0 1; do
    rc=0
    wait "${pids[s]}" || rc=$?
    rcs+=("$rc")
  done
  pids=()
  for s in 0 1; do
    rc="${rcs[s]}"
    if [ "$rc" -ne 0 ]; then
      local why="exit $rc"
      [ "$rc" -eq 124 ] && why="timed out after ${run_timeout}s"
      fail "run '$name' (multislice $1) failed on slice $s ($why): $(last_line "$log_dir/$name.$s.err")"
    fi
  done
}

say() { printf '%s\n' "$*"; }

# Fraction of the CPUs busy over the next second (from /proc/stat).
cpu_busy() {
  "$PY" - <<'EOF'
import time
def sample():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(v), v[3] + v[4]
t0, i0 = sample(); time.sleep(1); t1, i1 = sample()
print(round(1 - (i1 - i0) / max(1, t1 - t0), 3))
EOF
}
# wait_quiet: waits until less than 15 % of the CPUs are busy, at most
# --quiet_wait seconds; says so when it gives up.
wait_quiet() {
  [ "$quiet_wait" -gt 0 ] || return 0
  local start=$SECONDS busy
  while :; do
    busy="$(cpu_busy)"
    "$PY" -c "import sys; sys.exit(0 if $busy < 0.15 else 1)" && return 0
    if [ $((SECONDS - start)) -ge "$quiet_wait" ]; then
      say "# warning: the CPUs are still $(calc "round(100 * $busy)") % busy after ${quiet_wait}s of waiting; measuring anyway"
      return 0
    fi
    sleep 2
  done
}

# ---------------------------------------------------------------- step and CPU figures
# $tmp/stats.py MODE ...: one run's step times and its workers' CPU per step,
# as one JSON object (see each mode). CPU windows are read from the samples
# of bench/cpu_sample.py (NAME.s.cpu).
cat >"$tmp/stats.py" <<'EOF'
import importlib.util, json, statistics, sys

spec = importlib.util.spec_from_file_location("cpu_sample", sys.argv[1])
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)
mode, args = sys.argv[2], sys.argv[3:]


def first_json(path):
    for line in open(path, errors="replace"):
        i = line.find("{")
        if i >= 0:
            try:
                return json.loads(line[i:])
            except ValueError:
                pass
    sys.exit("dcn_netns.sh: no JSON result in " + path)


def records(path, first, last):
    """step -> (start, end, seconds) of steps first..last of metrics.jsonl."""
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "step" in r and first <= r["step"] <= last:
            out[r["step"]] = (r["time"] - r["step_time_s"], r["time"], r["step_time_s"])
    missing = [k for k in range(first, last + 1) if k not in out]
    if missing:
        sys.exit(f"dcn_netns.sh: {path} has no record of steps {missing}")
    return out


def per_step(cpu_file, t0, t1, count):
    w = cs.window_stats(cpu_file, t0, t1)
    f = 1.0 / count
    return {
        "steps": count, "window_s": w["seconds"], "covered": w["covered"],
        "threads_covered": w["threads_covered"],
        "cpu_s": w["cpu_s"] * f, "user_s": w["user_s"] * f, "sys_s": w["sys_s"] * f,
        "threads_s": {k: v * f for k, v in w["threads_s"].items()},
        "system_busy_s": w["system_busy_s"] * f,
        "system_softirq_s": w["system_softirq_s"] * f,
        "tx_bytes": w["net_tx_bytes"] * f, "rx_bytes": w["net_rx_bytes"] * f,
        "maxrss_kib": w["maxrss_kib"]}


def others(slices):
    """CPU seconds per step that neither worker nor softirq used: other
    processes (and the samplers), or the hypervisor's steal time."""
    w = slices[0]
    return w["system_busy_s"] - w["system_softirq_s"] - sum(x["cpu_s"] for x in slices)


if mode == "steps":
    # steps METRICS FIRST LAST: the step times of one training.
    r = records(args[0], int(args[1]), int(args[2]))
    t = [r[k][2] for k in sorted(r)]
    print(json.dumps({"step_times": t, "median": statistics.median(t)}))
elif mode == "shardings":
    # shardings STEPS OUT0 CPU0 CPU1: slice 0's timed steps (its JSON) and,
    # for each worker, the CPU over the timed steps: the last sum(timings)
    # seconds before its device thread ended (right after the last step and
    # the timings' all-reduce; seen within 20 ms).
    steps, out0, cpus = int(args[0]), args[1], args[2:]
    timings = first_json(out0)["timings_s"]
    span = sum(timings)
    # A run too short for any sample to see its device thread: up to its
    # exit instead (flagged as not covered).
    slices, tails = [], []
    for c in cpus:
        info = cs.load(c)[1]
        end = info.get("device_end_t")
        w = per_step(c, (end or info["exit_t"]) - span, end or info["exit_t"], steps)
        if end is None:
            w["covered"] = False
        tails.append(info["exit_t"] - end if end else None)
        slices.append(w)
    print(json.dumps({"step_times": timings, "slices": slices, "exit_after_s": tails,
                      "others_s": others(slices)}))
elif mode == "train":
    # train FIRST LAST METRICS... -- CPU0 CPU1: the counted steps of one
    # training (one METRICS: a job of 2 slices, whose steps are in step) or of
    # two independent ones (two METRICS, in namespace order); those of a
    # pair are kept while both ran (from the later first counted step's start
    # to the earlier exit), so that the CPU contention is the same in all.
    first, last = int(args[0]), int(args[1])
    sep = args.index("--")
    metrics, cpus = args[2:sep], args[sep + 1:]
    recs = [records(m, first, last) for m in metrics]
    lo = max(r[first][0] for r in recs) - 1e-3
    hi = min(cs.load(c)[1]["exit_t"] for c in cpus) + 1e-3
    kept = [{k: v for k, v in r.items() if v[0] >= lo and v[1] <= hi} for r in recs]
    overlap = all(kept)
    if not overlap:  # steps too short for the start-up's jitter: count all
        kept = recs
    times = [v[2] for k in kept for _, v in sorted(k.items())]
    slices = []
    for s, c in enumerate(cpus):
        k = kept[s] if len(kept) == len(cpus) else kept[0]
        steps = sorted(k)
        slices.append(per_step(c, k[steps[0]][0], k[steps[-1]][1], len(steps)))
    print(json.dumps({"step_times": times, "kept": [len(k) for k in kept],
                      "counted": last - first + 1, "overlap": overlap,
                      "slices": slices, "others_s": others(slices)}))
elif mode == "field":
    # field NAME FIRST LAST METRICS...: the median of a record's NAME over
    # steps FIRST..LAST of the trainings (e.g. pipeline_bubble).
    name, first, last = args[0], int(args[1]), int(args[2])
    rs = [json.loads(line) for m in args[3:] for line in open(m)]
    v = [r[name] for r in rs if first <= r.get("step", 0) <= last and name in r]
    print(statistics.median(v) if v else float("nan"))
elif mode == "peak":
    # peak OUTS...: the lowest matmul peak the runs measured at their start.
    print(min(first_json(f)["peak_tflops_per_device"] for f in args))
else:
    sys.exit("stats.py: unknown mode " + mode)
EOF
stats() { "$PY" "$tmp/stats.py" "$sampler" "$@"; }

# ---------------------------------------------------------------- 1. one slice
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
say "# $prog: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, ${cpu:-unknown CPU}, kernel $(uname -r)"
say "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine disturbs every figure)"
if [ "$workload" = shardings ]; then
  shard_args=(-d "$d" -n "$n" -b "$b" --dtype "$dtype" --steps "$steps" --json)
  params=$((2 * 4 * d * d * n))
  tokens="$b"
  bytes_per_value=2; [ "$dtype" = f32 ] && bytes_per_value=4
  grad_dtype="$dtype"
  grad_bytes=$((params * bytes_per_value))
  say "# workload: shardings -d $d -n $n -b $b --dtype $dtype --steps $steps; P = 2*4*d*d*n = $params parameters, gradients $grad_bytes bytes"
  say "# [1/4] 1 slice (device peak and the one-slice step time)"
  wait_quiet
  run_one one shardings "${shard_args[@]}"
  one_out="$log_dir/one.0.out"
  one_median="$(json "$one_out" 'j["median_step_time_s"]')"
  isa="$(json "$one_out" 'j.get("isa", "?")')"
  onednn_isa="$(json "$one_out" 'j.get("platform", {}).get("onednn_isa", "?")')"
else
  vocab=256
  tokens=$((b * seq_len))
  # The trainer's NumParameters (model/gpt.cc, ParameterLayout): wte V x C,
  # wpe T x C, per layer 4 C^2 + 2 C H + 9 C + H (ln1, qkv, attn_proj,
  # ln2, fc, fc_proj with their biases), lnf 2 C. Its gradients cross DCN
  # as f32 (train/trainer.cc) whatever the matmul dtype: 4 bytes each.
  params=$((vocab * d + seq_len * d + n * (4 * d * d + 2 * d * mlp_dim + 9 * d + mlp_dim) + 2 * d))
  bytes_per_value=4 grad_dtype=f32
  grad_bytes=$((params * bytes_per_value))
  first_counted=$((skip_steps + 1)) last_counted=$((skip_steps + steps))
  total_steps=$((last_counted + 1))
  train_runs="$tmp/train-runs"
  if [ -n "$runs_dir" ]; then
    mkdir -p "$runs_dir" || fail "cannot create --runs_dir '$runs_dir'"
    train_runs="$(cd "$runs_dir" && pwd)"
  fi
  dataset="$tmp/dataset"
  cp "$root/configs/base.yml" "$tmp/base.yml"
  # The evaluation splits the validation tokens over the global batch's
  # rows, each needing seq_len + 1 tokens: at the minimum batch (5,504 rows
  # of 65 over 2 slices) the default 5 % of the fortunes is too little.
  "$bin" data prepare --output "$dataset" --validation_fraction 0.2 \
    >"$log_dir/data.out" 2>"$log_dir/data.err" </dev/null ||
    fail "multislice data prepare failed: $(last_line "$log_dir/data.err")"
  train_args=(train "$tmp/base.yml" "steps=$total_steps" "per_device_batch_size=$b"
    "max_target_length=$seq_len" "emb_dim=$d" "num_heads=$heads" "mlp_dim=$mlp_dim"
    "num_decoder_layers=$n" "vocab_size=$vocab" "dtype=$dtype" ici_fsdp_parallelism=-1
    enable_checkpointing=false "eval_interval=$total_steps" eval_batches=1 log_period=1
    "dataset_path=$dataset" "base_output_directory=$train_runs" --json)
  read -r -a dcn_key_args <<<"$dcn_keys"
  # --compare_pipeline: the same training as a pipeline of depth 2 across
  # DCN, with its own number of steps (a later key overrides an earlier one).
  pipe_last=$((skip_steps + pipeline_steps)) pipe_total=$((skip_steps + pipeline_steps + 1))
  pipe_keys=(dcn_pipeline_parallelism=2 dcn_data_parallelism=1 "num_pipeline_microbatches=$compare_pipeline"
    "pipeline_parallel_schedule=$pipeline_schedule" "steps=$pipe_total" "eval_interval=$pipe_total")
  say "# workload: train emb_dim=$d num_decoder_layers=$n num_heads=$heads mlp_dim=$mlp_dim vocab_size=$vocab dtype=$dtype, per_device_batch_size=$b x max_target_length=$seq_len = $tokens tokens per slice; N = $params parameters, gradients $grad_bytes bytes (f32); steps $first_counted-$last_counted of $total_steps counted"
  say "# 2 slices (4.): $dcn_keys (plan strategy $dcn_kind)"
  [ -z "$compare_pipeline" ] ||
    say "# compared with: ${pipe_keys[*]:0:4} on the same global batch ($((2 * b)) rows, $((2 * b / compare_pipeline)) per microbatch); steps $first_counted-$pipe_last of $pipe_total counted"
  [ "$run_baseline" -eq 1 ] || say "# --no_baseline: no runs of 3.; the baseline is the 1-slice run"
  say "# [1/4] 1 slice (device peak and the one-slice step time)"
  wait_quiet
  run_one one "${train_args[@]}" run_name=one dcn_data_parallelism=1
  one_out="$log_dir/one.0.out"
  one_median="$(stats steps "$train_runs/one/metrics.jsonl" "$first_counted" "$last_counted" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["median"])')"
  isa="$(json "$one_out" 'j.get("platform", {}).get("isa", "?")')"
  onednn_isa="$(json "$one_out" 'j.get("platform", {}).get("onednn_isa", "?")')"
fi
if [ -n "$peak_gflops" ]; then
  peak="$(calc "$peak_gflops * 1e9")"; peak_source="given (--peak_gflops)"
else
  peak="$(json "$one_out" 'j["peak_tflops_per_device"] * 1e12')"
  peak_source="measured by the 1-slice run ($dtype square matmul, one thread)"
  [ "$workload" = train ] && peak_source="measured by the 1-slice training at start-up ($dtype 2048^3 matmul, one thread)"
fi
if [ -n "$rate_mbit" ]; then
  rate="$(calc "round($rate_mbit * 1e6)")"; rate_source="given (--rate_mbit)"
else
  rate="$(calc "round(1 * $peak / $ratio)")"; rate_source="1 device/host x peak / $ratio FLOP/bit"
fi
[ "$rate" -ge 8000 ] || fail "link rate $rate bit/s is below tc's 8 kbit/s minimum; lower --ratio or give --rate_mbit"
flop_per_bit="$(calc "$peak / $rate")"
burst="${tbf_burst:-$(calc "max(32768, 4 * ($mtu + 14), round($rate * 0.002 / 8))")}"

# ---------------------------------------------------------------- namespaces
for s in 0 1; do
  ip netns add "${ns[s]}" || fail "ip netns add ${ns[s]} failed"
  created_ns+=("${ns[s]}")
done
ip link add "${veth[0]}" type veth peer name "${veth[1]}" || fail "cannot create the veth pair"
for s in 0 1; do
  ip link set "${veth[s]}" netns "${ns[s]}"
  ip -n "${ns[s]}" link set lo up
  ip -n "${ns[s]}" link set "${veth[s]}" mtu "$mtu"
  ip -n "${ns[s]}" addr add "${addr[s]}/24" dev "${veth[s]}"
  ip -n "${ns[s]}" link set "${veth[s]}" up
  ip netns exec "${ns[s]}" tc qdisc add dev "${veth[s]}" root tbf \
    rate "${rate}bit" burst "$burst" latency "${tbf_latency_ms}ms" ||
    fail "tc tbf on ${veth[s]} failed (is sch_tbf available?)"
done
say "# link: ${ns[0]} ${addr[0]} <-veth-> ${addr[1]} ${ns[1]}, MTU $mtu, tbf rate $(calc "round($rate / 1e6, 3)") Mbit/s each way ($rate_source), burst $burst B, latency ${tbf_latency_ms} ms"
say "# device peak $(calc "round($peak / 1e9, 1)") GFLOP/s, $peak_source; FLOP/bit = $(calc "round($flop_per_bit)")"

# ---------------------------------------------------------------- 2. link check
link_rate=""
if [ "$linkcheck" -eq 1 ]; then
  say "# [2/4] link check: DCN all-reduce of $grad_bytes B ($grad_dtype) between the namespaces"
  wait_quiet
  run_pair link 2 bench collectives --paths dcn --ops all_reduce \
    --minbytes "$grad_bytes" --maxbytes "$grad_bytes" --iters 5 \
    --dtype "$grad_dtype" --baselines none --json
  link_out="$log_dir/link.0.out"
  r='[x for x in j["results"] if x["path"] == "dcn" and x["op"] == "all_reduce"][0]'
  link_us="$(json "$link_out" "${r}[\"out_of_place\"][\"time_us\"]")"
  link_min_us="$(json "$link_out" "${r}[\"out_of_place\"][\"min_us\"]")"
  link_max_us="$(json "$link_out" "${r}[\"out_of_place\"][\"max_us\"]")"
  link_dcn_bytes="$(json "$link_out" "${r}[\"dcn_bytes_per_device\"]")"
  # Bytes each member sent (each way) over the median time: what a ring
  # all-reduce of 2 gets from the link per direction.
  link_rate="$(calc "$link_dcn_bytes * 8 / ($link_us * 1e-6)")"
else
  say "# [2/4] link check skipped (--no_linkcheck)"
fi

# ---------------------------------------------------------------- 3, 4. two slices
skip_files=() dcn_files=() skip_stats=() dcn_stats=() pipe_files=() pipe_stats=()
# one_repeat_line FILE: median step and CPU per step of one run's stats.
one_repeat_line() {
  json "$1" "'median step %.3f s (%d steps), CPU per step %s s; other work on the 2 CPUs %.3f s per step (%.1f %%)' % (sorted(j['step_times'])[len(j['step_times']) // 2], len(j['step_times']), ' / '.join('%.3f' % x['cpu_s'] for x in j['slices']), j['others_s'], 100 * j['others_s'] / (2 * sorted(j['step_times'])[len(j['step_times']) // 2]))"
}
# disturbed FILE: true when other work took more than --max_other of the
# two CPUs during that run.
disturbed() {
  "$PY" -c "import sys; sys.exit(0 if $(json "$1" "j['others_s'] / (2 * sorted(j['step_times'])[len(j['step_times']) // 2])") > $max_other / 100 else 1)"
}
k=0 kept_runs=0 discarded=0
while [ "$kept_runs" -lt "$repeats" ]; do
  k=$((k + 1))
  if [ "$workload" = shardings ]; then
    say "# [3/4] 2 slices in the namespaces, --skip_dcn (baseline with the same CPU contention), run $k ($kept_runs of $repeats kept so far)"
    wait_quiet
    run_pair "skip$k" 2 shardings -dd 2 "${shard_args[@]}" --skip_dcn
    stats shardings "$steps" "$log_dir/skip$k.0.out" "$log_dir/skip$k.0.cpu" \
      "$log_dir/skip$k.1.cpu" >"$log_dir/skip$k.stats.json" || fail "no figures from run 'skip$k'"
    say "#   $(one_repeat_line "$log_dir/skip$k.stats.json")"
    say "# [4/4] 2 slices in the namespaces, gradients all-reduced over the shaped link, run $k ($kept_runs of $repeats kept so far)"
    wait_quiet
    run_pair "dcn$k" 2 shardings -dd 2 "${shard_args[@]}"
    stats shardings "$steps" "$log_dir/dcn$k.0.out" "$log_dir/dcn$k.0.cpu" \
      "$log_dir/dcn$k.1.cpu" >"$log_dir/dcn$k.stats.json" || fail "no figures from run 'dcn$k'"
  else
    if [ "$run_baseline" -eq 1 ]; then
      say "# [3/4] two independent 1-slice trainings at once, one per namespace (baseline with the same CPU contention), run $k ($kept_runs of $repeats kept so far)"
      wait_quiet
      run_pair "skip$k" 1 "${train_args[@]}" dcn_data_parallelism=1 "run_name=skip$k-slice@SLICE@"
      stats train "$first_counted" "$last_counted" "$train_runs/skip$k-slice0/metrics.jsonl" \
        "$train_runs/skip$k-slice1/metrics.jsonl" -- "$log_dir/skip$k.0.cpu" "$log_dir/skip$k.1.cpu" \
        >"$log_dir/skip$k.stats.json" || fail "no figures from run 'skip$k'"
      say "#   $(one_repeat_line "$log_dir/skip$k.stats.json")"
    fi
    say "# [4/4] one training of 2 slices ($dcn_keys) over the shaped link, run $k ($kept_runs of $repeats kept so far)"
    wait_quiet
    run_pair "dcn$k" 2 "${train_args[@]}" "${dcn_key_args[@]}" "run_name=dcn$k"
    stats train "$first_counted" "$last_counted" "$train_runs/dcn$k/metrics.jsonl" \
      -- "$log_dir/dcn$k.0.cpu" "$log_dir/dcn$k.1.cpu" \
      >"$log_dir/dcn$k.stats.json" || fail "no figures from run 'dcn$k'"
  fi
  say "#   $(one_repeat_line "$log_dir/dcn$k.stats.json")"
  if [ -n "$compare_pipeline" ]; then
    say "# [4/4] the same global batch as a pipeline of depth 2 across DCN (${pipe_keys[*]:0:4}), run $k ($kept_runs of $repeats kept so far)"
    wait_quiet
    run_pair "pipe$k" 2 "${train_args[@]}" "${pipe_keys[@]}" "run_name=pipe$k"
    stats train "$first_counted" "$pipe_last" "$train_runs/pipe$k/metrics.jsonl" \
      -- "$log_dir/pipe$k.0.cpu" "$log_dir/pipe$k.1.cpu" \
      >"$log_dir/pipe$k.stats.json" || fail "no figures from run 'pipe$k'"
    say "#   $(one_repeat_line "$log_dir/pipe$k.stats.json")"
  fi
  if { { [ "$run_baseline" -eq 1 ] && disturbed "$log_dir/skip$k.stats.json"; } ||
       disturbed "$log_dir/dcn$k.stats.json" ||
       { [ -n "$compare_pipeline" ] && disturbed "$log_dir/pipe$k.stats.json"; }; } &&
     [ "$discarded" -lt "$retries" ]; then
    discarded=$((discarded + 1))
    say "#   run $k discarded: other work used more than $max_other % of the CPUs during it (retry $discarded of at most $retries)"
    continue
  fi
  kept_runs=$((kept_runs + 1))
  if [ "$run_baseline" -eq 1 ]; then
    skip_files+=("$log_dir/skip$k.0.out") skip_stats+=("$log_dir/skip$k.stats.json")
  fi
  dcn_files+=("$log_dir/dcn$k.0.out") dcn_stats+=("$log_dir/dcn$k.stats.json")
  if [ -n "$compare_pipeline" ]; then
    pipe_files+=("$log_dir/pipe$k.0.out") pipe_stats+=("$log_dir/pipe$k.stats.json")
  fi
done
[ "$discarded" -eq 0 ] || say "# $discarded run(s) discarded for other work on the CPUs; the figures below pool runs $(for f in "${dcn_stats[@]}"; do f="${f##*/dcn}"; printf '%s ' "${f%.stats.json}"; done)"

# pool STATS...: the runs' step times pooled (median, min, max) and their
# workers' CPU per step averaged (over runs and both workers; the system's
# figures, which count both workers, from worker 0's samples), as JSON.
pool() {
  "$PY" - "$@" <<'EOF'
import json, statistics, sys
runs = [json.load(open(f)) for f in sys.argv[1:]]
t = [x for r in runs for x in r["step_times"]]
ws = [w for r in runs for w in r["slices"]]
mean = lambda xs: sum(xs) / len(xs)
groups = sorted({g for w in ws for g in w["threads_s"]})
print(json.dumps({
    "median": statistics.median(t), "min": min(t), "max": max(t), "n": len(t),
    "cpu_s": mean([w["cpu_s"] for w in ws]),
    "cpu_s_by_worker": [mean([r["slices"][s]["cpu_s"] for r in runs]) for s in (0, 1)],
    "user_s": mean([w["user_s"] for w in ws]), "sys_s": mean([w["sys_s"] for w in ws]),
    "threads_s": {g: mean([w["threads_s"].get(g, 0.0) for w in ws]) for g in groups},
    "system_busy_s": mean([r["slices"][0]["system_busy_s"] for r in runs]),
    "system_softirq_s": mean([r["slices"][0]["system_softirq_s"] for r in runs]),
    "others_s": mean([r["others_s"] for r in runs]),
    "others_share_max": max(r["others_s"] / (2 * statistics.median(r["step_times"])) for r in runs),
    "tx_bytes": mean([w["tx_bytes"] for w in ws]),
    "maxrss_kib": max(w["maxrss_kib"] or 0 for w in ws),
    "covered": all(w["covered"] for w in ws),
    "threads_covered": all(w["threads_covered"] for w in ws),
    "kept": [r.get("kept") for r in runs],
    "overlap": all(r.get("overlap", True) for r in runs)}))
EOF
}
[ "$run_baseline" -eq 0 ] || pool "${skip_stats[@]}" >"$log_dir/skip.pool.json"
pool "${dcn_stats[@]}" >"$log_dir/dcn.pool.json"
[ -z "$compare_pipeline" ] || pool "${pipe_stats[@]}" >"$log_dir/pipe.pool.json"
pj() { json "$1" "$2"; }
if [ "$run_baseline" -eq 1 ]; then
  skip_median="$(pj "$log_dir/skip.pool.json" 'j["median"]')"
  skip_min="$(pj "$log_dir/skip.pool.json" 'j["min"]')"
  skip_max="$(pj "$log_dir/skip.pool.json" 'j["max"]')"
fi
dcn_median="$(pj "$log_dir/dcn.pool.json" 'j["median"]')"
dcn_min="$(pj "$log_dir/dcn.pool.json" 'j["min"]')"
dcn_max="$(pj "$log_dir/dcn.pool.json" 'j["max"]')"

# lowest_peak FILES...: the lowest matmul peak a run measured at its start.
lowest_peak() { stats peak "$@"; }
st3() { calc "'%.3f (min %.3f, max %.3f)' % ($1, $2, $3)"; }
if [ "$workload" = shardings ]; then
  dcn_bytes="$(json "${dcn_files[0]}" 'j["dcn_bytes_per_device_per_step"]')"
  one_line="$(json "$one_out" "'%.3f (min %.3f, max %.3f)' % (j['median_step_time_s'], j['min_step_time_s'], j['max_step_time_s'])")"
else
  # A ring all-reduce of 2 members: each sends half the gradients in the
  # reduce-scatter and half in the all-gather.
  dcn_bytes="$grad_bytes"
  one_line="$(stats steps "$train_runs/one/metrics.jsonl" "$first_counted" "$last_counted" | "$PY" -c 'import json,sys; t=json.load(sys.stdin)["step_times"]; print("%.3f (min %.3f, max %.3f)" % (sorted(t)[len(t)//2], min(t), max(t)))')"
fi
wire_bytes="$(pj "$log_dir/dcn.pool.json" 'j["tx_bytes"]')"
lowest_peak="$(lowest_peak "${skip_files[@]}" "${dcn_files[@]}" "${pipe_files[@]}")"
one_peak="$(json "$one_out" 'j["peak_tflops_per_device"]')"

if [ "$baseline" = skip_dcn ]; then base_median="$skip_median"; else base_median="$one_median"; fi
# The plan's "peak" is the FLOP/s the baseline achieved (6 P B per step, the
# FLOPs `multislice shardings` counts; for train 6 N tokens, the plan's own
# count, while the trainer's TFLOP/s also counts attention), so its
# one-slice step is the measured baseline step and only the DCN part is
# predicted.
achieved="$(calc "6 * $params * $tokens / $base_median")"

# The plan's strategy: 4.'s (train: with the model width, so that a
# pipeline's activations count).
plan_kind_args=(--strategy dcn_data)
if [ "$workload" = train ]; then
  plan_kind_args=(--strategy "$dcn_kind" --emb_dim "$d")
  [ "$dcn_kind" != pipeline ] || plan_kind_args+=(--pipeline_depth 2 --pipeline_microbatches "$dcn_microbatches")
fi
# plan RATE_BIT_PER_S [NUM_SLICES [VOLUME [ARGS...]]]: prints the plan's
# JSON; ARGS (default plan_kind_args) choose the strategy.
plan() {
  local rate="$1" slices="${2:-2}" volume="${3:-ring}"
  shift "$(($# < 3 ? $# : 3))"
  [ $# -gt 0 ] || set -- "${plan_kind_args[@]}"
  timeout -k 5 60 "$bin" plan --accelerator_type cpu-1 --num_slices "$slices" \
    --parameters "$params" --tokens_per_slice "$tokens" \
    --peak_flops_per_chip "$achieved" --mfu 1 \
    --dcn_gbps_per_host "$(calc "$rate / 1e9")" --gradient_dtype "$grad_dtype" \
    --dcn_volume "$volume" "$@" --json
}
plan_to() {  # plan_to NAME ARGS...: plan ARGS into NAME.json
  plan "${@:2}" >"$log_dir/$1.json" 2>"$log_dir/$1.err" ||
    fail "multislice plan failed: $(last_line "$log_dir/$1.err")"
}
plan_to plan_nominal "$rate"
if [ -n "$link_rate" ]; then
  plan_to plan_link "$link_rate"
  plan_main="$log_dir/plan_link.json"; plan_main_what="measured link rate"
else
  plan_main="$log_dir/plan_nominal.json"; plan_main_what="nominal R"
fi
plan_to plan_256_ring "${link_rate:-$rate}" 256 ring
plan_to plan_256_seed "${link_rate:-$rate}" 256 seed
# And as the seed reasons: the device at its measured peak (MFU 100 %) on the
# nominal link R = peak / ratio, so that the hardware is at --ratio FLOP/bit.
"$bin" plan --accelerator_type cpu-1 --num_slices 256 --parameters "$params" \
  --tokens_per_slice "$tokens" --peak_flops_per_chip "$peak" --mfu 1 \
  --dcn_gbps_per_host "$(calc "$rate / 1e9")" --gradient_dtype "$grad_dtype" \
  --dcn_volume ring "${plan_kind_args[@]}" --json >"$log_dir/plan_256_peak.json" 2>"$log_dir/plan_256_peak.err" ||
  fail "multislice plan failed: $(last_line "$log_dir/plan_256_peak.err")"
"$bin" plan --accelerator_type cpu-1 --num_slices 2 --parameters "$params" \
  --tokens_per_slice "$tokens" --peak_flops_per_chip "$peak" --mfu 1 \
  --dcn_gbps_per_host "$(calc "$rate / 1e9")" --gradient_dtype "$grad_dtype" \
  --dcn_volume ring "${plan_kind_args[@]}" --json >"$log_dir/plan_2_peak.json" 2>"$log_dir/plan_2_peak.err" ||
  fail "multislice plan failed: $(last_line "$log_dir/plan_2_peak.err")"

if [ "$workload" = shardings ]; then
# Not the plan: a critical-path estimate at the granularity of matmuls, to
# explain what the plan's "forward + max(backward, DCN)" leaves out. The
# baseline step is 6n-1 equal matmuls (2 per layer forward; dW2, dM1, dW1, dX
# per layer backward, no dX for layer 0); each weight's gradient (P/2n
# values) is all-reduced as soon as its matmul ends, one after the other over
# the link at the measured (or nominal) rate.
critical_path() {  # critical_path BASE_STEP_S LINK_BIT_PER_S
  "$PY" - "$1" "$2" "$n" "$params" "$bytes_per_value" <<'EOF'
import sys
base, rate, n, p, bpv = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
u = base / (6 * n - 1)
per_grad = p / (2 * n) * bpv * 8 / rate  # ring of 2: each side sends the whole gradient
t = 2 * n * u
link_free = 0.0
for layer in reversed(range(n)):
    for mm in ("dW2", "dM1", "dW1", "dX"):
        if mm == "dX" and layer == 0:
            break
        t += u
        if mm in ("dW2", "dW1"):
            link_free = max(link_free, t) + per_grad
print(max(t, link_free), 2 * n * u, (4 * n - 1) * u, u, link_free)
EOF
}
read -r cp_step cp_fwd cp_bwd cp_first cp_link_end <<<"$(critical_path "$base_median" "${link_rate:-$rate}")"
else
# Not the plan: the trainer's buckets (train/gradient_buckets.h). The
# backward pass reports lnf, the layers from the last, then the embeddings;
# adjacent ranges join until a bucket holds 65,536 values, and each bucket's
# all-reduce starts when it is full, one after the other over the link. The
# baseline step is split as the plan splits it (forward 1/3, backward 2/3),
# the backward's time over its ranges in proportion to their matmul work
# (the head's V x C for lnf's range, a layer's parameters for a layer's, none
# for the encoder), so the first layer's and the embeddings' bucket, final
# only when the backward ends, is the tail DCN cannot hide.
buckets_path() {  # buckets_path BASE_STEP_S LINK_BIT_PER_S
  "$PY" - "$1" "$2" "$n" "$d" "$mlp_dim" "$vocab" "$seq_len" "$params" <<'EOF'
import sys
base, rate = float(sys.argv[1]), float(sys.argv[2])
n, c, h, v, t_len, p = (int(x) for x in sys.argv[3:])
layer = 4 * c * c + 2 * c * h + 9 * c + h
# (values, backward work) of each range, in the order the backward reports.
ranges = [(2 * c, v * c)] + [(layer, layer)] * n + [((v + t_len) * c, 0)]
work = sum(w for _, w in ranges)
fwd, bwd = base / 3, 2 * base / 3
t, link_free, pending, size, buckets = fwd, 0.0, 0, 0, []
for i, (values, w) in enumerate(ranges):
    t += bwd * w / work
    pending += values
    if pending >= 65536 or i == len(ranges) - 1:
        link_free = max(link_free, t) + pending * 4 * 8 / rate
        buckets.append(pending)
        pending = 0
print(max(t, link_free), len(buckets), (layer * (n > 0) + (v + t_len) * c) / p,
      max(0.0, link_free - t))
EOF
}
read -r bp_step bp_buckets bp_last_fraction bp_tail <<<"$(buckets_path "$base_median" "${link_rate:-$rate}")"
fi

measured="$(calc "$base_median / $dcn_median")"
measured_one="$(calc "$one_median / $dcn_median")"
pred="$(json "$plan_main" 'j["estimate"]["scaling_efficiency"]')"
pred_nominal="$(json "$log_dir/plan_nominal.json" 'j["estimate"]["scaling_efficiency"]')"
pred_serial="$(json "$plan_main" 'j["single_slice_step_seconds"] / j["estimate"]["step_seconds_without_overlap"]')"
ratio_main="$(calc "$measured / $pred")"
ratio_nominal="$(calc "$measured / $pred_nominal")"
ratio_serial="$(calc "$measured / $pred_serial")"
pe() { json "$1" "'step %.3f s = fwd %.3f + max(bwd %.3f, DCN %.3f); %d B over DCN per host; operational intensity %.0f FLOP/bit, minimum batch %.0f tokens/slice' % (j['estimate']['step_seconds'], j['estimate']['forward_seconds'], j['estimate']['backward_seconds'], j['estimate']['backward_dcn_seconds'], j['estimate']['dcn_bytes_per_host'], j['estimate']['operational_intensity_flops_per_bit'], j['estimate']['minimum_tokens_per_slice'])"; }
p256() { json "$1" "'scaling efficiency %.1f %%, %.2f DCN bits per parameter, operational intensity %.0f FLOP/bit (hardware %.0f), minimum batch %.0f tokens/slice, step %.3f s = fwd %.3f + max(bwd %.3f, DCN %.3f)' % (100 * j['estimate']['scaling_efficiency'], j['dcn_bits_per_parameter'], j['operational_intensity_flops_per_bit'], j['arithmetic_intensity_flops_per_bit'], j['minimum_tokens_per_slice'], j['estimate']['step_seconds'], j['estimate']['forward_seconds'], j['estimate']['backward_seconds'], j['estimate']['backward_dcn_seconds'])"; }
pct() { calc "'%.1f %%' % (100 * $1)"; }

# The CPU the network costs: per worker and step, the DCN run's CPU time
# less the baseline's (both over the counted steps); not without the
# baseline's runs (--no_baseline).
if [ "$run_baseline" -eq 1 ]; then
base_cpu="$(pj "$log_dir/skip.pool.json" 'j["cpu_s"]')"
dcn_cpu="$(pj "$log_dir/dcn.pool.json" 'j["cpu_s"]')"
base_softirq="$(pj "$log_dir/skip.pool.json" 'j["system_softirq_s"]')"
dcn_softirq="$(pj "$log_dir/dcn.pool.json" 'j["system_softirq_s"]')"
# Softirq time (the kernel's receive path, the qdisc's timers) is charged to
# no process: the system's, split between the 2 workers.
net_proc_cpu="$(calc "$dcn_cpu - $base_cpu")"
net_softirq="$(calc "($dcn_softirq - $base_softirq) / 2")"
net_cpu="$(calc "$net_proc_cpu + $net_softirq")"
# Attributed directly: the threads other than the device threads (the DCN
# stream, Gloo's I/O loop, which takes the name of the thread that made it)
# and softirq. The device threads' own CPU varies by a few per cent between
# runs with the contention, more than the network's CPU, which makes the
# difference of whole processes the noisier figure.
other_threads() { json "$1" "sum(v for g, v in j['threads_s'].items() if g != 'device')"; }
net_threads="$(calc "$(other_threads "$log_dir/dcn.pool.json") - $(other_threads "$log_dir/skip.pool.json")")"
net_direct="$(calc "$net_threads + $net_softirq")"
fi
gap="$(calc "$dcn_median - $base_median")"
threads_line() { json "$1" "', '.join('%s %.3f' % (g, v) for g, v in sorted(j['threads_s'].items(), key=lambda x: -x[1]) if v >= 0.0005)"; }
if [ "$workload" = shardings ]; then
  base_what="2 slices --skip_dcn"; dcn_what="2 slices over DCN"
else
  base_what="2 x 1-slice trainings"; dcn_what="1 training of 2 slices"
fi

say ""
say "== DCN emulation ($workload): 2 slices x cpu-1, veth + tbf, $(calc "round($rate / 1e6, 3)") Mbit/s each way, $(calc "round($flop_per_bit)") FLOP/bit =="
say "CPU                            ${cpu:-unknown}, $(nproc) CPUs"
say "ISA (multislice / oneDNN)      $isa / $onednn_isa"
say "device peak                    $(calc "round($peak / 1e9, 1)") GFLOP/s ($peak_source)"
say "step, 1 slice (own machine)    $one_line s"
[ "$run_baseline" -eq 0 ] ||
  say "step, $(printf '%-24s' "$base_what")$(st3 "$skip_median" "$skip_min" "$skip_max") s ($(pj "$log_dir/skip.pool.json" 'j["n"]') steps over $repeats runs)"
say "step, $(printf '%-24s' "$dcn_what")$(st3 "$dcn_median" "$dcn_min" "$dcn_max") s ($(pj "$log_dir/dcn.pool.json" 'j["n"]') steps over $repeats runs)"
if [ "$workload" = shardings ]; then
  say "DCN bytes per device per step  $(calc "int($dcn_bytes)") measured (ring all-reduce of 2: $grad_bytes gradient bytes each way); $(calc "int($wire_bytes)") on the wire (IP packets out of the namespace)"
elif [ "$dcn_kind" = dcn_data ]; then
  say "DCN bytes per device per step  $dcn_bytes (ring all-reduce of 2 of the $params f32 gradients: $grad_bytes each way); $(calc "int($wire_bytes)") on the wire (IP packets out of the namespace)"
else
  say "DCN bytes per device per step  $(json "$plan_main" "'%d' % j['estimate']['dcn_bytes_per_host']") by the plan ($dcn_kind; a pipeline's activations and their gradients, f32); $(calc "int($wire_bytes)") on the wire (IP packets out of the namespace)"
fi
if [ "$workload" = train ]; then
  say "memory                         peak RSS $(pj "$log_dir/dcn.pool.json" "'%.2f GiB' % (j['maxrss_kib'] / 2**20)") per worker (2 slices)$([ "$run_baseline" -eq 0 ] || pj "$log_dir/skip.pool.json" "', %.2f GiB (1 slice)' % (j['maxrss_kib'] / 2**20)")$([ -z "$compare_pipeline" ] || pj "$log_dir/pipe.pool.json" "', %.2f GiB (pipeline)' % (j['maxrss_kib'] / 2**20)")"
fi
if [ -n "$link_rate" ]; then
  say "link check                     all-reduce of $grad_bytes B: $(calc "'%.3f s (min %.3f, max %.3f)' % ($link_us / 1e6, $link_min_us / 1e6, $link_max_us / 1e6)") = $(calc "round($link_rate / 1e6, 2)") Mbit/s each way, $(pct "$link_rate / $rate") of the tbf rate"
fi
say "baseline                       $baseline (median step $(calc "round($base_median, 3)") s, $(calc "round($achieved / 1e9, 1)") GFLOP/s achieved = the plan's peak with --mfu 1)"
say "plan, nominal R                $(pe "$log_dir/plan_nominal.json")"
[ -z "$link_rate" ] || say "plan, measured link rate       $(pe "$log_dir/plan_link.json")"
if [ "$run_baseline" -eq 1 ]; then
say ""
say "CPU per step and worker        baseline $(calc "round($base_cpu, 3)") s ($(pj "$log_dir/skip.pool.json" "'user %.3f, sys %.3f' % (j['user_s'], j['sys_s'])")), over DCN $(calc "round($dcn_cpu, 3)") s ($(pj "$log_dir/dcn.pool.json" "'user %.3f, sys %.3f' % (j['user_s'], j['sys_s'])"))"
say "  threads, baseline            $(threads_line "$log_dir/skip.pool.json")"
say "  threads, over DCN            $(threads_line "$log_dir/dcn.pool.json")"
say "  other work per step          baseline $(pj "$log_dir/skip.pool.json" "'%.3f' % j['others_s']") s, over DCN $(pj "$log_dir/dcn.pool.json" "'%.3f' % j['others_s']") s (the system's busy time less the workers' and softirq: other processes, the samplers, steal)"
say "  system softirq per step      baseline $(pj "$log_dir/skip.pool.json" "'%.3f' % j['system_softirq_s']") s, over DCN $(pj "$log_dir/dcn.pool.json" "'%.3f' % j['system_softirq_s']") s (both CPUs, not charged to any process)"
say "network CPU per step           $(calc "'%.4f s per worker (process %+.4f, softirq %+.4f) = %.1f %% of the DCN step; the step grew by %.3f s, so it could explain at most %s of that' % ($net_cpu, $net_proc_cpu, $net_softirq, 100 * $net_cpu / $dcn_median, $gap, ('%.0f %%' % (100 * $net_cpu / $gap)) if $gap > 0 else 'all')")"
say "  attributed to the network    $(calc "'%.4f s per worker (threads other than device %+.4f, softirq %+.4f) = %.1f %% of the DCN step, at most %s of the step growth' % ($net_direct, $net_threads, $net_softirq, 100 * $net_direct / $dcn_median, ('%.0f %%' % (100 * $net_direct / $gap)) if $gap > 0 else 'all')")"
"$PY" -c "import sys; sys.exit(0 if $(pj "$log_dir/skip.pool.json" 'j["overlap"]') else 1)" ||
  say "# warning: in a baseline run no counted step of one training ran entirely while the other ran (steps too short, or a slow start): all counted steps are used"
"$PY" -c "import sys; sys.exit(0 if $(pj "$log_dir/dcn.pool.json" 'j["covered"]') and $(pj "$log_dir/skip.pool.json" 'j["covered"]') else 1)" ||
  say "# warning: a CPU window was not covered by the samples (a run ended early, or too short to see its device thread): the CPU figures are approximate"
"$PY" -c "import sys; sys.exit(0 if $(pj "$log_dir/dcn.pool.json" 'j["threads_covered"]') and $(pj "$log_dir/skip.pool.json" 'j["threads_covered"]') else 1)" ||
  say "# note: a window ended after its worker's last sample of threads (within ${sample_interval} s of the exit): per-thread figures miss up to one sample interval at the end; the process totals (exact at exit) do not"
fi
say ""
say "measured scaling efficiency    $(pct "$measured")   (baseline $baseline; against the 1-slice run: $(pct "$measured_one"))"
say "predicted (plan, nominal R)    $(pct "$pred_nominal")   measured/predicted = $(calc "round($ratio_nominal, 3)")"
[ -z "$link_rate" ] || say "predicted (plan, link check)   $(pct "$pred")   measured/predicted = $(calc "round($ratio_main, 3)")"
if [ "$workload" = shardings ]; then
  say "critical path (not the plan)   $(calc "'%.1f %%: step %.3f s = max(fwd %.3f + bwd %.3f, last all-reduce done at %.3f; the first starts at fwd + %.3f)' % (100 * $base_median / $cp_step, $cp_step, $cp_fwd, $cp_bwd, $cp_link_end, $cp_first)")   measured/this = $(calc "round($cp_step / $dcn_median, 3)")"
elif [ "$dcn_kind" = dcn_data ]; then
  say "trainer's buckets (not plan)   $(calc "'%.1f %%: step %.3f s, %d buckets; the link busy %.3f s after the backward ends (the first layer is final only then, the embeddings too: %.1f %% of the gradient)' % (100 * $base_median / $bp_step, $bp_step, $bp_buckets, $bp_tail, 100 * $bp_last_fraction)")   measured/this = $(calc "round($bp_step / $dcn_median, 3)")"
  say "plan without overlap           $(pct "$pred_serial")   measured/this = $(calc "round($ratio_serial, 3)")   (fwd + bwd + DCN: what the trainer did before its gradient buckets)"
fi
agree="$(calc "'yes' if abs($ratio_main - 1) <= 0.15 else 'no'")"
say "agree within 15 % ($plan_main_what): $agree"
say ""
say "256 slices, same per-slice numbers as the prediction (the baseline's achieved FLOP/s, $plan_main_what):"
say "  ring volume                  $(p256 "$log_dir/plan_256_ring.json")"
say "  seed volume                  $(p256 "$log_dir/plan_256_seed.json")"
say "at the device peak (MFU 100 %) and the nominal R ($(calc "round($flop_per_bit)") FLOP/bit), ring volume:"
say "  2 slices                     $(p256 "$log_dir/plan_2_peak.json")"
say "  256 slices                   $(p256 "$log_dir/plan_256_peak.json")"
if [ -n "$compare_pipeline" ]; then
  # Both strategies on the same global batch, and the plan's prediction of
  # each (its per-strategy table, the activations counted with emb_dim;
  # 4.'s from the plan of 4.'s strategy, the pipeline's from its row of
  # depth 2 with --compare_pipeline microbatches).
  plan_to plan_compare "${link_rate:-$rate}" 2 ring --emb_dim "$d" --pipeline_microbatches "$compare_pipeline"
  plan_to plan_compare_nominal "$rate" 2 ring --emb_dim "$d" --pipeline_microbatches "$compare_pipeline"
  global_tokens=$((2 * tokens))
  pipe_median="$(pj "$log_dir/pipe.pool.json" 'j["median"]')"
  pipe_row() {  # pipe_row PLAN FIELD: the field of the plan's pipeline of depth 2
    json "$1" "[e for e in j['strategies'] if e['strategy'] == 'pipeline' and e['pipeline_depth'] == 2][0]['$2']"
  }
  dcn_pred="$(json "$plan_main" 'j["estimate"]["step_seconds"]')"
  dcn_pred_nominal="$(json "$log_dir/plan_nominal.json" 'j["estimate"]["step_seconds"]')"
  pipe_pred="$(pipe_row "$log_dir/plan_compare.json" step_seconds)"
  pipe_pred_nominal="$(pipe_row "$log_dir/plan_compare_nominal.json" step_seconds)"
  pipe_metrics=()
  for f in "${pipe_stats[@]}"; do
    f="${f##*/pipe}"
    pipe_metrics+=("$train_runs/pipe${f%.stats.json}/metrics.jsonl")
  done
  pipe_bubble="$(stats field pipeline_bubble "$first_counted" "$pipe_last" "${pipe_metrics[@]}")"
  pipe_wall="$(stats field pipeline_seconds "$first_counted" "$pipe_last" "${pipe_metrics[@]}")"
  # row LABEL MEDIAN MIN MAX N PREDICTED PREDICTED_NOMINAL
  row() {
    calc "'%-28s %8.3f (%.3f-%.3f) %3d %10.1f | %8.3f %10.1f %8.3f | %10.1f' % ('$1', $2, $3, $4, $5, $global_tokens / $2, $6, $global_tokens / $6, $2 / $6, $global_tokens / $7)"
  }
  case "$dcn_kind" in
    dcn_data) dcn_label="4. data parallelism 2" ;;
    dcn_fsdp) dcn_label="4. FSDP 2" ;;
    *) dcn_label="4. pipeline 2 x $dcn_microbatches" ;;
  esac
  say ""
  say "== Pipeline of depth 2 across DCN against 4.: global batch $((2 * b)) sequences x $seq_len = $global_tokens tokens per step, $(calc "round(${link_rate:-$rate} / 1e6, 2)") Mbit/s each way ($plan_main_what) =="
  say "                             measured: step s (min-max)  n   tokens/s | plan: step s   tokens/s measured | nominal R:"
  say "strategy                     median                                     ($plan_main_what)  / plan    | tokens/s"
  say "$(row "$dcn_label" "$dcn_median" "$dcn_min" "$dcn_max" "$(pj "$log_dir/dcn.pool.json" 'j["n"]')" "$dcn_pred" "$dcn_pred_nominal")"
  say "$(row "pipeline 2 x $compare_pipeline $pipeline_schedule" "$pipe_median" "$(pj "$log_dir/pipe.pool.json" 'j["min"]')" "$(pj "$log_dir/pipe.pool.json" 'j["max"]')" "$(pj "$log_dir/pipe.pool.json" 'j["n"]')" "$pipe_pred" "$pipe_pred_nominal")"
  measured_gain="$(calc "$dcn_median / $pipe_median")"
  pred_gain="$(calc "$dcn_pred / $pipe_pred")"
  say "pipeline / 4. in tokens/s      measured $(calc "round($measured_gain, 3)"), plan $(calc "round($pred_gain, 3)") ($plan_main_what), plan $(calc "round($dcn_pred_nominal / $pipe_pred_nominal, 3)") (nominal R): $(calc "'the pipeline is faster' if $measured_gain > 1 else '4. is faster'"), $(calc "'as the plan predicted' if ($measured_gain > 1) == ($pred_gain > 1) else 'NOT as the plan predicted'")"
  say "plan, pipeline 2 x $compare_pipeline $(printf '%*s' $((12 - ${#compare_pipeline})) '')$(json "$log_dir/plan_compare.json" "(lambda e: 'fwd %.3f + bwd %.3f s compute (bubble %.1f %% included), activations %.3f s each way (%d B per host per step), fill and drain %.3f s, DCN hidden: %s' % (e['forward_seconds'], e['backward_seconds'], 100 * e['bubble_fraction'], e['activation_seconds'], e['activation_bytes_per_host'], e['fill_drain_seconds'], 'yes' if e['dcn_hidden'] else 'no'))([e for e in j['strategies'] if e['strategy'] == 'pipeline' and e['pipeline_depth'] == 2][0])")"
  say "pipeline, measured             pipeline_seconds $(calc "round($pipe_wall, 3)") s per step (median), of which idle (pipeline_bubble: 1 - compute / wall, DCN waits included) $(pct "$pipe_bubble"); the schedule's bubble alone (p-1)/(m+p-1) = $(pct "1 / ($compare_pipeline + 1)")"
  say "plan recommends                $(json "$log_dir/plan_compare.json" "j['recommendation']['strategy'] + ' (' + ' '.join(j['recommendation']['keys']) + ')'")"
  say "  reason                       $(json "$log_dir/plan_compare.json" "j['recommendation']['reason']")"
  say "  minimum batch (DP)           $(json "$log_dir/plan_compare.json" "'%.0f tokens per slice (this run: %d)' % (j['minimum_tokens_per_slice'], $tokens)")"
fi
for s in 0 1; do
  say "tbf ${veth[s]}: $(ip netns exec "${ns[s]}" tc -s qdisc show dev "${veth[s]}" | grep -m1 -o 'Sent.*)')"
done
if "$PY" -c "import sys; sys.exit(0 if $lowest_peak < 0.85 * $one_peak else 1)"; then
  say "# warning: a 2-slice run measured a matmul peak of $(calc "round($lowest_peak * 1e3, 1)") GFLOP/s, below 85 % of the 1-slice run's $(calc "round($one_peak * 1e3, 1)"): other work was using the CPUs; run it again"
fi
spread_warning() {  # spread_warning WHAT MIN MAX
  if "$PY" -c "import sys; sys.exit(0 if $3 > 1.25 * $2 else 1)"; then
    say "# warning: the $1 steps range from $(calc "round($2, 3)") to $(calc "round($3, 3)") s (over 25 %): other work was using the CPUs; run it again"
  fi
}
whiches=(dcn)
[ "$run_baseline" -eq 0 ] || whiches+=(skip)
[ -z "$compare_pipeline" ] || whiches+=(pipe)
for which in "${whiches[@]}"; do
  if "$PY" -c "import sys; sys.exit(0 if $(pj "$log_dir/$which.pool.json" 'j["others_share_max"]') > 0.05 else 1)"; then
    say "# warning: during a $which run other work used $(pj "$log_dir/$which.pool.json" "'%.1f %%' % (100 * j['others_share_max'])") of the 2 CPUs (beside the workers and softirq): run it again"
  fi
done
[ "$run_baseline" -eq 0 ] || spread_warning "baseline" "$skip_min" "$skip_max"
spread_warning "over-DCN" "$dcn_min" "$dcn_max"
[ -z "$compare_pipeline" ] ||
  spread_warning "pipeline" "$(pj "$log_dir/pipe.pool.json" 'j["min"]')" "$(pj "$log_dir/pipe.pool.json" 'j["max"]')"
[ -z "$logs" ] || say "# logs in $logs"
