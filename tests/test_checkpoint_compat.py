"""A checkpoint written before the library moved into bertrecipe/ (tests/data/checkpoint-fdd596d) still loads:
for --resume_from_checkpoint (the run goes on as it did), --init_checkpoint and scripts/convert_checkpoint.py
(checked against transformers)."""
import json
import shutil
import subprocess
import sys

import pytest
import transformers

from helpers import ENV, REPO_ROOT, TEST_DATA, masked_lm_loss_over_shard, run_command

OLD = TEST_DATA / "checkpoint-fdd596d"
FLAGS = ["--config_file", str(OLD / "bert_config.json"), "--max_seq_length", "64", "--max_predictions_per_seq",
         "10", "--train_batch_size", "4", "--learning_rate", "1e-2", "--warmup_proportion", "0.1", "--max_steps", "4",
         "--num_steps_per_checkpoint", "2", "--disable_progress_bar"]


def records(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line.removeprefix("DLLL ")) for line in lines if line.startswith("DLLL ")]


def step_losses(path):
    return {r["step"][1]: r["data"]["step_loss"] for r in records(path)
            if isinstance(r.get("step"), list) and r["step"]}


def run_pretraining(*args):
    result = run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *map(str, args)])
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_resume_from_the_old_checkpoint_repeats_the_old_run(tmp_path):
    (tmp_path / "shards").mkdir()
    shutil.copy(OLD / "books_training_0.hdf5", tmp_path / "shards")
    (tmp_path / "out").mkdir()
    shutil.copy(OLD / "ckpt_2.pt", tmp_path / "out")
    run_pretraining("--input_dir", tmp_path / "shards", "--output_dir", tmp_path / "out", *FLAGS, "--do_train",
                    "--resume_from_checkpoint", "--json-summary", tmp_path / "log.json")
    resumed, original = step_losses(tmp_path / "log.json"), step_losses(OLD / "log-steps-1-4.json")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == pytest.approx(original[step], abs=1e-5)
    assert (tmp_path / "out" / "ckpt_4.pt").is_file()


def transformers_masked_lm_loss(hf_folder, shard):
    """Masked-LM loss of the converted model over the shard, computed by transformers sample by sample."""
    model = transformers.BertForPreTraining.from_pretrained(hf_folder).eval()
    return masked_lm_loss_over_shard(
        lambda ids, segments, mask: model(input_ids=ids, token_type_ids=segments,
                                          attention_mask=mask).prediction_logits[0], shard)


@pytest.mark.slow
def test_init_checkpoint_and_convert_checkpoint_read_the_old_checkpoint_alike(tmp_path):
    convert = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "convert_checkpoint.py"),
                              str(OLD / "ckpt_2.pt"), str(tmp_path / "hf")], env=ENV, capture_output=True, text=True)
    assert convert.returncode == 0, convert.stderr
    expected = transformers_masked_lm_loss(tmp_path / "hf", OLD / "books_training_0.hdf5")
    run_pretraining("--input_dir", OLD, "--eval_dir", OLD, "--output_dir", tmp_path / "eval", *FLAGS, "--do_eval",
                    "--init_checkpoint", OLD / "ckpt_2.pt", "--json-summary", tmp_path / "eval.json")
    final = next(r["data"] for r in records(tmp_path / "eval.json") if r.get("step") == [])
    assert final["eval_loss"] == pytest.approx(expected, rel=1e-4)
