"""Issue 48 ("nothing lost", round four): a demanding new user's trials of the "your own corpus" path (bertPrep
--dataset custom, create_pretraining_data.py on record files). A filter column of two types, a source name reused for
other files, a DatasetDict folder, a file of another format than its name, a BOM, a relative working folder, a
working folder that cannot be used, a full disk, a file changed while the command runs: each is read as what it is
or refused in one line naming the file, exit status 2, nothing written."""
import errno
import gzip
import json
import os
import re
import sys
from pathlib import Path

import datasets
import h5py
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertrecipe.common.errors import DataError
from bertrecipe.common.files import FileStamp
from bertrecipe.dataprep import corpus_sources, layout
from helpers import REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, permissions_are_ignored, run_command

BERT_PREP = REPO_ROOT / "data" / "bertPrep.py"
CREATE = REPO_ROOT / "data" / "create_pretraining_data.py"
SHARDS = ["--n_training_shards", "2", "--n_test_shards", "1", "--fraction_test_set", "0.2"]


def rows(count: int = 24, start: int = 0) -> list[dict]:
    paragraphs = [" ".join(p.split()) for book in sorted((TEST_DATA / "books").glob("*.txt"))
                  for p in book.read_text(encoding="utf-8").split("\n\n") if len(p.split()) > 8]
    return [{"text": text, "score": i % 5} for i, text in enumerate(paragraphs[start:start + count], start)]


