"""data/tokenization.py gives exactly the tokens of Google's reference BERT tokenizer.

The reference below is a plain-Python rendering of Google's BasicTokenizer (clean text, CJK split, per-token
lower-case and accent stripping when uncased, punctuation split) and greedy longest-match-first WordPiece,
written for this test from the published description of the algorithm.
"""
from __future__ import annotations

import bz2
import random
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bertrecipe.common.errors import DataError
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from helpers import TEST_DATA


# ---------------------------------------------------------------- reference (Google's algorithm, plain Python)
def ref_is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def ref_is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")


def ref_is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]


def ref_is_cjk(ch: str) -> bool:
    return any(lo <= ord(ch) <= hi for lo, hi in CJK_RANGES)


def ref_basic_tokens(text: str, lower: bool) -> list[str]:
    kept = []
    for ch in text:
        if ch == "\x00" or ch == "\ufffd" or ref_is_control(ch):
            continue
        kept.append(" " if ref_is_whitespace(ch) else ch)
    spaced = "".join(f" {ch} " if ref_is_cjk(ch) else ch for ch in kept)
    pieces: list[str] = []
    for word in spaced.split():
        if lower:
            word = word.lower()
            word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
        current = ""
        for ch in word:
            if ref_is_punctuation(ch):
                if current:
                    pieces.append(current)
                    current = ""
                pieces.append(ch)
            else:
                current += ch
        if current:
            pieces.append(current)
    return " ".join(pieces).split()


def ref_wordpiece(word: str, vocab: set[str]) -> list[str]:
    if len(word) > 200:  # Google's max_input_chars_per_word
        return ["[UNK]"]
    out, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                out.append(piece)
                start = end
                break
        else:
            return ["[UNK]"]
    return out


def ref_tokenize(text: str, vocab: set[str], lower: bool) -> list[str]:
    return [piece for word in ref_basic_tokens(text, lower) for piece in ref_wordpiece(word, vocab)]


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def uncased_vocab_path(vocab_file: Path) -> Path:
    return vocab_file


@pytest.fixture(scope="module")
def cased_vocab_path(uncased_vocab_path: Path, tmp_path_factory) -> Path:
    """The uncased vocab plus capitalised and upper-case forms of its words, so cased text matches words."""
    tokens = uncased_vocab_path.read_text(encoding="utf-8").split("\n")[:-1]
    extra = sorted({v for t in tokens if t.isalpha() and not t.startswith("##") for v in (t.title(), t.upper())}
                   - set(tokens))
    path = tmp_path_factory.mktemp("vocab") / "cased_vocab.txt"
    path.write_text("\n".join(tokens + extra + ["Ελληνικά", "ΟΔΟΣ", "Σ", "É", "##É"]) + "\n", encoding="utf-8")
    return path


CRAFTED = [
    "Hello, World!  The quick brown fox -- jumped; over (the) lazy dog's back...",
    "Café naïve résumé Über Ångström façade Straße ÉCOLE ñandú",
    "中文字符和English混合，還有日本語のかな。한국어 텍스트",
    "control\x00chars\x01in\x07the\x1bmiddle\x7fof\u200bwords\u00ad and\ufeffhere\ufffd",
    "tabs\tand\rcarriage returns\x0bvertical\x0cfeed\x85next\u2028line\u2029para\u00a0nbsp\u3000ideo",
    "“Quotes” ‘single’ «guillemets» — em–en dashes … ellipsis ¿Qué? ¡Sí! §5 ¶ † ‡ • ‰",
    "$100 + 5% = <tag> ^caret `tick` |pipe| ~tilde {brace} [bracket] @at #hash &amp; *star _under_",
    "a" * 100 + " " + "b" * 101 + " " + "antidisestablishmentarianism" * 4 + " short",
    "ΟΔΟΣ ΟΔΟΣ. ΣΟΦΟΣ Σ ΑΣ\u200bΒ ΑΣ.Β ελληνικά ΕΛΛΗΝΙΚΆ",
    "İstanbul DİYARBAKIR ǅungla ﬁnance ﬀ ½ ² ⅷ Ⅻ",
    "private\ue000use \uf8ffx unassigned\u0378y tag\U000e0041z emoji 😀🇫🇷 math 𝔘𝔫𝔦",
    "  leading and trailing spaces  ",
    "",
    "[CLS] [SEP] [MASK] [UNK] [PAD] ##suffix",
    "e\u0301 combining acute, n\u0303, a\u0308 — precomposed é ñ ä",
    "Ａｌｐｈａ full-width ＡＢＣ　１２３ ｶﾀｶﾅ",
]


