"""bertPrep.py --dataset custom: a corpus of the user's own record files (Parquet, JSON Lines, datasets' Arrow
folders) as named sources mixed by epochs (web 1x, wiki 3x, books 2x).

Formatting runs as tasks of one file, or of a range of a Parquet file's row groups (so one large file is parallel
work), each writing its kept documents one a line to a part in a scratch folder; the parts are joined in corpus
order into one formatted file per source, exact duplicates dropped across the whole source on request (the tasks
hash, the join keeps 8 bytes a document: SeenHashes). What each source is and gave goes into
`<corpus>_sources.json` beside the formatted text, with absolute paths; sharding (epochs) and create_hdf5_files (the
manifest) read it, so they need no --source again. A file belongs to one source, and a source name to one set of
files; every file is stamped when planned (common/files.py's FileStamp) and refused if it changes before its
source is formatted."""
from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
from array import array
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from bertrecipe.common.atomic_files import atomic_output, scratch_folder, write_atomic
from bertrecipe.common.errors import DataError
from bertrecipe.common.files import FileStamp, file_sha256
from bertrecipe.dataprep import layout
from bertrecipe.dataprep.documents import input_files
from bertrecipe.dataprep.engine import Runner, in_order
from bertrecipe.dataprep.records import (
    Counts,
    Selection,
    arrow_files,
    check_column_types,
    documents,
    normalised_text,
    parquet_file,
    record_format,
    record_schemas,
)
from bertrecipe.dataprep.text_formatting import append_part

CORPUS = "custom"
TASK_BYTES = 64 << 20  # uncompressed Parquet bytes (of all columns, as the footer counts them) a task reads
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_SOURCE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)(?::([0-9.]+))?=(.+)$")


@dataclass(frozen=True)
class Source:
    """One named source of the mixture: its files (as --input_file names them) and how often its training
    documents are seen (2: twice; 0.5: each kept with probability one half)."""

    name: str
    spec: str
    epochs: float = 1.0


def parse_source(text: str) -> Source:
    """NAME[:EPOCHS]=FILES, e.g. `web=/data/fineweb/*.parquet` or `wiki:3=/data/wiki.jsonl.zst`."""
    match = _SOURCE.match(text.strip())
    epochs = _epochs(match.group(2)) if match and match.group(2) else 1.0
    if not match or not epochs > 0:
        raise DataError("--source", f"{text!r} is not NAME[:EPOCHS]=FILES with EPOCHS > 0 (e.g. --source "
                                    "web=/data/web/*.parquet --source wiki:3=/data/wiki.jsonl.zst)")
    return Source(match.group(1), absolute_spec(match.group(3)), epochs)


def absolute_spec(spec: str, base: Path | None = None) -> str:
    """FILES of a source (a path, or a comma-separated list of paths and glob patterns, as input_paths reads them)
    with each relative path made absolute against base (default: the current folder), so that the record of the
    call, and a later call from another folder, name the same files."""
    folder = str(base) if base is not None else os.getcwd()

    def absolute(part: str) -> str:
        return part if os.path.isabs(part) else os.path.join(folder, part)
    if os.path.exists(absolute(spec)) or "," not in spec and not glob.has_magic(spec):
        return absolute(spec)
    return ",".join(absolute(part.strip()) for part in spec.split(",") if part.strip())


