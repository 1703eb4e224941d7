"""Prepare BERT pre-training data, with NVIDIA's actions and flags.

  --action download | text_formatting | sharding | create_hdf5_files | create_vocab
  --dataset wikicorpus_en | bookscorpus | books_wiki_en_corpus | python_docs | custom | google_pretrained_weights |
            squad | mrpc | sst-2 | cola | sts-b | rte | glue | all

--dataset custom is a corpus of your own Parquet, JSON Lines or save_to_disk files, in named sources mixed by
epochs (--source web=/data/web/*.parquet --source wiki:3=/data/wiki.jsonl.zst), with the record flags of
create_pretraining_data.py (--text_field, --filter, --min_chars, --max_chars, --dedup); text_formatting records them,
the later actions read them from there. See docs/your-corpus.md.

Everything lives under $BERT_PREP_WORKING_DIR (default `data/` in the checkout); see bertrecipe/dataprep/layout.py.
"""
from __future__ import annotations

import argparse
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from tqdm import tqdm

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.cli.record_flags import add_record_arguments, selection_from
from bertrecipe.common.atomic_files import remove_stale_temporaries_of
from bertrecipe.common.errors import DataError
from bertrecipe.common.files import file_sha256
from bertrecipe.common.output_paths import check_writable_folder
from bertrecipe.dataprep import corpus_sources, download, engine, layout, text_formatting
from bertrecipe.dataprep.create_pretraining_data import (
    ShardConfig,
    check_shard_paths,
    expected_attributes,
    shard_task,
    text_attributes,
    validate,
)
from bertrecipe.dataprep.outputs import inside, refuse_data_input_as_output
from bertrecipe.dataprep.records import Selection
from bertrecipe.dataprep.shard_writer import is_complete
from bertrecipe.dataprep.sharding import ShardingConfig, segment_tasks, shard_corpus
from bertrecipe.dataprep.vocab_training import train_bpe, train_vocab, vocab_path
from bertrecipe.tokenization.bpe import is_bpe_file, load_bpe
from bertrecipe.tokenization.wordpiece import load_vocab

# tqdm's default lock is a multiprocessing semaphore that spawn workers leak warnings about; threads suffice.
tqdm.set_lock(threading.RLock())

ACTIONS = ("download", "text_formatting", "sharding", "create_hdf5_files", "create_vocab")
TEXT_CORPORA = ("wikicorpus_en", "bookscorpus", "python_docs")
GLUE_TASKS = ("cola", "sst-2", "mrpc", "sts-b", "rte")
DATASETS = (TEXT_CORPORA + (corpus_sources.CORPUS, "books_wiki_en_corpus", "google_pretrained_weights", "squad",
                            "glue", "all") + GLUE_TASKS)


@dataclass(frozen=True)
class PrepConfig:
    action: str
    dataset: str
    root: Path
    n_training_shards: int
    n_test_shards: int
    fraction_test_set: float
    n_processes: int
    random_seed: int
    dupe_factor: int
    masked_lm_prob: float
    short_seq_prob: float
    max_seq_length: int
    max_predictions_per_seq: int
    do_lower_case: bool
    whole_word_masking: bool
    vocab_file: Path | None
    vocab_size: int
    bookscorpus_url_list: Path | None
    compression: str
    engine: engine.EngineConfig = engine.EngineConfig()  # where formatting, sharding and hdf5 tasks run
    document_chunks: bool = False  # create_hdf5_files: masked-LM-only rows of whole documents
    vocab_type: str = "wordpiece"  # create_vocab: wordpiece (vocab.txt) or bpe (byte-level, tokenizer.json)
    sources: tuple[corpus_sources.Source, ...] = ()  # --dataset custom, text_formatting: the mixture's sources
    selection: Selection = Selection()  # --dataset custom, text_formatting: which records are documents
    drop_sources: tuple[str, ...] = ()  # --dataset custom, text_formatting: sources of earlier calls to leave out
    allow_vocab_mismatch: bool = False  # create_hdf5_files: a casing the vocab contradicts is a warning


