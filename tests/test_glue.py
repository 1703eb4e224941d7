"""GLUE readers on the real task folders and on files laid out like the other tasks, features against a plain
reference of the original truncation and layout, and the metrics against plain-Python references."""
import math
import random
from pathlib import Path

import numpy as np
import pytest

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import glue
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from helpers import TEST_DATA

# Official example counts of the GLUE train/dev sets.
OFFICIAL_COUNTS = {
    "CoLA": ("cola", 8551, 1043),
    "SST-2": ("sst-2", 67349, 872),
    "MRPC": ("mrpc", 3668, 408),
    "RTE": ("rte", 2490, 277),
    "STS-B": ("sts-b", 5749, 1500),
    "QNLI": ("qnli", 104743, 5463),
    "QQP": ("qqp", 363846, 40430),
    "WNLI": ("wnli", 635, 71),
    "MNLI": ("mnli", 392702, 9815),  # dev = dev_matched
}
GLUE_EXCERPTS = TEST_DATA / "glue"


# Rows (train, dev) of the excerpts in tests/data/glue (see its README): 40 of each split.
EXCERPT_COUNTS = {folder: (name, 40, 40) for folder, (name, *_) in OFFICIAL_COUNTS.items()
                  if (GLUE_EXCERPTS / folder).is_dir()}


@pytest.fixture(scope="module")
def tokenizer(vocab_file):
    return BertTokenizer(load_vocab(vocab_file), do_lower_case=True)


def check_task_folders(root: Path, counts: dict[str, tuple[str, int, int]]) -> None:
    """Every task folder under root reads with the expected counts, texts and labels."""
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    assert folders
    for folder in folders:
        name, n_train, n_dev = counts[folder.name]
        task = glue.get_task(name)
        train = glue.read_examples(task, folder, "train")
        dev = glue.read_examples(task, folder, "dev")
        assert (len(train), len(dev)) == (n_train, n_dev), folder.name
        for example in train + dev:
            assert example.text_a.strip()
            assert (example.text_b is None) == (task.text_b is None)
            assert example.text_b is None or example.text_b.strip()
        if task.is_regression:
            assert all(0.0 <= e.label <= 5.0 for e in train + dev)
        else:
            assert {e.label for e in train} == set(task.labels)


def test_every_task_excerpt_reads_with_its_row_counts():
    assert set(EXCERPT_COUNTS) == {"CoLA", "SST-2", "MRPC", "RTE", "STS-B"}
    check_task_folders(GLUE_EXCERPTS, EXCERPT_COUNTS)


@pytest.mark.shared_data
def test_every_task_folder_reads_with_the_official_counts(shared_data):
    check_task_folders(shared_data / "glue", OFFICIAL_COUNTS)


def test_quotes_are_text_and_the_byte_order_mark_is_ignored():
    mrpc = glue.read_examples(glue.get_task("mrpc"), GLUE_EXCERPTS / "MRPC", "dev")
    assert mrpc[0].text_b.startswith('" The foodservice pie business')  # bare quote kept as text
    assert mrpc[0].label == "1"
    assert (GLUE_EXCERPTS / "MRPC" / "dev.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t")
    header_free = glue.read_tsv(GLUE_EXCERPTS / "MRPC" / "dev.tsv")
    assert len(header_free) == 40 and header_free[0][0] == "1"  # header with its BOM removed
    cola = glue.read_examples(glue.get_task("cola"), GLUE_EXCERPTS / "CoLA", "dev")
    assert cola[0].text_a == "The sailors rode the breeze clear of the rocks." and cola[0].label == "1"
    # CoLA's dev.tsv ends without a newline: its last row is still read, whole.
    assert not (GLUE_EXCERPTS / "CoLA" / "dev.tsv").read_bytes().endswith(b"\n")
    assert cola[-1].text_a == "John talked to Bill about himself." and len(cola) == 40
    cola_train = glue.read_examples(glue.get_task("cola"), GLUE_EXCERPTS / "CoLA", "train")
    assert cola_train[-1].text_a == 'Susan whispered "Shut up" at them.'  # quotes in a file without header


