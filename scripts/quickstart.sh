#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on the local
# default: a SentencePiece tokenizer of 8192 pieces trained on the fortunes
# corpus (`multislice data prepare --train_tokenizer 8192`, once, into
# runs/datasets/fortunes-sp8k), then `multislice train configs/quickstart.yml`,
# a small Llama 2 style model trained across two slices (one CPU device each)
# of this machine, data parallel over DCN, with checkpoints in
# runs/quickstart/; then samples from it. Extra arguments are key=value
# overrides for the config (see `build/bin/multislice train --help`), e.g.
# steps=200.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh multislice   # the binary only; scripts/test.sh builds the tests
dataset=runs/datasets/fortunes-sp8k
if [ ! -f "$dataset/dataset.json" ]; then
  build/bin/multislice data prepare --train_tokenizer 8192 --output "$dataset"
fi
build/bin/multislice train configs/quickstart.yml "$@"
base=runs name=quickstart
for arg in "$@"; do
  case $arg in
    base_output_directory=*) base=${arg#*=} ;;
    run_name=*) name=${arg#*=} ;;
  esac
done
run_dir=$base/$name
echo "--- samples from the trained model (multislice generate $run_dir):"
for prompt in 'The meaning of life ' 'Q: ' 'A computer '; do
  printf '%s' "$prompt"
  build/bin/multislice generate "$run_dir" --prompt "$prompt" \
    --max_new_tokens 60 --temperature 0.7 --top_k 40
done
