"""The one test-only hook that causes the faults a run must survive (top_rl/run/faults.py says how it does).

Test-only fault injection: TOP_RL_FAULT="point:N[,point:N...]", read once by preflight (`FaultPlan.from_env`, the
only reader of the variable) into the run plan's `faults` (top_rl.driver.plan.RunPlan), which reaches the code that
causes them: the driver's (the loop, its RunGuard, the checkpoint writer, the cluster) and, in their TrainerSpec, the
trainer ranks. A malformed spec is refused by preflight before Ray starts (`BadFaultSpec`, naming the bad part).
  kill_after_step:N     SIGKILL this driver once step N is logged and checkpointed
  kill_in_checkpoint:N  SIGKILL this driver halfway through writing the step-N checkpoint
  kill_engine:N         kill rollout engine 0 while this process's N-th rollout call is in flight
  kill_trainer:N        kill trainer rank 0 while this process's N-th train step is in flight
  enospc_in_checkpoint:N          the driver's write of the step-N checkpoint fails with ENOSPC (disk full)
  enospc_in_trainer_checkpoint:N  a trainer rank's N-th shard write fails with ENOSPC
  run_dir_unseen:N      trainer rank N-1 reads run_dir as a node that does not mount it would: an empty directory of
                        its own stands in for the path (the shared run_dir check, top_rl/driver/shared_run_dir.py)
Unset (always, outside tests), the plan is empty and its `inject` returns at once.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field

ENV = "TOP_RL_FAULT"
POINTS = ("kill_after_step", "kill_in_checkpoint", "kill_engine", "kill_trainer", "enospc_in_checkpoint",
          "enospc_in_trainer_checkpoint", "run_dir_unseen")


class BadFaultSpec(ValueError):
    """TOP_RL_FAULT is not `point:N[,point:N...]` with known points; the message names the bad part."""


@dataclass(frozen=True)
class FaultPlan:
    """The faults to cause: (point, N) pairs (see module doc). Empty outside tests."""

    points: frozenset[tuple[str, int]] = frozenset()
    # occurrences of each point counted in this process (a point's N without a step); not part of the plan's value
    _calls: Counter = field(default_factory=Counter, compare=False, repr=False)

    @classmethod
    def parse(cls, spec: str) -> "FaultPlan":
        out = set()
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            point, colon, n = part.partition(":")
            if point not in POINTS:
                raise BadFaultSpec(f"{ENV}={spec!r}: {part!r} names no fault point "
                                   f"({point!r}; the points: {', '.join(POINTS)})")
            if not colon or not re.fullmatch(r"\s*[0-9]+\s*", n) or int(n) < 1:
                raise BadFaultSpec(f"{ENV}={spec!r}: {part!r} is not {point}:N with N a whole number >= 1 (the step, "
                                   "or the occurrence in its process)")
            out.add((point, int(n)))
        return cls(frozenset(out))

    @classmethod
    def from_env(cls) -> "FaultPlan":
        """The plan TOP_RL_FAULT names (empty when unset): preflight reads it once, for the run plan."""
        return cls.parse(os.environ.get(ENV, ""))

    def __bool__(self) -> bool:
        return bool(self.points)

    def __reduce__(self):
        """A copy sent to another process (a trainer rank, in its TrainerSpec) counts its own occurrences."""
        return type(self), (self.points,)

    def inject(self, point: str, step: int | None = None, actor=None, path: str | None = None) -> None:
        """Test-only (see module doc): cause the fault this plan names for this point, if any. `step` identifies the
        occurrence; without it, occurrences of `point` in this process are counted. `actor`: the Ray actor a kill_*
        point kills (None: this process). `path`: the file an enospc_* point fails to write."""
        if not self.points:
            return
        if step is None:
            self._calls[point] += 1
            step = self._calls[point]
        if (point, step) not in self.points:
            return
        print(f"[top-rl] {ENV}: injecting {point}:{step}", file=sys.stderr, flush=True)
        if point.startswith("enospc_"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        if actor is None:
            os.kill(os.getpid(), signal.SIGKILL)
        import ray

        ray.kill(actor, no_restart=True)


NO_FAULTS = FaultPlan()  # every run outside the fault tests
