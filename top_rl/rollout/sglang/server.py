"""One SGLang server as a child process: start, wait for /health, tail its log, stop (its whole process group).

`python -m sglang.launch_server` forks scheduler and detokenizer processes; the server runs in its own session so
stopping it reaches all of them, and a dead server leaves no GPU memory held by orphans.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from top_rl.rollout.sglang.client import SglangClient, SglangError
from top_rl.rollout.sglang.launch import LaunchSpec


# The server gets the default signal mask back before it execs: a local run starts Ray's processes (this engine's
# actor among them) with the stop signals blocked (top_rl/driver/local_ray.py), a blocked mask is inherited across fork and
# exec, and a server that never sees SIGTERM cannot shut down cleanly (stop() would wait its whole grace period,
# then SIGKILL). Popen has no sigmask argument, and preexec_fn is unsafe in a threaded process: a one-line exec shim.
_UNBLOCK_THEN_EXEC = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, set()); "
                      "os.execvp(sys.argv[1], sys.argv[1:])")


def unblocked(argv: list[str]) -> list[str]:
    """`argv` run with no signal blocked, whatever this process blocks."""
    return [sys.executable, "-c", _UNBLOCK_THEN_EXEC, *argv]


class SglangStartupError(SglangError):
    """The server exited or did not answer /health in time; the message carries its last log lines."""


class ServerProcess:
    def __init__(self, spec: LaunchSpec, client: SglangClient, log_path: str | Path):
        self.spec = spec
        self.client = client
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return "<no log>"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== top-rl start #{self.starts + 1}: {' '.join(self.spec.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(unblocked(self.spec.argv), env=self.spec.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.starts += 1
        self.wait_healthy(timeout_s)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.2
        while True:
            rc = self.proc.poll() if self.proc else None
            if rc is not None:
                raise SglangStartupError(
                    f"SGLang server on {self.client.url} exited with code {rc} during startup; last log lines "
                    f"({self.log_path}):\n{self.log_tail()}", "GET /health")
            if self.client.health(timeout=min(10.0, max(0.5, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise SglangStartupError(
                    f"SGLang server on {self.client.url} did not answer GET /health within {timeout_s:.0f}s "
                    f"(raise startup_timeout_s for large models); last log lines ({self.log_path}):\n{self.log_tail()}",
                    "GET /health")
            time.sleep(delay)
            delay = min(2.0, delay * 1.5)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL to whatever of it is left after `grace_s`."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # session leader: its pid is the group id, also after it has exited
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.proc = None
