"""Keys the config no longer has because the run could not honour them (it refused or overwrote every other value):
a user who passes one gets one line naming it and what to do instead, not Hydra's "not in" error. A checkpoint
written before a key went keeps it in its state.json: a resume ignores it (top_rl.run.resume_compat)."""

from __future__ import annotations

REMOVED_KEYS = {
    "trainer.dtype": "the trainer computes in model.dtype (one compute dtype for engine and trainer under the TOP "
                     "contract); set model.dtype instead",
    "algo.loss.kl_coef": "the loop keeps no reference policy, so no KL penalty is computed (GRPO/DAPO-style runs "
                         "train without it); remove it",
    "algo.name": "GRPO is the one advantage estimator (rewards relative to the prompt's group); remove it",
    "rollout.sglang.enable_memory_saver": "cluster.gpu_handoff=true turns SGLang's memory saver on (the servers give "
                                          "their memory back while the trainer steps); set that instead",
}


def refusal(overrides) -> str | None:
    """The line refusing the first removed key among command-line `overrides` (key=value, +key=value, ~key), or None."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in REMOVED_KEYS:
            return f"invalid config: {key} was removed: {REMOVED_KEYS[key]}"
    return None
