"""Task distillation's data augmentation (bertrecipe/distillation/augmentation.py, distillation/data_augmentation.py):
the candidates are the teacher's masked-LM top K as transformers computes them, the output is a plain-Python
reference's (unbatched, on transformers' BertForMaskedLM), words are replaced at the rate p, GLUE rows keep their
columns, labels and originals, SQuAD answers stay in their contexts under unique ids, a second call reuses the
output and a changed input remakes it, bad input is one line that writes nothing."""
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

from bertrecipe.cli import data_augmentation
from bertrecipe.common.stop_signals import stop_line
from bertrecipe.dataprep.vocab_training import train_bpe
from bertrecipe.distillation import augmentation
from bertrecipe.distillation.augmentation import AugmentationSettings, MaskedWordPredictor
from bertrecipe.finetuning import glue
from bertrecipe.finetuning import squad as squad_data
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.model.weights import export_huggingface, export_state_dict
from helpers import (
    ENV,
    EXCERPT,
    GLUE_EXCERPTS,
    REPO_ROOT,
    TEST_DATA,
    TINY_MODERN,
    VOCAB_EXCERPT,
    in_process,
    snapshot,
)

SCRIPT = REPO_ROOT / "distillation" / "data_augmentation.py"
VOCAB_SIZE = sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8"))
# A wide initialisation spreads the logits far apart: batched and unbatched runs (and transformers') rank alike.
TEACHER = {"vocab_size": VOCAB_SIZE, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
           "intermediate_size": 64, "max_position_embeddings": 128, "initializer_range": 1.0}
FEW = ["--N", "4", "--M", "5"]


