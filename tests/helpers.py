"""What several test modules share: the repository's paths, the small real data, the tiny models' configs, and the
helpers that run a command on them (pre-training, SQuAD, GLUE, Triton) or read what it wrote. Test modules import
these from here, never from each other or from conftest (which keeps the fixtures and hooks)."""
import ast
import functools
import importlib
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import traceback
import warnings
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Callable, Iterator, Optional

import h5py
import numpy as np
import torch

from bertrecipe.cli import triton_deployer as deployer
from bertrecipe.finetuning import squad as squad_features
from bertrecipe.finetuning.staged_outputs import save_finetuned
from bertrecipe.model.bert import BertForQuestionAnswering
from bertrecipe.model.weights import load_weights_into, read_weights
from bertrecipe.training.metric_logger import read_log

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # two cores: one thread per process avoids oversubscription
HOLMES_HELD_OUT_FROM = 200  # line of tests/data/books/pg1661.txt (a paragraph break) where the held-out text starts
TEST_DATA = REPO_ROOT / "tests" / "data"
# The first 8,000 entries of Google's uncased BERT vocabulary (ids unchanged) and its other single-character
# "##" pieces: every word still tokenizes, rarer words into more pieces than with the full vocabulary.
VOCAB_EXCERPT = TEST_DATA / "vocab-uncased-excerpt.txt"
# The pre-training tests' model (the corpus fixture's bert_config.json; TINY_BERT below is the Hugging Face one):
# its vocab is the one the shards are tokenized with (tests/data's excerpt of BERT's uncased vocab).
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "max_position_embeddings": 128, "vocab_size": sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8")),
        "hidden_act": "gelu", "type_vocab_size": 2, "initializer_range": 0.02, "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1}
# The tiny_bert fixture's Hugging Face model.
TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 512, "type_vocab_size": 2}
# The tiny transformers ModernBERT the fine-tuning and retrieval tests save (with vocab_size and special ids added):
# three layers, one global, two local of window 16.
TINY_MODERN = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 3, "intermediate_size": 48,
               "local_attention": 16, "global_attn_every_n_layers": 3, "max_position_embeddings": 256,
               "pad_token_id": 0}
SHARED_DATA = Path(os.environ.get("BERT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
SENTENCES = [("the movie was good", "1"), ("the plot was bad", "0"), ("i liked it", "1"), ("a very awful film", "0")]
WORDS = "the a movie film plot was is good bad great awful not very i liked it".split()
GLUE_EXCERPTS = TEST_DATA / "glue"  # 40 train and 40 dev rows per task (see its README)
CONTEXT = "the movie was good i liked it the plot was bad"
QUESTIONS = [("q1", "the movie was", ["good"]), ("q2", "the plot was", ["bad"]), ("q3", "i liked", ["it"])]
SHORT = ["--max_seq_length", "128", "--doc_stride", "64", "--max_query_length", "32", "--predict_batch_size", "32"]
EXCERPT = TEST_DATA / "squad"  # a few real dev articles of each version (README.md there)
SHELLS = {"sh", "bash", "dash", "ksh"}  # the dialects shellcheck checks
# fp16-exact inputs, so that only the loss scale can overflow: the weight gradient is scale * (0.75, -0.25, -0.25).
X = torch.tensor([[0.25, -0.5, 0.125], [0.5, 0.25, -0.375]])
LR = 0.1
FP16_MAX = torch.finfo(torch.float16).max  # 65504: a loss scale of 2**16 rounds to inf in fp16, 2**15 does not
SEQ = 128
# 14 paragraphs of the official dev-v1.1 (see tests/data/squad/README.md).
SQUAD_EXCERPT = TEST_DATA / "squad" / "dev-v1.1.json"
WINDOW = squad_features.WindowSettings(SEQ, 64, 32)
# A process that takes the lock and holds it until killed or until its stdin closes.
HOLDER = """
import sys
from bertrecipe.common.errors import InputError
from bertrecipe.training.run_lock import RunLock
lock = RunLock(sys.argv[1])
try:
    lock.acquire()
except InputError as error:
    print("refused", error, flush=True)
    sys.exit(2)
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


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


def write_formatted(articles, path: Path) -> Path:
    """Formatted text as text_formatting writes it: one article a line, a blank line after each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join(a.split()) + "\n\n" for a in articles), encoding="utf-8")
    return path


