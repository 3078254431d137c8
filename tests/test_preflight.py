"""Issue 14: every refusal a config or input can cause comes before Ray, wandb or any file write, and a
refused run leaves no run_dir behind. In-process: Ray's cluster and the tracker are replaced by stand-ins
that fail the test if the run ever gets that far."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from top_rl import kernels, loop, preflight
from top_rl.cli import compose
from top_rl.tasks import ArithTask

SMALL = ["rollout.prompts_per_step=2", "rollout.n_samples=4", "rollout.max_new_tokens=3", "cluster.torch_threads=1"]


@pytest.fixture()
def nothing_starts(monkeypatch):
    def started(what):
        def fail(*a, **k):
            raise AssertionError(f"{what} started: the refusal came too late")
        return fail

    monkeypatch.setattr(loop, "Cluster", started("Ray (the cluster)"))
    monkeypatch.setattr(loop, "Tracker", started("wandb (the tracker)"))
    backend = kernels.backend_name()
    yield
    kernels.set_backend(backend)


def _refused(run_dir: Path, *overrides: str) -> str:
    """The refusal's message; compose may refuse first (the CLI's path), else the run itself must."""
    try:
        cfg = compose([f"run_dir={run_dir}", *SMALL, *overrides])
    except preflight.REFUSALS as e:
        return str(e)
    with pytest.raises(preflight.REFUSALS) as e:
        loop.run(cfg)
    return str(e.value)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    ArithTask().save_tokenizer(str(d / "tok"))
    row = lambda q: json.dumps({"question": q, "answer": "so\n#### 4"}, ensure_ascii=False)  # noqa: E731
    (d / "empty.jsonl").write_text("")
    (d / "all_bad.jsonl").write_text("{oops\n\n")
    (d / "latin1.jsonl").write_bytes((row("What is 2+2?") + "\n" + row("Was ist 2+2? Gr\xfc\xdfe")).encode("latin-1"))
    long_q = "What is " + "1+" * 40 + "1?"
    rows = [row("What is 2+2?"), row("What is 1+3?"), row(long_q), row("What is 0+4?")]
    (d / "long.jsonl").write_text("\n".join(rows) + "\n")
    (d / "adir.jsonl").mkdir()
    return d


def _gsm(data: Path, name: str) -> list[str]:
    return ["task=gsm8k", f"task.path={data / name}", f"task.tokenizer={data / 'tok'}"]


@pytest.mark.parametrize("overrides, message", [
    (["trainer.lr=-1"], "trainer.lr=-1.0 must be > 0"),
    (["trainer.lr=0"], "trainer.lr=0.0 must be > 0"),
    (["trainer.eps=nan"], "trainer.eps=nan must be a finite number"),
    (["rollout.temperature=nan"], "rollout.temperature=nan must be a finite number"),
    (["rollout.temperature=inf"], "rollout.temperature=inf must be a finite number"),
    (["algo.loss.clip_eps_high=-inf"], "algo.loss.clip_eps_high=-inf must be a finite number"),
    (["rollout.n_samples=1"], "rollout.n_samples=1 must be >= 2 for GRPO"),
    (["rollout=sglang", "+rollout.sglang.port=60000"], "port=60000: SGLang 0.5.11 also opens port + 10000 for gRPC"),
])
def test_config_refusals_come_before_anything_starts(tmp_path, nothing_starts, overrides, message):
    run_dir = tmp_path / "run"
    assert message in _refused(run_dir, *overrides)
    assert not run_dir.exists()


def test_a_config_changed_after_compose_is_checked_again(tmp_path, nothing_starts):
    cfg = compose([f"run_dir={tmp_path / 'run'}", *SMALL])
    cfg.rollout.temperature = float("nan")
    with pytest.raises(preflight.REFUSALS, match="rollout.temperature=nan must be a finite number"):
        loop.run(cfg)
    assert not (tmp_path / "run").exists()


def test_dataset_refusals_name_the_file_and_line(tmp_path, nothing_starts, data):
    run_dir = tmp_path / "run"
    assert f"task 'gsm8k': {data / 'empty.jsonl'} holds no usable rows: nothing to train on" in \
        _refused(run_dir, *_gsm(data, "empty.jsonl"))
    assert "holds no usable rows (2 bad rows skipped under task.on_bad_row=skip)" in \
        _refused(run_dir, *_gsm(data, "all_bad.jsonl"), "task.on_bad_row=skip")
    assert f"{data / 'latin1.jsonl'}:2: not UTF-8 text (byte b'\\xfc' at column " in \
        _refused(run_dir, *_gsm(data, "latin1.jsonl"))
    assert f"Is a directory: '{data / 'adir.jsonl'}'" in _refused(run_dir, *_gsm(data, "adir.jsonl"))
    n = len("Question: What is " + "1+" * 40 + "1?\nAnswer:")
    assert f"prompt 2 of task 'gsm8k' has {n} tokens; the model's context leaves 61 for a prompt" in \
        _refused(run_dir, *_gsm(data, "long.jsonl"), "model.max_position_embeddings=64")
    assert not run_dir.exists()


@contextlib.contextmanager
def _unprivileged():
    """Root writes through any mode bits: drop to `nobody` for the check (os.access with effective ids)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_read_only_run_dir_is_refused_before_anything_starts(nothing_starts):
    base = Path(tempfile.mkdtemp(prefix="top_rl_ro_"))  # /tmp: `nobody` can reach it (pytest's tmp is 0700)
    run_dir = base / "ro"
    run_dir.mkdir()
    base.chmod(0o755)
    run_dir.chmod(0o555)
    cfg = compose([f"run_dir={run_dir}", *SMALL])
    try:
        with _unprivileged(), pytest.raises(preflight.Refused) as e:
            loop.run(cfg)
        assert f"run_dir={run_dir} is not writable ({run_dir} refuses writes)" in str(e.value)
        assert list(run_dir.iterdir()) == []
    finally:
        run_dir.chmod(0o755)
        shutil.rmtree(base)


def _top_rl(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "top_rl.cli", f"run_dir={run_dir}", *SMALL, *overrides],
                          capture_output=True, text=True, timeout=120, env=env)


def test_cli_refusals_are_one_message_and_leave_no_run_dir(tmp_path):
    out = _top_rl(tmp_path / "a", "rollout.temperature=nan")
    assert out.returncode == 2 and "top-rl: invalid config:\n  rollout.temperature=nan must be a finite number" \
        in out.stderr and "Traceback" not in out.stderr
    out = _top_rl(tmp_path / "b", "rollout=sglang", "+rollout.sglang.port=60000")
    assert out.returncode == 1 and "top-rl: port=60000: SGLang" in out.stderr
    assert "Traceback" not in out.stderr and "Ray" not in out.stderr
    assert list(tmp_path.iterdir()) == []
