"""scripts/plot_logs.py on real dllogger logs that run_pretraining.py writes for phase 1 and phase 2."""
import json
import os
import subprocess
import sys

import matplotlib
import matplotlib.axes
import pytest

from tests.conftest import REPO_ROOT

matplotlib.use("Agg")
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import plot_logs  # noqa: E402

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 128, "vocab_size": 30522, "hidden_act": "gelu", "type_vocab_size": 2,
        "initializer_range": 0.02, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(*command):
    done = subprocess.run([sys.executable, *map(str, command)], env=ENV, capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def logs(shared_data, tmp_path_factory):
    """Phase 1 (seq 64, 12 steps) then phase 2 (seq 128, 6 steps) of a tiny model on a real book."""
    root = tmp_path_factory.mktemp("plot")
    text = root / "book.txt"
    text.write_text((shared_data / "books" / "pg11.txt").read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    config = root / "bert_config.json"
    config.write_text(json.dumps(TINY))
    for phase, (seq, preds) in {1: (64, 10), 2: (128, 20)}.items():
        (root / f"p{phase}").mkdir()
        run(REPO_ROOT / "data" / "create_pretraining_data.py", "--input_file", text, "--output_file",
            root / f"p{phase}" / "book_training_0.hdf5", "--vocab_file", shared_data / "minilm" / "vocab.txt",
            "--max_seq_length", seq, "--max_predictions_per_seq", preds, "--dupe_factor", "1")
    common = ["--config_file", config, "--output_dir", root / "ckpt", "--train_batch_size", 8, "--do_train",
              "--learning_rate", 1e-2, "--warmup_proportion", 0.1, "--disable_progress_bar", "--log_freq", 1]
    run(REPO_ROOT / "run_pretraining.py", "--input_dir", root / "p1", "--max_seq_length", 64,
        "--max_predictions_per_seq", 10, "--max_steps", 12, "--json-summary", root / "dllogger_phase1.json", *common)
    run(REPO_ROOT / "run_pretraining.py", "--input_dir", root / "p2", "--max_seq_length", 128,
        "--max_predictions_per_seq", 20, "--max_steps", 6, "--resume_from_checkpoint", "--phase2",
        "--phase1_end_step", 12, "--json-summary", root / "dllogger_phase2.json", *common)
    return root


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


def test_a_file_that_is_not_a_log_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text("just text\n")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "plot_logs.py"), str(bad), "-o",
                           str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "notes.json" in done.stderr
    assert not (tmp_path / "x.png").exists()
