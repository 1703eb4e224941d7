# BERT pre-training, fine-tuning and deployment on an NGC PyTorch image (its CUDA build of torch is kept).
#   bash scripts/docker/build.sh && bash scripts/docker/launch.sh
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:25.01-py3
FROM ${FROM_IMAGE_NAME}

ENV BERT_PREP_WORKING_DIR=/workspace/data \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /workspace/bert

# Requirements first so that code changes reuse this layer. The image's torch stays: requirements.txt pins the
# PyPI build, which would replace the image's CUDA one; pytriton comes without its numpy<2 bound.
COPY requirements.txt requirements-deploy.txt ./
COPY triton/requirements-server.txt triton/
RUN sed '/^torch==/d' requirements.txt > /tmp/requirements-image.txt \
    && pip install --no-cache-dir -r /tmp/requirements-image.txt -r requirements-deploy.txt \
    && pip install --no-cache-dir --no-deps -r triton/requirements-server.txt \
    && rm /tmp/requirements-image.txt

COPY . .
