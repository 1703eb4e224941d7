"""Shared test fixtures: the small real data in tests/data, a tiny generated BERT, the pre-training corpus of shards
made from tests/data's books, and the location of the large real data that only the integration tier needs
(../shared/data in the development checkout and CI)."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_DATA = REPO_ROOT / "tests" / "data"
SHARED_DATA = Path(os.environ.get("BERT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
# The first 8,000 entries of Google's uncased BERT vocabulary (ids unchanged) and its other single-character
# "##" pieces: every word still tokenizes, rarer words into more pieces than with the full vocabulary.
VOCAB_EXCERPT = TEST_DATA / "vocab-uncased-excerpt.txt"
TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 512, "type_vocab_size": 2}
# The pre-training tests' model (the corpus fixture's bert_config.json; TINY_BERT above is the Hugging Face one):
# its vocab is the one the shards are tokenized with (tests/data's excerpt of BERT's uncased vocab).
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "max_position_embeddings": 128, "vocab_size": sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8")),
        "hidden_act": "gelu", "type_vocab_size": 2, "initializer_range": 0.02, "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1}
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # two cores: one thread per process avoids oversubscription
HOLMES_HELD_OUT_FROM = 200  # line of tests/data/books/pg1661.txt (a paragraph break) where the held-out text starts


def beside_the_benchmarks(code: str, *args: str) -> Any:
    """What `code` prints last, as JSON, run from benchmarks/ in a process of its own (sys.argv[1:] = args): the
    benchmarks import each other as scripts do, so their functions are tested where they run."""
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT / "benchmarks",
                            env={**ENV, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def vocab_file() -> Path:
    """The uncased vocabulary excerpt kept in the repository (see tests/data/README.md)."""
    return VOCAB_EXCERPT


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT saved by transformers as a Hugging Face folder (config.json,
    model.safetensors with BertModel's names and no pre-training heads, vocab.txt), laid out as a real
    pretrained encoder download is; seeded, so every session gets the same weights."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny_bert")
    vocab_size = sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8"))
    config = transformers.BertConfig(vocab_size=vocab_size, **TINY_BERT)
    torch.manual_seed(0)
    transformers.BertModel(config, add_pooling_layer=True).save_pretrained(folder, safe_serialization=True)
    shutil.copyfile(VOCAB_EXCERPT, folder / "vocab.txt")
    return folder


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder for tests; tests that need it are skipped, with the reason, where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"integration tier: needs the large real data, not found at {SHARED_DATA} (set BERT_SHARED_DATA)")
    return SHARED_DATA


def make_shard(vocab_file: Path, text_file: Path, out_file: Path, seq: int, preds: int, dupe_factor: int = 1) -> None:
    subprocess.run([sys.executable, str(REPO_ROOT / "data" / "create_pretraining_data.py"), "--input_file",
                    str(text_file), "--output_file", str(out_file), "--vocab_file", str(vocab_file),
                    "--max_seq_length", str(seq), "--max_predictions_per_seq", str(preds), "--dupe_factor",
                    str(dupe_factor)],
                   check=True, capture_output=True, env=ENV)


@pytest.fixture(scope="module")
def corpus(vocab_file, tmp_path_factory):
    """Phase-1 (64/10) training shards from two book excerpts (tests/data/books), a shard of held-out text of one
    of them, and phase-2 (128/20) shards. The phase-1 text is masked 5 times (NVIDIA's dupe factor) so that one
    epoch (about 850 sequences) outlasts every run here: the tests expect their steps in epoch 0."""
    root = tmp_path_factory.mktemp("corpus")
    holmes = (TEST_DATA / "books" / "pg1661.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    texts = {"holmes.txt": "".join(holmes[:HOLMES_HELD_OUT_FROM]),
             "alice.txt": (TEST_DATA / "books" / "pg11.txt").read_text(encoding="utf-8"),
             "holmes_held_out.txt": "".join(holmes[HOLMES_HELD_OUT_FROM:])}
    for name, text in texts.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "p1").mkdir()
    (root / "eval").mkdir()
    (root / "p2").mkdir()
    make_shard(vocab_file, root / "holmes.txt", root / "p1" / "books_training_0.hdf5", 64, 10, dupe_factor=5)
    make_shard(vocab_file, root / "alice.txt", root / "p1" / "books_training_1.hdf5", 64, 10, dupe_factor=5)
    make_shard(vocab_file, root / "holmes_held_out.txt", root / "eval" / "books_test_0.hdf5", 64, 10)
    make_shard(vocab_file, root / "alice.txt", root / "p2" / "books_training_0.hdf5", 128, 20)
    config = root / "bert_config.json"
    config.write_text(json.dumps(TINY))
    no_dropout = root / "bert_config_no_dropout.json"
    no_dropout.write_text(json.dumps({**TINY, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    return root


def write_formatted(articles, path: Path) -> Path:
    """Formatted text as text_formatting writes it: one article a line, a blank line after each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join(a.split()) + "\n\n" for a in articles), encoding="utf-8")
    return path


