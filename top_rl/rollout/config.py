"""What a step's rollout asks of the engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RolloutConfig:
    engine: str = "native"  # native (in-process Ray actor) | sglang (servers launched by Ray actors)
    num_engines: int = 1
    prompts_per_step: int = 16
    n_samples: int = 8  # samples per prompt (the GRPO group)
    max_new_tokens: int = 4
    temperature: float = 1.0
    # prefill: the engine re-scores finished sequences (fp32, untempered); decode: the sampler's own
    # log-probs (tempered, compute dtype). The gate compares the trainer against this source.
    logprob_source: str = "prefill"
    on_long_prompt: str = "error"  # error | truncate | skip, for prompts longer than the context allows
    sglang: dict[str, Any] = field(default_factory=dict)  # SglangEngineConfig fields (rollout=sglang)