def corpus_members(dataset: str, root: Path | None = None) -> tuple[str, ...]:
    """The formatted corpora a sharding/hdf5 dataset is made of (of the custom corpus: its sources, as
    text_formatting recorded them under root)."""
    if dataset == corpus_sources.CORPUS:
        recorded = corpus_sources.read_sources(root or layout.working_dir())["sources"]
        return tuple(f"{corpus_sources.CORPUS}_{source['name']}" for source in recorded)
    if dataset == "books_wiki_en_corpus":
        return ("bookscorpus", "wikicorpus_en")
    if dataset in TEXT_CORPORA:
        return (dataset,)
    raise DataError("--dataset", f"{dataset} is not a text corpus (choose from {', '.join(TEXT_CORPORA)}, "
                                 "books_wiki_en_corpus)")


def default_vocab(cfg: PrepConfig) -> Path:
    name = "uncased_L-24_H-1024_A-16" if cfg.do_lower_case else "cased_L-24_H-1024_A-16"
    return layout.download_dir(cfg.root) / "google_pretrained_weights" / name / "vocab.txt"


def default_book_list(root: Path) -> Path:
    """Where --action download looks for the BookCorpus URL list without --bookscorpus_url_list."""
    return layout.download_dir(root) / "bookscorpus_url_list.txt"


def do_download(cfg: PrepConfig) -> None:
    root = layout.download_dir(cfg.root)
    not_downloaded = {"books_wiki_en_corpus", "python_docs", corpus_sources.CORPUS}
    wanted = set(DATASETS[:-1]) - not_downloaded if cfg.dataset == "all" else {cfg.dataset}
    if "books_wiki_en_corpus" in wanted:
        wanted |= {"bookscorpus", "wikicorpus_en"}
    # Beside, not inside, download/bookscorpus/: every .txt in there is taken for a book.
    url_list = cfg.bookscorpus_url_list or default_book_list(cfg.root)
    if "bookscorpus" in wanted:
        download.read_book_urls(url_list)  # a missing or bad list fails now, not after the other downloads
        if inside(url_list, root / "bookscorpus"):
            raise DataError(url_list, f"--bookscorpus_url_list is inside {root / 'bookscorpus'}, where every .txt "
                                      f"is read as a book; move it (e.g. to {default_book_list(cfg.root)})")
    if "wikicorpus_en" in wanted:
        download.fetch(download.WIKI_URL, root / "wikicorpus_en" / "wikicorpus_en.xml.bz2")
    if "bookscorpus" in wanted:
        ok, skipped = download.download_books(url_list, root / "bookscorpus")
        print(f"bookscorpus: {ok} books present, {skipped} entries failed or had no .txt URL and were skipped")
    if "google_pretrained_weights" in wanted:
        for folder in download.download_google_weights(root):
            print(f"verified {folder}")
    if "squad" in wanted:
        download.download_squad(root)
    glue = [t for t in GLUE_TASKS if t in wanted or "glue" in wanted]
    if glue:
        download.download_glue(root, glue)
    print(f"downloads are in {root}")


def _format_sources(cfg: PrepConfig, corpus: str) -> list:
    """The dumps or book groups of a corpus (none for the embedded one); refuses an output that is, or lies
    among, them."""
    output = layout.formatted_text(cfg.root, corpus)
    source = layout.download_dir(cfg.root) / corpus
    if corpus == "wikicorpus_en":
        dumps = sorted(source.glob("*.xml.bz2")) + sorted(source.glob("*.xml"))
        if not dumps:
            raise DataError(source, "no Wikipedia dump (*.xml.bz2 or *.xml) found; run --action download")
        refuse_data_input_as_output(output, "the formatted text", [("dump", d) for d in dumps],
                               f"make {output.parent} a folder of its own")
        return dumps
    if corpus == "bookscorpus":
        books = text_formatting.book_groups(source)
        if inside(output, source):  # a symlinked folder: the output would be read as a book next time
            raise DataError(output, f"the formatted text would be written inside the book folder {source}, where "
                                    f"every .txt is read as a book; make {output.parent} a folder of its own")
        return books
    return []


