#!/usr/bin/env bash
# BERT pre-training, phase 1 (seq 128) then phase 2 (seq 512), with NVIDIA's positional arguments in NVIDIA's order:
#   bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && dgxa100_8gpu_fp16)
# Works with one process on a CPU: bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && cpu)
# Arguments 26-33 (ours) train the modern family the same way, phase 2 being its context extension:
#   bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && modernbert_base_8gpu_bf16)
set -euo pipefail

train_batch_size=${1:-8192}
learning_rate=${2:-"6e-3"}
precision=${3:-"fp16"}               # fp16 | bf16 | tf32 | fp32
num_gpus=${4:-8}                     # processes per node (1 on a CPU)
warmup_proportion=${5:-"0.2843"}
train_steps=${6:-7038}
save_checkpoint_steps=${7:-200}
resume_training=${8:-"false"}
create_logfile=${9:-"true"}
accumulate_gradients=${10:-"true"}
gradient_accumulation_steps=${11:-128}
seed=${12:-12439}
job_name=${13:-"bert_lamb_pretraining"}
allreduce_post_accumulation=${14:-"true"}
allreduce_post_accumulation_fp16=${15:-"true"}
train_batch_size_phase2=${16:-4096}
learning_rate_phase2=${17:-"4e-3"}
warmup_proportion_phase2=${18:-"0.128"}
train_steps_phase2=${19:-1563}
gradient_accumulation_steps_phase2=${20:-512}
BERT_PREP_WORKING_DIR=${BERT_PREP_WORKING_DIR:-"$(cd "$(dirname "$0")/.." && pwd)/data"}
DATA_DIR_PHASE1=${21:-"$BERT_PREP_WORKING_DIR/hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/books_wiki_en_corpus"}
BERT_CONFIG=${22:-"bert_configs/large.json"}
DATA_DIR_PHASE2=${23:-"$BERT_PREP_WORKING_DIR/hdf5_lower_case_1_seq_len_512_max_pred_80_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/books_wiki_en_corpus"}
CODEDIR=${24:-"$(cd "$(dirname "$0")/.." && pwd)"}
init_checkpoint=${25:-"None"}
# recipe: bert (NVIDIA's: LAMB, poly schedule, NSP, the shards' masks) or modern (ModernBERT's: StableAdamW,
# warmup-stable-decay with phase 1 held at its peak and phase 2 decaying its last sixth, 30 % masking at load
# time, no NSP, packed rows). The lengths, masked positions and phase 2's config default per recipe.
recipe=${26:-"bert"}
case "$recipe" in
  bert) lengths=(128 20 512 80); config2_default=$BERT_CONFIG ;;
  modern)
    lengths=(1024 308 8192 2458)  # 30 % of each length
    [ -n "${22:-}" ] || BERT_CONFIG=bert_configs/modernbert-base.json
    config2_default=${BERT_CONFIG%.json}-8k.json
    [ -n "${21:-}" ] || DATA_DIR_PHASE1="$BERT_PREP_WORKING_DIR/hdf5_document_chunks_lower_case_1_seq_len_1024_random_seed_12345/books_wiki_en_corpus"
    [ -n "${23:-}" ] || DATA_DIR_PHASE2="$BERT_PREP_WORKING_DIR/hdf5_document_chunks_lower_case_1_seq_len_8192_random_seed_12345/books_wiki_en_corpus"
    ;;
  *) echo "error: recipe (argument 26): '$recipe' is neither bert nor modern" >&2; exit 2 ;;
esac
max_seq_length=${27:-${lengths[0]}}
max_predictions_per_seq=${28:-${lengths[1]}}
max_seq_length_phase2=${29:-${lengths[2]}}
max_predictions_per_seq_phase2=${30:-${lengths[3]}}
BERT_CONFIG_PHASE2=${31:-$config2_default}  # the modern family's context extension raises its rotary base
# Phase 1's batch-size warm-up (ModernBERT's: from 768 to 4,608 rows over its first 50B tokens): the real tokens it
# lasts (0: none) and the share of the batch it starts from; run_pretraining.py checks both.
batch_size_warmup_tokens=${32:-0}
batch_size_warmup_start=${33:-"0.125"}
# Argument 34: ddp (each GPU a whole copy of the model and optimizer state) or fsdp (each 1/W of it, for models
# whose state does not fit; docs/pre-training.md). Argument 35: the nodes the run spans (this script runs on each,
# with NODE_RANK, MASTER_ADDR and MASTER_PORT set; the batch arguments are per GPU, as always).
sharding=${34:-"ddp"}
nodes=${35:-1}
RESULTS_DIR=${RESULTS_DIR:-"$CODEDIR/results"}
CHECKPOINTS_DIR=$RESULTS_DIR/checkpoints
PYTHON=${PYTHON:-python3}
EXTRA_ARGS=${EXTRA_ARGS:-}           # e.g. "--eval_dir DIR --compile_optimizer --steps_this_run 100"
# Seconds the workers get after a SIGTERM or Ctrl-C to finish their step and checkpoint before they are killed,
# passed to the launcher as --shutdown_timeout. 300 here, as run.sub's SIGTERM comes 300 s before the time limit;
# without the flag (run_squad.sh, run_glue.sh, the launcher by hand) it is torchrun's default:
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s, which can cut a large checkpoint short.
SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT:-300}

