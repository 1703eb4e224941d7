"""A pre-training run knows its inputs by content, not by name (issue 41, cases 1, 3 and 4): shards of the same
names but other contents are refused on resume, the tokenizer the shards record must fit the model, --vocab_file
and the checkpoint it starts from, and a tokenizer.json is taken wherever a vocab.txt is. Real shards from
tests/data's books through create_pretraining_data.py, the commands' main() in this process."""
import gzip
import hashlib
import json
import shutil

import h5py
import pytest
import torch
from safetensors.torch import save_file

from bertrecipe.cli import convert_checkpoint, create_pretraining_data, run_pretraining
from bertrecipe.common.errors import InputError
from bertrecipe.dataprep.vocab_training import train_bpe
from bertrecipe.pretraining.shard_schema import content_fingerprint
from bertrecipe.tokenization.bpe import load_bpe
from helpers import TEST_DATA, TINY, VOCAB_EXCERPT

SEQ, PREDS = 64, 10
HOLMES = TEST_DATA / "books" / "pg1661.txt"


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Two short excerpts of a book, as create_pretraining_data reads them (one sentence a line, blank lines
    between documents)."""
    root = tmp_path_factory.mktemp("texts")
    lines = HOLMES.read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "a.txt").write_text("".join(lines[:120]), encoding="utf-8")
    (root / "b.txt").write_text("".join(lines[120:240]), encoding="utf-8")
    return root


def make_shards(texts, folder, vocab=VOCAB_EXCERPT, *extra):
    """books_training_{0,1}.hdf5 in folder, made from a.txt and b.txt with `vocab` and the extra flags."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(("a.txt", "b.txt")):
        create_pretraining_data.main(["--input_file", str(texts / name), "--output_file",
                                      str(folder / f"books_training_{index}.hdf5"), "--vocab_file", str(vocab),
                                      "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PREDS),
                                      "--dupe_factor", "2", *map(str, extra)])
    return folder


def pretrain_flags(ws, data, *extra):
    return ["--input_dir", str(data), "--config_file", str(ws / "bert_config.json"), "--output_dir",
            str(ws / "out"), "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PREDS),
            "--train_batch_size", "4", "--learning_rate", "1e-3", "--do_train", "--disable_progress_bar",
            "--json-summary", str(ws / "out" / "log.json"), "--num_steps_per_checkpoint", "2", *map(str, extra)]


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "bert_config.json").write_text(json.dumps(TINY))
    return tmp_path


def files_of(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_resume_over_shards_of_the_same_names_but_other_contents_is_refused(texts, workspace, capsys):
    data = make_shards(texts, workspace / "data")
    run_pretraining.main(pretrain_flags(workspace, data, "--max_steps", 4, "--steps_this_run", 2))
    before = files_of(workspace / "out")
    # (A shard of the other casing is refused before this comparison: test_contradicting_inputs.py.)
    for other in (("--dupe_factor", 3), ("--random_seed", 7), ("--masked_lm_prob", 0.2)):
        # NVIDIA's layout: every shard folder holds books_training_<i>.hdf5; one was swapped for another's.
        make_shards(texts, workspace / "other", VOCAB_EXCERPT, *other)
        shutil.copyfile(workspace / "other" / "books_training_1.hdf5", data / "books_training_1.hdf5")
        with pytest.raises(InputError, match=r"ckpt_2\.pt: was trained on shards of the same names but other "
                                             r"contents .*1 of 2 differ, e\.g\. .*books_training_1\.hdf5"):
            run_pretraining.main(pretrain_flags(workspace, data, "--max_steps", 4, "--resume_from_checkpoint"))
        assert files_of(workspace / "out") == before
    make_shards(texts, data)  # the same shards made again: the same contents, so the run goes on
    run_pretraining.main(pretrain_flags(workspace, data, "--max_steps", 4, "--resume_from_checkpoint"))
    assert (workspace / "out" / "ckpt_4.pt").is_file()
    assert "compared with it by name only" not in capsys.readouterr().err


def rewrite_compressed(path):
    """The same arrays and attributes in a file laid out otherwise (gzip chunks): other bytes, same contents."""
    with h5py.File(path, "r") as f:
        arrays, attrs = {k: f[k][()] for k in f}, dict(f.attrs)
    path.unlink()
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value, compression="gzip", chunks=(7, *value.shape[1:]))
        f.attrs.update(attrs)


