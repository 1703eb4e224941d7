#!/usr/bin/env bash
# The GPU report (benchmarks/gpu_report.py): the cuda tests, then GEMM peaks, BERT-large pre-training steps, the
# whole loop and SQuAD fine-tuning against their peers, into one JSON and one Markdown table.
#
#   bash benchmarks/gpu_report.sh [--tiny] [--output_dir DIR] [--wheels DIR] [--profile] [--data_prep] ...
#
# --wheels DIR first installs the wheels benchmarks/gather_gpu_wheels.sh gathered (the packages of our
# requirements a GPU image lacks) into /tmp/site, without network. The python is $PYTHON, else this checkout's
# .venv/bin/python where it exists, else python3. Every other flag goes to gpu_report.py (--help lists them).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

wheels=""
args=()
while (($#)); do
    case "$1" in
        --wheels) wheels="${2:?--wheels needs a folder}"; shift 2 ;;
        --wheels=*) wheels="${1#--wheels=}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done

if [[ -n "$wheels" ]]; then
    shopt -s nullglob
    found=("$wheels"/*.whl)
    shopt -u nullglob
    if ((${#found[@]} == 0)); then
        echo "error: no .whl files in $wheels (make them with bash benchmarks/gather_gpu_wheels.sh $wheels)" >&2
        exit 2
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${found[@]}"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The checkout first: the benchmarks and data/ scripts import bertrecipe from it, installed or not.
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
cd "$repo"
exec "$PYTHON" benchmarks/gpu_report.py "${args[@]}"
