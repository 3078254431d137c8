"""The trainer's files in a checkpoint: checked before a resume loads them, and handed to the ranks.

Format 3 (state.json "format": 3): `trainer/`, torch DCP keyed by global parameter names, written by every rank
together (top_rl.run.dist_state): it loads into any DP/TP/CP/PP layout. Its index (`trainer/.metadata`, a pickle)
and every record it points at are read without running code (top_rl.run.dcp_safe), each rank's RNG is JSON.
Formats 1 and 2 (top-rl before resharding): one `trainer_rankNNN.pt` per rank, a torch.save pickle read with
weights_only after top_rl.run.safe_load names what it holds; they still resume, on the layout they were written with
only, and `top-rl-convert-checkpoint` rewrites a format-2 one into format 3 (top_rl/tools/convert_checkpoint.py).
driver.pt (the driver's RNG) is a torch.save pickle in every format, checked the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from top_rl.run.manifest import CheckpointInvalid, CheckpointUnsafe

TRAINER_DIR = "trainer"
LAYOUT = ("dp", "tp", "pp", "cp")
STATE = "trainer_state.json"  # in trainer/: step, weight versions, layout, model config (rank 0)
STATE_FORMAT = 1


def rng_file(rank: int) -> str:
    """In trainer/: rank `rank`'s RNG states (top_rl.run.rng.to_json)."""
    return f"rng_rank{rank:03d}.json"


def convert_command(ckpt: Path) -> str:
    """The command that rewrites the run's checkpoints before format 3 into format 3
    (top_rl/tools/convert_checkpoint.py; pyproject's [project.scripts] names it)."""
    import shlex

    return f"top-rl-convert-checkpoint run_dir={shlex.quote(str(Path(ckpt).resolve().parent.parent))}"


def legacy_shard(rank: int) -> str:
    return f"trainer_rank{rank:03d}.pt"


def is_legacy(state: dict) -> bool:
    fmt = state.get("format", 1)  # a hand-edited non-number is state_refusal's to name: read as this format here
    return type(fmt) is int and fmt < 3


def _pickles(ckpt: Path, names: list[str]) -> None:
    from top_rl.run import safe_load

    for name in names:  # read without running: a checkpoint that would run code is never loaded (safe_load)
        try:
            found = safe_load.unsafe_globals(ckpt / name)
        except Exception as e:  # noqa: BLE001 - not a readable torch file: name it, never a traceback
            raise CheckpointInvalid(ckpt, name, f"unreadable ({type(e).__name__}: {e})") from None
        if found:
            raise CheckpointUnsafe(ckpt, name, f"holds Python objects other than tensors and plain data "
                                   f"({', '.join(sorted(found))}): top-rl loads no code from a checkpoint")


def check(ckpt: Path, state: dict, world: int, load: bool) -> None:
    """Every trainer file (and driver.pt) the checkpoint's state.json implies is there; with `load` (a resume), each
    is also read as a resume would load it, without running anything: CheckpointUnsafe for one that would run code,
    CheckpointInvalid for one that is missing or unreadable."""
    from top_rl.run import dcp_safe, rng

    if is_legacy(state):
        names = [legacy_shard(r) for r in range(world)]
    else:
        names = [f"{TRAINER_DIR}/{n}" for n in (dcp_safe.METADATA, STATE)]
        names += [f"{TRAINER_DIR}/{rng_file(r)}" for r in range(world)]
    for name in names + ["driver.pt"]:
        if not (ckpt / name).is_file():
            raise CheckpointInvalid(ckpt, name, "missing")
    if not load:
        return
    if is_legacy(state):
        _pickles(ckpt, names + ["driver.pt"])
        return
    _pickles(ckpt, ["driver.pt"])
    bad = dcp_safe.refusal(ckpt / TRAINER_DIR)
    if bad is not None:
        name, why, unsafe = bad
        raise (CheckpointUnsafe if unsafe else CheckpointInvalid)(ckpt, f"{TRAINER_DIR}/{name}", why)
    for name in names[1:]:
        try:
            value = json.loads((ckpt / name).read_text(encoding="utf-8"))
            why = rng.refusal(rng.from_json(value)) if "rng_rank" in name else _state_refusal(value, world)
        except Exception as e:  # noqa: BLE001 - any way it fails: unreadable, named
            why = f"{type(e).__name__}: {e}"
        if why:
            raise CheckpointInvalid(ckpt, name, f"unreadable ({why})")


def _state_refusal(meta, world: int) -> str | None:
    if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT or type(meta.get("world")) is not int \
            or meta["world"] < 1:
        return f"not a format-{STATE_FORMAT} trainer state"
    return None


def paths(ckpt: Path, state: dict, saved: dict, now: dict) -> list[str]:
    """What each trainer rank of this run loads (absolute: an actor's cwd is not the driver's): trainer/ for every
    rank, or (formats 1-2) rank r's own shard. `saved`, `now`: the trainer layouts (dp, tp, pp, cp). A layout change
    is refused for a format-1/2 checkpoint in one line, and noted for one in format 3."""
    from top_rl.run.resume_compat import ResumeRefused

    ranks = now["dp"] * now["tp"] * now["pp"] * now["cp"]
    if is_legacy(state):
        if saved != now:
            raise ResumeRefused(
                f"{ckpt} holds per-rank trainer shards (trainer_rankNNN.pt, written by top-rl before checkpoint "
                f"format 3) for {saved}; they load only on that layout: convert them once with "
                f"`{convert_command(ckpt)}` (then any layout loads them), or resume with that layout")
        return [str((ckpt / legacy_shard(r)).resolve()) for r in range(state["world"])]
    if saved != now:
        print(f"[top-rl] the trainer layout changes from {saved} to {now}: the checkpoint's weights and optimizer "
              "state load bitwise into it, but the steps that follow reduce gradients in another order, so they are "
              "not bitwise the uninterrupted run's", flush=True)
    return [str((ckpt / TRAINER_DIR).resolve())] * ranks
