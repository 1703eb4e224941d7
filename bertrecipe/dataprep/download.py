"""Downloads for `bertPrep.py --action download`: resumable, atomic, skip-if-complete, fail fast offline.

A file is fetched to `<dest>.part` (resumed with an HTTP Range request when the server allows it, restarted
otherwise) and renamed to `<dest>` only when complete, so an existing `<dest>` is always whole and is skipped.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

from bertrecipe.common.atomic_files import atomic_output, move_onto, output_target, scratch_folder
from bertrecipe.common.errors import DataError
from bertrecipe.common.files import file_sha256, read_text_file

TIMEOUT = 15  # seconds without a byte: offline or a dead mirror fails fast, with the URL in the message
CHUNK = 1 << 20

WIKI_URL = "https://dumps.wikimedia.org/enwiki/latest/enwiki-latest-pages-articles.xml.bz2"
GOOGLE_BERT = "https://storage.googleapis.com/bert_models/2018_10_18/"
# Published sha256 of the files inside Google's zips (as listed by NVIDIA's recipe).
GOOGLE_WEIGHTS: dict[str, dict[str, str]] = {
    "uncased_L-12_H-768_A-12": {
        "bert_config.json": "7b4e5f53efbd058c67cda0aacfafb340113ea1b5797d9ce6ee411704ba21fcbc",
        "bert_model.ckpt.data-00000-of-00001": "58580dc5e0bf0ae0d2efd51d0e8272b2f808857f0a43a88aaf7549da6d7a8a84",
        "bert_model.ckpt.index": "04c1323086e2f1c5b7c0759d8d3e484afbb0ab45f51793daab9f647113a0117b",
        "bert_model.ckpt.meta": "dd5682170a10c3ea0280c2e9b9a45fee894eb62da649bbdea37b38b0ded5f60e",
        "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    },
    "uncased_L-24_H-1024_A-16": {
        "bert_config.json": "bfa42236d269e2aeb3a6d30412a33d15dbe8ea597e2b01dc9518c63cc6efafcb",
        "bert_model.ckpt.data-00000-of-00001": "bc6b3363e3be458c99ecf64b7f472d2b7c67534fd8f564c0556a678f90f4eea1",
        "bert_model.ckpt.index": "68b52f2205ffc64dc627d1120cf399c1ef1cbc35ea5021d1afc889ffe2ce2093",
        "bert_model.ckpt.meta": "6fcce8ff7628f229a885a593625e3d5ff9687542d5ef128d9beb1b0c05edc4a1",
        "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    },
    "cased_L-12_H-768_A-12": {
        "bert_config.json": "f11dfb757bea16339a33e1bf327b0aade6e57fd9c29dc6b84f7ddb20682f48bc",
        "bert_model.ckpt.data-00000-of-00001": "734d5a1b68bf98d4e9cb6b6692725d00842a1937af73902e51776905d8f760ea",
        "bert_model.ckpt.index": "517d6ef5c41fc2ca1f595276d6fccf5521810d57f5a74e32616151557790f7b1",
        "bert_model.ckpt.meta": "5f8a9771ff25dadd61582abb4e3a748215a10a6b55947cbb66d0f0ba1694be98",
        "vocab.txt": "eeaa9875b23b04b4c54ef759d03db9d1ba1554838f8fb26c5d96fa551df93d02",
    },
    "cased_L-24_H-1024_A-16": {
        "bert_config.json": "7adb2125c8225da495656c982fd1c5f64ba8f20ad020838571a3f8a954c2df57",
        "bert_model.ckpt.data-00000-of-00001": "6ff33640f40d472f7a16af0c17b1179ca9dcc0373155fb05335b6a4dd1657ef0",
        "bert_model.ckpt.index": "ef42a53f577fbe07381f4161b13c7cab4f4fc3b167cec6a9ae382c53d18049cf",
        "bert_model.ckpt.meta": "d2ddff3ed33b80091eac95171e94149736ea74eb645e575d942ec4a5e01a40a1",
        "vocab.txt": "eeaa9875b23b04b4c54ef759d03db9d1ba1554838f8fb26c5d96fa551df93d02",
    },
}
SQUAD_BASE = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
SQUAD_EVAL = {
    "v1.1": "https://worksheets.codalab.org/rest/bundles/0xbcd57bee090b421c982906709c8c27e1/contents/blob/",
    "v2.0": "https://worksheets.codalab.org/rest/bundles/0x6b567e1cf2e041ec80d7098f031c5c9e/contents/blob/",
}
GLUE_BASE = "https://dl.fbaipublicfiles.com/glue/data/"
GLUE_ZIPS = {"cola": "CoLA.zip", "sst-2": "SST-2.zip", "sts-b": "STS-B.zip", "rte": "RTE.zip", "qqp": "QQP-clean.zip",
             "mnli": "MNLI.zip", "qnli": "QNLIv2.zip", "wnli": "WNLI.zip"}
MRPC_URLS = {
    "msr_paraphrase_train.txt": "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_train.txt",
    "msr_paraphrase_test.txt": "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_test.txt",
    "dev_ids.tsv": GLUE_BASE + "mrpc_dev_ids.tsv",
}


def fetch(url: str, dest: Path, on_bytes: Callable[[int], None] | None = None, timeout: float = TIMEOUT) -> bool:
    """Download url to dest unless dest exists; resumes `<dest>.part`. True when something was fetched."""
    if dest.is_file():
        return False
    output_target(dest)  # a device node or FIFO there: refused before the download, never replaced
    part = dest.with_name(dest.name + ".part")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.is_file() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            resumed = have > 0 and response.status == 206
            expected = response.headers.get("Content-Length")
            expected_total = (have if resumed else 0) + int(expected) if expected is not None else None
            with open(part, "ab" if resumed else "wb") as out:
                while block := response.read(CHUNK):
                    out.write(block)
                    if on_bytes is not None:
                        on_bytes(len(block))
        if expected_total is not None and part.stat().st_size != expected_total:
            raise DataError(url, f"download ended early ({part.stat().st_size} of {expected_total} bytes); run again "
                                 "to resume")
        move_onto(part, dest)
    except urllib.error.HTTPError as err:
        if err.code == 416 and part.is_file():  # the part file already holds everything
            move_onto(part, dest)
            return True
        raise DataError(url, f"download failed (HTTP {err.code} {err.reason}); check the URL, or try again "
                             "later") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        reason = getattr(err, "reason", err)
        raise DataError(url, f"download failed ({reason}); are you offline?") from None
    except OSError as err:
        raise DataError(dest, f"cannot write download ({err.strerror or err}); check free space and permissions "
                              f"of {dest.parent}") from None
    return True


def fetch_zip(url: str, dest_dir: Path, expected: dict[str, str] | None = None) -> Path:
    """Fetch a zip, extract it into dest_dir (atomically, via a temporary directory), check sha256s."""
    archive = dest_dir / url.rsplit("/", 1)[-1]
    folder = dest_dir / archive.stem
    fetch(url, archive)
    if not folder.is_dir():
        _extract(archive, folder)
    for name, sha in (expected or {}).items():
        if not (folder / name).is_file():
            raise DataError(folder / name, f"missing from {url}; delete {folder} and {archive} and run --action "
                                           "download again")
        if file_sha256(folder / name) != sha:
            raise DataError(folder / name, f"sha256 does not match the published value for {url}; delete {folder} "
                                           f"and {archive} and run --action download again")
    return folder


def _extract(archive: Path, folder: Path) -> None:
    """Unzip into a scratch folder beside folder, move the result (the zip's one top folder, when it has it) to
    folder's temporary name, then rename that into place; a killed run's temporaries are removed first."""
    try:
        with atomic_output(folder) as tmp, scratch_folder(folder) as scratch:
            with zipfile.ZipFile(archive) as z:
                z.extractall(scratch)
            inner = scratch / archive.stem
            os.replace(inner if inner.is_dir() else scratch, tmp)
    except zipfile.BadZipFile:
        archive.unlink()  # a corrupt archive would otherwise be "complete" forever
        raise DataError(archive, "not a valid zip file (deleted; run again to download it anew)") from None
    except OSError as err:
        raise DataError(archive, f"cannot extract ({err.strerror or err}); check free space and permissions of "
                                 f"{folder.parent}") from None


def download_google_weights(root: Path, base: str = GOOGLE_BERT) -> list[Path]:
    return [fetch_zip(base + name + ".zip", root / "google_pretrained_weights", files)
            for name, files in GOOGLE_WEIGHTS.items()]


def download_squad(root: Path, base: str = SQUAD_BASE, evaluators: dict[str, str] = SQUAD_EVAL) -> None:
    for version in ("v1.1", "v2.0"):
        for split in ("train", "dev"):
            fetch(f"{base}{split}-{version}.json", root / "squad" / version / f"{split}-{version}.json")
        fetch(evaluators[version], root / "squad" / version / f"evaluate-{version}.py")


def download_glue(root: Path, tasks: list[str], base: str = GLUE_BASE,
                  mrpc_urls: dict[str, str] = MRPC_URLS) -> None:
    for task in tasks:
        if task == "mrpc":
            _download_mrpc(root / "glue" / "MRPC", mrpc_urls)
        else:
            fetch_zip(base + GLUE_ZIPS[task], root / "glue")


def _download_mrpc(folder: Path, urls: dict[str, str]) -> None:
    """MRPC ships as Microsoft's two files plus GLUE's list of dev pairs; build train/dev/test.tsv from them."""
    for name, url in urls.items():
        fetch(url, folder / "raw" / name)
    if all((folder / name).is_file() for name in ("train.tsv", "dev.tsv", "test.tsv")):
        return  # a run killed between the three renames left some missing: those are written again
    dev_lines = (folder / "raw" / "dev_ids.tsv").read_text("utf-8-sig").split("\n")
    dev_ids = {tuple(line.split("\t")[:2]) for line in dev_lines if line.strip()}
    lines = (folder / "raw" / "msr_paraphrase_train.txt").read_text("utf-8-sig").split("\n")
    header, rows = lines[0], [line for line in lines[1:] if line.strip()]
    test = [line for line in (folder / "raw" / "msr_paraphrase_test.txt").read_text("utf-8-sig").split("\n")[1:]
            if line.strip()]
    outputs = {
        "train.tsv": [r for r in rows if tuple(r.split("\t")[1:3]) not in dev_ids],
        "dev.tsv": [r for r in rows if tuple(r.split("\t")[1:3]) in dev_ids],
        "test.tsv": test,
    }
    for name, body in outputs.items():
        (folder / f".{name}.tmp").unlink(missing_ok=True)  # the fixed temporary name of earlier versions
        with atomic_output(folder / name) as tmp:
            tmp.write_text("\n".join([header] + body) + "\n", encoding="utf-8")


BOOK_LIST_FORMAT = ("one plain-text book URL a line, or as the url_list.jsonl of the soskek/bookcorpus scraper "
                    '(one JSON object a line; its "txt" URLs are used, epub-only entries skipped)')


def read_book_urls(url_list: Path) -> tuple[list[str], int]:
    """The book URLs of a BookCorpus list and the number of JSON-lines entries without a .txt URL (skipped:
    only plain text is downloaded). Lines are URLs, or JSON objects as soskek/bookcorpus's download_list.py
    writes them; blank lines are ignored."""
    text = read_text_file(url_list, "BookCorpus URL list", error=DataError, wording={
        # The repository ships no list (BookCorpus is no longer distributed): say what to put there.
        "missing": f"{{what}} not found; this repository ships none. Write this file with {BOOK_LIST_FORMAT}; or "
                   "pass another file with --bookscorpus_url_list",
        "directory": "{what} is a directory, not a file; pass the list file with --bookscorpus_url_list",
        "not UTF-8": "{what} is not UTF-8 (byte {byte}); save it as UTF-8"})
    urls: list[str] = []
    no_txt = 0
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line.startswith("{"):
            if line:
                urls.append(line)
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(url_list, f"line {number}: not a JSON object ({err.msg}); write the list with "
                                      f"{BOOK_LIST_FORMAT}") from None
        url = entry.get("txt") if isinstance(entry, dict) else None
        if isinstance(url, str) and url.strip():
            urls.append(url.strip())
        else:
            no_txt += 1  # epub-only books: this recipe formats plain text only
    if not urls:
        raise DataError(url_list, f"BookCorpus URL list holds no book URL; write it with {BOOK_LIST_FORMAT}")
    return urls, no_txt


def download_books(url_list: Path, dest_dir: Path) -> tuple[int, int]:
    """Fetch every .txt URL of a BookCorpus list (see read_book_urls) as <dest_dir>/<name>.txt;
    (fetched/present, failed or without a .txt URL)."""
    urls, no_txt = read_book_urls(url_list)
    ok, failed = 0, no_txt
    for url in urls:
        name = url.rstrip("/").rsplit("/", 1)[-1] or "book"
        dest = dest_dir / (name if name.endswith(".txt") else name + ".txt")
        try:
            fetch(url, dest)
            ok += 1
        except DataError:
            failed += 1  # many BookCorpus links are dead: count them, keep going
    if ok == 0:
        raise DataError(url_list, f"none of the {len(urls)} book URLs could be downloaded; check the network "
                                  "and the URLs in the list")
    return ok, failed
