"""What a step's rollout asks of the engines."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from top_rl.rollout.sglang_config import SglangEngineConfig


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


# rollout.sglang keys an engine takes from the run when left unset: model.path, rollout.logprob_source, top.enabled,
# top.attention_backend (top_rl/rollout/sglang_plan.py run_defaults); python: this interpreter
FROM_THE_RUN = {"model_path": None, "logprob_source": None, "top": None, "attention_backend": None, "python": ""}


def _hydra_type(hint):
    """An annotation OmegaConf can type: Literal -> str, `X | None` -> Optional[X], containers of Any."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return str
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return Optional[_hydra_type(inner[0])]
    if hint is dict:
        return dict[str, Any]
    return hint  # list[str], dict[str, str] and scalars OmegaConf types as they are


def _sglang_settings() -> type:
    """rollout.sglang as Hydra types it: SglangEngineConfig's fields and defaults (one source, so the two cannot
    drift), so `rollout.sglang.<key>=v` is checked and completed by Hydra like every other key, and the resolved
    config records every engine setting. FROM_THE_RUN keys default to "take it from the run"."""
    hints = typing.get_type_hints(SglangEngineConfig)
    fields = []
    for f in dataclasses.fields(SglangEngineConfig):
        if f.name in FROM_THE_RUN:
            unset = FROM_THE_RUN[f.name]
            fields.append((f.name, Optional[_hydra_type(hints[f.name])] if unset is None else str, field(default=unset)))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, _hydra_type(hints[f.name]), field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, _hydra_type(hints[f.name]), field(default=f.default)))
    return dataclasses.make_dataclass("SglangSettings", fields, module=__name__)


SglangSettings = _sglang_settings()


@dataclass
class RolloutConfig:
    engine: EngineKind = EngineKind.native  # which engine generates: native (in-process) or sglang (servers)
    num_engines: int = 1  # rollout engines; a step's samples are split over them
    prompts_per_step: int = 16  # prompts a step samples (each n_samples times)
    n_samples: int = 8  # samples per prompt (the GRPO group)
    max_new_tokens: int = 4  # response length limit; longer responses are cut (rollout/truncated_frac)
    temperature: float = 1.0  # sampling temperature (> 1e-6: TOP samples)
    logprob_source: LogprobSource = LogprobSource.prefill  # the gate compares the trainer against this source
    # a prompt the context cannot hold: error (all checked at start) | truncate | skip
    on_long_prompt: OnLongPrompt = OnLongPrompt.error
    # 0: synchronous (the rollout of step k+1 starts after step k's weights are pushed). 1: one step off: the rollout
    # of step k+1 is generated under the weights before step k's update while step k trains; the trainer proves it
    # against those weights (a snapshot of them) and uses their log-probs as PPO's old policy (docs/architecture.md)
    policy_lag: int = 0
    sglang: SglangSettings = field(default_factory=SglangSettings)  # one SGLang engine's settings (rollout=sglang)