# Layouts of the GLUE files not present here, from the GLUE download (header, one row).
LAYOUTS = {
    ("qqp", "train"): (
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "7\t15\t16\tHow?\tWhy?\t1", ("How?", "Why?", "1")
    ),
    ("qqp", "test"): ("id\tquestion1\tquestion2", "0\tHow?\tWhy?", ("How?", "Why?", None)),
    ("qnli", "dev"): (
        "index\tquestion\tsentence\tlabel", "0\tWho?\tHe did.\tentailment", ("Who?", "He did.", "entailment")
    ),
    ("wnli", "train"): ("index\tsentence1\tsentence2\tlabel", "0\tA b.\tC d.\t0", ("A b.", "C d.", "0")),
    ("mnli", "train"): (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
        "0\t1\t1e\tgov\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tPremise.\tHypothesis.\tneutral\tneutral",
        ("Premise.", "Hypothesis.", "neutral"),
    ),
    ("mnli", "dev"): (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
        "0\t1\t1e\tgov\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tP.\tH.\t"
        "neutral\tentailment\tneutral\tneutral\tneutral\tneutral",
        ("P.", "H.", "neutral"),
    ),
    ("mnli-mm", "test"): (
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2",
        "0\t1\t1e\tgov\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tP.\tH.",
        ("P.", "H.", None),
    ),
    ("cola", "test"): ("index\tsentence", "0\tA sentence.", ("A sentence.", None, None)),
    ("sst-2", "test"): ("index\tsentence", "0\tit 's fine . ", ("it 's fine . ", None, None)),
    ("mrpc", "test"): ("index\t#1 ID\t#2 ID\t#1 String\t#2 String", "0\t1\t2\tOne .\tTwo .", ("One .", "Two .", None)),
    ("sts-b", "test"): (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2",
        "0\tnews\tf\t2012\t0\tnone\tnone\tS1.\tS2.", ("S1.", "S2.", None),
    ),
    ("rte", "test"): ("index\tsentence1\tsentence2", "0\tA.\tB.", ("A.", "B.", None)),
}


@pytest.mark.parametrize("task_name, split", list(LAYOUTS))
def test_every_task_layout(tmp_path, task_name, split):
    header, row, (a, b, label) = LAYOUTS[(task_name, split)]
    task = glue.get_task(task_name)
    path = glue.split_file(task, tmp_path, split)
    path.write_text("\ufeff" + header + "\n" + row + "\n", encoding="utf-8")  # with a byte-order mark
    [example] = glue.read_examples(task, tmp_path, split)
    assert (example.text_a, example.text_b, example.label) == (a, b, label)


def test_mnli_files_and_task_names():
    assert glue.split_file(glue.get_task("MNLI"), "d", "dev").name == "dev_matched.tsv"
    assert glue.split_file(glue.get_task("mnli-mm"), "d", "dev").name == "dev_mismatched.tsv"
    assert glue.get_task("STS-B").is_regression and glue.get_task("sts-b").num_labels == 1
    assert glue.get_task("mnli").num_labels == 3
    with pytest.raises(InputError, match="unknown GLUE task 'squad'"):
        glue.get_task("squad")


@pytest.mark.parametrize(
    "task_name, content, message",
    [
        ("rte", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n",
         "line 3 has 3 tab-separated columns, expected 4"),
        ("cola", "gj04\t1\t\tFine.\ngj04\t1\tOne \"quoted\"\ttab.\textra\n",
         "line 2 has 5 tab-separated columns, expected 4"),
        ("rte", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n", "line 2: label 'maybe' is not one of"),
        ("sts-b", "\t".join(["h"] * 10) + "\n" + "\t".join(["x"] * 9 + ["high"]) + "\n",
         "line 2: score 'high' is not a number"),
        ("sst-2", "", "empty file"),
        ("sst-2", b"sentence\tlabel\nd\xe9j\xe0\t1\n", "not UTF-8"),
    ],
)
def test_bad_tsv_is_an_input_error_naming_file_and_line(tmp_path, task_name, content, message):
    path = tmp_path / "train.tsv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as error:
        glue.read_examples(glue.get_task(task_name), tmp_path, "train")
    assert str(error.value).startswith(str(path)) and message in str(error.value)


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="dev.tsv: file not found"):
        glue.read_examples(glue.get_task("rte"), tmp_path, "dev")


