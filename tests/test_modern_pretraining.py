"""run_pretraining.py with a ModernBERT config.json on today's NVIDIA-style shards (segment ids and NSP labels
unused): it learns, resumes bit for bit, starts from a folder transformers saved, and its checkpoint converts to a
folder transformers loads with the same masked-LM loss (transformers as the oracle)."""
import json
import math
import subprocess
import sys

import pytest
import torch
import transformers

from bertrecipe.training.metric_logger import read_log
from helpers import ENV, REPO_ROOT, TINY, masked_lm_loss_over_shard, run_command

MODERN = {"model_type": "modernbert", "vocab_size": TINY["vocab_size"], "hidden_size": 64, "num_hidden_layers": 3,
          "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 128,
          "local_attention": 16, "pad_token_id": 0, "global_attn_every_n_layers": 2}


@pytest.fixture(scope="module")
def modern_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("modern") / "modern_config.json"
    path.write_text(json.dumps(MODERN))
    return path


def pretrain(corpus, config, out, *extra, check=True):
    args = ["--input_dir", str(corpus / "p1"), "--config_file", str(config), "--output_dir", str(out),
            "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--learning_rate", "2e-2",
            "--warmup_proportion", "0.1", "--disable_progress_bar", "--json-summary", str(out / "log.json"),
            *map(str, extra)]
    result = run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *args])
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def step_losses(path):
    return {r["step"][1]: r["data"]["step_loss"] for r in read_log(path)
            if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"] and "step_loss" in r["data"]}


def final_record(path):
    return next(r["data"] for r in read_log(path) if r["type"] == "LOG" and r["step"] == [])


@pytest.mark.slow
def test_the_modern_family_learns_on_nvidia_shards_with_dynamic_masking_at_30_percent(corpus, modern_config,
                                                                                      tmp_path):
    pretrain(corpus, modern_config, tmp_path, "--do_train", "--train_batch_size", 16, "--max_steps", 40,
             "--log_freq", 5, "--dynamic_masking", "--masked_lm_prob", 0.3)
    losses = step_losses(tmp_path / "log.json")
    assert losses[40] < losses[5] - 1.0
    saved = torch.load(tmp_path / "ckpt_40.pt", weights_only=True)
    assert saved["config"]["model_type"] == "modernbert"
    assert not any(name.startswith(("bert.", "cls.")) for name in saved["model"])  # no BERT heads, no NSP


@pytest.mark.slow
def test_a_modern_run_resumes_bit_for_bit(corpus, modern_config, tmp_path):
    """With dropout in every place the family has it and dynamic masks at 30 %: both drawn anew each step."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**MODERN, "attention_dropout": 0.1, "mlp_dropout": 0.1, "embedding_dropout": 0.1}))
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--do_train", "--train_batch_size", 8, "--gradient_accumulation_steps", 2, "--max_steps", 8,
              "--num_steps_per_checkpoint", 4, "--dynamic_masking", "--masked_lm_prob", 0.3]
    pretrain(corpus, config, straight, *common)
    pretrain(corpus, config, split, *common, "--steps_this_run", 3)
    pretrain(corpus, config, split, *common, "--resume_from_checkpoint")
    a, b = step_losses(straight / "log.json"), step_losses(split / "log.json")
    assert all(a[step] == b[step] for step in range(4, 9))
    whole = torch.load(straight / "ckpt_8.pt", weights_only=True)["model"]
    resumed = torch.load(split / "ckpt_8.pt", weights_only=True)["model"]
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)


def transformers_masked_lm_loss(folder, shard):
    """The masked-LM loss over the shard's static masks, computed by transformers' ModernBertForMaskedLM."""
    model = transformers.ModernBertForMaskedLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    return masked_lm_loss_over_shard(
        lambda ids, _segments, mask: model(input_ids=ids, attention_mask=mask).logits[0], shard)


@pytest.mark.slow
def test_a_modern_checkpoint_converts_for_transformers_and_a_transformers_folder_starts_a_run(corpus, modern_config,
                                                                                              tmp_path):
    pretrain(corpus, modern_config, tmp_path / "run", "--do_train", "--train_batch_size", 8, "--max_steps", 3)
    converted = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "convert_checkpoint.py"),
                                str(tmp_path / "run" / "ckpt_3.pt"), str(tmp_path / "hf")],
                               env=ENV, capture_output=True, text=True)
    assert converted.returncode == 0, converted.stderr
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["ModernBertForMaskedLM"]
    shard = corpus / "eval" / "books_test_0.hdf5"
    expected = transformers_masked_lm_loss(tmp_path / "hf", shard)
    # The folder transformers reads is a starting point for our run: its held-out loss is transformers' loss.
    pretrain(corpus, tmp_path / "hf" / "config.json", tmp_path / "eval", "--do_eval", "--eval_dir",
             corpus / "eval", "--init_checkpoint", tmp_path / "hf")
    assert final_record(tmp_path / "eval" / "log.json")["eval_loss"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["--fp16", "--bf16"])
def test_the_modern_family_trains_in_fp16_with_its_loss_scale_and_in_bf16(corpus, modern_config, tmp_path,
                                                                          precision):
    """fp16 from NVIDIA's initial scale 2**20: the first steps overflow and are skipped with the scale halved, as
    for BERT; then it trains. bf16 needs no scale."""
    extra = ["--init_loss_scale", 2.0**20] if precision == "--fp16" else []
    pretrain(corpus, modern_config, tmp_path, "--do_train", "--train_batch_size", 8, "--max_steps", 12,
             "--dynamic_masking", "--optimizer", "adamw", "--learning_rate", 1e-3, precision, *extra)
    records = [r["data"] for r in read_log(tmp_path / "log.json")
               if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"] and "step_loss" in r["data"]]
    assert all(math.isfinite(r["step_loss"]) for r in records)
    saved = torch.load(tmp_path / "ckpt_12.pt", weights_only=True)
    if precision == "--fp16":
        assert records[-1]["skipped_steps"] >= 1
        assert saved["scaler"]["scale"] == 2.0**20 * 0.5 ** records[-1]["skipped_steps"]
    assert records[-1]["skipped_steps"] < 12
    assert all(torch.isfinite(t).all() for t in saved["model"].values())
