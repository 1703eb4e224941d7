"""The pure functions of benchmarks/time_to_accuracy.py: schedule sizing from a calibration, held-out accuracy
over fixed masked positions, reading a curve off a dllogger log, and the table's interpolations. No training."""
import math

import numpy as np
import pytest
import torch

from benchmarks import time_to_accuracy as tta


def test_planned_steps_fill_the_budget_at_the_calibrated_speed():
    assert tta.planned_steps(10, 2.0) == 300  # 600 s / 2 s
    assert tta.planned_steps(0.5, 7.0) == 4  # 30 s / 7 s, rounded down
    assert tta.planned_steps(0.01, 60.0) == 1  # never an empty schedule
    # run_pretraining.py reports sequences/s: 64 sequences at 32/s are 2 s a step
    assert tta.steps_from_throughput(10, 32.0, 64) == 300
    with pytest.raises(ValueError):
        tta.planned_steps(10, 0.0)
    with pytest.raises(ValueError):
        tta.steps_from_throughput(10, 0.0, 64)


def test_minutes_to_reach_interpolates_the_first_crossing():
    curve = [(0.5, 0.04), (1.0, 0.10), (1.5, 0.20), (2.0, 0.15), (2.5, 0.30)]
    assert tta.minutes_to_reach(curve, 0.15) == pytest.approx(1.25)  # halfway from 10 % to 20 %
    assert tta.minutes_to_reach(curve, 0.20) == pytest.approx(1.5)  # reached exactly at an evaluation
    assert tta.minutes_to_reach(curve, 0.02) == pytest.approx(0.25)  # from (0, 0) before the first evaluation
    assert tta.minutes_to_reach(curve, 0.25) == pytest.approx(2.0 + 0.5 * 0.10 / 0.15)  # after the dip
    assert tta.minutes_to_reach(curve, 0.31) is None
    assert tta.minutes_to_reach([], 0.1) is None


def test_value_at_the_budget_interpolates_or_takes_the_last_evaluation():
    curve = [(0.5, 0.10), (1.0, 0.20)]
    assert tta.value_at(curve, 0.75) == pytest.approx(0.15)
    assert tta.value_at(curve, 0.25) == pytest.approx(0.05)  # from (0, 0)
    assert tta.value_at(curve, 3.0) == pytest.approx(0.20)  # the run ended before the budget
    assert tta.value_at([], 1.0) is None


def reference_accuracy(logits, positions, ids):
    """Plain Python: a row's masked positions end at its first 0; count argmax hits at those positions."""
    correct = total = 0
    for row in range(len(positions)):
        for position, token in zip(positions[row], ids[row], strict=True):
            if position == 0:
                break
            scores = logits[row][position]
            correct += max(range(len(scores)), key=lambda v: scores[v]) == token
            total += 1
    return correct, total


def test_heldout_accuracy_matches_a_plain_python_reference():
    rng = np.random.default_rng(0)
    batch, seq, vocab = 3, 8, 11
    logits = rng.normal(size=(batch, seq, vocab)).astype(np.float32)
    # Row 0: three positions; row 1: one, then padding zeros and a stray non-zero after them (ignored, as the
    # recipe's make_batch ignores it); row 2: none.
    positions = np.array([[1, 4, 6, 0], [2, 0, 5, 0], [0, 0, 0, 0]])
    ids = np.array([[int(logits[0, 1].argmax()), 3, int(logits[0, 6].argmax()), 0], [7, 0, 9, 0], [0, 0, 0, 0]])
    inputs = np.zeros((batch, seq), dtype=np.int64)
    labels = tta.heldout_labels({"input_ids": inputs, "input_mask": inputs, "segment_ids": inputs,
                                 "masked_lm_positions": positions, "masked_lm_ids": ids})
    assert labels.shape == (batch, seq) and (labels >= 0).sum() == 4
    assert labels[1, 5] < 0
    where = torch.from_numpy(labels) >= 0
    counts = tta.accuracy_counts(torch.from_numpy(logits)[where], torch.from_numpy(labels)[where])
    assert counts == reference_accuracy(logits.tolist(), positions.tolist(), ids.tolist())
    assert counts[0] >= 2  # the two planted hits


def test_unigram_baseline_is_the_share_of_the_most_frequent_training_token():
    assert tta.unigram_baseline(np.array([5, 5, 7, 5, 9]), np.array([5, 7, 5, 1])) == pytest.approx(0.5)


