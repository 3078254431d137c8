"""Faults a run survives or stops on cleanly, and the one test-only hook that causes them.

- A rollout engine that dies is replaced and its call repeated (top_rl.driver.cluster): generation is a pure
  function of prompt, seed and weights, so a retried rollout is the rollout that would have happened.
- A trainer rank that dies stops the run: `RunGuard` turns the failure into `RunStopped`, naming the
  actor, the last complete checkpoint and the command that resumes from it.
- SIGINT / SIGTERM / SIGHUP: the first one lets the current step finish, checkpoints it and stops
  (exit 128 + signal); a second one abandons the step at once, and so does the first once the step has run
  cluster.stop_grace_s past it (the driver's waits on the cluster check every second: `RunGuard.abandon_if_due`;
  the actors are killed on the way out), so one signal stops any step in bounded time. An abandoned step loses
  nothing that a resume does not redo bitwise: its rows and checkpoint were never written. Before the first step can run (checks,
  imports, Ray starting) one stops the run at once (`interrupt_on_signals`, installed by `top-rl`
  first thing: also when the shell started it with SIGINT ignored, as a background job). Schedulers
  and terminals send them to the whole process group: Ray's own processes are shielded from them
  (top_rl.driver.local_ray), so the driver can finish. After SIGHUP a console that is a terminal is presumed
  gone: writes to it would fail (EIO) and stop the run mid-step, so they go to /dev/null instead.
  Checkpoints are written atomically (top_rl.run.checkpoint), so either way the last complete one is intact.

The test-only hook that causes them is top_rl/run/fault_injection.py: the run plan's `faults`, handed to RunGuard.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from top_rl.run import disk_full
from top_rl.run.fault_injection import NO_FAULTS, FaultPlan
from top_rl.run.checkpoint import resume_hint  # noqa: F401 - the stop messages' hint
from top_rl.run.stopped import ActorFailed, RunStopped  # noqa: F401 - raised and caught as faults.*

# What a user, a scheduler (timeout, Slurm, Kubernetes) or a closing terminal sends to stop a run.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


_startup_signal: int | None = None


def _record(signum, frame) -> None:
    global _startup_signal
    _startup_signal = signum
    if signum == signal.SIGHUP:
        _detach_terminal()


def _detach_terminal() -> None:
    """SIGHUP: the terminal is presumably gone, and a write to it fails with EIO (see module doc)."""
    devnull = None
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                devnull = os.open(os.devnull, os.O_WRONLY) if devnull is None else devnull
                os.dup2(devnull, fd)
        except OSError:
            pass
    if devnull is not None:
        os.close(devnull)


def _say(message: str) -> None:
    """A note from a signal handler: it must never raise into the step it interrupted."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _interrupt(signum, frame) -> None:
    _record(signum, frame)
    raise KeyboardInterrupt


_unraisablehook_before = sys.unraisablehook


