#!/usr/bin/env bash
# Creates or reuses .venv-triton, the CPU Triton server's own environment, and installs the pins of
# triton/requirements-server.txt into it when they changed (numpy 1.26.4: pytriton 0.7.0's bundled Python backend
# returns empty outputs under the NumPy 2 of .venv). PYTHON picks the base interpreter (default python3, <= 3.12).
# Then: .venv-triton/bin/python triton/server.py --model_file triton/model_repository/bert/1/model.onnx
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/ensure_venv.sh
source scripts/ensure_venv.sh
ensure_venv triton/requirements-server.txt .venv-triton
