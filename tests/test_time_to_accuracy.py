"""benchmarks/time_to_accuracy.py: its pure functions (schedule sizing from a calibration, held-out accuracy over
fixed masked positions, reading a curve off a dllogger log, the table's interpolations, the modern model's parameter
matching, the tuned peers' options and lr sweep, the comparison lines) without training, and one smoke run of the
modern family's two runs with budgets of about a second."""
import dataclasses
import json
import math
import statistics
import types
from pathlib import Path

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


def test_the_budget_run_is_sized_at_the_speed_the_sweep_measured():
    runs = [{"seconds_per_step": 0.5}, {"seconds_per_step": 0.8}, {"seconds_per_step": 0.64}]
    assert tta.measured_seconds_per_step(runs, calibrated=0.1) == 0.64  # the median
    assert tta.measured_seconds_per_step([], calibrated=0.1) == 0.1  # no sweep: the calibration's


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
    assert tta.ablated_options(best, "mask_schedule") == [*best, "--masked_lm_prob_schedule", "linear",
                                                          "--masked_lm_prob_end", "0.15"]
    assert tta.without_flag(["--a", "1", "--b", "--a", "2"], "--a") == ["--b"]  # every occurrence, value and all
    with pytest.raises(ValueError):
        tta.ablated_options(best, "warmup")


def test_ablation_runs_follow_the_main_runs_and_only_the_step_schedules_drop_the_time_budget():
    args = tta.parse_args(["--runs", "peer", "best", "--ablations", "schedule", "nsp", "mask_schedule"])
    runs = tta.our_runs(args)
    assert list(runs) == ["best", "best-schedule", "best-nsp", "best-mask_schedule"]  # nvidia was not asked
    assert [runs[name][3] for name in runs] == [True, False, True, False]
    assert runs["best-schedule"][0] == tta.BEST_OPTIONS and "--no_nsp" not in runs["best-nsp"][0]
    assert tta.our_runs(tta.parse_args([]))["nvidia"] == ([], tta.NVIDIA_LR, tta.NVIDIA_WARMUP, False, "bert")


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
    results["best-mask_schedule"] = {"curve": [(1.0, 0.19)], "steps": 9, "sequences_per_second": 1.0}
    lines = tta.ablation_lines(tta.table_rows(results, 1.0))
    assert lines[-1] == f"- {tta.ABLATIONS['mask_schedule']}: +1.00 (against best-schedule)"
    without_best = {name: run for name, run in results.items() if name != "best"}
    lines = tta.ablation_lines(tta.table_rows(without_best, 1.0))  # the schedule pair alone still compares
    assert lines[2:] == [f"- {tta.ABLATIONS['mask_schedule']}: +1.00 (against best-schedule)"]
    without_best["best-schedule"]["curve"] = [(0.5, 0.12), (1.0, 0.18)]
    without_best["best-mask_schedule"]["curve"] = [(0.5, 0.14), (1.0, 0.19)]
    assert ("- ours (best-mask_schedule) reached best-schedule's final accuracy (18.00%) in 0.90 minutes (budget 1)"
            in tta.comparison_lines(without_best, 1.0))
    assert tta.parse_args(["--runs", "--ablations", "schedule"]).runs == []
    assert tta.baseline_steps("best-mask_schedule", {"best-schedule": {"steps": 1379}}) == 1379  # one length
    assert tta.baseline_steps("best-mask_schedule", {}) is None  # no baseline ran: it calibrates its own
    assert tta.baseline_steps("best-nsp", {"best": {"steps": 9}}) is None  # compared with best, not its steps
    with pytest.raises(SystemExit):
        tta.parse_args(["--runs"])


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


# ------------------------------------------------------------------------------------ the tuned and modern runs

