"""The RL loop, top to bottom: prompts -> rollout -> rewards -> advantages -> trainer log-probs -> gate
-> policy update -> weight sync -> metrics -> checkpoint. Synchronous; each stage is one call on the
cluster, so rollout and training can later overlap without restructuring."""

from __future__ import annotations

import contextlib
import time
from functools import partial
from pathlib import Path

import torch

from top_rl import checkpoint, faults, kernels, preflight, prompts, run_lock
from top_rl.cluster import Cluster
from top_rl.config import RunConfig
from top_rl.model import hf_state_dict
from top_rl.rl import gate, grpo_advantages, policy_loss
from top_rl.rl.losses import pack
from top_rl.rollout.base import SamplingParams
from top_rl.tracking import Tracker
from top_rl.train import TrainSequence


def sample_seed(run_seed: int, step: int, index: int) -> int:
    """Each sample's sampling seed: a pure function of (run seed, step, position in the step)."""
    return (run_seed * 1_000_003 + step) * 65_537 + index


def grpo_loss_fn(old, advantages, loss_cfg, total_tokens, total_samples, lps, indices):
    """Loss of one micro-batch: PPO-clip on the sampler-path log-probs, normalised by the whole step."""
    new, lengths = pack([lp.float() for lp in lps])
    denom = total_tokens if loss_cfg.loss_agg == "token_mean" else total_samples
    loss, metrics = policy_loss(new, torch.cat([old[i] for i in indices]), advantages[indices], lengths,
                                loss_cfg, denominator=denom)
    return loss, metrics


def run(cfg: RunConfig) -> dict:
    run_dir = Path(cfg.run_dir)
    # Every refusal comes before Ray, wandb or any file write (a refused run leaves no run_dir behind).
    ready = preflight.check(cfg)
    task, max_prompt_len = ready.task, ready.max_prompt_len
    backend = cfg.top.kernels if cfg.top.enabled else "plain"
    kernels.set_backend(backend)
    checkpoint.seed_process(cfg.seed)
    # One run per run_dir; SIGINT/SIGTERM stop the run after a checkpointed step; a dead trainer stops it
    # naming the checkpoint.
    with run_lock.RunLock(run_dir), faults.RunGuard(run_dir) as guard, contextlib.ExitStack() as cleanup:
        state = preflight.confirm_under_lock(cfg, ready)  # None: a fresh run (which never overwrites checkpoints)
        policy = cfg.model.build(task.vocab_size, task.eos_token_id)
        cluster = Cluster(cfg.cluster, backend, cfg.rollout, cfg.trainer, policy.cfg, hf_state_dict(policy),
                          sglang_context={"trainer_attention_backend": cfg.top.attention_backend,
                                          "model_path": cfg.model.path, "top": cfg.top.enabled})
        cleanup.callback(cluster.shutdown)
        guard.catch_signals()  # after Ray started (it installs a SIGTERM handler of its own)
        if state is not None:  # engines get the resumed weights before the first rollout
            cluster.load_trainer_states(state["trainer"])  # each rank: its weights, optimizer and RNG
            cluster.sync_weights()
        start_step, position = checkpoint.resume_point(state)
        tracker = cleanup.enter_context(Tracker(str(run_dir), cfg.tracking, config=cfg.as_dict(),
                                                run_id=state["run_id"] if state else None,
                                                resume_from_step=start_step if state else None))
        params = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, (task.eos_token_id,))
        n = cfg.rollout.n_samples
        gate_cfg = gate.GateConfig(enabled=cfg.top.enabled, on_violation=cfg.top.on_violation)
        gate_temperature = None if cfg.rollout.logprob_source == "prefill" else cfg.rollout.temperature
        last = {}
        if start_step >= cfg.steps:
            print(f"[top-rl] {run_dir} is already at step {start_step} (steps={cfg.steps}): nothing to do", flush=True)
        if state is not None:  # the driver's RNG as the run that never stopped had it after this step
            checkpoint.set_rng_state(state["driver"]["rng"])
        for step in range(start_step, cfg.steps):
            t0 = time.perf_counter()
            items, position, prompt_counts = prompts.next_prompts(task, cfg.rollout.prompts_per_step, cfg.seed,
                                                                  position, max_prompt_len, cfg.rollout.on_long_prompt)
            group_items = [it for it in items for _ in range(n)]  # sample i belongs to prompt i // n
            prompt_ids = [it.prompt_ids for it in group_items]
            samples = cluster.generate(prompt_ids, [sample_seed(cfg.seed, step, i) for i in range(len(prompt_ids))],
                                       params)
            t_rollout = time.perf_counter() - t0
            rewards = torch.tensor([task.reward(it, task.response_text(s.response_ids))
                                    for it, s in zip(group_items, samples)])
            advantages = grpo_advantages(rewards, n, cfg.algo.normalize_std)

            # Recompute exactly what the engine reported, and refuse to train on a step where it differs.
            scored = [TrainSequence.from_sample(s, gate_temperature) for s in samples]
            trainer_lps = cluster.trainer_call("logprobs", scored)
            rollout_lps = [torch.tensor(s.logprobs, dtype=lp.dtype) for s, lp in zip(samples, trainer_lps)]
            parity = gate.check(trainer_lps, rollout_lps, step, gate_cfg, str(run_dir / "parity"),
                                sample_ids=[it.uid for it in group_items],
                                tokens=[s.tokens for s in scored], metadata={"run_dir": str(run_dir)})

            # The loss sees the distribution tokens were drawn from: the sampler path at the temperature.
            old = [torch.tensor(s.sample_logprobs, dtype=torch.float32) for s in samples]
            batch = [TrainSequence.from_sample(s, cfg.rollout.temperature) for s in samples]
            loss_fn = partial(grpo_loss_fn, old, advantages, cfg.algo.loss, sum(map(len, old)), len(old))
            t1 = time.perf_counter()
            train_metrics = cluster.train_step(batch, loss_fn)
            cluster.sync_weights()
            t_train = time.perf_counter() - t1

            last = {
                **(parity.to_dict(prefix="train/") if parity is not None else {}),
                "rollout/reward_mean": float(rewards.mean()),
                "rollout/response_len_mean": sum(len(s.response_ids) for s in samples) / len(samples),
                **prompt_counts,
                "data/rows_skipped": getattr(task, "skipped", 0),
                **{f"train/{k}": v for k, v in train_metrics.items() if isinstance(v, (int, float))},
                "perf/rollout_time": t_rollout,
                "perf/train_time": t_train,
                "perf/step_time": time.perf_counter() - t0,
            }
            # Log before checkpointing: a crash in between replays this step on resume, never loses its row.
            tracker.log(step + 1, last)
            if checkpoint.due(cfg.checkpoint, step + 1, cfg.steps) or guard.stopping:
                checkpoint.save(run_dir, cfg, step + 1, position, cluster, tracker.run_id, task)
            guard.step_done(step + 1)  # stops here after SIGINT/SIGTERM
    return last
