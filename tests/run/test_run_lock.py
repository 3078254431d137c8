"""Issue 14: one run per run_dir. A second run is refused naming the holder's pid and host; a lock left by a
process that died is taken over with a message; a run that ends (or is refused) leaves no lock behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from top_rl.run.lock import NAME, RunDirLocked, RunLock

ROOT = Path(__file__).resolve().parents[2]


def test_second_holder_is_refused_naming_pid_and_host_and_release_cleans_up(tmp_path):
    run_dir = tmp_path / "new" / "run"
    with RunLock(run_dir):
        rec = json.loads((run_dir / NAME).read_text())
        assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
        with pytest.raises(RunDirLocked, match=rf"in use by another top-rl run: pid {os.getpid()} on host "
                                               rf"{socket.gethostname()} \(started "):
            RunLock(run_dir).acquire()
        (run_dir / "metrics.jsonl").write_text("")
    assert not (run_dir / NAME).exists() and (run_dir / "metrics.jsonl").exists()  # the run's files stay
    with RunLock(tmp_path / "empty"):
        pass
    assert not (tmp_path / "empty").exists()  # created by the lock, nothing written: removed again


def test_a_resume_refused_on_a_run_dir_a_live_run_holds_names_that_run(tmp_path):
    """Issue 24: resume=true without a checkpoint is refused; on a run_dir a live run holds (and has not
    checkpointed yet), the reason to give is that run, as the lock would, not the missing checkpoint."""
    from top_rl import preflight
    from top_rl.run import lock as run_lock
    from top_rl.run.checkpoint import ResumeRefused
    from top_rl.cli import compose

    cfg = compose([f"run_dir={tmp_path}", "resume=true", "task.num_prompts=6"])
    with RunLock(tmp_path):
        with pytest.raises(RunDirLocked, match=rf"in use by another top-rl run: pid {os.getpid()} on host "):
            run_lock.refuse_if_held(tmp_path)
        with pytest.raises(RunDirLocked, match=rf"in use by another top-rl run: pid {os.getpid()} on host "):
            preflight.check(cfg)
    run_lock.refuse_if_held(tmp_path)  # released: nothing to say
    with pytest.raises(ResumeRefused, match="has no complete checkpoint to resume from"):
        preflight.check(cfg)


def test_lock_of_a_killed_process_is_taken_over_with_a_message(tmp_path, capsys):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from top_rl.run.lock import RunLock; "
         f"RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirLocked, match=rf"pid {holder.pid} on host "):
            RunLock(run_dir).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert json.loads((run_dir / NAME).read_text())["pid"] == holder.pid  # left behind by the dead holder
    with RunLock(run_dir):
        assert f"taking over {run_dir / NAME}: it was left by pid {holder.pid} on host {socket.gethostname()}" \
            in capsys.readouterr().out
        assert json.loads((run_dir / NAME).read_text())["pid"] == os.getpid()
    assert not (run_dir / NAME).exists()



def test_top_rl_on_a_run_dir_the_test_holds_is_refused_and_leaves_the_lock(tmp_path):
    """The CLI end to end, with no race: the lock is held here for the whole test, so the run must be refused
    whatever the machine's speed; the refusal writes nothing and leaves the holder's lock as it was."""
    from tests import rl_runs
    from tests.rl_runs import BASE

    with RunLock(tmp_path):
        held = (tmp_path / NAME).read_text()
        out = rl_runs.run(tmp_path, *BASE, "steps=2", "checkpoint.every=0", timeout=300)
        assert out.returncode == 1, out.stderr[-3000:]
        assert f"top-rl: {tmp_path} is in use by another top-rl run: pid {os.getpid()} on host " \
               f"{socket.gethostname()}" in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
        assert sorted(p.name for p in tmp_path.iterdir()) == [NAME] and (tmp_path / NAME).read_text() == held
        with pytest.raises(RunDirLocked):  # the refused run took nothing away: the lock still holds
            RunLock(tmp_path).acquire()


def test_a_run_lock_that_is_a_symlink_is_never_written_through(tmp_path):
    """Issue 54 item 1: run.lock opened with O_CREAT followed a link: a run_dir carrying run.lock -> ~/.bashrc had the
    file outside the run truncated and overwritten, and a dangling link created it there. Now the lock refuses."""
    victim, run_dir = tmp_path / "victim", tmp_path / "run"
    victim.write_text("precious\n")
    run_dir.mkdir()
    (run_dir / NAME).symlink_to(victim)
    with pytest.raises(RunDirLocked, match=rf"{run_dir / NAME} is a symbolic link \(to {victim}\): top-rl writes its "
                                           "lock only as a regular file"):
        RunLock(run_dir).acquire()
    assert victim.read_text() == "precious\n"
    (run_dir / NAME).unlink()
    (run_dir / NAME).symlink_to(tmp_path / "elsewhere")  # dangling: it would have been created outside the run
    with pytest.raises(RunDirLocked, match="is a symbolic link"):
        RunLock(run_dir).acquire()
    assert not (tmp_path / "elsewhere").exists()


def test_top_rl_refuses_a_run_lock_symlink_in_one_line_before_anything_starts(tmp_path):
    """The same with the CLI: one `top-rl:` line naming the link and the fix; the file it points to untouched."""
    from tests import rl_runs
    from tests.rl_runs import BASE

    victim, run_dir = tmp_path / "victim", tmp_path / "run"
    victim.write_text("precious\n")
    run_dir.mkdir()
    (run_dir / NAME).symlink_to(victim)
    out = rl_runs.run(run_dir, *BASE, "steps=1", "checkpoint.every=0", timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        f"top-rl: {run_dir / NAME} is a symbolic link (to {victim}): top-rl writes its lock only as a regular file "
        f"inside run_dir and never writes through a link; remove {run_dir / NAME} (nothing was written), or use "
        "another run_dir="], out.stderr[-3000:]
    assert victim.read_text() == "precious\n" and sorted(p.name for p in run_dir.iterdir()) == [NAME]


def _holder_pid(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / NAME).read_text())["pid"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


@pytest.mark.slow
def test_a_second_top_rl_on_a_running_run_dir_is_refused_and_the_first_goes_on(tmp_path):
    """Two real runs. The first's driver is frozen (SIGSTOP) once it has logged step 1, so it holds the lock, and
    cannot finish, for as long as the second takes to start and be refused, whatever the machine's speed."""
    from tests import rl_runs
    from tests.rl_runs import BASE

    first = rl_runs.start(tmp_path, *BASE, "steps=1000", "checkpoint.every=0")
    held, stopped = False, False
    try:
        rl_runs.wait_for_row(tmp_path, 1, first)
        first.send_signal(signal.SIGSTOP)  # the driver alone: its Ray workers go on idling
        held = first.poll() is None and _holder_pid(tmp_path) == first.pid
        if held:
            try:
                second = rl_runs.run(tmp_path, *BASE, "steps=1000", "checkpoint.every=0", "resume=true", timeout=300)
            finally:
                first.send_signal(signal.SIGCONT)
            assert second.returncode == 1, second.stderr[-3000:]
            assert f"top-rl: {tmp_path} is in use by another top-rl run: pid {first.pid} on host " \
                   f"{socket.gethostname()}" in second.stderr and "Traceback" not in second.stderr
            rl_runs.wait_for_row(tmp_path, rl_runs.rows(tmp_path)[-1]["step"] + 1, first)  # the first goes on
            first.send_signal(signal.SIGINT)
            stopped = True
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            if not stopped:
                first.send_signal(signal.SIGINT)
        out = rl_runs.finish(first)
    assert held, f"the first run lost its lock before step 2 (exit {out.returncode}): {out.stderr[-3000:]}"
    assert out.returncode == 130, out.stderr[-3000:]
    steps = [r["step"] for r in rl_runs.rows(tmp_path)]
    assert steps == list(range(1, len(steps) + 1))  # one writer: every step once, in order
    assert not (tmp_path / NAME).exists()
