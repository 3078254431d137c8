"""The one test-only hook that causes the faults a run must survive (top_rl/run/faults.py says how it does).

Test-only fault injection, read only here: TOP_RL_FAULT="point:N[,point:N...]"
  kill_after_step:N     SIGKILL this driver once step N is logged and checkpointed
  kill_in_checkpoint:N  SIGKILL this driver halfway through writing the step-N checkpoint
  kill_engine:N         kill rollout engine 0 while this process's N-th rollout call is in flight
  kill_trainer:N        kill trainer rank 0 while this process's N-th train step is in flight
  enospc_in_checkpoint:N          the driver's write of the step-N checkpoint fails with ENOSPC (disk full)
  enospc_in_trainer_checkpoint:N  a trainer rank's N-th shard write fails with ENOSPC
Unset (always, outside tests), `inject` is a dictionary lookup that does nothing.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections import Counter

ENV = "TOP_RL_FAULT"


def _plan() -> set[tuple[str, int]]:
    spec = os.environ.get(ENV, "")
    out = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, _, n = part.partition(":")
        out.add((point, int(n)))
    return out


_PLAN = _plan()
_calls: Counter = Counter()


def inject(point: str, step: int | None = None, actor=None, path: str | None = None) -> None:
    """Test-only (see module doc): cause the fault TOP_RL_FAULT names for this point, if any. `step`
    identifies the occurrence; without it, occurrences of `point` in this process are counted. `path`:
    the file an enospc_* point fails to write."""
    if not _PLAN:
        return
    if step is None:
        _calls[point] += 1
        step = _calls[point]
    if (point, step) not in _PLAN:
        return
    print(f"[top-rl] {ENV}: injecting {point}:{step}", file=sys.stderr, flush=True)
    if point.startswith("enospc_"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    if actor is None:
        os.kill(os.getpid(), signal.SIGKILL)
    import ray

    ray.kill(actor, no_restart=True)
