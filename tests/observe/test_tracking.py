import json
import math
import time
from pathlib import Path

import pytest
import torch

from top_rl.observe.tracking import Tracker, TrackingConfig, resolve_wandb_mode


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    yield
    import wandb

    wandb.teardown()  # the in-process service ends, and with it WANDB_SERVICE (see tests/conftest.py)


def _row(step):
    return {"train/train_rollout_logprob_abs_diff": 0.0, "train/ess_ratio": 1.0,
            "train/train_rollout_kl": torch.tensor(0.0), "rollout/reward_mean": step / 10,
            "perf/step_time": 1.5, "perf/rollout_time": 0.25}


def _steps(run_dir):
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_jsonl_wandb_offline_console_and_resume(tmp_path, capsys):
    run_dir = tmp_path / "run"
    t = Tracker(str(run_dir), TrackingConfig(), config={"lr": 1e-3, "task": {"name": "arith"}})
    rid = t.run_id
    assert t.mode == "offline" and rid
    for s in range(4):
        t.log(s, _row(s))
    with pytest.raises(ValueError, match="already logged"):
        t.log(3, _row(3))
    t.close()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[2] == {"step": 2, **_row(2), "train/train_rollout_kl": 0.0}
    out = capsys.readouterr().out
    assert "step 2 | reward 0.2 | abs_diff 0.0 | ess 1.0 | kl 0.0 | step 1.50s | rollout 0.25s" in out
    runs = list((run_dir / "wandb").glob(f"offline-run-*-{rid}"))
    assert len(runs) == 1 and (runs[0] / f"run-{rid}.wandb").stat().st_size > 0

    # crash after step 3 was logged but the checkpoint is at step 1: resume drops steps 2, 3
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "torn')  # a half-written line from the crash
    t2 = Tracker(str(run_dir), TrackingConfig(console=False), run_id=rid, resume_from_step=1)
    assert t2.run_id == rid and t2.last_step == 1
    t2.log(2, {**_row(2), "train/train_rollout_logprob_abs_diff": float("nan")})
    t2.close()
    assert _steps(run_dir) == [0, 1, 2]
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isnan(last["train/train_rollout_logprob_abs_diff"])  # NaN stays NaN, never 0
    assert _wandb_steps(run_dir, rid)[1] == 2  # two attempts (a same-second one is "offline-run-...-<id>-1")


def _six_rows_and_the_checkpoints_copy(run_dir):
    """A run's metrics.jsonl with steps 1..6; the lines a step-6 checkpoint keeps (those after the step-3 one)."""
    with Tracker(str(run_dir), TrackingConfig(wandb_mode="disabled", console=False)) as t:
        for s in range(1, 7):
            t.log(s, _row(s))
        copy = t.rows_since(3)
    assert [json.loads(line)["step"] for line in copy] == [4, 5, 6]
    return (run_dir / "metrics.jsonl").read_text(), copy


def test_resume_rewrites_a_torn_row_of_a_kept_step_from_the_checkpoint(tmp_path, capsys):
    """Issue 30: 60 bytes cut off step 6's line (checkpoint at 6): the resume dropped the torn row and went on from
    step 7, the record holding 1..5, 7, 8 and saying nothing. The row comes back byte for byte from the checkpoint's
    copy, in one line that says so."""
    run_dir = tmp_path / "run"
    whole, copy = _six_rows_and_the_checkpoints_copy(run_dir)
    path = run_dir / "metrics.jsonl"
    path.write_bytes(path.read_bytes()[:-60])  # torn inside step 6's line
    with Tracker(str(run_dir), TrackingConfig(wandb_mode="disabled", console=False), resume_from_step=6,
                 checkpoint_rows=copy, checkpoint_name="step_000006") as t:
        assert t.last_step == 6
        t.log(7, _row(7))
    assert path.read_text().splitlines()[:6] == whole.splitlines() and _steps(run_dir) == list(range(1, 8))
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("top-rl")]
    assert said == [f"top-rl: {path}: step 6 rewritten from checkpoint step_000006's copy (line 6 not a whole row)"]


def test_resume_names_a_lost_row_the_checkpoint_cannot_supply(tmp_path, capsys):
    run_dir = tmp_path / "run"
    whole, copy = _six_rows_and_the_checkpoints_copy(run_dir)
    lines = whole.splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text("".join(lines[:2] + [lines[2][:40] + "\n"] + lines[3:]))  # step 3 torn
    with Tracker(str(run_dir), TrackingConfig(wandb_mode="disabled", console=False), resume_from_step=6,
                 checkpoint_rows=copy, checkpoint_name="step_000006"):
        pass
    assert _steps(run_dir) == [1, 2, 4, 5, 6]
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("top-rl")]
    assert said == [f"top-rl: {run_dir / 'metrics.jsonl'} has no row for step 3 (line 3 not a whole row) and "
                    "checkpoint step_000006 cannot "
                    "supply it (it holds steps 4..6): the record goes on without it; a copy of metrics.jsonl from "
                    "before the damage has it"]


def test_fresh_run_replaces_and_modes(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 9}\n')
    with Tracker(str(run_dir), TrackingConfig(wandb_mode="disabled", console=False)) as t:
        assert t.run is None
        t.log(0, _row(0))
    assert _steps(run_dir) == [0] and not (run_dir / "wandb").exists()
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.delenv("WANDB_MODE")
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online" and resolve_wandb_mode("offline") == "offline"
    with pytest.raises(ValueError):
        resolve_wandb_mode("sometimes")


