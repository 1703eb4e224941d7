#!/usr/bin/env bash
# Creates or reuses .venv (and, on Linux, the Triton server's .venv-triton), installs the pinned requirements when
# they changed, lints the tree with ruff and runs the test suite. Extra arguments go to pytest, e.g.
# `bash scripts/test.sh tests/test_model.py -x`; `--fast` (first) leaves out the tests marked slow or integration,
# for day-to-day work. The tests run in one worker per core (pytest-xdist; TEST_WORKERS overrides the count, and
# TEST_WORKERS=0 runs them in this process, as pytest's -p no:xdist would).
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
# The linter first (pyproject.toml [tool.ruff]: import order, unused names, imports after code, pyflakes, bugbear):
# a second's work, and a finding fails the run as a failing test does.
.venv/bin/ruff check --quiet .
if [ "${1:-}" = --fast ]; then
  shift
  set -- -m "not slow and not integration" "$@"
fi
workers=${TEST_WORKERS:-$(nproc 2> /dev/null || echo 2)}
pytest=(.venv/bin/python -m pytest)
if [ "$workers" -gt 0 ]; then
  # worksteal: an idle worker takes pending tests from a busy one, so that a few long tests do not end the run alone.
  pytest+=(-n "$workers" --dist worksteal)
fi
# Root ignores permission bits, so the tests of read-only folders and files would be skipped: as root, run the suite
# without the capabilities that override them (where setpriv may drop them; a user's run needs nothing).
no_override=(setpriv --bounding-set "-dac_override,-dac_read_search")
if [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null && "${no_override[@]}" true 2> /dev/null; then
  pytest=("${no_override[@]}" "${pytest[@]}")
fi
exec "${pytest[@]}" "$@"
