"""A local run leaves no process behind once its driver is gone, however it went (a SIGKILL, the OOM killer, a
crash), as a scheduler's cgroup kill would end them all.

Ray's own fate sharing does not get there. The GCS and the raylet die with the driver (PR_SET_PDEATHSIG), but what the
raylet started outlives it: the dashboard and runtime-env agents notice their parent is gone within ~2 s (5 checks,
0.4 s apart) and then block in a report to the dead GCS for up to `gcs_rpc_server_reconnect_timeout_s` (60 s), so they
lingered 60-90 s, listening on 127.0.0.1; after a SIGKILL of the driver's process group the actors (each in a process
group of its own) and wandb-core (in a session of its own) lingered 30-60 s. Lowering Ray's timeouts would shorten
that, never end it, and would change how a live run tolerates a slow GCS.

So `marking()` (around `ray.init` in `local_ray.start`) starts one small watcher per driver: this file run by a plain
interpreter (stdlib only), in a session of its own so that the signals sent to the driver's process group do not
reach it. It waits on the driver's exit (a pidfd, or its parent pid changing), and then SIGKILLs the run's processes,
found two ways, on Linux's /proc:
- every process whose environment carries this driver's mark (MARK, in the driver's environment while Ray starts:
  inherited by the GCS and the raylet, and from the raylet by every worker it starts later and the SGLang servers
  those start, whichever process group or session they moved to), and
- every process it saw descend from the driver since it started (recorded once a second): the raylet's agents, which
  Ray starts with an environment of its own, and wandb-core.
With each of these, whatever it started. Processes the driver had started before are not the run's and are left
alone; so is anything that merely shares the driver's process group or session (the shell, `tee`, ...). The mark is
taken out of the driver's environment again once Ray is up: what the driver starts later is not marked.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

MARK = "TOP_RL_LOCAL_RUN"  # the environment variable naming the driver a process was started for
RECORD_EVERY_S = 1.0
_started_for: int | None = None  # the pid whose watcher runs (a sweep starts Ray once per job, in one driver)


_mark: str | None = None


@contextlib.contextmanager
def marking():
    """Start this driver's watcher (once; Linux only, elsewhere nothing happens) and, for the `with` body (Ray
    starting), put the run's mark into the environment its processes inherit (module doc)."""
    global _started_for, _mark
    if not os.path.isdir("/proc/self"):
        yield
        return
    if _started_for != os.getpid():
        _mark = f"{os.getpid()}.{time.time_ns()}"
        env = {k: v for k, v in os.environ.items() if k != MARK}  # the watcher is not the run's: it must not kill itself
        subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), _mark], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)  # stderr: ours
        _started_for = os.getpid()
    before = os.environ.get(MARK)
    os.environ[MARK] = _mark
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = before


# ------------------------------------------------------------------------------------------- the watcher
def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time in clock ticks, state) of every process /proc shows."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after "(comm)", which may hold spaces
        except OSError:
            continue
        table[int(name)] = (int(fields[1]), int(fields[19]), fields[0].decode())
    return table


def _descendants(roots: set[int], table: dict[int, tuple[int, int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _marked(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in b"\0" + f.read()
    except OSError:  # gone, or another user's
        return False


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    first = argv[0].decode(errors="replace").split()  # a title Ray set ("ray::TrainerActor  ...") or a program path
    return os.path.basename(first[0]) if first else "?"


def _reap(seen: dict[int, int], needle: bytes) -> list[str]:
    """SIGKILL the run's processes (module doc) until none is left (zombies are dead already); their names."""
    me = os.getpid()
    ended: dict[int, str] = {}  # one that takes a moment to die is seen, and sent SIGKILL, again
    for _ in range(100):
        table = _processes()
        roots = {pid for pid, start in seen.items() if pid in table and table[pid][1] == start}
        roots |= {pid for pid in table if pid != me and _marked(pid, needle)}
        victims = {p for p in roots | _descendants(roots, table) if p != me and table.get(p, (0, 0, "Z"))[2] != "Z"}
        if not victims:
            break
        names = {pid: _name(pid) for pid in victims}
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.setdefault(pid, names[pid])
            except OSError:
                pass
        time.sleep(0.05)
    return list(ended.values())


def _wait_for_exit(driver: int, seen: dict[int, int]) -> None:
    """Until the driver is gone, record every process that descends from it (and was not there before)."""
    me = os.getpid()
    before = _descendants({driver}, _processes())
    try:
        pidfd = os.pidfd_open(driver)
    except (AttributeError, OSError):  # no pidfd (an old kernel, a sandbox): the parent pid tells too
        pidfd = None
    poller = select.poll()
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while os.getppid() == driver:  # the driver is this process's parent until it dies
        table = _processes()
        for pid in _descendants({driver}, table) - before - {me}:
            seen[pid] = table[pid][1]
        if pidfd is not None:
            if poller.poll(RECORD_EVERY_S * 1000):
                return
        else:
            time.sleep(RECORD_EVERY_S / 4)


def main(argv: list[str]) -> None:
    driver, mark = int(argv[1]), argv[2]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # stopping the run is the driver's business
        signal.signal(sig, signal.SIG_IGN)
    seen: dict[int, int] = {}
    _wait_for_exit(driver, seen)
    ended = [n for n in _reap(seen, f"\0{MARK}={mark}\0".encode()) if n != "?"]  # "?": exiting anyway (GCS, raylet)
    if ended:  # on the driver's stderr: a driver that ended normally has stopped everything itself
        kinds = sorted(set(ended))
        try:
            print(f"top-rl: the run's driver (pid {driver}) is gone; ended the {len(ended)} processes it left behind "
                  f"({', '.join(kinds[:6])}{', ...' if len(kinds) > 6 else ''}). Continue the run with resume=true",
                  file=sys.stderr, flush=True)
        except OSError:  # its terminal is gone too
            pass


if __name__ == "__main__":
    main(sys.argv)
