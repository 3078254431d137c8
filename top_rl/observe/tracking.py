"""Metrics out of the run: ``run_dir/metrics.jsonl`` (the record tests and users read), wandb
(offline unless an API key or the config says online) and one console line per step."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from top_rl.atomic import write_file
from top_rl.observe import metrics_resume
from top_rl.observe import samples as saved_samples
from top_rl.config.tracking import TrackingConfig, WandbMode  # noqa: F401 - also tracking.TrackingConfig

log = logging.getLogger(__name__)

# The keys docs/architecture.md promises in every row (tests/entry/test_loop_e2e.py checks the loop writes them).
REQUIRED_KEYS = ("step", "train/train_rollout_logprob_abs_diff", "train/ess_ratio",
                 "train/train_rollout_kl", "rollout/reward_mean", "perf/step_time")
# Rows a checkpoint keeps a copy of (those since the checkpoint before it, at most this many: the newest).
CHECKPOINT_ROWS = 1000


def resolve_wandb_mode(mode: str) -> str:
    """"auto": $WANDB_MODE if set, else online with $WANDB_API_KEY, else offline (never fail a run
    for lack of credentials)."""
    mode = WandbMode(mode)  # refuses anything else, naming the choices
    if mode != WandbMode.auto:
        return mode.value
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def _plain(v: Any) -> Any:
    # tensors / numpy scalars -> python numbers; NaN stays NaN (json writes NaN, never 0)
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        return v.item()
    return v


def _config_dict(config: Any) -> dict:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    if isinstance(config, dict):
        return config
    from omegaconf import OmegaConf  # a Hydra DictConfig
    return OmegaConf.to_container(config, resolve=True)


def _fmt(v: Any, exact: bool = False) -> str:
    if isinstance(v, float):
        # parity numbers print exactly: "1.0" must not hide 0.99999994 behind rounding
        if exact or v == 0.0 or not math.isfinite(v):
            return repr(v)
        return f"{v:.4g}"
    return str(v)


SAMPLE_COLUMNS = ("group", "prompt", "response", "reward")


def sample_table_rows(sample_rows: Sequence[dict], n: int) -> list[list]:
    """The rows of a step's wandb samples table: the first `n` rows of its samples file (top_rl.observe.samples),
    the columns SAMPLE_COLUMNS. A few, not the file: wandb stores every step's table as a separate file."""
    return [[r[c] for c in SAMPLE_COLUMNS] for r in list(sample_rows)[:max(n, 0)]]