def json_lines(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")


def prep(root: Path, *flags: str, cwd: Path | None = None):
    return run_command([sys.executable, str(BERT_PREP), *flags, "--n_processes", "1"], cwd=cwd,
                       env={"BERT_PREP_WORKING_DIR": str(root)})


def format_custom(root: Path, *flags: str, cwd: Path | None = None):
    return prep(root, "--action", "text_formatting", "--dataset", "custom", *flags, cwd=cwd)


def create(input_file: Path | str, output: Path, *extra: str):
    return run_command([sys.executable, str(CREATE), "--input_file", str(input_file), "--output_file", str(output),
                        "--vocab_file", str(VOCAB_EXCERPT), "--max_seq_length", "64", "--max_predictions_per_seq",
                        "10", "--dupe_factor", "1", *extra])


def one_line(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (done.returncode,
                                                                                         done.stderr)
    return lines[0]


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- 1. a filter column of two types ----------------------------------------------------------------------------------

def web_parts(folder: Path, textual: int | None = 2) -> Path:
    """Five Parquet files of 12 rows; in part `textual` the score is stored as strings."""
    folder.mkdir(parents=True)
    everything = rows(60)
    for k in range(5):
        part = everything[12 * k:12 * (k + 1)]
        if k == textual:
            part = [{**r, "score": str(r["score"])} for r in part]
        pq.write_table(pa.Table.from_pylist(part), folder / f"p{k}.parquet")
    return folder


def test_a_filter_column_of_another_type_in_one_file_is_refused_naming_both_before_any_write(tmp_path):
    web = web_parts(tmp_path / "web")
    root = tmp_path / "work"
    line = one_line(format_custom(root, "--source", f"web={web}", "--filter", "score>=3"))
    assert re.search(r"p2\.parquet: column 'score' holds string, .*p0\.parquet's holds int64", line), line
    assert not root.exists()
    line = one_line(create(web, tmp_path / "out" / "shard.hdf5", "--filter", "score>=3"))
    assert "p2.parquet: column 'score' holds string" in line and "int64" in line, line
    assert not (tmp_path / "out").exists()

    strings = web_parts(tmp_path / "strings", textual=None)  # every file of strings: the filter's number contradicts
    for k in range(5):
        table = pq.read_table(strings / f"p{k}.parquet")
        pq.write_table(table.set_column(1, "score", table["score"].cast(pa.string())), strings / f"p{k}.parquet")
    line = one_line(format_custom(root, "--source", f"web={strings}", "--filter", "score>=3"))
    assert re.search(r"p0\.parquet: column 'score' holds string, and --filter score>=3(\.0)? compares numbers", line)
    line = one_line(format_custom(root, "--source", f"web={web / 'p0.parquet'}", "--filter", "score==high"))
    assert "p0.parquet: column 'score' holds int64, and --filter score==high compares text" in line, line
    assert not root.exists()

    mixed = tmp_path / "mixed.jsonl"
    lines = [dict(r) for r in rows(8)]
    lines[5]["score"] = "3"
    mixed.write_bytes(json_lines(lines))
    line = one_line(format_custom(root, "--source", f"web={mixed}", "--filter", "score>=3"))
    assert "mixed.jsonl: line 6: field 'score' holds a string, line 1's holds a number" in line, line
    assert not root.exists()


def test_a_column_of_nulls_in_one_file_is_no_contradiction(tmp_path):
    """pyarrow types a column that is all missing in a file as null: its rows pass no filter, as missing values."""
    web = web_parts(tmp_path / "web", textual=None)
    missing = [{**r, "score": None} for r in rows(12)]
    pq.write_table(pa.Table.from_pylist(missing), web / "p5.parquet")
    assert pq.read_schema(web / "p5.parquet").field("score").type == pa.null()
    done = format_custom(tmp_path / "work", "--source", f"web={web}", "--filter", "score>=3")
    assert done.returncode == 0 and "web: 24 of 72 records kept" in done.stdout, done.stdout + done.stderr


# --- 2. a source name reused, files under two names -------------------------------------------------------------------

def test_a_source_name_given_again_for_other_files_is_refused_and_drop_source_replaces_it(tmp_path):
    web = web_parts(tmp_path / "web", textual=None)
    root = tmp_path / "work"
    assert format_custom(root, "--source", f"web={web / 'p0.parquet'}").returncode == 0
    before = files_under(root)
    line = one_line(format_custom(root, "--source", f"web={web / 'p1.parquet'}"))
    assert re.search(r"--source web: the mixture holds a source web of other files \(.*p0\.parquet\); this call's: "
                     r".*p1\.parquet; give this one another name, or replace that one with --drop_source web "
                     r"--source web=", line), line
    assert files_under(root) == before

    again = format_custom(root, "--source", f"web={web / 'p0.parquet'}")  # the same files: formatting again
    assert again.returncode == 0 and "reused" in again.stdout, again.stdout + again.stderr
    replaced = format_custom(root, "--drop_source", "web", "--source", f"web={web / 'p1.parquet'}")
    assert replaced.returncode == 0 and "the mixture: web x1;" in replaced.stdout, replaced.stdout + replaced.stderr
    entry, = json.loads(corpus_sources.sources_file(root).read_text())["sources"]
    assert entry["spec"] == str(web / "p1.parquet")


def test_the_same_files_under_two_names_are_refused_naming_both(tmp_path):
    web = web_parts(tmp_path / "web", textual=None)
    root = tmp_path / "work"
    line = one_line(format_custom(root, "--source", f"a={web}", "--source", f"b={web / 'p3.parquet'}"))
    assert re.search(r"p3\.parquet: in --source b and in --source a; a file belongs to one source", line), line
    line = one_line(format_custom(root, "--source", f"a={web / 'p1.parquet'},{web}/*.parquet"))
    assert line == f"error: {web / 'p1.parquet'}: twice in --source a; name each file once", line
    assert not root.exists()
    assert format_custom(root, "--source", f"web={web}").returncode == 0
    recorded = corpus_sources.sources_file(root).read_bytes()
    link = tmp_path / "elsewhere.parquet"
    link.symlink_to(web / "p3.parquet")  # another spelling of the same file
    line = one_line(format_custom(root, "--source", f"more={link}"))
    assert re.search(r"elsewhere\.parquet: in --source more and in web of an earlier call .*; a file belongs to one "
                     r"source: leave it out, or --drop_source web", line), line
    assert corpus_sources.sources_file(root).read_bytes() == recorded


# --- 3. formats told by their bytes -----------------------------------------------------------------------------------

def arrow_ipc(records: list[dict], path: Path, stream: bool) -> Path:
    table = pa.Table.from_pylist(records)
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_stream(sink, table.schema) if stream else pa.ipc.new_file(sink, table.schema)
        with writer:
            writer.write_table(table, max_chunksize=5)
    return path


def test_every_file_is_read_as_what_its_bytes_are_or_refused_naming_what_it_is(tmp_path):
    records = rows(20)
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(records), folder / "parquet.jsonl", row_group_size=7)
    (folder / "lines.parquet").write_bytes(json_lines(records))
    (folder / "gzipped.jsonl").write_bytes(gzip.compress(json_lines(records)))
    arrow_ipc(records, folder / "stream.arrow", stream=True)
    arrow_ipc(records, folder / "file.bin", stream=False)
    for name in ("parquet.jsonl", "lines.parquet", "gzipped.jsonl", "stream.arrow", "file.bin"):
        done = create(folder / name, tmp_path / f"{name}.hdf5")
        assert done.returncode == 0 and "20 of 20 records kept" in done.stdout, (name, done.stdout + done.stderr)

    (folder / "parquet.gz").write_bytes(gzip.compress((folder / "parquet.jsonl").read_bytes()))
    (folder / "text.txt.gz").write_bytes(gzip.compress(b"One sentence.\nAnother one.\n"))
    (folder / "table.csv").write_text("id,text,score\n1,\"A first, long text.\",3\n2,Another text.,4\n")
    (folder / "shard.txt").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))
    (folder / "blob.jsonl").write_bytes(b"\x00\x01binary" * 30)
    (folder / "wide.txt").write_bytes("One sentence.\n".encode("utf-16"))
    refused = {"parquet.gz": r"gzip-compressed Parquet; decompress it",
               "text.txt.gz": r"gzip-compressed text, not JSON Lines; decompress it",
               "table.csv": r"a CSV file \(columns: id, text, score\), not JSON Lines or Parquet; convert it",
               "shard.txt": r"an HDF5 file, not text or records",
               "blob.jsonl": r"binary data \(a NUL byte at offset 0\), not text, Parquet, JSON Lines or Arrow",
               "wide.txt": r"UTF-16 text; convert it to UTF-8"}
    for name, message in refused.items():
        line = one_line(create(folder / name, tmp_path / "out" / "shard.hdf5"))
        assert re.search(re.escape(str(folder / name)) + ": " + message, line), (name, line)
    assert not (tmp_path / "out").exists()


