"""What a run's start-up says (issue 53 item 3; top_rl/observe/startup.py), checked by the CPU end-to-end runs."""

from __future__ import annotations

from pathlib import Path


def assert_started(stdout: str, run_dir: Path, engines: int = 1, trainers: int = 1) -> Path:
    """The start-up lines of a run, in order, and its log directory (returned): one per run under run_dir/logs/."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("[top-rl] start-up +")]
    what = [ln.split(": ", 1)[1] for ln in lines]
    order = ["checks passed; starting Ray", "local Ray up", "run_dir "] + [f"trainer rank {r} ready" for r in range(trainers)] + [
        f"rollout engine {i} starting" for i in range(engines)] + [f"rollout engine {i} ready" for i in range(engines)] + [
        "initial weights sent", "step 1 starting"]
    assert len(what) == len(order) and all(w.startswith(o) for w, o in zip(what, order)), "\n".join(lines)
    logs = [p for p in (run_dir / "logs").iterdir()]
    assert len(logs) == 1 and f"this run's logs: {logs[0]}" in lines[1]
    assert sorted(p.name for p in logs[0].glob("*-*.log") if not p.name.startswith("sglang")) == sorted(
        [f"engine-{i}.log" for i in range(engines)] + [f"trainer-rank{r}.log" for r in range(trainers)])
    return logs[0]
