#!/usr/bin/env bash
# Whole data chain, NVIDIA-style: bash data/create_datasets_from_start.sh [wiki_only|wiki_books] [bert|modern]
# bert (default): NVIDIA's phase-1 and phase-2 shards (128/20 and 512/80); modern: document-chunk shards of 1,024
# and 8,192 tokens for the modern family's two phases (scripts/configs/pretrain_config.sh modernbert_base_8gpu_bf16).
# Needs the network for the downloads. Working directory: $BERT_PREP_WORKING_DIR (default data/ in the checkout).
set -euo pipefail
to_download=${1:-wiki_only}
recipe=${2:-bert}
case "$recipe" in
  bert|modern) ;;
  *) echo "error: usage: $0 [wiki_only|wiki_books] [bert|modern]: '$recipe' is neither bert nor modern" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"
python=${PYTHON:-python}
prep() { "$python" "$here/bertPrep.py" "$@"; }

case "$to_download" in
  wiki_only) corpus=wikicorpus_en ;;
  wiki_books) corpus=books_wiki_en_corpus; prep --action download --dataset bookscorpus ;;
  *) echo "error: usage: $0 [wiki_only|wiki_books]" >&2; exit 2 ;;
esac
prep --action download --dataset wikicorpus_en
prep --action download --dataset google_pretrained_weights
prep --action download --dataset squad
prep --action download --dataset mrpc
prep --action download --dataset sst-2
prep --action text_formatting --dataset wikicorpus_en
[ "$to_download" = wiki_books ] && prep --action text_formatting --dataset bookscorpus
prep --action sharding --dataset "$corpus"
vocab="${BERT_PREP_WORKING_DIR:-$here}/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt"
if [ "$recipe" = modern ]; then
  # Whole documents cut into rows, masked at load time (no sentence pairs, no NSP labels).
  prep --action create_hdf5_files --dataset "$corpus" --document_chunks --max_seq_length 1024 --vocab_file "$vocab"
  prep --action create_hdf5_files --dataset "$corpus" --document_chunks --max_seq_length 8192 --vocab_file "$vocab"
  exit 0
fi
# Phase 1 and phase 2 shards (NVIDIA's defaults: 256 training and 256 test shards, dupe factor 5).
prep --action create_hdf5_files --dataset "$corpus" --max_seq_length 128 --max_predictions_per_seq 20 \
  --vocab_file "$vocab"
prep --action create_hdf5_files --dataset "$corpus" --max_seq_length 512 --max_predictions_per_seq 80 \
  --vocab_file "$vocab"
