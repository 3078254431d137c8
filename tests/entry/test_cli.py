"""The three commands share one style: key=value arguments, `--help` that names the program, errors that name
the key; a Hydra multirun gives each job its own run_dir under the sweep's directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from top_rl.cli import export_main, parity_probe_main, report_main
from top_rl.tools.args import Arg, KeyValueCli, UsageError

ROOT = Path(__file__).resolve().parents[2]


def _top_rl(*args, cwd=None):
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "top_rl.cli", *args], capture_output=True, text=True, timeout=400,
                          env=env, cwd=cwd)


def test_top_rl_help_names_the_program():
    out = _top_rl("--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("top-rl: ") and "usage: top-rl [key=value ...]" in out.stdout
    groups = out.stdout.split("== Config ==")[0]
    assert "cli" not in groups  # Hydra names the app after the file unless told
    # the task group's choices are the tasks, not the typed schemas their files start from
    assert "task: arith, custom, dapo, gsm8k\n" in groups and "schema" not in groups


@pytest.mark.parametrize("entry, prog, keys", [
    (export_main, "top-rl-export", ["run_dir=RUN_DIR", "out=OUT", "step", "overwrite"]),
    (parity_probe_main, "top-rl-parity-probe", ["url=URL", "model=MODEL", "num_prompts", "server_check"]),
    (report_main, "top-rl-report", ["run_dir=RUN_DIR", "out", "generations"]),
])
def test_tool_help_names_the_program_and_keys(entry, prog, keys, capsys):
    for flag in ("--help", "-h"):
        assert entry([flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {prog} ") and all(k in out for k in keys)


def test_tools_take_key_value_and_name_the_fix(capsys):
    assert export_main(["--run_dir", "x"]) == 2
    assert "top-rl-export takes key=value arguments; write run_dir=VALUE" in capsys.readouterr().err
    assert parity_probe_main(["url=http://127.0.0.1:9", "model=m", "num_prompts=many"]) == 2
    assert "num_prompts='many': expected int" in capsys.readouterr().err
    assert parity_probe_main(["url=u", "model=m", "source=sampler"]) == 2
    assert "source='sampler': expected one of prefill, decode, both" in capsys.readouterr().err


def test_key_value_parser():
    cli = KeyValueCli("t", "a test", [Arg("a", "a", required=True), Arg("n", "n", int, 3), Arg("f", "f", bool, False)])
    args = cli.parse(["a=x=y", "f=TRUE"])
    assert (args.a, args.n, args.f) == ("x=y", 3, True)
    with pytest.raises(UsageError, match="a= is required"):
        cli.parse(["n=1"])
    with pytest.raises(UsageError, match="a= needs a value"):
        cli.parse(["a="])
    assert cli.parse(["a=1", "n="]).n == 3  # an empty optional key is its default
    with pytest.raises(UsageError, match="n= given twice"):
        cli.parse(["a=1", "n=1", "n=2"])
    with pytest.raises(UsageError, match="f='maybe': expected true or false"):
        cli.parse(["a=1", "f=maybe"])


def _plans(stdout: str) -> list[dict]:
    dec, plans, i = json.JSONDecoder(), [], stdout.find("{")
    while i != -1:
        plan, end = dec.raw_decode(stdout, i)
        plans.append(plan)
        i = stdout.find("{", end)
    return plans


def test_multirun_jobs_get_their_own_run_dir(tmp_path):
    out = _top_rl("-m", "steps=1,2", "dry_run=true", "run_dir=sweep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plans = _plans(out.stdout)
    assert sorted((p["steps"], p["run_dir"]) for p in plans) == [(1, str(tmp_path / "sweep" / "0")),
                                                                  (2, str(tmp_path / "sweep" / "1"))]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]  # no ./multirun in the working directory


@pytest.mark.parametrize("sweep, rc, message", [
    # a real sweep: before, job 0 trained for its 2 steps, then job 1 was refused, leaving sweep/0 and sweep/1
    (["steps=2", "rollout.temperature=1.0,nan"], 2,
     "top-rl: sweep refused before any job started: job 1 (rollout.temperature=nan): invalid "
     "config: rollout.temperature=nan must be a finite number"),
    # refused by Hydra's own composition, but only after it wrote sweep/multirun.yaml
    (["steps=abc,2"], 2, "top-rl: sweep refused before any job started: job 0 (steps=abc): invalid "
                         "config: Error merging override steps=abc Value 'abc' of type 'str' could not be converted "
                         "to Integer"),
    (["steps=1,2", "model.num_key_value_heads=2,3"], 2, "top-rl: sweep refused before any job started: job 1 "
     "(steps=1 model.num_key_value_heads=3): invalid config: model.num_attention_heads=4 is not a "
     "multiple of model.num_key_value_heads=3 (each KV head serves a whole group of query heads)"),
])
def test_a_sweep_checks_every_job_before_the_first_starts(tmp_path, sweep, rc, message):
    """Issue 30: every job's config is composed and checked before job 0 starts; a refused sweep leaves nothing."""
    d = tmp_path / "sweep"
    out = _top_rl("-m", f"run_dir={d}", *sweep, "cluster.torch_threads=1", cwd=tmp_path)
    assert out.returncode == rc and out.stderr.splitlines() == [message.format(d=d)], out.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_checks_every_jobs_data_before_the_first_starts(tmp_path, tmp_path_factory):
    """Issue 54 item 4: a sweep checked a job's data only when that job started: task.path=good.jsonl,/dev/zero
    trained and checkpointed job 0, then refused job 1, leaving sweep/0, an empty sweep/1 and multirun.yaml."""
    from top_rl.tasks import ArithTask

    data = tmp_path_factory.mktemp("sweep_data")
    ArithTask().save_tokenizer(str(data / "tok"))
    (data / "good.jsonl").write_text("".join(json.dumps({"question": f"What is {a}+1?", "answer": f"#### {a + 1}"})
                                             + "\n" for a in range(4)))
    d = tmp_path / "sweep"
    out = _top_rl("-m", f"run_dir={d}", "steps=1", "task=gsm8k", f"task.tokenizer={data / 'tok'}",
                  f"task.path={data / 'good.jsonl'},/dev/zero", "rollout.prompts_per_step=2", "rollout.n_samples=2",
                  "rollout.max_new_tokens=2", "cluster.torch_threads=1", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "top-rl: sweep refused before any job started: job 1 (task.path=/dev/zero): task 'gsm8k': task.path=/dev/zero "
        "is a character device, not a regular file: nothing was read from it; point task.path at a data file"], \
        out.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_with_an_empty_or_blocked_run_dir_is_refused(tmp_path):
    """Issue 30: `-m run_dir=` (an unset variable) put the jobs in ./0, ./1; a run_dir under a file failed in Hydra's
    mkdir with a traceback."""
    out = _top_rl("-m", "run_dir=", "steps=1,2", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "top-rl: sweep refused before any job started: job 0 (steps=1): invalid config: run_dir='' is empty "
        "(an unset shell variable?): the run would write into the current directory; give it one, e.g. "
        "run_dir=runs/NAME"], out.stderr[-3000:]
    (tmp_path / "file").write_text("a regular file\n")
    out = _top_rl("-m", f"run_dir={tmp_path / 'file' / 'sweep'}", "steps=1,2", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"top-rl: sweep refused before any job started: job 0 (steps=1): "
        f"run_dir={tmp_path / 'file' / 'sweep' / '0'} cannot be created: {tmp_path / 'file'} is a file, not a "
        "directory; pick another run_dir="], out.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
