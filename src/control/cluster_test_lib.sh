# shellcheck shell=bash disable=SC2154  # here, root, prog, phases: the sourcing test's
# Shared by the root cluster tests (cluster_tutorial_test.sh,
# slurm_cluster_test.sh, slurm_controller_test.sh): each builds a cluster of
# network namespaces with scripts/netns_cluster.sh, runs its own checks as
# the cluster's COMMAND (`THE_TEST.sh --inside SCRATCH`) and then checks that
# nothing is left behind. This file holds what those tests do alike, so that
# a fix to a probe, a wait or a leftover check reaches all three.
#
# Sourced (not run) by each test right after it sets, under
# `set -euo pipefail`:
#   here   the test's own directory (absolute)
#   root   the repository root (absolute)
#   prog   the test's name = its file name without .sh; every line the
#          helpers print starts with it ("$prog: FAILED: ...",
#          "$prog: SKIPPED: ...", "$prog: PASSED (nothing left behind)")
# Defines functions only (and no variables until they are called).

# ---------------------------------------------------------------------------
# Inside the cluster.

# fail MESSAGE...: prints "$prog: FAILED: MESSAGE" and on_failure's output
# on stderr, exits 1. A test redefines on_failure to add what helps to
# debug it (Slurm's view, a daemon's log); by default it adds nothing.
fail() {
  echo "$prog: FAILED: $*" >&2
  on_failure >&2 || true
  exit 1
}
on_failure() { :; }

# slurm_status, slurmctld_log_tail: Slurm's view for on_failure (sinfo -N
# and squeue; the last 15 lines of slurmctld's log in $cluster_workdir).
# Bounded; never fail.
slurm_status() {
  echo "--- sinfo / squeue:"
  timeout 5 sinfo -N || true
  timeout 5 squeue || true
}
slurmctld_log_tail() {
  echo "--- slurmctld.log (tail):"
  tail -n 15 "$cluster_workdir/slurm/slurmctld.log" || true
}

# now: the time in seconds (fractional). since T: seconds since T, one
# decimal.
now() { date +%s.%N; }
since() { printf '%.1f' "$(echo "$(now) - $1" | bc)"; }

# phase NAME: starts phase NAME ("== $prog: NAME"); phase_done: "== $prog:
# NAME passed in S s" for the phase started last.
phase() { phase_name="$1"; phase_start=$(now); echo "== $prog: $1"; }
phase_done() { echo "== $prog: $phase_name passed in $(since "$phase_start") s"; }

# wants PHASE: PHASE is in $phases (the test's list of phases to run).
wants() { [[ " $phases " == *" $1 "* ]]; }

# wait_until SECONDS WHAT COMMAND...: polls COMMAND (its output dropped)
# every 0.2 s until it succeeds; fail "WHAT: not within SECONDS s" after
# SECONDS.
wait_until() {
  local seconds="$1" what="$2"; shift 2
  local deadline
  deadline=$(echo "$(now) + $seconds" | bc)
  until "$@" >/dev/null 2>&1; do
    if [ "$(echo "$(now) > $deadline" | bc)" = 1 ]; then
      fail "$what: not within $seconds s"
    fi
    sleep 0.2
  done
}

# address_of HOST: the address of the cluster's host HOST (h1, h2, ...),
# from netns_cluster.sh's MULTISLICE_CLUSTER_HOSTS ("HOST NAMESPACE ADDRESS"
# lines).
address_of() { awk -v h="$1" '$1 == h { print $3 }' <<<"$MULTISLICE_CLUSTER_HOSTS"; }

# losses METRICS OUT: writes "STEP LOSS" per step of a metrics.jsonl to OUT
# (the last record of a step wins: a step run again after a restart
# replaces the first); the loss as Python's repr, so that two runs compare
# bit for bit with cmp.
losses() {
  python3 - "$1" > "$2" <<'EOF'
import json, sys
losses = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "step" in r:
        losses[r["step"]] = r["loss"]
for step in sorted(losses):
    print(step, repr(losses[step]))
EOF
}

