"""The Hydra tree: every shipped config composes into a valid RunConfig; bad input fails early and clearly."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from top_rl import contract
from top_rl.cli import CONF_DIR, compose, launch_plan
from top_rl.config import ConfigError

CONF = Path(CONF_DIR)
GROUPS = ["model", "task", "rollout", "trainer", "algo"]


def _shipped(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


# Options whose keys have no default the config can compose without (task=custom: the user's file and function).
REQUIRED = {"task=custom": ["task.path=data.jsonl", "task.reward_fn=reward.py:score", "task.tokenizer=arith"]}


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group):
    for option in _shipped(group):
        cfg = compose([f"{group}={option}", *REQUIRED.get(f"{group}={option}", [])])
        assert cfg.steps >= 1


@pytest.mark.parametrize("experiment", _shipped("experiment"))
def test_every_experiment_composes_and_plans(experiment):
    cfg = compose([f"+experiment={experiment}"])
    plan = launch_plan(cfg)
    assert plan["engines"] and plan["trainer"]["world_size"] >= 1


def test_default_is_the_embedded_cpu_job():
    cfg = compose([])
    assert (cfg.rollout.engine, cfg.task.name, cfg.top.enabled, cfg.top.kernels) == ("native", "arith", True, "reference")
    assert (cfg.trainer.tp, cfg.model.path) == (1, None)


def test_bad_value_names_key_and_choices():
    with pytest.raises(ConfigError, match=r"top\.on_violation=explode.*expected one of \[halt, warn\]"):
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
    assert "rollout.logprob_source=sampler" in out.stderr and "expected one of [prefill, decode, auto]" in out.stderr
    out = _top_rl(f"run_dir={tmp_path}", "no_such_key=1")
    assert out.returncode != 0 and "no_such_key" in out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing ran


def test_cli_dry_run_prints_plan_and_exits(tmp_path):
    out = _top_rl(f"run_dir={tmp_path}", "dry_run=true")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout[out.stdout.index("{"):])
    # the contract of the SGLang release this interpreter imports (0.5.11's in CI's venv, 0.5.17's with .sglang0517)
    installed = contract.fallback()
    assert plan["top"]["contract"]["name"] == installed.name
    assert plan["runs"] == {"contract": installed.name, "sglang_release": installed.sglang_version,
                            "sglang_installed": installed.sglang_version}
    assert plan["engines"][0]["kind"] == "native" and plan["trainer"]["framework"] == "megatron-core"
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("override, fix", [
    ("algo.loss.kl_coef=0.1", "the loop keeps no reference policy"), ("trainer.dtype=float32", "set model.dtype"),
    ("+algo.name=grpo", "GRPO is the one advantage estimator"),
    ("rollout.sglang.enable_memory_saver=true", "set that instead")])
def test_keys_the_run_could_not_honour_are_gone_and_named_when_passed(override, fix):
    """A key whose every value but one was refused or overwritten is not in the config; passing it is refused in one
    line naming it and what to set instead."""
    key = override.split("=")[0].lstrip("+")
    section, _, name = key.rpartition(".")
    from top_rl.config import RunConfig

    assert name not in vars(eval("RunConfig()." + section))  # gone from the schema, not merely refused
    with pytest.raises(ConfigError, match=rf"^invalid config: {key} was removed: .*{fix}"):
        compose([override])


def test_a_removed_key_on_the_command_line_is_one_line():
    out = _top_rl("trainer.dtype=float32")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "top-rl: invalid config: trainer.dtype was removed: the trainer computes in model.dtype (one compute dtype for "
        "engine and trainer under the TOP contract); set model.dtype instead"]


def test_settings_the_loop_cannot_run_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"algo\.updates_per_rollout=1000 exceeds the 256 samples"):
        compose(["algo.updates_per_rollout=1000"])
    with pytest.raises(ConfigError, match=r"trainer\.dp=0 must be >= 1"):
        compose(["trainer.dp=0"])
    with pytest.raises(ConfigError, match=r"cluster\.gpu_handoff=true hands a GPU .* needs rollout\.engine=sglang, not "
                                          r"native"):
        compose(["cluster.gpu_handoff=true"])
    with pytest.raises(ConfigError, match=r"trainer\.offload_during_rollout=true parks .* only cluster\.gpu_handoff=true "
                                          r"does; set cluster\.gpu_handoff=true .* or trainer\.offload_during_rollout=false"):
        compose(["+experiment=one_gpu_qwen3_0.6b_sglang", "cluster.gpu_handoff=false", "trainer.offload_during_rollout=true"])
    handed = compose(["+experiment=one_gpu_qwen3_0.6b_sglang", "cluster.gpu_handoff=true",
                      "trainer.offload_during_rollout=true"])
    assert handed.trainer.offload_during_rollout and handed.cluster.gpu_handoff
    with pytest.raises(ConfigError, match=r"cluster\.weight_transport=disk does not reach a native rollout engine; "
                                          r"choose one of \['auto', 'broadcast', 'ipc', 'object_store'\]"):
        compose(["cluster.weight_transport=disk"])
    with pytest.raises(ConfigError, match=r"cluster\.weight_transport=nccl.*expected one of \[auto, ipc, broadcast, object_store, disk\]"):
        compose(["cluster.weight_transport=nccl"])


def test_a_seed_whose_sampling_seeds_leave_int64_is_refused():
    """Sampling seeds go to SGLang's sampler as an int64 tensor: a run seed that would overflow it is refused at
    start (it failed at the first rollout), naming the bound."""
    with pytest.raises(ConfigError, match=r"seed=1000000000000: this run's sampling seeds .* outside int64 \(SGLang's "
                                          r"sampling_seed\); use a seed with \|seed\| < 140734918"):
        compose(["seed=1000000000000"])
    with pytest.raises(ConfigError, match=r"seed=-1000000000000: .* outside int64"):
        compose(["seed=-1000000000000"])
    compose(["seed=140000000"])


def test_decode_logprobs_on_gpu_kernels_are_refused_before_start():
    """triton's decode kernel reduces differently from its extend kernel (measured on the H200), so the
    sampler's own log-probs would fail the gate at step 1: refused, with the reason and the fix."""
    with pytest.raises(ConfigError, match=r"rollout\.logprob_source=decode with top\.kernels=sglang.*prefill"):
        compose(["top.kernels=sglang", "rollout.logprob_source=decode"])
    compose(["top.kernels=sglang", "rollout.logprob_source=prefill"])  # the GPU experiment's setting
    compose(["rollout.logprob_source=decode"])  # reference kernels: decode == prefill, proven on CPU


