"""Checkpoints: everything a resumed run needs to be bitwise the run that never stopped.

`run_dir/checkpoints/step_NNNNNN/` holds
  trainer/             weights, optimizer, weight versions and each rank's RNG, torch DCP under global names, written
                       by every trainer rank together (so on a multi-node cluster run_dir must be on storage every
                       node sees) and loadable into another DP/TP/CP/PP layout (top_rl.run.dist_state,
                       top_rl.run.trainer_files; before format 3: one trainer_rankRRR.pt per rank, same layout only)
  driver.pt            the driver's RNG
  hf/                  the policy as a Hugging Face checkpoint (config.json, safetensors,
                       tokenizer), written by trainer rank 0: the exact weights the engines sample
                       with, so `top-rl-export` is a copy and needs neither the trainer nor its layout
  state.json           step, data position, wandb run id, resolved config, and the weight version the next step's
                       rollout is generated under (rollout.policy_lag > 0: a version before the trainer's, whose
                       copy the trainer shards hold; the data position is the one before that rollout, which a
                       resume generates again, with any after it, rather than storing them)
  metrics_tail.jsonl   the metrics.jsonl lines logged since the checkpoint before it, as written: a resume rewrites
                       a damaged row of a kept step from them (top_rl.observe.metrics_resume)
  manifest.json        size and SHA-256 of every file above (top_rl.run.manifest); written last
This module manages that directory and the loop fills it (top_rl.loop.save_checkpoint): `begin(run_dir, step)` makes
`step_NNNNNN.tmp/` (removing what an interrupted write left), the Writer names the paths the trainer ranks and the
task write into and writes the driver's files, `commit` writes the manifest, fsyncs and renames it complete, `prune`
keeps the newest `checkpoint.keep`; nothing here calls the cluster or the task. A crash mid-write leaves the previous
checkpoint as the latest; a full disk stops the run (top_rl.run.disk_full) with the partial one removed.
A checkpoint is trusted only once it verifies against its manifest (`load_verified`): resume takes the newest one that
does and names each one skipped (and the file that failed); the stop message and `top-rl-export` do the same. A
checkpoint holding what top-rl never writes (a pickle that would run code, a link, a file the manifest does not list,
an entry outside it: CheckpointUnsafe) stops the resume instead; whether this run's config may continue it is
top_rl.run.resume_compat's. Sampling seeds and data order are pure functions of (seed, step, position), so this is
the whole state.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from top_rl.run import manifest as checkpoint_manifest
from top_rl.run import disk_full, trainer_files
from top_rl.run.fault_injection import NO_FAULTS, FaultPlan
from top_rl.run.manifest import CheckpointInvalid, CheckpointUnsafe
from top_rl.run.resume_compat import ResumeRefused, check_compatible, state_refusal  # noqa: F401 - also checkpoint.*
from top_rl.tasks.base import DataPosition

STEP_PREFIX = "step_"
METRICS_TAIL = "metrics_tail.jsonl"
_STEP_DIR = re.compile(r"step_(\d+)")
FORMAT = 3  # 2: manifest.json (format 1 has none: loads unverified, with a note); 3: trainer/ (DCP, reshards)


@dataclass
class CheckpointConfig:
    every: int = 0  # save every K steps (0: only at the end of the run, or when a signal stops it)
    keep: int = 2  # newest complete checkpoints kept (>= 1)
    # false: the run writes no checkpoint, not even at its end or on a stop signal, so it cannot be resumed (a
    # benchmark whose 4B checkpoint would be ~56 GB of optimizer state it never reads)
    enabled: bool = True




def _dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_of(path: Path) -> int:
    return int(_STEP_DIR.fullmatch(Path(path).name).group(1))


def due(cfg: CheckpointConfig, done_steps: int, total_steps: int, stopping: bool = False) -> bool:
    """Whether the loop saves after `done_steps` steps: at the run's end, every `cfg.every` steps, and when a stop
    signal came (`stopping`); never with `cfg.enabled` false."""
    if not cfg.enabled:
        return False
    return stopping or done_steps == total_steps or (cfg.every > 0 and done_steps % cfg.every == 0)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a `.tmp` or `.old` directory never counts)."""
    root = _dir(run_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if _STEP_DIR.fullmatch(p.name) and (p / "state.json").is_file()]
    return sorted(done, key=step_of)


