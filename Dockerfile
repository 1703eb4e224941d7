# BERT pre-training, fine-tuning and deployment on an NGC PyTorch image (its CUDA build of torch is kept).
#   bash scripts/docker/build.sh && bash scripts/docker/launch.sh
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:25.01-py3
FROM ${FROM_IMAGE_NAME}

ENV BERT_PREP_WORKING_DIR=/workspace/data \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /workspace/bert

# Requirements first so that code changes reuse this layer. The image's torch stays: requirements.txt pins the
# PyPI build, which would replace the image's CUDA one. The CPU Triton server (pytriton, numpy<2, its own
# environment from triton/requirements-server.txt) is not installed: on GPU machines, serve deployer.py's model
# repository with NVIDIA's tritonserver container (nvcr.io/nvidia/tritonserver) instead.
COPY requirements.txt requirements-deploy.txt ./
RUN sed '/^torch==/d' requirements.txt > /tmp/requirements-image.txt \
    && pip install --no-cache-dir -r /tmp/requirements-image.txt -r requirements-deploy.txt \
    && rm /tmp/requirements-image.txt

COPY . .
# The recipe's modules as the package `bertrecipe` (pyproject.toml), in place; the dependencies are above.
RUN pip install --no-cache-dir --no-deps -e .
