#!/usr/bin/env bash
# Creates or reuses .venv, installs the pinned requirements when they changed, and runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_model.py -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ensure_venv.sh
source scripts/ensure_venv.sh
ensure_venv requirements-test.txt
exec .venv/bin/python -m pytest "$@"
