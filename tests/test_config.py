"""The Hydra tree: every shipped config composes into a valid RunConfig; bad input fails early and clearly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from top_rl.cli import CONF_DIR, compose, launch_plan
from top_rl.config import ConfigError

CONF = Path(CONF_DIR)
GROUPS = ["model", "task", "rollout", "trainer", "algo"]


def _shipped(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group):
    for option in _shipped(group):
        cfg = compose([f"{group}={option}"])
        assert cfg.steps >= 1


@pytest.mark.parametrize("experiment", _shipped("experiment"))
def test_every_experiment_composes_and_plans(experiment):
    cfg = compose([f"+experiment={experiment}"])
    plan = launch_plan(cfg)
    assert plan["engines"] and plan["trainer"]["world_size"] >= 1


def test_default_is_the_embedded_cpu_job():
    cfg = compose([])
    assert (cfg.rollout.engine, cfg.task["name"], cfg.top.enabled, cfg.top.kernels) == ("native", "arith", True, "reference")
    assert (cfg.trainer.tp, cfg.model.path) == (1, None)


def test_bad_value_names_key_and_choices():
    with pytest.raises(ConfigError, match=r"top\.on_violation='explode'.*halt, warn"):
        compose(["top.on_violation=explode"])
    with pytest.raises(ConfigError, match=r"rollout\.temperature=0\.0"):
        compose(["rollout.temperature=0"])


def _top_rl(*args, timeout=120):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "top_rl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_cli_bad_override_exits_nonzero_with_message(tmp_path):
    out = _top_rl(f"run_dir={tmp_path}", "rollout.logprob_source=sampler")
    assert out.returncode != 0
    assert "rollout.logprob_source='sampler'" in out.stderr and "prefill, decode" in out.stderr
    out = _top_rl(f"run_dir={tmp_path}", "no_such_key=1")
    assert out.returncode != 0 and "no_such_key" in out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing ran


def test_cli_dry_run_prints_plan_and_exits(tmp_path):
    out = _top_rl(f"run_dir={tmp_path}", "dry_run=true")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout[out.stdout.index("{"):])
    assert plan["top"]["contract"]["name"] == "qwen3_dense_top_v1"
    assert plan["engines"][0]["kind"] == "native" and plan["trainer"]["framework"] == "megatron-core"
    assert not (tmp_path / "metrics.jsonl").exists()
