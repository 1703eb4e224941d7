"""One HDF5 pre-training shard from text (one sentence per line, blank line between documents), as Google's and
NVIDIA's create_pretraining_data make it: ShardConfig, create_shard, and shard_task (a shard as a task of bertPrep's
engine); with document_chunks, a document-chunk shard for masked-LM-only training instead (document_chunks.py),
tokenized by a WordPiece vocab.txt or a byte-level BPE tokenizer.json (bpe_tokenizer.py). The command line is
bertrecipe/cli/create_pretraining_data.py. Every input is checked before anything is written."""
from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from tqdm import tqdm

from bertrecipe.common.errors import DataError
from bertrecipe.dataprep.bpe_tokenizer import bpe_documents
from bertrecipe.dataprep.document_chunks import write_document_chunks
from bertrecipe.dataprep.documents import Documents, input_files, input_paths, read_text, tokenize_documents
from bertrecipe.dataprep.instances import (
    MaskingConfig,
    SpecialIds,
    instance_blocks,
    instance_row_shapes,
    pair_spans,
    truncate_spans,
)
from bertrecipe.dataprep.outputs import check_data_output_writable, refuse_data_input_as_output
from bertrecipe.dataprep.records import (
    Counts,
    Selection,
    check_column_types,
    documents,
    google_layout,
    record_format,
    record_schemas,
)
from bertrecipe.dataprep.shard_writer import write_shard_blocks
from bertrecipe.pretraining.shard_schema import DOCUMENT_CHUNKS, KIND_ATTRIBUTE, SpecialTokenIds
from bertrecipe.tokenization.bpe import BpeVocab, load_bpe
from bertrecipe.tokenization.vocab_files import BPE, load_wordpiece_file, vocab_file_kind
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH, BertTokenizer, Vocab, vocab_lower_cases


@dataclass(frozen=True)
class ShardConfig:
    input_file: Path | str  # see documents.input_paths
    output_file: Path
    vocab_file: Path
    do_lower_case: bool = True
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    whole_word_masking: bool = False
    # none (default: writing costs ~0.1 s per 5 MB of text), gzip (level 1, ~4x smaller files, NVIDIA's format,
    # about as slow to write as everything else together), lzf (h5py only, ~3x smaller, half gzip's time).
    compression: str = "none"
    # bertPrep checks every job's paths and removes the stale temporaries of all its shards (one listing per
    # folder) before the first shard starts; done again per shard among 4,096 they cost ~0.3 ms and ~1.9 ms.
    checked_by_caller: bool = False
    # Rows of whole documents cut at max_seq_length, for masked-LM-only training: no pairs, masked as they are read
    # (the pair and masking parameters above are then unused). vocab_file may then be a BPE tokenizer.json.
    document_chunks: bool = False
    # Which records of Parquet, JSON Lines and Arrow inputs are documents (text inputs are taken whole).
    selection: Selection = Selection()
    # bertPrep: the sha256 of the text shard, recorded in the shard (`text_sha256`), so that a shard made from an
    # earlier text is made again rather than skipped as complete.
    text_sha256: str | None = None
    # bertPrep --dataset custom: the text shard's articles as runs of (source name, bytes), in order, as sharding
    # wrote them; each run is tokenized as a text of its own, so that the shard records the tokens of each source
    # (`source_tokens`) with the same documents and rows as the text tokenized whole.
    source_bytes: tuple[tuple[str, int], ...] = ()
    # A casing the WordPiece vocab contradicts (check_casing) is a warning instead of a refusal.
    allow_vocab_mismatch: bool = False


@dataclass(frozen=True)
class ShardResult:
    output_file: Path
    instances: int
    input_bytes: int
    seconds: float
    records: Counts | None = None  # of the record inputs, where there were any