def test_the_modern_model_matches_the_bert_model_in_parameters():
    for vocab in (1000, 7869):  # a small vocab, and the embedded corpus's
        bert = tta.parameter_count(tta.config_from_dict(tta.bert_values(vocab)))
        values = tta.modern_config_values(vocab)
        assert values["vocab_size"] % tta.VOCAB_MULTIPLE == 0 and 0 <= values["vocab_size"] - vocab < 64
        layers = values["num_hidden_layers"]
        counts = {n: tta.parameter_count(tta.config_from_dict(tta.modern_values(vocab, n)))
                  for n in (layers - 1, layers, layers + 1)}
        assert abs(counts[layers] / bert - 1) <= tta.PARAMETER_TOLERANCE
        assert abs(counts[layers] - bert) <= min(abs(counts[layers - 1] - bert), abs(counts[layers + 1] - bert))
        assert values["hidden_size"] == tta.MODEL["hidden_size"]
    assert layers == 6  # at the corpus's vocab: 5.43 M parameters against BERT's 5.45 M
    assert tta.round_up(7869, 64) == 7872 and tta.round_up(7872, 64) == 7872


def test_transformers_modern_model_has_our_modern_models_parameters():
    import transformers

    values = tta.modern_config_values(1000)
    tokenizer = types.SimpleNamespace(pad_token_id=0, cls_token_id=2, sep_token_id=3)
    with torch.device("meta"):  # shapes only: modern_peer_model builds this on the run's device
        theirs = transformers.ModernBertForMaskedLM(tta.modern_peer_config(values, tokenizer))
    assert theirs.config.sparse_prediction and theirs.config._attn_implementation == "sdpa"
    assert theirs.config.layer_types == tta.config_from_dict(values).layer_types
    assert sum(p.numel() for p in theirs.parameters()) == tta.parameter_count(tta.config_from_dict(values))
    assert {theirs.config.attention_dropout, theirs.config.mlp_dropout, theirs.config.embedding_dropout} == {0.0}


def test_the_sweep_picks_the_lr_with_the_best_final_heldout_accuracy():
    curves = {1e-4: [(0.5, 0.08), (1.0, 0.10)],
              5e-4: [(0.5, 0.14), (1.0, 0.12)],  # best midway, but the final evaluation counts
              1e-3: [(0.5, 0.06), (1.0, 0.13)],
              2e-3: []}  # never evaluated: never wins
    assert tta.pick_lr(curves) == 1e-3
    assert tta.pick_lr({2e-3: [(1.0, 0.2)], 5e-4: [(1.0, 0.2)]}) == 5e-4  # a tie goes to the smaller lr
    with pytest.raises(ValueError):
        tta.pick_lr({1e-3: []})
    assert tta.middle([1e-3, 2.5e-4, 5e-4]) == 5e-4
    args = tta.parse_args(["--budget_minutes", "10"])
    assert tta.sweep_minutes(args) == pytest.approx(2.0)  # a fifth of the budget by default
    assert tta.sweep_minutes(tta.parse_args(["--sweep_minutes", "0"])) == 0


def their_lrs(scheduler, steps):
    values = []
    for _ in range(steps):
        values.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()  # no gradients: nothing moves
        scheduler.step()
    return values


def test_peer_tuned_takes_bests_choices_where_transformers_has_them():
    from bertrecipe.training.optimization import LinearWarmUpScheduler

    best = tta.BEST_OPTIONS
    spec = tta.peer_specs(tta.parse_args([]))["peer_tuned"]
    assert spec.family == "bert"
    assert spec.mlm_probability == float(tta.option_value(best, "--masked_lm_prob")) == 0.3
    assert spec.dropout == float(tta.option_value(best, "--pretrain_dropout")) == 0.0
    assert spec.warmup == tta.BEST_WARMUP and spec.schedule == "linear"
    assert spec.sweep_lrs == tta.PEER_TUNED_LRS and spec.lr == 5e-4
    assert not any("NSP" in what for what in spec.not_offered)  # best trains without NSP, as every peer
    assert any("LAMB" in what for what in spec.not_offered)
    assert tta.peer_model(100, 0, "cpu", spec.dropout).config.hidden_dropout_prob == 0.0
    assert tta.peer_model(100, 0, "cpu").config.hidden_dropout_prob == tta.MODEL["hidden_dropout_prob"]
    # best's schedule on a time budget: warm-up, then linear decay to 0 at the end; the peer's over its steps
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = tta.peer_optimizer(model, 50, spec, lr=1.0)
    ours = LinearWarmUpScheduler(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0), spec.warmup, 50)
    assert their_lrs(scheduler, 50) == pytest.approx([ours.factor(step / 50) for step in range(50)])
    assert optimizer.defaults["betas"] == tta.PEER_BETAS  # LAMB has no transformers counterpart: run_mlm's AdamW
    # the run_mlm peer keeps its own choices
    peer = tta.peer_specs(tta.parse_args([]))["peer"]
    assert (peer.mlm_probability, peer.dropout, peer.warmup, peer.lr) == (0.15, None, tta.PEER_WARMUP, tta.PEER_LR)
    # the options rule: a wsd schedule, Adam's betas and NSP carry over or are named as not offered
    other = tta.peer_spec_from_options("bert", ["--lr_schedule", "wsd", "--decay_proportion", "0.3", "--optimizer",
                                                "adamw", "--adam_beta2", "0.95"], 0.1, 1e-3)
    assert (other.schedule, other.decay_proportion, other.decay_type) == ("warmup_stable_decay", 0.3, "linear")
    assert other.betas == (0.9, 0.95) and other.mlm_probability == 0.15  # static masks: the shards' 15 %
    assert any("NSP" in what for what in other.not_offered)


