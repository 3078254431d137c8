"""Issue 52's acceptance, in one default (tiny CPU) job with all of it on: generations on disk every step, an eval every
2 steps, a warm-up + cosine lr, the new step metrics, the first samples as a wandb table; then a SIGKILL after step 3
(checkpoint at 2) and a resume whose rows (every non-perf key, eval/* included), samples files and wandb tables are
the uninterrupted run's, byte for byte. Four steps: the fewest that hold a warm-up (2), a decay, an eval on each side
of the kill and a replayed step (3) whose samples file the killed attempt had already written."""

import json
import math

import pytest

from tests import rl_runs
from tests.rl_runs import BASE

from top_rl.observe import samples, wandb_history

pytestmark = pytest.mark.slow
ON = ["steps=4", "checkpoint.every=2", "rollout.save_samples_every=1", "rollout.save_samples_rows=16",
      "eval.every=2", "eval.n_samples=2", "eval.max_prompts=3",
      "trainer.lr_schedule=cosine", "trainer.lr_warmup_steps=2", "tracking.wandb_samples=4"]
NEW_KEYS = ("rollout/reward_std", "rollout/reward_min", "rollout/reward_max", "rollout/groups_one_reward_frac",
            "train/advantage_mean", "train/advantage_std", "train/advantage_zero_frac",
            "rollout/entropy_mc",  # the policy entropy estimate (the trainer never builds [T, V] logits)
            "train/lr", "perf/trained_tokens_per_s", "perf/wall_time")


def _wandb_tables(run_dir, run_id) -> dict[int, list]:
    """step -> the rows of its wandb "samples" table, over every attempt's offline run (wandb's own protobufs)."""
    from wandb.proto import wandb_internal_pb2

    out = {}
    for f in wandb_history.offline_files(run_dir, run_id):
        for raw in wandb_history.records(f):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") != "history":
                continue
            items = {it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in rec.history.item}
            if "samples/path" in items:
                assert items["step"] not in out, f"step {items['step']}'s table logged twice"
                out[items["step"]] = json.loads((f.parent / "files" / items["samples/path"]).read_text())["data"]
    return out


def test_default_job_with_samples_eval_cosine_lr_resumes_bitwise(tmp_path):
    straight = tmp_path / "straight"
    out = rl_runs.run(straight, *BASE, *ON)
    assert out.returncode == 0, out.stderr[-3000:]
    ref = rl_runs.rows(straight)
    assert [r["step"] for r in ref] == [1, 2, 3, 4]
    assert all(k in r for r in ref for k in NEW_KEYS), [k for k in NEW_KEYS if k not in ref[0]]
    # warm-up over updates 0, 1 (lr/2, lr), then cosine from lr at update 2 towards lr_min=0 at update 4 (= steps)
    lr = 0.01
    assert [r["train/lr"] for r in ref] == pytest.approx(
        [lr / 2, lr, lr, lr * 0.5 * (1 + math.cos(math.pi / 2))], rel=1e-12, abs=0)
    assert [("eval/accuracy" in r) for r in ref] == [False, True, False, True]
    assert sorted(p.name for p in (straight / "samples").iterdir()) == [f"step_{s:06d}.jsonl.gz" for s in (1, 2, 3, 4)]

    killed = tmp_path / "killed"  # wandb offline: the tables go where a user's would
    out = rl_runs.run(killed, *BASE, *ON, fault="kill_after_step:3", wandb="offline")
    assert out.returncode == -9, out.stderr[-3000:]
    assert [r["step"] for r in rl_runs.rows(killed)] == [1, 2, 3]
    assert (killed / "samples" / "step_000003.jsonl.gz").exists()  # the resume replays step 3 over it
    out = rl_runs.run(killed, *BASE, *ON, "resume=true", wandb="offline")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from" in out.stdout and "step 3 |" in out.stdout
    assert rl_runs.without_timing(rl_runs.rows(killed)) == rl_runs.without_timing(ref)  # eval/*, lr, new metrics
    assert rl_runs.tree_hash(killed / "samples") == rl_runs.tree_hash(straight / "samples")
    # every step's first 4 samples once in wandb (a step the killed attempt's wandb lost comes back with its table)
    run_id = json.loads((killed / "checkpoints" / "step_000004" / "state.json").read_text())["run_id"]
    tables = _wandb_tables(killed, run_id)
    assert sorted(tables) == [1, 2, 3, 4]
    for step, data in tables.items():
        saved = samples.read(samples.path(straight, step))[:4]
        assert data == [[r["group"], r["prompt"], r["response"], r["reward"]] for r in saved]
