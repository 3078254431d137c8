"""The run config's eval section's refusals (its dataclass: top_rl/config/eval.py)."""

from __future__ import annotations

from top_rl import contract
from top_rl.config.eval import EvalConfig  # noqa: F401 - also eval.config.EvalConfig


def errors(cfg) -> list[str]:
    """eval.* refusals (top_rl.config_checks.validate), one line each, naming the key and the fix."""
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
