#!/usr/bin/env bash
# Pre-training presets: each function echoes the positional arguments of scripts/run_pretraining.sh.
#   bash scripts/run_pretraining.sh $(source scripts/configs/pretrain_config.sh && dgxa100_8gpu_fp16)
# Order: batch lr precision gpus warmup steps save_steps resume logfile accumulate acc_steps seed job
#        allreduce_post allreduce_fp16 batch2 lr2 warmup2 steps2 acc_steps2 [data1 config data2 codedir init
#        [recipe seq1 preds1 seq2 preds2 config2 [batch_warmup_tokens batch_warmup_start [sharding nodes]]]]
# The global batch is 65536 (phase 1) and 32768 (phase 2) sequences in every BERT GPU preset, as in the LAMB paper.

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

# The modern family (arguments 26-33: recipe, lengths and masked positions of both phases, phase 2's config,
# phase 1's batch-size warm-up in tokens and the share of the batch it starts from).
# ModernBERT-base's recipe (Warner et al., 2024) on one node of 8 GPUs: 4,608 rows of 1,024 tokens a step
# (4.7M tokens; the first 50B tokens warm the batch up from 768 rows), peak 8e-4 after a 3B-token warm-up, 1.7T
# tokens; then the context extension to 8,192 tokens with
# the global rotary base raised to 160,000 (modernbert-base-8k.json), the same tokens a step, 3e-4, 300B tokens
# whose last sixth decays. Data: document-chunk shards (data/create_datasets_from_start.sh wiki_books modern).
modernbert_base_8gpu_bf16() {
  local data="${BERT_PREP_WORKING_DIR:-data}"
  echo 576 8e-4 bf16 8 0.0018 360275 2000 false true true 12 42 modernbert_base_bf16 true false \
    72 3e-4 0 63578 18 \
    "$data/hdf5_document_chunks_lower_case_1_seq_len_1024_random_seed_12345/books_wiki_en_corpus" \
    bert_configs/modernbert-base.json \
    "$data/hdf5_document_chunks_lower_case_1_seq_len_8192_random_seed_12345/books_wiki_en_corpus" \
    . None modern 1024 308 8192 2458 bert_configs/modernbert-base-8k.json 50e9 0.1667
}

# One process on a CPU: a tiny ModernBERT through both phases (128 then 512 tokens, the rotary base raised) on the
# quick start's shards, the modern way (30 % masking at load time, packed rows, StableAdamW, warmup-stable-decay).
cpu_modern() {
  local data="${BERT_PREP_WORKING_DIR:-data}"
  echo 64 2e-3 bf16 1 0.1 200 100 false true true 2 42 modernbert_cpu false false \
    16 1e-3 0.1 50 2 \
    "$data/hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/python_docs" \
    bert_configs/modernbert-tiny.json \
    "$data/hdf5_lower_case_1_seq_len_512_max_pred_80_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/python_docs" \
    . None modern 128 40 512 160 bert_configs/modernbert-tiny-512.json 4e5 0.5
}

_bert_shards() {  # LENGTH MASKED: NVIDIA's Wikipedia + books shards (data/create_datasets_from_start.sh)
  echo "${BERT_PREP_WORKING_DIR:-data}/hdf5_lower_case_1_seq_len_$1_max_pred_$2_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/books_wiki_en_corpus"
}

_modern_shards() {  # LENGTH: the document-chunk shards of the modern recipe
  echo "${BERT_PREP_WORKING_DIR:-data}/hdf5_document_chunks_lower_case_1_seq_len_$1_random_seed_12345/books_wiki_en_corpus"
}

# Encoders of a billion parameters, whose weights, gradients and optimizer moments (16 bytes a parameter: 20 GB
# for BERT-xlarge) leave too little of a GPU for activations under DDP: sharded with FSDP (argument 34), so that
# each GPU holds 1/8 or 1/64 of that state. The 64-GPU rows span 8 nodes of 8 (argument 35): run the same command
# on each node with NODE_RANK=0..7 and MASTER_ADDR (node 0) set. The batch arguments are per GPU, as always.
# BERT-xlarge (ALBERT paper's: 24 layers of 2,048, 1.28B parameters; bert_configs/xlarge.json) with NVIDIA's
# recipe: the LAMB paper's global batches (65,536 then 32,768 sequences) and rates, micro-batches of 64 at 128
# tokens and 16 at 512. Those rates were set for BERT-large: at this size they are a starting point, yours to tune.
bert_xlarge_8gpu_bf16_fsdp() {
  echo 8192 6e-3 bf16 8 0.2843 7038 200 false true true 128 42 bert_xlarge_bf16 true false 4096 4e-3 0.128 1563 256 \
    "$(_bert_shards 128 20)" bert_configs/xlarge.json "$(_bert_shards 512 80)" \
    . None bert 128 20 512 80 bert_configs/xlarge.json 0 0.125 fsdp 1
}

bert_xlarge_64gpu_bf16_fsdp() {
  echo 1024 6e-3 bf16 8 0.2843 7038 200 false true true 16 42 bert_xlarge_bf16 true false 512 4e-3 0.128 1563 32 \
    "$(_bert_shards 128 20)" bert_configs/xlarge.json "$(_bert_shards 512 80)" \
    . None bert 128 20 512 80 bert_configs/xlarge.json 0 0.125 fsdp 8
}

# The modern family at Ettin-1B's shape (28 layers of 1,792, 28 heads, GLU of 3,840; 1.0B parameters with the
# BERT vocab; bert_configs/modernbert-1b.json, its context extension modernbert-1b-8k.json) with ModernBERT's
# recipe as the base preset runs it (4,608 rows of 1,024 tokens a step, the batch warmed up from 768 rows, then
# 576 rows of 8,192), at ModernBERT-large's peak rate 5e-4 and 2e-4 for the extension (the base preset's ratio):
# micro-batches of 16 then 2 rows on 8 GPUs, 4 then 1 on 64.
modernbert_1b_8gpu_bf16_fsdp() {
  echo 576 5e-4 bf16 8 0.0018 360275 2000 false true true 36 42 modernbert_1b_bf16 true false 72 2e-4 0 63578 36 \
    "$(_modern_shards 1024)" bert_configs/modernbert-1b.json "$(_modern_shards 8192)" \
    . None modern 1024 308 8192 2458 bert_configs/modernbert-1b-8k.json 50e9 0.1667 fsdp 1
}

modernbert_1b_64gpu_bf16_fsdp() {
  echo 72 5e-4 bf16 8 0.0018 360275 2000 false true true 18 42 modernbert_1b_bf16 true false 9 2e-4 0 63578 9 \
    "$(_modern_shards 1024)" bert_configs/modernbert-1b.json "$(_modern_shards 8192)" \
    . None modern 1024 308 8192 2458 bert_configs/modernbert-1b-8k.json 50e9 0.1667 fsdp 8
}