def make_shard(vocab_file: Path, text_file: Path, out_file: Path, seq: int, preds: int, dupe_factor: int = 1) -> None:
    """data/create_pretraining_data.py on one text file (NVIDIA's sentence-pair shard)."""
    made = run_command([sys.executable, REPO_ROOT / "data" / "create_pretraining_data.py", "--input_file", text_file,
                        "--output_file", out_file, "--vocab_file", vocab_file, "--max_seq_length", seq,
                        "--max_predictions_per_seq", preds, "--dupe_factor", dupe_factor])
    assert made.returncode == 0, made.stderr[-3000:]


def tiny_sst2(folder: Path, train_rows: int = 8, dev_rows: int = 4, test_rows: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [f"{text}\t{label}" for text, label in SENTENCES * 4]
    for name, n in (("train.tsv", train_rows), ("dev.tsv", dev_rows)):
        (folder / name).write_text("\n".join(["sentence\tlabel", *rows[:n]]) + "\n", encoding="utf-8")
    tests = [f"{i}\t{text}" for i, (text, _) in enumerate(SENTENCES[:test_rows])]
    (folder / "test.tsv").write_text("\n".join(["index\tsentence", *tests]) + "\n", encoding="utf-8")
    return folder


def tiny_args(root: Path, *extra: str) -> list[str]:
    vocab, config = root / "model" / "vocab.txt", root / "model" / "bert_config.json"
    return ["--task_name", "sst-2", "--data_dir", str(root / "SST-2"), "--vocab_file", str(vocab), "--config_file",
            str(config), "--output_dir", str(root / "out"), "--json-summary", str(root / "dllogger.json"),
            "--max_seq_length", "16", "--train_batch_size", "4", "--max_steps", "2", "--disable_progress_bar",
            *extra]


def tiny_model_files(folder: Path) -> tuple[Path, Path]:
    """A WordPiece vocab and a one-layer BERT config: a fresh model of it trains a step in milliseconds."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    config = folder / "bert_config.json"
    config.write_text(json.dumps({
        "vocab_size": 5 + len(WORDS), "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}))
    return vocab, config


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder (relative name -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def subset(source: Path, target: Path, train_rows: int, dev_rows: int) -> Path:
    """The first rows of train.tsv and dev.tsv (headers kept) in a task folder of their own."""
    target.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.tsv", train_rows), ("dev.tsv", dev_rows)):
        lines = (source / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (target / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")
    return target


def glue(vocab: Path, data_dir: Path, out: Path, *extra: str, launcher=(sys.executable,),
         check: bool = True) -> subprocess.CompletedProcess:
    """run_glue.py with the given vocabulary file, uncased, its log in out/dllogger.json: in this process (in_process),
    or under `launcher` (torchrun) in processes of their own."""
    cmd = [*launcher, str(REPO_ROOT / "run_glue.py"), "--data_dir", str(data_dir), "--output_dir", str(out),
           "--vocab_file", str(vocab), "--do_lower_case", "--disable_progress_bar",
           "--json-summary", str(out / "dllogger.json"), *extra]
    result = run_command(cmd, cwd=REPO_ROOT)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def tiny_squad_file(path: Path, questions: list[tuple[str, str, list[str]]], version: str = "1.1") -> Path:
    """One paragraph of CONTEXT with questions (id, question, answer texts located by their first occurrence)."""
    qas = [{"id": qid, "question": question,
            "answers": [{"text": text, "answer_start": CONTEXT.index(text)} for text in answers]}
           for qid, question, answers in questions]
    data = {"version": version, "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def tiny_squad_args(root: Path, *extra: str) -> list[str]:
    model = root / "model"
    return ["--vocab_file", str(model / "vocab.txt"), "--config_file", str(model / "bert_config.json"),
            "--output_dir", str(root / "out"), "--json-summary", str(root / "dllogger.json"), "--cache_dir",
            str(root / "cache"), "--max_seq_length", "24", "--doc_stride", "8", "--max_query_length", "8",
            "--train_batch_size", "2", "--max_steps", "2", "--disable_progress_bar", *extra]


def squad_subset(source: Path, target: Path, titles: list[str], paragraphs: int) -> Path:
    data = json.loads(source.read_text(encoding="utf-8"))
    chosen = [dict(a, paragraphs=a["paragraphs"][:paragraphs]) for a in data["data"] if a["title"] in titles]
    assert len(chosen) == len(titles)
    target.write_text(json.dumps({"version": data["version"], "data": chosen}), encoding="utf-8")
    return target


def squad(vocab: Path, out: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO_ROOT / "run_squad.py"), "--output_dir", str(out), "--vocab_file",
           str(vocab), "--do_lower_case", "--disable_progress_bar",
           "--json-summary", str(out / "dllogger.json"), *SHORT, *extra]
    result = run_command(cmd, cwd=REPO_ROOT)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def step_records(path):
    return {tuple(r["step"]): r["data"] for r in read_log(path) if r["type"] == "LOG" and isinstance(r["step"], list)
            and r["step"] and "step_loss" in r["data"]}


@torch.no_grad()  # a reference forward pass: no autograd graph
def masked_lm_reference(model, shard, with_nsp=False):
    """Masked-LM loss and accuracy computed sample by sample from the HDF5 arrays, independently of
    pretraining_data.py (and, with_nsp, the share of next-sentence labels the head gets right)."""
    loss, correct, count, nsp_right = 0.0, 0, 0, 0
    with h5py.File(shard) as f:
        arrays = {k: f[k][()] for k in f}
    for i in range(len(arrays["input_ids"])):
        positions = [int(p) for p in arrays["masked_lm_positions"][i]]
        n = positions.index(0) if 0 in positions else len(positions)
        ids = torch.tensor(arrays["input_ids"][i], dtype=torch.long)[None]
        out, pooled = model.bert(ids, torch.tensor(arrays["segment_ids"][i], dtype=torch.long)[None],
                                 torch.tensor(arrays["input_mask"][i], dtype=torch.long)[None])
        logits = model.cls.predictions(out[0, positions[:n]])
        targets = torch.tensor(arrays["masked_lm_ids"][i][:n], dtype=torch.long)
        loss += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        correct += int((logits.argmax(-1) == targets).sum())
        count += n
        nsp_right += int(int(model.cls.seq_relationship(pooled).argmax()) == int(arrays["next_sentence_labels"][i]))
    if with_nsp:
        return loss / count, correct / count, nsp_right / len(arrays["input_ids"])
    return loss / count, correct / count


def tiny_modern_folder(folder: Path, vocab_file: Path, model_class: str = "ModernBertModel", **config_extra) -> Path:
    """A seeded TINY_MODERN model of transformers' `model_class` saved as a Hugging Face folder, with the WordPiece
    vocab_file beside it (its [CLS] 101 and [SEP] 102 as the config's special ids)."""
    import transformers

    vocab = vocab_file.read_text(encoding="utf-8")
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=len(vocab.splitlines()), bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102,
        **TINY_MODERN, **config_extra)
    getattr(transformers, model_class)(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text(vocab, encoding="utf-8")
    return folder


def page_script(page: Path, small: list[tuple[str, str]], blocks_at_least: int) -> str:
    """A docs page's bash blocks, in order, as one script, with its sizes made small: each (pattern, replacement)
    applied in turn, every pattern still on the page."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= blocks_at_least
    script = "\n".join(blocks)
    for pattern, replacement in small:
        assert re.search(pattern, script), f"{page.name} no longer has {pattern}: update its list of sizes"
        script = re.sub(pattern, replacement, script)
    return script


def pretrain(corpus, out, *extra, config="bert_config.json", phase=1, nproc=1, check=True, script=None, **popen):
    """run_pretraining.py (or `script`, a wrapper around its main) on the corpus, in 1 or `nproc` processes: one
    process of run_pretraining.py runs in this one (run_command), unless the test wants the process itself (popen)."""
    script = str(script or REPO_ROOT / "run_pretraining.py")
    shards, seq, preds = ("p1", 64, 10) if phase == 1 else ("p2", 128, 20)
    args = ["--input_dir", str(corpus / shards), "--config_file", str(corpus / config), "--output_dir", str(out),
            "--max_seq_length", str(seq), "--max_predictions_per_seq", str(preds), "--learning_rate", "2e-2",
            "--warmup_proportion", "0.1", "--do_train", "--disable_progress_bar",
            "--json-summary", str(out / "log.json"), *map(str, extra)]
    if nproc > 1:
        # --standalone: a rendezvous on a port the OS hands out, so that tests running side by side never meet.
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                   script, *args]
    else:
        command = [sys.executable, script, *args]
    if popen:
        # Its own process group, so that a test can signal the whole job as Slurm does.
        return subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    result = run_command(command)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def final_record(path):
    return next(r["data"] for r in read_log(path) if r["type"] == "LOG" and r["step"] == [])


def shell_scripts(root: Path = REPO_ROOT) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in sorted(set(listed)):
        path = root / name
        if not path.is_file():
            continue
        if name.endswith((".sh", ".sub")):
            found.append(name)
            continue
        with open(path, "rb") as f:
            if shebang_shell(f.readline(200)):
                found.append(name)
    return found


def shebang_shell(first_line: bytes) -> Optional[str]:
    """The shell a `#!` line names (`#!/bin/sh -e`, `#!/usr/bin/env bash`), or None for another interpreter."""
    if not first_line.startswith(b"#!"):
        return None
    words = first_line[2:].decode("utf-8", "replace").split()
    if words and Path(words[0]).name == "env":
        words = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
    name = Path(words[0]).name if words else ""
    return name if name in SHELLS else None


def sum_of_outputs(model, x):
    # d(loss)/d(output) is 1 everywhere: the fp16 gradient entering the matmul's backward is the loss scale itself.
    return model(x).float().sum()


def deploy(setup, repository: Path, *extra: str) -> None:
    deployer.main(["--init_checkpoint", str(setup["checkpoint"]), "--vocab_file", str(setup["vocab"]),
                   "--do_lower_case", "--predict_file", str(setup["predict"]), "--max_seq_length", str(SEQ),
                   "--doc_stride", "64", "--max_query_length", "32", "--model_repository", str(repository),
                   *extra])


def copy_squad_excerpt(target: Path) -> Path:
    """The SQuAD excerpt copied to `target`, so that nothing run on it (a feature cache) writes into tests/data."""
    shutil.copyfile(SQUAD_EXCERPT, target)
    return target


def make_qa_checkpoint(encoder: Path, out: Path) -> Path:
    """The encoder (a Hugging Face folder) with a seeded QA head, saved as run_squad.py saves a fine-tuned model."""
    weights = read_weights(encoder)
    torch.manual_seed(0)
    model = BertForQuestionAnswering(weights.config)
    load_weights_into(model, weights, encoder)
    save_finetuned(model, weights.config, out)
    return out / "pytorch_model.bin"


def feature_arrays(setup):
    examples = squad_features.read_squad_examples(setup["predict"], is_training=False)
    features = squad_features.convert_examples_to_features(examples, setup["tokenizer"], WINDOW)
    return features.input_ids, features.segment_ids, features.input_mask


def permissions_are_ignored() -> bool:
    """True for root (os.geteuid() == 0) unless it runs without CAP_DAC_OVERRIDE, where permissions hold."""
    if os.geteuid() != 0:
        return False
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o555)
        try:
            Path(folder, "probe").touch()
            return True
        except PermissionError:
            return False
        finally:
            os.chmod(folder, 0o755)


def start_holder(folder, env=None):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return process, process.stdout.readline().strip()


@contextmanager
def held_ports(count: int = 1) -> Iterator[list[int]]:
    """`count` ports the OS hands out, each kept bound (not listening) until the block ends, so that no other test
    or process is given one meanwhile. Servers bind with SO_REUSEADDR (torch's TCPStore, Dask, Triton), which Linux
    lets them do beside a bound socket that does not listen; the ports are theirs as soon as they start."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for held in sockets:
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", 0))
        yield [held.getsockname()[1] for held in sockets]
    finally:
        for held in sockets:
            held.close()


# Python's own filters in a fresh interpreter (`python -W` unset): what a command's warnings meet on the command line.
FRESH_INTERPRETER_FILTERS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                             ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                             ("ignore", ResourceWarning, None)]


@contextmanager
def as_a_fresh_process() -> Iterator[None]:
    """What a command changes in its process, put back afterwards: torch's threads (one, as ENV's OMP_NUM_THREADS
    gives a subprocess), seeds, deterministic mode and precision flags, the signal handlers, the environment, the
    working folder; warnings are printed to stderr once per place, as in a fresh interpreter (not recorded by
    pytest)."""
    threads = torch.get_num_threads()
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    matmul_precision = torch.get_float32_matmul_precision()
    rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    environment, folder = dict(os.environ), os.getcwd()
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        with warnings.catch_warnings():  # entering and leaving also clears the once-per-place registries
            warnings.resetwarnings()
            for action, category, module in reversed(FRESH_INTERPRETER_FILTERS):
                warnings.filterwarnings(action, category=category, module=module or "")
            warnings._showwarnmsg_impl = lambda message: sys.stderr.write(warnings._formatwarnmsg(message))
            yield
    finally:
        os.chdir(folder)
        os.environ.clear()
        os.environ.update(environment)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        torch.set_float32_matmul_precision(matmul_precision)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.set_num_threads(threads)


def in_process(cli: Callable[[], object], argv: list, cwd: Optional[Path] = None,
               env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """A command's cli() (run_cli around its main) with sys.argv = argv, in this process: what it prints and the exit
    status it ends with, as subprocess.run(capture_output=True, text=True) would give them for the command line,
    without a fresh interpreter's three seconds of imports. For tests of behaviour; tests of signals, ranks and the
    launchers start real processes."""
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_argv = sys.argv
    sys.argv = [str(a) for a in argv]
    status: object = 0
    try:
        with as_a_fresh_process(), redirect_stdout(stdout), redirect_stderr(stderr):
            os.environ.update(env or {})
            if cwd is not None:
                os.chdir(cwd)
            cli()
    except SystemExit as ended:
        status = ended.code
    except Exception:  # the interpreter would print it and exit 1
        stderr.write(traceback.format_exc())
        status = 1
    finally:
        sys.argv = saved_argv
    code = status if isinstance(status, int) else (0 if status is None else 1)
    if isinstance(status, str):  # SystemExit("message") prints it, as the interpreter would
        stderr.write(status + "\n")
    return subprocess.CompletedProcess([str(a) for a in argv], code, stdout.getvalue(), stderr.getvalue())


@functools.lru_cache(maxsize=None)
def command_module(script: Path) -> Optional[str]:
    """The bertrecipe.cli module whose cli() a root script of the checkout runs (`from bertrecipe.cli.entry import
    X`, as every one of them does, runs bertrecipe.cli.X's), or None for any other file."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "bertrecipe.cli.entry" and len(node.names) == 1:
            return f"bertrecipe.cli.{node.names[0].name}"
    return None


def run_command(command: list, cwd: Optional[Path] = None, env: Optional[dict[str, str]] = None
                ) -> subprocess.CompletedProcess:
    """`[sys.executable, <script>, *flags]` as subprocess.run(command, env=ENV | env, capture_output=True,
    text=True) runs it: a root script of the checkout (command_module) in this process (in_process, with `env` set in
    os.environ meanwhile); any other command (torchrun, a test's own wrapper, a shell script) in a process of its
    own."""
    script = Path(str(command[1])).resolve() if len(command) > 1 else None
    module = (command_module(script) if command[0] == sys.executable and script is not None
              and script.is_relative_to(REPO_ROOT) else None)
    if module is None:
        return subprocess.run([str(part) for part in command], env={**ENV, **(env or {})}, capture_output=True,
                              text=True, cwd=cwd, timeout=600)
    return in_process(importlib.import_module(module).cli, command[1:], cwd=cwd, env=env)


def made_once_per_run(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder name, made by make(folder) once per test run: the first xdist worker to ask makes it under a lock
    while the others wait, then all read it (a worker stopped halfway leaves no folder marked complete)."""
    import fcntl  # POSIX alone, as the suite's other process tests

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, which every worker's own folder sits in
    folder, complete = base / name, base / f"{name}.complete"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            complete.touch()
    return folder
