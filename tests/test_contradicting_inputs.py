"""A vocab, tokenizer, casing or checkpoint that contradicts another input is refused before work starts (issue 48,
trials 3 to 5): data prep refuses a casing its vocab contradicts, pre-training refuses shards whose recorded casing
contradicts the vocab or the checkpoint it starts from, a released folder's vocab is compared with the shards'
tokenizer, and a folder without pre-training heads says, a line a head, which heads start at random. Shards from
tests/data's books through create_pretraining_data.py, tiny models saved by transformers, the commands' main() in
this process (run_command for the one-line errors and exit statuses)."""
import json
import re
import shutil
import sys

import h5py
import pytest
import torch
import transformers

from bertrecipe.cli import bert_prep, create_pretraining_data, run_pretraining
from bertrecipe.common.errors import InputError
from bertrecipe.dataprep import layout
from bertrecipe.tokenization.wordpiece import load_vocab, vocab_casing
from helpers import REPO_ROOT, TEST_DATA, TINY, TINY_MODERN, VOCAB_EXCERPT, run_command, write_formatted

SEQ, PREDS = 64, 10
HOLMES = TEST_DATA / "books" / "pg1661.txt"
KINDS = {"sentence pairs": [], "document chunks": ["--document_chunks"]}
ALLOW = "--allow_vocab_mismatch"


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Two short excerpts of a book, one sentence a line, blank lines between documents."""
    root = tmp_path_factory.mktemp("texts")
    lines = HOLMES.read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "a.txt").write_text("".join(lines[:120]), encoding="utf-8")
    (root / "b.txt").write_text("".join(lines[120:240]), encoding="utf-8")
    return root


def shard_argv(text, out, vocab, *extra):
    return ["--input_file", str(text), "--output_file", str(out), "--vocab_file", str(vocab), "--max_seq_length",
            str(SEQ), "--max_predictions_per_seq", str(PREDS), "--dupe_factor", "2", *map(str, extra)]


def make_shards(texts, folder, vocab=VOCAB_EXCERPT, *extra):
    """books_training_{0,1}.hdf5 in folder, from a.txt and b.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(("a.txt", "b.txt")):
        create_pretraining_data.main(shard_argv(texts / name, folder / f"books_training_{index}.hdf5", vocab,
                                                *extra))
    return folder


def cased_vocab(path):
    """The excerpt with one word token in 20 capitalised: a vocab whose tokens say it is cased."""
    tokens = VOCAB_EXCERPT.read_text(encoding="utf-8").splitlines()
    words = [i for i, token in enumerate(tokens) if token.isalpha() and token.islower()]
    for i in words[::20]:
        tokens[i] = tokens[i].capitalize()
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    assert vocab_casing(load_vocab(path)) == "cased"
    return path


def reordered_vocab(path, moved=1000):
    """The excerpt with `moved` of its word tokens rotated by one place: as large, another tokenizer."""
    tokens = VOCAB_EXCERPT.read_text(encoding="utf-8").splitlines()
    start = tokens.index("the")
    block = tokens[start:start + moved]
    tokens[start:start + moved] = block[1:] + block[:1]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def pretrain_flags(out, data, config, *extra):
    return ["--input_dir", str(data), "--config_file", str(config), "--output_dir", str(out), "--max_seq_length",
            str(SEQ), "--max_predictions_per_seq", str(PREDS), "--train_batch_size", "4", "--learning_rate", "1e-3",
            "--do_train", "--max_steps", "2", "--disable_progress_bar", "--no_compile_optimizer", "--json-summary",
            str(out / "log.json"), *map(str, extra)]


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(TINY))
    return path