# The arguments only this script reads are checked before anything runs; run_pretraining.py checks the others
# and, like this script, creates nothing (no folder, no log) when it refuses them.
flags=()
# shellcheck source=scripts/precision_flags.sh
source "$(dirname "${BASH_SOURCE[0]}")/precision_flags.sh"
add_precision_flag "$precision"
require_count num_gpus 4 "$num_gpus"
if ! [[ $SHUTDOWN_TIMEOUT =~ ^[0-9]+$ ]]; then
  echo "error: SHUTDOWN_TIMEOUT: '$SHUTDOWN_TIMEOUT' is not a whole number of seconds" >&2
  exit 2
fi
require_boolean resume_training 8 "$resume_training"
require_boolean create_logfile 9 "$create_logfile"
require_boolean accumulate_gradients 10 "$accumulate_gradients"
require_boolean allreduce_post_accumulation 14 "$allreduce_post_accumulation"
require_boolean allreduce_post_accumulation_fp16 15 "$allreduce_post_accumulation_fp16"
case "$sharding" in
  ddp|fsdp) ;;
  *) refuse_argument sharding 34 "$sharding" "is neither ddp nor fsdp" ;;
esac
require_count nodes 35 "$nodes"
if [ "$nodes" != 1 ] && { [ -z "${NODE_RANK:-}" ] || [ -z "${MASTER_ADDR:-}" ]; }; then
  refuse_argument nodes 35 "$nodes" "needs NODE_RANK (this node's, from 0) and MASTER_ADDR (node 0's address) set"
fi
require_count max_seq_length 27 "$max_seq_length"
require_count max_predictions_per_seq 28 "$max_predictions_per_seq"
require_count max_seq_length_phase2 29 "$max_seq_length_phase2"
require_count max_predictions_per_seq_phase2 30 "$max_predictions_per_seq_phase2"
# A phase-2 config of its own is read only after phase 1 has trained: a missing one is refused now.
if [ "$BERT_CONFIG_PHASE2" != "$BERT_CONFIG" ] && [ ! -f "$BERT_CONFIG_PHASE2" ]; then
  refuse_argument "phase 2's config" 31 "$BERT_CONFIG_PHASE2" "does not exist"
fi
[ "$accumulate_gradients" = "true" ] || { gradient_accumulation_steps=1; gradient_accumulation_steps_phase2=1; }
[ "$allreduce_post_accumulation" = "true" ] && flags+=(--allreduce_post_accumulation)
[ "$allreduce_post_accumulation_fp16" = "true" ] && flags+=(--allreduce_post_accumulation_fp16)
[ "$sharding" = fsdp ] && flags+=(--sharding=fsdp)
phase1=() phase2=()
if [ "$recipe" = modern ]; then
  flags+=(--optimizer=stable_adamw --adam_beta2=0.98 --weight_decay=1e-5 --lr_schedule=wsd --decay_shape=1-sqrt
          --dynamic_masking --masked_lm_prob=0.3 --no_nsp --pack_sequences)
  phase1+=(--decay_proportion=0)
  phase2+=(--decay_proportion=0.1667)  # ModernBERT: 250B tokens at 8,192 then a 50B-token decay
fi
if [ "$batch_size_warmup_tokens" != 0 ]; then
  phase1+=(--batch_size_warmup_tokens="$batch_size_warmup_tokens" --batch_size_warmup_start="$batch_size_warmup_start")
fi
resume=()
[ "$resume_training" = "true" ] && resume+=(--resume_from_checkpoint)
[ "$init_checkpoint" != "None" ] && resume+=(--init_checkpoint "$init_checkpoint")
# shellcheck disable=SC2206  # EXTRA_ARGS is split into words on purpose
extra=($EXTRA_ARGS)
LOG_FILE=$RESULTS_DIR/$job_name.log

