#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on the local
# default: `multislice train configs/quickstart.yml`, a small GPT-2 trained
# on the fortunes corpus across two slices (one CPU device each) of this
# machine, data parallel over DCN, with checkpoints in runs/quickstart/; then
# samples from it. Extra arguments are key=value overrides for the config
# (see `build/bin/multislice train --help`), e.g. steps=200.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh multislice   # the binary only; scripts/test.sh builds the tests
build/bin/multislice train configs/quickstart.yml "$@"
base=runs name=quickstart
for arg in "$@"; do
  case $arg in
    base_output_directory=*) base=${arg#*=} ;;
    run_name=*) name=${arg#*=} ;;
  esac
done
run_dir=$base/$name
echo "--- a sample from the trained model (multislice generate $run_dir):"
build/bin/multislice generate "$run_dir" --prompt 'The meaning of life ' \
  --max_new_tokens 160
