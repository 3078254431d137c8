"""Issue 5: bad input is refused (or skipped, by config) with a message that names it, and nothing a run
already saved is lost: malformed / empty dataset rows, prompts longer than the context, a model that is
not dense Qwen3, a tokenizer that does not fit the model."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from tests import rl_runs
from tests.rl_runs import BASE

from top_rl.tasks import prompts
from top_rl.model import Qwen3Config, UnsupportedModel
from top_rl.tasks import ArithConfig, ArithTask, DataPosition

# gsm8k rows tokenized by the arith tokenizer (one token per character, <unk> for letters): a 64-token
# context minus 3 new tokens leaves 61 for "Question: {q}\nAnswer:" (18 characters + the question).
SHORT = ["What is 1+1?", "What is 2+2?", "What is 3+1?", "What is 0+4?"]
LONG = "What is " + "1+" * 30 + "1?"
GSM = ["rollout.prompts_per_step=2", "rollout.n_samples=4", "rollout.max_new_tokens=3", "trainer.lr=0.01",
       "cluster.torch_threads=1", "model.max_position_embeddings=64", "task=gsm8k", "task.on_bad_row=skip",
       "checkpoint.every=1"]


def _row(q: str, gold: int) -> str:
    return json.dumps({"question": q, "answer": f"so\n#### {gold}"})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    ArithTask().save_tokenizer(str(d / "tok"))
    lines = [_row(SHORT[0], 2), "", _row(SHORT[1], 4), "{not json", _row(LONG, 31), _row(SHORT[2], 4),
             _row(SHORT[3], 4)]
    (d / "rows.jsonl").write_text("\n".join(lines) + "\n")
    (d / "llama").mkdir()
    (d / "llama" / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                         "vocab_size": 32000, "hidden_size": 64}))
    (d / "small_vocab").mkdir()
    cfg = Qwen3Config(vocab_size=12, hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16)
    (d / "small_vocab" / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return d


@pytest.fixture()
def saved_run(tmp_path):
    """A copy of a finished run, and the hash of everything in it."""
    run_dir = tmp_path / "run"
    shutil.copytree(rl_runs.baseline(), run_dir)
    return run_dir, rl_runs.tree_hash(run_dir)


def _refused(run_dir, *overrides, base=BASE):
    """The CLI's answer to a run that must be refused at start: exit 1, one message, no traceback."""
    out = rl_runs.run(run_dir, *base, "steps=8", "resume=true", "resume_allow_changes=true", *overrides)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.stderr


def _refusal(run_dir, *overrides, base=BASE) -> str:
    """The same refusal in-process (the checks refuse before Ray or anything else starts)."""
    from top_rl import cli, kernels
    from top_rl.cli import compose

    before = kernels.current_plan()
    try:
        with pytest.raises((prompts.BadInput, UnsupportedModel)) as e:
            cli.run(compose([f"run_dir={run_dir}", *base, "steps=8", "resume=true", "resume_allow_changes=true",
                              *overrides]))
    finally:
        kernels.install(before)  # the run installed its own plan
    return str(e.value)


@pytest.mark.slow
def test_start_time_refusals_name_the_input_and_keep_the_run(saved_run, data):
    run_dir, before = saved_run
    err = _refused(run_dir, f"model.path={data / 'llama'}")
    assert "top-rl: " in err and "is not a dense Qwen3 checkpoint (model_type='llama'" in err
    assert "has no config.json: not a Hugging Face model directory" in _refusal(run_dir, f"model.path={data / 'nowhere'}")
    assert "the task 'arith' tokenizer has 18 tokens but the model's vocab_size is 12" in \
        _refusal(run_dir, f"model.path={data / 'small_vocab'}")
    err = _refusal(run_dir, "task=gsm8k", f"task.path={data / 'rows.jsonl'}", f"task.tokenizer={data / 'tok'}",
                   base=[o for o in BASE if not o.startswith("task.")])
    assert f"task 'gsm8k': {data / 'rows.jsonl'}:2: empty line (set task.on_bad_row=skip" in err
    assert rl_runs.tree_hash(run_dir) == before


def _edit_state(run_dir: Path, **changes) -> Path:
    """The final checkpoint's state.json changed, and its manifest recomputed so that it still verifies (the manifest
    is a checksum, not a signature). Returns state.json."""
    from top_rl.run import manifest

    ckpt = rl_runs.final_checkpoint(run_dir)
    state = ckpt / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), **changes}))
    manifest.write(ckpt)
    manifest.verify(ckpt)
    return state


