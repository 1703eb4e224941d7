"""benchmarks/ is a package: each benchmark is a module run as `python -m benchmarks.<name>` from the repository
root, imports its siblings as `benchmarks.<name>` (or relatively), never as top-level modules beside it (which gave
one file two module names), and leaves the import path alone; the docs invoke the benchmarks that way."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from helpers import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
MODULES = sorted(path.stem for path in BENCHMARKS.glob("*.py") if path.name != "__init__.py")
LIBRARIES = {"common", "gpu_report_markdown"}  # imported by the benchmarks, no command of their own
# Where the benchmarks' commands are written down for people to run.
DOCS = [REPO_ROOT / "README.md", BENCHMARKS / "README.md", BENCHMARKS / "requirements.txt",
        *sorted((REPO_ROOT / "docs").glob("*.md")), *sorted(BENCHMARKS.glob("*.py")), *sorted(BENCHMARKS.glob("*.sh"))]


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def sibling_imports(path: Path) -> list[str]:
    """The imports in the file (at any depth) that name a benchmarks/ file as a top-level module."""
    found = []
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:  # relative imports are the package's own
            names = [node.module or ""]
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in names if name.split(".")[0] in MODULES]
    return found


def import_path_edits(path: Path) -> list[str]:
    """Uses of the interpreter's module search path (sys's `path`) in the file, read or written."""
    found = []
    for node in ast.walk(tree(path)):
        if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys"):
            found.append(f"line {node.lineno}")
        if isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            found.append(f"line {node.lineno}")
    return found


def test_the_benchmarks_are_the_expected_modules() -> None:
    """The checks below run over every file: a sample of names makes sure the glob found them."""
    assert {"common", "gemm_peak", "gpu_report", "model_throughput", "pretrain_throughput",
            "time_to_accuracy"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_a_benchmark_imports_its_siblings_through_the_package(module: str) -> None:
    assert sibling_imports(BENCHMARKS / f"{module}.py") == []


@pytest.mark.parametrize("module", MODULES)
def test_a_benchmark_leaves_the_import_path_alone(module: str) -> None:
    assert import_path_edits(BENCHMARKS / f"{module}.py") == []


def test_the_checks_catch_a_sibling_import_and_an_import_path_edit(tmp_path) -> None:
    """The two checks above can fail: a file written as the benchmarks were before is caught by both. (The
    attribute is spelt in two pieces here: test_package_layout.py refuses its name in any tracked file.)"""
    old_style = tmp_path / "old_style.py"
    old_style.write_text("import sys\nsys." + "path.insert(0, '.')\nfrom gemm_peak import gemm_peak\n"
                         "def f():\n    import model_throughput as mt\nfrom . import common\n"
                         "from benchmarks.common import middle\nimport benchmarks.gemm_peak\n", encoding="utf-8")
    assert sibling_imports(old_style) == ["line 3: gemm_peak", "line 5: model_throughput"]
    assert import_path_edits(old_style) == ["line 2"]


@pytest.mark.parametrize("module", sorted(set(MODULES) - LIBRARIES))
def test_a_benchmark_is_a_command_with_an_entry_point(module: str) -> None:
    guards = [node for node in tree(BENCHMARKS / f"{module}.py").body if isinstance(node, ast.If)
              and ast.unparse(node.test) in ('__name__ == "__main__"', "__name__ == '__main__'")]
    assert len(guards) == 1


@pytest.mark.parametrize("module", MODULES)
def test_a_benchmark_imports_as_a_module_of_the_package(module: str) -> None:
    imported = importlib.import_module(f"benchmarks.{module}")
    assert Path(imported.__file__).resolve() == BENCHMARKS / f"{module}.py"


def test_the_docs_run_the_benchmarks_as_modules() -> None:
    """No `python benchmarks/<name>.py` (a file run as a script cannot import benchmarks.common) in the docs,
    the benchmarks' own usage lines or the shell helpers."""
    script = re.compile(r"python3?\s+(?:\S*/)?benchmarks/\w+\.py")
    offenders = [f"{path.relative_to(REPO_ROOT)}: {match.group(0)}" for path in DOCS
                 for match in script.finditer(path.read_text(encoding="utf-8"))]
    assert offenders == []
