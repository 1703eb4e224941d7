"""Raw corpora -> one article (or book) per line, articles separated by a blank line.

Wikipedia: the pages-articles XML dump (bz2 or plain) is streamed page by page; the wikitext of each
main-namespace, non-redirect page goes through wikiextractor (the maintained extractor NVIDIA's recipe also
uses; 6x faster than walking a mwparserfromhell tree on the sample dump, and cleaner), which removes tables,
references, templates, files, categories, headings and comments and keeps the visible text. Books: plain UTF-8
files (CRLF or LF, optional BOM), one book per line.

Formatting is split into tasks for dataprep/engine.py (local processes or Dask workers): one per dump file (Wikipedia
ships its dump whole or in parts, pages-articles1..27, which run in parallel) and one per group of up to
BOOKS_PER_TASK books. Each task writes its articles to a part file in a scratch folder beside the output; the
parts are joined in task order as they arrive, so the output is the same bytes whatever the engine and worker count.
"""
from __future__ import annotations

import bz2
import errno
import io
import logging
import os
import re
import shutil
import xml.etree.ElementTree as ET
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence, TextIO

from wikiextractor.extract import Extractor

from bertrecipe.common.atomic_files import atomic_output, scratch_folder
from bertrecipe.common.errors import DataError
from bertrecipe.common.files import read_text_file
from bertrecipe.dataprep.engine import Runner, in_order

BOOKS_PER_TASK = 256  # books formatted by one task: enough work to amortise a Dask round trip

def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def iter_wiki_pages(path: Path) -> Iterator[tuple[str, str]]:
    """(title, wikitext) of every main-namespace, non-redirect page of a dump, streamed."""
    opener = bz2.open if path.suffix == ".bz2" else open
    try:
        with opener(path, "rb") as stream:
            title, namespace, text, redirect = "", "", "", False
            root = None
            for event, elem in ET.iterparse(stream, events=("start", "end")):
                if root is None:
                    root = elem
                if event == "start":
                    continue
                name = _local(elem.tag)
                if name == "title":
                    title = elem.text or ""
                elif name == "ns":
                    namespace = elem.text or ""
                elif name == "redirect":
                    redirect = True
                elif name == "text":
                    text = elem.text or ""
                elif name == "page":
                    if namespace == "0" and not redirect:
                        yield title, text
                    title, namespace, text, redirect = "", "", "", False
                    root.clear()  # drop finished pages from the tree: memory stays flat over the whole dump
    except EOFError as err:
        raise DataError(path, f"truncated or corrupt compressed dump ({err}); delete it and run --action "
                              "download again") from None
    except OSError as err:
        raise DataError(path, f"cannot read dump ({err}); delete it and run --action download again") from None
    except ET.ParseError as err:
        raise DataError(path, f"malformed XML ({err}); delete it and run --action download again") from None
    except UnicodeDecodeError as err:
        raise DataError(path, f"not UTF-8 ({err.reason}); delete it and run --action download again") from None


LEFTOVER_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")


def wikitext_to_text(wikitext: str, title: str = "") -> str:
    """Visible prose of one article as a single line (no markup, templates, tables, references or headings)."""
    out = io.StringIO()
    Extractor("0", "0", "", title, wikitext.splitlines(keepends=True), keepSections=False, to_text=True,
              discard_empty=True).extract(out, html_safe=False)
    lines = [" ".join(line.split()) for line in out.getvalue().split("\n")]
    if lines and lines[0] == title:  # the extractor may print the title first; NVIDIA's recipe drops it
        lines = lines[1:]
    text = " ".join(line for line in lines if line)
    if "{{" in text:  # the extractor leaves templates inside tags it does not expand, e.g. {{eqm}} in <chem>
        text = " ".join(LEFTOVER_TEMPLATE.sub(" ", text).split())
    return text


def wiki_articles(path: Path) -> Iterator[str]:
    """One line of text per article of a dump, empty articles skipped."""
    logging.getLogger("wikiextractor").setLevel(logging.ERROR)  # its per-template warnings are noise here
    for title, wikitext in iter_wiki_pages(path):
        text = wikitext_to_text(wikitext, title)
        if text:
            yield text


def book_text(path: Path) -> str:
    """A book as one line: UTF-8 with or without BOM, CRLF or LF; whitespace runs become one space."""
    text = read_text_file(path, "book", encoding="utf-8-sig", newline="", error=DataError, wording={
        "unreadable": "cannot read the book ({reason}); fix its permissions or remove it",
        "not UTF-8": "not UTF-8 text (invalid byte at offset {byte}); convert the book to UTF-8 or remove it"})
    return " ".join(text.split())


def book_groups(path: Path, per_group: int | None = None) -> list[tuple[str, str]]:
    """The books of a .txt file or of every .txt file under a folder, in path order (sorted by parts, as sorted
    Paths are), in groups of up to per_group (default BOOKS_PER_TASK): (folder, the books' paths relative to
    it, joined by NUL). Compact, so that memory does not grow with the book count: 65,000 books took 21 MB as
    Paths, 10 MB as path strings, 1.5 MB as groups."""
    per_group = per_group or BOOKS_PER_TASK
    if path.is_file():
        return [(str(path.parent), path.name)]
    if not path.is_dir():
        raise DataError(path, "book folder not found; run --action download --dataset bookscorpus")
    groups, current = [], []
    for name in _walk_txt(str(path)):
        current.append(name)
        if len(current) == per_group:
            groups.append((str(path), "\0".join(current)))
            current = []
    if current:
        groups.append((str(path), "\0".join(current)))
    if not groups:
        raise DataError(path, "directory holds no .txt files; run --action download --dataset bookscorpus")
    return groups


