"""scripts/plot_logs.py on real dllogger logs that run_pretraining.py writes for phase 1 and phase 2 and that
run_glue.py (the fine-tuning loop) writes, and the per-step throughput those logs carry."""
import json
import math
import subprocess
import sys

import matplotlib
import matplotlib.axes
import pytest

from bertrecipe.cli import plot_logs
from bertrecipe.training.metric_logger import read_log
from helpers import GLUE_EXCERPTS, REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, glue, run_command, subset

matplotlib.use("Agg")


# The shards are made with the vocab excerpt: a model of its size (a larger one is refused as another's).
TINY_VOCAB = sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8"))
TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 128, "vocab_size": TINY_VOCAB, "hidden_act": "gelu", "type_vocab_size": 2,
        "initializer_range": 0.02, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def run(*command):
    done = run_command([sys.executable, *map(str, command)], cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def logs(vocab_file, tmp_path_factory):
    """Phase 1 (seq 64, 12 steps) then phase 2 (seq 128, 6 steps) of a tiny model on a real book (the first
    chapter of Alice in tests/data/books)."""
    root = tmp_path_factory.mktemp("plot")
    text = root / "book.txt"
    text.write_text((TEST_DATA / "books" / "pg11.txt").read_text(encoding="utf-8"), encoding="utf-8")
    config = root / "bert_config.json"
    config.write_text(json.dumps(TINY))
    for phase, (seq, preds) in {1: (64, 10), 2: (128, 20)}.items():
        (root / f"p{phase}").mkdir()
        run(REPO_ROOT / "data" / "create_pretraining_data.py", "--input_file", text, "--output_file",
            root / f"p{phase}" / "book_training_0.hdf5", "--vocab_file", vocab_file,
            "--max_seq_length", seq, "--max_predictions_per_seq", preds, "--dupe_factor", "1")
    common = ["--config_file", config, "--output_dir", root / "ckpt", "--train_batch_size", 8, "--do_train",
              "--learning_rate", 1e-2, "--warmup_proportion", 0.1, "--disable_progress_bar", "--log_freq", 1]
    run(REPO_ROOT / "run_pretraining.py", "--input_dir", root / "p1", "--max_seq_length", 64,
        "--max_predictions_per_seq", 10, "--max_steps", 12, "--json-summary", root / "dllogger_phase1.json", *common)
    run(REPO_ROOT / "run_pretraining.py", "--input_dir", root / "p2", "--max_seq_length", 128,
        "--max_predictions_per_seq", 20, "--max_steps", 6, "--resume_from_checkpoint", "--phase2",
        "--phase1_end_step", 12, "--json-summary", root / "dllogger_phase2.json", *common)
    return root


@pytest.mark.slow
def test_both_phase_logs_are_drawn_with_the_phase_boundary_marked(logs, monkeypatch):
    marks = []
    honest = matplotlib.axes.Axes.axvline
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline",
                        lambda self, x=0, *a, **k: marks.append(x) or honest(self, x, *a, **k))
    output = logs / "curves.png"
    plot_logs.main([str(logs / "dllogger_phase1.json"), str(logs / "dllogger_phase2.json"), "-o", str(output)])
    # Phase 2's first logged step follows phase 1's last (12): the boundary is drawn there on every panel.
    assert marks and set(marks) == {13}
    from matplotlib.image import imread

    image = imread(output)
    assert image.shape[0] > 400 and image.shape[1] > 600 and image.std() > 0.01


def test_series_follow_the_global_step_of_each_phase(logs):
    phase1 = plot_logs.series(logs / "dllogger_phase1.json")
    phase2 = plot_logs.series(logs / "dllogger_phase2.json")
    assert [step for step, _ in phase1["average_loss"]] == list(range(1, 13))
    assert [step for step, _ in phase2["learning_rate"]] == list(range(13, 19))
    assert plot_logs.final_summary(logs / "dllogger_phase2.json")["training_sequences_per_second"] > 0


def training_records(path):
    """(global step, data) of the per-step training records (evaluation records have no step_loss)."""
    return [(r["step"][-1], r["data"]) for r in read_log(path) if r["type"] == "LOG"
            and isinstance(r["step"], list) and r["step"] and "step_loss" in r["data"]]


def final(path):
    return next(r["data"] for r in read_log(path) if r["type"] == "LOG" and r["step"] == [])


def seconds_between_records(records, sequences_per_step, first_step):
    """What each record's per-step throughput says the time since the previous record (or since training
    started) was: the sequences trained in between divided by the record's sequences per second."""
    seconds, previous = [], first_step - 1
    for step, data in records:
        rate = data["training_sequences_per_second"]
        assert rate > 0 and math.isfinite(rate), (step, rate)
        seconds.append(sequences_per_step * (step - previous) / rate)
        previous = step
    return seconds


