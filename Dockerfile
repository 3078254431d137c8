# TOP-RL GPU image: the pinned SGLang release image + this package, every Python package it installs pinned
# (docs/docker.md; NOT yet built by the project: no machine here runs Docker).
#   docker build -t top-rl:sglang-0.5.11 .
#   docker run --gpus all --ipc=host --network=host --shm-size=32g -v /models:/models \
#     top-rl:sglang-0.5.11 top-rl +experiment=gsm8k_qwen3_0.6b
# SGLang 0.5.17 (contract qwen3_dense_top_v1_sglang0517, proven on Hopper GPUs like 0.5.11; README "Which SGLang"):
#   docker build --build-arg SGLANG_VERSION=0.5.17 -t top-rl:sglang-0.5.17 .
# A run takes the contract of the image's release (top_rl/contract.py RELEASE_DEFAULTS) unless top.contract names
# one; launch/check_image.py fails the build on a release without a contract.
# The image's CUDA stack (torch 2.11.0, triton, sglang-kernel, flashinfer, NCCL, transformers) is kept exactly as SGLang
# pinned it: the trainer must run the same kernels as the servers, so nothing installed here may change it. Everything
# else TOP-RL installs is pinned by requirements/docker-sglang-<v>.lock (scripts/docker_lock.py), and the build fails
# if any package it installed or changed is not pinned there.
ARG SGLANG_VERSION=0.5.11
ARG SGLANG_IMAGE=lmsysorg/sglang:v${SGLANG_VERSION}
FROM ${SGLANG_IMAGE}
ARG SGLANG_VERSION

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1

# Everything the base image pinned becomes a constraint for the installs below; its full freeze is kept so the last
# step can tell what this build installed or changed.
RUN python3 -m pip freeze > /opt/top-rl-base-freeze.txt \
 && grep -iE '^(torch|torchvision|torchaudio|triton|sglang|sgl[-_]kernel|sglang[-_]kernel|flashinfer[-_a-z]*|nvidia-[a-z0-9-]+|transformers|tokenizers|safetensors|numpy)==' \
    /opt/top-rl-base-freeze.txt > /opt/top-rl-constraints.txt \
 && cat /opt/top-rl-constraints.txt

WORKDIR /opt/top-rl
COPY pyproject.toml README.md ./
COPY requirements ./requirements
COPY top_rl ./top_rl
COPY launch ./launch
# Editable, so launch/ stays next to the package (the Hydra tree, top_rl/conf/, is package data either way).
RUN python3 -m pip install -c /opt/top-rl-constraints.txt -c requirements/docker-sglang-${SGLANG_VERSION}.lock -e .
RUN python3 launch/check_image.py /opt/top-rl-constraints.txt \
      --lock requirements/docker-sglang-${SGLANG_VERSION}.lock --before /opt/top-rl-base-freeze.txt \
 && top-rl-parity-probe --help >/dev/null
# The GPU itself is checked where the image runs (a build sees none): docker run --gpus all IMAGE top-rl doctor

WORKDIR /workspace
CMD ["top-rl", "--help"]