def validate(cfg: ShardConfig, warn: bool = True) -> None:
    """Refuse parameters the algorithm cannot work with (DataError names the flag) and a casing the WordPiece vocab
    contradicts (check_casing; with allow_vocab_mismatch a warning, printed when `warn`)."""
    if cfg.max_seq_length < 8:
        raise DataError("--max_seq_length", f"must be at least 8, got {cfg.max_seq_length}")
    if cfg.max_predictions_per_seq < 1:
        raise DataError("--max_predictions_per_seq", f"must be at least 1, got {cfg.max_predictions_per_seq}")
    if not 0.0 < cfg.masked_lm_prob <= 1.0:
        raise DataError("--masked_lm_prob", f"must be in (0, 1], got {cfg.masked_lm_prob}")
    if not 0.0 <= cfg.short_seq_prob <= 1.0:
        raise DataError("--short_seq_prob", f"must be in [0, 1], got {cfg.short_seq_prob}")
    if cfg.dupe_factor < 1:
        raise DataError("--dupe_factor", f"must be at least 1, got {cfg.dupe_factor}")
    if cfg.document_chunks and cfg.whole_word_masking:
        raise DataError("--whole_word_masking", "document chunks hold no masks (they are drawn as the rows are read): "
                                                "pass --whole_word_masking to run_pretraining.py instead")
    if not cfg.document_chunks and vocab_file_kind(cfg.vocab_file) == BPE:  # by content: one line for no tokenizer
        raise DataError(cfg.vocab_file, "a BPE tokenizer.json makes document-chunk shards only: add "
                                        "--document_chunks, or pass a WordPiece vocab.txt")
    if vocab_file_kind(cfg.vocab_file) != BPE:  # a byte-level BPE tokenizer keeps the case: no flag to contradict
        check_casing(cfg, warn)


def check_casing(cfg: ShardConfig, warn: bool = True) -> None:
    """Refuses (DataError naming the vocab) a do_lower_case that the WordPiece vocab contradicts: an uncased vocab with
    text that keeps its case makes every capitalised word [UNK], a cased one with lower-cased text never uses its
    capitalised tokens. With allow_vocab_mismatch, a warning on stderr (when `warn`) instead."""
    vocab, _ = vocab_and_tokenizer(cfg.vocab_file, cfg.do_lower_case)
    problem = casing_problem(vocab, cfg.do_lower_case)
    if problem is None:
        return
    if not cfg.allow_vocab_mismatch:
        raise DataError(vocab.path, f"{problem} (or {ALLOW_VOCAB_MISMATCH} to go on)")
    if warn:
        print(f"warning: {vocab.path}: {problem.split('; ')[0]}; going on ({ALLOW_VOCAB_MISMATCH})", file=sys.stderr,
              flush=True)


def casing_problem(vocab: Vocab, do_lower_case: bool) -> str | None:
    """What is wrong with tokenizing for `vocab` with do_lower_case, in both commands' spellings, its first "; "
    ending what a warning says; None when nothing is (or the vocab does not tell its casing)."""
    if vocab.lower_case is not None:  # a tokenizer.json's normalizer says it
        return vocab.casing_problem(do_lower_case)
    lower_cases = vocab_lower_cases(vocab)
    if lower_cases and not do_lower_case:
        return ("the vocab is uncased (next to none of its tokens is capitalised) but the text keeps its case "
                "(--no-do_lower_case, bertPrep.py's --do_lower_case 0): every capitalised word would become [UNK]; "
                "drop --no-do_lower_case (bertPrep.py: --do_lower_case 1), or pass a cased model's vocab")
    if lower_cases is False and do_lower_case:
        return ("the vocab is cased (it holds capitalised tokens) but the text is lower-cased (create_pretraining_data"
                ".py's default, bertPrep.py's --do_lower_case 1): its capitalised tokens would never be used and the "
                "accents would be stripped; pass --no-do_lower_case (bertPrep.py: --do_lower_case 0), or an uncased "
                "model's vocab")
    return None


def text_attributes(cfg: ShardConfig) -> dict[str, object]:
    """The attributes of a shard that tell its text: the text shard's sha256 and source runs (bertPrep's)."""
    attributes: dict[str, object] = {"text_sha256": cfg.text_sha256} if cfg.text_sha256 else {}
    if cfg.source_bytes:
        attributes["source_bytes"] = json.dumps([list(run) for run in cfg.source_bytes])
    return attributes


def source_tokens(cfg: ShardConfig, docs: Documents) -> dict[str, object]:
    """The `source_tokens` attribute (JSON: source name -> tokens of its documents in this shard, each copy
    counted, before they are cut into rows) where the text came in source runs; nothing otherwise."""
    if not cfg.source_bytes:
        return {}
    tokens: dict[str, int] = {}
    for (name, _), count in zip(cfg.source_bytes, docs.text_tokens, strict=True):
        tokens[name] = tokens.get(name, 0) + count
    return {"source_tokens": json.dumps(tokens)}