def released_folder(folder, model_class=transformers.BertForPreTraining, vocab_name="vocab.txt", vocab=VOCAB_EXCERPT):
    """A tiny BERT as transformers saves a released one (config.json, model.safetensors) with the vocab given as
    vocab.txt or as the tokenizer.json transformers writes for it (vocab_name None: no vocab at all)."""
    torch.manual_seed(0)
    bert_config = {key: value for key, value in TINY.items() if key != "vocab_size"}
    model_class(transformers.BertConfig(vocab_size=TINY["vocab_size"], **bert_config)).save_pretrained(folder)
    if vocab_name is not None:
        source = folder / "source"
        source.mkdir()
        shutil.copyfile(vocab, source / "vocab.txt")
        transformers.BertTokenizerFast.from_pretrained(source, do_lower_case=True).save_pretrained(source)
        shutil.copyfile(source / vocab_name, folder / vocab_name)
        shutil.rmtree(source)
    return folder


# ---------------------------------------------------------------- 3. casing in data prep
def bert_prep_argv(vocab, kind, *extra):
    return ["--action", "create_hdf5_files", "--dataset", "bookscorpus", "--n_training_shards", "1",
            "--n_test_shards", "1", "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PREDS),
            "--dupe_factor", "1", "--n_processes", "1", "--vocab_file", str(vocab), *KINDS[kind], *extra]


@pytest.fixture
def prep_dir(tmp_path, monkeypatch):
    """A bertPrep working folder holding the formatted and sharded excerpt of the book."""
    paragraphs = [" ".join(p.split()) for p in HOLMES.read_text(encoding="utf-8").split("\n\n")[:60]]
    write_formatted([" ".join(paragraphs[i:i + 6]) for i in range(0, len(paragraphs), 6)],
                    layout.formatted_text(tmp_path, "bookscorpus"))
    monkeypatch.setenv("BERT_PREP_WORKING_DIR", str(tmp_path))
    bert_prep.main(["--action", "sharding", "--dataset", "bookscorpus", "--n_training_shards", "1",
                    "--n_test_shards", "1"])
    return tmp_path


@pytest.mark.parametrize("kind", KINDS)
def test_data_prep_refuses_a_casing_that_contradicts_the_vocab_before_any_write(texts, prep_dir, kind, capsys):
    out = prep_dir / "out.hdf5"
    cased = cased_vocab(prep_dir / "cased_vocab.txt")
    refusals = [  # (the command, the vocab, the casing flag, words of the fix)
        (create_pretraining_data, VOCAB_EXCERPT, ["--no-do_lower_case"], "drop --no-do_lower_case"),
        (create_pretraining_data, cased, [], "pass --no-do_lower_case"),
        (bert_prep, VOCAB_EXCERPT, ["--do_lower_case", "0"], "--do_lower_case 1"),
        (bert_prep, cased, [], "--do_lower_case 0"),
    ]
    for command, vocab, flags, fix in refusals:
        argv = (shard_argv(texts / "a.txt", out, vocab, *KINDS[kind], *flags) if command is create_pretraining_data
                else bert_prep_argv(vocab, kind, *flags))
        refusal = rf"^{re.escape(str(vocab))}: the vocab is (un)?cased .*{fix}.* \(or {ALLOW} to go on\)$"
        with pytest.raises(InputError, match=refusal):
            command.main(argv)
        assert not out.exists() and not list(prep_dir.glob("hdf5_*"))
    # The override: one warning, and the shard records the casing it was made with.
    create_pretraining_data.main(shard_argv(texts / "a.txt", out, VOCAB_EXCERPT, *KINDS[kind], "--no-do_lower_case",
                                            ALLOW))
    [warning] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warning == (f"warning: {VOCAB_EXCERPT}: the vocab is uncased (next to none of its tokens is capitalised) "
                       "but the text keeps its case (--no-do_lower_case, bertPrep.py's --do_lower_case 0): every "
                       f"capitalised word would become [UNK]; going on ({ALLOW})")
    with h5py.File(out, "r") as f:
        assert int(f.attrs["do_lower_case"]) == 0


