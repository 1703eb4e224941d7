#!/usr/bin/env bash
# Starts the image with NVIDIA's arguments: bash scripts/docker/launch.sh [command] [visible devices] [bridge]
# Mounts the code (edits apply without a rebuild), results/ and the prepared data ($BERT_PREP_WORKING_DIR on the
# host, default data/); IMAGE picks the tag.
set -euo pipefail
code_dir=$(cd "$(dirname "$0")/../.." && pwd)
cmd=${1:-bash}
visible_devices=${2:-all}
docker_bridge=${3:-host}
image=${IMAGE:-bert}
data_dir=${BERT_PREP_WORKING_DIR:-$code_dir/data}
results_dir=${RESULTS_DIR:-$code_dir/results}
mkdir -p "$results_dir"
tty=()
[ -t 0 ] && tty=(-it)
# shellcheck disable=SC2086  # the command is split into words on purpose, as in NVIDIA's script
docker run "${tty[@]}" --rm --gpus "\"device=$visible_devices\"" --net="$docker_bridge" --ipc=host \
  --ulimit memlock=-1 --ulimit stack=67108864 \
  -v "$code_dir:/workspace/bert" -v "$results_dir:/results" -v "$data_dir:/workspace/data" \
  "$image" $cmd
