"""Generations on disk (top_rl/observe/samples.py, rollout.save_samples_every / save_samples_rows): the rows, the cap
by whole groups, bytes that depend on the rows alone, and a SIGKILL + resume that leaves every step's file exactly
as the uninterrupted run wrote it."""

from types import SimpleNamespace

import pytest

from top_rl.observe import samples

from tests import rl_runs


def _fake(n):
    items = [SimpleNamespace(uid=10 + i // 2) for i in range(n)]
    outs = [SimpleNamespace(response_ids=[1] * (i + 1), finish_reason="stop", logprobs=[-0.5] * (i + 1),
                            weight_version=3) for i in range(n)]
    return items, outs


def test_rows_hold_what_a_user_reads_and_the_cap_keeps_whole_groups(tmp_path):
    items, outs = _fake(6)
    rows = samples.rows(4, items, outs, ["p"] * 6, ["r"] * 6, [1.0, 0.0] * 3, [0.7, -0.7] * 3, n_samples=2,
                        max_rows=5)
    assert len(rows) == 4 and [r["group"] for r in rows] == [0, 0, 1, 1]  # 5 rows cap: two whole groups of 2
    assert rows[3] == {"step": 4, "sample": 3, "group": 1, "uid": 11, "prompt": "p", "response": "r", "reward": 0.0,
                       "advantage": -0.7, "length": 4, "finish_reason": "stop", "logprob_sum": -2.0,
                       "policy_version": 3}
    a = samples.write(tmp_path / "a", 4, rows)
    b = samples.write(tmp_path / "b", 4, rows)
    assert a.name == "step_000004.jsonl.gz" and a.read_bytes() == b.read_bytes() and samples.read(a) == rows
    samples.write(tmp_path / "a", 6, rows)
    samples.drop_after(tmp_path / "a", 4)
    assert [p.name for p in (tmp_path / "a" / "samples").iterdir()] == ["step_000004.jsonl.gz"]
    assert [s for s in range(1, 9) if samples.due(3, s)] == [3, 6] and not samples.due(0, 3)


@pytest.mark.slow
def test_samples_survive_sigkill_and_resume_without_duplicates(tmp_path):
    args = [*rl_runs.BASE, "steps=4", "checkpoint.every=2", "rollout.save_samples_every=1",
            "rollout.save_samples_rows=16"]
    straight = tmp_path / "straight"
    out = rl_runs.run(straight, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    files = sorted(p.name for p in (straight / "samples").iterdir())
    assert files == [f"step_{s:06d}.jsonl.gz" for s in (1, 2, 3, 4)]
    rows = samples.read(straight / "samples" / "step_000002.jsonl.gz")
    assert len(rows) == 16 and {r["group"] for r in rows} == {0, 1} and all(r["policy_version"] == 2 for r in rows)
    metrics = rl_runs.rows(straight)[1]
    assert all(r["reward"] in (0.0, 1.0) and 1 <= r["length"] <= 3 and r["logprob_sum"] < 0 for r in rows)
    assert metrics["rollout/reward_min"] <= min(r["reward"] for r in rows) <= metrics["rollout/reward_max"]

    killed = tmp_path / "killed"  # the kill after step 3 leaves step 3's file; the checkpoint is step 2's
    proc = rl_runs.start(killed, *args, fault="kill_after_step:3")
    assert rl_runs.finish(proc).returncode == -9
    assert (killed / "samples" / "step_000003.jsonl.gz").exists()
    out = rl_runs.run(killed, *args, "resume=true")
    assert out.returncode == 0, out.stderr[-3000:]
    assert rl_runs.tree_hash(killed / "samples") == rl_runs.tree_hash(straight / "samples")
