"""Downloads, against an HTTP server on 127.0.0.1 started by the test (never the internet)."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from functools import partial
from pathlib import Path

import pytest

from bertrecipe.common.errors import DataError
from bertrecipe.dataprep import download
from helpers import REPO_ROOT, held_ports, run_command


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with `Range: bytes=N-` support; `/short/<name>` promises more bytes than it sends."""

    ranges = True

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        short = self.path.startswith("/short/")
        path = Path(self.directory) / self.path.removeprefix("/short/").lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        body = path.read_bytes()
        start = 0
        header = self.headers.get("Range")
        if header and self.ranges:
            start = int(header.split("=")[1].rstrip("-"))
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start + (10 if short else 0)))
        self.end_headers()
        self.wfile.write(body[start:])


@pytest.fixture()
def server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    handler = type("Handler", (RangeHandler,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", root, handler
    httpd.shutdown()
    httpd.server_close()


def test_fetch_downloads_atomically_and_skips_complete_files(server, tmp_path):
    base, root, _ = server
    (root / "a.bin").write_bytes(b"x" * 3_000_000)
    dest = tmp_path / "out" / "a.bin"
    assert download.fetch(base + "a.bin", dest) is True
    assert dest.read_bytes() == b"x" * 3_000_000 and not dest.with_name("a.bin.part").exists()
    (root / "a.bin").unlink()  # a complete file is not fetched again, even with the source gone
    assert download.fetch(base + "a.bin", dest) is False


def test_fetch_resumes_a_partial_file(server, tmp_path):
    base, root, _ = server
    payload = bytes(range(256)) * 5000
    (root / "b.bin").write_bytes(payload)
    dest = tmp_path / "b.bin"
    dest.with_name("b.bin.part").write_bytes(payload[:400_000])
    download.fetch(base + "b.bin", dest)
    assert dest.read_bytes() == payload


def test_fetch_restarts_when_the_server_ignores_ranges(server, tmp_path):
    base, root, handler = server
    handler.ranges = False
    payload = b"0123456789" * 1000
    (root / "c.bin").write_bytes(payload)
    dest = tmp_path / "c.bin"
    dest.with_name("c.bin.part").write_bytes(b"garbage that is not a prefix")
    download.fetch(base + "c.bin", dest)
    assert dest.read_bytes() == payload


def test_a_short_download_is_not_renamed_into_place(server, tmp_path):
    base, root, _ = server
    (root / "d.bin").write_bytes(b"y" * 1000)
    dest = tmp_path / "d.bin"
    with pytest.raises(DataError, match=r"short/d\.bin: download ended early \(1000 of 1010 bytes\)"):
        download.fetch(base + "short/d.bin", dest)
    assert not dest.exists() and dest.with_name("d.bin.part").stat().st_size == 1000


def test_offline_fails_fast_naming_the_url(tmp_path, monkeypatch):
    """Refused once, said at once: one attempt, no retries (counted, not timed)."""
    attempts = []
    opener = download.urllib.request.urlopen
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda *a, **k: attempts.append(a) or opener(*a, **k))
    with held_ports() as [port]:  # bound and never listening: connection refused, as offline
        url = f"http://127.0.0.1:{port}/enwiki.xml.bz2"
        with pytest.raises(DataError) as err:
            download.fetch(url, tmp_path / "x")
    assert len(attempts) == 1
    assert str(err.value).startswith(url + ": download failed") and "\n" not in str(err.value)
    assert not (tmp_path / "x").exists()


def test_http_errors_name_the_url(server, tmp_path):
    base, _, _ = server
    with pytest.raises(DataError, match=r"missing\.bin: download failed \(HTTP 404"):
        download.fetch(base + "missing.bin", tmp_path / "m")


def _zip(root: Path, name: str, files: dict[str, bytes]) -> dict[str, str]:
    with zipfile.ZipFile(root / f"{name}.zip", "w") as z:
        for fname, data in files.items():
            z.writestr(f"{name}/{fname}", data)
    return {fname: hashlib.sha256(data).hexdigest() for fname, data in files.items()}


def test_zip_is_extracted_and_verified(server, tmp_path):
    base, root, _ = server
    sums = _zip(root, "uncased_L-2_H-8_A-2", {"vocab.txt": b"[PAD]\n", "bert_config.json": b"{}"})
    folder = download.fetch_zip(base + "uncased_L-2_H-8_A-2.zip", tmp_path / "w", sums)
    assert (folder / "vocab.txt").read_bytes() == b"[PAD]\n"


def test_zip_with_a_wrong_checksum_is_refused(server, tmp_path):
    base, root, _ = server
    sums = _zip(root, "m", {"vocab.txt": b"tampered\n"})
    sums["vocab.txt"] = hashlib.sha256(b"published\n").hexdigest()
    with pytest.raises(DataError, match=r"vocab\.txt: sha256 does not match the published value"):
        download.fetch_zip(base + "m.zip", tmp_path / "w", sums)


def test_squad_layout(server, tmp_path):
    base, root, _ = server
    for version in ("v1.1", "v2.0"):
        for split in ("train", "dev"):
            (root / f"{split}-{version}.json").write_text("{}", encoding="utf-8")
        (root / f"evaluate-{version}.py").write_text("print()", encoding="utf-8")
    evaluators = {v: f"{base}evaluate-{v}.py" for v in ("v1.1", "v2.0")}
    download.download_squad(tmp_path / "dl", base=base, evaluators=evaluators)
    assert sorted(p.relative_to(tmp_path / "dl").as_posix() for p in (tmp_path / "dl").rglob("*") if p.is_file()) == [
        "squad/v1.1/dev-v1.1.json", "squad/v1.1/evaluate-v1.1.py", "squad/v1.1/train-v1.1.json",
        "squad/v2.0/dev-v2.0.json", "squad/v2.0/evaluate-v2.0.py", "squad/v2.0/train-v2.0.json"]


def test_mrpc_is_split_with_the_glue_dev_ids(server, tmp_path):
    base, root, _ = server
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    rows = ["1\t1\t2\tA.\tB.", "0\t3\t4\tC.\tD.", "1\t5\t6\tE.\tF."]
    (root / "train.txt").write_text("\n".join([header] + rows) + "\n", encoding="utf-8")
    (root / "test.txt").write_text(header + "\n1\t7\t8\tG.\tH.\n", encoding="utf-8")
    (root / "dev_ids.tsv").write_text("3\t4\n", encoding="utf-8")
    urls = {"msr_paraphrase_train.txt": base + "train.txt", "msr_paraphrase_test.txt": base + "test.txt",
            "dev_ids.tsv": base + "dev_ids.tsv"}
    download.download_glue(tmp_path, ["mrpc"], mrpc_urls=urls)
    mrpc = tmp_path / "glue" / "MRPC"
    assert (mrpc / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:-1] == [rows[1]]
    assert (mrpc / "train.tsv").read_text(encoding="utf-8").split("\n")[1:-1] == [rows[0], rows[2]]


def test_books_skip_dead_links_and_count_them(server, tmp_path):
    base, root, _ = server
    (root / "book1.txt").write_text("Once upon a time.", encoding="utf-8")
    url_list = tmp_path / "urls.txt"
    url_list.write_text(f"{base}book1.txt\n{base}gone.txt\n{base}also-gone\n", encoding="utf-8")
    assert download.download_books(url_list, tmp_path / "books") == (1, 2)
    assert (tmp_path / "books" / "book1.txt").read_text(encoding="utf-8") == "Once upon a time."


def test_books_from_a_soskek_jsonl_list_use_the_txt_urls(server, tmp_path):
    """soskek/bookcorpus's url_list.jsonl: one JSON object a line; "txt" is fetched, epub-only entries skipped."""
    base, root, _ = server
    (root / "52").mkdir()
    (root / "52" / "style-guide.txt").write_text("A guide.", encoding="utf-8")
    entries = [
        {"page": "https://example.invalid/books/view/52", "epub": "", "txt": f"{base}52/style-guide.txt",
         "title": "A", "num_words": 2, "b_idx": 1},
        {"page": "https://example.invalid/books/view/53", "epub": f"{base}53/only.epub", "txt": "", "b_idx": 2},
        {"page": "https://example.invalid/books/view/54", "epub": "", "txt": f"{base}54/gone.txt", "b_idx": 3},
    ]
    url_list = tmp_path / "url_list.jsonl"
    url_list.write_text("\n".join(json.dumps(e) for e in entries) + "\n\n", encoding="utf-8")
    assert download.read_book_urls(url_list) == ([f"{base}52/style-guide.txt", f"{base}54/gone.txt"], 1)
    assert download.download_books(url_list, tmp_path / "books") == (1, 2)
    assert (tmp_path / "books" / "style-guide.txt").read_text(encoding="utf-8") == "A guide."


@pytest.mark.parametrize("content,problem", [
    ("", "BookCorpus URL list holds no book URL; write it with one plain-text book URL a line, or as the url_list"),
    ('{"txt": ""}\n', "holds no book URL"),
    ('{"txt": "http://x/a.txt"}\n{"txt": \n', "line 2: not a JSON object"),
])
def test_bad_book_lists_are_refused(tmp_path, content, problem):
    url_list = tmp_path / "list.txt"
    url_list.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=problem.replace("(", r"\(")):
        download.read_book_urls(url_list)


