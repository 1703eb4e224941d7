#!/usr/bin/env bash
# GLUE presets: each function echoes the positional arguments of scripts/run_glue.sh.
#   bash scripts/run_glue.sh $(source scripts/configs/glue_config.sh && mrpc_dgxa100-80g_8gpu_fp16)
# Order: init_checkpoint data_dir vocab_file config_file out_dir task_name num_gpu batch_size
#        gradient_accumulation_steps learning_rate warmup_proportion epochs max_steps precision [seed mode]
# GPU presets are NVIDIA's published ones for BERT-large: <task>_<system>_<1|2|4|8>gpu_<precision> for MRPC and
# SST-2 on dgxa100-80g (fp16, tf32) and dgx1-32g (fp16, fp32). The global batch is split over the GPUs and,
# past what one GPU holds, over accumulation steps.

_glue_preset() {  # task system gpus precision
  local task=$1 system=$2 gpus=$3 precision=$4 work=${BERT_PREP_WORKING_DIR:-data}
  local folder global lr warmup capacity accumulation=1 batch
  case $task in
    mrpc) folder=MRPC global=128 lr=1.8e-5 warmup=0.3 ;;
    sst-2) folder=SST-2 global=1024 lr=1e-5 warmup=0.1 ;;
  esac
  case $system-$precision in
    dgxa100-80g-fp16) capacity=256 ;;
    dgxa100-80g-tf32|dgx1-32g-fp16) capacity=128 ;;
    dgx1-32g-fp32) capacity=64; [ "$task" = sst-2 ] && global=512 ;;
  esac
  batch=$((global / gpus))
  while [ $((batch / accumulation)) -gt "$capacity" ]; do accumulation=$((accumulation * 2)); done
  echo /workspace/bert/checkpoints/bert_uncased.pt "$work/download/glue/$folder/" \
    "$work/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt" bert_configs/large.json \
    "/workspace/bert/results/$folder" "$task" "$gpus" "$batch" "$accumulation" "$lr" "$warmup" 3 -1.0 "$precision"
}

for _task in mrpc sst-2; do
  for _system_precision in dgxa100-80g:fp16 dgxa100-80g:tf32 dgx1-32g:fp16 dgx1-32g:fp32; do
    for _gpus in 1 2 4 8; do
      _name="${_task}_${_system_precision%:*}_${_gpus}gpu_${_system_precision#*:}"
      eval "${_name}() { _glue_preset $_task ${_system_precision%:*} $_gpus ${_system_precision#*:}; }"
    done
  done
done
unset _task _system_precision _gpus _name

# One CPU process, fp32, config from the checkpoint (e.g. a Hugging Face directory of a small BERT); any task:
# <task>_cpu for mrpc, sst-2, cola, rte, sts-b; `cpu` is mrpc_cpu. INIT_CHECKPOINT and VOCAB_FILE say where.
_glue_cpu() {  # task folder learning_rate epochs
  local work=${BERT_PREP_WORKING_DIR:-data}
  echo "${INIT_CHECKPOINT:-checkpoints/minilm}" "$work/download/glue/$2/" \
    "${VOCAB_FILE:-checkpoints/minilm/vocab.txt}" checkpoint "results/$2" "$1" 1 32 1 "$3" 0.1 "$4" -1.0 fp32 2 \
    train+eval
}
mrpc_cpu() { _glue_cpu mrpc MRPC 5e-5 3; }
sst-2_cpu() { _glue_cpu sst-2 SST-2 5e-5 1; }
cola_cpu() { _glue_cpu cola CoLA 5e-5 3; }
rte_cpu() { _glue_cpu rte RTE 5e-5 3; }
sts-b_cpu() { _glue_cpu sts-b STS-B 5e-5 3; }
cpu() { mrpc_cpu; }
