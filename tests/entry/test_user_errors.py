"""Issue 24 (6c): a user error at any entry point (`top-rl`, `dry_run=true` included, `top-rl-export`,
`top-rl-parity-probe`, `python -m top_rl.tools.score`) is one line naming the key or file and the fix, with a non-zero
exit and no Python traceback: a wrong key, a bad value, a missing or malformed file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env)


def _one_line(out: subprocess.CompletedProcess, rc: int, prefix: str, *parts: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == rc and len(lines) == 1 and lines[0].startswith(prefix), out.stderr[-3000:]
    assert all(p in lines[0] for p in parts), lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    (d / "bad_json").mkdir()
    (d / "bad_json" / "config.json").write_text("{bad json\n")
    (d / "no_weights").mkdir()
    (d / "no_weights" / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 18, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": True, "eos_token_id": 2}))
    (d / "zero_hidden").mkdir()
    (d / "zero_hidden" / "config.json").write_text(json.dumps({
        **json.loads((d / "no_weights" / "config.json").read_text()), "hidden_size": 0, "num_key_value_heads": 3}))
    return d


@pytest.mark.parametrize("overrides, rc, parts", [
    (["rollout.temperature=0", "trainer.lr=0"], 2, ["invalid config: rollout.temperature=0.0 must be > 1e-6",
                                                    "; trainer.lr=0.0 must be > 0"]),
    (["foo=1"], 2, ["invalid config: Could not override 'foo'.", "Key 'foo' not in 'RunConfig'"]),
    (["steps=abc"], 2, ["invalid config: Error merging override steps=abc", "could not be converted to Integer"]),
    (["task=nope"], 2, ["Could not find 'task/nope' Available options in 'task': arith, custom, dapo, gsm8k"]),
    (["+trainer.bogus=1"], 2, ["invalid config: trainer.bogus is not a key of the config"]),  # was dropped silently
    (["task.name=nope"], 1, ["task: unknown task 'nope'; known: ['arith', 'custom', 'dapo', 'gsm8k']"]),
    (["rollout=sglang", "rollout.sglang.port=60000"], 1, ["port=60000: SGLang", "port + 10000"]),
    (["cluster.colocate=true"], 1, ["cluster.colocate=true shares each trainer rank's GPU"]),
    (["rollout=sglang", "model.path=/m", "rollout.sglang.extra_args=3"], 2,
     ["Error merging override rollout.sglang.extra_args=3", "is not a ListConfig, list or tuple"]),
    (["rollout=sglang", "model.path=/m", "cluster.weight_transport=object_store"], 2,
     ["cluster.weight_transport=object_store does not reach a sglang rollout engine; choose one of "
      "['auto', 'broadcast', 'disk', 'ipc']"]),
    (["rollout=sglang", "model.path=/m", "+rollout.sglang.env={SGLANG_ENABLE_DETERMINISTIC_INFERENCE: 0}"], 1,
     ["SGLANG_ENABLE_DETERMINISTIC_INFERENCE='0' in the engine config's env, but the TOP contract pins '1'"]),
    (["trainer.tp=3", "cluster.num_cpus=4"], 1, ["trainer.tp=3 does not split this model", "valid trainer.tp: 1"]),
])
def test_dry_run_refuses_config_errors_in_one_line(tmp_path, overrides, rc, parts):
    out = _run("-m", "top_rl.cli", f"run_dir={tmp_path / 'run'}", "dry_run=true", *overrides)
    _one_line(out, rc, "top-rl: ", *parts)
    assert not (tmp_path / "run").exists()


def test_contract_breaking_extra_args_in_one_line(tmp_path):
    """SGLang's parser imported on this CPU driver (tests/entry/test_preflight.py covers the refusal itself) adds no
    import-time notices to the one line."""
    from tests import sglang_cpu

    if sglang_cpu.import_error():
        pytest.skip(sglang_cpu.import_error())
    out = _run("-m", "top_rl.cli", f"run_dir={tmp_path / 'run'}", "dry_run=true", "rollout=sglang",
               "model.path=/models/Qwen3-0.6B", "rollout.sglang.extra_args=[--enable-torch-compile]")
    _one_line(out, 1, "top-rl: ", "(--enable-torch-compile: the TOP contract needs it off, torch.compile changes")


def test_malformed_or_incomplete_model_dirs(tmp_path, models):
    bad = models / "bad_json"
    for extra in (["dry_run=true"], ["steps=1"]):
        _one_line(_run("-m", "top_rl.cli", f"run_dir={tmp_path / 'run'}", f"model.path={bad}", *extra), 1,
                  "top-rl: ", f"{bad / 'config.json'}:1: not valid JSON")
    zero = models / "zero_hidden" / "config.json"  # Issue 30: a size no model has, in a checkpoint's config.json
    _one_line(_run("-m", "top_rl.cli", f"run_dir={tmp_path / 'run'}", f"model.path={zero.parent}", "dry_run=true"), 1,
              "top-rl: ", f"{zero}: hidden_size=0 must be a positive integer")
    out = _run("-m", "top_rl.cli", f"run_dir={tmp_path / 'run'}", f"model.path={models / 'no_weights'}", "steps=1")
    _one_line(out, 1, "top-rl: ", "has neither model.safetensors nor model.safetensors.index.json")  # before Ray
    assert not (tmp_path / "run").exists()
    _one_line(_run("-m", "top_rl.tools.score", "--model", str(bad), "--input-ids", "1,2,3"), 2, "error: ",
              f"{bad / 'config.json'}:1: not valid JSON")


def test_tool_value_errors(models):
    out = _run("-m", "top_rl.tools.score", "--model", str(models / "no_weights"), "--input-ids", "1,2", "--dtype", "fp8")
    assert out.returncode == 2 and "argument --dtype: invalid choice: 'fp8'" in out.stderr
    assert "Traceback" not in out.stderr
    probe = ["-c", "import sys; from top_rl.cli import parity_probe_main; sys.exit(parity_probe_main())"]
    out = _run(*probe, "url=127.0.0.1:30000", f"model={models / 'no_weights'}")
    assert out.returncode == 2 and out.stderr.startswith("top-rl-parity-probe: url='127.0.0.1:30000' needs its scheme")
    out = _run(*probe, "url=http://127.0.0.1:9", f"model={models / 'no_weights'}", "dtype=fp8")
    assert out.returncode == 2 and "dtype='fp8': expected one of" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from top_rl.tasks import ArithTask

    d = tmp_path_factory.mktemp("tok")
    ArithTask().save_tokenizer(str(d))
    return d


@pytest.mark.parametrize("overrides, rc, parts", [
    (["run_dir="], 2, ["invalid config: run_dir='' is empty (an unset shell variable?): the run would write into "
                       "the current directory; give it one, e.g. run_dir=runs/NAME"]),
    (["run_dir={tmp}/file/sub"], 1, ["run_dir={tmp}/file/sub cannot be created: {tmp}/file is a file, not a "
                                     "directory; pick another run_dir="]),
    (["task=gsm8k", "task.path=/dev/zero", "task.tokenizer={tok}"], 1,
     ["task 'gsm8k': task.path=/dev/zero is a character device, not a regular file: nothing was read from it"]),
    (["rollout.prompts_per_step=1000000000"], 1, ["of memory cannot hold the run: it needs at least",
                                                  "(rollout.prompts_per_step=1000000000 x rollout.n_samples=16",
                                                  "Lower rollout.prompts_per_step (over "]),
    (["model.hidden_size=-64"], 2, ["invalid config: model.hidden_size=-64 must be a positive integer"]),
])
def test_impossible_input_is_one_line_before_anything_starts(tmp_path, tokenizer, overrides, rc, parts):
    """Issue 30: each of these started Ray (or hung, or wrote into the working directory) and failed later with a
    traceback, or never: now one line, from a run that touches nothing (it runs in tmp_path, which stays as it was)."""
    (tmp_path / "file").write_text("a regular file\n")
    fill = lambda s: s.format(tmp=tmp_path, tok=tokenizer)  # noqa: E731
    args = [fill(o) for o in overrides]
    if not any(a.startswith("run_dir=") for a in args):
        args.insert(0, f"run_dir={tmp_path / 'run'}")
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-m", "top_rl.cli", *args, "cluster.torch_threads=1"], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    _one_line(out, rc, "top-rl: ", *map(fill, parts))
    assert out.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]
