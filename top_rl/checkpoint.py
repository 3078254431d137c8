"""Checkpoints: everything a resumed run needs to be bitwise the run that never stopped.

`run_dir/checkpoints/step_NNNNNN/` holds the driver state (step, data position, wandb run id, resolved
config, RNG) and one trainer shard per rank (weights + optimizer). A checkpoint is written into a
`.tmp` directory and renamed when complete, so a crash mid-write leaves the previous one as the latest.
Sampling seeds and data order are pure functions of (seed, step, position), so this is the whole state.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from top_rl.tasks.base import DataPosition

STEP_PREFIX = "step_"
# Keys a resume may change freely: they do not enter any computed number.
RESUME_FREE_KEYS = {"steps", "run_dir", "resume", "dry_run", "checkpoint", "tracking", "cluster"}


@dataclass
class CheckpointConfig:
    every: int = 0  # save every K steps (0: only at the end of the run)
    keep: int = 2  # newest complete checkpoints kept


class ResumeRefused(ValueError):
    pass


def _dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def due(cfg: CheckpointConfig, done_steps: int, total_steps: int) -> bool:
    return done_steps == total_steps or (cfg.every > 0 and done_steps % cfg.every == 0)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    root = _dir(run_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(STEP_PREFIX) and p.is_dir() and (p / "state.json").is_file()]
    return sorted(done, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def save(run_dir: Path, cfg, step: int, position: DataPosition, cluster, run_id: str | None) -> Path:
    root = _dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{STEP_PREFIX}{step:06d}"
    tmp = root / f"{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for rank, shard in enumerate(cluster.trainer_states()):
        torch.save(shard, tmp / f"trainer_rank{rank:03d}.pt")
    state = {"step": step, "position": position.state_dict(), "run_id": run_id, "config": cfg.as_dict(),
             "world": len(cluster.trainers)}
    (tmp / "state.json").write_text(json.dumps(state, indent=2))  # written last: marks the shard set complete
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in complete_checkpoints(run_dir)[: -cfg.checkpoint.keep or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(run_dir: Path) -> dict | None:
    found = complete_checkpoints(run_dir)
    if not found:
        return None
    path = found[-1]
    state = json.loads((path / "state.json").read_text())
    state["trainer"] = [torch.load(path / f"trainer_rank{r:03d}.pt", weights_only=False) for r in range(state["world"])]
    state["path"] = str(path)
    return state


def check_compatible(saved: dict, current: dict, allow_changes: bool) -> list[str]:
    """Config keys that differ between the checkpoint and this run (outside RESUME_FREE_KEYS)."""
    diffs: list[str] = []

    def walk(a, b, prefix):
        for k in sorted(set(a) | set(b)):
            key = f"{prefix}{k}"
            if not prefix and k in RESUME_FREE_KEYS:
                continue
            va, vb = a.get(k, "<absent>"), b.get(k, "<absent>")
            if isinstance(va, dict) and isinstance(vb, dict):
                walk(va, vb, key + ".")
            elif va != vb:
                diffs.append(f"{key}: checkpoint {va!r} -> now {vb!r}")

    walk(saved, current, "")
    if diffs and not allow_changes:
        raise ResumeRefused(
            "resume refused: these settings differ from the checkpoint and would break determinism:\n  "
            + "\n  ".join(diffs) + "\nRestore them, or pass resume_allow_changes=true to resume anyway."
        )
    return diffs


def resume_point(state: dict | None) -> tuple[int, DataPosition]:
    if state is None:
        return 0, DataPosition()
    return state["step"], DataPosition.from_state_dict(state["position"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
