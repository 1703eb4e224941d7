"""`--action create_vocab`: train an uncased or cased BERT WordPiece vocab.txt from formatted text, or
(`--vocab_type bpe`, train_bpe) a byte-level BPE tokenizer.json for document-chunk shards.

Deterministic: the same text gives the same vocab.txt byte for byte, whatever the run or the thread count.
tokenizers' trainer is not: it gives the continuation pieces (`##x`) their ids in the order of a randomly
seeded hash map, breaks ties between equally frequent merges by those ids (so the merges, not only the order,
change from run to run, even on one thread), and drops the alphabet's excess characters among equal counts in
hash order too. Here the alphabet and the continuation pieces are worked out first, ties broken by code point,
and handed to the trainer as its first tokens in code-point order, so that every id it compares is fixed.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tokenizers.implementations import BertWordPieceTokenizer

from bertrecipe.common.atomic_files import atomic_output
from bertrecipe.common.errors import DataError
from bertrecipe.dataprep.outputs import check_data_output_writable, refuse_data_input_as_output
from bertrecipe.tokenization.bpe import load_bpe
from bertrecipe.tokenization.wordpiece import SPECIAL_TOKENS, load_vocab

LIMIT_ALPHABET = 1000  # most distinct characters kept (the most frequent ones)
PREFIX = "##"
_CODE_POINTS = 0x110000
_CHUNK_BYTES = 1 << 22  # text read per numpy pass (whole lines)
BPE_MULTIPLE = 64  # ModernBERT's choice: a vocab (so embedding) size that is a multiple of 64 suits the GPU
_BYTES = 256  # byte-level BPE's alphabet
_T = TypeVar("_T")


def vocab_path(root: str | Path, corpus: str, do_lower_case: bool, vocab_size: int, bpe: bool = False) -> Path:
    """Where create_vocab writes by default: `<root>/vocab/<corpus>_<uncased|cased>_<size>.txt`, or
    `<root>/vocab/<corpus>_bpe_<size>.json` for a BPE tokenizer (cased: byte-level BPE keeps the text as it is)."""
    if bpe:
        return Path(root) / "vocab" / f"{corpus}_bpe_{vocab_size}.json"
    return Path(root) / "vocab" / f"{corpus}_{'uncased' if do_lower_case else 'cased'}_{vocab_size}.txt"


def train_bpe(inputs: Sequence[Path], output: Path, vocab_size: int, min_frequency: int = 2) -> Path:
    """Train a byte-level BPE tokenizer (cased, lossless) on the text files and write its tokenizer.json: BERT's
    special tokens first (ids 0-4, [PAD] 0, as shards pad), the 256 bytes, the merges as learnt (up to
    vocab_size tokens in all), then `[unused<i>]` tokens up to a multiple of BPE_MULTIPLE. tokenizers' BPE
    trainer is deterministic (its ties are broken by pair ids, which come from the byte alphabet, given here)."""
    _check(inputs, output, vocab_size, minimum=len(SPECIAL_TOKENS) + _BYTES + 1)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    try:
        _interruptible(lambda: tokenizer.train([str(p) for p in inputs], trainer))
    except Exception as err:  # tokenizers reports a file it cannot read or decode as a plain Exception
        raise DataError(inputs[0], f"cannot train on the formatted text ({' '.join(str(err).split())}); run "
                                   "--action text_formatting again") from None
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS) + _BYTES:
        raise DataError(inputs[0], f"no text to train a BPE vocab on (no pair of bytes occurs {min_frequency} "
                                   "times); run --action text_formatting on a corpus with text")
    text = _padded_bpe(tokenizer)
    try:
        with atomic_output(output) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as err:
        raise DataError(output, f"cannot write the tokenizer ({err.strerror}); choose another --vocab_file") from None
    load_bpe(output)  # the file we wrote must pass the same checks as a user's
    return output


def _padded_bpe(tokenizer: Tokenizer) -> str:
    """The tokenizer's JSON with `[unused<i>]` tokens (never produced: no merge makes them) appended up to a
    multiple of BPE_MULTIPLE, and BERT's `[CLS] A [SEP]` template for users that encode with special tokens."""
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    size = -(-len(vocab) // BPE_MULTIPLE) * BPE_MULTIPLE
    names = (f"[unused{i}]" for i in range(size))
    while len(vocab) < size:
        name = next(names)
        if name not in vocab:
            vocab[name] = len(vocab)
    padded = Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
    cls, sep = padded.token_to_id("[CLS]"), padded.token_to_id("[SEP]")
    padded.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return padded.to_str(pretty=True)


def train_vocab(inputs: Sequence[Path], output: Path, vocab_size: int, do_lower_case: bool,
                min_frequency: int = 2) -> Path:
    """Train WordPiece on the text files and write vocab.txt: the special tokens, the alphabet and the `##`
    pieces (each in code-point order), then the merged tokens in the order they were learnt."""
    _check(inputs, output, vocab_size)
    base = base_tokens(inputs, _tokenizer(do_lower_case))
    if not base:
        raise DataError(inputs[0], "no text to train a vocab on; run --action text_formatting on a corpus with text")
    tokens, unforeseen = _train(inputs, do_lower_case, vocab_size, min_frequency, base)
    if unforeseen:  # a `##` piece the scan could not foresee (see base_tokens): add it to base and train again
        base = _canonical(base + unforeseen)
        tokens, unforeseen = _train(inputs, do_lower_case, vocab_size, min_frequency, base)
        if unforeseen:
            raise RuntimeError(f"the trainer added {unforeseen} to a vocab whose base had them")
    try:
        with atomic_output(output) as tmp:
            tmp.write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    except OSError as err:
        raise DataError(output, f"cannot write vocab ({err.strerror}); choose another --vocab_file") from None
    load_vocab(output)  # the file we wrote must pass the same checks as a user's vocab
    return output


def _tokenizer(do_lower_case: bool) -> BertWordPieceTokenizer:
    # Same normalisation as our tokenizer; [unused] slots are not needed for a vocab trained from scratch.
    return BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case,
                                  lowercase=do_lower_case)