def test_text_with_a_stray_nul_byte_is_text_and_data_of_control_bytes_is_not(tmp_path):
    """Google's tokenizer drops control characters: a NUL inside prose (the pinned golden input holds one) is text,
    as before; only a file where control bytes are common is binary data."""
    text = tmp_path / "prose.txt"
    text.write_text("The first sentence of a document.\nA second one, with nothing odd in it.\n\n" * 20
                    + "A last document with a stray\x00byte in it.\n")
    assert create(text, tmp_path / "out" / "shard.hdf5").returncode == 0
    blob = tmp_path / "blob.txt"
    blob.write_bytes(b"header line\n" + bytes(range(32)) * 10)
    assert "binary data (a NUL byte at offset 12)" in one_line(create(blob, tmp_path / "out" / "other.hdf5"))


def test_a_dataset_dict_folder_is_refused_naming_its_splits_and_the_folder_to_pass(tmp_path):
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows(12)),
                                   "test": datasets.Dataset.from_list(rows(4, 12))})
    splits.save_to_disk(str(tmp_path / "dd"))
    expected = (f"{tmp_path / 'dd'}: a DatasetDict folder of datasets' save_to_disk (splits: train, test), not one "
                f"dataset; pass one split's folder, e.g. {tmp_path / 'dd' / 'train'}")
    assert one_line(format_custom(tmp_path / "work", "--source", f"dd={tmp_path / 'dd'}")) == f"error: {expected}"
    assert one_line(create(tmp_path / "dd", tmp_path / "out.hdf5")) == f"error: {expected}"
    done = format_custom(tmp_path / "work", "--source", f"dd={tmp_path / 'dd' / 'train'}")
    assert done.returncode == 0 and "dd: 12 of 12 records kept" in done.stdout, done.stdout + done.stderr