def shard_attributes(cfg: ShardConfig, vocab_size: int, vocab_sha256: str) -> dict[str, object]:
    """The HDF5 attributes that tell readers what a shard was made with."""
    return {**text_attributes(cfg),
        "vocab_size": vocab_size, "vocab_sha256": vocab_sha256, "do_lower_case": int(cfg.do_lower_case),
        "max_seq_length": cfg.max_seq_length, "max_predictions_per_seq": cfg.max_predictions_per_seq,
        "masked_lm_prob": cfg.masked_lm_prob, "short_seq_prob": cfg.short_seq_prob,
        "dupe_factor": cfg.dupe_factor, "random_seed": cfg.random_seed,
        "whole_word_masking": int(cfg.whole_word_masking),
    }


def check_shard_paths(cfg: ShardConfig) -> list[Path]:
    """The input files; refuses, before anything is written, an output that is one of the inputs, the vocab,
    a .txt that a folder input would read next time, or a place that cannot be written."""
    named, files = input_paths(cfg.input_file), input_files(cfg.input_file)
    output = Path(cfg.output_file)
    inputs = [("--input_file", p) for p in named + files] + [("--vocab_file", Path(cfg.vocab_file))]
    refuse_data_input_as_output(output, "--output_file", inputs)
    for folder in (p for p in named if p.is_dir()):
        if output.suffix == ".txt" and output.resolve().parent == folder.resolve():
            raise DataError(output, f"--output_file is inside the --input_file folder {folder}, whose .txt files "
                                    "are all read as input; choose another --output_file")
    check_data_output_writable(output, "--output_file")
    return files