def _epochs(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return -1.0


def formatted_name(source: Source) -> str:
    """The corpus name of a source's formatted text (layout.formatted_text)."""
    return f"{CORPUS}_{source.name}"


def sources_file(root: Path) -> Path:
    return layout.formatted_text(root, CORPUS).with_name(f"{CORPUS}_sources.json")


Tasks = list[tuple[str, tuple[int, ...] | None]]  # (file, its row groups, or None for the whole file)


@dataclass(frozen=True)
class SourcePlan:
    """A source's input files as planned, each with the stamp taken before its first read, and its formatting
    tasks in corpus order."""

    files: tuple[tuple[str, FileStamp], ...]
    tasks: Tasks

    def check_files(self, source: Source) -> None:
        """A DataError naming the first file of the source that changed since it was planned."""
        for path, stamp in self.files:
            stamp.check(path, f"input file of --source {source.name}")


def plan_source(source: Source, selection: Selection) -> SourcePlan:
    """A source's files (stamped before they are read), its tasks (one a file, or a Parquet file's row groups in runs
    of TASK_BYTES, from its footer) and its filtered columns checked for one type each (check_column_types): all
    before anything is written."""
    files: list[tuple[str, FileStamp]] = []
    tasks: Tasks = []
    schemas: list[tuple[Path, Any]] = []
    for path in input_files(source.spec):
        kind = record_format(path)
        if kind is None:
            raise DataError(path, f"--source {source.name}: text, not Parquet, JSON Lines or Arrow records (text of "
                                  "one sentence a line goes through create_pretraining_data.py)")
        files += [(str(file), FileStamp.of(file)) for file in (arrow_files(path) if path.is_dir() else [path])]
        if kind == "parquet":
            parquet = parquet_file(path)
            schemas.append((path, parquet.schema_arrow))
            tasks += _row_group_tasks(str(path), parquet.metadata)
            continue
        if kind == "arrow" and selection.filters:
            schemas += record_schemas(path)
        tasks.append((str(path), None))  # a compressed stream cannot be entered in the middle
    check_column_types(schemas, selection)
    return SourcePlan(tuple(files), tasks)


def _row_group_tasks(path: str, metadata: Any) -> Tasks:
    """A Parquet file's row groups in runs of about TASK_BYTES (uncompressed), a task each; a file without row
    groups is one task of none."""
    tasks: Tasks = []
    group: list[int] = []
    size = 0
    for index in range(metadata.num_row_groups):
        group.append(index)
        size += metadata.row_group(index).total_byte_size
        if size >= TASK_BYTES:
            tasks.append((path, tuple(group)))
            group, size = [], 0
    if group or not tasks:
        tasks.append((path, tuple(group)))
    return tasks


def format_records(path: str, row_groups: tuple[int, ...] | None, selection: Selection, part: str) -> dict[str, int]:
    """One formatting task: the documents of a file (or of its row groups) that the selection keeps, one a line
    with a blank line after each, into part; with dedup, each one's hash into `<part>.hashes.npy` (the join drops
    the duplicates, across tasks). The counts."""
    counts = Counts()
    hashes = array("Q")
    groups = list(row_groups) if row_groups is not None else None
    try:
        with open(part, "w", encoding="utf-8") as out:
            for text in documents(Path(path), replace(selection, dedup=False), counts, groups):
                line = " ".join(text.split())
                if not line:
                    counts.kept -= 1
                    counts.too_short += 1
                    continue
                out.write(line + "\n\n")
                if selection.dedup:
                    hashes.append(_hash(text))
    except OSError as err:
        raise DataError(part, f"cannot write ({err.strerror}); check free space and permissions") from None
    if selection.dedup:
        np.save(part + ".hashes.npy", np.frombuffer(hashes, dtype=np.uint64))
    return counts.as_dict()


def _hash(text: str) -> int:
    digest = hashlib.blake2b(normalised_text(text).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def format_source(source: Source, selection: Selection, output: Path, run: Runner | None,
                  on_documents: Callable[[int], None] | None = None, plan: SourcePlan | None = None) -> Counts:
    """A source's tasks run (run: dataprep/engine.py's runner, or None: here) and joined into output atomically;
    what the selection did. Its files must be as planned when it starts and when its tasks are done. A failure
    leaves no output, part or folder behind, and an earlier output as it was."""
    plan = plan_source(source, selection) if plan is None else plan
    plan.check_files(source)
    total = Counts()
    seen = SeenHashes()
    with atomic_output(output) as tmp, scratch_folder(output) as scratch:
        parts = [str(scratch / f"part-{i:06d}.txt") for i in range(len(plan.tasks))]
        jobs = [(path, groups, selection, part) for (path, groups), part in zip(plan.tasks, parts, strict=True)]
        with _writing(output), open(tmp, "wb") as out, closing(in_order(run, format_records, jobs)) as results:
            for part, counts in zip(parts, results, strict=True):
                for key, value in counts.items():
                    setattr(total, key, getattr(total, key) + value)
                if selection.dedup:
                    total.duplicates += _append_new(part, out, seen)
                    total.kept = total.records - total.filtered - total.too_short - total.too_long - total.duplicates
                else:
                    append_part(part, out)
                if on_documents is not None:
                    on_documents(counts["records"])
        plan.check_files(source)  # a file changed while the tasks read it: the output is discarded
        if total.records == 0:
            raise DataError(source.spec, f"--source {source.name}: its files hold no record (0 rows); check the "
                                         "files it names")
        if total.kept == 0:
            raise DataError(source.spec, f"--source {source.name}: no document left of {total.records} records "
                                         f"({total.dropped()}); loosen --filter, --min_chars or --max_chars")
    return total


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A full disk (or quota) while path is written, as one line naming it."""
    try:
        yield
    except OSError as err:
        if err.errno not in _FULL_DISK:
            raise
        raise DataError(path, f"cannot write ({err.strerror}); free some space and run the command again") from None


class SeenHashes:
    """The 8-byte hashes of the documents kept so far, 8 bytes each (a Python set of ints takes ~70): sorted runs,
    merged into one when there are more than MAX_RUNS, searched with a binary search each."""

    MAX_RUNS = 8

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []

    def first_copies(self, hashes: np.ndarray) -> np.ndarray:
        """Which of hashes (in order) were seen neither before nor earlier in hashes; those are noted as seen."""
        _, first = np.unique(hashes, return_index=True)
        new = np.zeros(len(hashes), dtype=bool)
        new[first] = True
        for run in self.runs:
            at = np.searchsorted(run, hashes).clip(max=len(run) - 1)
            new &= run[at] != hashes
        if new.any():
            self.runs.append(np.sort(hashes[new]))
        if len(self.runs) > self.MAX_RUNS:
            self.runs = [np.sort(np.concatenate(self.runs))]
        return new


def _append_new(part: str, out: Any, seen: SeenHashes) -> int:
    """Append the documents of part whose hash was not seen (and note theirs); the duplicates dropped."""
    keep = seen.first_copies(np.load(part + ".hashes.npy")).tolist()
    with open(part, "rb") as lines:
        articles = (line for line in lines if line.strip())
        for kept, line in zip(keep, articles, strict=True):
            if kept:
                out.write(line + b"\n")
    return keep.count(False)


def format_custom(sources: list[Source], selection: Selection, root: Path, run: Runner | None,
                  on_documents: Callable[[int], None] | None = None, drop: tuple[str, ...] = (),
                  plans: dict[str, SourcePlan] | None = None) -> list[dict[str, Any]]:
    """The sources formatted with this selection, then recorded in `<corpus>_sources.json` beside the sources of
    earlier calls (each with its own selection: a source whose text sits in another column, or that needs other
    filters, is formatted by a call of its own), less those in drop (a source of drop given again is replaced).
    A source formatted before from the same files (sizes and times) with the same selection is reused, so a stopped
    run started again formats only what it had not finished. Every source of the mixture, in order. plans: each
    source's plan_source, where the caller has them already (planning reads every Parquet file's footer)."""
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise DataError("--source", f"names must differ: {', '.join(names)}")
    recorded = read_sources(root)["sources"] if sources_file(root).is_file() else []
    unknown = [name for name in drop if name not in {entry["name"] for entry in recorded}]
    if unknown:
        raise DataError("--drop_source", f"{', '.join(unknown)}: no such source in {sources_file(root)}")
    kept = [entry for entry in recorded if entry["name"] not in drop]
    if not kept and not sources:
        raise DataError("--drop_source", "would leave the mixture without a source")
    if plans is None:  # every file checked before any is formatted
        plans = {source.name: plan_source(source, selection) for source in sources}
    _check_one_source_per_file(sources, plans, kept, root)
    mixture = {entry["name"]: {**entry, "this_call": False} for entry in kept}
    for source in sources:
        mixture[source.name] = {**_formatted(source, selection, root, run, on_documents, plans[source.name]),
                                "this_call": True}
    transient = ("this_call", "reused")  # what this call did, for its report alone
    _write_json(sources_file(root), {"corpus": CORPUS, "sources": [
        {key: value for key, value in entry.items() if key not in transient} for entry in mixture.values()]})
    return list(mixture.values())


def _check_one_source_per_file(sources: list[Source], plans: dict[str, SourcePlan], kept: list[dict[str, Any]],
                               root: Path) -> None:
    """Refuses a name of an earlier call's source given again for other files (it would replace that source
    unseen), and a file in two sources or twice in one (the mixture would hold its documents twice): one line
    naming both, before anything is formatted. Files are compared by their real paths (links followed)."""
    given = {source.name: source for source in sources}
    owners: dict[str, tuple[str, bool, str]] = {}  # real path -> (source, of an earlier call, the path as named)
    for entry in kept:
        files = _recorded_files(entry, root)
        if entry["name"] in given:  # formatted again: its files must be the same
            _refuse_other_files(given[entry["name"]], entry, files, [path for path, _ in
                                                                     plans[entry["name"]].files])
            continue
        for file in files:
            owners.setdefault(os.path.realpath(file), (entry["name"], True, file))
    for source in sources:
        for file, _ in plans[source.name].files:
            real = os.path.realpath(file)
            if real not in owners:
                owners[real] = (source.name, False, file)
                continue
            name, earlier, named = owners[real]
            if name == source.name and not earlier:
                spelt = f" (as {named})" if named != file else ""
                raise DataError(file, f"twice in --source {name}{spelt}; name each file once")
            where = f"{name} of an earlier call (as {named})" if earlier else f"--source {name}"
            fix = f"leave it out, or --drop_source {name}" if earlier else "leave it out of one of them"
            raise DataError(file, f"in --source {source.name} and in {where}; a file belongs to one source: {fix}")


def _refuse_other_files(source: Source, earlier: dict[str, Any], before: list[str], now: list[str]) -> None:
    if earlier["spec"] == source.spec or sorted(map(os.path.realpath, before)) == sorted(map(os.path.realpath, now)):
        return  # the same source (its FILES may match more files than before: they are its own)
    raise DataError(f"--source {source.name}", f"the mixture holds a source {source.name} of other files "
                                               f"({_listing(before)}); this call's: {_listing(now)}; give this one "
                                               f"another name, or replace that one with --drop_source {source.name} "
                                               f"--source {source.name}=FILES")


def _listing(paths: list[str], shown: int = 3) -> str:
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more if paths else "no file known"


def _recorded_files(entry: dict[str, Any], root: Path) -> list[str]:
    """The files an earlier call formatted a source from: as its done file records them, or (a done file gone, or
    one of relative paths, which older versions wrote) as its FILES name them now."""
    done = _read_json(_done_file(layout.formatted_text(root, f"{CORPUS}_{entry['name']}")))
    try:
        paths = [str(item["path"]) for item in done["identity"]["inputs"]]
    except (TypeError, KeyError):
        paths = []
    if paths and all(os.path.isabs(path) for path in paths):
        return paths
    try:
        return [str(file) for path in input_files(entry["spec"])
                for file in (arrow_files(path) if path.is_dir() else [path])]
    except DataError:  # its files are gone: none of them can be in this call
        return []


def _formatted(source: Source, selection: Selection, root: Path, run: Runner | None,
               on_documents: Callable[[int], None] | None, plan: SourcePlan) -> dict[str, Any]:
    """One source formatted (or its earlier formatting reused): its record in the sources file."""
    output = layout.formatted_text(root, formatted_name(source))
    inputs = [{"path": path, "size": stamp.size, "mtime_ns": stamp.mtime_ns} for path, stamp in plan.files]
    identity = {"name": source.name, "spec": source.spec, "selection": _selection_record(selection),
                "inputs": inputs}  # not the epochs: sharding applies them
    earlier = _read_json(_done_file(output)) if output.is_file() else None
    reused = earlier is not None and earlier.get("identity") == identity
    if reused:
        counts = earlier["counts"]
    else:
        counts = format_source(source, selection, output, run, on_documents, plan).as_dict()
        _write_json(_done_file(output), {"identity": identity, "counts": counts})
    return {**asdict(source), "selection": identity["selection"], "formatted": str(output), "counts": counts,
            "reused": reused}


def _done_file(output: Path) -> Path:
    return output.with_name(output.name + ".done.json")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, record: Any) -> None:
    text = json.dumps(record, indent=2) + "\n"
    with _writing(path):
        write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def _selection_record(selection: Selection) -> dict[str, Any]:
    return {"text_field": selection.text_field, "filters": [str(f) for f in selection.filters],
            "min_chars": selection.min_chars, "max_chars": selection.max_chars, "dedup": selection.dedup}


def read_sources(root: Path) -> dict[str, Any]:
    """The `<corpus>_sources.json` that text_formatting wrote, its paths absolute (_with_absolute_paths); DataError
    saying to run it where there is none, and naming one that cannot be read (never taken for none: the next
    call would write a mixture without the sources it records)."""
    path = sources_file(root)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        [str(entry["name"]) for entry in record["sources"]]  # a record without its sources' names is unreadable
    except FileNotFoundError:
        raise DataError(path, "not found: run --action text_formatting --dataset custom --source ... first") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(path, f"unreadable ({_first_words(err)}); mend it, or remove it and run --action "
                              "text_formatting --dataset custom for every source again") from None
    return _with_absolute_paths(record, Path(os.path.abspath(root)), path)


def _first_words(error: BaseException) -> str:
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _with_absolute_paths(record: dict[str, Any], root: Path, path: Path) -> dict[str, Any]:
    """The sources file's record with the paths that older versions wrote as given (relative to the folder the
    call ran in: the working folder and FILES) made absolute. That folder is the one from which the recorded
    formatted text's path leads to where it is now: this one, or (a path without '..') one above the working
    folder. A DataError where none does."""
    sources = []
    for entry in record["sources"]:
        formatted, now = entry.get("formatted"), layout.formatted_text(root, f"{CORPUS}_{entry['name']}")
        if not isinstance(formatted, str) or os.path.isabs(formatted):
            sources.append(entry)
            continue
        folders = [Path.cwd()] + ([] if ".." in Path(formatted).parts else list(now.parents))
        base = next((f for f in folders if os.path.normpath(f / formatted) == os.path.normpath(now)), None)
        if base is None:
            raise DataError(path, f"records paths relative to the folder an earlier bertPrep ran in ({entry['name']}: "
                                  f"{formatted}), which is not this one; run this command from that folder")
        sources.append({**entry, "spec": absolute_spec(str(entry.get("spec", "")), base), "formatted": str(now)})
    return {**record, "sources": sources}


def mixture_file(sharded: Path) -> Path:
    """Beside the text shards of the custom corpus: the sources with what sharding gave each split."""
    return sharded / f"{CORPUS}_mixture.json"


def write_mixture(sharded: Path, sources: dict[str, Any], by_input: list[dict[str, int]], seed: int,
                  input_runs: dict[str, list[list[int]]]) -> None:
    """The mixture file: the sources with their articles per split, and each text shard's sources as runs of
    [name, bytes] in the shard's order (create_pretraining_data counts each source's tokens by them)."""
    names = [source["name"] for source in sources["sources"]]
    record = {**sources, "sharding_seed": seed,
              "sources": [{**source, "articles": given} for source, given in zip(sources["sources"], by_input,
                                                                                  strict=True)],
              "text_shards": {shard: [[names[source], size] for source, size in runs]
                              for shard, runs in input_runs.items()}}
    _write_json(mixture_file(sharded), record)


def source_runs(mixture: dict[str, Any], text_shard: Path) -> tuple[tuple[str, int], ...]:
    """A text shard's (source name, bytes) runs from the mixture file; () for a mixture written before them."""
    return tuple((name, size) for name, size in mixture.get("text_shards", {}).get(text_shard.name, []))


