#!/usr/bin/env bash
# Sourced by test.sh, quickstart.sh and triton/setup_server_env.sh, from the repository root.
# `ensure_venv REQUIREMENTS [VENV_DIR]` creates or reuses VENV_DIR (default .venv) with $PYTHON (default python3)
# and installs the pinned requirements file into it when that file, or one it includes with -r/-c, changed since
# the last install into that environment (pip asks no index when every pin is already satisfied), then installs
# this checkout in editable mode (pyproject.toml: the package `bertrecipe`) when it, or the checkout's place, changed.

# The requirements file and, recursively, the files it includes (-r/-c, relative to the including file as pip
# reads them), one path a line.
requirements_closure() {
  local file=$1 included
  printf '%s\n' "$file"
  sed -n -E 's/^[[:space:]]*(-r|-c|--requirement|--constraint)[[:space:]=]*([^[:space:]#]+).*/\2/p' "$file" |
    while IFS= read -r included; do
      case $included in
        /*) requirements_closure "$included" ;;
        *) requirements_closure "$(dirname "$file")/$included" ;;
      esac
    done
}

ensure_venv() {
  local requirements=$1
  local venv=${2:-.venv}
  local python_bin=${PYTHON:-python3}
  if [ ! -x "$venv/bin/python" ]; then
    "$python_bin" -m venv "$venv"
  fi
  local stamp wanted files
  stamp="$venv/.installed-$(basename "$requirements").sha256"
  mapfile -t files < <(requirements_closure "$requirements")
  # a missing file fails here (callers set pipefail); the checkout's path is in it because the editable
  # install points there
  wanted=$({ cat "${files[@]}" pyproject.toml; pwd; } | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -r "$requirements"
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps -e .
    echo "$wanted" > "$stamp"
  fi
}
