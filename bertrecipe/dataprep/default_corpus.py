"""The embedded default corpus: English prose that ships with every Python interpreter.

Sources, read at run time and never copied into the repository: the Python Language Reference topics of
`pydoc_data` (one article per topic) and the docstrings of the standard library's modules (one article per
module). Code samples, grammar rules and doctest lines (indented paragraphs) are left out.
"""
from __future__ import annotations

import ast
import sysconfig
from collections import deque
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


_DEFINITIONS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# Definitions sit only in statement bodies (an expression holds no statement), so the walk skips expressions.
_HOLD_STATEMENTS = (ast.mod, ast.stmt, ast.excepthandler, ast.match_case)


def definitions(tree: ast.AST) -> Iterator[ast.AST]:
    """The module, classes and functions of tree in ast.walk's breadth-first order, without visiting
    expressions (the bulk of the nodes)."""
    queue = deque([tree])
    while queue:
        node = queue.popleft()
        if isinstance(node, _DEFINITIONS):
            yield node
        queue.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, _HOLD_STATEMENTS))


def stdlib_docstrings() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if _SKIPPED_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        docs = [ast.get_docstring(node, clean=True) for node in definitions(tree)]
        text = " ".join(prose(d) for d in docs if d and len(d) >= MIN_DOC_CHARS)
        if text.strip():
            yield text


def articles() -> Iterator[str]:
    """Every article of the default corpus, in a fixed order."""
    yield from reference_topics()
    yield from stdlib_docstrings()
