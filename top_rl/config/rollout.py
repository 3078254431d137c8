"""What a step's rollout asks of the engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from top_rl.config.sglang import SglangSettings


class EngineKind(StrEnum):
    native = "native"  # in-process over the kernel seam, a Ray actor
    sglang = "sglang"  # SGLang servers launched by Ray actors


class LogprobSource(StrEnum):
    """Which engine number the gate compares (docs/numerics.md §6)."""

    prefill = "prefill"  # the engine re-scores finished sequences (fp32, untempered)
    decode = "decode"  # the sampler's own log-probs (tempered, compute dtype)
    # decode where the contract proves the attention backend's decode equal to its extend, else prefill; decided on
    # the driver with top.attention_backend (top_rl/driver/backend_choice.py) before any check
    auto = "auto"


class OnLongPrompt(StrEnum):
    """Prompts longer than the context allows (top_rl/tasks/prompts.py)."""

    error = "error"
    truncate = "truncate"
    skip = "skip"


@dataclass
class RolloutConfig:
    engine: EngineKind = EngineKind.native  # which engine generates: native (in-process) or sglang (servers)
    num_engines: int = 1  # rollout engines; a step's samples are split over them
    prompts_per_step: int = 16  # prompts a step samples (each n_samples times)
    n_samples: int = 16  # samples per prompt (the GRPO group; large groups: stable advantages from scratch)
    max_new_tokens: int = 2  # response length limit; longer responses are cut (rollout/truncated_frac)
    temperature: float = 1.0  # sampling temperature (> 1e-6: TOP samples)
    # the gate compares the trainer against this source; auto: decode where the contract proves the attention backend's
    # decode equal to its extend (no re-score pass), else prefill
    # (decode: the stricter source, the sampler's own log-probs; the reference kernels make decode and prefill agree
    # bit for bit, without TOP they visibly do not)
    logprob_source: LogprobSource = LogprobSource.decode
    # a prompt the context cannot hold: error (all checked at start) | truncate | skip
    on_long_prompt: OnLongPrompt = OnLongPrompt.error
    # 0: synchronous (the rollout of step k+1 starts after step k's weights are pushed). 1: one step off: the rollout
    # of step k+1 is generated under the weights before step k's update while step k trains; the trainer proves it
    # against those weights (a snapshot of them) and uses their log-probs as PPO's old policy (docs/architecture.md).
    # 2: two steps off, the same with copies of two versions (top_rl/driver/schedule.py)
    policy_lag: int = 0
    # every K steps, the step's generations to run_dir/samples/step_NNNNNN.jsonl.gz (top_rl/observe/samples.py); 0: off
    save_samples_every: int = 0
    save_samples_rows: int = 64  # at most this many rows per file (whole prompt groups, the step's first)
    sglang: SglangSettings = field(default_factory=SglangSettings)  # one SGLang engine's settings (rollout=sglang)
