#!/usr/bin/env bash
# The seed's tutorial driven by Google's own gcloud CLI (issue 29 point 4),
# pointed at the controller with environment variables alone
# (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU and _COMPUTE,
# CLOUDSDK_AUTH_ACCESS_TOKEN_FILE, CLOUDSDK_CORE_PROJECT), as a Cloud TPU
# user would, on 8 hosts of v5litepod-16 (2 slices of 4 hosts):
#
#   local    `multislice controller --local-hosts 8`: every host's sshd on a
#            loopback address of its own, port 22
#   cluster  scripts/netns_cluster.sh --hosts 8: every host's sshd on its
#            namespace's own address, port 22; gcloud runs in the
#            controller's namespace
#
# In each, for the GA and the alpha track:
#   create --node-count 2 (multislice), wait ACTIVE with describe --format,
#   list's NODE_COUNT; queued-resources ssh --node=all --worker=all
#   --batch-size=4: every worker answers from its own directory and
#   environment; (GA) the seed's shardings command on both slices: one
#   report of 32 devices on 2 slices with the one-device run's loss;
#   tpu-vm ssh --worker=all; tpu-vm scp both ways; a failing worker stops
#   the next batch (gcloud's rule); reset; delete --force --async; the
#   seed's --node-id and full create forms, ssh from stdin, describe and
#   list; (alpha, local) tpu-vm create, simulate-maintenance-event (the node
#   is repaired), tpu-vm delete.
# Then (local only, which shares the code paths): the key one user's gcloud
# added to one queued resource opens none of another's hosts, and a bad
# flag value is the controller's 400 naming the field, shown by gcloud.
# Waits poll with `multislice queued-resources describe` and files are
# checked on disk, since every gcloud call costs a second of CPU here.
#
# Exit 77 (CTest: skipped) with one line where gcloud is absent (it cannot
# come from Debian's archive), when not root (sshd on port 22), or without
# openssh-server; the cluster mode also without network namespaces.
#
# Usage: gcloud_tutorial_test.sh local|cluster [MULTISLICE_BINARY]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prog=gcloud_tutorial_test
# shellcheck source=cluster_test_lib.sh
source "$here/cluster_test_lib.sh"

