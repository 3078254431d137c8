"""A full disk stops the run with one line: where, how much is free, and how to resume.

A checkpoint is written atomically (top_rl.run.checkpoint), so a full disk never costs the last complete one.
What it did cost was the console: every write into run_dir fails, wandb's console capture fails to log
each stderr line into run_dir and reports that through Python logging, whose handler (also in run_dir)
fails and prints "--- Logging error ---" with a traceback to stderr, which is captured again: tens of
thousands of lines, and no word of what happened. So once a write failed for lack of space:
  - Python logging stops printing its own handler failures (`logging.raiseExceptions = False`): wandb's
    log files cannot be written anyway;
  - the failure becomes `DiskFull` (a RunStopped: `top-rl: <message>`, exit 1) naming the path, the free
    space (`shutil.disk_usage`) and the checkpoint to resume from, before the tracker and Ray shut down.
A write failed "for lack of space" when its error (or one it was raised from, also inside a Ray actor)
is ENOSPC / EDQUOT, says so in words (Rust and C++ writers keep only the text), or when the filesystem has
less than LOW_SPACE_BYTES free right after a checkpoint write failed (torch's C++ writer drops the errno).
"""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path

from top_rl.run.stopped import RunStopped

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_WORDS = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")
LOW_SPACE_BYTES = 64 << 20


class DiskFull(RunStopped):
    """The run stopped because a write under run_dir found no space; the message says where and what is free."""


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        cause = getattr(exc, "cause", None)  # a RayTaskError carries the actor's exception here
        yield from ([cause] if isinstance(cause, BaseException) else [])
        exc = exc.__cause__ or exc.__context__


def is_no_space(exc: BaseException) -> bool:
    return any(isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS or any(w in str(e) for w in NO_SPACE_WORDS)
               for e in _chain(exc))


def free_space(path: Path) -> tuple[int, int]:
    """(free, total) bytes of the filesystem holding `path` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    usage = shutil.disk_usage(path)
    return usage.free, usage.total


def size_of(directory: Path) -> str:
    return _size(sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file()))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def quiet_logging() -> None:
    """Python logging's own handler failures (to files under a full run_dir) stop reaching stderr."""
    logging.raiseExceptions = False


def stopped(where: Path, what: str, resume_hint: str) -> DiskFull:
    """The DiskFull for a write to `where` (under run_dir) that found no space while `what`."""
    quiet_logging()
    free, total = free_space(where)
    return DiskFull(f"no space left on device while {what}: {where} is on a filesystem with {_size(free)} free of "
                    f"{_size(total)}. Free some space (or move run_dir) and resume. {resume_hint}")
