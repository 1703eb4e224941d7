"""The one tokenizer of a pre-training run, known by content: the shards record the tokenizer that made them
(create_pretraining_data.py's vocab_sha256 attribute), --vocab_file may name it, and the checkpoint the run starts
from records the one it was trained with. All of them must be one tokenizer, and its size must fit the model's
word embeddings by the rules fine-tuning applies (tokenization.wordpiece.check_vocab_for_model). The run's
checkpoints record it in turn ("tokenizer"), so that fine-tuning, conversion and inference can compare theirs."""
from __future__ import annotations

import sys
from typing import Optional

from bertrecipe.common.errors import InputError
from bertrecipe.pretraining.shard_schema import ShardInfo
from bertrecipe.tokenization.vocab_files import (
    AnyVocab,
    TokenizerIdentity,
    identity_from_record,
    identity_of,
    refuse_other_tokenizer,
)
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH


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