def _quiet_swallowed_interrupt(unraisable) -> None:
    """A stop signal that lands while Python runs a weakref callback or a __del__ (an import's cache cleanup, say)
    raises KeyboardInterrupt there, where Python cannot propagate it: it prints "Exception ignored in ..." with a
    traceback and carries on. `_record` noted the signal, and `raise_if_interrupted` raises it at the next check, so
    the run still stops at once; only the print goes (a clean stop's message carries no traceback)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _startup_signal is not None:
        return
    _unraisablehook_before(unraisable)


def interrupt_on_signals() -> None:
    """SIGINT/SIGTERM/SIGHUP raise KeyboardInterrupt from now until `RunGuard.catch_signals` takes over:
    during start-up there is no step to finish, so the run stops at once (and cleanly: RunGuard and top-rl
    turn it into a message). Also re-arms SIGINT when the process inherited it ignored."""
    sys.unraisablehook = _quiet_swallowed_interrupt
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)


def raise_if_interrupted() -> None:
    """Raise the start-up interrupt that `_record` noted, if one came."""
    if _startup_signal is not None:
        raise KeyboardInterrupt


def startup_signal_name() -> str:
    return signal.Signals(_startup_signal or signal.SIGINT).name


class RunGuard:
    """Wraps a run: signal handling (see module doc) and clean stops naming the checkpoint to resume."""

    def __init__(self, run_dir: Path, fault_plan: FaultPlan = NO_FAULTS, checkpoints: bool = True,
                 grace_s: float = float("inf")):
        self.run_dir = Path(run_dir)
        self.grace_s = grace_s  # cluster.stop_grace_s: how long the first signal lets the step run on
        self.signalled_at: float | None = None
        self.step: int | None = None  # the step in progress (1-based), once the loop says
        self.logged: int | None = None  # the last step whose metrics row is written
        self.abandoned = False
        self.fault_plan = fault_plan  # test-only (top_rl.run.fault_injection): kill_after_step
        self.checkpoints = checkpoints  # checkpoint.enabled: false, and a stop saves nothing (its messages say so)
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def stopping(self) -> bool:
        """A signal asked the run to stop: checkpoint the step that just finished (unless checkpoints are off)."""
        return self.signum is not None

    def _hint(self) -> str:
        """The stop message's last words: how to resume, and with checkpoints off that this run saved nothing."""
        if self.checkpoints:
            return resume_hint(self.run_dir)
        return f"checkpoint.enabled=false: this run wrote no checkpoint, so none of its steps can be resumed. " \
               f"{resume_hint(self.run_dir)}"

    def step_started(self, step: int) -> None:
        self.step = step

    def step_logged(self, step: int) -> None:
        """Step `step`'s row is written: its checkpoint (if due) is never abandoned, it completes the step."""
        self.logged = step

    def abandon_if_due(self) -> None:
        """Called about every second while the driver waits on the cluster: past the first signal's grace, abandon the
        step (KeyboardInterrupt, as a second signal does), unless its row is written and only its checkpoint is left."""
        if self.logged is not None and self.logged == self.step:
            return
        if self.signalled_at is not None and time.monotonic() - self.signalled_at > self.grace_s:
            self.abandoned = True
            raise KeyboardInterrupt

    def step_done(self, step: int) -> None:
        """Called once step `step` is logged and (if due) checkpointed."""
        self.fault_plan.inject("kill_after_step", step)
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            raise RunStopped(f"stopped by {name} after step {step}. {self._hint()}",
                             exit_code=128 + self.signum)

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGHUP:
            _detach_terminal()
        if self.signum is not None:  # the second signal: abandon the step now
            raise KeyboardInterrupt
        self.signum = signum
        self.signalled_at = time.monotonic()
        saving = "checkpointing it and " if self.checkpoints else "(checkpoint.enabled=false: saving nothing) and "
        _say(f"[top-rl] {signal.Signals(signum).name}: finishing the current step, {saving}stopping (it is abandoned "
             f"if not done within cluster.stop_grace_s={self.grace_s:g} s; send the signal again to abandon it now)")

    def catch_signals(self) -> None:
        """Take the stop signals from here on. Call it after Ray has started: Ray's core worker installs
        a SIGTERM handler of its own (it aborts the process) when it initialises."""
        for sig in STOP_SIGNALS:
            try:
                signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread (e.g. run() called from a worker thread)
                pass
        raise_if_interrupted()  # one that came while Ray started

    def __enter__(self) -> "RunGuard":
        # Until catch_signals, a signal is only noted: Ray forks its processes while it starts, and Python
        # swallows an exception raised inside an at-fork hook ("Exception ignored in ..."), so raising where
        # the signal lands could let the run go on as if never stopped. catch_signals raises it.
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, _record)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: a handler set in C
        if isinstance(exc, ActorFailed):
            raise RunStopped(f"{exc}\nThe run stopped. {self._hint()}") from exc
        if isinstance(exc, KeyboardInterrupt):
            signum = self.signum or _startup_signal or signal.SIGINT
            name = signal.Signals(signum).name
            if self.abandoned:
                raise RunStopped(f"stopped by {name}: {self._abandoned_step()} did not finish within "
                                 f"cluster.stop_grace_s={self.grace_s:g} s of it and was abandoned (a resume redoes "
                                 f"it). {self._kept()}{self._hint()}", exit_code=128 + signum) from None
            how = "twice: the step in progress was abandoned" if self.signum else "while the run was starting"
            kept = self._kept() if self.signum else ""
            raise RunStopped(f"interrupted ({name} {how}). {kept}{self._hint()}", exit_code=128 + signum) from exc

    def _abandoned_step(self) -> str:
        return f"step {self.step}" if self.step is not None else "the step in progress"

    def _kept(self) -> str:
        """What an abandoned step leaves: the rows of the steps before it (the checkpoint: the hint after this)."""
        if self.step is None:
            return ""
        done = self.logged if self.logged is not None else self.step - 1
        rows = f"the rows of steps 1-{done}" if done > 1 else "the row of step 1" if done == 1 else "no rows"
        return f"Kept: {self.run_dir / 'metrics.jsonl'} with {rows} (this run's and any it resumed). "


class StopOnFullDisk:
    """`with StopOnFullDisk(run_dir):` the run's body: a no-space failure leaves it as DiskFull (module doc).
    Enter it inside the stack that closes the tracker and Ray, so it acts before they do."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def __enter__(self) -> "StopOnFullDisk":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None or isinstance(exc, disk_full.DiskFull) or not isinstance(exc, Exception) or not disk_full.is_no_space(exc):
            return
        raise disk_full.stopped(self.run_dir, "writing the run's files", resume_hint(self.run_dir)) from None
