"""What the trainer scores: one token sequence and which of its tokens, by which log-prob kind.
Importable without Megatron, so the RL driver can build batches without loading the trainer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from top_rl import contract


@dataclass(frozen=True)
class TrainSequence:
    """One sequence the trainer scores (Trainer.logprobs, the RL step's forwards): its tokens, its prompt length and
    the log-prob kind of its scored tokens (temperature None: the fp32 prefill kind; T: the sampler path at T).

    Not an RLSample (top_rl/rl/batch.py), which carries what one RL sample is labelled with (advantage, the engine's
    and the sampler's log-probs): scoring needs none of that, and Trainer.logprobs scores sequences outside RL too
    (the library use top_rl/train/__init__.py shows). The RL step turns one RLSample into up to three TrainSequences of different kinds
    (train/rl_step.py), so the kind belongs here and not on the sample."""

    tokens: Sequence[int]
    prompt_len: int
    temperature: float | None = None
    # With a temperature: also return the fp32 prefill log-probs of the scored tokens, computed from the same
    # logits (the gate's number when the engine reports prefill re-scores while the loss uses the sampler path).
    gate_prefill: bool = False

    def __post_init__(self):
        if not 1 <= self.prompt_len < len(self.tokens):
            raise ValueError(f"prompt_len={self.prompt_len} must be in [1, {len(self.tokens)}): at least one "
                             "prompt token and one scored token")
        if self.temperature is not None and contract.temperature_refusal(self.temperature):
            raise ValueError(f"temperature={self.temperature} {contract.temperature_refusal(self.temperature)}")
        if self.gate_prefill and self.temperature is None:
            raise ValueError("gate_prefill needs a temperature: a prefill-kind sequence already scores the prefill path")

    @property
    def num_scored(self) -> int:
        return len(self.tokens) - self.prompt_len

    @classmethod
    def from_sample(cls, sample, temperature: float | None = None) -> "TrainSequence":
        """From a rollout sample (prompt_ids, response_ids); temperature None scores the prefill kind."""
        return cls(tuple(sample.prompt_ids) + tuple(sample.response_ids), len(sample.prompt_ids), temperature)