def test_the_casing_refusal_is_one_line_and_exit_2(texts, tmp_path):
    done = run_command([sys.executable, REPO_ROOT / "data" / "create_pretraining_data.py",
                        *shard_argv(texts / "a.txt", tmp_path / "out.hdf5", VOCAB_EXCERPT, "--no-do_lower_case")])
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: {VOCAB_EXCERPT}: the vocab is uncased") and "[UNK]" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 3. casing in pre-training
@pytest.fixture(scope="module")
def shards(texts, tmp_path_factory):
    """Lower-cased shards, and shards that kept the case with the uncased excerpt (made with the override, as data
    prep made them before it refused the pair)."""
    root = tmp_path_factory.mktemp("shards")
    return {"lower": make_shards(texts, root / "lower"),
            "kept": make_shards(texts, root / "kept", VOCAB_EXCERPT, "--no-do_lower_case", ALLOW),
            "reordered": make_shards(texts, root / "reordered", reordered_vocab(root / "reordered_vocab.txt"))}


@pytest.fixture(scope="module")
def lower_checkpoint(shards, tmp_path_factory):
    """ckpt_2.pt of a run on the lower-cased shards."""
    root = tmp_path_factory.mktemp("lower_run")
    (root / "bert_config.json").write_text(json.dumps(TINY))
    run_pretraining.main(pretrain_flags(root / "out", shards["lower"], root / "bert_config.json"))
    return root / "out" / "ckpt_2.pt"


def test_checkpoints_record_the_casing_of_their_shards(lower_checkpoint):
    assert torch.load(lower_checkpoint, weights_only=True)["tokenizer"]["lower_case"] is True


def test_pretraining_refuses_shards_whose_casing_contradicts_the_vocab_or_the_checkpoint(shards, lower_checkpoint,
                                                                                         config, tmp_path):
    kept, out = shards["kept"] / "books_training_0.hdf5", tmp_path / "out"
    folder = released_folder(tmp_path / "released")
    cases = [  # (extra flags, the other side named, what it says)
        (["--dynamic_masking", "--vocab_file", VOCAB_EXCERPT], VOCAB_EXCERPT, "is uncased"),
        (["--init_checkpoint", folder], folder / "vocab.txt", "is uncased"),
        (["--init_checkpoint", lower_checkpoint], lower_checkpoint, "was trained on lower-cased text"),
    ]
    for extra, other, says in cases:
        with pytest.raises(InputError, match=rf"^{re.escape(str(kept))}: was made from text that keeps its case "
                                             rf"\(do_lower_case 0\), but {re.escape(str(other))} {says}.*\(or {ALLOW} "
                                             r"to go on\)$"):
            run_pretraining.main(pretrain_flags(out, shards["kept"], config, *extra))
        assert not out.exists()
    # Phase 2 from the lower-cased run's checkpoint, on the shards that kept the case.
    phase1 = tmp_path / "phase1"
    shutil.copytree(lower_checkpoint.parent, phase1)
    before = sorted(p.name for p in phase1.iterdir())
    with pytest.raises(InputError, match=rf"^{re.escape(str(kept))}: .* but {re.escape(str(phase1 / 'ckpt_2.pt'))} was "
                                         "trained on lower-cased text"):
        run_pretraining.main(pretrain_flags(phase1, shards["kept"], config, "--phase2", "--phase1_end_step", "2",
                                            "--resume_from_checkpoint"))
    assert sorted(p.name for p in phase1.iterdir()) == before


