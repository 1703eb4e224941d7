"""`--action create_vocab`: train an uncased or cased BERT WordPiece vocab.txt from formatted text."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tokenizers.implementations import BertWordPieceTokenizer

from .errors import DataError
from .outputs import atomic_output, check_writable, refuse_input_as_output
from .tokenization import SPECIAL_TOKENS, load_vocab


def vocab_path(root: str | Path, corpus: str, do_lower_case: bool, vocab_size: int) -> Path:
    """Where create_vocab writes by default: `<root>/vocab/<corpus>_<uncased|cased>_<size>.txt`."""
    return Path(root) / "vocab" / f"{corpus}_{'uncased' if do_lower_case else 'cased'}_{vocab_size}.txt"


def train_vocab(inputs: Sequence[Path], output: Path, vocab_size: int, do_lower_case: bool,
                min_frequency: int = 2) -> Path:
    """Train WordPiece on the text files and write vocab.txt (token i on line i, special tokens first)."""
    _check(inputs, output, vocab_size)
    tokenizer = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case,
                                       lowercase=do_lower_case)
    # Same normalisation as our tokenizer; [unused] slots are not needed for a vocab trained from scratch.
    tokenizer.train([str(p) for p in inputs], vocab_size=vocab_size, min_frequency=min_frequency,
                    special_tokens=list(SPECIAL_TOKENS), limit_alphabet=1000, wordpieces_prefix="##",
                    show_progress=False)
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    if len(by_id) <= len(SPECIAL_TOKENS):
        raise DataError(inputs[0], "no text to train a vocab on; run --action text_formatting on a corpus with text")
    try:
        with atomic_output(output) as tmp:
            tmp.write_text("".join(token + "\n" for token, _ in by_id), encoding="utf-8")
    except OSError as err:
        raise DataError(output, f"cannot write vocab ({err.strerror}); choose another --vocab_file") from None
    load_vocab(output)  # the file we wrote must pass the same checks as a user's vocab
    return output


def _check(inputs: Sequence[Path], output: Path, vocab_size: int) -> None:
    """Everything that can be refused before training: nothing is written by a refused run."""
    if vocab_size < len(SPECIAL_TOKENS) + 100:
        raise DataError("--vocab_size", f"must be at least {len(SPECIAL_TOKENS) + 100}, got {vocab_size}")
    for path in inputs:
        if not path.is_file():
            raise DataError(path, "formatted text not found (run --action text_formatting first)")
    refuse_input_as_output(output, "--vocab_file", [("formatted text", path) for path in inputs])
    if output.exists() or output.is_symlink():
        # Shards and models made with a vocab stop matching it when it is retrained (token order varies).
        raise DataError(output, "--vocab_file already exists and create_vocab does not replace a vocab; delete "
                                "it or choose another --vocab_file")
    check_writable(output, "--vocab_file")