def _wikitext_lines() -> list[str]:
    """The raw wikitext of the Wikipedia excerpt's pages, line by line (XML entities decoded): markup, URLs, many
    scripts and symbols, the non-ASCII text that the book excerpts lack."""
    with bz2.open(TEST_DATA / "wiki" / "enwiki-excerpt.xml.bz2") as f:
        texts = [e.text or "" for e in ET.parse(f).getroot().iter("{http://www.mediawiki.org/xml/export-0.10/}text")]
    return [line for text in texts for line in text.split("\n")]


def _real_lines(per_source: int) -> list[str]:
    """The first lines of each real text: two book excerpts (CRLF prose) and the Wikipedia excerpt."""
    sources = [(TEST_DATA / "books" / name).read_text(encoding="utf-8").split("\n")
               for name in ("pg11.txt", "pg1661.txt")] + [_wikitext_lines()]
    return [line.strip() for lines in sources for line in lines[:per_source]]


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_crafted_cases_match_reference(lower, uncased_vocab_path, cased_vocab_path):
    vocab = load_vocab(uncased_vocab_path if lower else cased_vocab_path)
    tokenizer = BertTokenizer(vocab, do_lower_case=lower)
    for text in CRAFTED:
        assert tokenizer.tokenize(text) == ref_tokenize(text, set(vocab.tokens), lower), repr(text)


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_real_text_matches_reference(lower, uncased_vocab_path, cased_vocab_path):
    vocab = load_vocab(uncased_vocab_path if lower else cased_vocab_path)
    tokenizer = BertTokenizer(vocab, do_lower_case=lower)
    lines = _real_lines(10**6)
    assert len(lines) > 1000 and sum(not line.isascii() for line in lines) > 50
    ids, offsets = tokenizer.encode_lines(lines)
    vocab_set = set(vocab.tokens)
    for i, line in enumerate(lines):
        got = [vocab.tokens[t] for t in ids[offsets[i]:offsets[i + 1]].tolist()]
        assert got == ref_tokenize(line, vocab_set, lower), repr(line)


def test_random_unicode_strings_match_reference(uncased_vocab_path):
    """Fuzz: strings drawn from a pool of every character class the basic tokenizer treats specially."""
    vocab = load_vocab(uncased_vocab_path)
    tokenizer = BertTokenizer(vocab, do_lower_case=True)
    pool = ("abcXYZ019 .,;!?'\"-()[]\t\r\x00\x01\x7f\x85\u00a0\u00ad\u200b\u200d\u2028\u3000\ufeff\ufffd"
            "éÉüÜñçßøœæÅİıΣσςΑΩ中文日本한국かなカナ\ue000\U000f0001“”—…€£¥©®™°±×÷¿¡§¶"
            "\u0301\u0308\u0327😀ﬁＡ１")
    rng = random.Random(1234)
    lines = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(800)]
    ids, offsets = tokenizer.encode_lines(lines)
    vocab_set = set(vocab.tokens)
    for i, line in enumerate(lines):
        got = [vocab.tokens[t] for t in ids[offsets[i]:offsets[i + 1]].tolist()]
        assert got == ref_tokenize(line, vocab_set, True), repr(line)


def test_mixed_ascii_and_unicode_lines_keep_their_order(uncased_vocab_path):
    tokenizer = BertTokenizer(load_vocab(uncased_vocab_path), do_lower_case=True)
    lines = ["plain ascii", "café", "", "more plain", "中文", "end."]
    ids, offsets = tokenizer.encode_lines(lines)
    assert offsets.tolist()[0] == 0 and len(offsets) == len(lines) + 1
    for i, line in enumerate(lines):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tokenizer.encode(line)
    assert ids.dtype.name == "int32" and offsets.dtype.name == "int64"


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_long_word_limit_is_googles_200_characters(lower, uncased_vocab_path, cased_vocab_path):
    """Up to 200 characters a word is split into pieces, beyond it is [UNK], on the ASCII path (lines of ASCII)
    and on the `tokenizers` path (lines with a non-ASCII character elsewhere), whole-text and line by line."""
    vocab = load_vocab(uncased_vocab_path if lower else cased_vocab_path)
    vocab_set = set(vocab.tokens)
    tokenizer = BertTokenizer(vocab, do_lower_case=lower)
    for char in "xb":
        for size in (101, 150, 200, 201, 250):
            word = char * size
            pieces = ref_wordpiece(word, vocab_set)
            assert (pieces == ["[UNK]"]) == (size > 200) and (len(pieces) > 1) == (size <= 200), (char, size)
            # Keyed words (up to 16 bytes) and the dict of longer ones share a line: both ASCII word paths.
            lines = [f"the {word} end", f"É {word} É"]  # ASCII path, `tokenizers` path
            assert lines[0].isascii() and not lines[1].isascii()
            accent = "e" if lower else "É"  # in both vocabs
            want = [["the", *pieces, "end"], [accent, *pieces, accent]]
            for text, expected in zip(lines, want, strict=True):
                assert tokenizer.tokenize(text) == expected == ref_tokenize(text, vocab_set, lower), (text, size)
            ids, offsets = BertTokenizer(vocab, do_lower_case=lower).encode_text("\n".join(lines))
            for i, expected in enumerate(want):
                assert [vocab.tokens[t] for t in ids[offsets[i]:offsets[i + 1]].tolist()] == expected, (i, size)
    # Non-ASCII words count characters, not bytes: 150 two-byte letters are split, 201 are [UNK].
    accented = "É" * 150 + " " + "É" * 201
    assert tokenizer.tokenize(accented) == ref_tokenize(accented, vocab_set, lower)
    assert tokenizer.tokenize(accented)[-1] == "[UNK]" and tokenizer.tokenize(accented).count("[UNK]") == 1
    assert "[UNK]" not in tokenizer.tokenize("the " * 30)


