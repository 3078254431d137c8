"""The eval set (top_rl/eval/run.py build): GSM8K's shipped test split, in dataset order, capped; refusals that name
the eval.* key; the config's eval.* refusals."""

import gzip
import json

import pytest

from top_rl import config
from top_rl.eval import config as eval_config
from top_rl.eval import run as eval_run
from top_rl.tasks import task_config
from top_rl.tasks.prompts import BadInput, load_task
from top_rl.tasks.sources import gsm8k_split


def _cfg(task, **eval_keys):
    cfg = config.RunConfig(task=task)
    cfg.eval = eval_config.EvalConfig(every=1, **eval_keys)
    return cfg


def test_gsm8k_evaluates_its_shipped_test_split_in_order():
    task_cfg = task_config("gsm8k")  # the train split, as the GSM8K experiment trains on
    task_cfg.tokenizer = "qwen3"  # its shipped tokenizer, as the experiment names it
    train = load_task(task_cfg)
    es = eval_run.build(_cfg(task_cfg, split="test", max_prompts=3, n_samples=2, temperature=0.5), train, 4096)
    with gzip.open(gsm8k_split("test"), "rt") as f:
        first = [json.loads(next(f))["question"] for _ in range(3)]
    assert [it.uid for it in es.items] == [0, 1, 2] and all(q in it.prompt for q, it in zip(first, es.items))
    assert es.task is not train and es.n == 2 and es.params.temperature == 0.5 and es.skipped == 0
    assert es.params.max_new_tokens == config.RunConfig().rollout.max_new_tokens  # null: the rollout's


def test_refusals_name_the_eval_key():
    arith = task_config("arith")
    with pytest.raises(BadInput, match=r"^eval.split='test': task 'arith' has no task.split"):
        eval_run.build(_cfg(arith, split="test"), load_task(arith), 64)
    gsm = task_config("gsm8k")
    gsm.tokenizer = "qwen3"
    with pytest.raises(BadInput, match=r"^eval \(eval.split='dev'\): .*task.split='dev'"):
        eval_run.build(_cfg(gsm, split="dev"), None, 4096)
    with pytest.raises(BadInput, match="no prompt of the eval set"):
        eval_run.build(_cfg(arith, max_new_tokens=64), load_task(arith), 64)
    bad = _cfg(arith, n_samples=0, temperature=0.0)
    bad.eval.every = -1
    msg = "; ".join(eval_config.errors(bad))
    assert "eval.every=-1 must be >= 0" in msg and "eval.n_samples=0 must be >= 1" in msg
    assert "eval.temperature=0.0 must be > 1e-6" in msg
    lagged = _cfg(arith)
    lagged.rollout.policy_lag = 1
    assert eval_config.errors(lagged)[0].startswith("eval.every with rollout.policy_lag=1")