def group_paths(group: Sequence[str]) -> list[str]:
    folder, names = group
    return [os.path.join(folder, name) for name in names.split("\0")]


def _walk_txt(folder: str, prefix: str = "") -> Iterator[str]:
    """The .txt files under folder, relative to it: each folder's entries in name order, depth first."""
    try:
        names = sorted(os.listdir(folder))  # names only: a DirEntry per book would cost 10 MB at 65,000
    except OSError as err:
        raise DataError(folder, f"cannot list the book folder ({err.strerror})") from None
    for name in names:
        full = os.path.join(folder, name)
        if os.path.isdir(full) and not os.path.islink(full):  # as rglob: a linked folder is not entered
            yield from _walk_txt(full, prefix + name + "/")
        elif name.endswith(".txt") and os.path.isfile(full):
            yield prefix + name


def format_tasks(corpus: str, sources: Sequence) -> list[tuple[str, tuple[str, ...]]]:
    """The (corpus, sources) of each formatting task, in output order: a dump file each for Wikipedia, a book
    group (book_groups) each for books, one task for the embedded corpus."""
    if corpus == "wikicorpus_en":
        return [(corpus, (str(dump),)) for dump in sources]
    if corpus == "bookscorpus":
        return [(corpus, tuple(group)) for group in sources]
    return [(corpus, ())]


def corpus_articles(corpus: str, sources: Sequence[str]) -> Iterator[str]:
    """The articles of one task's sources, in order."""
    if corpus == "wikicorpus_en":
        return (a for dump in sources for a in wiki_articles(Path(dump)))
    if corpus == "bookscorpus":
        return (book_text(Path(book)) for book in group_paths(sources))
    from bertrecipe.dataprep.default_corpus import articles
    return articles()


def format_part(corpus: str, sources: tuple[str, ...], part: str,
                on_article: Callable[[], None] | None = None) -> int:
    """One formatting task: the articles of sources, one a line with a blank line between, into the file part
    (in a scratch folder); the article count."""
    try:
        with open(part, "w", encoding="utf-8") as out:
            return _write_all(corpus_articles(corpus, sources), out, on_article)
    except OSError as err:
        raise DataError(part, f"cannot write ({err.strerror}); check free space and permissions") from None


def format_corpus(tasks: Sequence[tuple[str, tuple[str, ...]]], output: Path, run: Runner | None = None,
                  on_articles: Callable[[int], None] | None = None, source: Path | str | None = None) -> int:
    """Run the tasks (run: dataprep/engine.py's runner; None runs them here, one after the other) and join their
    parts into output atomically, each as soon as it and those before it are written; the article count. A
    failure leaves no output, part or folder behind."""
    each = (lambda: on_articles(1)) if on_articles is not None and run is None else None
    task = partial(format_part, on_article=each) if run is None else format_part
    total = 0
    try:
        with atomic_output(output) as tmp, scratch_folder(output) as scratch:
            parts = [str(scratch / f"part-{i:06d}.txt") for i in range(len(tasks))]
            jobs = [(corpus, sources, part) for (corpus, sources), part in zip(tasks, parts, strict=True)]
            with open(tmp, "wb") as out, closing(in_order(run, task, jobs)) as counts:
                for part, count in zip(parts, counts, strict=True):
                    total += count
                    if on_articles is not None and run is not None:  # here, the bar moved article by article
                        on_articles(count)
                    append_part(part, out)
            if total == 0:
                raise DataError(source or output, "no article with text was found in the input; check that it "
                                                  "holds the corpus (or run --action download again)")
    except OSError as err:
        raise DataError(output, f"cannot write ({err.strerror}); check free space and permissions") from None
    return total


def append_part(part: str, out: BinaryIO) -> None:
    """Append part to out and remove it."""
    with open(part, "rb") as f:
        if not _copied_in_kernel(f, out):
            shutil.copyfileobj(f, out, 1 << 20)  # from where the kernel's copy stopped, if it began
    os.unlink(part)  # frees its space before the next is copied


def _copied_in_kernel(source: BinaryIO, out: BinaryIO) -> bool:
    """Copy the rest of source to out inside the kernel (copy_file_range): no copy through this process, which
    runs alone while the workers format. False where the platform or file system cannot."""
    copy = getattr(os, "copy_file_range", None)  # Linux only
    if copy is None:
        return False
    out.flush()  # the kernel writes at the descriptor's offset: nothing may wait in out's buffer
    try:
        while copy(source.fileno(), out.fileno(), 1 << 30):
            pass
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return False
    return True


def _write_all(articles: Iterable[str], out: TextIO, on_article: Callable[[], None] | None) -> int:
    count = 0
    for text in articles:
        line = " ".join(text.split())
        if not line:
            continue
        out.write(line + "\n\n")
        count += 1
        if on_article is not None:
            on_article()
    return count
