"""A quiet console: third-party start-up notices about things TOP-RL does not use, filtered once per process.

`install()` is called by the CLI entry points before anything heavy is imported, and at the top of each Ray
actor's `__init__`. Every filter names the package module that issues the notice and the start of its text,
so a warning from TOP-RL itself, or any other message from those packages, still shows. What is hidden:

- megatron-core 0.19: Transformer Engine / Apex / absl are optional accelerations and loggers TOP-RL does
  not use (docs/megatron.md §1); "GPTModel IS DEPRECATED" (it still works and is what the TOP layer spec
  builds); "full scope is deprecated", raised by its own default `cuda_graph_modules="full"`.
- torch: "No CUDA runtime is found, using CUDA_HOME=..." when a CUDA build of torch runs on a CPU machine.
- SGLang: "Triton is not supported on current platform" when its argument parser is imported on a CPU machine (the
  extra_args check before Ray starts).
- Ray: "Token authentication is enabled for this Ray cluster" (the secure default; the warning Ray prints
  when authentication is *disabled* is left alone).

Warnings raised while a module is imported can fire in a Ray worker before any actor code runs (when
arguments are unpickled), so the warning filters are also exported in PYTHONWARNINGS (Python's documented
variable): processes started from here, a local Ray's workers included, begin with them.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

from top_rl.sglang_release import RELEASES

# (module that calls warnings.warn, start of the message); all are UserWarnings.
WARNINGS = [
    ("megatron.core.optimizer", "Transformer Engine and Apex are not installed"),
    ("megatron.core.optimizer.optimizer", "Transformer Engine and Apex are not installed"),
    ("megatron.core.optimizer.clip_grads", "Transformer Engine and Apex are not installed"),
    ("megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision",
     "Transformer Engine and Apex are not installed"),
    ("megatron.core.models.backends", "Apex is not installed. Falling back to Torch Norm"),
    ("megatron.core.models.gpt.gpt_layer_specs", "Apex is not installed. Falling back to Torch Norm"),
    ("megatron.core.hyper_comm_grid", "absl.logging is not installed"),
    ("megatron.core.transformer.transformer_config", "full scope is deprecated"),
    # SGLang's parser, imported on a CPU driver to check extra_args before Ray starts (top_rl.rollout.sglang.launch)
    *((r.fla_logger, "Triton is not supported on current platform") for r in RELEASES.values()),
]

# (logger name, start of the message)
LOG_RECORDS = [
    ("megatron.core.models.gpt.gpt_model", "GPTModel IS DEPRECATED"),
    ("torch.utils.cpp_extension", "No CUDA runtime is found"),
    ("ray._private.authentication.authentication_token_setup", "Token authentication is enabled for this Ray cluster"),
]


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _env_entry(module: str, message: str) -> str:
    # PYTHONWARNINGS: action:message:category:module (message matches a prefix, module exactly)
    return f"ignore:{message}:UserWarning:{module}"


def install() -> None:
    """Install the filters in this process (idempotent) and export the warning filters to child processes."""
    for module, message in WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=UserWarning,
                                module=re.escape(module) + r"\Z")
    for name, prefix in LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefix) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropPrefix(prefix))
    given = [e for e in os.environ.get("PYTHONWARNINGS", "").split(",") if e]
    ours = [_env_entry(module, message) for module, message in WARNINGS]
    os.environ["PYTHONWARNINGS"] = ",".join(given + [e for e in ours if e not in given])
