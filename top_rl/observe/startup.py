"""Start-up that speaks (issue 53 item 3): one console line for each thing the run waits on before its first step
(Ray up, each trainer rank ready, each rollout server starting and ready with its log, the first step starting), with
the seconds since the driver began, so ~40 s on CPU (minutes on a GPU) is no longer silence; and where each process's
log goes: `run_dir/logs/<start time>-<pid>/`, one directory per run (a resume or a restart never appends to an earlier
run's files, and nothing is written outside run_dir).

Actors (trainer ranks, engines) copy what Python writes to stdout and stderr into their own file there
(`tee_to`); output written by C code straight to the file descriptors (NCCL, CUDA) reaches only the console and
Ray's session logs. SGLang servers write their whole output to their file (rollout/sglang/server.py).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path


def run_logs_dir(run_dir: str | Path, now: datetime | None = None) -> Path:
    """This run's log directory (absolute; not created here: nothing is written before the run lock is held)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    return Path(run_dir).resolve() / "logs" / f"{stamp}-{os.getpid()}"


class StartupLog:
    """`say(what)`: one `[top-rl] start-up +S.Ss: what` line on stdout, S the seconds since the driver began."""

    def __init__(self, t0: float | None = None, out=None):
        self.t0 = time.monotonic() if t0 is None else t0
        self.out = out

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, what: str) -> None:
        print(f"[top-rl] start-up +{self.elapsed():.1f}s: {what}", file=self.out or sys.stdout, flush=True)


@contextlib.contextmanager
def imports_without_gc():
    """For a block of heavy imports (torch, megatron-core): the cyclic garbage collector stays off inside it. Importing
    makes millions of objects that live as long as the process, and the collector's passes over them are pure cost
    (2 CPU cores: torch, a trainer actor's modules and megatron-core imported in 9.7-10.3 s with it, 7.7-8.5 s
    without). Its state before comes back after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


QUIET = StartupLog(out=open(os.devnull, "w"))  # a Cluster built outside a run (tests, benches) says nothing


class _Tee:
    """A text stream that writes to the original stream and to a file, line-buffered on both."""

    def __init__(self, stream, file):
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stream.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding, ...: the original stream's
        return getattr(self.stream, name)


def tee_to(path: str | None) -> None:
    """Copy this process's Python-level stdout and stderr into `path` (a new file, `w`: one per actor per run)."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "w", encoding="utf-8", errors="replace", buffering=1)
    sys.stdout, sys.stderr = _Tee(sys.stdout, f), _Tee(sys.stderr, f)
