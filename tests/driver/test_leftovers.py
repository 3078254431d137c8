"""Issue 30: Ray outlived a killed driver. After `kill -9` of the driver, ray::DashboardAgent and ray::RuntimeEnvAgent
(listening on 127.0.0.1) lived 60-90 s; after a SIGKILL of its process group the actors and wandb-core lingered
30-60 s. Now nothing of a local run outlives its driver (top_rl.driver.leftovers): a real run, its driver SIGKILLed,
and within 10 s not one of the processes it had is left."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests import rl_runs
from tests.rl_runs import BASE

# What a local run starts (include_dashboard=False still starts the raylet's two agents)
EXPECTED = ("gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::TrainerActor",
            "ray::EngineActor", "wandb-core")


def _alive(pid: int, started: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _processes_of(driver: psutil.Process) -> dict[int, tuple[float, str]]:
    """The run's processes: the driver's descendants and every process of its session (rl_runs starts each run in a
    session of its own, so no other process is in it). pid -> (start time, command line)."""
    found = {p.pid: p for p in driver.children(recursive=True)}
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == driver.pid and p.pid != driver.pid:
                found[p.pid] = p
        except (OSError, psutil.Error):
            pass
    out = {}
    for pid, p in found.items():
        try:
            out[pid] = (p.create_time(), " ".join(" ".join(p.cmdline()).split()) or p.name())
        except psutil.Error:
            pass
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["the driver", "its process group"])
def test_nothing_of_a_local_run_outlives_its_sigkilled_driver(tmp_path, kill):
    proc = rl_runs.start(tmp_path, *BASE, "steps=60", wandb="offline")
    try:
        rl_runs.wait_for_row(tmp_path, 1, proc)
        run = _processes_of(psutil.Process(proc.pid))
        commands = " | ".join(cmd for _, cmd in run.values())
        assert all(name in commands for name in EXPECTED), commands  # the test sees what it is about
        os.kill(proc.pid, signal.SIGKILL) if kill == "the driver" else os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        t0 = time.monotonic()
        while (left := {pid: cmd for pid, (t, cmd) in run.items() if _alive(pid, t)}) and time.monotonic() - t0 < 10:
            time.sleep(0.2)
        assert left == {}, f"still running 10 s after SIGKILL of {kill}: {left}"
    finally:
        out = rl_runs.finish(proc, timeout=30)
    said = [line for line in out.stderr.splitlines() if line.startswith("top-rl")]
    assert len(said) == 1 and said[0].startswith(f"top-rl: the run's driver (pid {proc.pid}) is gone; ended the "), \
        out.stderr[-3000:]
    assert said[0].endswith("Continue the run with resume=true")
