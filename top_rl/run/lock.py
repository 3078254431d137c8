"""One run per run_dir: `run_dir/run.lock`, held for the run's life.

Two runs writing one run_dir would interleave metrics.jsonl and checkpoints/ (the second replaced the
first's metrics and both wrote one checkpoint directory). The lock is an exclusive `flock` on
run_dir/run.lock, which records the holder (pid, host, start time, command):
  - held by a live process: the second run is refused, naming the holder's pid and host;
  - left behind by a process that died (SIGKILL, a lost node): the kernel released its flock, so the
    next run takes the lock over and says whose it was.
The kernel drops a flock when its process dies, so a stale lock never blocks a run; on NFS, flock is
served by the server's lock manager and holds across nodes. A filesystem without locks is reported and
the run goes on unprotected (nothing better can be done there).
run.lock is opened with O_NOFOLLOW: a run.lock that is a symbolic link (a run_dir shared or unpacked from a tarball
can carry one to ~/.bashrc) would otherwise be truncated and written through, outside the run. Pre-flight refuses
such a run.lock (`refusal`) before anything starts; O_NOFOLLOW keeps one planted after that from being followed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

NAME = "run.lock"


class RunDirLocked(RuntimeError):
    """Another live run holds run_dir."""

    exit_code = 1


def _record() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)}


def _read(fd: int) -> dict:
    try:
        raw = os.pread(fd, 1 << 16, 0)
        return json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}


def _holder(rec: dict) -> str:
    if not rec:
        return "a process that has not written its pid yet"
    return f"pid {rec.get('pid')} on host {rec.get('host')} (started {rec.get('started')}: {rec.get('command')})"


_HELD = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def _locked(run_dir: Path, rec: dict) -> RunDirLocked:
    return RunDirLocked(f"{run_dir} is in use by another top-rl run: {_holder(rec)}. Wait for it to finish or stop "
                        f"it, or use another run_dir=. (If that process is gone, delete {Path(run_dir) / NAME}.)")


def refusal(run_dir: str | Path) -> str | None:
    """Why run_dir's run.lock cannot be this run's lock (it is a link or not a regular file), or None. Reads only."""
    path = Path(run_dir) / NAME
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return None
    what = f"a symbolic link (to {os.readlink(path)})" if stat.S_ISLNK(mode) else "not a regular file"
    return (f"{path} is {what}: top-rl writes its lock only as a regular file inside run_dir and never writes "
            f"through a link; remove {path} (nothing was written), or use another run_dir=")


def refuse_if_held(run_dir: str | Path) -> None:
    """Raise RunDirLocked when a live run holds run_dir. Writes nothing: a shared lock is tried and dropped (it
    conflicts with the holder's exclusive one, and works on a read-only descriptor, also over NFS)."""
    try:
        fd = os.open(Path(run_dir) / NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return  # no lock file (or unreadable: acquire will say)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in _HELD:
                raise _locked(Path(run_dir), _read(fd)) from None
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class RunLock:
    """`with RunLock(run_dir):` the run; creates run_dir. Leaving removes the lock file, and run_dir too when
    this run created it and left nothing else in it (a run stopped before it wrote anything)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / NAME
        self._fd: int | None = None
        self._created = False

    def acquire(self) -> None:
        self._created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as e:  # ELOOP: a link (pre-flight refuses one; this is one planted since)
                if e.errno != errno.ELOOP:
                    raise
                self._remove_created_dir()
                raise RunDirLocked(refusal(self.run_dir) or f"{self.path} is a symbolic link") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                rec = _read(fd)
                os.close(fd)
                if e.errno in _HELD:
                    self._remove_created_dir()
                    raise _locked(self.run_dir, rec) from None
                print(f"[top-rl] warning: cannot lock {self.path} ({os.strerror(e.errno)}): this filesystem has no "
                      "file locks, so a second run on this run_dir would not be refused", file=sys.stderr, flush=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
                break
            # Between our open and flock, the previous holder may have released and unlinked the file: then
            # we hold a lock on a name nobody else will open. Retry on the current file.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self._fd = fd
            left = _read(fd)
            if left:
                print(f"[top-rl] taking over {self.path}: it was left by {_holder(left)}, which is no longer running",
                      flush=True)
            break
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(_record()) + "\n").encode(), 0)
        os.fsync(self._fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it: a waiting process re-checks the inode (acquire)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        self._remove_created_dir()

    def _remove_created_dir(self) -> None:
        if self._created:
            try:
                self.run_dir.rmdir()  # only when empty: whatever the run wrote stays
            except OSError:
                pass

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