def _file_key(path: str | Path) -> tuple:
    """The file as it is now, whatever name reaches it: one system call, no resolve()."""
    try:
        stat = os.stat(path)
        return (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    except OSError:
        return (str(path), 0, 0, 0)  # the loader reports the problem


def vocab_and_tokenizer(vocab_file: str | Path, do_lower_case: bool) -> tuple:
    """The WordPiece vocab (a vocab.txt or a WordPiece tokenizer.json) and its tokenizer, built once per process for
    a file as it is now (a shard task of create_hdf5_files spent about 25 ms rebuilding them, which dominated shards
    of a few hundred KB). A casing the vocab contradicts is validate's (check_casing) to refuse."""
    return _cached_vocab_and_tokenizer(_file_key(vocab_file), str(vocab_file), do_lower_case)


@lru_cache(maxsize=2)
def _cached_vocab_and_tokenizer(key: tuple, vocab_file: str, do_lower_case: bool) -> tuple:
    vocab = load_wordpiece_file(vocab_file)
    return vocab, BertTokenizer(vocab, do_lower_case)


@lru_cache(maxsize=2)
def _cached_bpe(key: tuple, vocab_file: str) -> BpeVocab:
    return load_bpe(vocab_file)


@dataclass(frozen=True)
class ChunkVocab:
    """What a document-chunk shard needs of its --vocab_file (WordPiece vocab.txt or BPE tokenizer.json): the
    attributes it records and a tokenize(texts, on_progress) -> Documents."""

    kind: str  # "wordpiece" or "bpe"
    size: int
    sha256: str
    special: SpecialTokenIds
    lowercases: bool
    tokenize: Callable[[Iterable[str], Callable[[int], None] | None], Documents]


def chunk_vocab(vocab_file: str | Path, do_lower_case: bool) -> ChunkVocab:
    """The ChunkVocab of a byte-level BPE tokenizer.json (cased, do_lower_case unused) or of a WordPiece vocab.txt or
    tokenizer.json, by the file's content."""
    if vocab_file_kind(vocab_file) == BPE:
        bpe = _cached_bpe(_file_key(vocab_file), str(vocab_file))
        special = SpecialTokenIds(bpe.id("[CLS]"), bpe.id("[SEP]"), bpe.id("[PAD]"), bpe.id("[MASK]"), bpe.size)
        return ChunkVocab("bpe", bpe.size, bpe.sha256, special, False,
                          lambda texts, on_progress: bpe_documents(texts, bpe, on_progress))
    vocab, tokenizer = vocab_and_tokenizer(vocab_file, do_lower_case)
    special = SpecialTokenIds(vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.id("[PAD]"), vocab.id("[MASK]"), len(vocab))
    return ChunkVocab("wordpiece", len(vocab), vocab.sha256, special, do_lower_case,
                      lambda texts, on_progress: tokenize_documents(texts, tokenizer, on_progress))


def chunk_attributes(cfg: ShardConfig, vocab: ChunkVocab) -> dict[str, object]:
    """The HDF5 attributes of a document-chunk shard: its kind, what it was made with, and its special ids."""
    special = vocab.special
    return {**text_attributes(cfg),
        KIND_ATTRIBUTE: DOCUMENT_CHUNKS, "tokenizer": vocab.kind, "vocab_size": vocab.size,
        "vocab_sha256": vocab.sha256, "do_lower_case": int(vocab.lowercases), "max_seq_length": cfg.max_seq_length,
        "random_seed": cfg.random_seed, "cls_id": special.cls, "sep_id": special.sep, "pad_id": special.pad,
        "mask_id": special.mask,
    }


def expected_attributes(cfg: ShardConfig) -> dict[str, object]:
    """The attributes a complete shard of cfg holds (bertPrep skips a shard that has them)."""
    if cfg.document_chunks:
        return chunk_attributes(cfg, chunk_vocab(cfg.vocab_file, cfg.do_lower_case))
    vocab, _ = vocab_and_tokenizer(cfg.vocab_file, cfg.do_lower_case)
    return shard_attributes(cfg, len(vocab), vocab.sha256)


def create_shard(cfg: ShardConfig, progress: bool | None = None) -> ShardResult:
    """Text file(s) -> one HDF5 shard at cfg.output_file. Depends only on the input, the vocab and cfg.
    Every input is checked before the first write: a refused run leaves the output location as it was."""
    started = time.perf_counter()
    validate(cfg, warn=not cfg.checked_by_caller)  # bertPrep validated the first job and warned once
    disable = None if progress is None else not progress  # None: bars only on a terminal
    compression = None if cfg.compression == "none" else cfg.compression
    if cfg.document_chunks:
        vocab = chunk_vocab(cfg.vocab_file, cfg.do_lower_case)
        docs, input_bytes, counts = _read_documents(cfg, vocab.tokenize, disable, by_sentence=vocab.kind != "bpe")
        rows = write_document_chunks(Path(cfg.output_file), docs, cfg.max_seq_length, vocab.special,
                                     {**chunk_attributes(cfg, vocab), **source_tokens(cfg, docs)}, cfg.random_seed,
                                     compression, clean=not cfg.checked_by_caller)
    else:
        wordpiece, tokenizer = vocab_and_tokenizer(cfg.vocab_file, cfg.do_lower_case)
        docs, input_bytes, counts = _read_documents(
            cfg, lambda texts, on_progress: tokenize_documents(texts, tokenizer, on_progress), disable)
        rows = _write_instances(cfg, docs, wordpiece, compression, disable)
    return ShardResult(Path(cfg.output_file), rows, input_bytes, time.perf_counter() - started, counts)


def _read_documents(cfg: ShardConfig, tokenize: Callable[[Iterable[str], Callable[[int], None] | None], Documents],
                    disable: bool | None, by_sentence: bool = True) -> tuple[Documents, int, Counts | None]:
    """The input's documents, tokenized, its size in bytes and what the selection did to its records (records laid
    out a sentence a line, or a document a line where by_sentence is False: records.google_layout); refuses an
    input without text."""
    files = input_files(cfg.input_file) if cfg.checked_by_caller else check_shard_paths(cfg)
    counts = _check_selection(cfg, files)
    texts = []  # all read and decoded before any output: bad bytes and bad records fail early
    for path in files:
        texts += (google_layout(documents(path, cfg.selection, counts), by_sentence=by_sentence) if record_format(path)
                  else [read_text(path)])
    if cfg.source_bytes:
        texts = _source_runs(files[0], texts[0], cfg.source_bytes)
    input_bytes = sum(_size(path) for path in files)
    with tqdm(total=sum(len(t) for t in texts), unit="char", unit_scale=True,
              desc=f"tokenize {Path(cfg.output_file).name}", disable=disable, leave=False) as bar:
        docs = tokenize(texts, bar.update)
    if docs.num_documents == 0:
        if counts is not None and not counts.records:  # no hint of text or filters: the files hold no row
            raise DataError(cfg.input_file, "no record in it (0 rows); pass record files that hold documents")
        if counts is not None:
            empty = f", {counts.kept} without a sentence" if counts.kept else ""
            raise DataError(cfg.input_file, f"no document left of {counts.records} records ({counts.dropped()}"
                                            f"{empty}); loosen --filter, --min_chars or --max_chars")
        raise DataError(cfg.input_file, "input holds no text (no line that tokenizes to a word piece: empty, "
                                        "blank, or control and zero-width characters only); --input_file takes "
                                        "text of one sentence a line, documents separated by blank lines")
    return docs, input_bytes, counts


def _source_runs(path: Path, text: str, runs: tuple[tuple[str, int], ...]) -> list[str]:
    """A text shard cut into its source runs (each ends an article, so the documents are the same)."""
    data = text.encode("utf-8")
    if sum(size for _, size in runs) != len(data):
        raise DataError(path, f"holds {len(data):,} bytes where its sources' runs add up to "
                              f"{sum(size for _, size in runs):,}: it changed after sharding; run --action sharding "
                              "again")
    bounds = np.cumsum([0] + [size for _, size in runs]).tolist()
    return [data[lo:hi].decode("utf-8") for lo, hi in pairwise(bounds)]


def _check_selection(cfg: ShardConfig, files: list[Path]) -> Counts | None:
    """Counts for the record inputs, whose filtered columns hold one type each (check_column_types); a selection
    given to text inputs alone is refused (it would do nothing)."""
    if any(record_format(path) for path in files):
        check_column_types((schema for path in files for schema in record_schemas(path)), cfg.selection)
        return Counts()
    selection = cfg.selection
    flags = [flag for flag, given in (("--filter", selection.filters), ("--min_chars", selection.min_chars),
                                      ("--max_chars", selection.max_chars is not None), ("--dedup", selection.dedup),
                                      ("--text_field", selection.text_field != "text")) if given]
    if flags:
        raise DataError(flags[0], f"applies to Parquet, JSON Lines and Arrow inputs; {cfg.input_file} is text of "
                                  "one sentence a line (drop the flag, or pass the records)")
    return None


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size


def _write_instances(cfg: ShardConfig, docs: Documents, vocab: Vocab, compression: str | None,
                     disable: bool | None) -> int:
    """Google's sentence-pair instances of docs, statically masked, into cfg.output_file; their number."""
    masking = MaskingConfig(cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.masked_lm_prob,
                            cfg.short_seq_prob, cfg.dupe_factor, cfg.whole_word_masking)
    rng = random.Random(cfg.random_seed)
    gen = np.random.default_rng(cfg.random_seed)
    with tqdm(total=docs.num_documents * cfg.dupe_factor, unit="doc", desc=f"instances {Path(cfg.output_file).name}",
              disable=disable, leave=False) as bar:
        spans = pair_spans(docs, masking, rng, on_progress=bar.update)
    spans = spans[gen.permutation(len(spans))]  # Google shuffles the instances of all passes together
    spans = truncate_spans(spans, cfg.max_seq_length - 3, gen)
    continuation = None
    if cfg.whole_word_masking:
        continuation = np.fromiter((t.startswith("##") for t in vocab.tokens), dtype=bool, count=len(vocab))
    special = SpecialIds(vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.id("[MASK]"), len(vocab), continuation)
    # Block by block into the file: memory holds one block of rows, not the shard (~0.9 KB a row at 128/20).
    blocks = instance_blocks(docs.tokens, spans, masking, special, gen)
    write_shard_blocks(Path(cfg.output_file), len(spans), instance_row_shapes(masking), blocks,
                       {**shard_attributes(cfg, len(vocab), vocab.sha256), **source_tokens(cfg, docs)},
                       compression=compression, clean=not cfg.checked_by_caller)
    return len(spans)


def shard_task(cfg: ShardConfig) -> int:
    """One shard as a task of dataprep/engine.py (local processes or Dask workers): the number of instances."""
    return create_shard(cfg, progress=False).instances
