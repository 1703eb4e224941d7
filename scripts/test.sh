#!/usr/bin/env bash
# Creates or reuses .venv (and, on Linux, the Triton server's .venv-triton), installs the pinned requirements when
# they changed, and runs the test suite. Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_model.py -x`;
# `--fast` (first) leaves out the tests marked slow or integration, for day-to-day work.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ensure_venv.sh
source scripts/ensure_venv.sh
ensure_venv requirements-test.txt
if [ "$(uname -s)" = Linux ]; then
  # tests/test_triton_server.py runs triton/server.py with it; pytriton's wheels exist for Linux only.
  ensure_venv triton/requirements-server.txt .venv-triton
else
  echo "not on Linux: no .venv-triton, tests/test_triton_server.py's server tests are skipped" >&2
fi
if [ "${1:-}" = --fast ]; then
  shift
  set -- -m "not slow and not integration" "$@"
fi
exec .venv/bin/python -m pytest "$@"
