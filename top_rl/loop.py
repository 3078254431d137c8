"""The RL loop, top to bottom: prompts -> rollout -> rewards -> advantages -> the trainer's RL step (its
training forward is the gate's recompute; the gate is decided before the optimizer step) -> weights pushed
by the trainer to the engines -> metrics -> checkpoint. The driver holds no weights and computes no log-probs.

`run` tells that story once for every order. The order itself (when a rollout is submitted and collected, when the
trainer's version is pushed, which version a batch was generated under) is the schedule's, chosen by
rollout.policy_lag (top_rl.driver.schedule): synchronous, one ahead (the next rollout generates while this step
trains), two ahead. Each step's parts live with their owners: the rollout and its version check
(top_rl.driver.rollouts), rewards, dynamic sampling, overlong shaping and advantages (top_rl.driver.step_batch), the
metrics row (top_rl.observe.step_row), the samples on disk (top_rl.observe.samples), the eval (top_rl.eval.run)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from top_rl.run import checkpoint
from top_rl.run import faults
from top_rl.run import rng
from top_rl.run import lock as run_lock
from top_rl.driver.cluster import Cluster
from top_rl.driver.plan import RunPlan
from top_rl.driver import schedule as schedules
from top_rl.driver import step_batch
from top_rl.driver.rollouts import RolloutSource
from top_rl.config import RunConfig
from top_rl.rl import gate
from top_rl.observe.startup import StartupLog
from top_rl.observe import samples as saved_samples
from top_rl.observe import step_row
from top_rl.eval import run as eval_run
from top_rl.observe.tracking import Tracker


def save_checkpoint(run_dir: Path, cfg: RunConfig, step: int, position, cluster, task, run_id: str | None,
                    metrics_rows, behaviour: int | None, fault_plan) -> Path:
    """The step-`step` checkpoint (top_rl.run.checkpoint), filled here: every trainer rank writes its part of the trainer state into it,
    the driver its RNG, trainer rank 0 the policy as an HF checkpoint with the task's tokenizer beside it, the driver
    the run's state; committed atomically, then pruned to checkpoint.keep. `behaviour`: the version the first rollout
    not yet trained is generated under (a lagged schedule's, else None); `fault_plan`: the run plan's faults
    (test-only)."""
    with checkpoint.begin(run_dir, step, fault_plan) as writer:  # a full disk in any of these stops the run cleanly
        cluster.save_trainer_states([writer.trainer_dir] * len(cluster.trainers))
        writer.write_driver_state(rng.state())
        cluster.save_hf(writer.hf_dir)
        task.save_tokenizer(writer.hf_dir)
        writer.write_state(position, run_id, cfg.as_dict(), len(cluster.trainers), metrics_rows, behaviour)
        saved = writer.commit()
    checkpoint.prune(run_dir, cfg.checkpoint.keep)
    return saved


def _open_tracker(cleanup, run_dir: Path, cfg: RunConfig, state: dict | None) -> Tracker:
    """metrics.jsonl and wandb: a fresh run's, or the resumed run's continued from its checkpoint's rows."""
    start_step, _ = checkpoint.resume_point(state)
    return cleanup.enter_context(Tracker(str(run_dir), cfg.tracking, config=cfg.as_dict(),
                                         run_id=state["run_id"] if state else None,
                                         resume_from_step=start_step if state else None,
                                         checkpoint_rows=checkpoint.saved_metrics(state),
                                         checkpoint_name=Path(state["path"]).name if state else ""))


def _resume_driver(run_dir: Path, state: dict | None, start_step: int) -> None:
    """A resumed run's driver RNG as the run that never stopped had it after this step (restored after the tracker
    started, whatever it draws); the steps after the checkpoint write their samples again."""
    if state is not None:
        rng.restore(state["driver"]["rng"])
        saved_samples.drop_after(run_dir, start_step)


def _say_start(startup: StartupLog, run_dir: Path, cfg: RunConfig, start_step: int, state: dict | None) -> None:
    if start_step >= cfg.steps:
        print(f"[top-rl] {run_dir} is already at step {start_step} (steps={cfg.steps}): nothing to do", flush=True)
    else:
        resumed = f" (resumed from {Path(state['path']).name})" if state else ""
        startup.say(f"step {start_step + 1} starting{resumed}")


def run(cfg: RunConfig, ready, plan: RunPlan, startup: StartupLog) -> dict:
    """The run its checks passed (top_rl.cli.run runs them first: every refusal comes before Ray, wandb or any file
    write). `ready`: what they loaded (top_rl.preflight.Ready); `plan`: what the cluster places and starts, decided
    once; `startup`: the start-up lines, whose clock started with the checks."""
    run_dir = Path(cfg.run_dir)  # absolute from here on (preflight.config_values)
    rng.seed(cfg.seed)
    # One run per run_dir; SIGINT/SIGTERM/SIGHUP stop the run after a checkpointed step; a dead trainer stops it
    # naming the checkpoint; a full disk stops it in one line, before the tracker and Ray shut down.
    with faults.RunGuard(run_dir, plan.faults, cfg.checkpoint.enabled, cfg.cluster.stop_grace_s) as guard, \
            run_lock.RunLock(run_dir), \
            contextlib.ExitStack() as cleanup, faults.StopOnFullDisk(run_dir):
        state = ready.state_under_lock(cfg)  # None: a fresh run (which never overwrites checkpoints)
        cluster = Cluster(plan, startup)
        cleanup.callback(cluster.shutdown)
        guard.catch_signals()  # after Ray started (it installs a SIGTERM handler of its own)
        cluster.stop_check = guard.abandon_if_due  # one signal ends a step that outlasts cluster.stop_grace_s
        start_step, position = checkpoint.resume_point(state)
        source = RolloutSource(cluster, ready.task, cfg, position, ready.max_prompt_len)
        schedule = schedules.for_run(cluster, source, cfg, start_step)  # the order, by rollout.policy_lag
        if state is not None:  # each rank's weights, optimizer, RNG; the engines get the first rollout's version
            cluster.load_trainer_states(state["trainer"], schedule.version)
            schedule.resume(start_step)
        tracker = _open_tracker(cleanup, run_dir, cfg, state)
        saved_step = start_step  # the last checkpoint's step: each checkpoint keeps the rows logged after it
        wall, last = step_row.WallClock(checkpoint.saved_metrics(state)), {}
        _say_start(startup, run_dir, cfg, start_step, state)
        _resume_driver(run_dir, state, start_step)
        for step in range(start_step, cfg.steps):
            guard.step_started(step + 1)
            t0 = time.perf_counter()
            taken = schedule.take(step)  # the step's rollout, collected: every sample of the version expected
            scored = step_batch.score(source, cfg, taken)  # rewards (dynamic sampling, overlong), advantages
            # The trainer recomputes what the engine reported inside its training forward, and refuses to
            # step on a batch where it differs (top_rl.train.rl_step).
            report = schedule.train(step, scored.rl_batch(cfg, step + 1, taken.stamp))
            if report.verdict.message is not None:  # the trainer's verdict, whole
                gate.act(report.verdict, step + 1, cfg.top)
            timings = schedule.after_step(step, report, taken)  # the next version minted (and pushed, if due now)
            last = step_row.row(report, scored, taken, timings, cfg, ready.task, t0, wall, run_dir, cluster)
            last.update(eval_run.if_due(cluster, ready.eval_set, cfg, step + 1))  # under the weights just pushed
            # the step's generations on disk before its row: a resume writes them again
            sample_rows = saved_samples.save_if_due(run_dir, cfg.rollout, step + 1, scored, ready.task)
            # Log before checkpointing: a crash in between replays this step on resume, never loses its row.
            tracker.log(step + 1, last, samples=sample_rows)  # the first few samples also as a wandb table
            guard.step_logged(step + 1)
            if checkpoint.due(cfg.checkpoint, step + 1, cfg.steps, stopping=guard.stopping):
                # the data position and weight version of the first rollout not yet trained: a resume generates it
                save_checkpoint(run_dir, cfg, step + 1, schedule.checkpoint_position(), cluster, ready.task,
                                tracker.run_id, tracker.rows_since(saved_step), schedule.checkpoint_behaviour(step + 1),
                                plan.faults)
                saved_step = step + 1
            guard.step_done(step + 1)  # stops here after SIGINT/SIGTERM
    return last