def tiny_teacher_model() -> BertForPreTraining:
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TEACHER)).eval()
    with torch.no_grad():  # a bias of its own, so that a head that left it out would rank otherwise
        model.cls.predictions.bias.normal_(0.0, 1.0)
    return model


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A tiny BERT with its masked-LM head, as a transformers folder (config.json, model.safetensors, vocab.txt)."""
    folder = tmp_path_factory.mktemp("teacher")
    export_huggingface(tiny_teacher_model(), folder, vocab_file=VOCAB_EXCERPT)
    return folder


@pytest.fixture(scope="module")
def hf_masked_lm(teacher):
    import transformers

    return transformers.BertForMaskedLM.from_pretrained(teacher).eval()


def glue_dir(tmp_path: Path, *tasks: str) -> Path:
    root = tmp_path / "glue"
    for task in tasks:
        shutil.copytree(GLUE_EXCERPTS / task, root / task)
    return root


def augment(teacher: Path, root: Path, task: str, *extra: str):
    return in_process(data_augmentation.cli, [SCRIPT, "--pretrained_bert_model", teacher, "--glue_dir", root,
                                              "--task_name", task, *extra])


# ---------------------------------------------------------------------------------------------------------
# A plain-Python reference: one masked text at a time on transformers' model, the documented rules written anew
# ---------------------------------------------------------------------------------------------------------
def reference_words(text: str) -> list[tuple[int, int]]:
    # for these excerpts (no CJK, no control characters) BERT's basic tokens are runs of letters and digits, and
    # every other non-space character alone
    return [match.span() for match in re.finditer(r"[^\W_]+|\S", text)]


def plain(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")


def reference_candidates(model, tokenizer, text: str, spans, word: int, k: int, max_seq_length: int = 128,
                         with_original: bool = True, segments: bool = True) -> list[str]:
    pieces = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text[s:e])) for s, e in spans]
    before = [p for w in pieces[:word] for p in w]
    original = [p for w in pieces for p in w]
    masked = before + [tokenizer.mask_token_id] + [p for w in pieces[word + 1:] for p in w]
    window = (max_seq_length - 3) // 2 if with_original else max_seq_length - 2
    start = max(0, min(len(before) - window // 2, len(masked) - window))
    ids = [tokenizer.cls_token_id] + masked[start:start + window] + [tokenizer.sep_token_id]
    types = [0] * len(ids)
    if with_original:
        original_start = max(0, min(len(before) - window // 2, len(original) - window))
        second = original[original_start:original_start + window] + [tokenizer.sep_token_id]
        ids, types = ids + second, types + [1] * len(second)
    with torch.no_grad():
        given = {"token_type_ids": torch.tensor([types])} if segments else {}  # ModernBERT has none
        logits = model(input_ids=torch.tensor([ids]), **given).logits[0]
    word_text = text[spans[word][0]:spans[word][1]]
    ranked = tokenizer.convert_ids_to_tokens(logits[1 + len(before) - start].argsort(descending=True).tolist())
    chosen = [t for t in ranked if len(t) >= 2 and t.isalpha() and not any("CJK" in unicodedata.name(c, "") for c in t)
              and plain(t) != plain(word_text)][:k]
    return [t[0].upper() + t[1:] if word_text[0].isupper() else t for t in chosen]


def reference_copies(model, tokenizer, text: str, key: list[int], n: int, k: int, p: float) -> list[str]:
    spans = reference_words(text)
    replaceable = [j for j, (s, e) in enumerate(spans)
                   if text[s:e].isalpha() and text[s:e].lower() not in augmentation.STOP_WORDS]
    if not replaceable:
        return []
    candidates = [reference_candidates(model, tokenizer, text, spans, j, k) for j in replaceable]
    rng = np.random.default_rng(key)
    replace = rng.random((n, len(replaceable))) < p
    pick = rng.random((n, len(replaceable)))
    copies = [text]
    for row in range(n):
        words = [text[s:e] for s, e in spans]
        for column, j in enumerate(replaceable):
            if replace[row, column]:
                words[j] = candidates[column][int(pick[row, column] * len(candidates[column]))]
        new = "".join(text[spans[j - 1][1]:spans[j][0]] + w if j else text[:spans[0][0]] + w
                      for j, w in enumerate(words)) + text[spans[-1][1]:]
        if new not in copies:
            copies.append(new)
    return copies[1:]


def reference_train_aug(model, tokenizer, train: Path, task: glue.GlueTask, seed: int, n: int, k: int,
                        rows: int) -> str:
    lines = train.read_text(encoding="utf-8").split("\n")[:-1]
    header, rows = (lines[0], lines[1:rows + 1]) if task.has_header else (None, lines[:rows])
    out = [] if header is None else [header]
    for index, line in enumerate(rows):
        row = line.split("\t")
        out.append(line)
        columns = [task.text_a] if task.text_b is None else [task.text_a, task.text_b]
        for position, column in enumerate(columns):
            for text in reference_copies(model, tokenizer, row[column], [seed, index, position], n, k, 0.4):
                out.append("\t".join([*row[:column], text, *row[column + 1:]]))
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def hf_tokenizer():
    import transformers

    return transformers.BertTokenizer(str(VOCAB_EXCERPT), do_lower_case=True)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["SST-2", "MRPC", "CoLA"])
def test_the_augmented_file_is_the_plain_python_references(teacher, hf_masked_lm, hf_tokenizer, tmp_path, task):
    """Batched, windowed and drawn by the library, the file equals one made a masked text at a time on
    transformers' model with the documented draws; the same seed makes the same bytes again."""
    root = glue_dir(tmp_path, task)
    part = [*FEW, "--max_examples", "12"]
    done = augment(teacher, root, task, *part, "--seed", "7")
    assert done.returncode == 0, done.stderr
    made = (root / task / "train_aug.tsv").read_text(encoding="utf-8")
    spec = glue.get_task(task)
    assert made == reference_train_aug(hf_masked_lm, hf_tokenizer, root / task / "train.tsv", spec, 7, 4, 5, 12)
    again = augment(teacher, root, task, *part, "--seed", "7", "--output_file", tmp_path / "again.tsv")
    assert again.returncode == 0 and (tmp_path / "again.tsv").read_text(encoding="utf-8") == made
    other = augment(teacher, root, task, *part, "--seed", "8", "--output_file", tmp_path / "other.tsv")
    assert other.returncode == 0 and (tmp_path / "other.tsv").read_text(encoding="utf-8") != made


