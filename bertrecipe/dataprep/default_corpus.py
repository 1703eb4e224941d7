"""The embedded default corpus: English prose that ships with every Python interpreter.

Sources, read at run time and never copied into the repository: the Python Language Reference topics of
`pydoc_data` (one article per topic) and the docstrings of the standard library's modules (one article per
module). Code samples, grammar rules and doctest lines (indented paragraphs) are left out.
"""
from __future__ import annotations

import ast
import sysconfig
from pathlib import Path
from typing import Iterator

_SKIPPED_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "turtledemo"}
MIN_DOC_CHARS = 200  # shorter docstrings are one-liners, not prose


def prose(text: str) -> str:
    """Unindented paragraphs of reStructuredText-like text, as one line (headings and code dropped)."""
    kept = []
    for paragraph in text.split("\n\n"):
        lines = [line for line in paragraph.split("\n") if line.strip()]
        if not lines or any(line.startswith((" ", "\t", ">>>")) for line in lines):
            continue
        if len(lines) <= 2 and set(lines[-1].strip()) <= set("*=-~^"):
            continue  # a heading and its underline
        kept.append(" ".join(" ".join(line.split()) for line in lines))
    return " ".join(p for p in kept if any(c.isalpha() for c in p) and p.rstrip()[-1:] in ".:?!)\"")


def reference_topics() -> Iterator[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions split it out; the docstrings are still there
        return
    for name in sorted(topics):
        text = prose(topics[name])
        if text:
            yield text


def stdlib_docstrings() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if _SKIPPED_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        docs = [ast.get_docstring(node, clean=True) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        text = " ".join(prose(d) for d in docs if d and len(d) >= MIN_DOC_CHARS)
        if text.strip():
            yield text


def articles() -> Iterator[str]:
    """Every article of the default corpus, in a fixed order."""
    yield from reference_topics()
    yield from stdlib_docstrings()
