"""The layout issue 29 asks for, read from the tree alone as an editor or a static tool reads it: every
`bertrecipe` import resolves to a file here; the sub-packages form layers that only import downwards; no module
import cycle; the root commands are thin and are also console scripts; no path or module-table tricks outside
triton/__init__.py."""
import ast
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import tomllib

from bertrecipe.cli import entry
from helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "bertrecipe"
# Lowest first; a sub-package may import only those of a lower layer (and itself), never a sibling of its own.
LAYERS = [("common",), ("tokenization",), ("model",), ("training",), ("pretraining", "finetuning"),
          ("dataprep", "deploy", "distillation"), ("release",), ("cli",)]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}
ROOT_COMMANDS = ["run_pretraining.py", "run_squad.py", "run_glue.py", "inference.py", "evaluate_squad.py",
                 "data/bertPrep.py", "data/create_pretraining_data.py", "data/build_default_corpus.py",
                 "scripts/convert_checkpoint.py", "scripts/plot_logs.py", "triton/deployer.py", "triton/server.py",
                 "triton/client.py", "triton/run_perf_client.py", "triton/run_squad_client.py",
                 "run_downstream.py", "run_retrieval.py", "distillation/general_distill.py",
                 "distillation/task_distill.py", "distillation/data_augmentation.py"]
ROOT_FACADES = ["model.py", "optimization.py"]  # NVIDIA's layout: re-exports only
MAX_COMMAND_LINES = 60


def tracked_python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return [REPO_ROOT / name for name in listed.stdout.split() if (REPO_ROOT / name).is_file()]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolves(dotted: str) -> bool:
    """True when `dotted` (a.b.c) is a module file or a package folder in the tree."""
    path = REPO_ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def bertrecipe_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a bertrecipe module in the file; `from m import name` gives m.name
    when that is a module itself, else m."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "bertrecipe"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "bertrecipe":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append((node.lineno, submodule if resolves(submodule) else node.module))
    return found


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        graph[module_name(path)] |= {target for _, target in bertrecipe_imports(path)}
    return graph


def sub_package(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


@pytest.mark.slow
def test_every_bertrecipe_import_resolves_to_a_file_in_the_tree():
    unresolved = [f"{path.relative_to(REPO_ROOT)}:{line}: {target}" for path in tracked_python_files()
                  for line, target in bertrecipe_imports(path) if not resolves(target)]
    assert not unresolved


def test_the_package_is_the_sub_packages_of_the_layers_and_nothing_else():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYER_OF)
    assert {p.name for p in PACKAGE.glob("*.py")} == {"__init__.py"}
    assert all((PACKAGE / name / "__init__.py").is_file() for name in folders)


def test_sub_packages_import_only_lower_layers():
    upward = [f"{source} -> {target}" for source, targets in package_graph().items() for target in targets
              if sub_package(source) != sub_package(target)
              and LAYER_OF[sub_package(target)] >= LAYER_OF[sub_package(source)]]
    assert not upward


def test_no_import_cycle_between_modules():
    graph = package_graph()
    state: dict[str, str] = {}
    cycles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles


def test_the_package_never_imports_the_root_files():
    root_names = {Path(name).stem for name in ROOT_COMMANDS + ROOT_FACADES} | {"data", "scripts", "triton",
                                                                               "benchmarks", "tests", "conftest"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            offenders += [f"{path.relative_to(REPO_ROOT)}: {n}" for n in names if n.split(".")[0] in root_names]
    assert not offenders


def console_scripts() -> dict[str, str]:
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def command_module(name: str) -> Path:
    """The module bertrecipe.cli.entry runs for the entry point `name`, checked to be a command: it has a cli()."""
    assert name in entry.COMMANDS, name
    path = PACKAGE / "cli" / f"{name}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert "cli" in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, path
    return path


@pytest.mark.parametrize("relative", ROOT_COMMANDS)
def test_a_root_command_is_thin_and_is_also_a_console_script(relative):
    """A root command imports only its entry point (which imports the command where a signal has its one line) and
    calls it; the same entry point is a console script."""
    path = REPO_ROOT / relative
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_COMMAND_LINES
    tree = ast.parse(text)
    imported = [node for node in tree.body if isinstance(node, (ast.ImportFrom, ast.Import))]
    assert len(imported) == 1 and imported[0].module == "bertrecipe.cli.entry", relative
    [alias] = imported[0].names
    command_module(alias.name)
    assert f"bertrecipe.cli.entry:{alias.name}" in console_scripts().values(), f"{relative}: no console script"
    assert not [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]


def test_every_console_script_runs_a_command_module_through_its_entry_point():
    for name, target in console_scripts().items():
        module, _, function = target.partition(":")
        assert module == "bertrecipe.cli.entry", (name, target)
        command_module(function)
    # every command module (a module of cli/ with a cli()) has its entry point
    commands = {path.stem for path in (PACKAGE / "cli").glob("*.py")
                if "def cli()" in path.read_text(encoding="utf-8")}
    assert commands == set(entry.COMMANDS)


@pytest.mark.parametrize("relative", ROOT_FACADES)
def test_the_root_model_and_optimization_files_only_re_export_the_package(relative):
    tree = ast.parse((REPO_ROOT / relative).read_text(encoding="utf-8"))
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    imports = [node for node in body if isinstance(node, ast.ImportFrom)]
    assert imports and all(node.module.startswith("bertrecipe.") for node in imports)
    exported = {alias.name for node in imports for alias in node.names}
    [assignment] = [node for node in body if not isinstance(node, ast.ImportFrom)]
    assert {element.value for element in assignment.value.elts} == exported  # __all__


def test_only_triton_init_touches_the_import_path_or_module_table():
    words = ("sys.path", "sys.modules", "syspath_prepend", "spec_from_file_location", "find_spec",
             "register_pickle_by_value")
    offenders = [f"{path.relative_to(REPO_ROOT)}: {word}" for path in tracked_python_files()
                 if path != REPO_ROOT / "triton" / "__init__.py" and path != Path(__file__).resolve()
                 for word in words if word in path.read_text(encoding="utf-8")]
    assert not offenders


def test_the_package_map_names_every_module_in_its_sub_packages_row():
    """bertrecipe/README.md is the map a newcomer opens first: each sub-package's row names every module of it
    (cli/ included: its commands are listed by name)."""
    rows = {}
    for line in (PACKAGE / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`") and cells[1].endswith("/`"):
            rows[cells[1].strip("`/")] = cells[2]
    assert set(rows) == set(LAYER_OF), sorted(rows)
    missing = [f"{folder.name}/{module.name}" for folder in PACKAGE.iterdir() if folder.name in rows
               for module in sorted(folder.glob("*.py"))
               if module.name != "__init__.py" and f"`{module.name}`" not in rows[folder.name]]
    assert missing == [], f"bertrecipe/README.md does not name {missing}"


COMMAND_PROTOCOL = {"main", "cli", "parse_args", "run"}  # every command module's entry points, alike by design


def test_one_meaning_per_public_function_name():
    """No two modules of the package define a public function of one name (bar the commands' own entry points):
    a reader who meets a name knows which function it is."""
    homes: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                homes[node.name].append(str(path.relative_to(REPO_ROOT)))
    shared = {name: files for name, files in homes.items() if len(files) > 1 and name not in COMMAND_PROTOCOL}
    assert shared == {}


def test_only_the_commands_see_the_flags():
    """Below cli/ the library takes typed settings (pretraining/settings.py, finetuning's LoopSettings): no module
    outside cli/ imports argparse or takes a parsed namespace."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            imported = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.split(".")[0] == "argparse" for name in imported):
                found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports argparse")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                    annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if "Namespace" in annotation or arg.arg == "args":
                        found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} takes flags ({arg.arg})")
    assert found == []


def test_test_modules_share_code_through_helpers_alone():
    """Shared test code lives in tests/helpers.py; a test module never imports another test module or conftest
    (whose fixtures pytest hands out), so that each one can be read, moved and run on its own."""
    tests = REPO_ROOT / "tests"
    local = {path.stem for path in tests.glob("*.py")} - {"helpers"}
    found = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name}:{node.lineno} imports {name}" for name in names if name.split(".")[0] in local]
    assert found == []