LONG = " ".join(["the film's quiet charm and its players carry a story that wanders"] * 6)


@pytest.mark.parametrize("with_original", [True, False])
@pytest.mark.parametrize("text", ["a charming and often affecting journey through cinematic history", LONG])
def test_candidates_are_the_masked_lms_top_k_as_transformers_computes_them(teacher, hf_masked_lm, hf_tokenizer,
                                                                          text, with_original):
    """Every replaceable word's K candidates are transformers' BertForMaskedLM's best whole words at its [MASK]
    (the unmasked text as second segment, or not; a long text as windows around the word)."""
    settings = AugmentationSettings(candidates=6, max_seq_length=32, with_original=with_original, batch_size=7)
    model = augmentation.load_masked_lm(teacher, None, load_tokenizer(VOCAB_EXCERPT, True).vocab, 32)
    predictor = MaskedWordPredictor(model, load_tokenizer(VOCAB_EXCERPT, True), settings)
    sentence = augmentation.sentence_of(text)
    [found] = predictor.candidates([sentence])
    spans = reference_words(text)
    assert list(sentence.spans) == spans and len(sentence.replaceable) >= 5
    expected = [reference_candidates(hf_masked_lm, hf_tokenizer, text, spans, j, 6, 32, with_original)
                for j in sentence.replaceable]
    assert found == expected and all(len(c) == 6 for c in found)


def test_a_modern_teacher_gives_the_candidates_transformers_gives(hf_tokenizer, tmp_path):
    """ModernBERT (no segments, local attention) with a WordPiece vocab: the candidates are transformers'
    ModernBertForMaskedLM's, and the command augments with it."""
    import transformers

    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        vocab_size=VOCAB_SIZE, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102, **TINY_MODERN))
    with torch.no_grad():  # weights far from their init: the logits far apart
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    folder = tmp_path / "modern"
    model.save_pretrained(folder)
    shutil.copyfile(VOCAB_EXCERPT, folder / "vocab.txt")
    tokenizer = load_tokenizer(VOCAB_EXCERPT, True)
    settings = AugmentationSettings(candidates=6, max_seq_length=64)
    predictor = MaskedWordPredictor(augmentation.load_masked_lm(folder, None, tokenizer.vocab, 64), tokenizer, settings)
    text = "a charming and often affecting journey through cinematic history"
    sentence = augmentation.sentence_of(text)
    [found] = predictor.candidates([sentence])
    expected = [reference_candidates(model.eval(), hf_tokenizer, text, list(sentence.spans), j, 6, 64, segments=False)
                for j in sentence.replaceable]
    assert found == expected
    root = glue_dir(tmp_path, "SST-2")
    done = augment(folder, root, "SST-2", *FEW, "--max_examples", "5")
    assert done.returncode == 0 and len(glue.read_tsv(root / "SST-2" / "train_aug.tsv")) > 5, done.stderr