# launch PHASE_JSON ARGS...: one phase through bertrecipe.cli.launch (torchrun in one process), which ends with the
# workers' own exit status (2 after their one-line error, 130 after Ctrl-C, 143 after a SIGTERM that stopped the
# phase early) and no traceback. With create_logfile=true it appends the phase's output to $LOG_FILE after a line
# naming the phase's start, and opens that log only once the phase wrote PHASE_JSON, which run_pretraining.py
# does right after its argument checks: refused arguments leave no log and no results folder. An earlier run's
# log is never cut. The launcher runs as a background job that this script waits for, so that a SIGTERM sent to
# this script alone (docker stop, a scheduler) is handed on to it; Ctrl-C reaches it directly (the terminal
# signals the whole foreground process group), so meanwhile this script ignores SIGINT and waits for its status.
launch() {
  local json=$1 launcher status=0
  shift
  local command=("$PYTHON" -m bertrecipe.cli.launch)
  [ "$create_logfile" = "true" ] && command+=(--log_file="$LOG_FILE" --log_after="$json")
  if [ "$nodes" = 1 ]; then
    command+=(--standalone)
  else  # torchrun's static rendezvous at node 0
    command+=(--nnodes="$nodes" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="${MASTER_PORT:-29500}")
  fi
  command+=(--nproc_per_node="$num_gpus" --shutdown_timeout="$SHUTDOWN_TIMEOUT")
  trap '' INT
  "${command[@]}" "$CODEDIR/run_pretraining.py" --json-summary="$json" "$@" &
  launcher=$!
  trap 'kill -TERM "$launcher" 2>/dev/null || true' TERM
  wait "$launcher" || status=$?
  while kill -0 "$launcher" 2>/dev/null; do  # wait was cut short by the trapped SIGTERM: wait on for the exit
    status=0
    wait "$launcher" || status=$?
  done
  trap - TERM INT
  return "$status"
}

launch "$RESULTS_DIR/dllogger_phase1.json" --input_dir="$DATA_DIR_PHASE1" --output_dir="$CHECKPOINTS_DIR" \
  --config_file="$BERT_CONFIG" --bert_model=bert-large-uncased --train_batch_size="$train_batch_size" \
  --max_seq_length="$max_seq_length" --max_predictions_per_seq="$max_predictions_per_seq" \
  --max_steps="$train_steps" --warmup_proportion="$warmup_proportion" \
  --num_steps_per_checkpoint="$save_checkpoint_steps" --learning_rate="$learning_rate" --seed="$seed" \
  --gradient_accumulation_steps="$gradient_accumulation_steps" --do_train "${flags[@]}" "${phase1[@]}" \
  "${resume[@]}" "${extra[@]}"

# A shortened phase 1 (--steps_this_run, exit 0) must not hand over; a preempted one (SIGTERM) ended above, 143.
# (Its checkpoint is a file, or under fsdp a folder of shards.)
if [ ! -f "$CHECKPOINTS_DIR/ckpt_${train_steps}.pt" ] && [ ! -d "$CHECKPOINTS_DIR/ckpt_${train_steps}.dcp" ]; then
  message="phase 1 stopped before step $train_steps: run again with resume_training=true to finish it;"
  message+=" phase 2 not started"
  echo "$message"
  if [ -f "$LOG_FILE" ] && [ "$create_logfile" = "true" ]; then echo "$message" >> "$LOG_FILE"; fi
  exit 0
fi

launch "$RESULTS_DIR/dllogger_phase2.json" --input_dir="$DATA_DIR_PHASE2" --output_dir="$CHECKPOINTS_DIR" \
  --config_file="$BERT_CONFIG_PHASE2" --bert_model=bert-large-uncased \
  --train_batch_size="$train_batch_size_phase2" --max_seq_length="$max_seq_length_phase2" \
  --max_predictions_per_seq="$max_predictions_per_seq_phase2" --max_steps="$train_steps_phase2" \
  --warmup_proportion="$warmup_proportion_phase2" --num_steps_per_checkpoint="$save_checkpoint_steps" \
  --learning_rate="$learning_rate_phase2" --seed="$seed" \
  --gradient_accumulation_steps="$gradient_accumulation_steps_phase2" --do_train --resume_from_checkpoint \
  --phase2 --phase1_end_step="$train_steps" "${flags[@]}" "${phase2[@]}" "${extra[@]}"