def test_modern_peer_takes_the_modern_runs_choices_and_its_schedule_shape():
    from bertrecipe.training.optimization import wsd_factor

    spec = tta.peer_specs(tta.parse_args([]))["modern_peer"]
    assert (spec.family, spec.mlm_probability, spec.dropout) == ("modern", 0.3, None)  # the config's dropout: 0
    assert (spec.schedule, spec.decay_type, spec.decay_proportion) == ("warmup_stable_decay", "1-sqrt", 0.2)
    assert spec.betas == (0.9, 0.98) and spec.warmup == tta.MODERN_WARMUP and spec.sweep_lrs == tta.MODERN_PEER_LRS
    assert any("packed" in what for what in spec.not_offered)
    _, scheduler = tta.peer_optimizer(torch.nn.Linear(2, 2), 100, spec, lr=1.0)
    expected = [wsd_factor(step / 100, spec.warmup, spec.decay_proportion, 0.0, "1-sqrt") for step in range(100)]
    assert their_lrs(scheduler, 100) == pytest.approx(expected)


def test_our_modern_run_uses_the_modern_config_and_options_on_the_time_budget(tmp_path):
    args = tta.parse_args(["--runs", "modern", "peer", "modern_peer"])
    assert args.runs == ["peer", "modern_peer", "modern"]  # the table's order
    run = tta.our_runs(args)["modern"]
    assert run == (tta.MODERN_OPTIONS, tta.MODERN_LR, tta.MODERN_WARMUP, True, "modern")
    corpus = tta.Corpus(tmp_path / "vocab.txt", tmp_path / "bert.json", 100, tmp_path / "train", tmp_path / "test", 5,
                        tmp_path / "modern.json")
    command = tta.our_command(tmp_path, corpus, "fp32", run.lr, run.warmup, 10, 0.5, run.options,
                              corpus.modern_config)
    assert command[command.index("--config_file") + 1] == str(tmp_path / "modern.json")
    assert command[len(command) - command[::-1].index("--max_predictions_per_seq")] == "40"  # the last one rules
    assert "--pack_sequences" in command and "--vocab_file" in command


def test_comparison_lines_give_minutes_to_the_tuned_peers_and_the_two_families_side_by_side():
    results = {"peer_tuned": {"curve": [(0.5, 0.10), (1.0, 0.16)]},
               "best": {"curve": [(0.5, 0.12), (1.0, 0.20)], "parameters": 5_446_850},
               "modern_peer": {"curve": [(0.5, 0.10), (1.0, 0.18)], "lr": 1e-3, "sweep_minutes": 0.2,
                               "sweep": [{"lr": 5e-4, "curve": [(0.2, 0.05)]}, {"lr": 1e-3, "curve": [(0.2, 0.07)]}]},
               "modern": {"curve": [(0.5, 0.09), (1.0, 0.15)], "parameters": 5_434_560}}
    lines = tta.comparison_lines(results, 1.0)
    assert lines[2] == "- ours (best) reached peer_tuned's final accuracy (16.00%) in 0.75 minutes (budget 1)"
    assert lines[3].startswith("- ours (modern) did not reach modern_peer's final accuracy (18.00%)")
    assert "BERT 5.45 M parameters, modern 5.43 M, -0.2 %" in lines[4]
    assert "BERT with the best options 20.00%, the modern family 15.00%" in lines[4]
    assert lines[4].endswith("at the budget: BERT ahead by 5.00 points; it reached the other's final accuracy "
                             "(15.00%) in 0.69 minutes")
    assert lines[5] == ("- modern_peer: lr sweep, 0.2 minutes a value (not counted in the budget): lr 0.0005 5.00%, "
                        "lr 0.001 7.00%; chosen lr 0.001")
    results["modern"]["curve"] = [(0.5, 0.15), (1.0, 0.25)]
    lines = tta.comparison_lines(results, 1.0)
    assert lines[3] == "- ours (modern) reached modern_peer's final accuracy (18.00%) in 0.65 minutes (budget 1)"
    assert lines[4].endswith("the modern family ahead by 5.00 points; it reached the other's final accuracy "
                             "(20.00%) in 0.75 minutes")
    assert tta.comparison_lines({"best": results["best"]}, 1.0) == []


