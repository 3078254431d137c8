"""metrics.jsonl on resume: the rows up to the checkpoint's step, each step once, a damaged row rewritten from the
checkpoint.

A resumed run keeps the rows of the steps its checkpoint holds and replays the rest, so the file ends up with every
step exactly once. A row of a kept step can be damaged, though: a line cut short (a copy or sync of run_dir cut off,
a full disk, an edit), a line that is not JSON. Every checkpoint therefore carries the exact lines of the rows logged
since the checkpoint before it (top_rl.run.checkpoint, `metrics_tail.jsonl`), and a kept step whose row the file lacks
is rewritten from there, byte for byte. A step neither has is named in one line: the record goes on without it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def step_of(line: str) -> int | None:
    """The step of one metrics line, or None when the line is not a whole row."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _steps(steps: list[int]) -> str:
    """[1, 2, 3, 5] -> "steps 1..3, 5" """
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    text = ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"step{'s' if len(steps) > 1 else ''} {text}"


def resumed_lines(path: Path, upto: int, saved: Sequence[str], saved_from: str) -> tuple[list[str], str | None]:
    """The lines metrics.jsonl keeps when a run resumes after step `upto`, in step order, and the one line that says
    what was repaired or is missing (None when nothing was). `saved`: the checkpoint's own copy of its latest rows,
    `saved_from` its name."""
    kept: dict[int, str] = {}
    torn: list[int] = []
    doubled: list[int] = []
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                step = step_of(line)
                if step is None:
                    if line.strip():
                        torn.append(number)
                elif step <= upto:
                    if step in kept:
                        doubled.append(step)
                    else:
                        kept[step] = line.rstrip("\n") + "\n"
    copies = {s: line.rstrip("\n") + "\n" for line in saved if (s := step_of(line)) is not None and s <= upto}
    restored = sorted(s for s in copies if s not in kept)
    kept.update({s: copies[s] for s in restored})
    missing = [s for s in range(min([*kept, 1]), upto + 1) if s not in kept]
    lines = [kept[s] for s in sorted(kept)]
    if not (restored or missing or doubled):
        return lines, None  # a torn line past the checkpoint is the crash being resumed from: replayed anyway
    cause = f" (line{'s' if len(torn) > 1 else ''} {', '.join(map(str, torn))} not a whole row)" if torn else ""
    said = []
    if restored:
        said.append(f"{path}: {_steps(restored)} rewritten from checkpoint {saved_from}'s copy{cause}")
        cause = ""
    if missing:
        held = f"it holds {_steps(sorted(copies))}" if copies else "it holds no copy of any row"
        said.append(f"{path} has no row for {_steps(missing)}{cause} and checkpoint {saved_from} cannot supply it "
                    f"({held}): the record goes on without it; a copy of metrics.jsonl from before the damage has it")
    if doubled:
        said.append(f"{path}: {_steps(sorted(set(doubled)))} appeared twice, the first row kept")
    return lines, "; ".join(said)
