#!/usr/bin/env bash
# Builds the image from the repository's Dockerfile: bash scripts/docker/build.sh [tag] [base image]
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-bert}
base=${2:-nvcr.io/nvidia/pytorch:25.01-py3}
docker build --network=host --build-arg FROM_IMAGE_NAME="$base" -t "$tag" .
