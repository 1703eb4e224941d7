#!/usr/bin/env bash
# Creates or reuses .venv, installs the pinned requirements when they changed, and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_model.py -x`.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
# Reinstall only when a requirements file changed since the last install.
stamp=.venv/.requirements.sha256
wanted=$(cat requirements.txt requirements-test.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
  .venv/bin/python -m pip install --disable-pip-version-check --quiet -r requirements-test.txt
  echo "$wanted" > "$stamp"
fi
exec .venv/bin/python -m pytest "$@"
