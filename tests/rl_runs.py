"""Runs of the `top-rl` CLI for the resume / fault / export / bad-input tests (issue 5).

Every run is a subprocess in its own session, so a run killed on purpose (TOP_RL_FAULT) cannot leave
Ray helper processes behind: `run` kills the session's process group when the driver is gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# Small and quick, with a reward signal from the first step (leading_number) so weights really move, and
# a 6-prompt dataset so a 6-step run crosses epoch boundaries (4 prompts per step). Everything the numbers
# depend on is pinned here, so retuning the shipped defaults does not change what these tests check.
BASE = ["rollout.prompts_per_step=4", "rollout.n_samples=8", "rollout.max_new_tokens=3", "rollout.temperature=1.0",
        "task.max_operand=4", "task.reward_mode=leading_number", "task.num_prompts=6", "trainer.lr=0.01",
        "cluster.torch_threads=1", "checkpoint.every=1", "checkpoint.keep=3"]
STEPS = 6


def start(run_dir: Path, *overrides: str, fault: str | None = None, wandb: str = "disabled",
          ignore_sigint: bool = False) -> subprocess.Popen:
    """`ignore_sigint`: start it as a shell starts a background job (SIGINT ignored, inherited)."""
    env = {**os.environ, "WANDB_MODE": wandb, "WANDB_SILENT": "true", "RAY_DEDUP_LOGS": "0"}
    env.pop("TOP_RL_FAULT", None)
    if fault:
        env["TOP_RL_FAULT"] = fault
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    return subprocess.Popen([sys.executable, "-m", "top_rl.cli", f"run_dir={run_dir}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=ignore)


def finish(proc: subprocess.Popen, timeout: float = 400) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:  # whatever the killed driver's Ray left in its session
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run(run_dir: Path, *overrides: str, fault: str | None = None, wandb: str = "disabled",
        timeout: float = 400) -> subprocess.CompletedProcess:
    return finish(start(run_dir, *overrides, fault=fault, wandb=wandb), timeout)


def rows(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rows_so_far(run_dir: Path) -> list[dict]:  # while a run writes: a half-written last line is skipped
    path = Path(run_dir) / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def without_timing(rs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rs]


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(str(k).encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _feed(h, x)
    elif hasattr(obj, "tobytes"):  # numpy arrays in RNG states
        h.update(obj.tobytes())
    else:
        h.update(repr(obj).encode())


def state_hash(ckpt: Path) -> str:
    """Hash of a checkpoint's trainer state (every DCP entry read whole: weights, optimizer, snapshots; the step and
    versions; each rank's RNG), driver RNG and HF weights."""
    from top_rl.run import dist_state

    h = hashlib.sha256()
    for key, t in sorted(dist_state.read_full(ckpt / "trainer").items()):
        h.update(key.encode())
        _feed(h, t)
    for f in sorted((ckpt / "trainer").glob("*.json")):
        h.update(f.name.encode() + f.read_bytes())
    _feed(h, torch.load(ckpt / "driver.pt", weights_only=False))
    h.update((ckpt / "hf" / "model.safetensors").read_bytes())
    return h.hexdigest()


def tree_hash(path: Path) -> str:
    """Hash of every file under path (names and bytes): 'nothing saved was lost or changed'."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


_straight: dict[tuple[str, ...], Path] = {}


def straight(*overrides: str) -> Path:
    """The uninterrupted STEPS-step run of BASE and `overrides` (computed once per test session for each, shared by the
    test modules)."""
    if overrides not in _straight:
        d = Path(tempfile.mkdtemp(prefix="top_rl_straight_" if overrides else "top_rl_baseline_"))
        out = run(d, *BASE, *overrides, f"steps={STEPS}")
        assert out.returncode == 0, out.stderr[-4000:]
        _straight[overrides] = d
    return _straight[overrides]


def baseline() -> Path:
    """The uninterrupted 6-step run of BASE (the synchronous loop)."""
    return straight()


def assert_lagged_steps(got: list[dict], lags: list[int], versions: list[int]) -> None:
    """The rows of a rollout.policy_lag run: every step, each gated bit for bit (Δ = 0, ESS 1) under the version that
    sampled it (`versions`, trained `lags` behind), each lagged batch with its behaviour forward; its first batch is
    the synchronous run's (version 1 either way) and later ones are not (they come from older weights)."""
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), [r["step"] for r in got]
    for r in got:
        assert r["train/train_rollout_logprob_abs_diff"] == 0.0 and r["train/ess_ratio"] == 1.0, r
    assert [r["train/policy_lag"] for r in got] == lags, [r["train/policy_lag"] for r in got]
    assert [r["train/behaviour_version"] for r in got] == versions, [r["train/behaviour_version"] for r in got]
    assert all(r["perf/trainer/behaviour_forward_s"] > 0 for r in got[1:]), "a lagged batch with no behaviour forward"
    sync = rows(baseline())
    first = without_timing(sync)[0] | {"train/policy_lag": 0, "train/behaviour_version": 1}
    assert without_timing(got)[0] == first, (without_timing(got)[0], first)
    assert [r["rollout/reward_mean"] for r in got[2:]] != [r["rollout/reward_mean"] for r in sync[2:]], \
        "the lagged run's later batches are the synchronous run's: the lag did nothing"


