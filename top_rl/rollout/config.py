"""What a step's rollout asks of the engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class EngineKind(StrEnum):
    native = "native"  # in-process over the kernel seam, a Ray actor
    sglang = "sglang"  # SGLang servers launched by Ray actors


class LogprobSource(StrEnum):
    """Which engine number the gate compares (docs/numerics.md §6)."""

    prefill = "prefill"  # the engine re-scores finished sequences (fp32, untempered)
    decode = "decode"  # the sampler's own log-probs (tempered, compute dtype)


class OnLongPrompt(StrEnum):
    """Prompts longer than the context allows (top_rl/tasks/prompts.py)."""

    error = "error"
    truncate = "truncate"
    skip = "skip"


@dataclass
class RolloutConfig:
    engine: EngineKind = EngineKind.native
    num_engines: int = 1
    prompts_per_step: int = 16
    n_samples: int = 8  # samples per prompt (the GRPO group)
    max_new_tokens: int = 4
    temperature: float = 1.0
    logprob_source: LogprobSource = LogprobSource.prefill  # the gate compares the trainer against this source
    on_long_prompt: OnLongPrompt = OnLongPrompt.error
    sglang: dict[str, Any] = field(default_factory=dict)  # SglangEngineConfig fields (rollout=sglang)