@pytest.mark.parametrize("tokens,missing", [
    ("[PAD] [UNK] [SEP] the", r"\[CLS\] \[MASK\]"),
    # Without [UNK] an unknown word would have no id (the WordPiece model fails mid-run): refused up front.
    ("[PAD] [CLS] [SEP] [MASK] the", r"\[UNK\]"),
], ids=["no CLS MASK", "no UNK"])
def test_vocab_without_special_tokens_is_refused(tmp_path, tokens, missing):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(tokens.split()) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"vocab\.txt: vocab lacks the special token\(s\) {missing}$"):
        load_vocab(path)


@pytest.mark.parametrize("content,problem", [(None, "not found"), (b"", "empty"), (b"[PAD]\n\xff\xfe\n", "not UTF-8")])
def test_bad_vocab_files_are_refused(tmp_path, content, problem):
    path = tmp_path / "vocab.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=problem):
        load_vocab(path)


def test_vocab_ids_follow_line_numbers(uncased_vocab_path):
    vocab = load_vocab(uncased_vocab_path)
    assert len(vocab) == 8960 and vocab.id("the") == 1996  # the excerpt keeps Google's ids (tests/data/README.md)
    assert [vocab.id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 100, 101, 102, 103]
    assert len(vocab.sha256) == 64


def test_encode_text_equals_encode_lines_on_mixed_text(uncased_vocab_path):
    """The whole-text path (ASCII lines vectorised, non-ASCII lines cut out and encoded apart) changes nothing."""
    tokenizer = BertTokenizer(load_vocab(uncased_vocab_path), do_lower_case=True)
    lines = _real_lines(200)
    for i, text in enumerate(CRAFTED):
        lines.insert(i * 97, text)
    for text in ("\n".join(lines), "\n".join(line for line in lines if line.isascii()), "", "\n\n", "x\n"):
        ids, offsets = tokenizer.encode_text(text)
        ref_ids, ref_offsets = BertTokenizer(tokenizer.vocab, True).encode_lines(text.split("\n"))
        assert offsets.tolist() == ref_offsets.tolist()
        assert ids.tolist() == ref_ids.tolist()
    vocab_set = set(tokenizer.vocab.tokens)
    ids, offsets = tokenizer.encode_text("\n".join(lines))
    for i in range(0, len(lines), 7):
        got = [tokenizer.vocab.tokens[t] for t in ids[offsets[i]:offsets[i + 1]].tolist()]
        assert got == ref_tokenize(lines[i], vocab_set, True), repr(lines[i])


def test_colliding_word_keys_fall_back_to_exact_words(uncased_vocab_path, monkeypatch):
    """Words are made unique by a hash table of their bytes; words sharing a slot must be told apart, never merged."""
    import numpy as np

    import bertrecipe.tokenization.ascii_wordpiece as ascii_wordpiece

    vocab = load_vocab(uncased_vocab_path)
    lines = _real_lines(50) + ["a" * 9 + "b", "a" * 9 + "c", "x" * 30, "x" * 31]
    expected = BertTokenizer(vocab, True).encode_text("\n".join(lines))
    # A zero multiplier puts every word in slot 0: one is kept there, all others must be made distinct apart.
    monkeypatch.setattr(ascii_wordpiece, "_MIX", np.uint64(0))
    got = BertTokenizer(vocab, True).encode_text("\n".join(lines))
    assert got[0].tolist() == expected[0].tolist() and got[1].tolist() == expected[1].tolist()
    vocab_set = set(vocab.tokens)
    for i, line in enumerate(lines):
        assert [vocab.tokens[t] for t in got[0][got[1][i]:got[1][i + 1]].tolist()] == \
            ref_tokenize(line, vocab_set, True)