def latest(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


# ------------------------------------------------------------------------------------------- write
def _write(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        _fsync(p)
    _fsync(path)


def _scratch(root: Path) -> list[Path]:
    """What interrupted writes leave in checkpoints/: `step_N.tmp` and `step_N.old` (begin removes them)."""
    return [*root.glob(f"{STEP_PREFIX}*.tmp"), *root.glob(f"{STEP_PREFIX}*.old")]


def scratch_refusal(run_dir: Path) -> str | None:
    """A `step_N.tmp` / `.old` in run_dir's checkpoints/ that is not a directory (a link, a file): top-rl never
    writes one, and the checkpoint write that replaces it would fail after its step trained (pre-flight). Reads only."""
    root = _dir(run_dir)
    for path in sorted(_scratch(root)) if root.is_dir() else []:
        if path.is_symlink() or not path.is_dir():
            what = f"a symbolic link (to {os.readlink(path)})" if path.is_symlink() else "not a directory"
            return (f"{path} is {what}: top-rl writes only directories there (an unfinished checkpoint), and would "
                    f"fail replacing it after a step trained; remove {path} (nothing was written)")
    return None


def begin(run_dir: Path, step: int, faults: FaultPlan = NO_FAULTS) -> "Writer":
    """Start the step-`step` checkpoint: its `step_NNNNNN.tmp/` directory, created empty after removing what writes a
    crash interrupted left (one writer per run: the run lock). `faults`: the run plan's (test-only)."""
    root = _dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{STEP_PREFIX}{step:06d}"
    for leftover in _scratch(root):
        if leftover.is_symlink() or not leftover.is_dir():  # pre-flight refused one; planted since: the link goes,
            leftover.unlink(missing_ok=True)                # never what it points to
        else:
            shutil.rmtree(leftover, ignore_errors=True)
    writer = Writer(Path(run_dir), step, final, faults)
    writer.tmp.mkdir()
    return writer


class Writer:
    """One checkpoint being written (see module doc), into `tmp` until `commit` renames it complete. The loop fills
    it (top_rl.loop.save_checkpoint): the trainer ranks write their shards to `trainer_shard(rank)`, rank 0 and the
    task the HF policy and tokenizer into `hf_dir`, the driver its RNG (`write_driver_state`) and the run's state
    (`write_state`). Used as `with begin(...) as writer:`, a write into it that finds the disk full (this
    module's or another's) stops the run as DiskFull: the partial checkpoint removed, the last complete one kept."""

    def __init__(self, run_dir: Path, step: int, final: Path, faults: FaultPlan = NO_FAULTS):
        self.run_dir, self.step, self.final, self.faults = run_dir, step, final, faults
        self.tmp = final.with_name(final.name + ".tmp")

    @property
    def trainer_dir(self) -> str:
        """Where every trainer rank writes its part of the trainer state (absolute: an actor's cwd is not the
        driver's)."""
        return str((self.tmp / trainer_files.TRAINER_DIR).resolve())

    @property
    def hf_dir(self) -> str:
        """Where the policy goes as a Hugging Face checkpoint (trainer rank 0), with the task's tokenizer."""
        return str((self.tmp / "hf").resolve())

    def write_driver_state(self, rng_state: dict) -> None:
        """driver.pt: the driver's RNG (top_rl.run.rng.state())."""
        import torch  # here, not at import: the run config imports CheckpointConfig without loading torch

        from top_rl.run import safe_load

        def driver_state(f) -> None:
            self.faults.inject("enospc_in_checkpoint", self.step, path=f.name)
            torch.save({"rng": rng_state}, f)

        with self:
            _write(self.tmp / "driver.pt", driver_state)
            safe_load.check_saved(self.tmp / "driver.pt")
        self.faults.inject("kill_in_checkpoint", self.step)

    def write_state(self, position: DataPosition, run_id: str | None, config: dict, world: int,
                    metrics_rows: Sequence[str] = (), behaviour_version: int | None = None) -> None:
        """state.json (step, data position, wandb run id, resolved config, trainer world; rollout.policy_lag: the
        version the rollout in flight is generated under) and METRICS_TAIL, the metrics lines logged since the
        checkpoint before (Tracker.rows_since)."""
        state = {"format": FORMAT, "step": self.step, "position": position.state_dict(), "run_id": run_id,
                 "config": config, "world": world}
        if behaviour_version is not None:  # the rollout in flight: generated again on resume, under this version
            state["behaviour_version"] = behaviour_version
        with self:
            _write(self.tmp / METRICS_TAIL, lambda f: f.write("".join(line + "\n" for line in metrics_rows).encode()))
            _write(self.tmp / "state.json", lambda f: f.write(json.dumps(state, indent=2).encode()))

    def commit(self) -> Path:
        """The manifest (last: sizes and checksums of everything above), every file fsynced, then the atomic rename
        to `step_NNNNNN/`. Returns its path."""
        with self:
            checkpoint_manifest.write(self.tmp)
            _fsync_tree(self.tmp)
        old = self.final.with_name(self.final.name + ".old")
        if self.final.exists():  # should a step be saved twice: never be without one complete copy
            self.final.rename(old)
        os.replace(self.tmp, self.final)
        _fsync(self.final.parent)
        shutil.rmtree(old, ignore_errors=True)
        return self.final

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """A write that failed for lack of space stops the run (see class doc); any other failure propagates, the
        `.tmp` left for the next `begin` to remove."""
        if not isinstance(exc, Exception) or isinstance(exc, disk_full.DiskFull):
            return
        root = self.tmp.parent
        if not (disk_full.is_no_space(exc) or disk_full.free_space(root)[0] < disk_full.LOW_SPACE_BYTES):
            return
        shutil.rmtree(self.tmp, ignore_errors=True)  # the partial checkpoint: its space back, the last complete one kept
        last = latest(self.run_dir)
        took = f" (the last one, {last.name}, takes {disk_full.size_of(last)})" if last is not None else ""
        raise disk_full.stopped(root, f"writing the step-{self.step} checkpoint{took}",
                                resume_hint(self.run_dir)) from None


def prune(run_dir: Path, keep: int) -> None:
    """Remove all but the newest `keep` (>= 1: config.validate) complete checkpoints."""
    for stale in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)


# ------------------------------------------------------------------------------------------- resume
def load_verified(ckpt: Path, driver: bool = True) -> dict:
    """The checkpoint's state (state.json, plus driver.pt's content under "driver") once every file verifies
    against manifest.json. Raises CheckpointInvalid naming the bad file, CheckpointUnsafe for a file that would
    run code. `driver=False` (exports, resume hints) reads no pickle."""
    ckpt = Path(ckpt)
    if checkpoint_manifest.has_manifest(ckpt):
        checkpoint_manifest.verify(ckpt)
    else:  # an older checkpoint, unverifiable: still never read through a link or a special file
        checkpoint_manifest.files(ckpt)
    try:
        state = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))
        step, world = int(state["step"]), int(state["world"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CheckpointInvalid(ckpt, "state.json", f"unreadable ({type(e).__name__}: {e})") from None
    if not checkpoint_manifest.has_manifest(ckpt) and state.get("format", 1) != 1:
        raise CheckpointInvalid(ckpt, checkpoint_manifest.NAME, "missing: the checkpoint cannot be verified")
    if step != step_of(ckpt):
        raise CheckpointInvalid(ckpt, "state.json", f"says step {step}, the directory name says {step_of(ckpt)}")
    trainer_files.check(ckpt, state, world, load=driver)  # a resume loads them: read without running code
    if driver:  # (exports and resume hints read only state.json and hf/)
        from top_rl.run import safe_load

        try:
            state["driver"] = safe_load.load(ckpt / "driver.pt")
            state["driver"]["rng"]
        except Exception as e:  # noqa: BLE001 - any unpickling failure: name the file, never a traceback
            raise CheckpointInvalid(ckpt, "driver.pt", f"unreadable ({type(e).__name__}: {e})") from None
        from top_rl.run import rng

        why = rng.refusal(state["driver"]["rng"])  # restored only after Ray started: checked here, before it
        if why:
            raise CheckpointInvalid(ckpt, "driver.pt", f"its RNG state cannot be restored ({why})")
    return state


def newest_verified(run_dir: Path, driver: bool = True) -> tuple[Path | None, dict | None, list[CheckpointInvalid]]:
    """The newest complete checkpoint that verifies, its state, and the newer ones that failed (newest first)."""
    failed: list[CheckpointInvalid] = []
    for ckpt in reversed(complete_checkpoints(run_dir)):
        try:
            return ckpt, load_verified(ckpt, driver), failed
        except CheckpointInvalid as e:
            failed.append(e)
    return None, None, failed


def describe_failed(failed: list[CheckpointInvalid]) -> str:
    return "".join(f"\n  {e.ckpt.name} fails verification, skipped: {'' if e.file == '.' else e.file + ': '}{e.why}"
                   for e in failed)


def prepare(run_dir: Path, cfg) -> dict | None:
    """The state to resume from (config-checked; shard paths for the ranks), or None for a fresh run. A fresh run
    refuses a run_dir that already holds checkpoints: it would overwrite them. Reads only: nothing is written."""
    if not cfg.resume:
        found = latest(run_dir)
        if found is not None:
            raise ResumeRefused(
                f"{run_dir} already holds checkpoints (latest: {found.name}); a fresh run there would "
                "overwrite them. Continue it with resume=true, or start elsewhere with run_dir=<new dir>.")
        earlier = _earlier_rows(Path(run_dir) / "metrics.jsonl")
        if earlier:  # a run that wrote no checkpoint (checkpoint.enabled=false, stopped before its first)
            raise ResumeRefused(
                f"{Path(run_dir) / 'metrics.jsonl'} holds {earlier} of an earlier run that wrote no checkpoint; a "
                "fresh run there would replace them, and resume=true has no checkpoint to continue from. Start "
                "elsewhere with run_dir=<new dir>, or move that metrics.jsonl aside to start again here.")
        return None
    found, state, failed = newest_verified(run_dir)
    unsafe = [e for e in failed if isinstance(e, CheckpointUnsafe)]
    if unsafe:
        raise ResumeRefused("resume refused: " + "; ".join(str(e) for e in unsafe) + ". Nothing was loaded. Find out "
                            "where that checkpoint came from; move it aside to resume from an earlier one.")
    if found is None and failed:
        raise ResumeRefused(f"resume refused: no checkpoint in {run_dir} verifies:{describe_failed(failed)}\n"
                            "Restore them from a copy, or move them aside to start again from step 0.")
    if found is None:  # starting over would replace metrics.jsonl and the wandb run: the user did not ask for that
        raise ResumeRefused(f"resume refused: {run_dir} has no complete checkpoint to resume from (looked in "
                            f"{_dir(run_dir)}); nothing was changed. Drop resume=true to start a new run there")
    if failed:
        print(f"[top-rl] checkpoints that fail verification:{describe_failed(failed)}\n"
              f"[top-rl] resuming from {found.name}, the newest checkpoint that verifies", flush=True)
    if not checkpoint_manifest.has_manifest(found):
        print(f"[top-rl] {found} has no manifest.json (written by an older top-rl): resuming without verifying it",
              flush=True)
    inconsistent = state_refusal(found, state)
    if inconsistent:
        raise ResumeRefused(f"resume refused: {inconsistent}. The checkpoint verifies but contradicts itself (edited "
                            "after it was written?); restore it from a copy, or move it aside to resume from an "
                            "earlier one.")
    check_compatible(state["config"], cfg.as_dict(), cfg.resume_allow_changes)
    saved_layout = {k: state["config"]["trainer"].get(k, 1) for k in trainer_files.LAYOUT}
    # Paths, not tensors: what each rank of this run loads (a layout change only reaches here under allow_changes)
    state["trainer"] = trainer_files.paths(found, state, saved_layout,
                                           {k: getattr(cfg.trainer, k) for k in trainer_files.LAYOUT})
    state["path"] = str(found)
    print(f"[top-rl] resuming from {found} (step {state['step']})", flush=True)
    return state


def _earlier_rows(metrics: Path) -> str | None:
    """The rows an earlier run left in `metrics` ("4 rows (steps 1-4)"), or None when it holds none. Reads only."""
    try:
        lines = [line for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except (FileNotFoundError, IsADirectoryError):
        return None
    steps = []
    for line in lines:
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            pass  # a torn or foreign row: counted, not named
    span = f" (steps {min(steps)}-{max(steps)})" if steps else ""
    return f"{len(lines)} row{'s' if len(lines) != 1 else ''}{span}" if lines else None


def saved_metrics(state: dict | None) -> list[str]:
    """The metrics lines the resumed checkpoint keeps (METRICS_TAIL, verified with the rest of it; none from a
    checkpoint written before checkpoints kept them)."""
    path = Path(state["path"]) / METRICS_TAIL if state else None
    return path.read_text(encoding="utf-8").splitlines() if path is not None and path.is_file() else []


def resume_point(state: dict | None) -> tuple[int, DataPosition]:
    if state is None:
        return 0, DataPosition()
    return state["step"], DataPosition.from_state_dict(state["position"])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resume_hint(run_dir: Path) -> str:
    """How to resume: the newest checkpoint that verifies against its manifest (never one that fails)."""
    try:
        latest, _, failed = newest_verified(run_dir, driver=False)
    except Exception as e:  # noqa: BLE001 - the stop message must never fail itself
        return f"(the checkpoints in {run_dir} could not be checked: {e})"
    skipped = describe_failed(failed)
    if latest is None:
        return f"{run_dir} has no complete checkpoint{' that verifies' if failed else ''} yet: a new run starts " \
               f"from step 0 (in another run_dir=, or here once metrics.jsonl is moved aside: a fresh run never " \
               f"replaces the rows kept).{skipped}"
    from_cli = Path(sys.argv[0]).name in ("top-rl", "cli.py")  # the same overrides, plus resume=true
    args = [a for a in sys.argv[1:] if not a.startswith(("resume=", "+resume="))] if from_cli else []
    if not any(a.startswith("run_dir=") for a in args):
        args.insert(0, f"run_dir={run_dir}")
    cmd = shlex.join(["top-rl", *args, "resume=true"]) + ("" if from_cli else "  (with the run's other overrides)")
    which = "Last complete checkpoint that verifies" if failed else "Last complete checkpoint"
    return f"{which}: {latest} (step {step_of(latest)}).{skipped}{chr(10) if skipped else ' '}Resume " \
           f"with:\n  {cmd}"