@pytest.mark.parametrize("backend", ["triton", "flashinfer", "fa3"])
def test_the_gpu_tests_decode_claim_is_asserted_or_refused(backend, monkeypatch):
    """tests/gpu asserts decode == prefill bits only where a contract claims it (decode_equals_extend); every other
    contract must refuse logprob_source=decode with that backend. Checked here, without a GPU, for each backend."""
    import dataclasses

    from top_rl import contract
    from tests.gpu._common import decode_equals_extend_claimed

    # the Triton-GEMM contracts of 0.5.11 and 0.5.17 claim fa3 (proven live, tests/gpu/test_fa3_decode.py); every
    # other contract and backend refuses (decode_equals_extend_claimed asserts the refusals of those that do not claim it)
    assert decode_equals_extend_claimed(backend) is (backend == "fa3")
    assert contract.QWEN3_DENSE_TOP_V1.decode_equals_extend == ("fa3",)
    assert contract.QWEN3_DENSE_TOP_V1_SGLANG_0_5_17.decode_equals_extend == ("fa3",)
    assert contract.QWEN3_DENSE_TOP_V1_DEEPGEMM.decode_equals_extend == ()
    claims = {n: dataclasses.replace(c, decode_equals_extend=(backend,)) for n, c in contract.CONTRACTS.items()}
    monkeypatch.setattr(contract, "CONTRACTS", claims)
    assert decode_equals_extend_claimed(backend) is True  # claimed: the GPU tests then assert equal bits


def test_dry_run_plan_shows_the_placement():
    cfg = compose(["+experiment=one_node_qwen3_0.6b_arith", "trainer.dp=2", "cluster.colocate=true",
                   "cluster.engine_gpus=0.5", "cluster.trainer_gpus=0.5"])
    plan = launch_plan(cfg)
    assert plan["trainer"]["world_size"] == 2 and plan["ray"]["engine_bundle"] == [1]
    assert plan["ray"]["bundles"] == [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}]