# --- 4. hints that fit the file's format ------------------------------------------------------------------------------

def test_a_record_file_without_rows_says_so_and_no_hint_of_text_or_filters(tmp_path):
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty)
    line = one_line(create(empty, tmp_path / "out.hdf5"))
    assert line == f"error: {empty}: no record in it (0 rows); pass record files that hold documents", line
    line = one_line(format_custom(tmp_path / "work", "--source", f"e={empty}"))
    assert line == f"error: {empty}: --source e: its files hold no record (0 rows); check the files it names", line


# --- 5. a UTF-8 BOM ---------------------------------------------------------------------------------------------------

def test_a_utf8_bom_starts_a_json_lines_or_text_file_and_is_content_elsewhere(tmp_path):
    records = rows(10)
    plain, bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    plain.write_bytes(json_lines(records))
    bom.write_bytes(b"\xef\xbb\xbf" + json_lines(records))
    (tmp_path / "bom.jsonl.gz").write_bytes(gzip.compress(bom.read_bytes()))
    text = "".join(r["text"] + "\n\n" for r in records)
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    (tmp_path / "bom.txt").write_text(text, encoding="utf-8-sig")
    for name, reference in (("bom.jsonl", "plain.jsonl"), ("bom.jsonl.gz", "plain.jsonl"), ("bom.txt", "plain.txt")):
        shards = []
        for source in (name, reference):
            done = create(tmp_path / source, tmp_path / f"{source}.hdf5")
            assert done.returncode == 0, (source, done.stderr)
            with h5py.File(tmp_path / f"{source}.hdf5", "r") as shard:
                shards.append({key: shard[key][()].tolist() for key in shard})
        assert shards[0] == shards[1], name
    inside = tmp_path / "inside.jsonl"
    inside.write_bytes(json_lines(records[:2]) + b"\xef\xbb\xbf" + json_lines(records[2:]))
    assert "inside.jsonl: line 3: invalid JSON" in one_line(create(inside, tmp_path / "inside.hdf5"))


# --- 6. --dedup within each source ------------------------------------------------------------------------------------

def test_dedup_drops_repeats_within_a_source_and_keeps_those_of_other_sources(tmp_path):
    """As docs/your-corpus.md says: each source is deduplicated on its own; a document in two sources is in both."""
    records = rows(10)
    (tmp_path / "a.jsonl").write_bytes(json_lines(records + records[:3]))
    (tmp_path / "b.jsonl").write_bytes(json_lines(records[:4]))
    done = format_custom(tmp_path / "work", "--source", f"a={tmp_path / 'a.jsonl'}", "--source",
                         f"b={tmp_path / 'b.jsonl'}", "--dedup")
    assert done.returncode == 0, done.stderr
    assert "a: 10 of 13 records kept" in done.stdout and "b: 4 of 4 records kept" in done.stdout, done.stdout


# --- 7. a relative working folder -------------------------------------------------------------------------------------

def test_a_relative_working_folder_and_source_are_recorded_as_absolute_paths(tmp_path):
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    web_parts(tmp_path / "here" / "web", textual=None)
    done = format_custom(Path("work"), "--source", "web=web/p0.parquet,web/p1.parquet", cwd=tmp_path / "here")
    assert done.returncode == 0, done.stderr
    root = tmp_path / "here" / "work"
    entry, = json.loads(corpus_sources.sources_file(root).read_text())["sources"]
    web = tmp_path / "here" / "web"
    assert entry["spec"] == f"{web / 'p0.parquet'},{web / 'p1.parquet'}"
    assert entry["formatted"] == str(layout.formatted_text(root, "custom_web"))
    again = format_custom(root, "--source", f"web={web / 'p0.parquet'},{web / 'p1.parquet'}", cwd=tmp_path / "there")
    assert again.returncode == 0 and "reused" in again.stdout, again.stdout + again.stderr


