"""The docs' links into the code still point where they say: docs/read-this-first.md follows one batch with
file:line anchors, and a refactoring that moves a function must move its anchor too."""
import re

import pytest

from helpers import REPO_ROOT

DOCS = sorted((REPO_ROOT / "docs").glob("*.md")) + [REPO_ROOT / "README.md", REPO_ROOT / "bertrecipe" / "README.md"]
# [text](relative/path#L12) or [text](relative/path)
LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]+)(?:#L(\d+))?\)")
# A name in backticks right before a line link, e.g. "`make_batch` ([data.py:90](...#L90))": the line must hold it.
NAMED_ANCHOR = re.compile(r"`([A-Za-z_][\w.]*)(?:\(\))?`[^`\[]{0,40}\(\[[^\]]*\]\(([^)#\s]+)#L(\d+)\)")


def links(doc):
    return [(m.group(2), m.group(3)) for m in LINK.finditer(doc.read_text(encoding="utf-8"))
            if not m.group(2).startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_names_a_file_and_line_that_exist(doc):
    broken = []
    for target, line in links(doc):
        path = (doc.parent / target).resolve()
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif line and int(line) > len(path.read_text(encoding="utf-8").splitlines()):
            broken.append(f"{target}#L{line}: past the end of the file")
    assert not broken


def test_read_this_first_anchors_land_on_the_names_they_follow():
    doc = REPO_ROOT / "docs" / "read-this-first.md"
    text = doc.read_text(encoding="utf-8")
    checked, wrong = 0, []
    for match in NAMED_ANCHOR.finditer(text):
        name, target, line = match.group(1).split(".")[-1], match.group(2), int(match.group(3))
        lines = (doc.parent / target).resolve().read_text(encoding="utf-8").splitlines()
        window = "\n".join(lines[max(0, line - 1): line + 5])  # the line and a few after (a signature, fields)
        checked += 1
        if name not in window:
            wrong.append(f"`{name}` -> {target}#L{line}: {lines[line - 1].strip()[:80]!r}")
    assert checked >= 10 and not wrong


def test_the_read_this_first_path_from_shard_to_loss_names_at_most_four_files():
    text = (REPO_ROOT / "docs" / "read-this-first.md").read_text(encoding="utf-8")
    section = text.split("## From a shard to the loss", 1)[1].split("\n## ", 1)[0]
    files = {target for target, _ in ((m.group(2), m.group(3)) for m in LINK.finditer(section))}
    assert 1 <= len(files) <= 4, sorted(files)
