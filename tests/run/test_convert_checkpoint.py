"""Issue 53 item 5, old checkpoints: `top-rl-convert-checkpoint` rewrites a per-rank checkpoint (format 2) into format
3, which then resumes on another layout; a tampered one is refused by name and left as it was.

The old checkpoint is a real one: the uninterrupted CPU run's step-6 checkpoint (format 3) with its trainer state
written back the way top-rl before format 3 wrote it (each rank's torch.save of {"trainer": Trainer.state_dict(),
"rng": rng.state()}, the trainer having loaded that state), state.json's format 2 and a manifest of its own. Converting
it must give back the format-3 checkpoint it came from, bitwise (every DCP entry, trainer_state.json, each rank's RNG,
driver.pt and hf/)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from tests import rl_runs
from tests.rl_runs import BASE, STEPS

from top_rl.run import checkpoint, trainer_files
from top_rl.run import manifest as checkpoint_manifest
from top_rl.run.checkpoint import ResumeRefused

ROOT = Path(__file__).resolve().parents[2]


def _old_rank(rank, world, trainer_dir, arch, settings, keep, out):
    """What TrainerActor.save_checkpoint wrote before format 3, from a trainer that loaded `trainer_dir`."""
    from top_rl.run import dist_state, rng
    from top_rl.train import Trainer
    from top_rl.train.snapshots import PolicySnapshots

    trainer = Trainer(arch, settings)
    trainer.snapshots = PolicySnapshots(keep=keep)
    dist_state.load(trainer, trainer_dir)  # restores the RNG this rank saved too
    torch.save({"trainer": trainer.state_dict(), "rng": rng.state()}, Path(out) / f"trainer_rank{rank:03d}.pt")


def _to_format_2(ckpt: Path, **layout: int) -> None:
    """`ckpt`'s trainer state as per-rank shards of `layout` (default: its own), state.json format 2."""
    from top_rl.config.model import ComputeDtype
    from top_rl.model import family
    from top_rl.run import dist_state
    from top_rl.train import TrainerSettings
    from top_rl.train.parallel import spawn

    state = json.loads((ckpt / "state.json").read_text())
    state["config"]["trainer"].update(layout)
    state["world"] = 1
    for k in trainer_files.LAYOUT:
        state["world"] *= state["config"]["trainer"].get(k, 1)
    meta = dist_state.read_state(ckpt / "trainer")
    arch = type(family.config_from_dir(ckpt / "hf"))(**meta["model_config"])
    t = state["config"]["trainer"]
    settings = TrainerSettings(dtype=ComputeDtype(state["config"]["model"]["dtype"]), lr=t["lr"],
                               **{k: t[k] for k in trainer_files.LAYOUT})
    spawn(_old_rank, state["world"], str(ckpt / "trainer"), arch, settings, state["config"]["rollout"]["policy_lag"],
          str(ckpt))
    shutil.rmtree(ckpt / "trainer")
    (ckpt / "state.json").write_text(json.dumps({**state, "format": 2}, indent=2))
    (ckpt / checkpoint_manifest.NAME).unlink()
    checkpoint_manifest.write(ckpt)


@pytest.fixture(scope="module")
def old_run(tmp_path_factory) -> Path:
    """The baseline run with its last checkpoint in format 2 (module doc); the others removed."""
    run_dir = tmp_path_factory.mktemp("old") / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    for ckpt in checkpoint.complete_checkpoints(run_dir)[:-1]:
        shutil.rmtree(ckpt)
    _to_format_2(checkpoint.latest(run_dir))
    return run_dir


def _convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "top_rl.tools.convert_checkpoint", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)