def test_shards_of_two_casings_in_one_folder_are_refused(shards, config, tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copyfile(shards["lower"] / "books_training_0.hdf5", mixed / "books_training_0.hdf5")
    shutil.copyfile(shards["kept"] / "books_training_1.hdf5", mixed / "books_training_1.hdf5")
    first, second = (re.escape(str(mixed / f"books_training_{i}.hdf5")) for i in (0, 1))
    with pytest.raises(InputError, match=rf"^{second}: was made from text that keeps its case \(do_lower_case 0\), but "
                                         rf"{first} was made from lower-cased text"):
        run_pretraining.main(pretrain_flags(tmp_path / "out", mixed, config))
    assert not (tmp_path / "out").exists()


def test_the_override_warns_and_old_shards_without_the_record_still_run(shards, config, tmp_path, capsys):
    folder = released_folder(tmp_path / "released")
    run_pretraining.main(pretrain_flags(tmp_path / "out", shards["kept"], config, "--init_checkpoint", folder, ALLOW))
    err = capsys.readouterr().err
    assert f"warning: {shards['kept'] / 'books_training_0.hdf5'}: was made from text that keeps its case" in err
    assert (tmp_path / "out" / "ckpt_2.pt").is_file()
    old = shutil.copytree(shards["kept"], tmp_path / "old")
    for shard in old.iterdir():
        with h5py.File(shard, "r+") as f:
            del f.attrs["do_lower_case"]  # as shards written before the attribute
    run_pretraining.main(pretrain_flags(tmp_path / "out2", old, config, "--dynamic_masking", "--vocab_file",
                                        VOCAB_EXCERPT))
    assert "keeps its case" not in capsys.readouterr().err
    assert "lower_case" not in torch.load(tmp_path / "out2" / "ckpt_2.pt", weights_only=True)["tokenizer"]


# ---------------------------------------------------------------- 4. the released folder's vocab
@pytest.mark.parametrize("vocab_name", ["vocab.txt", "tokenizer.json"])
def test_a_released_folder_refuses_shards_of_another_vocab_of_the_same_size(shards, config, tmp_path, vocab_name):
    folder = released_folder(tmp_path / "released", vocab_name=vocab_name)
    out = tmp_path / "out"
    shard = shards["reordered"] / "books_training_0.hdf5"
    with pytest.raises(InputError, match=rf"^{re.escape(str(shard))}: its tokenizer \(wordpiece, 8,960 tokens, sha256 "
                                         rf"[0-9a-f]{{12}}\) is not the one of {re.escape(str(folder / vocab_name))} "
                                         r"\(wordpiece, 8,960 tokens, sha256 [0-9a-f]{12}\)"):
        run_pretraining.main(pretrain_flags(out, shards["reordered"], config, "--init_checkpoint", folder))
    assert not out.exists()
    run_pretraining.main(pretrain_flags(out, shards["lower"], config, "--init_checkpoint", folder))  # its own vocab


def test_our_checkpoint_refuses_shards_of_a_reordered_vocab(shards, lower_checkpoint, config, tmp_path):
    with pytest.raises(InputError, match=rf"its tokenizer .* is not the one of {re.escape(str(lower_checkpoint))}"):
        run_pretraining.main(pretrain_flags(tmp_path / "out", shards["reordered"], config, "--init_checkpoint",
                                            lower_checkpoint))
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_vocab_is_one_warning_that_the_shards_tokenizer_is_taken(shards, config, tmp_path,
                                                                                   capsys):
    folder = released_folder(tmp_path / "released", vocab_name=None)
    run_pretraining.main(pretrain_flags(tmp_path / "out", shards["reordered"], config, "--init_checkpoint", folder))
    [line] = [line for line in capsys.readouterr().err.splitlines() if "no vocab" in line]
    assert line.startswith(f"warning: {folder}: holds no vocab.txt or tokenizer.json and records no tokenizer: "
                           "nothing to compare the run's tokenizer (wordpiece, 8,960 tokens")
    record = torch.load(tmp_path / "out" / "ckpt_2.pt", weights_only=True)["tokenizer"]
    assert record["sha256"] == load_vocab(shards["reordered"].parent / "reordered_vocab.txt").sha256


# ---------------------------------------------------------------- the checkpoint's config
def test_a_checkpoint_whose_config_computes_otherwise_is_refused_naming_both_files(shards, config, tmp_path):
    folder = released_folder(tmp_path / "released")
    saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**saved, "hidden_act": "relu", "layer_norm_eps": 1e-5}))
    both = f"{folder}: its config differs from {config}"
    with pytest.raises(InputError, match=rf"^{re.escape(both)} in what the weights compute \(hidden_act relu -> gelu; "
                                         r"layer_norm_eps 1e-05 -> 1e-12\); pass the checkpoint's own config as "
                                         "--config_file$"):
        run_pretraining.main(pretrain_flags(tmp_path / "out", shards["lower"], config, "--init_checkpoint", folder))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 5. heads that start at random