def _prep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return run_command([sys.executable, REPO_ROOT / "data" / "bertPrep.py", "--action", "download", *args],
                       env={"BERT_PREP_WORKING_DIR": str(tmp_path)})


@pytest.mark.parametrize("flag", [None, "--bookscorpus_url_list", "--bookcorpus_url_list"])
def test_missing_book_list_says_what_to_provide(tmp_path, flag):
    """No URL list is shipped: the download stops at once (before any other download of the dataset) with one
    line and exit 2 naming the file to write, its formats and the flag."""
    expected = tmp_path / "download" / "bookscorpus_url_list.txt" if flag is None else tmp_path / "mine.jsonl"
    for dataset in ("bookscorpus", "books_wiki_en_corpus"):
        run = _prep(tmp_path, "--dataset", dataset, *([flag, str(expected)] if flag else []))
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().split("\n")
        assert len(lines) == 1, run.stderr
        assert lines[0].startswith(f"error: {expected}: BookCorpus URL list not found"), lines[0]
        for part in ("one plain-text book URL a line", "url_list.jsonl", "soskek/bookcorpus", '"txt"',
                     "--bookscorpus_url_list"):
            assert part in lines[0], (part, lines[0])
        assert not (tmp_path / "download" / "wikicorpus_en").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not found")
