#!/usr/bin/env bash
# Pre-training presets: each function echoes the positional arguments of scripts/run_pretraining.sh.
#   bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && dgxa100_8gpu_fp16)
# Order: batch lr precision gpus warmup steps save_steps resume logfile accumulate acc_steps seed job
#        allreduce_post allreduce_fp16 batch2 lr2 warmup2 steps2 acc_steps2 [data1 config data2 codedir init]
# The global batch is 65536 (phase 1) and 32768 (phase 2) sequences in every GPU preset, as in the LAMB paper.

dgxa100_8gpu_fp16() {
  echo 8192 6e-3 fp16 8 0.2843 7038 200 false true true 128 42 bert_dgxa100_fp16 true true \
    4096 4e-3 0.128 1563 256
}

dgxa100_8gpu_tf32() {
  echo 8192 6e-3 tf32 8 0.2843 7038 200 false true true 256 42 bert_dgxa100_tf32 true false \
    4096 4e-3 0.128 1563 512
}

dgx2_16gpu_fp16() {
  echo 4096 6e-3 fp16 16 0.2843 7038 200 false true true 64 42 bert_dgx2_fp16 true true \
    2048 4e-3 0.128 1563 256
}

dgx1_8gpu_fp16() {
  echo 8192 6e-3 fp16 8 0.2843 7038 200 false true true 512 42 bert_dgx1_fp16 true true \
    4096 4e-3 0.128 1563 1024
}

h100_8gpu_bf16() {
  echo 8192 6e-3 bf16 8 0.2843 7038 200 false true true 64 42 bert_h100_bf16 true true \
    4096 4e-3 0.128 1563 128
}

# One process on a CPU with the tiny config: a smoke run of the whole two-phase recipe.
cpu() {
  local data="${BERT_PREP_WORKING_DIR:-data}"
  echo 64 1e-2 bf16 1 0.1 200 100 false true true 2 42 bert_cpu false false \
    16 5e-3 0.1 50 2 \
    "$data/hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/python_docs" \
    bert_configs/tiny.json \
    "$data/hdf5_lower_case_1_seq_len_512_max_pred_80_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/python_docs"
}