@pytest.mark.slow
def test_a_checkpoint_whose_state_contradicts_itself_is_refused_before_ray(saved_run):
    """Issue 30: state.json with "world": 0 verified, passed the resume checks and failed once Ray and the trainers
    had started, with a traceback. Now the resume's checks refuse it in one line naming the file and the key."""
    run_dir, _ = saved_run
    state = _edit_state(run_dir, world=0)
    before = rl_runs.tree_hash(run_dir)
    err = _refused(run_dir)
    assert err.strip().splitlines() == [
        f"top-rl: resume refused: {state}: world=0, but its trainer layout {{'dp': 1, 'tp': 1, 'pp': 1, 'cp': 1}} has 1 "
        "rank(s), one trainer_rankNNN.pt each. The checkpoint verifies but contradicts itself (edited after it was "
        "written?); restore it from a copy, or move it aside to resume from an earlier one."], err[-3000:]
    assert rl_runs.tree_hash(run_dir) == before


@pytest.mark.slow
@pytest.mark.parametrize("changes, message", [
    ({"world": True}, "world=True, but its trainer layout {'dp': 1, 'tp': 1, 'pp': 1, 'cp': 1} has 1 rank(s)"),
    ({"world": "1"}, "world='1', but its trainer layout"),
    ({"position": {"epoch": -1, "index": 0}}, "position={'epoch': -1, 'index': 0} must be {'epoch': E, 'index': I}, "
                                              "whole numbers >= 0 (the data position)"),
    ({"position": {"epoch": 0}}, "position={'epoch': 0} must be"),
    ({"run_id": 7}, "run_id=7 must be a string or null (the wandb run id)"),
    ({"config": {}}, "config.trainer is missing"),
    # issue 54 item 6: each of these passed, then failed after Ray started (a traceback, an actor error)
    ({"step": "6"}, "step='6' must be a whole number >= 0 (below 2**63)"),
    ({"step": 6.5}, "step=6.5 must be a whole number >= 0"),
    ({"behaviour_version": 10 ** 24}, f"behaviour_version={10 ** 24} must be a whole number >= 0 (below 2**63)"),
    ({"format": "2"}, "format='2' must be a whole number"),
    ({"config": []}, "config=[] must be the resolved config the checkpoint was written with"),
])
def test_the_resume_checks_every_key_of_state_json_it_uses(saved_run, changes, message):
    from top_rl.cli import compose
    from top_rl.run import checkpoint

    run_dir, _ = saved_run
    state = _edit_state(run_dir, **changes)
    cfg = compose([f"run_dir={run_dir}", *BASE, "steps=8", "resume=true", "resume_allow_changes=true"])
    with pytest.raises(checkpoint.ResumeRefused) as refused:
        checkpoint.prepare(run_dir, cfg)
    assert str(refused.value).startswith(f"resume refused: {state}: {message}"), str(refused.value)


@pytest.mark.slow
def test_a_tampered_state_json_or_driver_rng_is_refused_in_one_line_before_ray(saved_run):
    """Issue 54 item 6, end to end: "step": "6" with the manifest recomputed gave a 37-line traceback after Ray
    started, and a driver RNG state of the wrong size a 78-line one. Now both are one `top-rl:` line, before Ray."""
    import torch

    from top_rl.run import manifest, safe_load

    run_dir, _ = saved_run
    state = _edit_state(run_dir, step="6")
    before = rl_runs.tree_hash(run_dir)
    err = _refused(run_dir)
    assert err.strip().splitlines() == [
        f"top-rl: resume refused: {state}: step='6' must be a whole number >= 0 (below 2**63). The checkpoint verifies "
        "but contradicts itself (edited after it was written?); restore it from a copy, or move it aside to resume "
        "from an earlier one."], err[-3000:]
    assert rl_runs.tree_hash(run_dir) == before

    _edit_state(run_dir, step=rl_runs.STEPS)
    driver = rl_runs.final_checkpoint(run_dir) / "driver.pt"
    saved = safe_load.load(driver)
    saved["rng"]["torch"] = saved["rng"]["torch"][:-8]  # a generator state 8 bytes short
    torch.save(saved, driver)
    manifest.write(driver.parent)
    older = sorted((run_dir / "checkpoints").iterdir())[:-1]
    for ckpt in older:  # the newest only: the refusal, not a fallback to an older checkpoint
        __import__("shutil").rmtree(ckpt)
    err = _refused(run_dir)
    assert err.strip().splitlines() == [
        f"top-rl: resume refused: no checkpoint in {run_dir} verifies:",
        f"  {driver.parent.name} fails verification, skipped: driver.pt: its RNG state cannot be restored "
        f"(RuntimeError: {_torch_state_error(saved['rng']['torch'])})",
        "Restore them from a copy, or move them aside to start again from step 0."], err[-3000:]


