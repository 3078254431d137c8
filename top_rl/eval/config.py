"""The run config's eval section (plain data: the run config imports it without loading torch)."""

from __future__ import annotations

from dataclasses import dataclass

from top_rl import contract


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


def errors(cfg) -> list[str]:
    """eval.* refusals (top_rl.config.validate), one line each, naming the key and the fix."""
    e, out = cfg.eval, []
    if e.every < 0:
        out.append(f"eval.every={e.every} must be >= 0 (0: no eval)")
    for key in ("n_samples", "max_prompts", "max_new_tokens"):
        v = getattr(e, key)
        if v is not None and v < 1:
            out.append(f"eval.{key}={v} must be >= 1" + ("" if key == "n_samples" else ", or null"))
    if e.temperature is not None and contract.temperature_refusal(e.temperature):
        out.append(f"eval.temperature={e.temperature} {contract.temperature_refusal(e.temperature)} (the eval samples "
                   "with the engines' seeded sampler; a low temperature such as 0.01 is near greedy)")
    if e.every > 0 and cfg.rollout.policy_lag:
        out.append(f"eval.every with rollout.policy_lag={cfg.rollout.policy_lag}: the next step's rollout is in flight when a step ends, and "
                   "the eval would share the engines with it; set rollout.policy_lag=0 or eval.every=0")
    return out
