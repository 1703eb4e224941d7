#!/usr/bin/env bash
# SQuAD presets: each function echoes the positional arguments of scripts/run_squad.sh.
#   bash scripts/run_squad.sh $(source scripts/configs/squad_config.sh && dgxa100-80g_8gpu_fp16)
# Order: init_checkpoint epochs batch_size learning_rate warmup_proportion precision num_gpu seed squad_dir
#        vocab_file out_dir [mode config_file max_steps]
# The GPU presets are NVIDIA's published ones for BERT-large (v1.1, 2 epochs, lr 4.6e-5, warmup 0.2, seed 1).

_squad_gpu() {  # batch_size precision
  local work=${BERT_PREP_WORKING_DIR:-data}
  echo /workspace/bert/checkpoints/bert_uncased.pt 2.0 "$1" 4.6e-5 0.2 "$2" 8 1 "$work/download/squad/v1.1" \
    "$work/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt" /workspace/bert/results/SQuAD
}

dgxa100-80g_8gpu_fp16() { _squad_gpu 32 fp16; }
dgxa100-80g_8gpu_tf32() { _squad_gpu 32 tf32; }
dgx1-32g_8gpu_fp16() { _squad_gpu 32 fp16; }
dgx1-32g_8gpu_fp32() { _squad_gpu 16 fp32; }

# One CPU process, fp32, config taken from the checkpoint (e.g. a Hugging Face directory such as a small BERT);
# INIT_CHECKPOINT and VOCAB_FILE say where they are.
cpu() {
  local work=${BERT_PREP_WORKING_DIR:-data}
  echo "${INIT_CHECKPOINT:-checkpoints/minilm}" 2.0 16 5e-5 0.1 fp32 1 1 "$work/download/squad/v1.1" \
    "${VOCAB_FILE:-checkpoints/minilm/vocab.txt}" results/SQuAD train+eval checkpoint -1
}