# ---------------------------------------------------------------------------
# The tutorial, against the controller at $url in zone $zone; gcloud's
# files under $scratch.
tutorial() {
  export CLOUDSDK_CONFIG="$scratch/gcloud" HOME="$scratch/home"
  export CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU="$url/"
  export CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE="$url/compute/v1/"
  export CLOUDSDK_AUTH_ACCESS_TOKEN_FILE="$token_file"
  export CLOUDSDK_CORE_PROJECT=my-project CLOUDSDK_CORE_DISABLE_PROMPTS=1
  export CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK=1
  export CLOUDSDK_CORE_DISABLE_USAGE_REPORTING=1
  local ms="$MULTISLICE_BINARY" out="$scratch/out"
  mkdir -p "$HOME/.ssh" "$out"
  # The seed: "Crie chaves SSH para gcloud".
  ssh-keygen -q -N '' -f "$HOME/.ssh/google_compute_engine"

  g() { timeout 300 gcloud "$@"; }
  # Waits poll with this project's own CLI (gcloud takes a second a call);
  # the seed's `describe --format` runs once the state is reached.
  export MULTISLICE_CONTROLLER="$url" MULTISLICE_TOKEN_FILE="$token_file"
  qr_state() {
    $ms queued-resources describe "$1" --zone="$zone" \
      --format='value(state.state)' 2>/dev/null
  }
  is_state() { [ "$(qr_state "$1")" = "$2" ]; }
  is_gone() { ! $ms queued-resources describe "$1" --zone="$zone" > /dev/null 2>&1; }
  wait_active() {  # QR [WHAT]: ACTIVE, as gcloud's describe --format says
    wait_until 60 "$1 ACTIVE${2:+ $2}" is_state "$1" ACTIVE
    [ "$(g $track compute tpus queued-resources describe "$1" --zone="$zone" \
          --format='value(state.state)')" = ACTIVE ] || fail "describe $1: not ACTIVE"
  }
  # The workers' directories are on this machine's disk (local hosts, and
  # the namespace cluster's hosts alike): files are checked there.
  worker_files() {  # QR NODE FILE: that file of each of the node's workers
    compgen -G "$hosts_dir/*/workers/$1.$2.*/$3" || true
  }

  # The one-device loss of the shardings run below (32 devices x 4 rows).
  $ms shardings -d 64 -b 128 -n 2 --dtype f32 --steps 1 --json \
    > "$out/one_device.json" 2>/dev/null || fail "the one-device shardings run"
  one_device_loss=$(python3 -c '
import json, sys
print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["first_step_loss"])' \
    "$out/one_device.json")

  local track
  for track in "" alpha; do
    local name=${track:-ga} qr tpu
    qr="qr-$name" tpu="tpu-$name"
    phase "$name: create, wait ACTIVE, list"
    g $track compute tpus queued-resources create "$qr" \
      --accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite \
      --node-count=2 --node-prefix="$tpu" --zone="$zone" --reserved \
      > "$out/create-$name" 2>&1 || fail "create: $(tail -n 3 "$out/create-$name")"
    wait_active "$qr"
    g $track compute tpus queued-resources list --filter="$qr" --zone="$zone" \
      > "$out/list-$name" 2>&1
    grep -Eq "^$qr +$zone +2 +v5litepod-16 .*ACTIVE" "$out/list-$name" ||
      fail "list: $(cat "$out/list-$name")"
    # GA's --reserved sends reservation_name, alpha's guaranteed.reserved.
    [ "$(g $track compute tpus queued-resources describe "$qr" --zone="$zone" \
          --format='value(tier)')" = reserved ] || fail "--reserved: not the reserved tier"
    phase_done

    phase "$name: queued-resources ssh --node=all --worker=all --batch-size=4"
    g $track compute tpus queued-resources ssh "$qr" --zone="$zone" \
      --node=all --worker=all --batch-size=4 \
      --command='echo "answer $MEGASCALE_SLICE_ID $TPU_WORKER_ID $(id -un) $PWD"' \
      > "$out/ssh-$name" 2>&1 || fail "ssh: $(tail -n 5 "$out/ssh-$name")"
    local s w
    for s in 0 1; do
      for w in 0 1 2 3; do
        grep -Eq "^answer $s $w root .*/workers/$qr\.$s\.$w\$" "$out/ssh-$name" ||
          fail "ssh: no answer of slice $s worker $w in its directory: $(grep answer "$out/ssh-$name")"
      done
    done
    [ "$(grep -c '^answer ' "$out/ssh-$name")" = 8 ] || fail "ssh: not 8 answers"
    phase_done

    if [ "$track" = "" ]; then
      # The seed's command on every worker at once (it waits for all: one
      # batch).
      phase "$name: the seed's shardings on both slices"
      g compute tpus queued-resources ssh "$qr" --zone="$zone" --node=all \
        --worker=all --batch-size=8 \
        --command="$ms shardings --dcn_data_parallelism 2 --ici_fsdp_parallelism 16 -d 64 -b 4 -n 2 --dtype f32 --steps 1 --json 2>/dev/null | tail -n 1" \
        > "$out/shardings" 2>&1 || fail "shardings: $(tail -n 5 "$out/shardings")"
      python3 - "$out/shardings" "$one_device_loss" <<'EOF' || fail "shardings: $(tail -n 3 "$out/shardings")"
import json, sys
reports = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
if not reports:
    sys.exit("no report")
for r in reports:
    if (r["num_devices"], r["num_slices"]) != (32, 2):
        sys.exit(f"ran on {r['num_devices']} devices in {r['num_slices']} slices")
    if repr(r["first_step_loss"]) != sys.argv[2]:
        sys.exit(f"loss {r['first_step_loss']}, one device's {sys.argv[2]}")
print(f"gcloud_tutorial_test: shardings: {len(reports)} report(s), 32 devices "
      f"on 2 slices, loss {sys.argv[2]} as on one device")
EOF
      phase_done
    fi

    phase "$name: tpu-vm ssh --worker=all, tpu-vm scp both ways"
    g $track compute tpus tpu-vm ssh "$tpu-1" --zone="$zone" --worker=all \
      --command='echo "vm $MEGASCALE_SLICE_ID $TPU_WORKER_ID"' \
      > "$out/vm-$name" 2>&1 || fail "tpu-vm ssh: $(tail -n 5 "$out/vm-$name")"
    for w in 0 1 2 3; do
      grep -qx "vm 1 $w" "$out/vm-$name" || fail "tpu-vm ssh: no answer of worker $w"
    done
    printf 'payload %s\n' "$name" > "$out/payload"
    g $track compute tpus tpu-vm scp "$out/payload" "$tpu-1:~/copied" \
      --zone="$zone" --worker=all > "$out/scp-$name" 2>&1 ||
      fail "tpu-vm scp to: $(tail -n 5 "$out/scp-$name")"
    g $track compute tpus tpu-vm scp "$tpu-1:copied" "$out/back-$name" \
      --zone="$zone" --worker=3 > "$out/scp-back-$name" 2>&1 ||
      fail "tpu-vm scp from: $(tail -n 5 "$out/scp-back-$name")"
    cmp -s "$out/payload" "$out/back-$name" || fail "tpu-vm scp: the copy differs"
    local copies=0 f
    for f in $(worker_files "$qr" 1 copied); do
      cmp -s "$out/payload" "$f" && copies=$((copies + 1))
    done
    [ "$copies" = 4 ] || fail "tpu-vm scp --worker=all: on $copies of 4 workers"
    phase_done

    phase "$name: a failing worker stops the next batch"
    code=0
    g $track compute tpus queued-resources ssh "$qr" --zone="$zone" \
      --node=all --worker=all --batch-size=2 \
      --command='[ "$MEGASCALE_SLICE_ID$TPU_WORKER_ID" != 01 ] || exit 3; echo "ran $MEGASCALE_SLICE_ID $TPU_WORKER_ID"' \
      > "$out/failing-$name" 2>&1 || code=$?
    [ "$code" = 3 ] || fail "failing batch: exit $code, expected 3"
    [ "$(grep -c '^ran ' "$out/failing-$name")" = 1 ] &&
      grep -qx "ran 0 0" "$out/failing-$name" ||
      fail "failing batch: ran on $(grep '^ran ' "$out/failing-$name" | tr '\n' ' ')"
    phase_done

    phase "$name: reset, delete --force --async"
    g $track compute tpus queued-resources reset "$qr" --zone="$zone" \
      > "$out/reset-$name" 2>&1 || fail "reset: $(tail -n 3 "$out/reset-$name")"
    wait_active "$qr" "after reset"
    g $track compute tpus queued-resources delete "$qr" --zone="$zone" \
      --force --async > "$out/delete-$name" 2>&1 ||
      fail "delete: $(tail -n 3 "$out/delete-$name")"
    grep -q "Delete request issued for: \[$qr\]" "$out/delete-$name" ||
      fail "delete: $(cat "$out/delete-$name")"
    wait_until 60 "$qr deleted" is_gone "$qr"
    phase_done

    if [ "$track" = alpha ] && [ "$extras" = 1 ]; then
      phase "$name: tpu-vm create, simulate-maintenance-event, delete"
      g alpha compute tpus tpu-vm create "$tpu-vm" --zone="$zone" \
        --accelerator-type=v5litepod-16 --version=v2-alpha-tpuv5-lite \
        > "$out/vm-create" 2>&1 || fail "tpu-vm create: $(tail -n 3 "$out/vm-create")"
      grep -q "Created tpu \[$tpu-vm\]" "$out/vm-create" || fail "tpu-vm create: $(cat "$out/vm-create")"
      g alpha compute tpus tpu-vm simulate-maintenance-event "$tpu-vm" \
        --zone="$zone" --workers=2 > "$out/vm-maintenance" 2>&1 ||
        fail "simulate-maintenance-event: $(tail -n 3 "$out/vm-maintenance")"
      repaired() {
        [ "$($ms queued-resources describe "$tpu-vm" --zone="$zone" \
              --format='value(attempt,state.state)' | tr -s ' \t' ' ')" = "2 ACTIVE" ]
      }
      wait_until 60 "$tpu-vm repaired after the maintenance event" repaired
      g alpha compute tpus tpu-vm delete "$tpu-vm" --zone="$zone" --quiet \
        > "$out/vm-delete" 2>&1 || fail "tpu-vm delete: $(tail -n 3 "$out/vm-delete")"
      wait_until 60 "$tpu-vm deleted" is_gone "$tpu-vm"
      phase_done
    fi

    phase "$name: the seed's other create forms"
    # Exemplo introdutório: --node-id, then ssh with the command on stdin.
    g $track compute tpus queued-resources create "$qr-solo" \
      --accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite \
      --node-id="$tpu-solo" --zone="$zone" --spot > "$out/solo-$name" 2>&1 ||
      fail "create --node-id: $(tail -n 3 "$out/solo-$name")"
    wait_active "$qr-solo"
    echo 'echo "stdin $MEGASCALE_SLICE_ID $TPU_WORKER_ID"' |
      g $track compute tpus tpu-vm ssh "$tpu-solo" --zone="$zone" \
        > "$out/stdin-$name" 2>&1 || fail "tpu-vm ssh (stdin): $(tail -n 3 "$out/stdin-$name")"
    grep -qx "stdin 0 0" "$out/stdin-$name" || fail "tpu-vm ssh (stdin): $(cat "$out/stdin-$name")"
    g $track compute tpus queued-resources delete "$qr-solo" --zone="$zone" \
      --force --quiet > /dev/null 2>&1 || fail "delete $qr-solo"
    # Gerenciar: the full form, with network, tags and a startup script.
    g $track compute tpus queued-resources create "$qr-full" \
      --project=my-project --zone="$zone" --node-count=2 \
      --accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite \
      --network=your-network-name --subnetwork=your-subnetwork-name \
      --tags=your-tag-1,your-tag-2 \
      --metadata=startup-script='#!/bin/bash
echo started > started.txt' > "$out/full-$name" 2>&1 ||
      fail "create (full form): $(tail -n 3 "$out/full-$name")"
    wait_active "$qr-full"
    g $track compute tpus queued-resources describe "$qr-full" --zone="$zone" \
      > "$out/describe-$name" 2>&1
    grep -A1 -x 'state:' "$out/describe-$name" | grep -qx '  state: ACTIVE' ||
      fail "describe: no 'state: ACTIVE' under 'state:'"
    grep -q -- "- your-tag-2" "$out/describe-$name" || fail "describe: no tags"
    g $track compute tpus queued-resources list --zone="$zone" > "$out/list-all-$name" 2>&1
    head -n 1 "$out/list-all-$name" | grep -q '^NAME  *ZONE  *NODE_COUNT  *ACCELERATOR_TYPE' ||
      fail "list: $(head -n 1 "$out/list-all-$name")"
    grep -Eq "^$qr-full +$zone +2 +v5litepod-16 .*ACTIVE" "$out/list-all-$name" ||
      fail "list: $(cat "$out/list-all-$name")"
    started() {
      [ "$(cat $(worker_files "$qr-full" '*' started.txt) 2>/dev/null |
            grep -cx started)" = 8 ]
    }
    wait_until 60 "the startup script on all 8 workers" started
    g $track compute tpus queued-resources delete "$qr-full" --zone="$zone" \
      --force --async --quiet > /dev/null 2>&1 || fail "delete $qr-full"
    wait_until 60 "$qr-full deleted" is_gone "$qr-full"
    phase_done
  done

  [ "$extras" = 1 ] || return 0
  phase "keys open only their own queued resource's hosts"
  track=""
  for q in a b; do
    g compute tpus queued-resources create "iso-$q" --node-id="iso-$q" \
      --accelerator-type=v5litepod-16 --runtime-version=v2-alpha-tpuv5-lite \
      --zone="$zone" > /dev/null 2>&1 || fail "create iso-$q"
  done
  wait_active iso-a
  wait_active iso-b
  # A second user (another HOME, another key) reaches iso-b with gcloud.
  mkdir -p "$scratch/home2/.ssh"
  ssh-keygen -q -N '' -f "$scratch/home2/.ssh/google_compute_engine"
  HOME="$scratch/home2" g compute tpus tpu-vm ssh iso-b --zone="$zone" \
    --command=true > /dev/null 2>&1 || fail "the second user's gcloud ssh to iso-b"
  g compute tpus tpu-vm ssh iso-a --zone="$zone" --command=true > /dev/null 2>&1 ||
    fail "the first user's gcloud ssh to iso-a"
  address() {
    g compute tpus tpu-vm describe "$1" --zone="$zone" \
      --format='value(networkEndpoints[0].ipAddress)'
  }
  plain_ssh() {  # KEY ADDRESS: a login with that key alone
    ssh -i "$1" -o IdentitiesOnly=yes -o BatchMode=yes \
      -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
      -o LogLevel=ERROR -o ConnectTimeout=10 "root@$2" true
  }
  key1="$HOME/.ssh/google_compute_engine" key2="$scratch/home2/.ssh/google_compute_engine"
  a=$(address iso-a) b=$(address iso-b)
  [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ] || fail "addresses '$a' '$b'"
  plain_ssh "$key1" "$a" || fail "the first key does not open iso-a ($a)"
  plain_ssh "$key2" "$b" || fail "the second key does not open iso-b ($b)"
  ! plain_ssh "$key1" "$b" || fail "the key added to iso-a opens iso-b ($b)"
  ! plain_ssh "$key2" "$a" || fail "the key added to iso-b opens iso-a ($a)"
  echo "$prog: iso-a ($a) and iso-b ($b) each open with their own key only"
  for q in a b; do
    g compute tpus queued-resources delete "iso-$q" --zone="$zone" --force \
      --async --quiet > /dev/null 2>&1 || fail "delete iso-$q"
  done
  wait_until 60 "iso-a deleted" is_gone iso-a
  # Deleted: the key opens nothing any more.
  # (within a heartbeat: the host's agent learns it is free)
  key_refused() { ! plain_ssh "$key1" "$a"; }
  wait_until 10 "iso-a's key refused by $a after the delete" key_refused
  phase_done

  phase "a bad flag value is the controller's 400, shown by gcloud"
  code=0
  g compute tpus queued-resources create bad --node-count=2 \
    --accelerator-type=v9-bogus --runtime-version=x --zone="$zone" \
    > "$out/bad" 2>&1 || code=$?
  [ "$code" != 0 ] &&
    grep -q "INVALID_ARGUMENT: tpu.node_spec\[0\].node.accelerator_type: unknown accelerator type 'v9-bogus'" "$out/bad" ||
    fail "bad flag: exit $code: $(cat "$out/bad")"
  phase_done
}

