"""The one tokenizer of a pre-training run, known by content: the shards record the tokenizer that made them
(create_pretraining_data.py's vocab_sha256 attribute), --vocab_file may name it, and the checkpoint the run starts
from records the one it was trained with (a released folder: its vocab.txt or tokenizer.json). All of them must be
one tokenizer, and its size must fit the model's word embeddings by the rules fine-tuning applies
(tokenization.wordpiece.check_vocab_for_model). Likewise one casing: the shards record whether their text was
lower-cased (do_lower_case), which the vocab (its tokens or normalizer) and the checkpoint must not contradict. The
run's checkpoints record both in turn ("tokenizer"), so that fine-tuning, conversion and inference can compare
theirs."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bertrecipe.common.errors import DataError, InputError
from bertrecipe.model.weights import HF_WEIGHT_FILES, LoadedWeights
from bertrecipe.pretraining.shard_schema import ShardInfo
from bertrecipe.tokenization.vocab_files import (
    AnyVocab,
    TokenizerIdentity,
    identity_from_record,
    identity_of,
    load_vocab_file,
    refuse_other_tokenizer,
)
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH, Vocab, vocab_lower_cases

RELEASED_VOCAB_FILES = ("vocab.txt", "tokenizer.json")  # what a released model folder carries as its tokenizer
SHARDS, VOCAB, CHECKPOINT = "shards", "vocab", "checkpoint"  # who tells a casing


def shards_tokenizer(shards: list[ShardInfo]) -> Optional[TokenizerIdentity]:
    """The tokenizer the shards record; refuses shards of two tokenizers (one run reads one kind of ids). None
    when no shard records one (NVIDIA's shards)."""
    recorded = [shard.tokenizer for shard in shards if shard.tokenizer is not None]
    if not recorded:
        return None
    first = recorded[0]
    other = next((t for t in recorded if t.sha256 != first.sha256), None)
    if other is not None:
        raise InputError(f"{other.source}: was written with another tokenizer ({other.describe()}) than "
                         f"{first.source} ({first.describe()}); one run reads the ids of one tokenizer: make the "
                         "shards again with one --vocab_file")
    return first


def run_tokenizer(shards: list[ShardInfo], vocab: Optional[AnyVocab], model_vocab_size: int,
                  allow_mismatch: bool) -> Optional[TokenizerIdentity]:
    """The run's tokenizer: --vocab_file's (loaded as `vocab`) or the shards' (training and held-out), which must
    be the same one, with a size that fits the model's word embeddings. None when nothing records one."""
    from_shards = shards_tokenizer(shards)
    given = identity_of(vocab) if vocab is not None else None
    refuse_other_tokenizer(given, from_shards, "pass the --vocab_file the shards were made with", allow_mismatch)
    tokenizer = given or from_shards
    if tokenizer is not None and given is None:  # a --vocab_file has been checked against the model already
        check_size(tokenizer, model_vocab_size, allow_mismatch)
    return tokenizer


def check_size(tokenizer: TokenizerIdentity, model_vocab_size: int, allow_mismatch: bool) -> None:
    """The shards' tokenizer against the model's word embeddings: more tokens than embeddings is always refused,
    far fewer (another tokenizer's model) unless allow_mismatch, which warns."""
    problem, may_pass = tokenizer.size_problem(model_vocab_size)
    if problem is None:
        return
    what = problem.split("; ")[0].replace("the vocab has", "its tokenizer has").replace("the tokenizer has",
                                                                                          "its tokenizer has")
    if allow_mismatch and may_pass:
        print(f"warning: {tokenizer.source}: {what}; going on ({ALLOW_VOCAB_MISMATCH})", file=sys.stderr, flush=True)
        return
    hint = f" (or {ALLOW_VOCAB_MISMATCH} to go on)" if may_pass else ""
    raise InputError(f"{tokenizer.source}: {what}; use the config (vocab_size) that fits the shards' tokenizer, or "
                     f"shards made with the model's tokenizer{hint}")


def refuse_checkpoint_of_another_tokenizer(tokenizer: Optional[TokenizerIdentity], record: object, source: str,
                                           allow_mismatch: bool) -> None:
    """The checkpoint a run starts from (resumes, hands over from, or takes as --init_checkpoint) must have been
    trained on the run's tokenizer, when both are known."""
    refuse_other_tokenizer(tokenizer, identity_from_record(record, source),
                           f"train on shards of the tokenizer {source} was trained with", allow_mismatch)


@dataclass(frozen=True)
class TextCasing:
    """Whether text is lower-cased, as `source` tells it: a shard (its text was), a vocab (its tokens or normalizer
    are made for it) or a checkpoint (its model was trained on it)."""

    lower_case: bool
    source: str
    told_by: str  # SHARDS, VOCAB or CHECKPOINT

    def describe(self) -> str:
        if self.told_by == SHARDS:
            return ("was made from lower-cased text (do_lower_case 1)" if self.lower_case
                    else "was made from text that keeps its case (do_lower_case 0)")
        if self.told_by == CHECKPOINT:
            return f"was trained on {'lower-cased text' if self.lower_case else 'text that keeps its case'}"
        return f"is {'uncased' if self.lower_case else 'cased'}"


def vocab_text_casing(vocab: AnyVocab) -> Optional[TextCasing]:
    """The casing a WordPiece vocab is made for (its normalizer, else its tokens); None for a byte-level BPE
    tokenizer (no casing flag) or a vocab whose tokens do not tell."""
    lower_case = vocab_lower_cases(vocab) if isinstance(vocab, Vocab) else None
    return None if lower_case is None else TextCasing(lower_case, str(vocab.path), VOCAB)


def checkpoint_casing(record: Any, source: str) -> Optional[TextCasing]:
    """The casing a checkpoint's "tokenizer" record holds; None for older checkpoints and others' (none recorded)."""
    lower_case = record.get("lower_case") if isinstance(record, dict) else None
    return TextCasing(lower_case, source, CHECKPOINT) if isinstance(lower_case, bool) else None


def casing_record(casing: Optional[TextCasing]) -> dict[str, bool]:
    """What a checkpoint's "tokenizer" record adds of the run's casing (the shards'; nothing where unknown)."""
    return {} if casing is None or casing.told_by != SHARDS else {"lower_case": casing.lower_case}


def casing_flag(lower_case: bool) -> str:
    return ("--do_lower_case (bertPrep.py: --do_lower_case 1)" if lower_case
            else "--no-do_lower_case (bertPrep.py: --do_lower_case 0)")


def run_casing(shards: list[ShardInfo], vocab: Optional[AnyVocab], allow_mismatch: bool) -> Optional[TextCasing]:
    """The casing of the run's text: the shards' (one for all of them), which --vocab_file's (loaded as `vocab`)
    must not contradict. None when no shard records it (NVIDIA's shards)."""
    recorded = [shard for shard in shards if shard.lower_case is not None]
    if not recorded:
        return None
    first = TextCasing(bool(recorded[0].lower_case), str(recorded[0].path), SHARDS)
    other = next((shard for shard in recorded if shard.lower_case != first.lower_case), None)
    if other is not None:
        refuse_other_casing(TextCasing(bool(other.lower_case), str(other.path), SHARDS), first, allow_mismatch)
    if vocab is not None:
        refuse_other_casing(first, vocab_text_casing(vocab), allow_mismatch)
    return first


def refuse_other_casing(shards: Optional[TextCasing], other: Optional[TextCasing], allow_mismatch: bool) -> None:
    """One line naming both when the shards' casing (`shards`) is not `other`'s (a shard's, the vocab's, the
    checkpoint's; either unknown: nothing to compare); with allow_mismatch, a warning instead."""
    if shards is None or other is None or shards.lower_case == other.lower_case:
        return
    if other.told_by == SHARDS:
        consequence, fix = "a run trains on text of one casing", "make the shards again with one --do_lower_case"
    elif other.told_by == CHECKPOINT:
        consequence = "the model would go on learning another casing than the one it was trained on"
        fix = f"train on shards made with {casing_flag(other.lower_case)}"
    else:
        consequence = ("every capitalised word in the shards is [UNK]" if other.lower_case else
                       "the vocab's capitalised tokens never occur in them and their accents were stripped")
        fix = f"make the shards again with {casing_flag(other.lower_case)}"
    problem = f"{shards.describe()}, but {other.source} {other.describe()}: {consequence}"
    if allow_mismatch:
        print(f"warning: {shards.source}: {problem}; going on ({ALLOW_VOCAB_MISMATCH})", file=sys.stderr, flush=True)
        return
    raise InputError(f"{shards.source}: {problem}; {fix} (or {ALLOW_VOCAB_MISMATCH} to go on)")


def released_vocab_file(path: str | Path) -> Optional[Path]:
    """The vocab.txt or tokenizer.json of a model folder (or beside a Hugging Face weight file in one); None for a
    checkpoint file of its own or a folder without either."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent if path.name in HF_WEIGHT_FILES else None
    if folder is None:
        return None
    return next((folder / name for name in RELEASED_VOCAB_FILES if (folder / name).is_file()), None)


def check_init_checkpoint_tokenizer(weights: LoadedWeights, source: str, tokenizer: Optional[TokenizerIdentity],
                                    casing: Optional[TextCasing], allow_mismatch: bool, warn: bool) -> None:
    """--init_checkpoint against the run's tokenizer and casing: what our checkpoints record, else the folder's own
    vocab.txt or tokenizer.json. With neither, a warning (when `warn`) that the run's tokenizer is taken to be the
    model's, since the run's checkpoints will record it as such."""
    if weights.tokenizer is not None:
        refuse_checkpoint_of_another_tokenizer(tokenizer, weights.tokenizer, source, allow_mismatch)
        refuse_other_casing(casing, checkpoint_casing(weights.tokenizer, source), allow_mismatch)
        return
    vocab_file = released_vocab_file(source)
    holds = "holds no vocab.txt or tokenizer.json" if vocab_file is None else ""
    try:
        vocab = load_vocab_file(vocab_file) if vocab_file is not None else None
    except DataError as error:  # e.g. a tokenizer.json of a model the recipe has no tokenizer for
        vocab, holds = None, f"holds no tokenizer the recipe reads ({error})"
    if vocab is not None:
        refuse_other_tokenizer(tokenizer, identity_of(vocab), "make the shards with the model's own vocab",
                               allow_mismatch)
        refuse_other_casing(casing, vocab_text_casing(vocab), allow_mismatch)
    elif tokenizer is not None and warn:
        released = Path(source).is_dir() or Path(source).name in HF_WEIGHT_FILES
        holds = holds if released else "is a checkpoint file"
        print(f"warning: {source}: {holds} and records no tokenizer: nothing to compare the run's tokenizer "
              f"({tokenizer.describe()}, recorded by {tokenizer.source}) with; it is taken to be the model's, and "
              "this run's checkpoints record it as such", file=sys.stderr, flush=True)
