"""`top-rl-export run_dir=RUN out=DIR [step=N] [overwrite=true]`: a Hugging Face checkpoint of a run.

Design: every checkpoint already carries the policy as a Hugging Face checkpoint (`step_N/hf/`: config.json,
safetensors, the task's tokenizer), written from the weights the trainer exports to the engines: full
tensors under HF names, TP shards gathered and pipeline stages joined by the trainer itself. So export is
a copy of that directory: it needs no trainer, no process group and no knowledge of the run's TP/PP
layout, and it works on any machine that can read the run directory. `transformers`'
`AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load the result.
The weights are the compute-dtype values the trainer and engines compute with (fp32 embedding and norms).
Only the regular files of a checkpoint that verifies are copied, each opened without following a link; where the
copy may go and what `overwrite=true` may replace is export_target.py's to decide.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

from top_rl.run import checkpoint, file_tree
from top_rl.run import manifest as checkpoint_manifest
from top_rl.run.manifest import CheckpointInvalid, CheckpointUnsafe
from top_rl.tools import export_target
from top_rl.tools.args import Arg, KeyValueCli, UsageError
from top_rl.tools.export_target import ExportError

CLI = KeyValueCli("top-rl-export", "Copy a run's checkpoint (its Hugging Face `hf/` directory) to a directory that "
                  "transformers loads.", [
    Arg("run_dir", "the run directory (top-rl's run_dir=)", required=True),
    Arg("out", "the directory to write", required=True),
    Arg("step", "the checkpoint's step (default: the latest complete checkpoint)", int),
    Arg("overwrite", f"replace `out` if it holds a previous export (only that: a directory holding nothing but the "
        f"files its {export_target.MARKER} lists)", bool, False),
])


def _overlap(a: Path, b: Path) -> str | None:
    """How `a` relates to `b` (both resolved): "is", "lies inside", "contains", or None."""
    if a == b:
        return "is"
    if a.is_relative_to(b):
        return "lies inside"
    if b.is_relative_to(a):
        return "contains"
    return None


def _looks_like_a_run(path: Path) -> bool:
    """A top-rl run_dir or a checkpoint: what overwrite=true must never delete."""
    return ((path / "checkpoints").is_dir() or (path / "metrics.jsonl").exists() or (path / "run.lock").exists()
            or (path / "state.json").is_file() and (path / "manifest.json").is_file())


def _refuse_overlap(run_dir: Path, out: Path, out_real: Path, ckpt: Path | None = None) -> None:
    """`out` is replaced as a whole: it must not be, hold or sit inside the run it is exported from, its
    checkpoints (wherever symlinks put them) or another run. Paths are resolved first."""
    protected = [("the run_dir", run_dir), ("its checkpoints", run_dir / "checkpoints")] + \
        ([("the checkpoint exported", ckpt)] if ckpt is not None else [])
    for what, path in protected:
        if not path.exists():
            continue
        # out's staging sibling is written and removed too: it must not be the run either
        for target, name in ((out_real, f"out={out}"), (export_target.staging(out_real).resolve(),
                                                         f"out={out}'s staging directory")):
            how = _overlap(target, path.resolve())
            if how is not None:
                raise ExportError(f"{name} {how} {what} ({path.resolve()}): exporting there would overwrite the run; "
                                  "pick an out= outside the run_dir; nothing was exported")
    if out_real.is_dir() and _looks_like_a_run(out_real):
        raise ExportError(f"out={out} holds a top-rl run or checkpoint (checkpoints/, metrics.jsonl, run.lock or "
                          "state.json + manifest.json): export never replaces one; pick another out=; nothing was "
                          "exported")


def _checkpoint(run_dir: Path, step: int | None) -> tuple[Path, dict]:
    """The checkpoint to export and its state, verified against its manifest. Without `step`: the newest one
    that verifies (each newer one that fails is named on stderr); with `step`: that one, or a refusal."""
    found = checkpoint.complete_checkpoints(run_dir)
    if not found:
        raise ExportError(f"{run_dir} has no complete checkpoint (looked in {run_dir / 'checkpoints'})")
    if step is None:
        ckpt, state, failed = checkpoint.newest_verified(run_dir, driver=False)
        unsafe = [e for e in failed if isinstance(e, CheckpointUnsafe)]
        if unsafe:  # changed by someone: stop, never quietly export an older one
            raise ExportError(f"{unsafe[0]}. Nothing was exported; find out where that checkpoint came from, and "
                              f"export an earlier one with step=N, or the newest once it is removed")
        if failed:
            print(f"top-rl-export: checkpoints that fail verification:{checkpoint.describe_failed(failed)}",
                  file=sys.stderr)
        if ckpt is None:
            raise ExportError(f"no checkpoint in {run_dir} verifies; nothing was exported")
        return ckpt, state
    by_step = {checkpoint.step_of(p): p for p in found}
    if step not in by_step:
        raise ExportError(f"{run_dir} has no complete checkpoint at step {step}; it has steps {sorted(by_step)}")
    try:
        return by_step[step], checkpoint.load_verified(by_step[step], driver=False)
    except CheckpointUnsafe as e:
        raise ExportError(f"checkpoint step {step} fails verification: {e}. Nothing was exported; find out where that "
                          "checkpoint came from, or export an earlier one with step=N") from None
    except CheckpointInvalid as e:
        raise ExportError(f"checkpoint step {step} fails verification: {e}; nothing was exported") from None


def _copy(src: Path, dst: Path) -> None:
    """One verified file, read without following a link (verification found none; O_NOFOLLOW keeps it so). The copy
    keeps at most the source's permissions (a file readable by its owner only is not exported readable by all)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with file_tree.open_regular(src) as f_in, open(dst, "xb") as f_out:
        mode = stat.S_IMODE(os.fstat(f_in.fileno()).st_mode) & stat.S_IMODE(os.fstat(f_out.fileno()).st_mode)
        os.fchmod(f_out.fileno(), mode)
        shutil.copyfileobj(f_in, f_out, 8 << 20)