def kill_and_resume(run_dir: Path, *overrides: str, kill_after: int = 3) -> tuple[dict, subprocess.CompletedProcess]:
    """Run BASE and `overrides` for STEPS steps SIGKILLed after step `kill_after` (its rows and newest checkpoint
    end there), then resume it to the end: (what that checkpoint holds, checkpoint.load_verified; the resumed run, which
    succeeded)."""
    from top_rl.run import checkpoint

    killed = run(run_dir, *BASE, *overrides, f"steps={STEPS}", fault=f"kill_after_step:{kill_after}")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [r["step"] for r in rows(run_dir)] == list(range(1, kill_after + 1)), rows(run_dir)
    ckpt = checkpoint.latest(run_dir)
    assert checkpoint.step_of(ckpt) == kill_after, ckpt
    saved = checkpoint.load_verified(ckpt)
    resumed = run(run_dir, *BASE, *overrides, f"steps={STEPS}", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return saved, resumed


def assert_bitwise_the_straight_run(run_dir: Path, straight_dir: Path) -> None:
    """A resumed run's every step once and its rows (but timings) and final checkpoint bit for bit the straight run's."""
    got, ref = rows(run_dir), rows(straight_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), [r["step"] for r in got]
    assert without_timing(got) == without_timing(ref), "the resumed run's rows differ from the straight run's"
    assert state_hash(final_checkpoint(run_dir)) == state_hash(final_checkpoint(straight_dir)), \
        "the resumed run's final checkpoint differs from the straight run's"


def fake_run(run_dir: Path, steps: tuple[int, ...] = (2,)) -> Path:
    """A run_dir with a checkpoint per step that verifies (tiny stand-in files, a real manifest), metrics and a wandb
    dir, for tests of what reads checkpoints without loading them (export, verification); the last checkpoint."""
    from top_rl.run import manifest as checkpoint_manifest

    for step in steps:
        ckpt = Path(run_dir) / "checkpoints" / f"step_{step:06d}"
        (ckpt / "hf").mkdir(parents=True)
        (ckpt / "state.json").write_text(json.dumps({"format": 2, "step": step, "world": 1, "config": {"top": {}}}))
        (ckpt / "trainer_rank000.pt").write_bytes(b"weights")
        (ckpt / "driver.pt").write_bytes(b"rng")
        (ckpt / "hf" / "config.json").write_text("{}")
        (ckpt / "hf" / "model.safetensors").write_bytes(b"tensors %d" % step)
        checkpoint_manifest.write(ckpt)
    (Path(run_dir) / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, max(steps) + 1)))
    (Path(run_dir) / "wandb").mkdir()
    (Path(run_dir) / "wandb" / "run.wandb").write_bytes(b"history")
    return ckpt


def manifest_through_links(ckpt: Path, extra: dict[str, Path] | None = None) -> None:
    """What an attacker writes: a manifest listing every name under the checkpoint (links followed) and `extra`
    names with the size and SHA-256 of the file each points at."""
    names = {os.path.relpath(os.path.join(d, f), ckpt): Path(d) / f
             for d, _, fs in os.walk(ckpt, followlinks=True) for f in fs if f != "manifest.json"}
    names.update(extra or {})
    files = {n: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for n, p in names.items()}
    (ckpt / "manifest.json").write_text(json.dumps({"format": 1, "algorithm": "sha256", "files": files}))


def final_checkpoint(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{STEPS:06d}"


def wait_for_row(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    t_end = time.time() + timeout
    while time.time() < t_end:
        if any(r["step"] >= step for r in _rows_so_far(run_dir)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"run exited ({proc.returncode}) before step {step}")
        time.sleep(0.2)
    raise AssertionError(f"no step {step} within {timeout}s")