def _torch_state_error(bad) -> str:
    import torch

    try:
        torch.Generator().set_state(bad)
    except RuntimeError as e:
        return str(e).splitlines()[0]
    raise AssertionError("a short state was accepted")


@pytest.mark.slow
def test_bad_rows_and_long_prompts_skipped_and_counted_then_a_long_prompt_stops_the_run(tmp_path, data):
    task = [f"task.path={data / 'rows.jsonl'}", f"task.tokenizer={data / 'tok'}"]
    out = rl_runs.run(tmp_path, *GSM, *task, "steps=3", "rollout.on_long_prompt=skip")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "task 'gsm8k': skipped 2 bad rows (task.on_bad_row=skip)" in out.stdout
    assert f"{data / 'rows.jsonl'}:2: empty line" in out.stdout and f"{data / 'rows.jsonl'}:4: invalid JSON" in out.stdout
    rows = rl_runs.rows(tmp_path)
    assert [r["data/rows_skipped"] for r in rows] == [2, 2, 2]
    # 3 steps x 2 prompts cover the 5 good rows' first epoch: the long one was met and skipped, never truncated
    assert sum(r["rollout/prompts_skipped"] for r in rows) >= 1 and all(r["rollout/prompts_truncated"] == 0 for r in rows)

    ckpt = tmp_path / "checkpoints" / "step_000003"
    before, rows_before = rl_runs.tree_hash(ckpt), (tmp_path / "metrics.jsonl").read_text()
    out = rl_runs.run(tmp_path, *GSM, *task, "steps=6", "resume=true", "resume_allow_changes=true",
                      "rollout.on_long_prompt=error")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    n = len(f"Question: {LONG}\nAnswer:")  # uid 2: the third good row
    assert f"top-rl: prompt 2 of task 'gsm8k' has {n} tokens; the model's context leaves 61 for a prompt" in out.stderr
    assert "rollout.on_long_prompt=truncate or skip" in out.stderr
    assert rl_runs.tree_hash(ckpt) == before
    assert (tmp_path / "metrics.jsonl").read_text().startswith(rows_before)


class _Lengths(ArithTask):
    """Prompts of chosen lengths (token ids 0..n-1), so each policy's effect is known exactly."""
    LENS = [3, 8, 4, 9, 2, 5]

    def item(self, uid):
        return dataclasses.replace(super().item(uid), prompt_ids=list(range(self.LENS[uid])))


def test_long_prompt_policies():
    task, limit = _Lengths(ArithConfig(num_prompts=6)), 5
    order = task.order(0, 0)
    long_in_first_4 = sum(task.LENS[u] > limit for u in order[:4])
    assert 0 < long_in_first_4 < 4

    items, pos, counts = prompts.next_prompts(task, 4, 0, DataPosition(), limit, "truncate")
    assert [it.uid for it in items] == order[:4] and pos == DataPosition(0, 4)
    assert counts == {"rollout/prompts_truncated": long_in_first_4, "rollout/prompts_skipped": 0}
    for it in items:  # the end is kept (where the question ends and the answer starts)
        assert it.prompt_ids == list(range(task.LENS[it.uid]))[-limit:]

    items, pos, counts = prompts.next_prompts(task, 3, 0, DataPosition(), limit, "skip")
    fitting = [u for u in order if task.LENS[u] <= limit][:3]
    used = order.index(fitting[-1]) + 1  # the stream moved past the skipped ones
    assert [it.uid for it in items] == fitting and pos == DataPosition(0, used)
    assert counts == {"rollout/prompts_truncated": 0, "rollout/prompts_skipped": used - 3} and used > 3

    first_long = next(u for u in order if task.LENS[u] > limit)
    with pytest.raises(prompts.PromptTooLong, match=rf"prompt {first_long} of task 'arith' has "
                                                     rf"{task.LENS[first_long]} tokens; the model's context leaves 5"):
        prompts.next_prompts(task, 6, 0, DataPosition(), limit, "error")
    with pytest.raises(prompts.PromptTooLong, match="every prompt of task 'arith' is longer than 1 tokens"):
        prompts.next_prompts(task, 1, 0, DataPosition(), 1, "skip")


def test_tokenizer_checks():
    task = ArithTask()
    prompts.check_tokenizer(task, Qwen3Config(vocab_size=18))
    with pytest.raises(prompts.TokenizerMismatch, match="has 18 tokens but the model's vocab_size is 17"):
        prompts.check_tokenizer(task, Qwen3Config(vocab_size=17))

    class NoEos(ArithTask):
        eos_token_id = None

    with pytest.raises(prompts.TokenizerMismatch, match="eos_token_id=None, outside the model's vocabulary"):
        prompts.check_tokenizer(NoEos(), Qwen3Config(vocab_size=64))