def do_text_formatting(cfg: PrepConfig) -> None:
    if cfg.dataset == corpus_sources.CORPUS:
        do_custom_formatting(cfg)
        return
    corpora = corpus_members(cfg.dataset)
    sources = {corpus: _format_sources(cfg, corpus) for corpus in corpora}  # all checked before any write
    used: set[str] = set()
    with engine.open_runner(cfg.engine) as run:  # a Dask scheduler answers before the first write
        for corpus in corpora:
            output = layout.formatted_text(cfg.root, corpus)
            tasks = text_formatting.format_tasks(corpus, sources[corpus])
            with tqdm(desc=f"format {corpus}", unit="article", disable=None) as bar:
                source = layout.download_dir(cfg.root) / corpus if sources[corpus] else None
                count = text_formatting.format_corpus(tasks, output, _runner(cfg, run, len(tasks), used),
                                                      bar.update, source)
            print(f"{corpus}: {count} articles -> {output}")
    _report_workers(used)


def do_custom_formatting(cfg: PrepConfig) -> None:
    """--dataset custom: each --source formatted (tasks by file and row group), then what they held recorded."""
    if not cfg.sources and not cfg.drop_sources:
        raise DataError("--source", "--dataset custom needs at least one --source NAME[:EPOCHS]=FILES (or "
                                    "--input_files FILES)")
    used: set[str] = set()
    with engine.open_runner(cfg.engine) as run, tqdm(desc="format custom", unit="record", disable=None) as bar:
        plans = {source.name: corpus_sources.plan_source(source, cfg.selection) for source in cfg.sources}  # once
        n_tasks = sum(len(plan.tasks) for plan in plans.values())
        described = corpus_sources.format_custom(list(cfg.sources), cfg.selection, cfg.root,
                                                 _runner(cfg, run, n_tasks, used), bar.update, cfg.drop_sources, plans)
    for source in described:
        counts = source["counts"]
        if not source["this_call"]:
            print(f"{source['name']}: from an earlier call ({counts['kept']} documents; --drop_source "
                  f"{source['name']} leaves it out)")
            continue
        again = " (formatted before from the same files and selection: reused)" if source["reused"] else ""
        print(f"{source['name']}: {counts['kept']} of {counts['records']} records kept -> {source['formatted']}{again}")
    mixture = ", ".join(f"{source['name']} x{source['epochs']:g}" for source in described)
    print(f"the mixture: {mixture}; recorded in {corpus_sources.sources_file(cfg.root)}")
    _report_workers(used)


def do_sharding(cfg: PrepConfig) -> None:
    members = corpus_members(cfg.dataset, cfg.root)
    inputs = tuple(layout.formatted_text(cfg.root, c) for c in members)
    out = layout.sharded_dir(cfg.root, cfg.n_training_shards, cfg.n_test_shards, cfg.fraction_test_set) / cfg.dataset
    sources = corpus_sources.read_sources(cfg.root) if cfg.dataset == corpus_sources.CORPUS else None
    epochs = tuple(float(s["epochs"]) for s in sources["sources"]) if sources else ()
    scfg = ShardingConfig(inputs, out, cfg.dataset, cfg.n_training_shards, cfg.n_test_shards, cfg.fraction_test_set,
                          epochs, cfg.random_seed)
    used: set[str] = set()
    with engine.open_runner(cfg.engine) as run, tqdm(desc=f"shard {cfg.dataset}", unit="article", disable=None) as bar:
        result = shard_corpus(scfg, bar.update, _runner(cfg, run, len(segment_tasks(inputs)), used))
    for split, counts in result.sentences.items():
        if counts:
            print(f"{split}: {len(counts)} shards, {min(counts)}-{max(counts)} sentences each")
    print(f"{result.articles} articles -> {out}")
    if sources is not None:
        corpus_sources.write_mixture(out, sources, result.by_input, cfg.random_seed, result.input_runs)
        for source, given in zip(sources["sources"], result.by_input, strict=True):
            print(f"  {source['name']} (x{source['epochs']:g}): {given['training']} training articles as "
                  f"{given['training_copies']} copies, {given['test']} test")
    _report_workers(used)