def test_curve_from_log_takes_evaluation_records_and_a_later_closing_one():
    records = [
        {"step": "PARAMETER", "data": {"learning_rate": 0.01}},
        {"step": [0, 10], "data": {"average_loss": 7.0}},
        {"step": [0, 12], "data": {"eval_loss": 6.0, "eval_mlm_accuracy": 0.05, "train_minutes": 0.5}},
        {"step": [0, 25], "data": {"eval_loss": 5.0, "eval_mlm_accuracy": 0.11, "train_minutes": 1.0}},
        {"step": [], "data": {"eval_mlm_accuracy": 0.11, "train_minutes": 1.0, "training_sequences_per_second": 9}},
    ]
    assert tta.curve_from_log(records) == [(0.5, 0.05), (1.0, 0.11)]
    records[-1]["data"].update(eval_mlm_accuracy=0.12, train_minutes=1.1)
    assert tta.curve_from_log(records) == [(0.5, 0.05), (1.0, 0.11), (1.1, 0.12)]
    assert tta.last_step(records) == 25


def test_table_reports_not_reached_and_sst2_spread():
    results = {"peer": {"curve": [(0.5, 0.10), (1.0, 0.20)], "steps": 40, "sequences_per_second": 12.0},
               "nvidia": {"curve": [(0.5, 0.05), (1.0, 0.15)], "steps": 50, "sequences_per_second": 20.0,
                          "sst2": [0.80, 0.82, 0.84]},
               "best": {"curve": [(0.5, 0.15), (1.0, 0.30)], "steps": 60, "sequences_per_second": 30.0}}
    rows = {row["run"]: row for row in tta.table_rows(results, 1.0)}
    assert rows["nvidia"]["minutes_to_peer_final"] is None
    assert rows["best"]["minutes_to_peer_final"] == pytest.approx(0.5 + 0.5 * (0.05 / 0.15))
    assert rows["peer"]["minutes_to_peer_final"] == pytest.approx(1.0)
    assert rows["nvidia"]["sst2"][0] == pytest.approx(0.82)
    assert rows["nvidia"]["sst2"][1] == pytest.approx(0.02)
    text = tta.table_markdown(list(rows.values()), ["header"])
    assert "not reached" in text and "82.00% ± 2.00%" in text and "not run" in text
    assert math.isclose(tta.mean_std([0.5])[1], 0.0)


def test_each_ablation_undoes_one_choice_of_the_best_set_and_keeps_the_others():
    best = ["--no_nsp", "--dynamic_masking", "--masked_lm_prob", "0.3", "--max_predictions_per_seq", "40",
            "--pretrain_dropout", "0"]
    assert tta.ablated_options(best, "nsp") == best[1:]
    assert tta.ablated_options(best, "dropout") == best[:6]
    masking = tta.ablated_options(best, "masking")
    assert masking == ["--no_nsp", "--dynamic_masking", "--pretrain_dropout", "0", "--masked_lm_prob", "0.15",
                       "--max_predictions_per_seq", str(tta.PREDICTIONS)]
    assert tta.ablated_options(best, "schedule") == best
    assert tta.without_flag(["--a", "1", "--b", "--a", "2"], "--a") == ["--b"]  # every occurrence, value and all
    with pytest.raises(ValueError):
        tta.ablated_options(best, "warmup")


def test_ablation_runs_follow_the_main_runs_and_only_schedule_drops_the_time_budget():
    args = tta.parse_args(["--runs", "peer", "best", "--ablations", "schedule", "nsp"])
    runs = tta.our_runs(args)
    assert list(runs) == ["best", "best-schedule", "best-nsp"]  # the peer runs in-process, nvidia was not asked
    assert [runs[name][3] for name in runs] == [True, False, True]
    assert runs["best-schedule"][0] == tta.BEST_OPTIONS and "--no_nsp" not in runs["best-nsp"][0]
    assert tta.our_runs(tta.parse_args([]))["nvidia"] == ([], tta.NVIDIA_LR, tta.NVIDIA_WARMUP, False)


def test_dupe_factor_changes_the_training_shards_only_and_must_be_positive(tmp_path, capsys):
    assert tta.parse_args([]).dupe_factor == tta.DUPE_FACTOR
    with pytest.raises(SystemExit):
        tta.parse_args(["--dupe_factor", "0"])
    assert "--dupe_factor must be at least 1" in capsys.readouterr().err
    training, heldout = tta.shard_dir("training", 50), tta.shard_dir("test", tta.DUPE_FACTOR)
    assert "dupe_factor_50" in str(training) and f"dupe_factor_{tta.DUPE_FACTOR}" in str(heldout)
    corpus = tta.Corpus(tmp_path / "vocab.txt", tmp_path / "config.json", 100, training, heldout, 50)
    command = tta.our_command(tmp_path, corpus, "fp32", 1e-2, 0.1, 10, 0.5, [])
    assert command[command.index("--input_dir") + 1] == str(training)
    assert command[command.index("--eval_dir") + 1] == str(heldout)