def relative_record(root: Path, relative_root: str, cwd: Path) -> None:
    """custom_sources.json as an older version wrote it: the working folder and the spec as given, relative."""
    path = corpus_sources.sources_file(root)
    record = json.loads(path.read_text())
    for entry in record["sources"]:
        entry["formatted"] = entry["formatted"].replace(str(root), relative_root)
        entry["spec"] = os.path.relpath(entry["spec"], cwd)
    path.write_text(json.dumps(record, indent=2) + "\n")


def test_an_older_sources_file_of_relative_paths_is_read_as_meant_or_refused(tmp_path):
    web = web_parts(tmp_path / "a" / "web", textual=None)
    root = tmp_path / "work"
    assert format_custom(root, "--source", f"web={web / 'p0.parquet'}").returncode == 0
    relative_record(root, "../work", tmp_path / "a")  # written from tmp_path/a with BERT_PREP_WORKING_DIR=../work
    done = prep(root, "--action", "sharding", "--dataset", "custom", *SHARDS, cwd=tmp_path / "a")
    assert done.returncode == 0, done.stderr
    mixture = json.loads(corpus_sources.mixture_file(layout.sharded_dir(root, 2, 1, 0.2) / "custom").read_text())
    assert mixture["sources"][0]["spec"] == str(web / "p0.parquet")  # relative to the folder it was written from
    assert mixture["sources"][0]["formatted"] == str(layout.formatted_text(root, "custom_web"))

    (tmp_path / "b" / "c").mkdir(parents=True)
    line = one_line(prep(root, "--action", "sharding", "--dataset", "custom", *SHARDS, cwd=tmp_path / "b" / "c"))
    assert line == (f"error: {corpus_sources.sources_file(root)}: records paths relative to the folder an earlier "
                    f"bertPrep ran in (web: ../work/formatted_one_article_per_line/custom_web_one_article_per_line"
                    f".txt), which is not this one; run this command from that folder"), line


# --- 8. a working folder that cannot be used, a full disk -------------------------------------------------------------

ACTIONS = {"text_formatting": ["--source", "web=SOURCE"], "sharding": SHARDS,
           "create_hdf5_files": [*SHARDS, "--vocab_file", str(VOCAB_EXCERPT)], "create_vocab": []}


@pytest.mark.parametrize("action", ACTIONS)
def test_a_working_folder_that_is_a_file_or_unwritable_is_one_line_naming_it(tmp_path, action):
    web = web_parts(tmp_path / "web", textual=None)
    flags = [flag.replace("SOURCE", str(web / "p0.parquet")) for flag in ACTIONS[action]]
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")
    for root in (a_file, a_file / "below"):
        line = one_line(prep(root, "--action", action, "--dataset", "custom", *flags))
        assert line.startswith(f"error: {root}: $BERT_PREP_WORKING_DIR ") and "is a file" in line, line
    assert a_file.read_text() == "not a folder\n"
    if permissions_are_ignored():
        return
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    line = one_line(prep(locked, "--action", action, "--dataset", "custom", *flags))
    assert line.startswith(f"error: {locked}: $BERT_PREP_WORKING_DIR cannot be written to"), line
    assert list(locked.iterdir()) == []