def test_task_sections_are_typed_by_their_task():
    """Each task group file starts from its task's dataclass: unknown keys and wrong types fail at compose."""
    with pytest.raises(ConfigError, match=r"task\.max_operand.*could not be converted to Integer"):
        compose(["task.max_operand=abc"])
    with pytest.raises(ConfigError, match=r"Key 'no_such_key' not in 'Gsm8kConfig'"):
        compose(["task=gsm8k", "task.no_such_key=1"])
    assert compose(["task=gsm8k"]).task.reward_mode == "strict"
    with pytest.raises(ConfigError, match=r"task\.reward_mode='loose'; choose one of: strict, lenient_last_number"):
        compose(["task=gsm8k", "task.reward_mode=loose"])  # a string choice: the config's one validator


def test_the_run_config_defaults_are_the_yaml_defaults():
    """RunConfig() is the run `top-rl` makes without overrides: conf/config.yaml composed with no override (its
    defaults list and group files) equals the dataclasses' defaults."""
    from top_rl.config import RunConfig
    from top_rl.tasks import ArithConfig

    composed, default = compose([], check=False), RunConfig()
    assert {k: v for k, v in default.as_dict().items() if k != "task"} == \
        {k: v for k, v in composed.as_dict().items() if k != "task"}
    # the task section: a TaskConfig naming the default group, which composes to that task's own dataclass
    assert default.task.name == composed.task.name == "arith" and isinstance(composed.task, ArithConfig)


@pytest.mark.parametrize("group", ["model", "rollout", "trainer", "algo"])
def test_a_group_option_states_only_what_it_changes(group):
    """Each default is stated once, in the schema's dataclasses: a group's option file (conf/<group>/*.yaml) sets no
    key to the value the dataclass already gives it, and config.yaml itself sets no key (its defaults list only)."""
    from omegaconf import OmegaConf

    from top_rl.config import RunConfig, plain

    default = plain(dataclasses.asdict(getattr(RunConfig(), group)))
    for option in _shipped(group):
        body = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml")) or {}
        same = [f"{group}.{key}={v}" for key, v in _leaves(body) if _at(default, key) == v]
        assert same == [], f"conf/{group}/{option}.yaml restates the dataclass default: {same}"
    top = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    assert set(top) == {"defaults", "hydra"}


def _at(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree.get(part, {}) if isinstance(tree, dict) else None
    return tree


def test_importing_the_config_loads_no_runtime():
    code = "import sys, top_rl.config; print(sorted(m for m in ('torch', 'ray', 'megatron') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _leaves(tree, prefix=""):
    for k, v in tree.items():
        yield from _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(prefix + k, v)]


@pytest.mark.parametrize("experiment", _shipped("experiment"))
def test_an_experiment_states_only_the_model_keys_it_changes(experiment):
    """A model shape lives in its model group (conf/model/qwen3_0.6b.yaml), not copied into each experiment: every
    model.* an experiment sets differs from what its groups alone compose to."""
    from omegaconf import OmegaConf

    body = OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / f"{experiment}.yaml"))
    # a group override is a mapping; a plain name is another experiment this one builds on (gsm8k_qwen3_0.6b_one_gpu)
    groups = [f"{k.split()[-1].lstrip('/')}={v}" if isinstance(d, dict) else f"+experiment={d}"
              for d in body.get("defaults", []) for k, v in (d.items() if isinstance(d, dict) else [(d, d)])]
    base = compose(groups).model
    same = [f"model.{key}={v}" for key, v in _leaves(body.get("model") or {})
            if getattr(getattr(base, key), "value", getattr(base, key)) == v]
    assert same == [], f"{experiment}.yaml restates what its groups already set: {same}"
    shape = sorted(set(body.get("model") or {}) & _SHAPE)
    assert shape == [], f"{experiment}.yaml writes out a model shape ({shape}): select a conf/model group instead"


# An architecture's fields: a model group's (conf/model/*.yaml). An experiment may still set its context length.
_SHAPE = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "tie_word_embeddings", "rope_theta"}
