"""What the driver hands the trainer for one RL step, and what comes back. Plain data (no torch, no
Megatron): the driver builds it from rollout samples and advantages; every trainer rank runs the step.

Under TOP the training forward is the recompute: one forward per micro-batch gives the log-probs the loss
differentiates (the sampler path at the rollout temperature) and the ones the gate compares with the
engine's (the same numbers for `decode` rollouts; the fp32 prefill log-softmax of the same logits for
`prefill` rollouts). The gate is decided on the trainer before `optimizer.step()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from top_rl.config.algo import GateConfig, PolicyLossConfig

if TYPE_CHECKING:
    from top_rl.rl.gate import Verdict


@dataclass(frozen=True)
class RLSample:
    """One sample of an RL step as the driver hands it to the trainer: its tokens and the RL labels its loss and gate
    need (the engine's log-probs, the sampler's, the advantage, a name for reports).

    Not a TrainSequence (top_rl/train/sequence.py), though both hold tokens and a prompt length: a TrainSequence says
    only what the trainer scores and by which log-prob kind, and Trainer.logprobs scores sequences with no RL labels
    at all (the library use top_rl/train/__init__.py shows). train/rl_step.py makes up to three TrainSequences of one RLSample (the
    training forward at the rollout temperature, the gate's re-score of a later mini-batch, PPO's old policy), each
    with its own kind. Plain data in the rl layer, so the driver builds it without importing the trainer."""

    tokens: tuple[int, ...]  # prompt + response
    prompt_len: int
    rollout_logprobs: tuple[float, ...]  # what the engine reported for the gate (its log-prob source)
    old_logprobs: tuple[float, ...]  # the sampler's log-probs the response was drawn with (PPO's old policy)
    advantage: float
    uid: Any = None  # names the sample in a parity report (task item id)

    @property
    def num_scored(self) -> int:
        return len(self.tokens) - self.prompt_len

    @classmethod
    def from_rollout(cls, sample, advantage: float, uid: Any = None) -> "RLSample":
        """From an engine.interface.RolloutSample."""
        return cls(tuple(sample.prompt_ids) + tuple(sample.response_ids), len(sample.prompt_ids),
                   tuple(sample.logprobs), tuple(sample.sample_logprobs), float(advantage), uid)


@dataclass(frozen=True)
class RLBatch:
    samples: list[RLSample]
    temperature: float  # the rollout's sampling temperature: the loss's log-probs are taken at it
    logprob_source: str  # "prefill" | "decode": which engine number rollout_logprobs holds (the gate's kind)
    step: int  # 1-based step number, for reports and dumps
    updates: int = 1  # optimizer steps over this batch: consecutive equal mini-batches, in order
    # rollout.policy_lag > 0: the weight version the samples were generated under (checked by the driver: rl/versions),
    # older than the trainer's; the gate and PPO's old policy come from one forward under that version's weights.
    # None: the synchronous loop (the samples are the trainer's live version; its training forward is the gate's).
    behaviour_version: int | None = None


@dataclass
class StepReport:
    """Rank 0's account of one RL step. `verdict` is the gate's, whole (the driver acts on it: top_rl.rl.gate.act);
    when TOP parity failed under `top.on_violation=halt` the trainer applied no update (`updated` is False)."""

    parity: dict[str, float]  # train/... parity metrics (the gate's numbers); empty when TOP is off and unmeasured
    losses: dict[str, float]  # loss metrics reduced over ranks (DP mean, last PP stage)
    timings: dict[str, float]  # seconds: forward_backward, gate, optimizer, scoring (later mini-batches)
    updated: bool
    verdict: Verdict
    trainer_step: int  # optimizer steps the trainer has taken, this one included
    micro_batches: int  # forward/backward micro-batches this rank ran
    tokens: int  # prompt + response tokens of the batch
    policy_version: int = 1  # the trainer's weight version when the step began (its update makes the next one)
    gpu_memory: dict[str, float] = field(default_factory=dict)  # rank 0's GiB after the step (top_rl.driver.actors)
    lr: float | None = None  # the learning rate of the step's last update (top_rl.rl.lr_schedule); None: no update

    @property
    def violation(self) -> str | None:
        """The gate's violation report; None when TOP held (or the gate is off)."""
        return self.verdict.message


@dataclass
class RLStepConfig:
    """How the trainer runs every RL step of a run (set once, at trainer start)."""

    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    dump_dir: str | None = None  # where rank 0 writes a violation's dump (run_dir/parity)
    old_logprobs: str = "rollout"  # algo.old_logprobs: rollout | recompute (top_rl.config.algo.OldLogprobs)
    policy_lag: int = 0  # rollout.policy_lag: older versions' weights each rank keeps (top_rl.train.snapshots)