def export(run_dir: str | Path, out: str | Path, step: int | None = None, overwrite: bool = False) -> dict:
    run_dir, out = Path(run_dir), Path(out)
    out_real = export_target.real_out(out)
    ckpt, state = _checkpoint(run_dir, step)  # reads only
    _refuse_overlap(run_dir, out, out_real, ckpt)  # before any write: a refused export touches nothing
    src = ckpt / "hf"
    if not (src / "config.json").is_file():
        raise ExportError(f"{ckpt} has no hf/ directory (written by an older top-rl): resume the run for one step "
                          "to write a checkpoint that has it")
    names = [n.removeprefix("hf/") for n in checkpoint_manifest.files(ckpt) if n.startswith("hf/")]  # verified
    old_out, old_tmp = export_target.replaceable(out, out_real, overwrite)
    info = {"written_by": "top-rl-export", "run_dir": str(run_dir.resolve()), "checkpoint": str(ckpt.resolve()),
            "step": state["step"], "wandb_run_id": state.get("run_id"), "top": state["config"].get("top"),
            "files": names}
    tmp = export_target.staging(out_real)
    made = replacing = False
    try:
        if old_tmp is not None:
            export_target.remove(tmp, old_tmp)
        tmp.mkdir(parents=True)  # not exist_ok: from here on the directory is ours
        made = True
        # the marker first: a staging directory a crash leaves is then known as ours (export_target)
        (tmp / export_target.MARKER).write_text(json.dumps(info, indent=2))
        for name in names:
            _copy(src / name, tmp / name)
        if old_out is not None:
            replacing = True
            export_target.remove(out_real, old_out)
        tmp.rename(out_real)  # the directory appears complete or not at all
    except OSError as e:
        if made:
            shutil.rmtree(tmp, ignore_errors=True)
        was = " (the earlier export there is partly removed)" if replacing else ""
        raise ExportError(f"writing {e.filename or tmp}: {e.strerror or e}; nothing was exported to out={out}{was}") \
            from None
    return {"out": str(out), **info}


def main(argv: list[str]) -> int:
    try:
        args = CLI.parse(argv)
        if args is None:  # --help
            return 0
        info = export(args.run_dir, args.out, args.step, args.overwrite)
    except UsageError as e:
        print(f"top-rl-export: {e}\n{CLI.usage()}", file=sys.stderr)
        return 2
    except ExportError as e:
        print(f"top-rl-export: {e}", file=sys.stderr)
        return 2
    except CheckpointInvalid as e:  # the checkpoint changed between its verification and the copy
        print(f"top-rl-export: {e}; nothing was exported", file=sys.stderr)
        return 2
    except OSError as e:  # an unreadable run_dir or checkpoint: named, never a traceback
        print(f"top-rl-export: {e.filename or ''}: {e.strerror or e}; nothing was exported", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0
