"""The TOP parity gate: refuse to train on a step whose trainer log-probs are not bitwise the
rollout's. On violation the offending batch is dumped (torch.save) so the parity probe can replay it.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch

from top_rl.atomic import write_file
from top_rl.config.algo import GateConfig, OnViolation
from top_rl.rl.metrics import ParityMetrics, parity_metrics

log = logging.getLogger(__name__)


class ParityViolation(RuntimeError):
    def __init__(self, message: str, step: int, metrics: ParityMetrics | None, dump_path: str):
        super().__init__(message)
        self.step, self.metrics, self.dump_path = step, metrics, dump_path


def _describe(step: int, m: ParityMetrics | None, error: str | None,
              sample_ids: Sequence[Any] | None, dump_path: str) -> str:
    head = f"TOP parity violation at step {step}"
    if error is not None:
        return f"{head}: {error}; dump: {dump_path}"
    assert m is not None
    fd = m.first_diff
    if fd is not None:
        sid = f" (id {sample_ids[fd.sample]})" if sample_ids is not None else ""
        # repr() of a python float round-trips exactly, so the printed values are the real ones.
        where = (f"first differing sample {fd.sample}{sid}, token position {fd.position}: "
                 f"trainer={fd.trainer!r} rollout={fd.rollout!r}")
    else:
        where = "every token equal, yet the metrics are not exactly 0 and 1"
    return (f"{head}: {where}; abs_diff={m.abs_diff!r} (max {m.abs_diff_max!r}), "
            f"ess_ratio={m.ess_ratio!r}, "
            f"train_rollout_kl={m.kl!r}, non-finite tokens={m.n_nonfinite}; dump: {dump_path}")


def _dump(dump_dir: str, step: int, payload: dict[str, Any]) -> str:
    os.makedirs(dump_dir, exist_ok=True)
    path = os.path.join(dump_dir, f"parity_violation_step{step:06d}.pt")
    return str(write_file(path, lambda tmp: torch.save(payload, tmp)))  # never seen half-written


@dataclass
class Verdict:
    metrics: ParityMetrics | None  # None only when a length mismatch made them uncomputable
    message: str | None  # the violation report; None when TOP holds (or the gate is off)
    dump_path: str | None


def evaluate(
    trainer: Sequence[torch.Tensor],
    rollout: Sequence[torch.Tensor],
    step: int,
    cfg: GateConfig = GateConfig(),
    dump_dir: str | None = ".",
    sample_ids: Sequence[Any] | None = None,
    tokens: Sequence[Sequence[int] | torch.Tensor] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Verdict:
    """The parity metrics of one step and TOP's verdict, without acting on it.

    ``trainer`` / ``rollout``: one 1-D tensor of response log-probs per sample (same lengths).
    ``tokens`` / ``sample_ids`` / ``metadata`` only go into the dump (and the message). ``dump_dir`` None:
    no dump (every trainer rank evaluates the gate; one writes the dump).

    Violation: abs_diff != 0, ess_ratio != 1, any non-finite value, any unequal token, or a length
    mismatch between the two sides.
    """
    if cfg.on_violation not in set(OnViolation):
        raise ValueError(f"on_violation must be 'halt' or 'warn', got {cfg.on_violation!r}")
    error = None
    try:
        m = parity_metrics(trainer, rollout)
    except ValueError as e:  # misaligned batch: an alignment bug, still a parity failure
        if not cfg.enabled:
            raise
        m, error = None, str(e)
    if not cfg.enabled or (m is not None and not m.violation):
        return Verdict(m, None, None)

    def _cpu(ts):
        return None if ts is None else [torch.as_tensor(t).detach().cpu() for t in ts]

    path = None
    if dump_dir is not None:
        path = _dump(dump_dir, step, {
            "step": step,
            "sample_ids": list(sample_ids) if sample_ids is not None else None,
            "tokens": _cpu(tokens),
            "trainer_logprobs": _cpu(trainer),
            "rollout_logprobs": _cpu(rollout),
            "metrics": None if m is None else {**m.to_dict(), "first_diff": (
                asdict(m.first_diff) if m.first_diff else None)},
            "error": error,
            "metadata": metadata or {},
        })
    return Verdict(m, _describe(step, m, error, sample_ids, path or "(not written by this rank)"), path)


def check(trainer, rollout, step, cfg: GateConfig = GateConfig(), dump_dir: str = ".", sample_ids=None,
          tokens=None, metadata=None) -> ParityMetrics | None:
    """`evaluate`, then act: under "halt" a violation raises ParityViolation, under "warn" it is logged.
    Returns the metrics (None only when a length mismatch made them uncomputable and on_violation is "warn")."""
    v = evaluate(trainer, rollout, step, cfg, dump_dir, sample_ids, tokens, metadata)
    if v.message is not None:
        act(v, step, cfg)
    return v.metrics


def act(v: Verdict, step: int, cfg: GateConfig) -> None:
    """What a violation does: raise under "halt", warn under "warn"."""
    if cfg.on_violation == OnViolation.halt:
        raise ParityViolation(v.message, step, v.metrics, v.dump_path or "")
    log.warning(v.message)
    warnings.warn(v.message, RuntimeWarning, stacklevel=3)