# write_tiny_config FILE DATASET STEPS CHECKPOINT_PERIOD [LINE...]: the tiny
# training the tests run (1 layer, width 32, f32, 2 slices by DCN data
# parallelism; small enough for 16 devices on 2 cores), with these LINEs
# (e.g. "ici_fsdp_parallelism: 8") before its last two.
write_tiny_config() {
  local file="$1" dataset="$2" steps="$3" checkpoint_period="$4"; shift 4
  {
    cat <<EOF
emb_dim: 32
num_heads: 2
num_decoder_layers: 1
mlp_dim: 64
max_target_length: 16
dtype: f32
warmup_steps: 2
learning_rate: 3.0e-3
eval_interval: 1000
steps: $steps
checkpoint_period: $checkpoint_period
per_device_batch_size: 1
EOF
    [ "$#" -eq 0 ] || printf '%s\n' "$@"
    printf 'dcn_data_parallelism: 2\ndataset_path: %s\n' "$dataset"
  } > "$file"
}

# ---------------------------------------------------------------------------
# Outside: whether this machine can run the test, its scratch directory, the
# cluster, and that nothing is left.

# skip REASON: "$prog: SKIPPED: REASON", exit 77 (CTest's
# SKIP_RETURN_CODE).
skip() { echo "$prog: SKIPPED: $*"; exit 77; }

# require_root WHAT: skip unless root ("needs root (WHAT)").
require_root() { [ "$(id -u)" -eq 0 ] || skip "needs root ($1)"; }

# require_tools TOOL...: skip "needs TOOL" unless each is on PATH.
require_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" > /dev/null || skip "needs $tool"
  done
}

# require_slurm_tools TOOL...: the same for munge's and Slurm's commands,
# naming the packages that bring them.
require_slurm_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" > /dev/null ||
      skip "needs $tool (Debian's munge, slurmctld, slurmd, slurm-client: scripts/install_deps.sh)"
  done
}

# require_netns_veth_htb: skip unless `ip netns add` works and a veth pair
# with an htb qdisc can be made in a namespace (what netns_cluster.sh
# needs); the probe namespace is removed either way.
require_netns_veth_htb() {
  local probe="msprobe$$" probe_ok=1
  if ! ip netns add "$probe" 2> /dev/null; then
    skip "ip netns is not available here (ip netns add failed)"
  fi
  ip -n "$probe" link add p0 type veth peer name p1 2> /dev/null &&
    ip netns exec "$probe" tc qdisc add dev p0 root handle 1: htb 2> /dev/null ||
    probe_ok=0
  ip netns del "$probe"
  [ "$probe_ok" = 1 ] || skip "this kernel has no veth or htb qdisc"
}

# make_scratch BINARY NAME LETTER: sets scratch (a new
# /tmp/multislice-NAME-XXXXXX, removed at exit: this sets the EXIT trap)
# and prefix (the namespaces' prefix: LETTER and this shell's pid), and
# exports MULTISLICE_BINARY as a copy of BINARY in $scratch/bin, so that a
# build that relinks BINARY meanwhile does not change it under the
# cluster's processes. Exits 1 if BINARY is not executable.
make_scratch() {
  local binary="$1" name="$2" letter="$3"
  [ -x "$binary" ] || { echo "$prog: $binary is missing" >&2; exit 1; }
  scratch="$(mktemp -d "/tmp/multislice-$name-XXXXXX")"
  prefix="$letter$(( $$ % 100000 ))"
  trap 'rm -rf "$scratch"' EXIT
  mkdir "$scratch/bin"
  cp "$binary" "$scratch/bin/multislice"
  export MULTISLICE_BINARY="$scratch/bin/multislice"
}

