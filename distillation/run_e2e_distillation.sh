#!/usr/bin/env bash
# NVIDIA's distillation chain for SST-2 (distillation/run_e2e_distillation.sh there): a teacher fine-tuned on SST-2,
# data augmentation with a masked LM, then task distillation into a smaller student, its backbone stage and its
# heads stage, each an ordinary command of this repository; OUT/summary.json holds the teacher's and the student's
# SST-2 dev accuracy, the checkpoints' paths, the sizes used and each stage's seconds.
#
#   bash distillation/run_e2e_distillation.sh cpu OUT
#
# cpu: the chain on this machine's CPU in about 5 minutes on 2 cores, from the real data in $BERT_SHARED_DATA
# (default ../shared/data beside the checkout): the released MiniLM (6 layers, hidden 384) is the teacher and,
# with a masked-LM head trained here for E2E_MLM_STEPS steps on a public-domain book (the released folder has
# none), the augmentation's masked LM; the student is 3 of the teacher's layers. It uses the first E2E_TRAIN_ROWS
# rows of SST-2's training set (recorded in the summary) and scores the whole dev set. GloVe is not used: the masked
# LM proposes every word's candidates (docs/distillation.md). Sizes: E2E_TRAIN_ROWS (2000), E2E_AUG_N (4 copies a
# sentence), E2E_MLM_STEPS (100), E2E_STUDENT_LAYERS (3), E2E_SEQ (64); a second call reuses the stages it finds
# complete, as the commands do.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: bash distillation/run_e2e_distillation.sh cpu OUT"
mode=${1:-}
out=${2:-}
if [ "$mode" != cpu ] || [ -z "$out" ] || [ $# -ne 2 ]; then
  echo "error: run_e2e_distillation.sh: $usage" >&2
  exit 2
fi
shared=${BERT_SHARED_DATA:-$(cd .. && pwd)/shared/data}
for needed in minilm/model.safetensors minilm/vocab.txt glue/SST-2/train.tsv glue/SST-2/dev.tsv books/pg1661.txt; do
  if [ ! -f "$shared/$needed" ]; then
    echo "error: $shared/$needed: not found; point BERT_SHARED_DATA to the shared data folder (see its README)" >&2
    exit 2
  fi
done
rows=${E2E_TRAIN_ROWS:-2000}
copies=${E2E_AUG_N:-4}
mlm_steps=${E2E_MLM_STEPS:-100}
layers=${E2E_STUDENT_LAYERS:-3}
seq=${E2E_SEQ:-64}
for value in "$rows" "$copies" "$mlm_steps" "$layers" "$seq"; do
  if ! [[ $value =~ ^[1-9][0-9]*$ ]]; then
    echo "error: run_e2e_distillation.sh: the E2E_* sizes are whole numbers >= 1, got '$value'" >&2
    exit 2
  fi
done

python=${PYTHON:-python3}
minilm=$shared/minilm
vocab=$minilm/vocab.txt
mkdir -p "$out/data/SST-2" "$out/times"
out=$(cd "$out" && pwd)
data=$out/data

# Each stage's seconds, for the summary.
timed() {
  local name=$1
  shift
  local start=$SECONDS
  "$@"
  echo $((SECONDS - start)) > "$out/times/$name"
}

sst2_part() {
  head -n "$((rows + 1))" "$shared/glue/SST-2/train.tsv" > "$data/SST-2/train.tsv.part"
  mv "$data/SST-2/train.tsv.part" "$data/SST-2/train.tsv"
  # Copied by content, not by cp: the shared files may be read-only and a second run replaces them.
  cat "$shared/glue/SST-2/dev.tsv" > "$data/SST-2/dev.tsv.part"
  mv "$data/SST-2/dev.tsv.part" "$data/SST-2/dev.tsv"
}

teacher() {
  "$python" run_glue.py --task_name SST-2 --data_dir "$data/SST-2" --init_checkpoint "$minilm" \
    --vocab_file "$vocab" --do_lower_case --output_dir "$out/teacher" --do_train --do_eval \
    --max_seq_length "$seq" --train_batch_size 32 --learning_rate 1e-4 --num_train_epochs 2 \
    --eval_batch_size 64 --disable_progress_bar --log_freq 20
}

masked_lm() {
  # The released MiniLM has no masked-LM head: a short continued pre-training on a book trains one (the encoder
  # moves little), for the augmentation alone.
  "$python" data/create_pretraining_data.py --input_file "$shared/books/pg1661.txt" \
    --output_file "$data/mlm/books_training_0.hdf5" --vocab_file "$vocab" --do_lower_case \
    --max_seq_length "$seq" --max_predictions_per_seq 10 --dupe_factor 1
  "$python" run_pretraining.py --input_dir "$data/mlm" --init_checkpoint "$minilm" \
    --config_file "$minilm/config.json" --output_dir "$out/masked_lm" --max_seq_length "$seq" \
    --max_predictions_per_seq 10 --train_batch_size 32 --learning_rate 5e-4 --warmup_proportion 0.1 \
    --optimizer adamw --max_steps "$mlm_steps" --num_steps_per_checkpoint "$mlm_steps" --no_nsp --do_train \
    --disable_progress_bar --log_freq 20
}

augment() {
  "$python" distillation/data_augmentation.py --pretrained_bert_model "$out/masked_lm/ckpt_$mlm_steps.pt" \
    --vocab_file "$vocab" --do_lower_case --glue_dir "$data" --task_name SST-2 --N "$copies" --seed 1 \
    --no_original_segment
}

student_config() {
  "$python" - "$minilm/config.json" "$out/student_config/config.json" "$layers" << 'EOF'
import json, pathlib, sys
config = json.loads(pathlib.Path(sys.argv[1]).read_text())
config["num_hidden_layers"] = int(sys.argv[3])
pathlib.Path(sys.argv[2]).parent.mkdir(parents=True, exist_ok=True)
pathlib.Path(sys.argv[2]).write_text(json.dumps(config, indent=2) + "\n")
EOF
}

distil() {  # stage, student, output folder, epochs, learning rate
  "$python" distillation/task_distill.py --teacher_model "$out/teacher" --student_model "$2" \
    --student_init teacher --vocab_file "$vocab" --do_lower_case --data_dir "$data/SST-2" --task_name SST-2 \
    --output_dir "$3" --distill_config "distillation/distillation_config_$1.json" --aug_train \
    --max_seq_length "$seq" --train_batch_size 32 --num_train_epochs "$4" --learning_rate "$5" \
    --eval_batch_size 64 --disable_progress_bar --log_freq 20
}

summary() {
  "$python" - "$out" "$rows" "$copies" "$mlm_steps" "$layers" "$seq" << 'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows, copies, mlm_steps, layers, seq = map(int, sys.argv[2:])
teacher = json.loads((out / "teacher" / "results.json").read_text())
student = json.loads((out / "student" / "results.json").read_text())
times = {path.name: int(path.read_text()) for path in sorted((out / "times").iterdir())}
summary = {
    "task": "SST-2", "teacher_dev_accuracy": teacher["eval_acc"], "student_dev_accuracy": student["eval_acc"],
    "student_share_of_teacher": student["eval_acc"] / teacher["eval_acc"],
    "teacher_checkpoint": str(out / "teacher" / "pytorch_model.bin"),
    "student_checkpoint": str(out / "student" / "pytorch_model.bin"),
    "sst2_train_rows_used": rows, "augmented_train_examples": student["train_examples"],
    "augmentation_copies_per_sentence": copies, "masked_lm_steps": mlm_steps, "student_layers": layers,
    "teacher_layers": 6, "max_seq_length": seq, "dev_examples": teacher["eval_examples"],
    "seconds_per_stage": times, "total_seconds": sum(times.values())}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
}

timed data sst2_part
[ -f "$out/teacher/results.json" ] || timed teacher teacher
[ -f "$out/masked_lm/ckpt_$mlm_steps.pt" ] || timed masked_lm masked_lm
timed augmentation augment
student_config
[ -f "$out/student_backbone/results.json" ] || timed backbone distil backbone "$out/student_config" \
  "$out/student_backbone" 1 1e-4
[ -f "$out/student/results.json" ] || timed heads distil heads "$out/student_backbone" "$out/student" 1 5e-5
summary