def test_a_full_disk_while_the_sources_file_is_written_is_one_line_and_keeps_the_earlier_one(tmp_path, monkeypatch):
    web = web_parts(tmp_path / "web", textual=None)
    root = tmp_path / "work"
    assert format_custom(root, "--source", f"web={web / 'p0.parquet'}").returncode == 0
    before = files_under(root)
    real = corpus_sources.write_atomic

    def full_disk(path, write, clean=True):
        def half_then_full(f):
            f.write(b'{"corpus": "cus')
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, half_then_full if Path(path).name == "custom_sources.json" else write, clean)
    monkeypatch.setattr(corpus_sources, "write_atomic", full_disk)
    line = one_line(format_custom(root, "--source", f"more={web / 'p1.parquet'}"))
    assert line == (f"error: {corpus_sources.sources_file(root)}: cannot write (No space left on device); free some "
                    "space and run the command again"), line
    after = files_under(root)
    assert {k: v for k, v in after.items() if "custom_more" not in k} == before  # the sources file as it was
    assert not [name for name in after if name.endswith(".tmp")]


# --- 9. a file changed while the command runs -------------------------------------------------------------------------

def test_file_stamp_tells_a_rewritten_appended_or_replaced_file(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"text": "a"}\n')
    stamp = FileStamp.of(path)
    stamp.check(path, "input file")
    os.utime(path, ns=(stamp.mtime_ns, stamp.mtime_ns + 1_000_000))
    with pytest.raises(DataError, match=r"data\.jsonl: input file changed while this command ran \(modified\)"):
        stamp.check(path, "input file")
    with open(path, "ab") as f:
        f.write(b'{"text": "b"}\n')
    with pytest.raises(DataError, match=r"changed while this command ran \(size 14 -> 28 bytes, modified\)"):
        stamp.check(path, "input file")
    stamp = FileStamp.of(path)
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(path.read_bytes())
    os.utime(replacement, ns=(stamp.mtime_ns, stamp.mtime_ns))
    os.replace(replacement, path)
    with pytest.raises(DataError, match=r"changed while this command ran \(replaced by another file\)"):
        stamp.check(path, "input file")
    path.unlink()
    with pytest.raises(DataError, match=r"data\.jsonl: input file removed while this command ran"):
        stamp.check(path, "input file")
    with pytest.raises(DataError, match=r"data\.jsonl: cannot be read \(No such file or directory\)"):
        FileStamp.of(path)


@pytest.mark.parametrize("when", ["before formatting", "while formatting"])
def test_a_source_file_changed_after_planning_is_refused_naming_it(tmp_path, monkeypatch, when):
    web = web_parts(tmp_path / "web", textual=None)
    target = web / "p3.parquet"
    hook = "format_source" if when == "before formatting" else "format_records"
    real = getattr(corpus_sources, hook)

    def change_then_run(*args, **kwargs):
        if target.exists():
            pq.write_table(pa.Table.from_pylist(rows(13)), target)
        return real(*args, **kwargs)
    monkeypatch.setattr(corpus_sources, hook, change_then_run)
    root = tmp_path / "work"
    line = one_line(format_custom(root, "--source", f"web={web}"))
    assert re.fullmatch(rf"error: {re.escape(str(target))}: input file of --source web changed while this command "
                        r"ran \(size \d+ -> \d+ bytes, modified\); run the command again once nothing writes to it",
                        line), line
    assert [p for p in root.rglob("*") if p.is_file()] == []


def test_an_unreadable_sources_file_is_refused_not_replaced(tmp_path):
    """It records the mixture's earlier sources: a call that took it for none would write a mixture without them."""
    web = web_parts(tmp_path / "web", textual=None)
    root = tmp_path / "work"
    assert format_custom(root, "--source", f"web={web / 'p0.parquet'}").returncode == 0
    sources_file = corpus_sources.sources_file(root)
    sources_file.write_text('{"corpus": "custom", "sources": [{"name": "web", ')  # cut short
    line = one_line(format_custom(root, "--source", f"more={web / 'p1.parquet'}"))
    assert line.startswith(f"error: {sources_file}: unreadable (") and line.endswith(
        "; mend it, or remove it and run --action text_formatting --dataset custom for every source again"), line
    assert sources_file.read_text() == '{"corpus": "custom", "sources": [{"name": "web", '
