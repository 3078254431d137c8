"""`top-rl-convert-checkpoint run_dir=RUN [step=N]`: rewrite checkpoints from before format 3 into format 3.

A format-2 checkpoint holds the trainer's state as one `trainer_rankNNN.pt` per rank (torch.save of that rank's
Trainer.state_dict() and RNG), which loads only on the layout that wrote it; format 3 holds it as torch DCP under
global names (`trainer/`, top_rl.run.dist_state), which loads into any DP/TP/CP/PP layout. The conversion is done by
the code that reads and writes each format, not by a second copy of the layout rules: the saved layout's ranks are
started here as local CPU processes (gloo), each builds the trainer the run built (the checkpoint's model config and
trainer settings), loads its own shard as a resume of that layout would (top_rl.run.safe_load: weights_only, after
the pickle scan), and all save together with dist_state.save, recording the RNG states the shard holds. Then each
rank builds the trainer again, loads the new `trainer/` back and must hold bitwise what the shard held (weights,
fp32 masters, AdamW moments and step counts, weight versions and their snapshots, the step), or nothing is replaced.

Safety: the run's lock is held throughout (no run writes the run_dir meanwhile); only a checkpoint that verifies
against its manifest, whose every pickle is tensors and plain data, is read (a tampered one is refused by name and
left as it is); the new checkpoint is written beside the old one as `step_N.tmp` (its other files copied: a
checkpoint holds no hard links), gets its own manifest and is verified, and replaces the old one by the checkpoint writer's
rename (top_rl.run.checkpoint.Writer.commit). A failure before that rename removes the `.tmp` and leaves the old
checkpoint untouched. A format-1 checkpoint (no manifest) cannot be verified, so it is
not converted. Costs: the saved layout's ranks on this machine's CPU, each holding its shard twice (the loaded
trainer and the one that checks it), and the checkpoint's size again on disk until the swap.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from top_rl.run import checkpoint, trainer_files
from top_rl.run.manifest import CheckpointInvalid
from top_rl.tools.args import Arg, KeyValueCli, UsageError

CLI = KeyValueCli("top-rl-convert-checkpoint", "Rewrite a run's checkpoints from before format 3 (one "
                  "trainer_rankNNN.pt per rank: their layout only) into format 3 (trainer/: any layout).", [
    Arg("run_dir", "the run directory (top-rl's run_dir=)", required=True),
    Arg("step", "the checkpoint's step (default: every checkpoint of the run from before format 3)", int),
])


class ConvertError(ValueError):
    pass


def _settings(config: dict):
    """The TrainerSettings the run built its trainer with, from the checkpoint's resolved config."""
    from top_rl.config.model import ComputeDtype
    from top_rl.config.trainer import TrainerConfig, TrainerSettings

    saved = config.get("trainer", {})
    fields = {f.name: saved[f.name] for f in dataclasses.fields(TrainerConfig) if f.name in saved}
    if "betas" in fields:
        fields["betas"] = tuple(fields["betas"])
    dtype = config.get("model", {}).get("dtype")
    return TrainerSettings.of(TrainerConfig(**fields), dtype=ComputeDtype(dtype) if dtype else None)


def _trainer(arch, settings, keep: int):
    from top_rl.train import Trainer
    from top_rl.train.snapshots import PolicySnapshots

    trainer = Trainer(arch, settings)
    trainer.snapshots = PolicySnapshots(keep=keep)
    return trainer


def _first_difference(a, b) -> str | None:
    """The first state of trainer `b` that is not bitwise trainer `a`'s, or None."""
    import torch

    def same(x, y) -> bool:
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape and torch.equal(x.cpu(), y.cpu()))
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        return x == y

    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    checks = [("the weights", pa, pb), ("the optimizer state", a.optimizer.named_state(), b.optimizer.named_state()),
              ("the step", a.step, b.step), ("the weight version", a.snapshots.current, b.snapshots.current),
              ("the held weight versions", a.snapshots.held, b.snapshots.held)]
    for what, x, y in checks:
        if isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys():
            bad = next((k for k in x if not same(x[k], y[k])), None)
            if bad is not None:
                return f"{what} ({bad})"
        elif not same(x, y):
            return what
    return None


def convert_rank(rank: int, world: int, shards: list[str], out: str, arch, settings, keep: int, version: int):
    """One rank of the saved layout (top_rl.train.parallel.spawn): its shard into `out` (format 3), then checked by
    loading it back (module doc). Raises naming what differs."""
    from top_rl.run import dist_state, safe_load

    shard = safe_load.load(shards[rank], map_location="cpu")
    saved = shard["trainer"]
    trainer = _trainer(arch, settings, keep)
    if saved["model_config"] != dataclasses.asdict(trainer.model_cfg):
        raise ValueError(f"{shards[rank]} holds a trainer for another model than its checkpoint's hf/config.json")
    trainer.load_state_dict(saved)  # the layout's own check: a shard of another layout is refused by it
    if saved.get("policy_versions") is None:  # a shard from before weight versions were recorded (as a resume sets)
        trainer.snapshots.current = version
    dist_state.save(trainer, out, rng_state=shard["rng"])
    back = _trainer(arch, settings, keep)
    dist_state.load(back, out)
    differs = _first_difference(trainer, back)
    if differs is not None:
        raise ValueError(f"rank {rank}: {differs} loaded back from the converted trainer/ differs from "
                         f"{Path(shards[rank]).name}")