def _train(inputs: Sequence[Path], do_lower_case: bool, vocab_size: int, min_frequency: int,
           base: list[str]) -> tuple[list[str], list[str]]:
    """The trained tokens by id, and the single-character tokens the trainer added beyond `base`."""
    tokenizer = _tokenizer(do_lower_case)
    # The trainer puts special tokens first, in the order given: the base tokens' ids are ours. With no
    # alphabet of its own (limit 0) it adds only `##` pieces that base lacks, after them.
    given = list(SPECIAL_TOKENS) + base
    _interruptible(lambda: tokenizer.train([str(p) for p in inputs], vocab_size=vocab_size,
                                           min_frequency=min_frequency, special_tokens=given, limit_alphabet=0,
                                           wordpieces_prefix=PREFIX, show_progress=False))
    tokens = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    # Merges join two pieces, so a token of one character (after the prefix) can only be an added base token.
    unforeseen = [t for t in tokens[len(given):] if len(t.removeprefix(PREFIX)) == 1]
    return tokens, unforeseen


def _interruptible(train: Callable[[], _T]) -> _T:
    """train() (tokenizers' trainer) in a daemon thread while this thread waits for it. The trainer runs in Rust
    without returning to Python, so a Ctrl-C or SIGTERM in the thread that calls it waits for the end of the
    training (minutes on a real corpus); a waiting thread takes the signal's exception at once, and the process
    ends without waiting for the training it leaves (nothing of it has been written)."""
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, train()))
        except BaseException as error:  # noqa: BLE001 - raised again in the waiting thread
            outcome.append((False, error))

    thread = threading.Thread(target=run, name="vocab-training", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _canonical(base: list[str]) -> list[str]:
    """The alphabet, then the `##` pieces, each in code-point order."""
    return sorted(base, key=lambda token: (token.startswith(PREFIX) and len(token) > 1, token))


def base_tokens(inputs: Sequence[Path], tokenizer: BertWordPieceTokenizer,
                limit_alphabet: int = LIMIT_ALPHABET) -> list[str]:
    """The alphabet (the `limit_alphabet` most frequent characters of the normalized words, ties to the lower
    code point) and its `##` pieces (characters seen after the first of a word), in code-point order: what the
    trainer derives, without its hash order.

    Normalization and pre-tokenization act on each character alone, so each distinct character is normalized
    once and the text is only counted, with numpy. The exception, NFD reordering a run of combining marks that
    survive accent stripping at the start of a word, can miss a `##` piece: train_vocab then trains again."""
    chars = _Characters(tokenizer)
    counts, follows = _scan(inputs, chars)
    totals: dict[str, int] = {}
    continuing: set[str] = set()
    for code in np.flatnonzero(counts).tolist():
        text = chars.normalized[code]
        for i, char in enumerate(text):
            if chars.kind(char) != "space":
                totals[char] = totals.get(char, 0) + int(counts[code])
            if i > 0 and chars.kind(char) == "word" and chars.kind(text[i - 1]) == "word":
                continuing.add(char)
        if follows[code]:
            continuing.add(text[0])
    alphabet = sorted(sorted(totals, key=lambda c: (-totals[c], c))[:limit_alphabet])
    return alphabet + [PREFIX + char for char in alphabet if char in continuing]


class _Characters:
    """What the tokenizer's normalizer and pre-tokenizer make of each raw character, worked out once each."""

    def __init__(self, tokenizer: BertWordPieceTokenizer) -> None:
        self._normalize = tokenizer.normalizer.normalize_str
        self._pre_tokenize = tokenizer.pre_tokenizer.pre_tokenize_str
        self._kinds: dict[str, str] = {}
        self.normalized: dict[int, str] = {}
        self.known = np.zeros(_CODE_POINTS, bool)
        self.dropped = np.zeros(_CODE_POINTS, bool)  # normalizes to nothing (control characters, accents)
        self.starts_word = np.zeros(_CODE_POINTS, bool)  # its normalized text starts with a word character
        self.ends_word = np.zeros(_CODE_POINTS, bool)

    def kind(self, char: str) -> str:
        """'word', 'punctuation' (a word of its own) or 'space' (a separator), as the pre-tokenizer splits."""
        if char not in self._kinds:
            pieces = [piece for piece, _ in self._pre_tokenize(f"a{char}a")]
            self._kinds[char] = ("word" if pieces == [f"a{char}a"] else "space" if pieces == ["a", "a"]
                                 else "punctuation")
        return self._kinds[char]

    def learn(self, codes: np.ndarray) -> None:
        for code in np.unique(codes[~self.known[codes]]).tolist():
            text = self._normalize(chr(code))
            self.normalized[code] = text
            self.known[code] = True
            self.dropped[code] = not text
            self.starts_word[code] = bool(text) and self.kind(text[0]) == "word"
            self.ends_word[code] = bool(text) and self.kind(text[-1]) == "word"


def _scan(inputs: Sequence[Path], chars: _Characters) -> tuple[np.ndarray, np.ndarray]:
    """Per raw code point: how often it occurs, and whether it ever continues a word (follows, past dropped
    characters, one whose normalized text ends in a word character)."""
    counts = np.zeros(_CODE_POINTS, np.int64)
    follows = np.zeros(_CODE_POINTS, bool)
    for codes in _code_chunks(inputs):
        chars.learn(codes)
        counts += np.bincount(codes, minlength=_CODE_POINTS)
        kept = codes[~chars.dropped[codes]]
        after_word = chars.ends_word[kept[:-1]] & chars.starts_word[kept[1:]]
        follows[kept[1:][after_word]] = True
    return counts, follows


def _code_chunks(inputs: Sequence[Path]) -> Iterator[np.ndarray]:
    """The code points of the files, whole lines at a time; a file's last line never runs into the next file
    (the trainer reads line by line, and every line break is a separator once normalized)."""
    for path in inputs:
        try:
            with open(path, encoding="utf-8", newline="") as f:
                while lines := f.readlines(_CHUNK_BYTES):
                    yield np.frombuffer(("".join(lines) + "\n").encode("utf-32-le"), np.uint32)
        except UnicodeDecodeError as err:
            raise DataError(path, f"not UTF-8 text ({err.reason}); run --action text_formatting again") from None
        except OSError as err:
            raise DataError(path, f"cannot read the formatted text ({err.strerror}); check its permissions") from None


def _check(inputs: Sequence[Path], output: Path, vocab_size: int, minimum: int = len(SPECIAL_TOKENS) + 100) -> None:
    """Everything that can be refused before training: nothing is written by a refused run."""
    if vocab_size < minimum:
        raise DataError("--vocab_size", f"must be at least {minimum}, got {vocab_size}")
    for path in inputs:
        if not path.is_file():
            raise DataError(path, "formatted text not found (run --action text_formatting first)")
    refuse_data_input_as_output(output, "--vocab_file", [("formatted text", path) for path in inputs])
    if output.exists() or output.is_symlink():
        # Shards and models made with a vocab stop matching it when it is replaced.
        raise DataError(output, "--vocab_file already exists and create_vocab does not replace a vocab; delete "
                                "it or choose another --vocab_file")
    check_data_output_writable(output, "--vocab_file")
