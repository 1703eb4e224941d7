"""Shared test fixtures: the small real data in tests/data, a tiny generated BERT, the pre-training corpus of shards
made from tests/data's books, and the location of the large real data that only the integration tier needs
(../shared/data in the development checkout and CI)."""
import json
import shutil
import signal
from pathlib import Path

import pytest
import torch

from helpers import (
    EXCERPT,
    HOLMES_HELD_OUT_FROM,
    SHARED_DATA,
    TEST_DATA,
    TINY,
    TINY_BERT,
    VOCAB_EXCERPT,
    make_shard,
)


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
def squad_beir(tmp_path_factory) -> Path:
    """tests/data/squad's v1.1 excerpt (6 articles) as BEIR folders (benchmarks' squad_as_beir): train/ and
    pairs.jsonl of 4 articles, test/ of the other 2. Read-only for the tests."""
    from benchmarks.retrieval_training import squad_as_beir

    out = tmp_path_factory.mktemp("squad_beir")
    squad_as_beir(EXCERPT / "dev-v1.1.json", out, test_articles=2)
    return out


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder for tests; tests that need it are skipped, with the reason, where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"integration tier: needs the large real data, not found at {SHARED_DATA} (set BERT_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def corpus(vocab_file, tmp_path_factory):
    """Phase-1 (64/10) training shards from two book excerpts (tests/data/books), a shard of held-out text of one
    of them, and phase-2 (128/20) shards. The phase-1 text is masked 5 times (NVIDIA's dupe factor) so that one
    epoch (about 850 sequences) outlasts every run here: the tests expect their steps in epoch 0. Built once per
    session (per xdist worker) and read-only, so that no test can change what the next one reads."""
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
    for path in sorted(root.rglob("*"), reverse=True) + [root]:  # files before their folders
        path.chmod(0o555 if path.is_dir() else 0o444)
    return root


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