def _run_ranks(ckpt: Path, state: dict, out: Path) -> None:
    from top_rl.model import family
    from top_rl.run import safe_load
    from top_rl.train.parallel import spawn

    config, world = state["config"], state["world"]
    shards = [str(ckpt / trainer_files.legacy_shard(r)) for r in range(world)]
    model_config = safe_load.load(shards[0], map_location="cpu")["trainer"]["model_config"]
    arch = type(family.config_from_dir(ckpt / "hf"))(**model_config)  # the family from hf/, the shape the trainer had
    keep = int(config.get("rollout", {}).get("policy_lag", 0))
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the ranks run on the CPU (gloo), whatever wrote the checkpoint
    try:
        spawn(convert_rank, world, shards, str(out), arch, _settings(config), keep, state["step"] + 1)
    except Exception as e:  # noqa: BLE001 - a rank's failure (its traceback is on stderr): one line
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        raise ConvertError(f"{ckpt}: not converted ({lines[-1].strip()[:400] if lines else type(e).__name__}); "
                           "the checkpoint is unchanged") from None
    finally:
        if hidden is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden


def _copy(src: Path, dest: Path) -> None:
    """A copy, not a hard link: verification refuses a file with a second name (top_rl.run.file_tree)."""
    from top_rl.run import file_tree

    dest.parent.mkdir(parents=True, exist_ok=True)
    with file_tree.open_regular(src) as f, open(dest, "xb") as out:  # never through a link
        shutil.copyfileobj(f, out, 8 << 20)


def convert(run_dir: Path, ckpt: Path) -> str:
    """Rewrite checkpoint `ckpt` of `run_dir` into format 3 (module doc; the caller holds the run lock). Returns the
    line to print. CheckpointInvalid (CheckpointUnsafe) names a file that fails verification; ConvertError the rest."""
    from top_rl.run import manifest

    if not manifest.has_manifest(ckpt):
        raise ConvertError(f"{ckpt} has no manifest.json (checkpoint format 1): it cannot be verified, so it is not "
                           "converted; resume it on its own layout, and the checkpoints that run writes load anywhere")
    state = checkpoint.load_verified(ckpt)  # the manifest, every pickle scanned: nothing in it runs code
    if not trainer_files.is_legacy(state):
        return f"{ckpt}: already format {state.get('format')}, nothing to do"
    why = checkpoint.state_refusal(ckpt, state)
    if why:
        raise ConvertError(f"{why}: not converted; the checkpoint is unchanged")
    writer = checkpoint.begin(run_dir, state["step"])  # step_N.tmp, what interrupted writes left removed
    shards = {trainer_files.legacy_shard(r) for r in range(state["world"])}
    converted = {**json.loads((ckpt / "state.json").read_text(encoding="utf-8")), "format": checkpoint.FORMAT}
    try:
        with writer:
            for name in manifest.files(ckpt):
                if name not in shards | {"state.json"}:
                    _copy(ckpt / name, writer.tmp / name)
            _run_ranks(ckpt, state, Path(writer.trainer_dir))
            (writer.tmp / "state.json").write_text(json.dumps(converted, indent=2), encoding="utf-8")
        try:
            trainer_files.check(writer.tmp, converted, state["world"], load=True)
        except CheckpointInvalid as e:
            raise ConvertError(f"{ckpt}: the converted trainer state fails its check ({e}); the checkpoint is "
                               "unchanged") from None
    except BaseException:
        shutil.rmtree(writer.tmp, ignore_errors=True)  # no half-converted copy left beside the untouched original
        raise
    writer.commit()  # the manifest, fsync, and the rename over the old checkpoint
    checkpoint.load_verified(ckpt)
    return (f"{ckpt}: converted to format {checkpoint.FORMAT} (trainer/, {state['world']} rank(s) of "
            f"{ {k: state['config']['trainer'].get(k, 1) for k in trainer_files.LAYOUT} } loaded back bitwise); "
            "it now resumes on any layout")


def _targets(run_dir: Path, step: int | None) -> list[Path]:
    found = checkpoint.complete_checkpoints(run_dir)
    if step is not None:
        chosen = [p for p in found if checkpoint.step_of(p) == step]
        if not chosen:
            raise ConvertError(f"step={step}: {run_dir} has no complete checkpoint of that step "
                               f"({', '.join(p.name for p in found) or 'none'})")
        return chosen
    if not found:
        raise ConvertError(f"run_dir={run_dir} has no complete checkpoint")
    return found


def main(argv: list[str]) -> int:
    from top_rl.run.lock import RunDirLocked, RunLock

    try:
        args = CLI.parse(argv)
        if args is None:
            return 0
        run_dir = Path(args.run_dir).resolve()
        if not (run_dir / "checkpoints").is_dir():
            raise ConvertError(f"run_dir={args.run_dir} holds no checkpoints/: not a top-rl run directory")
        with RunLock(run_dir):
            for old in sorted((run_dir / "checkpoints").glob(f"{checkpoint.STEP_PREFIX}*.old")):
                if not old.with_suffix("").exists():  # a swap cut between its two renames: the only copy
                    raise ConvertError(f"{old} is a checkpoint whose replacement was interrupted, and its step has no "
                                       f"other copy: rename it to {old.with_suffix('').name} first; nothing converted")
            for ckpt in _targets(run_dir, args.step):
                print(convert(run_dir, ckpt), flush=True)
    except UsageError as e:
        print(f"{CLI.prog}: {e}\n{CLI.usage()}", file=sys.stderr)
        return 2
    except (ConvertError, CheckpointInvalid, RunDirLocked) as e:  # CheckpointUnsafe too: named, left untouched
        print(f"{CLI.prog}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