class Tracker:
    """``log(step, metrics)`` once per step. Resume: pass the checkpoint's ``resume_from_step``
    and wandb ``run_id``; rows after that step (from the crashed attempt) are dropped so the
    JSONL never holds a step twice, and a damaged row of a kept step is rewritten from the checkpoint's
    copy (``checkpoint_rows``; top_rl.observe.metrics_resume). Without ``resume_from_step`` an existing JSONL is
    replaced.

    wandb on resume (top_rl.observe.wandb_history): the rows metrics.jsonl keeps that wandb never recorded
    (a crash loses wandb's buffered tail) are logged again from the JSONL, and steps wandb already
    holds (logged past the checkpoint, then replayed) are not sent twice: the wandb run ends up with
    every step exactly once."""

    def __init__(self, run_dir: str, cfg: TrackingConfig = TrackingConfig(), config: Any = None,
                 run_id: str | None = None, resume_from_step: int | None = None,
                 checkpoint_rows: Sequence[str] = (), checkpoint_name: str = "the checkpoint"):
        """`checkpoint_rows`: on resume, the checkpoint's copy of its latest rows (`rows_since`), which repair a
        damaged row of a kept step (top_rl.observe.metrics_resume)."""
        self.cfg, self.run_dir = cfg, run_dir
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._recent: deque[tuple[int, str]] = deque(maxlen=CHECKPOINT_ROWS)  # (step, line) as written
        self.last_step = self._prepare_jsonl(resume_from_step, checkpoint_rows, checkpoint_name)
        self._f = open(self.path, "a", encoding="utf-8")
        self.mode = resolve_wandb_mode(cfg.wandb_mode)
        self.run = None
        self.run_id = run_id
        if self.mode != "disabled":
            import wandb
            self.run = wandb.init(project=cfg.project, entity=cfg.entity, name=cfg.run_name,
                                  dir=run_dir, id=run_id, resume="allow", mode=self.mode,
                                  config=_config_dict(config))
            self.run_id = self.run.id  # the checkpoint stores it so a resume continues this run
            # every key is plotted against our step, also after a resume
            self.run.define_metric("step")
            self.run.define_metric("*", step_metric="step")
        self._wandb_has: set[int] = set()  # steps this wandb run recorded before this attempt
        if self.run is not None and resume_from_step is not None:
            self._restore_wandb_history()

    def _restore_wandb_history(self) -> None:
        from top_rl.observe import wandb_history

        if self.mode == "offline":
            this = Path(self.run.dir).parent / f"run-{self.run_id}.wandb"
            self._wandb_has = wandb_history.recorded_steps(self.run_dir, self.run_id, exclude=this)
        else:  # the server's step counter: wandb holds every step below it
            self._wandb_has = set(range(int(self.run.starting_step or 0)))
        lost = [row for row in self._jsonl_rows() if row["step"] not in self._wandb_has]
        for row in lost:  # with the step's table where its samples file is on disk (kept steps keep their files)
            saved = saved_samples.path(self.run_dir, int(row["step"]))
            self._log_wandb(row, saved_samples.read(saved) if saved.is_file() else ())
        if lost:
            print(f"[top-rl] wandb: restored {len(lost)} rows (steps {lost[0]['step']}..{lost[-1]['step']}) from "
                  "metrics.jsonl that the interrupted attempt logged but wandb had not recorded", flush=True)

    def _jsonl_rows(self) -> list[dict]:
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def _prepare_jsonl(self, resume_from_step: int | None, checkpoint_rows: Sequence[str], checkpoint_name: str
                       ) -> int | None:
        lines: list[str] = []
        if resume_from_step is not None:
            lines, note = metrics_resume.resumed_lines(Path(self.path), resume_from_step, checkpoint_rows,
                                                       checkpoint_name)
            if note:
                print(f"top-rl: {note}", file=sys.stderr, flush=True)
        elif os.path.exists(self.path):
            log.warning("fresh run: replacing %s", self.path)
        write_file(self.path, lambda tmp: Path(tmp).write_text("".join(lines), encoding="utf-8"))
        self._recent.extend((metrics_resume.step_of(line), line.rstrip("\n")) for line in lines)
        return metrics_resume.step_of(lines[-1]) if lines else None

    def rows_since(self, step: int) -> list[str]:
        """The lines logged after `step` (at most CHECKPOINT_ROWS, the newest), as written: what a checkpoint keeps."""
        return [line for s, line in self._recent if s > step]

    def _log_wandb(self, row: dict[str, Any], sample_rows: Sequence[dict]) -> None:
        table = sample_table_rows(sample_rows, self.cfg.wandb_samples)
        if table:  # in the step's own history record, so a resume's "step already in wandb" skips it too
            import wandb
            row = {**row, "samples": wandb.Table(columns=list(SAMPLE_COLUMNS), data=table)}
        self.run.log(row, step=int(row["step"]))

    def log(self, step: int, metrics: dict[str, Any], samples: Sequence[dict] = ()) -> None:
        """`samples`: the step's saved generations (top_rl.observe.samples.rows), of which the first
        cfg.wandb_samples go to wandb as a table; never into metrics.jsonl (the samples file holds them)."""
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} already logged (last {self.last_step})")
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items() if k != "step"}}
        line = json.dumps(row)
        self._f.write(line + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())  # the JSONL is the run's record: survive a crash right after
        self.last_step = int(step)
        self._recent.append((int(step), line))
        if self.run is not None and int(step) not in self._wandb_has:
            self._log_wandb(row, samples)
        if self.cfg.console:
            print(self.console_line(row), flush=True)

    @staticmethod
    def console_line(row: dict[str, Any]) -> str:
        parts = [f"step {row['step']}"]
        for key, label, exact in (("rollout/reward_mean", "reward", False),
                                  ("train/train_rollout_logprob_abs_diff", "abs_diff", True),
                                  ("train/ess_ratio", "ess", True), ("train/train_rollout_kl", "kl", False),
                                  ("rollout/response_len_mean", "len", False),
                                  ("rollout/truncated_frac", "truncated", False)):
            if key in row:
                parts.append(f"{label} {_fmt(row[key], exact)}")
        if "train/policy_lag" in row:  # rollout.policy_lag: how far behind the trainer the batch's weights were
            parts.append(f"lag {row['train/policy_lag']} (v{row.get('train/behaviour_version')})")
        times = [f"{k[5:-5]} {row[k]:.2f}s" for k in row
                 if k.startswith("perf/") and k.endswith("_time") and isinstance(row[k], (int, float))]
        if isinstance(row.get("perf/overlap_s"), (int, float)):  # the rollout time hidden behind training
            times.append(f"overlap {row['perf/overlap_s']:.2f}s")
        if isinstance(row.get("perf/rollout_tokens_per_s"), (int, float)):
            times.append(f"{row['perf/rollout_tokens_per_s']:.0f} tok/s")
        return " | ".join(parts + times)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
        if self.run is not None:
            self.run.finish()
            self.run = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
            return
        try:  # the run is already failing (a full disk, a dead actor): closing must not replace its error
            self.close()
        except Exception as e:  # noqa: BLE001
            try:
                print(f"[top-rl] could not close the run's tracking ({type(e).__name__}: {e})", flush=True)
            except OSError:
                pass