@pytest.fixture
def cuda_device() -> torch.device:
    """The GPU of the cuda tier (device 0); a test that takes it is marked cuda, so skipped where there is none."""
    return torch.device("cuda", 0)


def pytest_configure(config) -> None:
    # A shell without job control starts a background command (`bash scripts/test.sh &`, nohup) with SIGINT
    # ignored, and every process the tests start would inherit that: the Ctrl-C tests' runs would then train on
    # (one waited 240 s). A Python handler is reset to the default in a child at exec, where SIG_IGN is kept.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items) -> None:
    """A test that needs the large real data is the integration tier, and one that takes cuda_device the cuda tier,
    whether or not it says so itself; the cuda tier is skipped, with the reason, where torch sees no GPU."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "shared_data" in fixtures:
            item.add_marker(pytest.mark.integration)
        if "cuda_device" in fixtures:
            item.add_marker(pytest.mark.cuda)
    on_gpu = [item for item in items if item.get_closest_marker("cuda")]
    if on_gpu and not torch.cuda.is_available():  # asked only when a cuda test was collected
        skip = pytest.mark.skip(reason=f"cuda tier: needs a CUDA GPU; torch {torch.__version__} sees none "
                                       "(torch.cuda.is_available() is False)")
        for item in on_gpu:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After pytest's own summary: how much of the suite ran here, and why the rest did not."""
    yield
    stats = terminalreporter.stats
    ran = sum(len(stats.get(key, [])) for key in ("passed", "failed", "error", "xfailed", "xpassed"))
    skipped = [report for report in stats.get("skipped", []) if report.when in ("setup", "call")]
    deselected = len(stats.get("deselected", []))
    total = ran + len(skipped)
    if not total:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    line = f"ran {ran} of {total} selected tests ({100 * ran / total:.1f} %), skipped {len(skipped)}"
    if deselected:
        line += f", {deselected} deselected by -m/-k"
    terminalreporter.write_line(line, bold=True)
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"  skipped {count}: {reason}")


@torch.no_grad()
def masked_lm_loss_over_shard(logits_of, shard: Path) -> float:
    """The masked-LM loss over a shard's static masks, sample by sample: logits_of(input_ids, segment_ids,
    input_mask), each [1, seq], gives the [seq, vocab] logits of an independent model (transformers')."""
    with h5py.File(shard) as f:
        arrays = {k: f[k][()] for k in f}
    total, count = 0.0, 0
    for i in range(len(arrays["input_ids"])):
        positions = [int(p) for p in arrays["masked_lm_positions"][i]]
        n = positions.index(0) if 0 in positions else len(positions)
        row = [torch.tensor(arrays[k][i], dtype=torch.long)[None] for k in ("input_ids", "segment_ids", "input_mask")]
        logits = logits_of(*row)[positions[:n]]
        targets = torch.tensor(arrays["masked_lm_ids"][i][:n], dtype=torch.long)
        total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += n
    return total / count