def _finished(path, timeout_s=30.0):
    """Wait until an attempt's offline file holds its exit record: wandb's service writes the file after
    run.finish() returns (on this 2-core machine a read right after finish saw no history row 1 time in 30)."""
    from wandb.proto import wandb_internal_pb2

    from top_rl.observe import wandb_history

    deadline = time.monotonic() + timeout_s
    while True:
        kinds = []
        for raw in wandb_history.records(path):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(raw)
            kinds.append(rec.WhichOneof("record_type"))
        if "exit" in kinds or time.monotonic() > deadline:
            return path
        time.sleep(0.05)


def _wandb_steps(run_dir, run_id):
    """Every history row of every finished attempt's offline file, read back with wandb's own protobufs."""
    from top_rl.observe import wandb_history

    files = [_finished(f) for f in wandb_history.offline_files(run_dir, run_id)]
    return sorted(s for f in files for s in wandb_history.history_steps(f)), len(files)


def test_resume_restores_wandb_history_from_jsonl_and_never_logs_a_step_twice(tmp_path, capsys):
    """Issue 14: rows the crashed attempt wrote to metrics.jsonl but wandb lost are restored on resume, and
    steps wandb already holds (logged past the checkpoint, then replayed) are not sent again."""
    run_dir, rid = tmp_path / "run", "resumeme1"
    # attempt 1: its wandb recorded nothing (as after a SIGKILL that lost wandb's buffer); the JSONL has 1..4
    with Tracker(str(run_dir), TrackingConfig(wandb_mode="disabled", console=False), run_id=rid) as t:
        for s in range(1, 5):
            t.log(s, _row(s))
    # attempt 2 resumes from the step-3 checkpoint: 1..3 come back from the JSONL, then 4 and 5 are new
    with Tracker(str(run_dir), TrackingConfig(console=False), run_id=rid, resume_from_step=3) as t:
        for s in (4, 5):
            t.log(s, _row(s))
    assert "wandb: restored 3 rows (steps 1..3) from metrics.jsonl" in capsys.readouterr().out
    assert _wandb_steps(run_dir, rid) == ([1, 2, 3, 4, 5], 1)
    # attempt 3 resumes from step 4 although wandb holds 5: the replayed step 5 is not sent twice
    with Tracker(str(run_dir), TrackingConfig(console=False), run_id=rid, resume_from_step=4) as t:
        for s in (5, 6):
            t.log(s, _row(s))
    assert "restored" not in capsys.readouterr().out
    assert _wandb_steps(run_dir, rid) == ([1, 2, 3, 4, 5, 6], 2)
    assert _steps(run_dir) == [1, 2, 3, 4, 5, 6]


def test_rollout_metrics_and_their_console_line(capsys):
    """Issue 23: what any engine's rollout gave (lengths, the share finished by max_new_tokens, tokens per second of the
    rollout call), from its samples alone, and shown on the console line."""
    from top_rl.observe.step_row import rollout_metrics
    from top_rl.engine.interface import RolloutSample

    def sample(n, finish):
        return RolloutSample([1], list(range(n)), [0.0] * n, [0.0] * n, finish, 0)

    m = rollout_metrics([sample(4, "length"), sample(1, "stop"), sample(2, "stop"), sample(4, "length")], 0.5)
    assert m == {"rollout/response_len_mean": 2.75, "rollout/response_len_max": 4, "rollout/response_len_min": 1,
                 "rollout/truncated_frac": 0.5, "perf/rollout_tokens_per_s": 22.0}
    line = Tracker.console_line({"step": 3, **_row(3), "train/train_rollout_kl": 0.0, **m})
    assert line == ("step 3 | reward 0.3 | abs_diff 0.0 | ess 1.0 | kl 0.0 | len 2.75 | truncated 0.5 | step 1.50s | "
                    "rollout 0.25s | 22 tok/s")


def test_a_steps_first_samples_go_to_wandb_as_a_table(tmp_path):
    """Issue 52 item 2: where a step saves its generations, the first tracking.wandb_samples of them are a wandb table
    in that step's history (read back from the offline run's files, as wandb wrote them); metrics.jsonl never holds
    them, and a step without samples logs no table."""
    from wandb.proto import wandb_internal_pb2

    from top_rl.observe import wandb_history
    from top_rl.observe.tracking import sample_table_rows

    run_dir = tmp_path / "run"
    saved = [{"step": 2, "sample": i, "group": i // 2, "prompt": f"1+{i}=", "response": str(i + 1), "reward": i % 2,
              "length": 1} for i in range(5)]
    assert sample_table_rows(saved, 3) == [[0, "1+0=", "1", 0], [0, "1+1=", "2", 1], [1, "1+2=", "3", 0]]
    assert sample_table_rows(saved, 0) == [] and sample_table_rows((), 3) == []
    t = Tracker(str(run_dir), TrackingConfig(console=False, wandb_samples=3))
    t.log(1, _row(1))
    t.log(2, _row(2), samples=saved)
    rid = t.run_id
    t.close()
    assert _steps(run_dir) == [1, 2] and "samples" not in (run_dir / "metrics.jsonl").read_text()
    (run_file,) = wandb_history.offline_files(run_dir, rid)
    history = {}  # step -> the history record's items, read with wandb's own protobufs
    for raw in wandb_history.records(_finished(run_file)):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            items = {it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in rec.history.item}
            history[items.get("step")] = items
    assert sorted(history) == [1, 2] and not any(k.startswith("samples") for k in history[1])
    ref = {k[len("samples/"):]: v for k, v in history[2].items() if k.startswith("samples/")}  # nested keys
    assert ref["_type"] == "table-file" and ref["nrows"] == 3
    table = json.loads((run_file.parent / "files" / ref["path"]).read_text())  # the table file wandb uploads
    assert table["columns"] == ["group", "prompt", "response", "reward"]
    assert table["data"] == sample_table_rows(saved, 3)