def small_heldout(tmp_path, corpus, rows):
    """The corpus with a held-out split of its test split's first `rows` rows (the same static masks)."""
    import h5py

    folder = tmp_path / "heldout"
    folder.mkdir()
    source = sorted(corpus.heldout.glob("*.hdf5"))[0]
    with h5py.File(source, "r") as f, h5py.File(folder / source.name, "w") as g:
        for key in f:
            g[key] = f[key][:rows]
        g.attrs.update(dict(f.attrs))
    return dataclasses.replace(corpus, heldout=folder)


@pytest.mark.slow
def test_a_smoke_run_of_the_modern_family_gives_curves_a_table_and_scores_our_checkpoint_alike(tmp_path, monkeypatch):
    """--runs modern modern_peer with budgets of about a second, batches of 8, a held-out split of 64 rows, a
    calibration and sweep of a step or two; the default corpus is built (or reused) where the benchmark builds it."""
    build = tta.build_corpus
    monkeypatch.setattr(tta, "build_corpus", lambda out, dupe: small_heldout(tmp_path, build(out, dupe), 64))
    monkeypatch.setattr(tta, "CALIBRATION_STEPS", 1)
    monkeypatch.setattr(tta, "BATCH", 8)
    out = tmp_path / "out"
    tta.main(["--runs", "modern", "modern_peer", "--budget_minutes", "0.02", "--eval_every_minutes", "0.02",
              "--sweep_minutes", "0.005", "--modern_peer_lrs", "1e-3", "2e-3", "--skip_sst2", "--precision", "fp32",
              "--output_dir", str(out)])
    record = json.loads((out / "curves.json").read_text())
    assert list(record["runs"]) == ["modern_peer", "modern"]
    for name, run in record["runs"].items():
        assert run["curve"] and all(0 <= accuracy <= 1 for _, accuracy in run["curve"]), name
        assert run["steps"] >= 1 and run["checkpoint"]
    peer, ours = record["runs"]["modern_peer"], record["runs"]["modern"]
    assert [entry["lr"] for entry in peer["sweep"]] == [1e-3, 2e-3] and peer["lr"] in (1e-3, 2e-3)
    assert peer["lr"] == tta.pick_lr({entry["lr"]: entry["curve"] for entry in peer["sweep"]})
    assert peer["planned_seconds_per_step"] == pytest.approx(
        statistics.median(entry["seconds_per_step"] for entry in peer["sweep"]))
    assert peer["planned_steps"] == tta.planned_steps(0.02, peer["planned_seconds_per_step"])
    assert abs(ours["parameters"] / peer["parameters"] - 1) < 0.001  # the same model, transformers' and ours
    assert record["modern_model"]["num_hidden_layers"] == 6
    table = (out / "table.md").read_text()
    assert tta.LABELS["modern"] in table and tta.LABELS["modern_peer"] in table
    assert "- ours (modern) " in table and "modern_peer's final accuracy" in table
    assert "lr sweep" in table and (out / "time_to_accuracy.png").is_file()
    # the held-out score of our final checkpoint, rebuilt in its family's class, is the one run_pretraining logged
    heldout = tta.load_split(tmp_path / "heldout")
    score = tta.checkpoint_accuracy(Path(ours["checkpoint"]), Path(ours["config"]), heldout, "cpu",
                                    tta.autocast("cpu", "fp32"))
    assert score == pytest.approx(ours["curve"][-1][1], abs=1e-3)
