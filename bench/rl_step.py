"""Where an RL step's time goes, from the perf/* keys of one or more runs' metrics.jsonl (the loop writes
them every step): rollout, trainer forward+backward, gate, optimizer, weight push, rest. The gate rides the
training forward, so its row is only the comparison itself. Also the parity and reward summary of each run.

    python bench/rl_step.py runs/default/metrics.jsonl [more.jsonl ...] [--skip 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROWS = [("rollout", "perf/rollout_time"), ("trainer forward+backward", "perf/trainer/forward_backward_s"),
        ("trainer scoring (updates > 1)", "perf/trainer/scoring_s"), ("gate", "perf/trainer/gate_s"),
        ("optimizer", "perf/trainer/optimizer_s"), ("weight push", "perf/weight_push_time")]


def summarize(path: Path, skip: int) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    timed = rows[skip:] or rows
    mean = lambda key: statistics.fmean(r.get(key, 0.0) for r in timed)  # noqa: E731
    parts = {name: mean(key) for name, key in ROWS}
    step = mean("perf/step_time")
    trainer_other = mean("perf/train_time") - sum(parts[n] for n in ROWS_TRAINER)
    parts["trainer other (gather, Ray call)"] = trainer_other
    parts["driver (prompts, rewards, logging)"] = step - sum(parts.values())
    diffs = [r.get("train/train_rollout_logprob_abs_diff") for r in rows]
    ess = [r.get("train/ess_ratio") for r in rows]
    rewards = [r["rollout/reward_mean"] for r in rows]
    k = max(1, min(5, len(rewards) // 2))
    return {"path": str(path), "steps": len(rows), "step_s": step, "parts": parts,
            "all_zero": all(d == 0.0 for d in diffs), "all_one": all(e == 1.0 for e in ess),
            "reward_first": statistics.fmean(rewards[:k]), "reward_last": statistics.fmean(rewards[-k:])}


ROWS_TRAINER = ("trainer forward+backward", "trainer scoring (updates > 1)", "gate", "optimizer")


def _label(run: dict) -> str:
    p = Path(run["path"])
    return p.parent.name if p.name == "metrics.jsonl" else p.stem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", nargs="+", type=Path)
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the means")
    args = ap.parse_args()
    runs = [summarize(p, args.skip) for p in args.metrics]
    names = list(runs[0]["parts"])
    print("### RL step breakdown (mean seconds per step, first steps skipped)\n")
    print("| part | " + " | ".join(_label(r) for r in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{r['parts'][n]:.3f} ({100 * r['parts'][n] / r['step_s']:.0f}%)"
                                         for r in runs) + " |")
    print("| **step** | " + " | ".join(f"**{r['step_s']:.3f}**" for r in runs) + " |")
    print("\n| run | steps | abs_diff == 0 every step | ess == 1 every step | reward first 5 | reward last 5 |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {_label(r)} | {r['steps']} | {r['all_zero']} | {r['all_one']} | "
              f"{r['reward_first']:.3f} | {r['reward_last']:.3f} |")


if __name__ == "__main__":
    main()