# slurm_daemons: the pids of the munge and Slurm daemons running now, sorted
# (pgrep -x takes one name of at most 15 characters); not zombies, which
# PID 1 reaps when it will.
slurm_daemons() {
  local name pid state
  for name in munged slurmctld slurmd slurmstepd; do
    for pid in $(pgrep -x "$name" || true); do
      state=$(ps -o stat= -p "$pid" 2> /dev/null | cut -c1 || true)
      [ -z "$state" ] || [ "$state" = Z ] || echo "$pid"
    done
  done | sort
}

# note_slurm_daemons: remembers slurm_daemons before the cluster starts, for
# check_nothing_left --slurm.
note_slurm_daemons() { daemons_before=$(slurm_daemons); }

# run_cluster LABEL SECONDS NETNS_CLUSTER_ARG...: runs
# `netns_cluster.sh ARG... --prefix $prefix -- bash $here/$prog.sh --inside
# $scratch` under `timeout SECONDS` (SIGTERM, so that netns_cluster.sh
# cleans up; SIGKILL 30 s later), sets code to its exit status and prints
# "$prog: LABEL: S s, exit CODE".
run_cluster() {
  local label="$1" seconds="$2" start; shift 2
  start=$(now)
  code=0
  timeout -s TERM -k 30 "$seconds" "$root/scripts/netns_cluster.sh" "$@" \
    --prefix "$prefix" -- bash "$here/$prog.sh" --inside "$scratch" || code=$?
  printf '%s: %s: %.1f s, exit %d\n' "$prog" "$label" \
    "$(echo "$(now) - $start" | bc)" "$code"
}

# check_nothing_left [--slurm]: after run_cluster, sets code=1 with a
# "$prog: FAILED: ..." line for anything left: a namespace named
# $prefix-*, the cluster's work directory (the inside wrote its path to
# $scratch/cluster_workdir) or a process naming it, a process naming
# $scratch; with --slurm also a /etc/netns/$prefix-* folder and a munge or
# Slurm daemon not there at note_slurm_daemons. Then prints
# "$prog: PASSED (nothing left behind)" if code is 0, and exits with code.
check_nothing_left() {
  local slurm=0 left etc_left cluster_workdir procs daemons_after new_daemons
  [ "${1:-}" != --slurm ] || slurm=1
  left=$(ip netns list | awk -v p="$prefix-" 'index($1, p) == 1 { print $1 }')
  [ -z "$left" ] || { echo "$prog: FAILED: namespaces left: $left" >&2; code=1; }
  if [ "$slurm" = 1 ]; then
    etc_left=$(compgen -G "/etc/netns/$prefix-*" || true)
    [ -z "$etc_left" ] || { echo "$prog: FAILED: left: $etc_left" >&2; code=1; }
  fi
  cluster_workdir=$(cat "$scratch/cluster_workdir" 2> /dev/null || true)
  if [ -n "$cluster_workdir" ]; then
    [ ! -e "$cluster_workdir" ] ||
      { echo "$prog: FAILED: $cluster_workdir is left" >&2; code=1; }
    procs=$(pgrep -f -- "$cluster_workdir" || true)
    # shellcheck disable=SC2086  # one pid a word
    [ -z "$procs" ] ||
      { echo "$prog: FAILED: processes left: $(ps -o pid=,args= -p $procs)" >&2; code=1; }
  fi
  procs=$(pgrep -f -- "$scratch" || true)
  # shellcheck disable=SC2086
  [ -z "$procs" ] ||
    { echo "$prog: FAILED: processes left: $(ps -o pid=,args= -p $procs)" >&2; code=1; }
  if [ "$slurm" = 1 ]; then
    daemons_after=$(slurm_daemons)
    new_daemons=$(comm -13 <(echo "$daemons_before") <(echo "$daemons_after") | grep . || true)
    # shellcheck disable=SC2086
    [ -z "$new_daemons" ] ||
      { echo "$prog: FAILED: daemons left: $(ps -o pid=,args= -p $new_daemons)" >&2; code=1; }
  fi
  [ "$code" -eq 0 ] && echo "$prog: PASSED (nothing left behind)"
  exit "$code"
}