def test_create_datasets_wiki_books_stops_at_the_missing_book_list(tmp_path):
    script = Path(__file__).resolve().parents[1] / "data" / "create_datasets_from_start.sh"
    run = subprocess.run(["bash", str(script), "wiki_books"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "BERT_PREP_WORKING_DIR": str(tmp_path), "PYTHON": sys.executable})
    lines = run.stderr.strip().split("\n")
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert f"{tmp_path}/download/bookscorpus_url_list.txt: BookCorpus URL list not found" in lines[0], lines[0]
    assert not (tmp_path / "download" / "wikicorpus_en").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not found")
@pytest.mark.parametrize("recipe, shards", [
    ("bert", [["--max_seq_length", "128", "--max_predictions_per_seq", "20"],
              ["--max_seq_length", "512", "--max_predictions_per_seq", "80"]]),
    ("modern", [["--document_chunks", "--max_seq_length", "1024"], ["--document_chunks", "--max_seq_length", "8192"]]),
])
def test_create_datasets_makes_each_recipe_s_shards(tmp_path, recipe, shards):
    """With a stand-in python that records each bertPrep.py call: the recipe picks the shards made at the end."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\nshift\necho "$@" >> "$ARGS_LOG"\n')
    fake.chmod(0o755)
    script = Path(__file__).resolve().parents[1] / "data" / "create_datasets_from_start.sh"
    run = subprocess.run(["bash", str(script), "wiki_only", recipe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "BERT_PREP_WORKING_DIR": str(tmp_path), "PYTHON": str(fake),
                              "ARGS_LOG": str(tmp_path / "calls")})
    assert run.returncode == 0, run.stderr
    calls = [line.split() for line in (tmp_path / "calls").read_text().splitlines()]
    made = [[a for a in call if a.startswith("--") and a not in ("--action", "--dataset", "--vocab_file")
             or a.isdigit()] for call in calls if call[:2] == ["--action", "create_hdf5_files"]]
    assert made == shards


def test_create_datasets_refuses_an_unknown_recipe_before_any_download(tmp_path):
    script = Path(__file__).resolve().parents[1] / "data" / "create_datasets_from_start.sh"
    run = subprocess.run(["bash", str(script), "wiki_only", "modrn"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "BERT_PREP_WORKING_DIR": str(tmp_path), "PYTHON": sys.executable})
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "'modrn' is neither bert nor modern" in run.stderr and not list(tmp_path.iterdir())


def test_a_killed_extraction_is_cleaned_and_redone(server, tmp_path):
    """A run killed while unzipping leaves `.<folder>.tmp-<pid>/`: the next run removes it (only it) and extracts."""
    base, root, _ = server
    sums = _zip(root, "uncased_L-2_H-8_A-2", {"vocab.txt": b"[PAD]\n"})
    dest = tmp_path / "w"
    stale = dest / ".uncased_L-2_H-8_A-2.tmp-999999999"
    (stale / "uncased_L-2_H-8_A-2").mkdir(parents=True)
    (stale / "uncased_L-2_H-8_A-2" / "vocab.txt").write_bytes(b"[PA")
    kept = [dest / "notes.tmp", dest / ".other.tmp-999999999"]
    for path in kept:
        path.write_bytes(b"mine")
    folder = download.fetch_zip(base + "uncased_L-2_H-8_A-2.zip", dest, sums)
    assert (folder / "vocab.txt").read_bytes() == b"[PAD]\n"
    assert not stale.exists() and all(p.read_bytes() == b"mine" for p in kept)
    assert sorted(p.name for p in dest.iterdir()) == sorted(["uncased_L-2_H-8_A-2", "uncased_L-2_H-8_A-2.zip",
                                                             "notes.tmp", ".other.tmp-999999999"])


def test_mrpc_killed_between_its_three_files_is_completed(server, tmp_path):
    base, root, _ = server
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    (root / "train.txt").write_text(header + "\n1\t1\t2\tA.\tB.\n0\t3\t4\tC.\tD.\n", encoding="utf-8")
    (root / "test.txt").write_text(header + "\n1\t7\t8\tG.\tH.\n", encoding="utf-8")
    (root / "dev_ids.tsv").write_text("3\t4\n", encoding="utf-8")
    urls = {"msr_paraphrase_train.txt": base + "train.txt", "msr_paraphrase_test.txt": base + "test.txt",
            "dev_ids.tsv": base + "dev_ids.tsv"}
    download.download_glue(tmp_path, ["mrpc"], mrpc_urls=urls)
    mrpc = tmp_path / "glue" / "MRPC"
    expected = (mrpc / "test.tsv").read_bytes()
    (mrpc / "test.tsv").unlink()  # killed while writing the last of the three (train and dev are in place)
    (mrpc / ".test.tsv.tmp").write_bytes(b"Quality\t#1")
    (mrpc / ".test.tsv.tmp-999999999").write_bytes(b"Quality\t#1")
    download.download_glue(tmp_path, ["mrpc"], mrpc_urls=urls)
    assert (mrpc / "test.tsv").read_bytes() == expected
    assert sorted(p.name for p in mrpc.iterdir()) == ["dev.tsv", "raw", "test.tsv", "train.tsv"]


def test_book_list_inside_the_book_folder_is_refused(tmp_path):
    """Every .txt of download/bookscorpus/ is formatted as a book: a URL list there would become one."""
    url_list = tmp_path / "download" / "bookscorpus" / "urls.txt"
    url_list.parent.mkdir(parents=True)
    url_list.write_text("http://127.0.0.1:9/book.txt\n", encoding="utf-8")
    run = _prep(tmp_path, "--dataset", "bookscorpus", "--bookscorpus_url_list", str(url_list))
    lines = run.stderr.strip().split("\n")
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert lines[0].startswith(f"error: {url_list}: --bookscorpus_url_list is inside {url_list.parent}, where every "
                               ".txt is read as a book; move it"), lines[0]
    assert sorted(p.name for p in url_list.parent.iterdir()) == ["urls.txt"]
