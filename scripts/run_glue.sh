#!/usr/bin/env bash
# GLUE fine-tuning and evaluation with NVIDIA's positional arguments in NVIDIA's order:
#   bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && mrpc_dgxa100-80g_8gpu_fp16)
# mode: "train", "eval", "prediction" or any combination ("train eval", the default; "train+eval" too).
# config_file "checkpoint" takes the config from the checkpoint (e.g. a Hugging Face directory).
set -euo pipefail

init_checkpoint=${1:-"/workspace/bert/checkpoints/bert_uncased.pt"}
data_dir=${2:-"${BERT_PREP_WORKING_DIR:-data}/download/glue/MRPC/"}
vocab_file=${3:-"${BERT_PREP_WORKING_DIR:-data}/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt"}
config_file=${4:-"bert_configs/large.json"}
out_dir=${5:-"results/MRPC"}
task_name=${6:-"mrpc"}
num_gpu=${7:-"8"}                    # processes (1 on a CPU)
batch_size=${8:-"16"}
gradient_accumulation_steps=${9:-"1"}
learning_rate=${10:-"2.4e-5"}
warmup_proportion=${11:-"0.1"}
epochs=${12:-"3"}
max_steps=${13:-"-1.0"}
precision=${14:-"fp16"}              # fp16 | bf16 | tf32 | fp32
seed=${15:-"2"}
mode=${16:-"train eval"}
CODEDIR=${CODEDIR:-"$(cd "$(dirname "$0")/.." && pwd)"}
PYTHON=${PYTHON:-python3}

# The arguments only this script reads are checked before anything runs; run_glue.py checks the others (--mode
# too) and, like this script, creates nothing (no folder, no log) when it refuses them.
flags=()
# shellcheck source=scripts/precision_flags.sh
source "$(dirname "${BASH_SOURCE[0]}")/precision_flags.sh"
add_precision_flag "$precision"
require_count num_gpu 7 "$num_gpu"
[ "$config_file" != "checkpoint" ] && flags+=(--config_file="$config_file")

# bertrecipe.cli.launch (torchrun in one process, in place of this script so that signals reach it) ends with the
# workers' own exit status and no traceback after their one-line errors. It appends the output to
# $out_dir/logfile.txt after a line naming the run's start (an earlier run's log, scores included, is never
# cut), and opens it only once run_glue.py wrote its dllogger JSON, right after its argument checks: refused
# arguments leave no log and no $out_dir.
exec "$PYTHON" -m bertrecipe.cli.launch --log_file="$out_dir/logfile.txt" --log_after="$out_dir/dllogger.json" \
  --standalone --nproc_per_node="$num_gpu" "$CODEDIR/run_glue.py" \
  --task_name="$task_name" --data_dir="$data_dir" --vocab_file="$vocab_file" --init_checkpoint="$init_checkpoint" \
  --output_dir="$out_dir" --mode="$mode" --bert_model=bert-large-uncased --do_lower_case --max_seq_length=128 \
  --train_batch_size="$batch_size" --eval_batch_size="$batch_size" \
  --gradient_accumulation_steps="$gradient_accumulation_steps" --learning_rate="$learning_rate" \
  --warmup_proportion="$warmup_proportion" --num_train_epochs="$epochs" --max_steps="$max_steps" --seed="$seed" \
  --json-summary="$out_dir/dllogger.json" "${flags[@]}"