def test_the_fingerprint_is_of_the_contents_not_of_the_bytes(texts, tmp_path):
    data = make_shards(texts, tmp_path / "data")
    shard = data / "books_training_0.hdf5"
    before, raw = content_fingerprint(shard), hashlib.sha256(shard.read_bytes()).hexdigest()
    rewrite_compressed(shard)
    assert hashlib.sha256(shard.read_bytes()).hexdigest() != raw
    assert content_fingerprint(shard) == before
    with h5py.File(shard, "r+") as f:  # one token of the first rows changed
        ids = f["input_ids"][0]
        ids[1] = ids[1] + 1
        f["input_ids"][0] = ids
    assert content_fingerprint(shard) != before


def test_a_checkpoint_older_than_the_fingerprints_resumes_by_name_with_a_warning(texts, workspace, capsys):
    data = make_shards(texts, workspace / "data")
    run_pretraining.main(pretrain_flags(workspace, data, "--max_steps", 4, "--steps_this_run", 2))
    path = workspace / "out" / "ckpt_2.pt"
    ckpt = torch.load(path, weights_only=True)
    del ckpt["data"]["fingerprints"], ckpt["tokenizer"]
    torch.save(ckpt, path)
    capsys.readouterr()
    run_pretraining.main(pretrain_flags(workspace, data, "--max_steps", 4, "--resume_from_checkpoint"))
    err = capsys.readouterr().err
    assert f"warning: {path}: was written before checkpoints recorded their shards' contents" in err
    assert torch.load(workspace / "out" / "ckpt_4.pt", weights_only=True)["data"]["fingerprints"]


def other_vocab(tmp_path):
    """The excerpt with its last two tokens swapped: as large, another tokenizer (two words trade ids)."""
    tokens = VOCAB_EXCERPT.read_text(encoding="utf-8").splitlines()
    tokens[-1], tokens[-2] = tokens[-2], tokens[-1]
    path = tmp_path / "other_vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def test_checkpoints_record_the_shards_tokenizer_and_a_run_on_another_ones_shards_is_refused(texts, workspace):
    data = make_shards(texts, workspace / "data")
    run_pretraining.main(pretrain_flags(workspace, data, "--max_steps", 2))
    ckpt = torch.load(workspace / "out" / "ckpt_2.pt", weights_only=True)
    sha = hashlib.sha256(VOCAB_EXCERPT.read_bytes()).hexdigest()
    assert ckpt["tokenizer"] == {"kind": "wordpiece", "size": TINY["vocab_size"], "sha256": sha, "lower_case": True}
    other = make_shards(texts, workspace / "other", other_vocab(workspace))
    # Phase 2 on shards of another tokenizer; a new run from the checkpoint's weights on them.
    with pytest.raises(InputError, match=rf"books_training_0\.hdf5: its tokenizer \(wordpiece, .*\) is not the one "
                                         rf"of .*ckpt_2\.pt .*sha256 {sha[:12]}"):
        run_pretraining.main(pretrain_flags(workspace, other, "--max_steps", 2, "--phase2", "--phase1_end_step", 2,
                                            "--resume_from_checkpoint"))
    with pytest.raises(InputError, match=r"its tokenizer .* is not the one of .*ckpt_2\.pt"):
        run_pretraining.main([*pretrain_flags(workspace, other, "--max_steps", 2, "--init_checkpoint",
                                              workspace / "out" / "ckpt_2.pt"),
                              "--output_dir", str(workspace / "new")])
    assert not (workspace / "new").exists()
    # Shards of two tokenizers in one folder; a --vocab_file that is not the shards'.
    shutil.copyfile(other / "books_training_1.hdf5", data / "books_training_1.hdf5")
    with pytest.raises(InputError, match=r"books_training_1\.hdf5: was written with another tokenizer"):
        run_pretraining.main([*pretrain_flags(workspace, data, "--max_steps", 2),
                              "--output_dir", str(workspace / "new")])
    with pytest.raises(InputError, match=r"excerpt\.txt: its tokenizer .* is not the one of .*other/books_training_0"):
        run_pretraining.main([*pretrain_flags(workspace, other, "--max_steps", 2, "--dynamic_masking", "--vocab_file",
                                              VOCAB_EXCERPT), "--output_dir", str(workspace / "new")])
    assert not (workspace / "new").exists()


