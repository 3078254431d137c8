"""The RL loop, top to bottom: prompts -> rollout -> rewards -> advantages -> the trainer's RL step (its
training forward is the gate's recompute; the gate is decided before the optimizer step) -> weights pushed
by the trainer to the engines -> metrics -> checkpoint. The driver holds no weights and computes no log-probs.

rollout.policy_lag=0: synchronous, each stage one call on the cluster. rollout.policy_lag=1: step k collects its
rollout (generated under weight version k, one update behind the trainer's k + 1), has the trainer push version
k + 1, submits step k + 1's rollout under it, and trains while it generates: the push never meets a rollout in flight,
and the trainer proves each batch against its own copy of the version that sampled it (top_rl.train.snapshots). A
checkpoint holds that copy and the data position before the rollout in flight, which a resume generates again
under the same version (a rollout is a pure function of prompts, seeds and weights)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch

from top_rl import preflight
from top_rl.run import checkpoint
from top_rl.run import faults
from top_rl.tasks import prompts
from top_rl.run import rng
from top_rl.run import lock as run_lock
from top_rl.driver.cluster import Cluster
from top_rl import kernels
from top_rl.atomic import write_file
from top_rl.config import RunConfig
from top_rl.rl import dynamic_sampling, gate, grpo_advantages, overlong, step_stats, versions
from top_rl.rl.batch import RLBatch, RLSample
from top_rl.rollout.base import SamplingParams, sample_seed
from top_rl.observe.startup import StartupLog
from top_rl.observe import samples as saved_samples
from top_rl.eval import run as eval_run
from top_rl.observe.tracking import Tracker


def rollout_metrics(samples, seconds: float) -> dict:
    """What any engine's rollout gave: response lengths, the share cut by max_new_tokens, generated tokens per second
    of the rollout call (the generate wall time seen by the driver, Ray included)."""
    lengths = [len(s.response_ids) for s in samples]
    return {"rollout/response_len_mean": sum(lengths) / len(lengths), "rollout/response_len_max": max(lengths),
            "rollout/response_len_min": min(lengths),
            "rollout/truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
            "perf/rollout_tokens_per_s": sum(lengths) / seconds if seconds > 0 else float("nan")}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _overlap(cluster, pending) -> float:
    """Seconds of the rollout hidden behind the trainer's step: the engines' generate time (the slowest engine's,
    over its waves) less the time the driver waited for it."""
    return max(0.0, cluster.generate_seconds() - pending.waited_s)


def _kernel_metrics(run_dir: Path, reports: list[dict]) -> dict:
    """Every actor's kernel report (the paths its ops took, its fallbacks) to run_dir/kernels.json; the counts as
    step metrics."""
    write_file(run_dir / "kernels.json", lambda tmp: Path(tmp).write_text(json.dumps(reports, indent=1) + "\n"))
    return kernels.step_metrics(reports)


def _wall_time_at(saved_lines: list[str]) -> float:
    """perf/wall_time of the checkpoint's last row (0 for a fresh run, or a checkpoint from before the metric)."""
    for line in reversed(saved_lines):
        try:
            value = json.loads(line).get("perf/wall_time")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def behaviour_version(step: int, policy_lag: int) -> int:
    """The weight version step `step`'s batch (0-based) is generated under: the trainer's (step + 1) synchronously;
    one behind it with a lag, except the first step's, which nothing precedes (version 1, the initial policy)."""
    return step + 1 if policy_lag == 0 else max(step, 1)


def save_checkpoint(run_dir: Path, cfg: RunConfig, step: int, position, cluster, task, run_id: str | None,
                    metrics_rows, behaviour: int | None, fault_plan) -> Path:
    """The step-`step` checkpoint (top_rl.run.checkpoint), filled here: every trainer rank writes its part of the trainer state into it,
    the driver its RNG, trainer rank 0 the policy as an HF checkpoint with the task's tokenizer beside it, the driver
    the run's state; committed atomically, then pruned to checkpoint.keep. `behaviour`: the version the rollout in
    flight is generated under (rollout.policy_lag, else None); `fault_plan`: the run plan's faults (test-only)."""
    with checkpoint.begin(run_dir, step, fault_plan) as writer:  # a full disk in any of these stops the run cleanly
        cluster.save_trainer_states([writer.trainer_dir] * len(cluster.trainers))
        writer.write_driver_state(rng.state())
        cluster.save_hf(writer.hf_dir)
        task.save_tokenizer(writer.hf_dir)
        writer.write_state(position, run_id, cfg.as_dict(), len(cluster.trainers), metrics_rows, behaviour)
        saved = writer.commit()
    checkpoint.prune(run_dir, cfg.checkpoint.keep)
    return saved


