#!/usr/bin/env bash
# Creates or reuses the int8 benchmark's peer environments from their pinned files, each only when its pins changed:
#   .venv-optimum   benchmarks/peer_envs/optimum.txt   (Optimum's ONNX export and ONNX Runtime quantization)
#   .venv-openvino  benchmarks/peer_envs/openvino.txt  (optimum-intel: OpenVINO and NNCF int8)
# Both pin transformers below the tests' 5.23, so neither is ever the tests' environment; the tests never need them.
# PYTHON picks the base interpreter (default python3; the pins were resolved on 3.11). Arguments name the ones to
# make (optimum, openvino; default both). Then: python -m benchmarks.int8_inference (it finds them at the root).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/ensure_venv.sh
source scripts/ensure_venv.sh
peers=("$@")
[ ${#peers[@]} -gt 0 ] || peers=(optimum openvino)
for peer in "${peers[@]}"; do
  case $peer in
    optimum|openvino) ;;
    *) echo "make_peer_envs.sh: unknown peer '$peer' (optimum or openvino)" >&2; exit 2 ;;
  esac
done
for peer in "${peers[@]}"; do
  # One literal call per environment: the tests read which requirements file goes into which environment.
  case $peer in
    optimum) ensure_venv benchmarks/peer_envs/optimum.txt .venv-optimum ;;
    openvino) ensure_venv benchmarks/peer_envs/openvino.txt .venv-openvino ;;
  esac
  if [ "$peer" = openvino ]; then
    # PyPI's torchvision is built against CUDA torch and fails to load under the CPU build, which breaks
    # transformers' imports; text models never use it (openvino.txt says more).
    ".venv-$peer/bin/python" -m pip uninstall --quiet --yes torchvision 2>/dev/null || true
  fi
  echo ".venv-$peer ready"
done