@pytest.fixture(scope="module")
def bpe_shards(texts, tmp_path_factory):
    """Document-chunk shards of a byte-level BPE tokenizer.json trained on the book (about 1,150 tokens: the
    merges the book's text supports, up to 2,048)."""
    root = tmp_path_factory.mktemp("bpe")
    tokenizer = train_bpe([HOLMES], root / "tokenizer.json", 2048)
    for index, name in enumerate(("a.txt", "b.txt")):
        create_pretraining_data.main(["--input_file", str(texts / name), "--output_file",
                                      str(root / "data" / f"books_training_{index}.hdf5"), "--vocab_file",
                                      str(tokenizer), "--max_seq_length", "128", "--document_chunks"])
    return root


def modern_config(path, vocab_size):
    config = json.loads((TEST_DATA.parent.parent / "bert_configs" / "modernbert-tiny.json").read_text())
    path.write_text(json.dumps({**config, "vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 48}))
    return path


def modern_flags(ws, data, config, *extra):
    return ["--input_dir", str(data), "--config_file", str(config), "--output_dir", str(ws / "out"),
            "--max_seq_length", "128", "--train_batch_size", "4", "--learning_rate", "1e-3", "--do_train",
            "--dynamic_masking", "--optimizer", "adamw", "--max_steps", "2", "--disable_progress_bar",
            "--json-summary", str(ws / "out" / "log.json"), *map(str, extra)]


def test_a_model_whose_embeddings_do_not_fit_the_shards_tokenizer_is_refused(bpe_shards, tmp_path, capsys):
    config = modern_config(tmp_path / "modern.json", 7872)
    with pytest.raises(InputError, match=r"books_training_0\.hdf5: its tokenizer has 1,[0-9]{3} tokens but the model "
                                         r"embeds 7,872 .*use the config \(vocab_size\) that fits"):
        run_pretraining.main(modern_flags(tmp_path, bpe_shards / "data", config))
    assert not (tmp_path / "out").exists()
    run_pretraining.main(modern_flags(tmp_path, bpe_shards / "data", config, "--allow_vocab_mismatch"))
    assert "going on (--allow_vocab_mismatch)" in capsys.readouterr().err


def test_a_tokenizer_json_is_a_vocab_file_for_dynamic_masking_and_conversion(bpe_shards, tmp_path):
    tokenizer = bpe_shards / "tokenizer.json"
    config = modern_config(tmp_path / "modern.json", len(load_bpe(tokenizer)))
    run_pretraining.main(modern_flags(tmp_path, bpe_shards / "data", config, "--vocab_file", tokenizer))
    ckpt = torch.load(tmp_path / "out" / "ckpt_2.pt", weights_only=True)
    assert ckpt["tokenizer"]["kind"] == "bpe"
    assert ckpt["tokenizer"]["sha256"] == hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    convert_checkpoint.main([str(tmp_path / "out" / "ckpt_2.pt"), str(tmp_path / "hf"), "--to", "huggingface",
                             "--vocab_file", str(tokenizer)])
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    assert not (tmp_path / "hf" / "vocab.txt").exists()
    with pytest.raises(InputError, match=r"whole_word_masking finds words by WordPiece's '##' pieces"):
        run_pretraining.main([*modern_flags(tmp_path, bpe_shards / "data", config, "--vocab_file", tokenizer,
                                            "--whole_word_masking"), "--output_dir", str(tmp_path / "new")])


def test_conversion_refuses_a_vocab_file_of_another_tokenizer_than_the_checkpoints(texts, workspace):
    data = make_shards(texts, workspace / "data")
    run_pretraining.main(pretrain_flags(workspace, data, "--max_steps", 2))
    with pytest.raises(InputError, match=r"other_vocab\.txt: its tokenizer .* is not the one of .*ckpt_2\.pt"):
        convert_checkpoint.main([str(workspace / "out" / "ckpt_2.pt"), str(workspace / "hf"), "--to", "huggingface",
                                 "--vocab_file", str(other_vocab(workspace))])
    assert not (workspace / "hf").exists()
    convert_checkpoint.main([str(workspace / "out" / "ckpt_2.pt"), str(workspace / "hf"), "--to", "huggingface",
                             "--vocab_file", str(VOCAB_EXCERPT)])
    assert (workspace / "hf" / "vocab.txt").read_bytes() == VOCAB_EXCERPT.read_bytes()


@pytest.mark.parametrize("text", ["\u200b\u200c\n\n\x01\x02\n", " \t\n\ufeff\n"])
def test_text_that_tokenizes_to_nothing_is_refused_like_an_empty_file(tmp_path, text):
    source = tmp_path / "blank.txt"
    source.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=rf"^{source}: input holds no text \(no line that tokenizes to a word piece"):
        create_pretraining_data.main(["--input_file", str(source), "--output_file", str(tmp_path / "out.hdf5"),
                                      "--vocab_file", str(VOCAB_EXCERPT)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blank.txt"]


def other_formats(folder):
    """Files of formats a user may pass by mistake, named as our readers should name them."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"a gzip-compressed file": folder / "data.json.gz", "an HDF5 file": folder / "shard.hdf5",
             "a zip archive (a torch checkpoint is one)": folder / "model.pt",
             "a safetensors file": folder / "model.safetensors"}
    files["a gzip-compressed file"].write_bytes(gzip.compress(b'{"data": []}'))
    with h5py.File(files["an HDF5 file"], "w") as f:
        f["input_ids"] = [[1, 2]]
    torch.save({"model": {}}, files["a zip archive (a torch checkpoint is one)"])
    save_file({"weight": torch.zeros(3)}, files["a safetensors file"])
    return files


@pytest.mark.parametrize("reader, expected", [
    ("squad", "not a SQuAD JSON file"), ("config", "not a BERT config file"), ("glue", "not a TSV file"),
    ("vocab", "not a vocab file")])
def test_a_file_of_another_format_is_named_as_what_its_bytes_say(tmp_path, reader, expected):
    """A gzip'd SQuAD file, a checkpoint given as the config, a shard as the vocab: each reader said `not UTF-8
    (byte 1)` or `malformed JSON`; the rule of issue 48 is that a wrong file is named as what it is."""
    from bertrecipe.finetuning.glue import read_tsv
    from bertrecipe.finetuning.squad import read_squad_file
    from bertrecipe.model.bert import BertConfig
    from bertrecipe.tokenization.vocab_files import load_vocab_file

    read = {"squad": read_squad_file, "config": BertConfig.from_json_file, "glue": read_tsv,
            "vocab": load_vocab_file}[reader]
    for kind, path in other_formats(tmp_path).items():
        with pytest.raises(InputError) as refused:
            read(path)
        assert str(refused.value) in (f"{path}: {kind}, {expected}", f"{path}: {kind}, not JSON"), str(refused.value)


def test_a_file_of_another_format_among_the_shards_is_named(tmp_path):
    from bertrecipe.pretraining.shard_schema import inspect_shard

    path = tmp_path / "books_training_0.hdf5"
    path.write_bytes(gzip.compress(b"not a shard"))
    with pytest.raises(InputError, match=rf"^{path}: a gzip-compressed file, not an HDF5 shard; move it out of"):
        inspect_shard(path, 100, 128)
