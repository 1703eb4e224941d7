"""--pack_sequences (bertrecipe/pretraining/packing.py): best fit against a plain-Python reference, packed
micro-batches of real shards give the loss of the same samples unpacked (both families), and run_pretraining trains
and resumes with it."""
import json
import random
import sys

import h5py
import numpy as np
import pytest
import torch

from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.model.modern import ModernBertForMaskedLM
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.pretraining.data import BertPretrainingCriterion, make_batch
from bertrecipe.pretraining.packing import best_fit_rows, pack_batch
from bertrecipe.training.metric_logger import read_log
from helpers import REPO_ROOT, TINY, run_command


def reference_best_fit(lengths, capacity):
    """Best-fit decreasing as the bin-packing literature states it, with explicit loads."""
    items = sorted(enumerate(lengths), key=lambda item: (-item[1], item[0]))
    bins = []  # [load, [indexes]]
    for index, size in items:
        best = None
        for candidate in bins:
            if candidate[0] + size <= capacity and (best is None or candidate[0] > best[0]):
                best = candidate
        if best is None:
            bins.append([size, [index]])
        else:
            best[0] += size
            best[1].append(index)
    return [b[1] for b in bins]


@pytest.mark.parametrize("seed", range(20))
def test_best_fit_equals_the_reference_and_places_every_sample_once(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 64) for _ in range(rng.randint(1, 40))]
    rows = best_fit_rows(lengths, 64)
    assert rows == reference_best_fit(lengths, 64)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)


def shard_batch(corpus, size=32):
    with h5py.File(corpus / "p1" / "books_training_1.hdf5") as f:
        rows = {k: f[k][()] for k in f}
    return make_batch(rows, np.arange(size))


def test_packing_real_samples_keeps_every_token_label_and_sample(corpus):
    batch = shard_batch(corpus)
    packed = pack_batch(batch)
    assert len(packed["input_ids"]) < len(batch["input_ids"])  # the shards' short samples share rows
    lengths = batch["input_mask"].sum(1)
    assert packed["input_mask"].sum() == lengths.sum()
    assert (packed["document_ids"] > 0).sum() == lengths.sum()
    assert sorted(packed["input_ids"][packed["input_mask"] == 1].tolist()) == \
        sorted(batch["input_ids"][batch["input_mask"] == 1].tolist())
    assert sorted(packed["masked_lm_labels"][packed["masked_lm_labels"] >= 0].tolist()) == \
        sorted(batch["masked_lm_labels"][batch["masked_lm_labels"] >= 0].tolist())
    assert "next_sentence_labels" not in packed


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_a_packed_micro_batch_has_the_loss_of_its_samples_unpacked(corpus, family):
    torch.manual_seed(0)
    if family == "bert":
        model = BertForPreTraining(BertConfig(**{**TINY, "hidden_dropout_prob": 0.0,
                                                 "attention_probs_dropout_prob": 0.0}))
    else:
        model = ModernBertForMaskedLM(ModernBertConfig(
            vocab_size=TINY["vocab_size"], hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=96, max_position_embeddings=128, local_attention=16, pad_token_id=0))
    model.eval()
    batch = shard_batch(corpus)
    criterion = BertPretrainingCriterion(nsp=False)
    as_tensors = lambda b: {k: torch.from_numpy(v) for k, v in b.items()}  # noqa: E731
    with torch.no_grad():
        unpacked = criterion(model, as_tensors(batch))
        packed = criterion(model, as_tensors(pack_batch(batch)))
    assert packed.item() == pytest.approx(unpacked.item(), rel=1e-5)


def pretrain(corpus, config, out, *extra, check=True):
    args = ["--input_dir", str(corpus / "p1"), "--config_file", str(config), "--output_dir", str(out),
            "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--learning_rate", "2e-2",
            "--warmup_proportion", "0.1", "--disable_progress_bar", "--json-summary", str(out / "log.json"),
            "--do_train", *map(str, extra)]
    result = run_command([sys.executable, str(REPO_ROOT / "run_pretraining.py"), *args])
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_run_pretraining_packs_learns_and_resumes_bit_for_bit(corpus, tmp_path):
    config = tmp_path / "modern.json"
    config.write_text(json.dumps({"model_type": "modernbert", "vocab_size": TINY["vocab_size"], "hidden_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
                                  "max_position_embeddings": 128, "local_attention": 16, "pad_token_id": 0,
                                  "mlp_dropout": 0.1}))
    common = ["--train_batch_size", 16, "--max_steps", 8, "--num_steps_per_checkpoint", 4, "--pack_sequences",
              "--dynamic_masking"]
    pretrain(corpus, config, tmp_path / "straight", *common)
    pretrain(corpus, config, tmp_path / "split", *common, "--steps_this_run", 3)
    pretrain(corpus, config, tmp_path / "split", *common, "--resume_from_checkpoint")
    losses = [{r["step"][1]: r["data"]["step_loss"] for r in read_log(out / "log.json")
               if r["type"] == "LOG" and isinstance(r["step"], list) and r["step"]}
              for out in (tmp_path / "straight", tmp_path / "split")]
    assert all(losses[0][step] == losses[1][step] for step in range(4, 9))
    assert all(np.isfinite(loss) for loss in losses[0].values())


def test_packing_a_bert_run_with_nsp_is_refused_in_one_line(corpus, tmp_path):
    result = pretrain(corpus, corpus / "bert_config.json", tmp_path / "out", "--max_steps", 2, "--pack_sequences",
                      check=False)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "--no_nsp" in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
