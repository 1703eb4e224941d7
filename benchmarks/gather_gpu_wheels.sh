#!/usr/bin/env bash
# The wheels of our pinned requirements that a GPU machine (CPython 3.12, manylinux x86_64, torch and transformers
# installed, no network) lacks, downloaded here for `bash benchmarks/gpu_report.sh --wheels DIR` there:
#
#   bash benchmarks/gather_gpu_wheels.sh [DIR]        # DIR defaults to .whl in the checkout (ignored by git)
#
# DIR is the one argument besides -h/--help; anything else (a second folder, a word starting with -) is refused in
# one line, exit status 2, before anything is downloaded or made.
#
# Left out of requirements.txt: torch (the machine's CUDA build); numpy, tokenizers, safetensors and tqdm, which
# transformers brings there (ours, first on PYTHONPATH, would shadow them under the image's transformers);
# matplotlib (plot_logs.py only, 9 MB with its dependencies); dask, distributed and dask-jobqueue (bertPrep's dask
# and slurm engines only, imported when chosen; without their own dependencies, which --no-deps leaves out, they
# would not import). Added: pytest for the cuda tests, at requirements-test.txt's pin, and its dependencies at the
# versions the test environment runs it with.
set -euo pipefail

script="$(basename "${BASH_SOURCE[0]}")"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir=""
for arg in "$@"; do
    case "$arg" in
        -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; exit 0 ;;
        -*) echo "error: $script: unknown option $arg; see --help" >&2; exit 2 ;;
        *)
            if [[ -n "$dir" ]]; then
                echo "error: $script: one folder at most, got $dir and $arg; see --help" >&2
                exit 2
            fi
            dir="$arg"
            ;;
    esac
done
dir="${dir:-$repo/.whl}"
python="${PYTHON:-python3}"

left_out='^(torch|numpy|tokenizers|safetensors|tqdm|matplotlib|dask|distributed|dask-jobqueue)=='
mapfile -t pins < <(sed 's/[[:space:]]*#.*//' "$repo/requirements.txt" | grep -E '^[A-Za-z0-9_.-]+==' |
    grep -Ev "$left_out")
mapfile -t pytest_pin < <(grep -E '^pytest==' "$repo/requirements-test.txt")
pins+=("${pytest_pin[@]}" pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0)

# Binary wheels for the GPU machine's interpreter, whatever this one is; pure-Python wheels (py3-none-any) match
# these platforms too.
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" "${pins[@]}"

echo "$(du -sh "$dir" | cut -f1) in $dir: ${pins[*]}"
echo "install on the GPU machine (gpu_report.sh --wheels $dir does it):"
echo "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site" \
    "$dir/*.whl && export PYTHONPATH=/tmp/site"