class _Rollout:
    """A step's rollout: its prompts' items (one per sample), their counts, the submitted call. `round_`: dynamic
    sampling's extra round of the step (0: the step's own rollout, its ordinary seeds)."""

    def __init__(self, cluster, task, cfg: RunConfig, step: int, position, max_prompt_len: int, params, round_=0):
        n = cfg.rollout.n_samples
        items, self.position, self.prompt_counts = prompts.next_prompts(
            task, cfg.rollout.prompts_per_step, cfg.seed, position, max_prompt_len, cfg.rollout.on_long_prompt)
        self.group_items = [it for it in items for _ in range(n)]  # sample i belongs to prompt i // n
        batch = len(self.group_items)
        self.pending = cluster.submit_generate(
            [it.prompt_ids for it in self.group_items],
            [sample_seed(cfg.seed, step, dynamic_sampling.round_index(round_, i, batch)) for i in range(batch)], params)


def _fill_dynamic(cluster, task, cfg: RunConfig, step: int, rollout: _Rollout, samples, scores, behaviour: int,
                  max_prompt_len: int, params):
    """DAPO's dynamic sampling (top_rl/rl/dynamic_sampling.py): the step's batch of groups with a signal, from its
    rollout and as many extra rounds as it takes (each drawn from the data position the last left, under the weights
    the step's rollout was generated with: nothing is pushed in between). Returns the batch, the data position after
    every round, the rounds' prompt counts summed, and the filling's metrics."""
    position, counts = rollout.position, dict(rollout.prompt_counts)

    def draw(round_: int) -> dynamic_sampling.Round:
        nonlocal position
        extra = _Rollout(cluster, task, cfg, step, position, max_prompt_len, params, round_)
        position = extra.position
        for k, v in extra.prompt_counts.items():
            counts[k] += v
        got = cluster.collect(extra.pending)
        version = versions.check_batch([s.weight_version for s in got], extra.pending.version, step + 1)
        if version != behaviour:
            raise versions.VersionMismatch(f"weight version check at step {step + 1}: dynamic sampling's round "
                                           f"{round_} was generated under weight version {version}, the step's "
                                           f"rollout under {behaviour}", step + 1)
        return dynamic_sampling.Round(extra.group_items, got, prompts.rewards(task, extra.group_items,
                                                                              [s.response_ids for s in got]))

    ds = cfg.algo.dynamic_sampling
    filled = dynamic_sampling.fill(dynamic_sampling.Round(rollout.group_items, samples, scores), draw,
                                   cfg.rollout.prompts_per_step, cfg.rollout.n_samples, ds.max_rounds)
    return filled, position, counts