def test_ablation_lines_give_each_leave_one_out_against_best_in_points():
    results = {"best": {"curve": [(1.0, 0.175)], "steps": 9, "sequences_per_second": 1.0},
               "best-nsp": {"curve": [(1.0, 0.16)], "steps": 9, "sequences_per_second": 1.0},
               "best-schedule": {"curve": [(1.0, 0.18)], "steps": 9, "sequences_per_second": 1.0}}
    rows = tta.table_rows(results, 1.0)
    lines = tta.ablation_lines(rows)
    assert lines[-2:] == [f"- {tta.ABLATIONS['nsp']}: -1.50", f"- {tta.ABLATIONS['schedule']}: +0.50"]
    assert tta.ablation_lines(rows[1:]) == []  # no best row to compare with
    assert tta.ABLATIONS["nsp"] in tta.table_markdown(rows, ["header"])


def reference_neighbour_guess(train_rows, mask_rows, specials, before, after):
    """Plain Python: count (left, right) -> centre and left -> centre over the training rows, then answer."""
    pair_counts, left_counts, totals = {}, {}, {}
    for row, mask in zip(train_rows, mask_rows, strict=True):
        for i in range(1, len(row) - 1):
            if mask[i + 1] != 1 or row[i] in specials:
                continue
            pair_counts.setdefault((row[i - 1], row[i + 1]), {}).setdefault(row[i], 0)
            pair_counts[(row[i - 1], row[i + 1])][row[i]] += 1
            left_counts.setdefault(row[i - 1], {}).setdefault(row[i], 0)
            left_counts[row[i - 1]][row[i]] += 1
            totals[row[i]] = totals.get(row[i], 0) + 1

    def best(counts):
        return min(counts, key=lambda token: (-counts[token], token))

    if (before, after) in pair_counts:
        return best(pair_counts[(before, after)])
    if before in left_counts:
        return best(left_counts[before])
    return best(totals)


def test_neighbour_baseline_equals_a_plain_python_count_model():
    rng = np.random.default_rng(3)
    specials = [0, 1, 2, 3]  # pad, [CLS], [SEP], [MASK]
    train = rng.integers(4, 12, size=(40, 10))  # few tokens, so pairs repeat and ties occur
    train[:, 0], train[:, -1] = 1, 2
    mask = np.ones_like(train)
    mask[::3, 7:] = 0  # some short rows, padded
    train[::3, 6], train[::3, 7:] = 2, 0
    heldout = rng.integers(3, 14, size=(12, 10))  # 12, 13 never in training: back-offs
    heldout[:, 0], heldout[:, -1] = 1, 2
    labels = np.full(heldout.shape, -1)
    for row in range(len(heldout)):
        for position in rng.choice(np.arange(1, 9), size=2, replace=False):
            labels[row, position] = rng.integers(4, 12)
    expected = [reference_neighbour_guess(train.tolist(), mask.tolist(), specials, heldout[r, p - 1], heldout[r, p + 1])
                == labels[r, p] for r, p in zip(*np.nonzero(labels >= 0), strict=True)]
    assert tta.neighbour_baseline(train, mask, heldout, labels, specials) == pytest.approx(np.mean(expected))


def test_neighbour_baseline_reads_the_context_and_backs_off():
    # training text "[CLS] a b c [SEP]" twice and "[CLS] a d c [SEP]" once: between a and c comes b
    train = np.array([[1, 4, 5, 6, 2], [1, 4, 5, 6, 2], [1, 4, 7, 6, 2]])
    mask = np.ones_like(train)
    heldout = np.array([[1, 4, 3, 6, 2],    # a [MASK] c -> b (the pair)
                        [1, 4, 3, 9, 2],    # a [MASK] x -> b (left a alone: b twice, d once)
                        [1, 9, 3, 9, 2]])   # x [MASK] x -> the most frequent centre token
    labels = np.full(heldout.shape, -1)
    labels[:, 2] = [5, 5, 4]  # each right only by its own rule: a and c are the most frequent centres (3 times
    # each) and the tie goes to the smaller id, a
    assert tta.neighbour_baseline(train, mask, heldout, labels, [0, 1, 2, 3]) == 1.0
    labels[:, 2] = [7, 7, 6]
    assert tta.neighbour_baseline(train, mask, heldout, labels, [0, 1, 2, 3]) == 0.0
    assert tta.most_frequent_by_key(np.array([1, 1, 1, 2, 2]), np.array([9, 8, 9, 3, 4])) == {1: 9, 2: 3}