def test_pretraining_logs_throughput_of_every_step_consistent_with_the_run_timings(logs):
    for name, first_step, count in (("dllogger_phase1.json", 1, 12), ("dllogger_phase2.json", 13, 6)):
        records = training_records(logs / name)
        assert [step for step, _ in records] == list(range(first_step, first_step + count))
        seconds = seconds_between_records(records, 8, first_step)
        summary = final(logs / name)
        # The intervals between records hold every step's compute (raw_train_time) and lie within the run.
        assert summary["raw_train_time"] * (1 - 1e-9) <= sum(seconds) <= summary["e2e_train_time"], (name, summary)
        # From the third step on they hold the steps the final throughput is timed on, plus only the logging:
        # a rate counted per process, per step or twice would fall outside.
        timed = 8 * (count - 2) / summary["training_sequences_per_second"]
        assert timed * (1 - 1e-9) <= sum(seconds[2:]) < timed / 0.55, (name, seconds, summary)


def ylabels(fig):
    return [axis.get_ylabel() for axis in fig.axes]


def test_throughput_panel_draws_each_phase_against_the_global_step(logs):
    paths = [logs / "dllogger_phase1.json", logs / "dllogger_phase2.json"]
    fig = plot_logs.figure(paths)
    assert ylabels(fig) == ["loss", "learning rate", "sequences/s"]
    throughput = fig.axes[2]
    assert throughput.get_xlabel() == "global step"
    curves = [line for line in throughput.get_lines() if line.get_linestyle() != "--"]
    assert len(curves) == 2
    for line, path in zip(curves, paths, strict=True):
        records = training_records(path)
        assert list(line.get_xdata()) == [step for step, _ in records]
        assert list(line.get_ydata()) == [data["training_sequences_per_second"] for _, data in records]
    boundary = [line for line in throughput.get_lines() if line.get_linestyle() == "--"]
    assert len(boundary) == 1 and list(boundary[0].get_xdata()) == [13, 13]


def without_throughput(source, target):
    """The log with the per-step throughput taken out, as NVIDIA's own logs are."""
    lines = []
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.startswith("DLLL "):
            record = json.loads(line[5:])
            if isinstance(record.get("step"), list) and record["step"]:
                record["data"].pop("training_sequences_per_second", None)
            line = "DLLL " + json.dumps(record)
        lines.append(line)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


def test_logs_without_per_step_throughput_still_plot(logs, tmp_path):
    phase1 = without_throughput(logs / "dllogger_phase1.json", tmp_path / "nvidia_phase1.json")
    phase2 = without_throughput(logs / "dllogger_phase2.json", tmp_path / "nvidia_phase2.json")
    fig = plot_logs.figure([phase1, phase2])
    assert ylabels(fig) == ["loss", "learning rate"]
    # One log with it and one without: the panel holds the one curve there is.
    fig = plot_logs.figure([phase1, logs / "dllogger_phase2.json"])
    assert ylabels(fig) == ["loss", "learning rate", "sequences/s"]
    curves = [line for line in fig.axes[2].get_lines() if line.get_linestyle() != "--"]
    assert len(curves) == 1 and list(curves[0].get_xdata()) == list(range(13, 19))
    output = plot_logs.plot([phase1, phase2], tmp_path / "nvidia.png")
    assert output.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_finetuning_log_has_per_step_throughput_and_plots_it(tiny_bert, vocab_file, tmp_path):
    data = subset(GLUE_EXCERPTS / "SST-2", tmp_path / "SST-2", 40, 8)
    out = tmp_path / "out"
    glue(vocab_file, data, out, "--task_name", "sst-2", "--init_checkpoint", str(tiny_bert),
         "--do_train", "--max_seq_length", "32", "--train_batch_size", "8", "--max_steps", "4", "--log_freq", "1")
    records = training_records(out / "dllogger.json")
    assert [step for step, _ in records] == [1, 2, 3, 4]
    # Records follow each other to the end of the loop: together they span its whole time.
    taken = sum(seconds_between_records(records, 8, 1))
    elapsed = final(out / "dllogger.json")["e2e_train_time"]
    assert 0.95 * elapsed - 0.05 <= taken <= elapsed * (1 + 1e-9), (taken, elapsed)
    fig = plot_logs.figure([out / "dllogger.json"])
    assert ylabels(fig) == ["loss", "learning rate", "sequences/s"]
    assert [list(line.get_xdata()) for line in fig.axes[2].get_lines()] == [[1, 2, 3, 4]]


def test_a_file_that_is_not_a_log_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text("just text\n")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "plot_logs.py"), str(bad), "-o",
                           str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "notes.json" in done.stderr
    assert not (tmp_path / "x.png").exists()
