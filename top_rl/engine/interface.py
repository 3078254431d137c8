"""The rollout engine interface, the native engine and SGLang servers both implement it, and the engine side of the
weight seam (`EngineWeights`): every way trainer rank 0's weights can enter an engine. The transports in top_rl.weights
call only these methods; an engine implements the ways it has, and the others refuse, naming the engine and the ways it
does have. Kept apart from the engines (top_rl/rollout/), which import models and servers: the driver, the weight
transports and the eval import this alone, so none of them stands on an engine."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

from top_rl import contract
from top_rl.config.rollout import LogprobSource  # engines type with it


def mix_seed(a: int, b: int) -> int:
    """One integer from two (run seed and step): every seed of a run derives this way."""
    return a * 1_000_003 + b


def sample_seed(run_seed: int, step: int, index: int) -> int:
    """Each sample's sampling seed: a pure function of (run seed, step, position in the step). Engines pass it to
    SGLang's sampler as its int64 `sampling_seed` (config_checks.validate refuses a run whose seeds would not fit)."""
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


class WeightWayUnsupported(NotImplementedError):
    """An engine asked to take weights by a way it has no door for (a transport the link rule should not have chosen)."""


class EngineWeights(abc.ABC):
    """The engine side of the weight seam. Each method is one way in; `version` is the trainer's weight version, which
    every sample generated after the load carries (rl/versions.py checks it)."""

    WAYS = ("load_named_tensors", "load_directory", "load_ipc_buckets", "join_weight_group", "receive_bucket")

    def load_named_tensors(self, named: dict[str, Any], version: int | None = None) -> None:
        """One whole version as HF-named tensors (the native engine loads them; an SGLang engine writes them as a
        checkpoint its server reloads). `version` None: the one after the engine's last."""
        self._cannot("load_named_tensors")

    def load_directory(self, path: str, version: int | None = None) -> str:
        """One whole version from an HF checkpoint directory the engine can read; returns the version it now holds."""
        self._cannot("load_directory")

    def load_ipc_buckets(self, buckets: list[tuple[list[str], str | None]], version: int) -> None:
        """One whole version as CUDA IPC handles of flat buckets, serialised by trainer rank 0 (one
        (serialized_named_tensors, load_format) per bucket); the engine copies out before it returns."""
        self._cannot("load_ipc_buckets")

    def join_weight_group(self, host: str, port: int, backend: str, name: str) -> None:
        """Join trainer rank 0's broadcast group `name` at host:port as ranks 1.. of it (the engine's own ranks)."""
        self._cannot("join_weight_group")

    def receive_bucket(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                       weight_version: str | None = None) -> None:
        """One bucket of rank 0's broadcast over the joined group; `weight_version` marks the version's last."""
        self._cannot("receive_bucket")

    @classmethod
    def weight_ways(cls) -> list[str]:
        """The ways this engine implements (the others refuse)."""
        return [w for w in cls.WAYS if getattr(cls, w) is not getattr(EngineWeights, w)]

    def _cannot(self, way: str):
        raise WeightWayUnsupported(f"{type(self).__name__} has no {way}: it takes weights by "
                                   f"{', '.join(self.weight_ways()) or 'no way'} (top_rl/engine/interface.py)")


class RolloutEngine(EngineWeights):
    logprob_source: LogprobSource

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], seeds: list[int], params: SamplingParams) -> list[RolloutSample]:
        """One sample per (prompt, seed); a sample depends only on its prompt, seed and the weights."""

    @abc.abstractmethod
    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """Prefill re-scoring: log p(response[j] | prompt + response[:j]), fp32, no temperature (§6.1)."""

    progress = None  # the rollout in flight, where the engine counts it (top_rl.rollout.sglang.rollout.Progress)

    def rollout_metrics(self) -> dict:
        """The last rollout's own timings and its server's peaks, where the engine measures them."""
        return {}

    def health(self) -> bool:
        return True

    def shutdown(self) -> None:
        return None