@pytest.mark.parametrize("p", [0.1, 0.4, 0.9])
def test_words_are_replaced_at_the_rate_p(p):
    """Over 400 copies of a 50-word text (20,000 draws), the share of replaced words is p within 4 standard
    deviations; each replacement is one of the word's candidates."""
    text = " ".join(f"w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(50))
    sentence = augmentation.sentence_of(text)
    assert len(sentence.replaceable) == 50
    candidates = [[f"x{j}a", f"x{j}b", f"x{j}c"] for j in range(50)]
    settings = AugmentationSettings(copies=400, replace_probability=p)
    copies = augmentation.draw_copies(sentence, candidates, settings, np.random.default_rng([3, 0, 0]))
    rate = sum(len(edits) for edits in copies) / (400 * 50)
    assert abs(rate - p) < 4 * (p * (1 - p) / 20000) ** 0.5
    for edits in copies:
        for start, end, new in edits:
            assert new in candidates[sentence.spans.index((start, end))]


def test_numbers_punctuation_stop_words_and_protected_words_are_never_replaced():
    text = "In 1998, [SEP] Yucaipa's chain (Safeway) sold 3 stores; the answer stays 東京"
    sentence = augmentation.sentence_of(text, protected=[(text.index("answer"), text.index("answer") + 6)])
    replaced = [text[slice(*sentence.spans[j])] for j in sentence.replaceable]
    assert replaced == ["Yucaipa", "chain", "Safeway", "sold", "stores", "stays"]


def test_copies_keep_the_columns_labels_header_and_originals(teacher, tmp_path):
    """MRPC (a pair, a header with a byte-order mark): each original row, in order, then copies that differ from
    it in one sentence alone; every other column (the label) as it was; the GLUE reader reads the file."""
    root = glue_dir(tmp_path, "MRPC")
    done = augment(teacher, root, "MRPC", "--N", "3", "--glove_embs", "glove.840B.300d.txt")
    assert done.returncode == 0, done.stderr
    assert "warning: --glove_embs glove.840B.300d.txt: not read" in done.stderr
    train, made = root / "MRPC" / "train.tsv", root / "MRPC" / "train_aug.tsv"
    assert made.read_bytes().split(b"\n")[0] == train.read_bytes().split(b"\n")[0]  # the BOM too
    originals = glue.read_tsv(train)
    rows = glue.read_tsv(made)
    kept = [row for row in rows if row in originals]
    assert kept == originals and len(rows) > 2 * len(originals)
    current = None
    for row in rows:
        if row in originals:
            current = row
            continue
        changed = [i for i in range(5) if row[i] != current[i]]
        assert len(changed) == 1 and changed[0] in (3, 4)
    (tmp_path / "read").mkdir()
    shutil.copyfile(made, tmp_path / "read" / "train.tsv")
    examples = glue.read_examples(glue.get_task("mrpc"), tmp_path / "read", "train")
    assert len(examples) == len(rows)


def test_max_examples_augments_the_first_examples_alone(teacher, tmp_path):
    root = glue_dir(tmp_path, "SST-2")
    assert augment(teacher, root, "sst-2", *FEW, "--max_examples", "3").returncode == 0  # the folder is SST-2
    rows = glue.read_tsv(root / "SST-2" / "train_aug.tsv")
    first = glue.read_tsv(root / "SST-2" / "train.tsv")[:4]
    assert [row for row in rows if row in first] == first[:3] and len(rows) > 3


def squad_ids(data) -> list[str]:
    return [qa["id"] for article in data["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


@pytest.mark.parametrize("part", ["context", "question"])
@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_squad_copies_keep_every_answer_in_its_context_under_ids_of_their_own(teacher, tmp_path, part, version):
    """Contexts (NVIDIA's choice; answers never replaced, moved with the text) or questions: every answer is its
    text at its answer_start, ids are unique (`<id>_aug<k>`), every original question is there unchanged, and the
    file reads as training data with every question kept."""
    (tmp_path / "squad").mkdir()
    shutil.copyfile(EXCERPT / f"dev-v{version}.json", tmp_path / "squad" / f"train-v{version}.json")
    done = augment(teacher, tmp_path / "squad", f"SQuADv{version}", "--N", "3", "--squad_part", part)
    assert done.returncode == 0, done.stderr
    made = json.loads((tmp_path / "squad" / f"train-v{version}_aug.json").read_text(encoding="utf-8"))
    original = json.loads((EXCERPT / f"dev-v{version}.json").read_text(encoding="utf-8"))
    ids = squad_ids(made)
    assert len(ids) == len(set(ids)) > 2 * len(squad_ids(original))
    assert all(re.fullmatch(r".+_aug[123]", qid) for qid in set(ids) - set(squad_ids(original)))
    questions = {qa["id"]: qa for a in made["data"] for p in a["paragraphs"] for qa in p["qas"]}
    contexts = {p["context"] for a in made["data"] for p in a["paragraphs"]}
    for article in original["data"]:
        for paragraph in article["paragraphs"]:
            assert paragraph["context"] in contexts
            assert all(questions[qa["id"]] == qa for qa in paragraph["qas"])
    for article in made["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                for answer in qa["answers"] + qa.get("plausible_answers", []):
                    start = answer["answer_start"]
                    assert paragraph["context"][start:start + len(answer["text"])] == answer["text"]
    if part == "question":
        assert len(contexts) == sum(len(a["paragraphs"]) for a in original["data"])
    examples = squad_data.read_squad_examples(tmp_path / "squad" / f"train-v{version}_aug.json", is_training=True,
                                              version_2_with_negative=version == "2.0")
    assert len(examples) == len(ids)


def test_a_second_call_reuses_the_output_and_a_change_makes_it_again(teacher, tmp_path):
    root = glue_dir(tmp_path, "SST-2")
    made, train = root / "SST-2" / "train_aug.tsv", root / "SST-2" / "train.tsv"
    assert augment(teacher, root, "SST-2", *FEW).returncode == 0
    first = (made.read_bytes(), made.stat().st_mtime_ns)
    again = augment(teacher, root, "SST-2", *FEW)
    assert again.returncode == 0 and "complete, made before" in again.stdout and "reused" in again.stdout
    assert (made.read_bytes(), made.stat().st_mtime_ns) == first
    made.write_bytes(first[0][:-20])  # a damaged output is made again, whole
    remade = augment(teacher, root, "SST-2", *FEW)
    assert remade.returncode == 0 and "reused" not in remade.stdout and made.read_bytes() == first[0]
    other_p = augment(teacher, root, "SST-2", *FEW, "--p", "0.5")  # a flag
    assert other_p.returncode == 0 and "reused" not in other_p.stdout and made.read_bytes() != first[0]
    with_p = made.read_bytes()
    train.write_text(train.read_text(encoding="utf-8").replace("\t0\n", "\t1\n", 1), encoding="utf-8")
    new_train = augment(teacher, root, "SST-2", *FEW, "--p", "0.5")  # the train file
    assert new_train.returncode == 0 and "reused" not in new_train.stdout and made.read_bytes() != with_p


def test_every_teacher_format_gives_the_same_augmentation(teacher, tmp_path):
    """Ours (a .pt with its config), NVIDIA's (a bare state dict with its names, bert_config.json beside) and a
    transformers folder make the same file."""
    model = tiny_teacher_model()
    ours, nvidia = tmp_path / "ours", tmp_path / "nvidia"
    ours.mkdir()
    nvidia.mkdir()
    torch.save({"model": model.state_dict(), "config": model.config.to_dict()}, ours / "ckpt_8.pt")
    torch.save(export_state_dict(model, "nvidia"), nvidia / "pytorch_model.bin")
    (nvidia / "bert_config.json").write_text(json.dumps(model.config.to_dict()), encoding="utf-8")
    root = glue_dir(tmp_path, "SST-2")
    made = []
    for source in (teacher, ours / "ckpt_8.pt", nvidia):
        output = tmp_path / f"{source.name}.tsv"
        done = augment(source, root, "SST-2", *FEW, "--vocab_file", VOCAB_EXCERPT, "--output_file", output)
        assert done.returncode == 0, done.stderr
        made.append(output.read_bytes())
    assert made[0] == made[1] == made[2]


def encoder_without_head(folder: Path) -> Path:
    import transformers

    config = transformers.BertConfig(**{k: v for k, v in TEACHER.items() if k != "initializer_range"})
    transformers.BertModel(config).save_pretrained(folder)
    shutil.copyfile(VOCAB_EXCERPT, folder / "vocab.txt")
    return folder


BAD = {
    "unknown task": (["--task_name", "SST-3"], "--task_name 'SST-3': not a task"),
    "no task folder": (["--task_name", "RTE"], "RTE/train.tsv: no such file"),
    "no teacher": (["--pretrained_bert_model", "missing"], "missing: --pretrained_bert_model does not exist"),
    "no masked-LM head": (["--pretrained_bert_model", "{encoder}"], "has no masked-LM head"),
    "p above 1": (["--p", "1.5"], "--p 1.5: a probability"),
    "no copies": (["--N", "0"], "--N 0: must be at least 1"),
    "no candidates": (["--M", "0"], "--M 0: must be at least 1"),
    "too short": (["--max_seq_length", "5"], "--max_seq_length 5: must be at least 7"),
    "output onto the input": (["--output_file", "{root}/SST-2/train.tsv"], "--output_file is the same file"),
    "a row short of a column": (["--break_row"], "line 3 has 1 tab-separated columns, expected 2"),
    "a label of no class": (["--bad_label"], "label 'positive' is not one of 0, 1"),
    "malformed SQuAD": (["--task_name", "SQuADv1.1"], "malformed JSON"),
    "a byte-level BPE tokenizer": (["--vocab_file", "{bpe}"], "a byte-level BPE tokenizer; data augmentation works"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_writes_nothing(teacher, tmp_path, case):
    root = glue_dir(tmp_path, "SST-2")
    (root / "train-v1.1.json").write_text('{"data": [', encoding="utf-8")
    flags, expected = BAD[case]
    train = root / "SST-2" / "train.tsv"
    if "--break_row" in flags or "--bad_label" in flags:
        lines = train.read_text(encoding="utf-8").split("\n")
        lines[2] = lines[2].split("\t")[0] if "--break_row" in flags else lines[2].split("\t")[0] + "\tpositive"
        train.write_text("\n".join(lines), encoding="utf-8")
        flags = []
    made = {"encoder": lambda: encoder_without_head(tmp_path / "encoder"),
            "bpe": lambda: train_bpe([TEST_DATA / "books" / "pg11.txt"], tmp_path / "bpe" / "tokenizer.json", 300)}
    flags = [f.format(root=root, **{name: make() for name, make in made.items() if f"{{{name}}}" in f})
             for f in flags]
    before = snapshot(root)
    done = in_process(data_augmentation.cli, [SCRIPT, "--pretrained_bert_model", teacher, "--glue_dir", root,
                                              "--task_name", "SST-2", *flags])
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and expected in line, line
    assert snapshot(root) == before


@pytest.mark.slow
@pytest.mark.parametrize("sent, status, said", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                                (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_while_augmenting_is_one_line_and_leaves_nothing(teacher, tmp_path, sent, status, said):
    """Ctrl-C or SIGTERM while the masked LM runs and the output is half-written: one line, and the task folder
    as it was (no output, no temporary, no record)."""
    folder = tmp_path / "glue" / "SST-2"
    folder.mkdir(parents=True)
    lines = (GLUE_EXCERPTS / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (folder / "train.tsv").write_text("\n".join([lines[0], *lines[1:] * 100]) + "\n", encoding="utf-8")
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--pretrained_bert_model", str(teacher), "--glue_dir",
                                str(tmp_path / "glue"), "--task_name", "SST-2"], env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(folder.glob(".train_aug.tsv.*.tmp")):  # the output is being written: the masked LM runs
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.01)
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=120)
    assert (process.returncode, stderr.splitlines()) == (status, [stop_line(said)])
    assert [path.name for path in folder.iterdir()] == ["train.tsv"]
