"""bertPrep.py --dataset custom: a corpus of the user's own record files (Parquet, JSON Lines, datasets' Arrow
folders) as named sources mixed by epochs (web 1x, wiki 3x, books 2x).

Formatting runs as tasks of one file, or of a range of a Parquet file's row groups (so one large file is parallel
work), each writing its kept documents one a line to a part in a scratch folder; the parts are joined in corpus
order into one formatted file per source, exact duplicates dropped across the whole source on request (the tasks
hash, the join keeps 8 bytes a document: SeenHashes). What each source is and gave goes into
`<corpus>_sources.json` beside the formatted text; sharding (epochs) and create_hdf5_files (the manifest) read it,
so they need no --source again."""
from __future__ import annotations

import hashlib
import json
import re
from array import array
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bertrecipe.common.atomic_files import atomic_output, scratch_folder, write_atomic
from bertrecipe.common.errors import DataError
from bertrecipe.common.files import file_sha256
from bertrecipe.dataprep import layout
from bertrecipe.dataprep.documents import input_files
from bertrecipe.dataprep.engine import Runner, in_order
from bertrecipe.dataprep.records import (
    Counts,
    Selection,
    arrow_files,
    documents,
    normalised_text,
    parquet_file,
    record_format,
)
from bertrecipe.dataprep.text_formatting import append_part

CORPUS = "custom"
TASK_BYTES = 64 << 20  # uncompressed Parquet bytes (of all columns, as the footer counts them) a task reads
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
    return Source(match.group(1), match.group(3), epochs)


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


def source_tasks(source: Source) -> list[tuple[str, tuple[int, ...] | None]]:
    """(file, row groups or None for the whole file) of each formatting task of a source, in corpus order."""
    tasks: list[tuple[str, tuple[int, ...] | None]] = []
    for path in input_files(source.spec):
        kind = record_format(path)
        if kind is None:
            raise DataError(path, f"--source {source.name}: not Parquet, JSON Lines or a save_to_disk folder (text "
                                  "in one-sentence-a-line files goes through create_pretraining_data.py)")
        if kind != "parquet":
            tasks.append((str(path), None))  # a compressed stream cannot be entered in the middle
            continue
        metadata, group, size = parquet_file(path).metadata, [], 0
        for index in range(metadata.num_row_groups):
            group.append(index)
            size += metadata.row_group(index).total_byte_size
            if size >= TASK_BYTES:
                tasks.append((str(path), tuple(group)))
                group, size = [], 0
        if group or not tasks or tasks[-1][0] != str(path):
            tasks.append((str(path), tuple(group)))
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


Tasks = list[tuple[str, tuple[int, ...] | None]]


def format_source(source: Source, selection: Selection, output: Path, run: Runner | None,
                  on_documents: Callable[[int], None] | None = None, tasks: Tasks | None = None) -> Counts:
    """A source's tasks run (run: dataprep/engine.py's runner, or None: here) and joined into output atomically;
    what the selection did. A failure leaves no output, part or folder behind."""
    tasks = source_tasks(source) if tasks is None else tasks
    total = Counts()
    seen = SeenHashes()
    with atomic_output(output) as tmp, scratch_folder(output) as scratch:
        parts = [str(scratch / f"part-{i:06d}.txt") for i in range(len(tasks))]
        jobs = [(path, groups, selection, part) for (path, groups), part in zip(tasks, parts, strict=True)]
        with open(tmp, "wb") as out, closing(in_order(run, format_records, jobs)) as results:
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
    if total.kept == 0:
        output.unlink()
        raise DataError(source.spec, f"--source {source.name}: no document left of {total.records} records "
                                     f"({total.dropped()}); loosen --filter, --min_chars or --max_chars")
    return total


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
                  tasks: dict[str, Tasks] | None = None) -> list[dict[str, Any]]:
    """The sources formatted with this selection, then recorded in `<corpus>_sources.json` beside the sources of
    earlier calls (each with its own selection: a source whose text sits in another column, or that needs other
    filters, is formatted by a call of its own), less those in drop. A source formatted before from the same files
    (sizes and times) with the same selection is reused, so a stopped run started again formats only what it had
    not finished. Every source of the mixture, in order. tasks: each source's source_tasks, where the caller
    has them already (planning reads every Parquet file's footer)."""
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise DataError("--source", f"names must differ: {', '.join(names)}")
    recorded = _read_json(sources_file(root)) or {"sources": []}
    unknown = [name for name in drop if name not in {s["name"] for s in recorded["sources"]} | set(names)]
    if unknown:
        raise DataError("--drop_source", f"{', '.join(unknown)}: no such source in {sources_file(root)}")
    if tasks is None:  # every file checked before any is formatted
        tasks = {source.name: source_tasks(source) for source in sources}
    mixture = {entry["name"]: {**entry, "this_call": False} for entry in recorded["sources"]}
    for source in sources:
        mixture[source.name] = {**_formatted(source, selection, root, run, on_documents, tasks[source.name]),
                                "this_call": True}
    for name in drop:
        mixture.pop(name, None)
    if not mixture:
        raise DataError("--drop_source", "would leave the mixture without a source")
    transient = ("this_call", "reused")  # what this call did, for its report alone
    _write_json(sources_file(root), {"corpus": CORPUS, "sources": [
        {key: value for key, value in entry.items() if key not in transient} for entry in mixture.values()]})
    return list(mixture.values())


def _formatted(source: Source, selection: Selection, root: Path, run: Runner | None,
               on_documents: Callable[[int], None] | None, tasks: Tasks) -> dict[str, Any]:
    """One source formatted (or its earlier formatting reused): its record in the sources file."""
    output = layout.formatted_text(root, formatted_name(source))
    identity = {"name": source.name, "spec": source.spec, "selection": _selection_record(selection),
                "inputs": _inputs_record(source)}  # not the epochs: sharding applies them
    earlier = _read_json(_done_file(output)) if output.is_file() else None
    reused = earlier is not None and earlier.get("identity") == identity
    if reused:
        counts = earlier["counts"]
    else:
        counts = format_source(source, selection, output, run, on_documents, tasks).as_dict()
        _write_json(_done_file(output), {"identity": identity, "counts": counts})
    return {**asdict(source), "selection": identity["selection"], "formatted": str(output), "counts": counts,
            "reused": reused}


def _inputs_record(source: Source) -> list[dict[str, Any]]:
    """Each input file of a source (an Arrow folder's .arrow files) with its size and modification time."""
    files = []
    for path in input_files(source.spec):
        for file in (arrow_files(path) if path.is_dir() else [path]):
            stat = file.stat()
            files.append({"path": str(file), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return files


def _done_file(output: Path) -> Path:
    return output.with_name(output.name + ".done.json")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, record: Any) -> None:
    text = json.dumps(record, indent=2) + "\n"
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def _selection_record(selection: Selection) -> dict[str, Any]:
    return {"text_field": selection.text_field, "filters": [str(f) for f in selection.filters],
            "min_chars": selection.min_chars, "max_chars": selection.max_chars, "dedup": selection.dedup}


def read_sources(root: Path) -> dict[str, Any]:
    """The `<corpus>_sources.json` that text_formatting wrote; DataError saying to run it where there is none."""
    path = sources_file(root)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(path, "not found: run --action text_formatting --dataset custom --source ... first") from None
    except (OSError, ValueError) as err:
        raise DataError(path, f"unreadable ({err}); run --action text_formatting --dataset custom again") from None


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
