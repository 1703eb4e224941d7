#!/usr/bin/env bash
# Sourced by test.sh and quickstart.sh: creates or reuses .venv and installs a pinned requirements file into it
# when that file changed since the last install (pip asks no index when every pin is already satisfied).
ensure_venv() {
  local requirements=$1
  local python_bin=${PYTHON:-python3}
  if [ ! -x .venv/bin/python ]; then
    "$python_bin" -m venv .venv
  fi
  local stamp wanted
  stamp=".venv/.installed-$(basename "$requirements").sha256"
  wanted=$(cat requirements*.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
    .venv/bin/python -m pip install --disable-pip-version-check --quiet -r "$requirements"
    echo "$wanted" > "$stamp"
  fi
}
