#!/bin/bash
# The start-up matmul peak that `multislice train` divides by (MFU), over
# several runs: the quickstart config (2 local slices of one device, bf16),
# 3 steps each, its --json peak_tflops_per_device. Prints each run's peak,
# then the median, min, max and max/min, and the load average around them.
#
#   bench/startup_peaks.sh [BINARY] [RUNS]            # default build/bin/multislice 5
#   MULTISLICE_MAX_ISA=avx2 bench/startup_peaks.sh    # as on an AVX2-only CPU
#   bench/startup_peaks.sh BINARY 5 bursty   # a neighbour busy in bursts
#   bench/startup_peaks.sh BINARY 5 builds   # neighbours like two compilers
#
# A neighbour runs for the whole measurement, as other jobs (compilers,
# tests) do on a shared machine: "bursty" keeps one core busy 0.2 s out of
# every 0.4 s; "builds" keeps every core busy 1 s out of every 2 s.
set -euo pipefail
bin=${1:-build/bin/multislice}
runs=${2:-5}
out=$(mktemp -d)
neighbour=""
trap 'rm -rf "$out"; [ -n "$neighbour" ] && kill "$neighbour" 2>/dev/null; true' EXIT
burn() {  # burn SECONDS_ON SECONDS_OFF COPIES
  while :; do
    for _ in $(seq "$3"); do timeout "$1" sh -c 'while :; do :; done' & done
    wait
    sleep "$2"
  done
}
case "${3:-}" in
  bursty) burn 0.2 0.2 1 & neighbour=$! ;;
  builds) burn 1 1 "$(nproc)" & neighbour=$! ;;
esac
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
peaks=()
for i in $(seq "$runs"); do
  peak=$("$bin" train configs/quickstart.yml steps=3 \
    base_output_directory="$out" run_name="peak$i" --json 2>/dev/null |
    tail -1 | python3 -c \
      'import json,sys; print("%.3f" % json.load(sys.stdin)["peak_tflops_per_device"])')
  peaks+=("$peak")
done
echo "peaks (TFLOP/s per device): ${peaks[*]}"
printf '%s\n' "${peaks[@]}" | sort -n | python3 -c '
import sys
v = [float(x) for x in sys.stdin]
print("median %.3f, min %.3f, max %.3f, max/min %.2f" %
      (v[len(v) // 2], v[0], v[-1], v[-1] / v[0]))'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
