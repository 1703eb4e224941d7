#!/usr/bin/env bash
# The GPU report (python -m benchmarks.gpu_report): the cuda tests, then GEMM peaks, BERT-large pre-training steps,
# the whole loop and SQuAD fine-tuning against their peers, into one JSON and one Markdown table.
#
#   bash benchmarks/gpu_report.sh [--tiny] [--output_dir DIR] [--wheels DIR] [--profile] [--data_prep] ...
#
# --wheels DIR first installs the wheels benchmarks/gather_gpu_wheels.sh gathered (the packages of our
# requirements a GPU image lacks) into /tmp/site, without network. The python is $PYTHON, else this checkout's
# .venv/bin/python where it exists, else python3. Every other flag goes to the report (--help lists them); an
# unknown one is refused here, before any wheel is installed or folder made. Runs from any folder.
set -euo pipefail

script="$(basename "${BASH_SOURCE[0]}")"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The report's own flags (benchmarks/gpu_report.py's argument_parser; a test keeps the two lists equal).
REPORT_FLAGS=(-h --help --tiny --output_dir --device --profile --data_prep --sections --time_budget --batch_128
              --batch_512)

refuse() {
    echo "error: $script: $1; see --help" >&2
    exit 2
}

known_report_flag() {
    local flag
    for flag in "${REPORT_FLAGS[@]}"; do
        [[ "$1" == "$flag" ]] && return 0
    done
    return 1
}

wheels=""
help=""
args=()
while (($#)); do
    case "$1" in
        --wheels)
            (($# >= 2)) && [[ "$2" != -* ]] || refuse "--wheels needs a folder"
            wheels="$2"
            shift 2
            ;;
        --wheels=*) wheels="${1#--wheels=}"; [[ -n "$wheels" ]] || refuse "--wheels needs a folder"; shift ;;
        -[0-9]*) args+=("$1"); shift ;;  # a negative number: a flag's value (argparse takes it so too)
        -*)
            known_report_flag "${1%%=*}" || refuse "unknown option $1"
            [[ "$1" == -h || "$1" == --help ]] && help=1
            args+=("$1")
            shift
            ;;
        *) args+=("$1"); shift ;;
    esac
done

if [[ -n "$help" ]]; then  # this script's usage, then the report's flags below
    sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    echo
fi

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

if [[ -n "$wheels" && -z "$help" ]]; then
    shopt -s nullglob
    found=("$wheels"/*.whl)
    shopt -u nullglob
    if ((${#found[@]} == 0)); then
        echo "error: $script: no .whl files in $wheels (make them with" \
            "bash benchmarks/gather_gpu_wheels.sh $wheels)" >&2
        exit 2
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${found[@]}"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The checkout first: the data/ scripts the report runs import bertrecipe from it, installed or not. From the
# checkout's root, `-m benchmarks.gpu_report` finds the package.
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
cd "$repo"
exec "$PYTHON" -m benchmarks.gpu_report "${args[@]}"
