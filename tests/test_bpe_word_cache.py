"""tokenization/bpe.py's SpacedWordEncoder gives a tokenizer.json's own ids (tokenizers' encode_batch, the oracle)
for any text, fuzzed over ASCII, other scripts, marks, numbers, emoji, control characters and every kind of
whitespace, through its word cache where the tokenizer allows it and whole texts where it does not; word_rule
tells which tokenizer.json allows what. load_bpe ignores a tokenizer.json's truncation and padding."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertrecipe.dataprep.bpe_tokenizer import bpe_documents
from bertrecipe.dataprep.vocab_training import train_bpe
from bertrecipe.tokenization.bpe import ASCII_WORDS, WHOLE_TEXTS, WORDS, SpacedWordEncoder, load_bpe
from helpers import TEST_DATA

PIECES = [chr(b) for b in range(128)] + [
    "the", "The", " a", "don't", "it's", "'ll", "'S", "123", "4.5", "é", "naïve", "e\u0301", "Ж", "日本語", "。",
    "٣", "½", "²", "Ⅻ", "🙂", "[SEP]", "[MASK]", "|||IP|||", "\u00a0", "\u3000", "\u2028", "\u0085", "\x1c",
    "\u180e", "\u200b", "\ufeff", "  ", "\t", "\n", "a b", "xyz", "xyz ", "a\tb"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
SINGLE_SPACED = TEXTS.map(lambda text: " ".join(text.split()))
# Where each variant's added token or setting acts, besides what the fuzzing draws.
CASES = ["xyz abc", "the xyz abc", "the a b c", "a\tb c", "x |||IP||| y", "Hello world. It's 2026!", " lead",
         "trail ", "two  spaces", "naïve café 日本語 🙂 [SEP]"]


@pytest.fixture(scope="module")
def bpe_json(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer.json trained on the book excerpts, as bertPrep trains one."""
    return train_bpe(sorted((TEST_DATA / "books").glob("*.txt")), tmp_path_factory.mktemp("bpe") / "tokenizer.json",
                     1000)


def variant(bpe_json: Path, folder: Path, change) -> Path:
    """A copy of the tokenizer.json with change(data) applied."""
    data = json.loads(bpe_json.read_text(encoding="utf-8"))
    change(data)
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def added(content: str, **options):
    token = {"id": None, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False, **options}

    def change(data):
        token["id"] = len(data["model"]["vocab"]) + len(data["added_tokens"])
        data["added_tokens"].append(token)
    return change


def set_prefix_space(data):
    data["pre_tokenizer"]["add_prefix_space"] = True


def set_lowercase(data):
    data["normalizer"] = {"type": "Lowercase"}


VARIANTS = {  # name: (change, the word rule it must get)
    "as trained": (lambda data: None, ASCII_WORDS),
    "a space added in front": (set_prefix_space, WORDS),
    "an added token without spaces": (added("|||IP|||"), WORDS),
    "an added token of a tab": (added("a\tb"), WORDS),
    "an added token spanning a space": (added("a b"), WHOLE_TEXTS),
    "an added token taking the space after it": (added("xyz", rstrip=True), WHOLE_TEXTS),
    "a normalizer": (set_lowercase, WHOLE_TEXTS),
}


def oracle(vocab, texts: list[str]) -> tuple[list[int], list[int]]:
    encodings = vocab.tokenizer.encode_batch(texts, add_special_tokens=False)
    return [i for e in encodings for i in e.ids], [len(e.ids) for e in encodings]


@pytest.mark.parametrize("name", VARIANTS)
def test_each_tokenizer_gets_its_word_rule(bpe_json, tmp_path, name):
    change, rule = VARIANTS[name]
    assert load_bpe(variant(bpe_json, tmp_path, change)).word_rule == rule


@pytest.mark.parametrize("name", VARIANTS)
def test_the_encoder_gives_the_tokenizers_own_ids_for_any_text(bpe_json, tmp_path, name):
    vocab = load_bpe(variant(bpe_json, tmp_path, VARIANTS[name][0]))
    encoder = SpacedWordEncoder(vocab, capacity=50)  # small: the cache also starts afresh during the run
    assert encoder.encode(CASES) == oracle(vocab, CASES)

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.lists(st.one_of(TEXTS, SINGLE_SPACED), min_size=1, max_size=6))
    def check(texts):
        assert encoder.encode(texts) == oracle(vocab, texts)

    check()


def test_the_cache_serves_repeated_words_and_keeps_to_its_capacity(bpe_json):
    vocab = load_bpe(bpe_json)
    encoder = SpacedWordEncoder(vocab, capacity=6)
    texts = ["the cat saw the dog", "The dog saw the cat again"]
    assert encoder.encode(texts) == oracle(vocab, texts)
    assert set(encoder.spaced) == {"cat", "saw", "the", "dog", "again"} and set(encoder.leading) == {"the", "The"}
    assert encoder.encode(["a new batch"]) == oracle(vocab, ["a new batch"])  # 7 words held: a fresh cache
    assert set(encoder.spaced) == {"new", "batch"} and set(encoder.leading) == {"a"}


def test_a_tokenizer_json_truncation_does_not_cut_documents(bpe_json, tmp_path):
    def truncate(data):
        data["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
        data["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None,
                           "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
    document = "the quick brown fox jumps over the lazy dog " * 20
    full = load_bpe(bpe_json).tokenizer.encode(document.strip(), add_special_tokens=False).ids
    docs = bpe_documents([document + "\n\nshort one\n"], load_bpe(variant(bpe_json, tmp_path, truncate)))
    assert docs.tokens[:len(full)].tolist() == full and docs.num_documents == 2
    short = load_bpe(bpe_json).tokenizer.encode("short one", add_special_tokens=False).ids
    assert len(docs.tokens) == len(full) + len(short)


def test_bpe_documents_count_the_tokens_of_each_text(bpe_json):
    vocab = load_bpe(bpe_json)
    texts = ["the first text\n\nits second document\n", "\n", "another text whole\n"]
    docs = bpe_documents(texts, vocab)
    count = [len(vocab.tokenizer.encode(t, add_special_tokens=False).ids)
             for t in ("the first text", "its second document", "another text whole")]
    assert docs.text_tokens == (count[0] + count[1], 0, count[2]) and len(docs.tokens) == sum(count)