def shard_summary(path: Path) -> dict[str, Any]:
    """A finished shard's file name, rows, tokens (its input_mask's ones), sha256, its text shard's sha256 and the
    tokens of each source's documents in it."""
    import h5py

    with h5py.File(path, "r") as shard:
        mask = shard["input_mask"]
        rows = len(mask)
        tokens = sum(int(np.count_nonzero(mask[i:i + 4096])) for i in range(0, rows, 4096))
        text, by_source = (_text(shard.attrs.get(key)) for key in ("text_sha256", "source_tokens"))
    return {"file": path.name, "rows": rows, "tokens": tokens, "sha256": file_sha256(path), "text_sha256": text,
            "source_tokens": json.loads(by_source) if by_source else {}}


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _with_tokens(source: dict[str, Any], splits: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A source with the tokens of its documents in each split's shards (each copy counted; before the documents
    are cut into rows, so no special tokens nor padding)."""
    tokens = {f"{split}_tokens": sum(shard["source_tokens"].get(source["name"], 0) for shard in shards)
              for split, shards in splits.items()}
    return {**source, "articles": {**source["articles"], **tokens}}


def write_manifest(output: Path, mixture: dict[str, Any], tokenizer: dict[str, Any], parameters: dict[str, Any],
                   shards: dict[str, list[Path]]) -> dict[str, Any]:
    """manifest.json beside the shards: the sources, selection and mixture, the tokenizer, the shard parameters, and
    each shard's rows, tokens and checksum, with the totals per split."""
    splits = {split: [shard_summary(path) for path in paths] for split, paths in shards.items()}
    totals = {split: {"shards": len(rows), "rows": sum(r["rows"] for r in rows),
                      "tokens": sum(r["tokens"] for r in rows)} for split, rows in splits.items()}
    record = {**{key: value for key, value in mixture.items() if key != "text_shards"},
              "sources": [_with_tokens(source, splits) for source in mixture["sources"]],
              "tokenizer": tokenizer, "parameters": parameters, "totals": totals, "shards": splits}
    _write_json(output, record)
    return record
