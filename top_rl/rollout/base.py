"""The rollout engine interface: the native engine and SGLang servers both implement it."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Literal

from top_rl import contract
from top_rl.rollout.config import LogprobSource  # engines type with it


def mix_seed(a: int, b: int) -> int:
    """One integer from two (run seed and step): every seed of a run derives this way."""
    return a * 1_000_003 + b


def sample_seed(run_seed: int, step: int, index: int) -> int:
    """Each sample's sampling seed: a pure function of (run seed, step, position in the step). Engines pass it to
    SGLang's sampler as its int64 `sampling_seed` (config.validate refuses a run whose seeds would not fit)."""
    return mix_seed(run_seed, step) * 65_537 + index


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if contract.temperature_refusal(self.temperature):
            raise ValueError(f"temperature={self.temperature} {contract.temperature_refusal(self.temperature)}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")


@dataclass
class RolloutSample:
    prompt_ids: list[int]
    response_ids: list[int]
    # The numbers the parity gate compares, from the engine's configured log-prob source.
    logprobs: list[float]
    # The sampler's log-probs (§6.2: tempered, compute dtype): the distribution tokens were drawn from.
    sample_logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    seed: int
    meta: dict = field(default_factory=dict)
    # The weight version the engine held when it generated this sample (the native engine: the version of the last
    # push it took; SGLang: the server's reported weight_version): the driver refuses a batch not of the version it
    # expects (top_rl.rl.versions), and the trainer proves it against that version's weights.
    weight_version: int | None = None


class RolloutEngine(abc.ABC):
    logprob_source: LogprobSource

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], seeds: list[int], params: SamplingParams) -> list[RolloutSample]:
        """One sample per (prompt, seed); a sample depends only on its prompt, seed and the weights."""

    @abc.abstractmethod
    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """Prefill re-scoring: log p(response[j] | prompt + response[:j]), fp32, no temperature (§6.1)."""

    @abc.abstractmethod
    def update_weights(self, hf_state_dict: dict) -> None:
        """Take new weights (Hugging Face names); the next generate uses them."""

    progress = None  # the rollout in flight, where the engine counts it (top_rl.rollout.sglang.rollout.Progress)

    def rollout_metrics(self) -> dict:
        """The last rollout's own timings and its server's peaks, where the engine measures them."""
        return {}

    def health(self) -> bool:
        return True

    def shutdown(self) -> None:
        return None