def _runner(cfg: PrepConfig, run: engine.Runner, n_tasks: int, used: set[str]) -> engine.Runner | None:
    """The engine's runner, recording the Dask workers it used; None where the tasks would run in this process
    anyway: then they run here with a progress bar that moves article by article."""
    if engine.runs_here(cfg.engine, n_tasks):
        return None
    return lambda function, tasks, on_done: used.update(run(function, tasks, on_done))


def _report_workers(used: set[str]) -> None:
    if used:
        print(f"tasks ran on {len(used)} Dask workers: {' '.join(sorted(used))}")


def _shard_jobs(cfg: PrepConfig, vocab: Path) -> list[ShardConfig]:
    text_dir = layout.sharded_dir(cfg.root, cfg.n_training_shards, cfg.n_test_shards, cfg.fraction_test_set)
    params = layout.InstanceParams(cfg.do_lower_case, cfg.max_seq_length, cfg.max_predictions_per_seq,
                                   cfg.masked_lm_prob, cfg.random_seed, cfg.dupe_factor, cfg.document_chunks,
                                   is_bpe_file(vocab))
    mixture = _custom_mixture(cfg) if cfg.dataset == corpus_sources.CORPUS else {}
    jobs = []
    for split, count in (("training", cfg.n_training_shards), ("test", cfg.n_test_shards)):
        for i in range(count):
            source = layout.text_shard(cfg.root, cfg.n_training_shards, cfg.n_test_shards, cfg.fraction_test_set,
                                       cfg.dataset, split, i)
            if not source.is_file():
                raise DataError(source, f"text shard not found under {text_dir}; run --action sharding first")
            jobs.append(ShardConfig(source, layout.hdf5_shard(cfg.root, params, cfg.dataset, split, i), vocab,
                                    cfg.do_lower_case, cfg.max_seq_length, cfg.max_predictions_per_seq,
                                    cfg.masked_lm_prob, cfg.short_seq_prob, cfg.dupe_factor, cfg.random_seed,
                                    cfg.whole_word_masking, cfg.compression, checked_by_caller=True,
                                    document_chunks=cfg.document_chunks, text_sha256=_sha256(source),
                                    source_bytes=corpus_sources.source_runs(mixture, source),
                                    allow_vocab_mismatch=cfg.allow_vocab_mismatch))
    return jobs