def _copy(old_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    shutil.copytree(old_run, run_dir)
    return run_dir, checkpoint.latest(run_dir)


@pytest.mark.slow
def test_an_old_checkpoint_converts_to_the_format_3_one_it_came_from_bitwise(old_run, tmp_path):
    run_dir, ckpt = _copy(old_run, tmp_path)
    state = checkpoint.load_verified(ckpt, driver=False)
    assert state["format"] == 2 and (ckpt / "trainer_rank000.pt").is_file() and not (ckpt / "trainer").exists()
    out = _convert(f"run_dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{ckpt}: converted to format 3" in out.stdout and "loaded back bitwise" in out.stdout
    assert checkpoint.load_verified(ckpt)["format"] == 3  # its manifest recomputed: it verifies
    assert not (ckpt / "trainer_rank000.pt").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [ckpt.name]  # no .tmp or .old left
    assert rl_runs.state_hash(ckpt) == rl_runs.state_hash(rl_runs.final_checkpoint(rl_runs.baseline()))
    again = _convert(f"run_dir={run_dir}", f"step={STEPS}")
    assert again.returncode == 0 and "already format 3, nothing to do" in again.stdout


@pytest.mark.slow
@pytest.mark.parametrize("layout", [{"dp": 2}, {"pp": 2}])
def test_an_old_checkpoint_of_two_ranks_converts_bitwise(tmp_path, layout):
    """Shards of two DP ranks (each a whole replica) or two PP stages (each its layers): the converted trainer/
    holds every entry of the state they came from bitwise, and each rank's RNG as its shard held it."""
    from top_rl.run import dist_state

    run_dir = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    for ckpt in checkpoint.complete_checkpoints(run_dir)[:-1]:
        shutil.rmtree(ckpt)
    ckpt = checkpoint.latest(run_dir)
    original, rng0 = dist_state.read_full(ckpt / "trainer"), (ckpt / "trainer" / "rng_rank000.json").read_bytes()
    _to_format_2(ckpt, **layout)
    assert sorted(p.name for p in ckpt.glob("trainer_rank*.pt")) == ["trainer_rank000.pt", "trainer_rank001.pt"]
    out = _convert(f"run_dir={run_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    converted = dist_state.read_full(ckpt / "trainer")
    assert sorted(converted) == sorted(original)
    assert all(converted[k].dtype == original[k].dtype and torch.equal(converted[k], original[k]) for k in original)
    # one rank saved: both restored its RNG (rank r takes rank r mod 1's), so both shards hold it
    assert [(ckpt / "trainer" / f"rng_rank00{r}.json").read_bytes() for r in (0, 1)] == [rng0, rng0]
    assert dist_state.read_state(ckpt / "trainer")["layout"] == {**{"dp": 1, "tp": 1, "pp": 1, "cp": 1}, **layout}


def _reload_rank(rank, world, trainer_dir, arch, dtype, layout, out):
    from top_rl.run import dist_state
    from top_rl.train import Trainer, TrainerSettings
    from top_rl.train.snapshots import PolicySnapshots

    trainer = Trainer(arch, TrainerSettings(dtype=dtype, **layout))
    trainer.snapshots = PolicySnapshots(keep=0)
    dist_state.load(trainer, trainer_dir)
    dist_state.save(trainer, out)


@pytest.mark.slow
def test_a_converted_checkpoint_resumes_on_another_layout(old_run, tmp_path):
    """Refused on another layout before (naming the command); converted, two DP ranks load it and hold bitwise what
    it held (their save read back whole equals it), and the run resumes with trainer.dp=2 and trains its step."""
    from top_rl.cli import compose
    from top_rl.config.model import ComputeDtype
    from top_rl.model import family
    from top_rl.run import dist_state
    from top_rl.train.parallel import spawn

    run_dir, ckpt = _copy(old_run, tmp_path)
    args = [f"run_dir={run_dir}", *BASE, f"steps={STEPS + 1}", "resume=true", "resume_allow_changes=true",
            "trainer.dp=2"]
    with pytest.raises(ResumeRefused) as refused:
        checkpoint.prepare(run_dir, compose(args))
    assert f"convert them once with `top-rl-convert-checkpoint run_dir={run_dir.resolve()}`" in str(refused.value)
    assert _convert(f"run_dir={run_dir}").returncode == 0

    original = dist_state.read_full(ckpt / "trainer")
    arch = type(family.config_from_dir(ckpt / "hf"))(**dist_state.read_state(ckpt / "trainer")["model_config"])
    spawn(_reload_rank, 2, str(ckpt / "trainer"), arch, ComputeDtype.float32, {"dp": 2}, str(tmp_path / "dp2"))
    resharded = dist_state.read_full(tmp_path / "dp2")
    assert sorted(resharded) == sorted(original)
    assert all(resharded[k].dtype == original[k].dtype and torch.equal(resharded[k], original[k]) for k in original)

    out = rl_runs.run(run_dir, *BASE, f"steps={STEPS + 1}", "resume=true", "resume_allow_changes=true",
                      "trainer.dp=2", "cluster.num_cpus=3")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming from {ckpt}" in out.stdout and f"step {STEPS + 1} |" in out.stdout
    assert [r["step"] for r in rl_runs.rows(run_dir)] == list(range(1, STEPS + 2))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["a pickle that names code, manifest recomputed", "a flipped byte"])
def test_a_tampered_old_checkpoint_is_refused_by_name_and_left_untouched(old_run, tmp_path, how):
    run_dir, ckpt = _copy(old_run, tmp_path)
    shard = ckpt / "trainer_rank000.pt"
    if how == "a flipped byte":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        state = torch.load(shard, weights_only=False)
        torch.save({**state, "extra": subprocess.getoutput}, shard)  # a callable: what a payload names
        (ckpt / checkpoint_manifest.NAME).unlink()
        checkpoint_manifest.write(ckpt)
    before = rl_runs.tree_hash(run_dir / "checkpoints")
    out = _convert(f"run_dir={run_dir}")
    assert out.returncode == 1
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("top-rl-convert-checkpoint: ")
    assert f"{shard}: " in out.stderr
    assert ("subprocess.getoutput" in out.stderr and "top-rl loads no code" in out.stderr
            if how != "a flipped byte" else "changed after it was written" in out.stderr)
    assert rl_runs.tree_hash(run_dir / "checkpoints") == before
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [ckpt.name]


def test_the_refusal_names_a_command_the_package_installs(tmp_path):
    """The layout-change refusal of an old checkpoint names `top-rl-convert-checkpoint`, a console script of the
    package (pyproject), whose --help answers."""
    ckpt = rl_runs.fake_run(tmp_path)
    state = checkpoint.load_verified(ckpt, driver=False)
    one = {"dp": 1, "tp": 1, "pp": 1, "cp": 1}
    with pytest.raises(ResumeRefused) as refused:
        trainer_files.paths(ckpt, state, one, {**one, "tp": 2})
    text = str(refused.value)
    assert len(text.splitlines()) == 1 and f"`top-rl-convert-checkpoint run_dir={tmp_path.resolve()}`" in text
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["top-rl-convert-checkpoint"] == "top_rl.cli:convert_checkpoint_main"
    from top_rl import cli

    assert cli.convert_checkpoint_main(["--help"]) == 0


def test_what_cannot_be_converted_is_refused_in_one_line(tmp_path, capsys):
    from top_rl.tools import convert_checkpoint

    assert convert_checkpoint.main([f"run_dir={tmp_path}"]) == 1
    assert "holds no checkpoints/: not a top-rl run directory" in capsys.readouterr().err
    ckpt = rl_runs.fake_run(tmp_path / "run")
    assert convert_checkpoint.main([f"run_dir={tmp_path / 'run'}", "step=5"]) == 1
    assert "step=5: " in (err := capsys.readouterr().err) and "no complete checkpoint of that step (step_000002)" in err
    (ckpt / checkpoint_manifest.NAME).unlink()  # format 1: no manifest
    state = json.loads((ckpt / "state.json").read_text())
    (ckpt / "state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "format"}))
    before = rl_runs.tree_hash(ckpt)
    assert convert_checkpoint.main([f"run_dir={tmp_path / 'run'}"]) == 1
    assert "has no manifest.json (checkpoint format 1): it cannot be verified" in capsys.readouterr().err
    assert rl_runs.tree_hash(ckpt) == before
    old = ckpt.with_name(ckpt.name + ".old")
    ckpt.rename(old)  # a swap cut between its renames
    assert convert_checkpoint.main([f"run_dir={tmp_path / 'run'}"]) == 1
    assert f"rename it to {ckpt.name} first" in capsys.readouterr().err and old.is_dir()
