#!/usr/bin/env bash
# SQuAD fine-tuning, prediction and evaluation with NVIDIA's positional arguments in NVIDIA's order:
#   bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && dgxa100-80g_8gpu_fp16)
# mode: "train", "eval" (predict + evaluate), "prediction" or both ("train eval", the default; "train+eval" too).
# config_file "checkpoint" takes the config from the checkpoint (e.g. a Hugging Face directory).
set -euo pipefail

init_checkpoint=${1:-"/workspace/bert/checkpoints/bert_uncased.pt"}
epochs=${2:-"2.0"}
batch_size=${3:-"4"}
learning_rate=${4:-"3e-5"}
warmup_proportion=${5:-"0.1"}
precision=${6:-"fp16"}               # fp16 | bf16 | tf32 | fp32
num_gpu=${7:-"8"}                    # processes (1 on a CPU)
seed=${8:-"1"}
squad_dir=${9:-"${BERT_PREP_WORKING_DIR:-data}/download/squad/v1.1"}
vocab_file=${10:-"${BERT_PREP_WORKING_DIR:-data}/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt"}
OUT_DIR=${11:-"results/SQuAD"}
mode=${12:-"train eval"}
CONFIG_FILE=${13:-"bert_configs/large.json"}
max_steps=${14:-"-1"}
CODEDIR=${CODEDIR:-"$(cd "$(dirname "$0")/.." && pwd)"}
PYTHON=${PYTHON:-python3}

# The arguments only this script reads are checked before anything runs; run_squad.py checks the others and,
# like this script, creates nothing (no folder, no log) when it refuses them.
flags=()
# shellcheck source=scripts/precision_flags.sh
source "$(dirname "${BASH_SOURCE[0]}")/precision_flags.sh"
add_precision_flag "$precision"
require_count num_gpu 7 "$num_gpu"
require_mode 12 "$mode"
[[ $mode == *train* ]] && flags+=(--do_train --train_file="$squad_dir/train-v1.1.json" --train_batch_size="$batch_size")
[[ $mode == *eval* || $mode == *prediction* ]] && flags+=(--do_predict --predict_file="$squad_dir/dev-v1.1.json" \
  --predict_batch_size="$batch_size")
[[ $mode == *eval* ]] && flags+=(--do_eval)
[ "$CONFIG_FILE" != "checkpoint" ] && flags+=(--config_file="$CONFIG_FILE")

# bertrecipe.cli.launch (torchrun in one process, in place of this script so that signals reach it) ends with the
# workers' own exit status and no traceback after their one-line errors. It appends the output to
# $OUT_DIR/logfile.txt after a line naming the run's start (an earlier run's log, scores included, is never
# cut), and opens it only once run_squad.py wrote its dllogger JSON, right after its argument checks: refused
# arguments leave no log and no $OUT_DIR.
exec "$PYTHON" -m bertrecipe.cli.launch --log_file="$OUT_DIR/logfile.txt" --log_after="$OUT_DIR/dllogger.json" \
  --standalone --nproc_per_node="$num_gpu" "$CODEDIR/run_squad.py" \
  --init_checkpoint="$init_checkpoint" --bert_model=bert-large-uncased --do_lower_case --max_seq_length=384 \
  --doc_stride=128 --num_train_epochs="$epochs" --learning_rate="$learning_rate" \
  --warmup_proportion="$warmup_proportion" --seed="$seed" --max_steps="$max_steps" --vocab_file="$vocab_file" \
  --output_dir="$OUT_DIR" --json-summary="$OUT_DIR/dllogger.json" "${flags[@]}"
