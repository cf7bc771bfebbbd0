#!/usr/bin/env bash
# Emulates a data-center network between two slices on one machine and checks
# the performance model against it: each slice runs in its own network
# namespace, the two joined by a veth pair shaped with `tc tbf` in both
# directions so that device FLOP/s over DCN bit/s is the seed's TPU v4 figure
# (22,000 FLOP/bit) or a chosen one. Measures the scaling efficiency of
# `multislice shardings -dd 2` and prints it next to what `multislice plan`
# predicts for the same workload and link. See --help and
# docs/performance.md ("DCN under a shaped link").
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
and measures, with the same per-device batch:
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
  3. and 4. alternate --repeats times; step times are pooled over the repeats
  (slice 0's timed steps) and reported as median (min, max).
Before each run it waits (up to --quiet_wait s) until the CPUs are idle, and
it warns when a run's own matmul peak came out well below the 1-slice run's
or its steps vary by more than 25 % (someone else was using the CPUs: run it
again).
Then runs `multislice plan` for the same workload (parameters 2*4*d*d*n,
tokens per slice = batch, --mfu 1 with the baseline's achieved FLOP/s as the
peak, ring volume, gradient dtype = --dtype) with the measured link rate, and
again with the nominal R, and prints

  measured efficiency = median step(baseline) / median step(2 slices)

next to the predicted scaling efficiency and their ratio (within 15 %: agree).
A last line, not from the plan, replays the step at the granularity of
matmuls (DCN starts when the first gradient is ready, gradients queue on the
link) to show what the plan's forward + max(backward, DCN) leaves out.

Options:
  -d, --embedding_dimension D  default 256   (D_FF = 4 D)
  -n, --num_layers L           default 2
  -b, --batch_size B           rows per device = tokens per slice; default 65536
  --dtype T                    bf16 or f32; default bf16
  --steps K                    timed steps after 1 warm-up; default 10
  --repeats N                  runs of 3. and of 4., alternating; default 2
  --ratio X                    target FLOP/bit (device peak / link bit/s);
                               default 22000 (the seed's TPU v4 figure)
  --peak_gflops G              device peak in GFLOP/s instead of the one the
                               1-slice run measures (sets R)
  --rate_mbit M                shape to M Mbit/s instead of peak / ratio
  --baseline B                 skip_dcn (default) or one_slice: which run the
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
  -h, --help                   this text

Examples (about 2 minutes, and 4, on a 2-core machine):
  sudo bench/dcn_netns.sh
  sudo bench/dcn_netns.sh -b 131072 --ratio 44000 --logs /tmp/dcn-logs

Exit status: 0 when every run completed (whether or not the figures agree),
1 when not root, a tool is missing or a run failed, 2 on a usage error.
Everything it creates (namespaces, veth pair, temporary files, workers) is
removed on exit, including on error or Ctrl-C.
EOF
}

usage_error() { echo "$prog: $*" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }

d=256 n=2 b=65536 dtype=bf16 steps=10 ratio=22000 peak_gflops="" rate_mbit=""
repeats=2 quiet_wait=120
baseline=skip_dcn linkcheck=1 mtu=9000 tbf_latency_ms=20 tbf_burst=""
subnet=10.213.7 ms="$root/build/bin/multislice" run_timeout=300 logs=""

need() { [ $# -ge 2 ] || usage_error "option $1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
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
    *) usage_error "unknown argument '$1' (see --help)" ;;
  esac
done

is_pos_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
is_pos_num() { [[ "$1" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$ ]] && [[ "$1" =~ [1-9] ]]; }
for pair in "embedding_dimension:$d" "num_layers:$n" "batch_size:$b" \
            "steps:$steps" "repeats:$repeats" "mtu:$mtu" "timeout:$run_timeout"; do
  is_pos_int "${pair#*:}" || usage_error "--${pair%%:*} '${pair#*:}' is not a positive integer"
done
for pair in "ratio:$ratio" "tbf_latency_ms:$tbf_latency_ms"; do
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
j = objs[0]
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

# run_pair NAME ARGS...: `multislice ARGS` as two workers started by hand,
# slice s in namespace s, rendezvous in a file:// store both can see.
run_pair() {
  local name="$1"; shift
  local store="$tmp/store-$name" s rc
  mkdir -p "$store"
  pids=()
  for s in 0 1; do
    timeout -k 10 "$run_timeout" ip netns exec "${ns[s]}" env \
      -u MULTISLICE_ATTEMPT -u MEGASCALE_PORT \
      MEGASCALE_COORDINATOR_ADDRESS="file://$store" \
      MEGASCALE_NUM_SLICES=2 MEGASCALE_SLICE_ID="$s" \
      TPU_WORKER_ID=0 TPU_WORKER_HOSTNAMES="${addr[s]}" \
      MULTISLICE_ACCELERATOR_TYPE=cpu-1 MULTISLICE_RUN_ID="dcn-netns-$$-$name" \
      "$bin" "$@" >"$log_dir/$name.$s.out" 2>"$log_dir/$name.$s.err" </dev/null &
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

# ---------------------------------------------------------------- 1. one slice
shard_args=(-d "$d" -n "$n" -b "$b" --dtype "$dtype" --steps "$steps" --json)
params=$((2 * 4 * d * d * n))
bytes_per_value=2; [ "$dtype" = f32 ] && bytes_per_value=4
grad_bytes=$((params * bytes_per_value))
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

say "# $prog: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, ${cpu:-unknown CPU}, kernel $(uname -r)"
say "# load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine disturbs every figure)"
say "# workload: shardings -d $d -n $n -b $b --dtype $dtype --steps $steps; P = 2*4*d*d*n = $params parameters, gradients $grad_bytes bytes"
say "# [1/4] 1 slice (device peak and the one-slice step time)"
wait_quiet
run_one one shardings "${shard_args[@]}"
one_out="$log_dir/one.0.out"
one_median="$(json "$one_out" 'j["median_step_time_s"]')"
isa="$(json "$one_out" 'j.get("isa", "?")')"
if [ -n "$peak_gflops" ]; then
  peak="$(calc "$peak_gflops * 1e9")"; peak_source="given (--peak_gflops)"
else
  peak="$(json "$one_out" 'j["peak_tflops_per_device"] * 1e12')"
  peak_source="measured by the 1-slice run ($dtype square matmul, one thread)"
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
  say "# [2/4] link check: DCN all-reduce of $grad_bytes B ($dtype) between the namespaces"
  wait_quiet
  run_pair link bench collectives --paths dcn --ops all_reduce \
    --minbytes "$grad_bytes" --maxbytes "$grad_bytes" --iters 5 \
    --dtype "$dtype" --baselines none --json
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
skip_files=() dcn_files=()
for ((k = 1; k <= repeats; k++)); do
  say "# [3/4] 2 slices in the namespaces, --skip_dcn (baseline with the same CPU contention), run $k of $repeats"
  wait_quiet
  run_pair "skip$k" shardings -dd 2 "${shard_args[@]}" --skip_dcn
  skip_files+=("$log_dir/skip$k.0.out")  # slice 0 prints the JSON
  say "# [4/4] 2 slices in the namespaces, gradients all-reduced over the shaped link, run $k of $repeats"
  wait_quiet
  run_pair "dcn$k" shardings -dd 2 "${shard_args[@]}"
  dcn_files+=("$log_dir/dcn$k.0.out")
done

# pooled FIELD FILES...: with FIELD "steps", pools the timed steps of the
# files and prints "median min max"; with any other FIELD (e.g.
# peak_tflops_per_device) prints its minimum over the files.
pooled() {
  "$PY" - "$@" <<'EOF'
import json, statistics, sys
field, files = sys.argv[1], sys.argv[2:]
def load(path):
    for line in open(path, errors="replace"):
        i = line.find("{")
        if i >= 0:
            try:
                return json.loads(line[i:])
            except ValueError:
                pass
    sys.exit("dcn_netns.sh: no JSON result in " + path)
if field == "steps":
    t = [x for f in files for x in load(f)["timings_s"]]
    print(statistics.median(t), min(t), max(t))
else:
    print(min(load(f)[field] for f in files))
EOF
}
read -r skip_median skip_min skip_max <<<"$(pooled steps "${skip_files[@]}")"
read -r dcn_median dcn_min dcn_max <<<"$(pooled steps "${dcn_files[@]}")"
st3() { calc "'%.3f (min %.3f, max %.3f)' % ($1, $2, $3)"; }
st() { json "$1" "'%.3f (min %.3f, max %.3f)' % (j['median_step_time_s'], j['min_step_time_s'], j['max_step_time_s'])"; }
dcn_bytes="$(json "${dcn_files[0]}" 'j["dcn_bytes_per_device_per_step"]')"
lowest_peak="$(pooled peak_tflops_per_device "${skip_files[@]}" "${dcn_files[@]}")"
one_peak="$(json "$one_out" 'j["peak_tflops_per_device"]')"

if [ "$baseline" = skip_dcn ]; then base_median="$skip_median"; else base_median="$one_median"; fi
# The plan's "peak" is the FLOP/s the baseline achieved (6 P B per step, the
# FLOPs `multislice shardings` counts), so its one-slice step is the measured
# baseline step and only the DCN part is predicted.
achieved="$(calc "6 * $params * $b / $base_median")"

plan() {  # plan RATE_BIT_PER_S: prints the plan's JSON
  local gdt=f32; [ "$dtype" = bf16 ] && gdt=bf16
  timeout -k 5 60 "$bin" plan --accelerator_type cpu-1 --num_slices 2 \
    --parameters "$params" --tokens_per_slice "$b" \
    --peak_flops_per_chip "$achieved" --mfu 1 \
    --dcn_gbps_per_host "$(calc "$1 / 1e9")" --gradient_dtype "$gdt" \
    --dcn_volume ring --strategy dcn_data --json
}
plan "$rate" >"$log_dir/plan_nominal.json" 2>"$log_dir/plan_nominal.err" ||
  fail "multislice plan failed: $(last_line "$log_dir/plan_nominal.err")"
if [ -n "$link_rate" ]; then
  plan "$link_rate" >"$log_dir/plan_link.json" 2>"$log_dir/plan_link.err" ||
    fail "multislice plan failed: $(last_line "$log_dir/plan_link.err")"
  plan_main="$log_dir/plan_link.json"; plan_main_what="measured link rate"
else
  plan_main="$log_dir/plan_nominal.json"; plan_main_what="nominal R"
fi

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

measured="$(calc "$base_median / $dcn_median")"
measured_one="$(calc "$one_median / $dcn_median")"
pred="$(json "$plan_main" 'j["estimate"]["scaling_efficiency"]')"
pred_nominal="$(json "$log_dir/plan_nominal.json" 'j["estimate"]["scaling_efficiency"]')"
ratio_main="$(calc "$measured / $pred")"
ratio_nominal="$(calc "$measured / $pred_nominal")"
pe() { json "$1" "'step %.3f s = fwd %.3f + max(bwd %.3f, DCN %.3f); %d B over DCN per host; operational intensity %.0f FLOP/bit, minimum batch %.0f tokens/slice' % (j['estimate']['step_seconds'], j['estimate']['forward_seconds'], j['estimate']['backward_seconds'], j['estimate']['backward_dcn_seconds'], j['estimate']['dcn_bytes_per_host'], j['estimate']['operational_intensity_flops_per_bit'], j['estimate']['minimum_tokens_per_slice'])"; }
pct() { calc "'%.1f %%' % (100 * $1)"; }

say ""
say "== DCN emulation: 2 slices x cpu-1, veth + tbf, $(calc "round($rate / 1e6, 3)") Mbit/s each way, $(calc "round($flop_per_bit)") FLOP/bit =="
say "oneDNN ISA                     $isa"
say "device peak                    $(calc "round($peak / 1e9, 1)") GFLOP/s ($peak_source)"
say "step, 1 slice (own machine)    $(st "$one_out") s"
say "step, 2 slices --skip_dcn      $(st3 "$skip_median" "$skip_min" "$skip_max") s ($repeats x $steps steps)"
say "step, 2 slices over DCN        $(st3 "$dcn_median" "$dcn_min" "$dcn_max") s ($repeats x $steps steps)"
say "DCN bytes per device per step  $(calc "int($dcn_bytes)") measured (ring all-reduce of 2: $grad_bytes gradient bytes each way)"
if [ -n "$link_rate" ]; then
  say "link check                     all-reduce of $grad_bytes B: $(calc "'%.3f s (min %.3f, max %.3f)' % ($link_us / 1e6, $link_min_us / 1e6, $link_max_us / 1e6)") = $(calc "round($link_rate / 1e6, 2)") Mbit/s each way, $(pct "$link_rate / $rate") of the tbf rate"
fi
say "baseline                       $baseline (median step $(calc "round($base_median, 3)") s, $(calc "round($achieved / 1e9, 1)") GFLOP/s achieved = the plan's peak with --mfu 1)"
say "plan, nominal R                $(pe "$log_dir/plan_nominal.json")"
[ -z "$link_rate" ] || say "plan, measured link rate       $(pe "$log_dir/plan_link.json")"
say ""
say "measured scaling efficiency    $(pct "$measured")   (baseline $baseline; against the 1-slice run: $(pct "$measured_one"))"
say "predicted (plan, nominal R)    $(pct "$pred_nominal")   measured/predicted = $(calc "round($ratio_nominal, 3)")"
[ -z "$link_rate" ] || say "predicted (plan, link check)   $(pct "$pred")   measured/predicted = $(calc "round($ratio_main, 3)")"
say "critical path (not the plan)   $(calc "'%.1f %%: step %.3f s = max(fwd %.3f + bwd %.3f, last all-reduce done at %.3f; the first starts at fwd + %.3f)' % (100 * $base_median / $cp_step, $cp_step, $cp_fwd, $cp_bwd, $cp_link_end, $cp_first)")   measured/this = $(calc "round($cp_step / $dcn_median, 3)")"
agree="$(calc "'yes' if abs($ratio_main - 1) <= 0.15 else 'no'")"
say "agree within 15 % ($plan_main_what): $agree"
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
spread_warning "--skip_dcn" "$skip_min" "$skip_max"
spread_warning "over-DCN" "$dcn_min" "$dcn_max"
[ -z "$logs" ] || say "# logs in $logs"
