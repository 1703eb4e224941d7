"""Issue "judge a checkpoint", item 5: the model FLOPs the logs' `mfu` is computed from. The oracle is torch's own
FLOP counter (torch.utils.flop_counter) on a training step of both families, on batches where every token does
useful work (full rows, windows wider than the rows), and a brute-force count of the pairs a sliding window sees."""
import sys

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bertrecipe.model.bert import BertConfig
from bertrecipe.model.families import config_from_json_file, pretraining_model
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.training import model_flops
from bertrecipe.training.metric_logger import read_log
from helpers import REPO_ROOT, pretrain, run_command, tiny_args, tiny_model_files, tiny_sst2


def counted_training_flops(model, batch) -> int:
    with FlopCounterMode(display=False) as counter:
        output = model(**batch)
        output.loss.backward()
    return counter.get_total_flops()


def full_batch(vocab: int, rows: int, length: int, predicted: int, nsp: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (rows, length), generator=generator)
    labels = torch.full((rows, length), -1)
    for row in range(rows):
        where = torch.randperm(length - 2, generator=generator)[:predicted] + 1
        labels[row, where] = ids[row, where]
    batch = {"input_ids": ids, "attention_mask": torch.ones(rows, length, dtype=torch.long),
             "masked_lm_labels": labels}
    if nsp:
        batch |= {"token_type_ids": torch.zeros(rows, length, dtype=torch.long),
                  "next_sentence_labels": torch.zeros(rows, dtype=torch.long)}
    return batch


def ours(config, batch) -> float:
    shape = model_flops.batch_shape({"input_mask": batch["attention_mask"],
                                     "masked_lm_labels": batch["masked_lm_labels"]})
    return model_flops.training_flops(config, shape)


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_a_training_step_has_the_flops_torch_counts(family):
    torch.manual_seed(0)
    if family == "bert":
        config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    else:  # windows wider than the rows: every pair a local layer computes is one it needs
        config = ModernBertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=64, local_attention=64,
                                  pad_token_id=0)
    model = pretraining_model(config)
    batch = full_batch(config.vocab_size, rows=3, length=32, predicted=5, nsp=family == "bert")
    counted = counted_training_flops(model, batch)
    assert counted > 0
    assert ours(config, batch) == pytest.approx(counted, rel=0.01)


def test_the_window_pairs_are_those_a_brute_force_count_finds():
    for length in (1, 2, 5, 17, 64, 130):
        for half in (None, 0, 1, 8, 64, 200):
            positions = np.arange(length)
            seen = np.abs(positions[:, None] - positions[None, :]) <= (length if half is None else half)
            assert model_flops.windowed_pairs(np.array([length]), half)[0] == seen.sum(), (length, half)


def test_padding_and_packing_count_only_the_real_tokens_of_each_document():
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    documents = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 2, 2]])
    shape = model_flops.batch_shape({"input_mask": mask, "document_ids": documents,
                                     "masked_lm_labels": torch.tensor([[5, -1, -1, -1, -1, -1], [-1] * 6])})
    assert sorted(shape.spans.tolist()) == [1, 2, 2, 2, 3] and shape.tokens == 10 and shape.predicted == 1
    unpacked = model_flops.batch_shape({"input_mask": mask})
    assert unpacked.spans.tolist() == [4, 6] and unpacked.predicted == 0


def test_the_peak_is_the_flag_a_known_gpu_or_a_measured_cpu_gemm():
    assert model_flops.device_peak_tflops(torch.device("cpu"), torch.float32, given=12.5) == 12.5
    measured = model_flops.device_peak_tflops(torch.device("cpu"), torch.float32)
    assert 1e-4 < measured < 100  # a CPU core or two: a few tens to hundreds of GFLOP/s
    names = dict(model_flops.PEAK_TFLOPS)
    assert names["H100 PCIe"] < names["H100"] and names["A100"] == 312.0


def step_records(log):
    return [r["data"] for r in read_log(log) if r.get("type") == "LOG" and isinstance(r.get("step"), list)
            and r["step"] and "average_loss" in r["data"]]


def test_pretraining_records_carry_tokens_per_second_mfu_and_the_input_wait(corpus, tmp_path):
    """Every record: real tokens per second over the same interval as the sequences per second, the input wait as
    a share of it, and mfu against --peak_tflops; two runs on the same rows with peaks 1 and 2 log the same FLOPs per
    token (mfu x peak / tokens_per_second), which lies between the formula's on the shortest and longest rows."""
    runs = {}
    for peak in (1.0, 2.0):
        out = tmp_path / f"peak{peak}"
        pretrain(corpus, out, "--train_batch_size", 8, "--max_steps", 4, "--peak_tflops", peak, "--seed", 3)
        runs[peak] = step_records(out / "log.json")
    per_token = {}
    for peak, records in runs.items():
        assert len(records) == 4
        tokens = [0] + [r["tokens"] for r in records]
        for index, record in enumerate(records):
            assert 0.0 <= record["input_wait_share"] <= 1.0 and record["mfu"] > 0
            per_sequence = record["tokens_per_second"] / record["training_sequences_per_second"]
            assert per_sequence == pytest.approx((tokens[index + 1] - tokens[index]) / 8, rel=1e-6)
        per_token[peak] = [r["mfu"] * peak * 1e12 / r["tokens_per_second"] for r in records]
    assert per_token[1.0] == pytest.approx(per_token[2.0], rel=1e-6)
    config = config_from_json_file(corpus / "bert_config.json")

    def flops_per_token(length):
        spans = np.full(8, length)
        return model_flops.training_flops(config, model_flops.BatchShape(spans, 8, 10 * 8)) / spans.sum()
    assert all(flops_per_token(64) * 0.5 < value < flops_per_token(8) * 1.5 for value in per_token[1.0])


def test_peak_tflops_that_is_no_positive_number_is_one_line(corpus, tmp_path):
    done = pretrain(corpus, tmp_path / "out", "--max_steps", 1, "--peak_tflops", 0, check=False)
    assert done.returncode == 2 and "--peak_tflops must be a number > 0, got 0" in done.stderr
    assert not (tmp_path / "out").exists()


def test_fine_tuning_records_carry_them_too(tmp_path):
    """run_glue.py's records: tokens per second (real tokens, so at most max_seq_length a sequence), the input wait
    share, and mfu against --peak_tflops, whose FLOPs per token do not depend on the peak."""
    tiny_model_files(tmp_path / "model")
    tiny_sst2(tmp_path / "SST-2", train_rows=16)
    per_token = {}
    for peak in (1.0, 4.0):
        log = tmp_path / f"log{peak}.json"
        done = run_command([sys.executable, str(REPO_ROOT / "run_glue.py"), *tiny_args(tmp_path, "--do_train",
                            "--log_freq", "1", "--peak_tflops", str(peak), "--seed", "5"), "--json-summary", str(log)])
        assert done.returncode == 0, done.stderr[-2000:]
        records = [r["data"] for r in read_log(log) if r.get("type") == "LOG" and "step_loss" in r.get("data", {})]
        assert len(records) == 2
        for record in records:
            assert 0.0 <= record["input_wait_share"] <= 1.0 and record["mfu"] > 0
            assert 3 <= record["tokens_per_second"] / record["training_sequences_per_second"] <= 16
        per_token[peak] = [r["mfu"] * peak * 1e12 / r["tokens_per_second"] for r in records]
    assert per_token[1.0] == pytest.approx(per_token[4.0], rel=1e-6)