# ---------------------------------------------------------------------------------------------------------
# Features
# ---------------------------------------------------------------------------------------------------------
def reference_truncate(a, b, max_total):
    a, b = list(a), list(b)
    while len(a) + len(b) > max_total:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def test_truncation_lengths_equal_the_pop_loop():
    rng = random.Random(0)
    for _ in range(3000):
        la, lb, total = rng.randint(0, 60), rng.randint(0, 60), rng.randint(0, 70)
        a, b = reference_truncate(range(la), range(lb), total)
        assert glue.truncate_pair_lengths(la, lb, total) == (len(a), len(b)), (la, lb, total)


@pytest.mark.parametrize(
    "folder, name, max_len, truncates",
    [("MRPC", "mrpc", 32, True), ("SST-2", "sst-2", 12, True), ("STS-B", "sts-b", 128, False)],
)
def test_features_equal_reference_layout(tokenizer, folder, name, max_len, truncates):
    task = glue.get_task(name)
    examples = [e for split in ("train", "dev") for e in glue.read_examples(task, GLUE_EXCERPTS / folder, split)]
    features = glue.glue_features(examples, task, tokenizer, max_len)
    assert features.input_ids.shape == (len(examples), max_len) and features.input_ids.dtype == np.int32
    full = 0
    for i, example in enumerate(examples):
        a = tokenizer.tokenize(example.text_a)
        if example.text_b is None:
            tokens = ["[CLS]"] + a[: max_len - 2] + ["[SEP]"]
            segments = [0] * len(tokens)
        else:
            a, b = reference_truncate(a, tokenizer.tokenize(example.text_b), max_len - 3)
            tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
            segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        full += len(tokens) == max_len
        n = len(tokens)
        assert [tokenizer.vocab.tokens[t] for t in features.input_ids[i, :n]] == tokens
        assert not features.input_ids[i, n:].any()
        assert features.input_mask[i].tolist() == [1] * n + [0] * (max_len - n)
        assert features.segment_ids[i].tolist() == segments + [0] * (max_len - n)
        if task.is_regression:
            assert features.labels[i] == np.float32(example.label)
        else:
            assert task.labels[features.labels[i]] == example.label
    assert (full > 0) == truncates  # the excerpt exercises truncation where max_len is short


def test_test_split_features_have_no_labels(tmp_path, tokenizer):
    (tmp_path / "test.tsv").write_text("index\tsentence1\tsentence2\n0\tA.\tB.\n", encoding="utf-8")
    task = glue.get_task("rte")
    features = glue.glue_features(glue.read_examples(task, tmp_path, "test"), task, tokenizer, 16)
    assert features.labels.tolist() == [-1]


# ---------------------------------------------------------------------------------------------------------
# Metrics against plain references
# ---------------------------------------------------------------------------------------------------------
def ref_pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def ref_ranks(x):
    # Rank = number of smaller values + the mean position among the equal ones.
    return [sum(v < a for v in x) + (sum(v == a for v in x) + 1) / 2 for a in x]


def ref_mcc_binary(preds, labels):
    tp = sum(p == 1 and y == 1 for p, y in zip(preds, labels, strict=True))
    tn = sum(p == 0 and y == 0 for p, y in zip(preds, labels, strict=True))
    fp = sum(p == 1 and y == 0 for p, y in zip(preds, labels, strict=True))
    fn = sum(p == 0 and y == 1 for p, y in zip(preds, labels, strict=True))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denominator == 0 else (tp * tn - fp * fn) / denominator


def ref_mcc_multiclass(preds, labels):
    # Pearson correlation of the one-hot encodings, summed over classes (Gorodkin's R_K).
    classes = sorted(set(preds) | set(labels))
    n = len(preds)
    cov = lambda u, v: sum(  # noqa: E731
        sum((u[s] == k) * (v[s] == k) for s in range(n)) / n
        - (sum(u[s] == k for s in range(n)) / n) * (sum(v[s] == k for s in range(n)) / n)
        for k in classes
    )
    denominator = math.sqrt(cov(preds, preds) * cov(labels, labels))
    return 0.0 if denominator == 0 else cov(preds, labels) / denominator


