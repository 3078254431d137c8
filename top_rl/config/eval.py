"""The run config's eval section (plain data: top_rl/eval/run.py evaluates by it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EvalConfig:
    every: int = 0  # evaluate after every K-th step (its row gets eval/*); 0: never
    # the eval data: task.path for the eval task (null: the training task's own path)
    path: str | None = None
    # the eval task's task.split where the task has one (gsm8k: test); null: the training task's
    split: str | None = None
    max_prompts: int | None = None  # the eval set's first N prompts (in dataset order); null: all of them
    n_samples: int = 1  # samples per prompt: eval/accuracy over all of them, eval/pass@k for k = 1, 2, 4, ... <= n
    # sampling temperature (null: rollout.temperature). Sampled, never greedy: the engines sample with TOP's seeded
    # sampler, which refuses temperature <= 1e-6 (a low one, e.g. 0.01, is near greedy and still seeded, so exact)
    temperature: float | None = None
    max_new_tokens: int | None = None  # the eval's response length limit (null: rollout.max_new_tokens)
