"""A step's metrics row, assembled from what the step's parts measured: the trainer's report (parity, losses,
timings), the batch (rewards, advantages, samples), the rollout, the schedule's timings and versions, the kernels.
The keys and their order are what metrics.jsonl and wandb show (docs/metrics.md); nothing here computes a number the
parts did not."""

from __future__ import annotations

import json
import time
from pathlib import Path

from top_rl import kernels
from top_rl.atomic import write_file
from top_rl.rl import step_stats


def rollout_metrics(samples, seconds: float) -> dict:
    """What any engine's rollout gave: response lengths, the share cut by max_new_tokens, generated tokens per second
    of the rollout call (the generate wall time seen by the driver, Ray included)."""
    lengths = [len(s.response_ids) for s in samples]
    return {"rollout/response_len_mean": sum(lengths) / len(lengths), "rollout/response_len_max": max(lengths),
            "rollout/response_len_min": min(lengths),
            "rollout/truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
            "perf/rollout_tokens_per_s": sum(lengths) / seconds if seconds > 0 else float("nan")}


def kernel_metrics(run_dir: Path, reports: list[dict]) -> dict:
    """Every actor's kernel report (the paths its ops took, its fallbacks) to run_dir/kernels.json; the counts as
    step metrics."""
    write_file(run_dir / "kernels.json", lambda tmp: Path(tmp).write_text(json.dumps(reports, indent=1) + "\n"))
    return kernels.step_metrics(reports)


class WallClock:
    """perf/wall_time: seconds since the run first started, across resumes (the checkpoint's last row carries it)."""

    def __init__(self, saved_lines: list[str]):
        self.t_start, self.before = time.perf_counter(), 0.0
        for line in reversed(saved_lines):  # 0 for a fresh run, or a checkpoint from before the metric
            try:
                value = json.loads(line).get("perf/wall_time")
            except (ValueError, AttributeError):
                continue
            if isinstance(value, (int, float)):
                self.before = float(value)
                break

    def now(self) -> float:
        return self.before + time.perf_counter() - self.t_start


def row(report, scored, taken, schedule_metrics: dict, cfg, task, t0: float, wall: WallClock, run_dir: Path,
        cluster) -> dict:
    """Step metrics: `report` the trainer's StepReport, `scored` the batch (top_rl.driver.step_batch), `taken` its
    collected rollout, `schedule_metrics` the schedule's timings and versions, `t0` the step's start."""
    n, rewards, advantages, samples = cfg.rollout.n_samples, scored.rewards, scored.advantages, scored.samples
    t_rollout = taken.seconds + scored.fill_seconds  # every round's generation
    t_train = schedule_metrics["perf/train_time"]
    return {
        **report.parity,
        "rollout/reward_mean": float(rewards.mean()),
        **step_stats.reward_stats(rewards, n),
        **step_stats.advantage_stats(advantages),
        **step_stats.entropy_estimate([s.sample_logprobs for s in samples]),
        **rollout_metrics(samples, t_rollout),
        **taken.engine_metrics,  # the engines' own: generation, re-score, server peaks
        **scored.prompt_counts,
        **scored.shaping,
        "data/rows_skipped": getattr(task, "skipped", 0),
        **{f"train/{k}": v for k, v in report.losses.items()},
        "train/step": report.trainer_step,
        "train/micro_batches": report.micro_batches,
        "train/tokens": report.tokens,
        "train/lr": cfg.trainer.lr if report.lr is None else report.lr,  # the schedule's (rl/lr_schedule.py)
        **{f"perf/trainer/{k}_s": v for k, v in report.timings.items()},
        **{f"perf/trainer/gpu_{k}_gib": v for k, v in report.gpu_memory.items()},
        "perf/rollout_time": t_rollout,
        **schedule_metrics,
        "perf/step_time": time.perf_counter() - t0,
        # the trainer's tokens (prompts and responses) per second of its step
        "perf/trained_tokens_per_s": report.tokens / t_train if t_train > 0 else float("nan"),
        "perf/wall_time": wall.now(),
        **kernel_metrics(run_dir, cluster.kernel_reports()),
    }