def test_metrics_equal_plain_references():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(5, 80))
        labels = rng.integers(0, 2, n)
        preds = np.where(rng.uniform(size=n) < 0.7, labels, 1 - labels)
        expected = ref_mcc_binary(preds.tolist(), labels.tolist())
        assert glue.matthews_corrcoef(preds, labels) == pytest.approx(expected, abs=1e-12)
        assert glue.accuracy(preds, labels) == pytest.approx(sum(preds == labels) / n)
        tp = sum((preds == 1) & (labels == 1))
        precision = tp / max(sum(preds == 1), 1)
        recall = tp / max(sum(labels == 1), 1)
        ref_f1 = 0.0 if tp == 0 else 2 * precision * recall / (precision + recall)
        assert glue.f1_binary(preds, labels) == pytest.approx(ref_f1, abs=1e-12)
        three = rng.integers(0, 3, n)
        guess = np.where(rng.uniform(size=n) < 0.5, three, rng.integers(0, 3, n))
        expected = ref_mcc_multiclass(guess.tolist(), three.tolist())
        assert glue.matthews_corrcoef(guess, three) == pytest.approx(expected, abs=1e-12)
        # Scores on a 0-5 grid (many ties), like STS-B.
        x = np.round(rng.uniform(0, 5, n) * 4) / 4
        y = np.round((x + rng.normal(0, 1, n)).clip(0, 5) * 2) / 2
        assert glue.pearson(x, y) == pytest.approx(ref_pearson(x.tolist(), y.tolist()), abs=1e-12)
        assert glue.average_ranks(y).tolist() == ref_ranks(y.tolist())
        expected = ref_pearson(ref_ranks(x.tolist()), ref_ranks(y.tolist()))
        assert glue.spearman(x, y) == pytest.approx(expected, abs=1e-12)


def test_metric_edge_cases():
    assert glue.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # constant prediction
    assert glue.matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert glue.matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
    assert glue.f1_binary([0, 0], [1, 0]) == 0.0
    assert glue.spearman([1, 2, 3, 4], [10, 20, 30, 100]) == pytest.approx(1.0)


def test_compute_metrics_per_task():
    labels, preds = np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1])
    assert set(glue.compute_metrics("cola", preds, labels)) == {"mcc"}
    mrpc = glue.compute_metrics("mrpc", preds, labels)
    assert mrpc["acc"] == 0.75 and mrpc["f1"] == pytest.approx(0.8) and mrpc["acc_and_f1"] == pytest.approx(0.775)
    assert set(glue.compute_metrics("qqp", preds, labels)) == {"acc", "f1", "acc_and_f1"}
    for name in ("sst-2", "mnli", "mnli-mm", "qnli", "rte", "wnli"):
        assert glue.compute_metrics(name, preds, labels) == {"acc": 0.75}
    sts = glue.compute_metrics("sts-b", np.array([0.5, 2.0, 4.5, 3.0]), np.array([1.0, 2.0, 5.0, 2.5]))
    assert set(sts) == {"pearson", "spearmanr", "corr"}
    assert sts["corr"] == pytest.approx((sts["pearson"] + sts["spearmanr"]) / 2)


def test_max_seq_length_must_keep_a_token_of_every_sentence(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie", "plot"]) + "\n")
    tokenizer = BertTokenizer(load_vocab(vocab), do_lower_case=True)
    single, pair = glue.get_task("sst-2"), glue.get_task("rte")
    one = [glue.GlueExample("0", "the movie", None, "1")]
    two = [glue.GlueExample("0", "the movie", "the plot", "entailment")]
    assert glue.glue_features(one, single, tokenizer, 3).input_ids.tolist() == [[2, 5, 3]]
    assert glue.glue_features(two, pair, tokenizer, 5).input_ids.tolist() == [[2, 5, 3, 5, 3]]
    with pytest.raises(InputError, match="max_seq_length 2 is too short for sst-2: it needs at least 3"):
        glue.glue_features(one, single, tokenizer, 2)
    with pytest.raises(InputError, match="max_seq_length 4 is too short for rte: it needs at least 5"):
        glue.glue_features(two, pair, tokenizer, 4)  # would drop the second sentence whole
