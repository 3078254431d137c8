"""One RL step on every trainer rank: the training forward is the gate's recompute.

Order (top_rl/rl/batch.py says what goes in and out):
  1. with several updates per rollout batch, the samples of mini-batches 2.. are scored forward-only first:
     their gate values must come from the weights the engine sampled with (before any update);
  2. forward + backward of mini-batch 1, micro-batch by micro-batch: each forward yields the loss's log-probs
     (sampler path at the temperature) and the gate's (the same numbers, or the fp32 prefill log-softmax of
     the same logits for prefill-sourced rollouts);
  3. the gate, on every rank from the same gathered numbers, before any `optimizer.step()`: a violation
     under `halt` applies no update;
  4. the optimizer step, then mini-batches 2.. (forward, backward, step each).
Where the gate's numbers come from is decided once (GateSource). A lagged batch (rollout.policy_lag > 0:
`batch.behaviour_version` older than the trainer's version) replaces 1 and the gate's half of 2 with one forward
without gradients under the behaviour version's weights (top_rl.train.snapshots): it gives every sample's gate
numbers and its sampler log-probs, and those proven numbers are PPO's old policy, so the ratio is pi_theta / pi_v
exactly. The training forwards then run under the live weights and feed only the loss.
Loss metrics are reduced over ranks: summed / token-weighted over DP, taken where the logits are (last PP
stage, TP and CP rank 0), so every layout reports them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from top_rl.rl import gate
from top_rl.rl.batch import RLBatch, RLStepConfig, StepReport
from top_rl.config.algo import PolicyLossConfig
from top_rl.rl.losses import policy_loss
from top_rl.train.logprobs import split_per_sample
from top_rl.train.sequence import TrainSequence

_SUMMED = ("pg_loss",)  # additive over micro-batches and DP ranks (each is normalised by the whole mini-batch)
_WEIGHTED = ("pg_clipfrac", "ppo_kl", "kl_ref", "entropy")  # token-weighted means


def minibatches(n: int, updates: int) -> list[list[int]]:
    """Consecutive, as equal as possible, never empty."""
    if not 1 <= updates <= n:
        raise ValueError(f"{updates} updates need at least as many samples (got {n})")
    bounds = [round(k * n / updates) for k in range(updates + 1)]
    return [list(range(bounds[k], bounds[k + 1])) for k in range(updates)]


@dataclass(frozen=True)
class GateSource:
    """Where every sample's gate numbers come from, decided once per step: a lagged batch's all from one forward
    without gradients under the snapshot of the version that sampled it (`snapshot`); otherwise mini-batch 1's from
    its training forward (`trained`) and the later mini-batches' from a scoring forward under the same, not yet
    updated, weights (`scored`)."""

    snapshot: int | None
    trained: tuple[int, ...] = ()
    scored: tuple[int, ...] = ()

    @staticmethod
    def of(batch: RLBatch, policy_version: int, parts: list[list[int]]) -> "GateSource":
        if batch.behaviour_version is not None and batch.behaviour_version != policy_version:
            return GateSource(snapshot=batch.behaviour_version)
        return GateSource(None, tuple(parts[0]), tuple(i for part in parts[1:] for i in part))


class _Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.times: dict[str, float] = {}

    def lap(self, name: str, t0: float) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - t0
        return now


def run(trainer, batch: RLBatch, cfg: RLStepConfig) -> StepReport | None:
    """Rank 0 returns the report; the other ranks return None (they hold the same verdict)."""
    samples, T = batch.samples, batch.temperature
    prefill_gate = batch.logprob_source == "prefill"
    seqs = [TrainSequence(s.tokens, s.prompt_len, T, gate_prefill=prefill_gate) for s in samples]
    parts = minibatches(len(samples), batch.updates)
    clock = _Clock(trainer.device)
    t = time.perf_counter()
    versions = trainer.snapshots
    policy_version = versions.current
    versions.record(trainer.model)  # the live weights, for the batches sampled under them (none without a lag)

    # 1. The gate's numbers that no training forward gives, before any update.
    source = GateSource.of(batch, policy_version, parts)
    gate_lps: list[torch.Tensor | None] = [None] * len(samples)
    old = [torch.tensor(s.old_logprobs, dtype=torch.float32) for s in samples]
    if source.snapshot is not None:  # every sample's gate numbers and old log-probs, under the behaviour weights
        with versions.swapped_in(trainer.model, source.snapshot, f"the batch of step {batch.step}"):
            behaviour, gate_lps = trainer.logprobs_and_gate(seqs)
        old = [lp.float() for lp in behaviour]
        t = clock.lap("behaviour_forward", t)
    if source.scored:
        scored = trainer.logprobs([TrainSequence(seqs[i].tokens, seqs[i].prompt_len, None if prefill_gate else T)
                                   for i in source.scored])
        for i, lp in zip(source.scored, scored):
            gate_lps[i] = lp
        t = clock.lap("scoring", t)

    # algo.old_logprobs=recompute: PPO's old policy from one forward-only pass under the weights that sampled
    if cfg.old_logprobs == "recompute" and source.snapshot is None:  # (config.validate refuses it with a lag)
        old = [lp.float() for lp in trainer.logprobs([TrainSequence(s.tokens, s.prompt_len, T) for s in samples])]
        t = clock.lap("old_logprobs", t)

    # 2. Mini-batch 1: its training forward gives its gate values (none of a lagged batch's: see GateSource).
    meter = _LossMeter(trainer.device)
    first = _forward_backward(trainer, seqs, old, samples, parts[0], cfg.loss, meter)
    t = clock.lap("forward_backward", t)
    for i, lp in zip(source.trained, first):
        gate_lps[i] = lp

    # 3. The gate, before any optimizer step.
    trainer_side = [lp.to(torch.float32 if prefill_gate else trainer.compute_dtype) for lp in gate_lps]
    rollout_side = [torch.tensor(s.rollout_logprobs, dtype=lp.dtype) for s, lp in zip(samples, trainer_side)]
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    verdict = gate.evaluate(trainer_side, rollout_side, batch.step, cfg.gate, cfg.dump_dir if rank0 else None,
                            sample_ids=[s.uid for s in samples], tokens=[s.tokens for s in samples],
                            metadata=None if batch.behaviour_version is None else
                            {"behaviour_version": batch.behaviour_version, "policy_version": policy_version})
    if verdict.message is not None and batch.behaviour_version is not None:  # which weights the gate ran under
        verdict = gate.Verdict(verdict.metrics, f"{verdict.message} (the batch was generated under weight version "
                               f"{batch.behaviour_version}; the gate computed under version {batch.behaviour_version}'s "
                               f"weights, the trainer is at version {policy_version})", verdict.dump_path)
    t = clock.lap("gate", t)
    halt = verdict.message is not None and cfg.gate.on_violation == "halt"

    # 4. Updates.
    grad_norms = []
    if halt:
        trainer.optimizer.zero_grad()
    else:
        grad_norms.append(trainer.optimizer_step())
        t = clock.lap("optimizer", t)
        for part in parts[1:]:
            _forward_backward(trainer, seqs, old, samples, part, cfg.loss, meter)
            t = clock.lap("forward_backward", t)
            grad_norms.append(trainer.optimizer_step())
            t = clock.lap("optimizer", t)
    if not halt:
        versions.advance()  # the live weights are the next version now
    losses = meter.reduce()
    losses["loss"] = losses["loss/pg_loss"]  # the whole objective: kl_coef is 0 (config.validate)
    if grad_norms:
        losses["grad_norm"] = sum(grad_norms) / len(grad_norms)
    if not rank0:
        return None
    parity = verdict.metrics.to_dict(prefix="train/") if verdict.metrics is not None else {}
    return StepReport(parity=parity, losses=losses, timings=clock.times, updated=not halt, verdict=verdict,
                      trainer_step=trainer.step, micro_batches=meter.micro_batches,
                      tokens=sum(len(s.tokens) for s in samples), policy_version=policy_version,
                      lr=trainer.last_lr if grad_norms else None)


def _forward_backward(trainer, seqs, olds, samples, part: list[int], loss_cfg: PolicyLossConfig,
                      meter: "_LossMeter") -> list[torch.Tensor]:
    """Forward + backward over the samples `part` (all DP ranks together; `olds`: every sample's old-policy
    log-probs); returns every sample's gate log-probs (float64, gathered from the ranks that hold them) in `part`'s
    order."""
    sub = [seqs[i] for i in part]
    n_tok = sum(s.num_scored for s in sub)
    denom = n_tok if loss_cfg.loss_agg == "token_mean" else len(sub)
    old = [olds[i] for i in part]
    adv = torch.tensor([samples[i].advantage for i in part], dtype=torch.float32)
    starts = [0]
    for s in sub:
        starts.append(starts[-1] + s.num_scored)
    gathered = torch.zeros(starts[-1], dtype=torch.float64, device=trainer.device)

    def loss_of(mb, out):
        flat, gate_flat = out
        lps = split_per_sample(flat, sub, mb.indices, trainer.compute_dtype)
        new = torch.cat([lp.float() for lp in lps])
        dev = new.device
        loss, metrics = policy_loss(new, torch.cat([old[i] for i in mb.indices]).to(dev), adv[mb.indices].to(dev),
                                    [sub[i].num_scored for i in mb.indices], loss_cfg, denominator=denom)
        for i, g in zip(mb.indices, gate_flat.split(mb.scored_sizes)):
            gathered[starts[i] : starts[i + 1]] = g.double()
        meter.add(metrics, sum(sub[i].num_scored for i in mb.indices))
        return loss

    meter.minibatches += 1
    trainer.backward_micro_batches(sub, loss_of)  # zeroes the gradients first
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(gathered)  # one owning rank per entry: exact
    return [gathered[starts[k] : starts[k + 1]].cpu() for k in range(len(sub))]


class _LossMeter:
    """Loss metrics of the micro-batches this rank owns, reduced over all ranks (non-owners add nothing)."""

    def __init__(self, device):
        self.device = device
        self.sums = dict.fromkeys(_SUMMED + _WEIGHTED, 0.0)
        self.present: set[str] = set()
        self.tokens = 0.0
        self.ratio_max, self.ratio_min = -math.inf, math.inf
        self.micro_batches = 0
        self.minibatches = 0  # optimizer updates' worth of forward/backward (the reported loss is their mean)

    def add(self, metrics: dict[str, float], tokens: int) -> None:
        self.micro_batches += 1
        self.tokens += tokens
        for k in _SUMMED:
            self.sums[k] += metrics.get(k, 0.0)
        for k in _WEIGHTED:
            if k in metrics:
                self.present.add(k)
                self.sums[k] += metrics[k] * tokens
        self.ratio_max = max(self.ratio_max, metrics.get("ratio_max", -math.inf))
        self.ratio_min = min(self.ratio_min, metrics.get("ratio_min", math.inf))

    def reduce(self) -> dict[str, float]:
        keys = list(_SUMMED + _WEIGHTED)
        owned = float(self.micro_batches > 0)
        sums = torch.tensor([self.sums[k] for k in keys] + [self.tokens, owned, float(len(self.present) > 0)]
                            + [float(k in self.present) for k in _WEIGHTED], dtype=torch.float64, device=self.device)
        extremes = torch.tensor([self.ratio_max, -self.ratio_min], dtype=torch.float64, device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
        vals = sums.tolist()
        tokens = vals[len(keys)] or 1.0
        present = dict(zip(_WEIGHTED, vals[len(keys) + 3:]))
        out = {f"loss/{k}": vals[i] / max(self.minibatches, 1) for i, k in enumerate(_SUMMED)}
        out.update({f"loss/{k}": vals[len(_SUMMED) + j] / tokens for j, k in enumerate(_WEIGHTED) if present[k] > 0})
        if math.isfinite(extremes[0].item()):
            out["loss/ratio_max"], out["loss/ratio_min"] = extremes[0].item(), -extremes[1].item()
        return out