# ---------------------------------------------------------------------------
# Inside the namespace cluster: netns_cluster.sh's COMMAND.
if [ "${1:-}" = "--inside" ]; then
  scratch="$2"
  cluster_workdir="$(dirname "$(dirname "$MULTISLICE_TOKEN_FILE")")"
  echo "$cluster_workdir" > "$scratch/cluster_workdir"
  url="$MULTISLICE_CONTROLLER" token_file="$MULTISLICE_TOKEN_FILE" zone=local-a
  hosts_dir="$cluster_workdir/hosts" extras=0
  tutorial
  exit 0
fi

# ---------------------------------------------------------------------------
# Outside.
mode="${1:-local}"
[ "$mode" = local ] || [ "$mode" = cluster ] || { echo "usage: $0 local|cluster [BINARY]" >&2; exit 2; }
echo "$prog: mode $mode"
command -v gcloud > /dev/null ||
  skip "gcloud is not installed (Google's google-cloud-cli; Debian's archive does not have it)"
require_root "each host's sshd listens on port 22"
[ -x /usr/sbin/sshd ] && command -v ssh > /dev/null ||
  skip "needs openssh-server and openssh-client (scripts/install_deps.sh)"
require_tools python3 bc timeout
make_scratch "${2:-$root/build/bin/multislice}" gcloud-test g