def _custom_mixture(cfg: PrepConfig) -> dict:
    """The custom corpus's mixture file beside its text shards (what sharding gave each source and shard)."""
    text_dir = layout.sharded_dir(cfg.root, cfg.n_training_shards, cfg.n_test_shards, cfg.fraction_test_set)
    mixture_path = corpus_sources.mixture_file(text_dir / cfg.dataset)
    try:
        return json.loads(mixture_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(mixture_path, f"unreadable ({err}); run --action sharding --dataset custom again") from None


def _sha256(path: Path) -> str:
    """A text shard's sha256, which its HDF5 shard records: sharding again with other text remakes the shard."""
    try:
        return file_sha256(path)
    except OSError as err:
        raise DataError(path, f"cannot read the text shard ({err.strerror}); run --action sharding again") from None


def _prepare_hdf5_dirs(jobs: list[ShardConfig]) -> None:
    """After every check passed: make the shard folders (so that workers never race to make or remove them) and
    remove the temporaries that killed runs left beside any of the shards."""
    for folder in sorted({job.output_file.parent for job in jobs}):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DataError(folder, f"cannot create the shard folder ({err.strerror}); check the permissions of "
                                    "$BERT_PREP_WORKING_DIR") from None
    remove_stale_temporaries_of(job.output_file for job in jobs)  # so the shard tasks need not


def do_create_hdf5_files(cfg: PrepConfig) -> None:
    corpus_members(cfg.dataset, cfg.root)
    if cfg.n_training_shards < 1:
        raise DataError("--n_training_shards", f"must be at least 1, got {cfg.n_training_shards}")
    engine.validate_engine(cfg.engine)
    vocab_file = cfg.vocab_file or default_vocab(cfg)
    jobs = _shard_jobs(cfg, vocab_file)
    validate(jobs[0])
    expected = expected_attributes(jobs[0])  # reads the vocab (or tokenizer.json): a bad one is refused here
    for job in jobs:
        check_shard_paths(job)  # no shard may be the vocab or a text shard, whatever symlinks the working dir holds
    # A shard that exists with the same parameters is complete (it was renamed into place): skip it.
    shared = {key: value for key, value in expected.items() if key not in text_attributes(jobs[0])}
    todo = [j for j in jobs if not is_complete(j.output_file, {**shared, **text_attributes(j)})]
    print(f"{len(jobs) - len(todo)} of {len(jobs)} shards already complete")
    if not todo:
        _prepare_hdf5_dirs(jobs)
        print(f"shards are in {jobs[0].output_file.parent.parent}")
        return
    # The engine is reached (a Dask scheduler answers) before the first folder is made.
    with engine.open_runner(cfg.engine) as run, \
            tqdm(total=len(todo), desc="hdf5 shards", unit="shard", disable=None) as bar:
        _prepare_hdf5_dirs(jobs)
        # Each shard depends only on its text and the seed: the engine and worker count cannot change the output.
        workers = run(shard_task, [(job,) for job in todo], lambda _: bar.update())
    if workers:
        print(f"{len(todo)} shards made by {len(workers)} Dask workers: {' '.join(sorted(workers))}")
    print(f"shards are in {jobs[0].output_file.parent.parent}")
    if cfg.dataset == corpus_sources.CORPUS:
        _write_custom_manifest(cfg, jobs, vocab_file, expected)


def _write_custom_manifest(cfg: PrepConfig, jobs: list[ShardConfig], vocab_file: Path, attributes: dict) -> None:
    """manifest.json beside the custom corpus's shards: sources, mixture, tokenizer, counts and checksums."""
    mixture = _custom_mixture(cfg)
    tokenizer = {"file": str(vocab_file), "sha256": attributes.get("vocab_sha256"),
                 "size": attributes.get("vocab_size"), "kind": attributes.get("tokenizer", "wordpiece")}
    parameters = {key: value.item() if hasattr(value, "item") else value for key, value in attributes.items()
                  if key not in ("vocab_sha256", "vocab_size", "tokenizer", "text_sha256", "source_bytes")}
    shards = {split: [job.output_file for job in jobs if job.output_file.parent.name == split]
              for split in layout.SPLITS}
    manifest = jobs[0].output_file.parent.parent / "manifest.json"
    record = corpus_sources.write_manifest(manifest, mixture, tokenizer, parameters, shards)
    totals = ", ".join(f"{split} {t['rows']} rows, {t['tokens']} tokens" for split, t in record["totals"].items())
    print(f"manifest ({totals}) -> {manifest}")


def do_create_vocab(cfg: PrepConfig) -> None:
    inputs = [layout.formatted_text(cfg.root, c) for c in corpus_members(cfg.dataset, cfg.root)]
    bpe = cfg.vocab_type == "bpe"
    output = cfg.vocab_file or vocab_path(cfg.root, cfg.dataset, cfg.do_lower_case, cfg.vocab_size, bpe)
    if is_bpe_file(output) != bpe:  # a file still to be written counts by its suffix; an existing one by content
        raise DataError(output, "--vocab_file of --vocab_type bpe must end in .json and not be a WordPiece "
                                "tokenizer.json, of wordpiece must not end in .json")
    if bpe:
        train_bpe(inputs, output, cfg.vocab_size)
        print(f"BPE tokenizer ({load_bpe(output).size} tokens, a multiple of 64) -> {output}")
        return
    train_vocab(inputs, output, cfg.vocab_size, cfg.do_lower_case)
    print(f"vocab ({len(load_vocab(output))} tokens) -> {output}")


def parse_args(argv: list[str] | None = None) -> PrepConfig:
    p = ArgumentParser(prog="bertPrep.py", description=__doc__.split("\n")[0])
    p.add_argument("--action", choices=ACTIONS, required=True)
    p.add_argument("--dataset", choices=DATASETS, required=True)
    p.add_argument("--input_files", help="--dataset custom: the files of one source (as --source input=FILES); other "
                                         "datasets: accepted for compatibility, inputs come from the working directory")
    p.add_argument("--source", action="append", default=[], metavar="NAME[:EPOCHS]=FILES",
                   help="--dataset custom, text_formatting: a source of the mixture, e.g. web=/data/web/*.parquet or "
                        "wiki:3=/data/wiki.jsonl.zst (FILES as create_pretraining_data.py's --input_file); repeat. "
                        "Sources of earlier calls stay in the mixture (a source with other record flags is a call "
                        "of its own)")
    p.add_argument("--drop_source", action="append", default=[], metavar="NAME",
                   help="--dataset custom, text_formatting: leave a source of an earlier call out of the mixture "
                        "(with --source NAME=FILES in the same call: replace it)")
    p.add_argument("--n_training_shards", type=int, default=256)
    p.add_argument("--n_test_shards", type=int, default=256)
    p.add_argument("--fraction_test_set", type=float, default=0.1)
    p.add_argument("--segmentation_method", default="blingfire", help="accepted for compatibility; blingfire")
    p.add_argument("--n_processes", type=int, default=4)
    p.add_argument("--random_seed", type=int, default=12345)
    p.add_argument("--dupe_factor", type=int, default=5)
    p.add_argument("--masked_lm_prob", type=float, default=0.15)
    p.add_argument("--short_seq_prob", type=float, default=0.1)
    p.add_argument("--max_seq_length", type=int, default=512)
    p.add_argument("--max_predictions_per_seq", type=int, default=20)
    p.add_argument("--do_lower_case", type=int, choices=(0, 1), default=1)
    p.add_argument("--allow_vocab_mismatch", action="store_true",
                   help="create_hdf5_files: warn instead of refusing a casing the WordPiece vocab contradicts")
    p.add_argument("--whole_word_masking", action="store_true")
    p.add_argument("--vocab_file", type=Path,
                   help="create_hdf5_files: the tokenizer, a WordPiece vocab.txt or tokenizer.json (a released "
                        "BERT's), or with --document_chunks a byte-level BPE tokenizer.json (a released ModernBERT's); "
                        "create_vocab: the file to write")
    p.add_argument("--vocab_size", type=int, default=30522,
                   help="size of the vocab trained by create_vocab (BPE: then padded to a multiple of 64)")
    p.add_argument("--vocab_type", choices=("wordpiece", "bpe"), default="wordpiece",
                   help="create_vocab: a WordPiece vocab.txt (default) or a cased byte-level BPE tokenizer.json "
                        "(ModernBERT-style, for --document_chunks)")
    p.add_argument("--document_chunks", action="store_true",
                   help="create_hdf5_files: masked-LM-only shards of whole documents cut at --max_seq_length (see "
                        "create_pretraining_data.py --help), under hdf5_document_chunks_*")
    p.add_argument("--bookscorpus_url_list", "--bookcorpus_url_list", type=Path,
                   help="BookCorpus list for --action download (none is shipped): one plain-text book URL a line, "
                        "or soskek/bookcorpus's url_list.jsonl (its \"txt\" URLs are used) "
                        "(default: <working dir>/download/bookscorpus_url_list.txt)")
    p.add_argument("--compression", choices=("gzip", "lzf", "none"), default="none",
                   help="HDF5 compression of the shards (see create_pretraining_data.py --help)")
    add_record_arguments(p)
    _add_engine_args(p)
    p.add_argument("--skip_wikiextractor", type=int, default=0, help="accepted for compatibility")
    p.add_argument("--interactive_json_config_generator", help="accepted for compatibility")
    a = p.parse_args(argv)
    return PrepConfig(a.action, a.dataset, layout.working_dir(), a.n_training_shards, a.n_test_shards,
                      a.fraction_test_set, a.n_processes, a.random_seed, a.dupe_factor, a.masked_lm_prob,
                      a.short_seq_prob, a.max_seq_length, a.max_predictions_per_seq, bool(a.do_lower_case),
                      a.whole_word_masking, a.vocab_file, a.vocab_size, a.bookscorpus_url_list, a.compression,
                      _engine_config(a), document_chunks=a.document_chunks, vocab_type=a.vocab_type,
                      sources=_sources(a), selection=selection_from(a), drop_sources=tuple(a.drop_source),
                      allow_vocab_mismatch=a.allow_vocab_mismatch)


def _sources(a: argparse.Namespace) -> tuple[corpus_sources.Source, ...]:
    sources = [corpus_sources.parse_source(text) for text in a.source]
    if a.input_files and a.dataset == corpus_sources.CORPUS:
        sources.append(corpus_sources.Source("input", corpus_sources.absolute_spec(a.input_files)))
    if sources and a.dataset != corpus_sources.CORPUS:
        raise DataError("--source", f"names the files of --dataset custom, not of {a.dataset}")
    return tuple(sources)


def _add_engine_args(p: ArgumentParser) -> None:
    g = p.add_argument_group("where text_formatting, sharding and create_hdf5_files run (see "
                                 "bertrecipe/dataprep/engine.py; the output is the same on all)")
    g.add_argument("--engine", choices=engine.ENGINES, default=None,
                   help="local: --n_processes processes (default); dask: a running Dask cluster (implied by "
                        "--scheduler/--scheduler_file); slurm: Dask workers in Slurm jobs (dask-jobqueue)")
    g.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://node1:8786")
    g.add_argument("--scheduler_file", type=Path, help="the JSON file of `dask scheduler --scheduler-file`")
    g.add_argument("--scheduler_timeout", type=float, default=60.0,
                   help="seconds to reach the scheduler and see its first worker (default 60)")
    g.add_argument("--scheduler_host", help="--engine slurm: the address the scheduler listens on (default: "
                                            "Dask's choice); the workers must reach it")
    g.add_argument("--slurm_jobs", type=int, default=1, help="--engine slurm: Slurm jobs of workers")
    g.add_argument("--slurm_cores", type=int, default=8, help="--engine slurm: worker processes (cores) per job")
    g.add_argument("--slurm_memory", default="32GB", help="--engine slurm: memory per job")
    g.add_argument("--slurm_walltime", default="04:00:00", help="--engine slurm: time limit per job")
    g.add_argument("--slurm_queue", help="--engine slurm: partition")
    g.add_argument("--slurm_account", help="--engine slurm: account")


def _engine_config(a: argparse.Namespace) -> engine.EngineConfig:
    name = a.engine or ("dask" if a.scheduler or a.scheduler_file else "local")
    return engine.EngineConfig(name, a.n_processes, a.scheduler, a.scheduler_file, a.scheduler_timeout,
                               a.scheduler_host, a.slurm_jobs, a.slurm_cores, a.slurm_memory, a.slurm_walltime,
                               a.slurm_queue, a.slurm_account)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    if cfg.action != "create_vocab" or cfg.vocab_file is None:  # every output of the action is under it
        check_writable_folder(cfg.root, "$BERT_PREP_WORKING_DIR")
    if cfg.engine.engine != "local" and cfg.action in ("download", "create_vocab"):
        raise DataError("--engine", f"Dask runs text_formatting, sharding and create_hdf5_files, not {cfg.action}; "
                                    "drop --engine, --scheduler and --scheduler_file for this action")
    {"download": do_download, "text_formatting": do_text_formatting, "sharding": do_sharding,
     "create_hdf5_files": do_create_hdf5_files, "create_vocab": do_create_vocab}[cfg.action](cfg)


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