def run(cfg: RunConfig) -> dict:
    startup = StartupLog()  # the start-up lines' clock starts with the checks
    # Every refusal comes before Ray, wandb or any file write (a refused run leaves no run_dir behind).
    ready = preflight.check(cfg)
    run_dir = Path(cfg.run_dir)  # absolute from here on (preflight.config_values)
    plan = preflight.run_plan(cfg, ready)  # what the cluster places and starts, decided once
    task, max_prompt_len = ready.task, ready.max_prompt_len
    rng.seed(cfg.seed)
    # One run per run_dir; SIGINT/SIGTERM/SIGHUP stop the run after a checkpointed step; a dead trainer stops it
    # naming the checkpoint; a full disk stops it in one line, before the tracker and Ray shut down.
    with faults.RunGuard(run_dir, plan.faults, cfg.checkpoint.enabled, cfg.cluster.stop_grace_s) as guard, \
            run_lock.RunLock(run_dir), \
            contextlib.ExitStack() as cleanup, faults.StopOnFullDisk(run_dir):
        state = preflight.confirm_under_lock(cfg, ready)  # None: a fresh run (which never overwrites checkpoints)
        cluster = Cluster(plan, startup)
        cleanup.callback(cluster.shutdown)
        guard.catch_signals()  # after Ray started (it installs a SIGTERM handler of its own)
        cluster.stop_check = guard.abandon_if_due  # one signal ends a step that outlasts cluster.stop_grace_s
        lag = cfg.rollout.policy_lag
        start_step, position = checkpoint.resume_point(state)
        if state is not None:  # engines get the resumed weights before the first rollout
            cluster.load_trainer_states(state["trainer"], start_step + 1)  # each rank: weights, optimizer, RNG
            # under a lag, the version the rollout in flight at the checkpoint was generated under: generated again
            cluster.push_weights(version=behaviour_version(start_step, lag))
        tracker = cleanup.enter_context(Tracker(str(run_dir), cfg.tracking, config=cfg.as_dict(),
                                                run_id=state["run_id"] if state else None,
                                                resume_from_step=start_step if state else None,
                                                checkpoint_rows=checkpoint.saved_metrics(state),
                                                checkpoint_name=Path(state["path"]).name if state else ""))
        saved_step = start_step  # the last checkpoint's step: each checkpoint keeps the rows logged after it
        params = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, (task.eos_token_id,))
        n = cfg.rollout.n_samples
        last = {}
        if start_step >= cfg.steps:
            print(f"[top-rl] {run_dir} is already at step {start_step} (steps={cfg.steps}): nothing to do", flush=True)
        if state is not None:  # the driver's RNG as the run that never stopped had it after this step
            rng.restore(state["driver"]["rng"])
            saved_samples.drop_after(run_dir, start_step)  # the steps after the checkpoint write theirs again
        next_rollout = None  # policy_lag=1: the next step's rollout, generating while this step trains
        t_start, wall_start = time.perf_counter(), _wall_time_at(checkpoint.saved_metrics(state))
        for step in range(start_step, cfg.steps):
            guard.step_started(step + 1)
            if step == start_step:
                startup.say(f"step {step + 1} starting" + (f" (resumed from {Path(state['path']).name})" if state else ""))
            t0 = time.perf_counter()
            rollout = next_rollout or _Rollout(cluster, task, cfg, step, position, max_prompt_len, params)
            position = rollout.position
            samples = cluster.collect(rollout.pending)
            t_rollout = time.perf_counter() - t0
            overlap = _overlap(cluster, rollout.pending) if lag else 0.0  # before the next rollout starts
            # Every sample from the version the rollout was submitted under, the one this step expects.
            behaviour = versions.check_batch([s.weight_version for s in samples], rollout.pending.version, step + 1)
            if behaviour != behaviour_version(step, lag):  # the loop's own order, checked: never trained past
                raise versions.VersionMismatch(f"weight version check at step {step + 1}: the rollout was submitted "
                                               f"under weight version {behaviour}, expected version "
                                               f"{behaviour_version(step, lag)}", step + 1)
            engine_metrics = cluster.rollout_metrics()  # the engines' own: generation, re-score, server peaks
            group_items, prompt_counts, shaping = rollout.group_items, rollout.prompt_counts, {}
            scores = prompts.rewards(task, group_items, [s.response_ids for s in samples])
            if cfg.algo.dynamic_sampling.enabled:  # off: nothing below runs, the rows are the plain run's
                filled, position, prompt_counts = _fill_dynamic(cluster, task, cfg, step, rollout, samples, scores,
                                                                behaviour, max_prompt_len, params)
                group_items, samples, scores = filled.items, filled.samples, filled.scores
                shaping.update(filled.metrics)
                t_rollout = time.perf_counter() - t0  # every round's generation
            if cfg.algo.overlong.enabled:  # after the filter, which judges the task's reward (dynamic_sampling.py)
                scores, penalties = overlong.shape_with_metrics(scores, [len(s.response_ids) for s in samples],
                                                                cfg.rollout.max_new_tokens, cfg.algo.overlong.buffer,
                                                                cfg.algo.overlong.penalty_factor)
                shaping.update(penalties)
            rewards = torch.tensor(scores)
            advantages = grpo_advantages(rewards, n, cfg.algo.normalize_std)

            # The trainer recomputes what the engine reported inside its training forward, and refuses to
            # step on a batch where it differs (top_rl.train.rl_step).
            batch = RLBatch([RLSample.from_rollout(s, float(a), it.uid)
                             for s, a, it in zip(samples, advantages, group_items)],
                            cfg.rollout.temperature, cfg.rollout.logprob_source, step + 1, cfg.algo.updates_per_rollout,
                            behaviour_version=behaviour if lag else None)
            t_push = 0.0
            next_rollout = None
            if lag:  # the trainer's version to the engines, now that nothing generates; then the next rollout
                t2 = time.perf_counter()
                if cluster.weight_version != step + 1:
                    cluster.push_weights(version=step + 1)
                t_push = time.perf_counter() - t2
                if step + 1 < cfg.steps:
                    next_rollout = _Rollout(cluster, task, cfg, step + 1, position, max_prompt_len, params)
            t_handoff = 0.0
            if cfg.cluster.gpu_handoff:  # the servers give the GPU to the trainer for its step (top_rl.driver.cluster)
                t_handoff = _timed(cluster.release_engine_memory)
            t1 = time.perf_counter()
            report = cluster.rl_step(batch)
            t_train = time.perf_counter() - t1
            if report.verdict.message is not None:  # the trainer's verdict, whole
                gate.act(report.verdict, step + 1, cfg.top)
            if cfg.cluster.gpu_handoff:  # ... and take it back, empty: the push below restores their weights
                t_handoff += _timed(cluster.resume_engine_memory)
            if not lag:
                t2 = time.perf_counter()
                cluster.push_weights(version=report.policy_version + int(report.updated))
                t_push = time.perf_counter() - t2
            lagged = {}
            if lag:
                lagged = {"train/policy_lag": report.policy_version - behaviour, "train/behaviour_version": behaviour,
                          "perf/overlap_s": overlap}

            last = {
                **report.parity,
                "rollout/reward_mean": float(rewards.mean()),
                **step_stats.reward_stats(rewards, n),
                **step_stats.advantage_stats(advantages),
                **step_stats.entropy_estimate([s.sample_logprobs for s in samples]),
                **rollout_metrics(samples, t_rollout),
                **engine_metrics,
                **prompt_counts,
                **shaping,
                "data/rows_skipped": getattr(task, "skipped", 0),
                **{f"train/{k}": v for k, v in report.losses.items()},
                "train/step": report.trainer_step,
                "train/micro_batches": report.micro_batches,
                "train/tokens": report.tokens,
                "train/lr": cfg.trainer.lr if report.lr is None else report.lr,  # the schedule's (rl/lr_schedule.py)
                **{f"perf/trainer/{k}_s": v for k, v in report.timings.items()},
                **{f"perf/trainer/gpu_{k}_gib": v for k, v in report.gpu_memory.items()},
                "perf/rollout_time": t_rollout,
                "perf/train_time": t_train,
                "perf/weight_push_time": t_push,
                **({"perf/gpu_handoff_time": t_handoff} if cfg.cluster.gpu_handoff else {}),
                **lagged,
                "perf/step_time": time.perf_counter() - t0,
                # the trainer's tokens (prompts and responses) per second of its step
                "perf/trained_tokens_per_s": report.tokens / t_train if t_train > 0 else float("nan"),
                # seconds since the run first started, across resumes (the checkpoint's last row carries it on)
                "perf/wall_time": wall_start + time.perf_counter() - t_start,
                **_kernel_metrics(run_dir, cluster.kernel_reports()),
            }
            if ready.eval_set is not None and eval_run.due(cfg.eval.every, step + 1):  # the weights just pushed
                last.update(eval_run.run(cluster, ready.eval_set, cfg.seed, step + 1))
            sample_rows = []
            if saved_samples.due(cfg.rollout.save_samples_every, step + 1):  # before the row: a resume rewrites it
                sample_rows = saved_samples.rows(
                    step + 1, group_items, samples, [it.prompt for it in group_items],
                    [task.response_text(s.response_ids) for s in samples], rewards, advantages, n,
                    cfg.rollout.save_samples_rows)
                saved_samples.write(run_dir, step + 1, sample_rows)
            # Log before checkpointing: a crash in between replays this step on resume, never loses its row.
            tracker.log(step + 1, last, samples=sample_rows)  # the first few samples also as a wandb table
            guard.step_logged(step + 1)
            if checkpoint.due(cfg.checkpoint, step + 1, cfg.steps, stopping=guard.stopping):
                # the data position before the rollout in flight (policy_lag=1): a resume generates it again
                save_checkpoint(run_dir, cfg, step + 1, position, cluster, task, tracker.run_id,
                                tracker.rows_since(saved_step), behaviour_version(step + 1, lag) if lag else None,
                                plan.faults)
                saved_step = step + 1
            guard.step_done(step + 1)  # stops here after SIGINT/SIGTERM
    return last
