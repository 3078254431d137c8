"""Issue 24: a full disk while checkpointing kept the last good checkpoint but printed ~30k stderr lines (wandb's
console capture and its log handler failing on run_dir, in a loop) and no `top-rl:` line. Now the run stops
with one line naming the path and the free space, the partial checkpoint removed and the last one intact.

Three ways to fill the disk: ENOSPC injected into the driver's checkpoint write (in-process), into a trainer
actor's shard write (TOP_RL_FAULT, a real run), and a real full filesystem (a tiny tmpfs; needs root to
mount one, skipped otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests import rl_runs
from tests.rl_runs import BASE, STEPS

from top_rl import loop
from top_rl.run import checkpoint
from top_rl.run import manifest as checkpoint_manifest
from top_rl.run import disk_full
from top_rl.run import faults
from top_rl.run.fault_injection import NO_FAULTS, FaultPlan
from top_rl.tasks import ArithTask, DataPosition


class _StandInCluster:
    """Test double for the Ray cluster in `loop.save_checkpoint`: writes small stand-in files where ranks would."""

    trainers = [None]

    def save_trainer_states(self, paths):
        from tests.run.test_checkpoint_writer import trainer_stand_in

        for p in set(paths):  # every rank writes into the checkpoint's trainer/ (format 3: top_rl.run.dist_state)
            trainer_stand_in(p, world=len(paths))

    def save_hf(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"weights")


class _Cfg:
    checkpoint = checkpoint.CheckpointConfig(every=1, keep=2)

    def as_dict(self):
        return {"steps": 3}


def test_enospc_in_the_drivers_checkpoint_write_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path):
    def save(step, fault_plan=NO_FAULTS):
        return loop.save_checkpoint(tmp_path, _Cfg(), step, DataPosition(), _StandInCluster(), ArithTask(), None, (),
                                    None, fault_plan)

    last = save(2)
    before = rl_runs.tree_hash(last)
    with pytest.raises(disk_full.DiskFull) as stop:
        save(3, FaultPlan.parse("enospc_in_checkpoint:3"))
    root = tmp_path / "checkpoints"
    free, total = disk_full.free_space(root)
    msg = str(stop.value)
    assert msg.startswith(f"no space left on device while writing the step-3 checkpoint (the last one, step_000002, "
                          f"takes {disk_full.size_of(last)}): {root} is on a filesystem with ")
    assert f" free of {disk_full._size(total)}." in msg and f"Last complete checkpoint: {last} (step 2)" in msg
    assert sorted(p.name for p in root.iterdir()) == ["step_000002"]  # the partial step 3 removed
    assert rl_runs.tree_hash(last) == before
    checkpoint_manifest.verify(last)


def test_what_counts_as_no_space():
    import errno

    assert disk_full.is_no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full.is_no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    try:  # an actor's error re-raised in the driver: the OSError is its cause
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise faults.ActorFailed("trainer rank 0 failed during checkpoint save", "trainer rank 0", False, 0) \
                from inner
    except faults.ActorFailed as e:
        assert disk_full.is_no_space(e)
    assert disk_full.is_no_space(RuntimeError("Error while serializing: I/O error: No space left on device (os "
                                              "error 28)"))  # safetensors' Rust writer keeps only the words
    assert not disk_full.is_no_space(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full.is_no_space(ValueError("bad"))


def _assert_stopped_in_one_line(run_dir: Path, out, step: int) -> None:
    assert out.returncode == 1, out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if line.startswith("top-rl:")]
    assert len(said) == 1 and said[0].startswith(
        f"top-rl: no space left on device while writing the step-{step} checkpoint (the last one, "
        f"step_{step - 1:06d}, takes "), out.stderr[-3000:]
    assert f"{run_dir / 'checkpoints'} is on a filesystem with " in said[0] and " free of " in said[0]
    assert "Traceback" not in out.stderr and "Logging error" not in out.stderr
    assert len(out.stderr.splitlines()) <= 6, out.stderr[-3000:]  # the line, the resume command, the fault note
    ckpt, _, failed = checkpoint.newest_verified(run_dir)
    assert checkpoint.step_of(ckpt) == step - 1 and not failed
    assert not list((run_dir / "checkpoints").glob("*.tmp")) and not (run_dir / "run.lock").exists()


@pytest.mark.slow
def test_enospc_in_a_trainer_ranks_shard_write_stops_the_run_with_one_line(tmp_path):
    out = rl_runs.run(tmp_path, *BASE, f"steps={STEPS}", fault="enospc_in_trainer_checkpoint:2", wandb="offline")
    _assert_stopped_in_one_line(tmp_path, out, 2)


def _mount_tmpfs(path: Path, size: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return res.returncode == 0


@pytest.mark.slow
def test_a_really_full_disk_stops_with_one_line_and_the_resume_is_bitwise_the_straight_run(tmp_path):
    straight = rl_runs.baseline()
    one = sum(p.stat().st_size for p in rl_runs.final_checkpoint(straight).rglob("*") if p.is_file())
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, int(1.6 * one) + (400 << 10)):  # the first checkpoint fits, not a second beside it
        pytest.skip("needs to mount a tmpfs (root): the injected ENOSPC tests above run everywhere")
    try:
        run_dir = disk / "run"
        out = rl_runs.run(run_dir, *BASE, f"steps={STEPS}", wandb="offline")
        _assert_stopped_in_one_line(run_dir, out, 2)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # space freed: resume
        resumed = rl_runs.run(run_dir, *BASE, f"steps={STEPS}", "resume=true", wandb="offline")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        got = rl_runs.rows(run_dir)
        assert [r["step"] for r in got] == list(range(1, STEPS + 1))
        assert rl_runs.without_timing(got) == rl_runs.without_timing(rl_runs.rows(straight))
        assert rl_runs.state_hash(rl_runs.final_checkpoint(run_dir)) == \
            rl_runs.state_hash(rl_runs.final_checkpoint(straight))
        assert json.loads((rl_runs.final_checkpoint(run_dir) / "state.json").read_text())["step"] == STEPS
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
