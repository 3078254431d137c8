"""A local Ray (`ray.init()` on this machine) whose own processes survive the signals that stop the run.

`timeout -s TERM`, `kill -TERM -<pgid>`, Slurm and a closing terminal signal every process of the run's
process group (or of the job), not only the driver. Ray's GCS, raylet, agents and workers would die on that SIGTERM/SIGHUP
at once, so the driver could not finish its step and write the checkpoint it promises (top_rl.run.faults). So
Ray's processes start with the stop signals blocked: a blocked signal mask is inherited across fork and exec
(the raylet passes it on to the workers it starts), which is how Ray itself already keeps Ctrl-C (SIGINT)
away from its processes. The driver alone receives them and stops the run in order. A driver that dies (SIGKILL
included) takes every process of the run with it at once: Ray's GCS and raylet by Ray's parent-death signal, the rest
by the watcher `start` sets up first (top_rl.driver.leftovers).

The cost of the shield: Ray's shutdown asks its processes to stop with SIGTERM and waits up to 1 s for each
before SIGKILL (~4 s at every exit), and the raylet's agents, never told to stop, would outlive it. Those
processes hold nothing to flush by then (the run's actors are gone, its files closed), so the node this
run started, with everything it started, is stopped with SIGKILL directly (through Ray's node object,
`ray._private.worker._global_node`; a Ray version without it only exits the slow way).
"""

from __future__ import annotations

import signal

import ray

from top_rl.driver import leftovers
from top_rl.run.faults import STOP_SIGNALS as SHIELDED  # the driver handles them (top_rl.run.faults)


def start(**init_kwargs) -> None:
    """`ray.init(**init_kwargs)` for a local Ray whose processes do not see the stop signals and do not outlive the
    driver (module doc)."""
    handlers = {sig: signal.getsignal(sig) for sig in SHIELDED}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        with leftovers.marking():  # Ray's processes carry the run's mark: none outlives this driver
            ray.init(**init_kwargs)
    finally:
        # ray.init installs a SIGTERM handler that exits the driver at once (sys.exit): the run's own
        # handlers come back before a signal that came meanwhile (pending, blocked) is delivered.
        for sig, handler in handlers.items():
            if handler is not None:  # None: a handler installed in C, which Python cannot put back
                try:
                    signal.signal(sig, handler)
                except ValueError:  # not the main thread: Ray installed none either
                    pass
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    _stop_without_waiting()


def _stop_without_waiting() -> None:
    """Make `ray.shutdown()` (atexit) SIGKILL this node's processes, and the agents and workers they started,
    instead of sending them a SIGTERM they no longer see (module doc)."""
    try:
        import psutil
        from ray._private import worker as ray_worker
    except ImportError:
        return
    node = getattr(ray_worker, "_global_node", None)
    kill_all = getattr(node, "kill_all_processes", None)
    if kill_all is None or not isinstance(getattr(node, "all_processes", None), dict):
        return  # another Ray version: shutdown still works, it only waits ~1 s on each process

    def kill_all_processes(*args, **kwargs):
        started = []  # the raylet's agents and workers: without its graceful SIGTERM they would linger
        for infos in node.all_processes.values():
            for info in infos:
                try:
                    started += psutil.Process(info.process.pid).children(recursive=True)
                except (psutil.Error, AttributeError):
                    pass
        for proc in started:
            try:
                proc.kill()
            except psutil.Error:
                pass
        kwargs["allow_graceful"] = False
        return kill_all(*args, **kwargs)

    node.kill_all_processes = kill_all_processes
