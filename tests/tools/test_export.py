"""Issue 5: `top-rl-export` writes a Hugging Face checkpoint that `transformers` loads, whose
next-token distributions equal the trainer's (fp32, 1e-5 relative) and whose tokenizer is the task's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import rl_runs

from top_rl.tools.export import main as export_main

transformers = pytest.importorskip("transformers")

PREFIXES = [[1, 5, 14, 7, 17], [1, 8, 14, 8, 17, 6], [1, 4, 14, 4, 17, 2, 9]]  # "<bos>1+3=", ...


def _trainer_log_softmax(ckpt: Path, model_dir: Path) -> torch.Tensor:
    """The trainer, rebuilt from the checkpoint's shard: log p(v | prefix) for every v, per prefix."""
    from top_rl.model import Qwen3Config
    from top_rl.train import Trainer, TrainerConfig, TrainSequence

    state = json.loads((ckpt / "state.json").read_text())
    trainer = Trainer(Qwen3Config.from_dir(model_dir), TrainerConfig(**state["config"]["trainer"]))
    from top_rl.run import dist_state

    dist_state.load(trainer, ckpt / "trainer")
    vocab = trainer.model_cfg.vocab_size
    batch = [TrainSequence(p + [v], len(p)) for p in PREFIXES for v in range(vocab)]
    return torch.cat(trainer.logprobs(batch)).view(len(PREFIXES), vocab)


@pytest.mark.slow
def test_export_loads_in_transformers_and_matches_the_trainer(tmp_path, capsys):
    run_dir = rl_runs.baseline()
    out = tmp_path / "hf"
    assert export_main([f"run_dir={run_dir}", f"out={out}"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == rl_runs.STEPS and Path(info["checkpoint"]).name == f"step_{rl_runs.STEPS:06d}"
    assert {"config.json", "model.safetensors", "tokenizer.json", "top_rl_export.json"} <= {p.name for p in out.iterdir()}

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tok("1+3=")["input_ids"] == PREFIXES[0][1:] and tok.eos_token == "<eos>"

    with torch.no_grad():
        hf = torch.stack([torch.log_softmax(model(torch.tensor([p])).logits[0, -1].float(), -1) for p in PREFIXES])
    trainer = _trainer_log_softmax(rl_runs.final_checkpoint(run_dir), out)
    assert hf.shape == trainer.shape
    torch.testing.assert_close(hf, trainer, rtol=1e-5, atol=0)


def test_export_refusals(tmp_path, capsys):
    assert export_main([f"run_dir={tmp_path}", f"out={tmp_path / 'o'}"]) == 2
    assert "has no complete checkpoint" in capsys.readouterr().err
    assert export_main(["run_dir=x"]) == 2
    assert "out= is required" in capsys.readouterr().err
    assert export_main(["run_dir=x", "out=y", "bogus=1"]) == 2
    assert "unexpected argument 'bogus=1'" in capsys.readouterr().err


@pytest.mark.slow
def test_export_console_script_replaces_only_an_earlier_export(tmp_path, capsys):
    run_dir = rl_runs.baseline()
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    cmd = [sys.executable, "-c", "import sys; from top_rl.cli import export_main; sys.exit(export_main())",
           f"run_dir={run_dir}", f"out={out}", "step=5"]
    for extra in ([], ["overwrite=true"]):  # a directory that is not an export is never replaced
        res = subprocess.run(cmd + extra, capture_output=True, text=True)
        assert res.returncode == 2 and "holds keep.txt and no top_rl_export.json" in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    assert export_main(cmd[3:]) == 0  # an empty directory is written into
    assert export_main(cmd[3:-1] + ["step=6"]) == 2
    assert "holds an earlier export; pass overwrite=true to replace it" in capsys.readouterr().err
    assert export_main(cmd[3:-1] + ["step=6", "overwrite=true"]) == 0
    assert json.loads((out / "top_rl_export.json").read_text())["step"] == 6


def test_export_refuses_an_out_that_is_holds_or_lies_inside_the_run(tmp_path, capsys):
    """Issue 24: `out=RUN overwrite=true` deleted the run it exported. Every out that overlaps the run (after
    symlinks), its checkpoints, or another run is refused before anything is touched."""
    run_dir = tmp_path / "runs" / "r"
    ckpt = rl_runs.fake_run(run_dir)
    other = tmp_path / "other_run"
    rl_runs.fake_run(other)
    (tmp_path / "link_to_run").symlink_to(run_dir)
    elsewhere = tmp_path / "ckpt_store"  # the run's checkpoints/ is a symlink to storage outside the run_dir
    linked_run = tmp_path / "linked_run"
    linked_run.mkdir()
    (run_dir / "checkpoints").rename(elsewhere)
    (run_dir / "checkpoints").symlink_to(elsewhere)
    (linked_run / "checkpoints").symlink_to(elsewhere)
    cases = [
        (run_dir, run_dir, "is the run_dir"),
        (run_dir, run_dir / "export", "lies inside the run_dir"),
        (run_dir, ckpt / "hf", "lies inside its checkpoints"),  # ckpt: the path under the symlink
        (run_dir, tmp_path / "runs", "contains the run_dir"),
        (run_dir, tmp_path / "link_to_run", "is the run_dir"),
        (run_dir, elsewhere, "is its checkpoints"),
        (run_dir, elsewhere / "step_000002", "lies inside its checkpoints"),
        (linked_run, tmp_path, "contains the run_dir"),
        (run_dir, other, "holds a top-rl run or checkpoint"),
    ]
    before = {p: rl_runs.tree_hash(p) for p in (tmp_path / "runs", other, elsewhere)}
    for src, out, why in cases:
        code = export_main([f"run_dir={src}", f"out={out}", "overwrite=true"])
        err = capsys.readouterr().err
        assert code == 2 and why in err and "nothing was exported" in err, (out, err)
        assert {p: rl_runs.tree_hash(p) for p in before} == before, out
    # an out outside every run still exports, also over an earlier export with overwrite=true
    out = tmp_path / "exported"
    for _ in range(2):
        assert export_main([f"run_dir={run_dir}", f"out={out}", "overwrite=true"]) == 0
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "top_rl_export.json"]
    # a staging directory that would be the run: out=<run_dir minus ".export-tmp">
    staged_run = tmp_path / "s.export-tmp"
    rl_runs.fake_run(staged_run)
    assert export_main([f"run_dir={staged_run}", f"out={tmp_path / 's'}"]) == 2
    assert "staging directory is the run_dir" in capsys.readouterr().err
    assert (staged_run / "metrics.jsonl").exists()