if [ "$mode" = cluster ]; then
  require_tools ip tc
  require_netns_veth_htb
  run_cluster "cluster and gcloud tutorial" 400 --hosts 8 \
    --accelerator_type v5litepod-16
  check_nothing_left
fi

# Local: the controller with 8 local hosts, on a free port.
code=0
(
  data="$scratch/controller"
  "$MULTISLICE_BINARY" controller --local-hosts 8 \
    --local-accelerator-type v5litepod-16 --zone us-central2-b --port 0 \
    --data-dir "$data" > "$scratch/controller.log" 2>&1 &
  controller=$!
  trap 'kill -TERM $controller 2>/dev/null; wait $controller 2>/dev/null' EXIT
  for _ in $(seq 300); do
    url=$(grep -o 'http://[0-9.:]*' "$scratch/controller.log" | head -n 1 || true)
    [ -n "$url" ] && [ "$(grep -c 'ssh: sshd listening' "$data"/hosts/*/agent.log 2>/dev/null | awk -F: '{ s += $2 } END { print s + 0 }')" = 8 ] && break
    sleep 0.1
  done
  [ -n "$url" ] || fail "the controller did not start: $(tail -n 5 "$scratch/controller.log")"
  token_file="$data/token" zone=us-central2-b hosts_dir="$data/hosts" extras=1
  tutorial
) || code=$?
echo "$scratch" > /dev/null
procs=$(pgrep -f -- "$scratch" || true)
# shellcheck disable=SC2086
[ -z "$procs" ] || { echo "$prog: FAILED: processes left: $(ps -o pid=,args= -p $procs)" >&2; code=1; }
[ "$code" -eq 0 ] && echo "$prog: PASSED (nothing left behind)"
exit "$code"