MLM = "no masked-LM head (cls.predictions.bias, cls.predictions.transform.*): it starts at random"
NSP = "no next-sentence head (cls.seq_relationship.*): it starts at random"
MASKED_LM_NOTE = ("; the decoder is the word embeddings (tied), so only the transform and the output bias are new, "
                  "and the first losses can exceed ln(vocab_size), a uniform guess's")


@pytest.mark.parametrize("model_class, flags, expected", [
    (transformers.BertModel, [], [MLM, NSP]),
    (transformers.BertModel, ["--no_nsp"], [MLM]),  # the NSP head is frozen and unused
    (transformers.BertForSequenceClassification, [],
     [MLM, NSP, "2 weights the model has no place for are dropped: classifier.bias, classifier.weight"]),
    (transformers.BertForPreTraining, [], []),
])
def test_a_folder_without_pretraining_heads_names_each_head_that_starts_at_random(shards, config, tmp_path, capsys,
                                                                                  model_class, flags, expected):
    folder = released_folder(tmp_path / "released", model_class)
    run_pretraining.main(pretrain_flags(tmp_path / "out", shards["lower"], config, "--init_checkpoint", folder, *flags))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"warning: {folder}: ")]
    assert [line.removeprefix(f"warning: {folder}: ") for line in lines] == [
        text + MASKED_LM_NOTE if text == MLM else text for text in expected]


@pytest.mark.parametrize("model_class, expected", [(transformers.ModernBertModel, 1),
                                                   (transformers.ModernBertForMaskedLM, 0)])
def test_a_modern_folder_without_its_masked_lm_head_says_so(texts, tmp_path, capsys, model_class, expected):
    chunks = make_shards(texts, tmp_path / "chunks", VOCAB_EXCERPT, "--document_chunks")
    folder = tmp_path / "modern"
    torch.manual_seed(0)
    model_class(transformers.ModernBertConfig(vocab_size=TINY["vocab_size"], bos_token_id=101, eos_token_id=102,
                                              cls_token_id=101, sep_token_id=102, **TINY_MODERN)
                ).save_pretrained(folder)
    shutil.copyfile(VOCAB_EXCERPT, folder / "vocab.txt")
    run_pretraining.main(pretrain_flags(tmp_path / "out", chunks, folder / "config.json", "--init_checkpoint", folder,
                                        "--dynamic_masking", "--optimizer", "adamw"))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"warning: {folder}: ")]
    assert lines == [f"warning: {folder}: no masked-LM head (decoder.bias, head.*): it starts at random"
                     + MASKED_LM_NOTE][:expected]


# ---------------------------------------------------------------- the released MiniLM (integration tier)
def test_the_released_minilm_refuses_shards_of_its_vocab_reordered_and_names_its_missing_heads(shared_data, texts,
                                                                                             tmp_path, capsys):
    minilm = shared_data / "minilm"
    tokens = (minilm / "vocab.txt").read_text(encoding="utf-8").splitlines()
    start = tokens.index("the")
    tokens[start:start + 1000] = tokens[start + 1:start + 1000] + tokens[start:start + 1]  # 1,000 entries reordered
    (tmp_path / "reordered.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    reordered = make_shards(texts, tmp_path / "reordered", tmp_path / "reordered.txt")
    flags = ["--init_checkpoint", minilm, "--max_steps", "1", "--skip_checkpoint"]
    with pytest.raises(InputError, match=rf"its tokenizer \(wordpiece, 30,522 tokens, .*\) is not the one of "
                                         rf"{re.escape(str(minilm / 'vocab.txt'))}"):
        run_pretraining.main(pretrain_flags(tmp_path / "out", reordered, minilm / "config.json", *flags))
    assert not (tmp_path / "out").exists()
    own = make_shards(texts, tmp_path / "own", minilm / "vocab.txt")
    capsys.readouterr()
    run_pretraining.main(pretrain_flags(tmp_path / "out", own, minilm / "config.json", *flags))
    err = capsys.readouterr().err
    assert f"warning: {minilm}: {MLM}{MASKED_LM_NOTE}\n" in err and f"warning: {minilm}: {NSP}\n" in err
