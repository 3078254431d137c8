"""Whether a checkpoint's run may be continued by this run's config (top_rl.run.checkpoint.prepare): the settings a
resume may change freely, those it takes from the checkpoint (never changed, even under resume_allow_changes=true),
the config diff a resume refuses or notes, and what in a verified state.json a resume cannot use."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from top_rl.config.removed import REMOVED_KEYS
from top_rl.kernels.plan import CHANGES_GRADIENTS, FastPaths

# Keys a resume may change freely: they do not enter any computed number.
RESUME_FREE_KEYS = {"steps", "run_dir", "resume", "resume_allow_changes", "dry_run", "checkpoint", "tracking",
                    "cluster",
                    "eval",  # the eval reads the weights, never changes them (top_rl/eval/run.py)
                    # fast paths that keep the forward's bits and the gradients (not plan.CHANGES_GRADIENTS')
                    *(f"top.fast_paths.{f.name}" for f in dataclasses.fields(FastPaths) if f.name not in CHANGES_GRADIENTS),
                    # where and how an SGLang engine runs and takes its weights (they arrive bitwise either way)
                    *(f"rollout.sglang.{k}" for k in (
                        "host", "port", "python", "log_path", "startup_timeout_s", "request_timeout_s", "max_retries",
                        "retry_backoff_s", "restart_on_failure", "validate_with_parser", "weights_dir",
                        "keep_weight_versions", "flattened_buckets", "weight_group_name",
                        "weight_sync", "bucket_mb")),  # the last two: recorded by runs before cluster.weight_transport
                    # where the trainer parks its optimizer state while the server generates: it comes back bitwise
                    # (mem_fraction_static=auto may turn it on or off anew on another card; the KV pool's size stays
                    # a change, refused: a smaller pool can retract requests)
                    "trainer.offload_during_rollout"}
# Keys whose value a resume takes from the checkpoint, so a change could not take effect: refused even under
# resume_allow_changes=true (every other change it allows is applied: rollout, algo, task, top, seed, and the
# trainer's optimizer settings, which top_rl.train.optim puts into the loaded optimizer).
RESUME_FROM_CHECKPOINT = {"model.": "the policy's weights and architecture are the checkpoint's",
                          "trainer.seed": "the trainer's RNG state is the checkpoint's"}


class ResumeRefused(ValueError):
    pass


_LAYOUT_KEYS = ("dp", "tp", "pp", "cp")


def state_refusal(ckpt: Path, state: dict) -> str | None:
    """What in state.json a resume cannot use, naming the file and key (None: nothing). A manifest is a checksum, not
    a signature: a hand-edited state.json with its manifest recomputed verifies, and a world of 0 or a broken data
    position would otherwise fail only once Ray and the trainers had started."""
    where = Path(ckpt) / "state.json"
    for key in ("step", "format", "behaviour_version"):  # JSON gives "6", 6.5 or 10**24 as readily as 6
        value = state.get(key, 1)
        if type(value) is not int or not 0 <= value < 2 ** 63:
            return f"{where}: {key}={value!r} must be a whole number >= 0 (below 2**63)"
    if not isinstance(state.get("config"), dict):
        return f"{where}: config={state.get('config')!r} must be the resolved config the checkpoint was written with"
    trainer = state["config"].get("trainer") if isinstance(state.get("config"), dict) else None
    if not isinstance(trainer, dict):
        return f"{where}: config.trainer is missing (the resolved config the checkpoint was written with)"
    layout = {k: trainer.get(k, 1) for k in _LAYOUT_KEYS}
    bad = [k for k, v in layout.items() if type(v) is not int or v < 1]
    if bad:
        return f"{where}: config.trainer.{bad[0]}={layout[bad[0]]!r} must be a whole number >= 1"
    ranks = layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"]
    if type(state["world"]) is not int or state["world"] != ranks:
        return (f"{where}: world={state['world']!r}, but its trainer layout {layout} has {ranks} rank(s), one "
                "trainer_rankNNN.pt each")
    position = state.get("position")
    if not isinstance(position, dict) or any(type(position.get(k)) is not int or position[k] < 0
                                             for k in ("epoch", "index")):
        return f"{where}: position={position!r} must be {{'epoch': E, 'index': I}}, whole numbers >= 0 (the data position)"
    if state.get("run_id") is not None and not isinstance(state["run_id"], str):
        return f"{where}: run_id={state['run_id']!r} must be a string or null (the wandb run id)"
    return None


def check_compatible(saved: dict, current: dict, allow_changes: bool) -> list[str]:
    """Config keys that differ between the checkpoint and this run (outside RESUME_FREE_KEYS)."""
    diffs: list[str] = []
    newer: list[str] = []  # settings added to top-rl after the checkpoint was written

    def walk(a, b, prefix):
        for k in sorted(set(a) | set(b)):
            key = f"{prefix}{k}"
            if key in RESUME_FREE_KEYS or key in REMOVED_KEYS:  # a removed key held its refused or overwritten value
                continue
            va, vb = a.get(k, "<absent>"), b.get(k, "<absent>")
            if isinstance(va, dict) and isinstance(vb, dict):
                walk(va, vb, key + ".")
            elif k not in a:  # a new setting keeps the old behaviour by default: a notice, not a change
                newer.append(f"{key}={vb!r}")
            elif va != vb:
                diffs.append(f"{key}: checkpoint {va!r} -> now {vb!r}")

    walk(saved, current, "")
    trainer = current.get("trainer", {})
    if (trainer.get("lr_schedule", "constant") != "constant" and trainer.get("lr_decay_steps") is None
            and saved.get("steps") != current.get("steps")):  # `steps` is free, except where it is the lr's horizon
        updates = saved.get("steps", 0) * saved.get("algo", {}).get("updates_per_rollout", 1)
        diffs.append(f"steps: checkpoint {saved.get('steps')!r} -> now {current.get('steps')!r} (with "
                     f"trainer.lr_decay_steps=null the lr decays over the run's steps; set trainer.lr_decay_steps="
                     f"{updates} to keep the checkpoint's schedule)")
    if newer:
        print("[top-rl] the checkpoint predates these settings; resuming with their values: " + ", ".join(newer),
              flush=True)
    fixed = [f"{d} ({why})" for d in diffs for key, why in RESUME_FROM_CHECKPOINT.items()
             if d.split(":", 1)[0] == key or key.endswith(".") and d.startswith(key)]
    if fixed and allow_changes:
        raise ResumeRefused("resume refused: these settings come from the checkpoint on resume, so a change cannot "
                            "take effect (resume_allow_changes=true does not cover them):\n  " + "\n  ".join(fixed)
                            + "\nRestore them, or start a new run (another run_dir=) to train with them.")
    if diffs and not allow_changes:
        raise ResumeRefused(
            "resume refused: these settings differ from the checkpoint and would break determinism:\n  "
            + "\n  ".join(diffs) + "\nRestore them, or pass resume_allow_changes=true to resume anyway."
        )
    if diffs:
        print("[top-rl] resuming with changed settings (resume_allow_changes=true):\n  " + "\n  ".join(diffs),
              flush=True)
    return diffs
