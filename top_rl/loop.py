"""The RL loop, top to bottom: prompts -> rollout -> rewards -> advantages -> trainer log-probs -> gate
-> policy update -> weight sync -> checkpoint -> metrics. Synchronous; each stage is one call on the
cluster, so rollout and training can later overlap without restructuring."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch

from top_rl import checkpoint, kernels
from top_rl.cluster import Cluster
from top_rl.config import RunConfig
from top_rl.model import hf_state_dict
from top_rl.rl import gate, grpo_advantages, policy_loss
from top_rl.rl.losses import pack
from top_rl.rollout.base import SamplingParams
from top_rl.tasks import get_task
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
    run_dir.mkdir(parents=True, exist_ok=True)
    backend = cfg.top.kernels if cfg.top.enabled else "plain"
    kernels.set_backend(backend)
    task = get_task(cfg.task["name"], cfg.task)
    state = checkpoint.load_latest(run_dir) if cfg.resume else None
    if state is not None:
        checkpoint.check_compatible(state["config"], cfg.as_dict(), cfg.resume_allow_changes)
        print(f"[top-rl] resuming from {state['path']} (step {state['step']})", flush=True)
    elif cfg.resume:
        print(f"[top-rl] resume=true but {run_dir} has no complete checkpoint: starting at step 0", flush=True)
    policy = cfg.model.build(task.vocab_size, task.eos_token_id)
    cluster = Cluster(cfg.cluster, backend, cfg.rollout, cfg.trainer, policy.cfg, hf_state_dict(policy))
    if state is not None:  # engines get the resumed weights before the first rollout
        cluster.load_trainer_states(state["trainer"])
        cluster.sync_weights()
    start_step, position = checkpoint.resume_point(state)
    tracker = Tracker(str(run_dir), cfg.tracking, config=cfg.as_dict(),
                      run_id=state["run_id"] if state else None, resume_from_step=start_step if state else None)
    params = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, (task.eos_token_id,))
    n = cfg.rollout.n_samples
    gate_cfg = gate.GateConfig(enabled=cfg.top.enabled, on_violation=cfg.top.on_violation)
    gate_temperature = None if cfg.rollout.logprob_source == "prefill" else cfg.rollout.temperature
    last = {}
    try:
        for step in range(start_step, cfg.steps):
            t0 = time.perf_counter()
            items, position = task.batch(cfg.rollout.prompts_per_step, cfg.seed, position)
            prompts = [it.prompt_ids for it in items for _ in range(n)]
            samples = cluster.generate(prompts, [sample_seed(cfg.seed, step, i) for i in range(len(prompts))], params)
            t_rollout = time.perf_counter() - t0
            rewards = torch.tensor([task.reward(items[i // n], task.response_text(s.response_ids))
                                    for i, s in enumerate(samples)])
            advantages = grpo_advantages(rewards, n, cfg.algo.normalize_std)

            # Recompute exactly what the engine reported, and refuse to train on a step where it differs.
            scored = [TrainSequence.from_sample(s, gate_temperature) for s in samples]
            trainer_lps = cluster.trainer_call("logprobs", scored)
            rollout_lps = [torch.tensor(s.logprobs, dtype=lp.dtype) for s, lp in zip(samples, trainer_lps)]
            parity = gate.check(trainer_lps, rollout_lps, step, gate_cfg, str(run_dir / "parity"),
                                sample_ids=[it.uid for it in items for _ in range(n)],
                                tokens=[s.tokens for s in scored], metadata={"run_dir": str(run_dir)})

            # The loss sees the distribution tokens were drawn from: the sampler path at the temperature.
            old = [torch.tensor(s.sample_logprobs, dtype=torch.float32) for s in samples]
            batch = [TrainSequence.from_sample(s, cfg.rollout.temperature) for s in samples]
            loss_fn = partial(grpo_loss_fn, old, advantages, cfg.algo.loss, sum(map(len, old)), len(old))
            t1 = time.perf_counter()
            train_metrics = cluster.train_step(batch, loss_fn)
            cluster.sync_weights()
            t_train = time.perf_counter() - t1

            if checkpoint.due(cfg.checkpoint, step + 1, cfg.steps):
                checkpoint.save(run_dir, cfg, step + 1, position, cluster, tracker.run_id)
            last = {
                **(parity.to_dict(prefix="train/") if parity is not None else {}),
                "rollout/reward_mean": float(rewards.mean()),
                "rollout/response_len_mean": sum(len(s.response_ids) for s in samples) / len(samples),
                **{f"train/{k}": v for k, v in train_metrics.items() if isinstance(v, (int, float))},
                "perf/rollout_time": t_rollout,
                "perf/train_time": t_train,
                "perf/step_time": time.perf_counter() - t0,
            }
            tracker.log(step + 1, last)
    finally:
        tracker.close()
        cluster.shutdown()
    return last
