# TOP-RL GPU image: the pinned SGLang release image + Megatron-core 0.19 + this package (docs/docker.md).
#   docker build -t top-rl:sglang-0.5.11 .
#   docker run --gpus all --ipc=host --network=host --shm-size=32g -v /models:/models \
#     top-rl:sglang-0.5.11 top-rl +experiment=gsm8k_qwen3_0.6b
# SGLang 0.5.17 (its contract is built from the wheel's source, NOT yet proven on a GPU; README "Which SGLang"):
#   docker build --build-arg SGLANG_IMAGE=lmsysorg/sglang:v0.5.17 -t top-rl:sglang-0.5.17 .
# A run takes the contract of the image's release (top_rl/contract.py RELEASE_DEFAULTS) unless top.contract names
# one; launch/check_image.py fails the build on a release without a contract.
# The image's CUDA stack (torch 2.11.0, triton, sgl-kernel, flashinfer, NCCL) is kept exactly as SGLang pinned it:
# the trainer must run the same kernels as the servers, so nothing installed here may change it.
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.11
FROM ${SGLANG_IMAGE}

ARG MEGATRON_CORE="megatron-core>=0.19,<0.20"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1

# Everything the base image pinned becomes a constraint for the installs below.
RUN python3 -m pip freeze \
    | grep -iE '^(torch|torchvision|torchaudio|triton|sglang|sgl[-_]kernel|flashinfer[-_a-z]*|nvidia-[a-z0-9-]+|transformers|tokenizers|safetensors|numpy)==' \
    > /opt/top-rl-constraints.txt \
 && cat /opt/top-rl-constraints.txt

WORKDIR /opt/top-rl
COPY pyproject.toml README.md ./
COPY top_rl ./top_rl
COPY launch ./launch
# Editable, so launch/ stays next to the package (the Hydra tree, top_rl/conf/, is package data either way).
RUN python3 -m pip install -c /opt/top-rl-constraints.txt "${MEGATRON_CORE}" -e .
RUN python3 launch/check_image.py /opt/top-rl-constraints.txt \
 && top-rl-parity-probe --help >/dev/null

WORKDIR /workspace
CMD ["top-rl", "--help"]
