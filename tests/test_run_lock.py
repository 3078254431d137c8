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

from top_rl.run_lock import NAME, RunDirLocked, RunLock

ROOT = Path(__file__).resolve().parent.parent


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


def test_lock_of_a_killed_process_is_taken_over_with_a_message(tmp_path, capsys):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from top_rl.run_lock import RunLock; "
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

