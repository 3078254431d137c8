"""RL building blocks: advantages, the PPO-clip loss, parity metrics and the TOP gate.

Layout convention shared by every function here: a batch of responses is *ragged*, so per-token
quantities are passed as a list of 1-D tensors, one per sample (response tokens only, already
shifted so entry t is log p(response[t] | prefix)). Functions that run on the hot path also accept
the packed form (one flat 1-D tensor + ``lengths``) through :func:`top_rl.rl.losses.concat_ragged`.
"""

import importlib

# Lazy: importing one module of the package (the config checks import dynamic_sampling, overlong, lr_schedule) loads
# none of the others.
_EXPORTS = {
    "grpo_advantages": "advantages",
    "concat_ragged": "losses", "policy_loss": "losses",
    "ParityViolation": "gate", "check": "gate",
    "ParityMetrics": "metrics", "parity_metrics": "metrics", "train_rollout_logprob_abs_diff": "metrics",
    "ess_ratio": "metrics", "train_rollout_kl": "metrics", "first_difference": "metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"top_rl.rl.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'top_rl.rl' has no attribute {name!r}")
