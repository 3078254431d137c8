"""The KernelPlan: every kernel decision made once from the run config (top.*), recorded in the resolved config,
carried to the actors as an object, read by the ops instead of the environment, and reported with its fallbacks."""

from __future__ import annotations

import pickle

import pytest
import torch

from top_rl import config, contract, kernels
from top_rl.driver import resolution
from top_rl.kernels import fallback
from top_rl.kernels import plan as kplan


def test_defaults_are_every_fast_path_on():
    fp = kplan.FastPaths()
    assert (fp.fused_forward, fp.fused_sampler, fp.fused_head_mean, fp.fused_backward, fp.flashinfer_lse,
            fp.decode_graphs, fp.attention_backward) == (True, True, True, True, True, True, "flash")
    assert kplan.build(environ={}).fast_paths == fp
    assert config.RunConfig().top.fast_paths == fp  # top.fast_paths is FastPaths itself: one class, one default
    assert kplan.build(environ={}, fast_paths=fp).fast_paths is not fp  # the plan holds its own copy


def test_the_run_config_decides_and_records_the_plan(monkeypatch):
    monkeypatch.delenv("TOP_RL_FUSED_FORWARD", raising=False)
    cfg = config.RunConfig()
    cfg.top.fast_paths.fused_backward = False  # top.fast_paths.fused_backward=false
    monkeypatch.setenv("TOP_RL_FUSED_FORWARD", "0")  # a bench's A/B switch: read by the builder, nowhere else
    resolved = resolution.resolve(cfg)  # the run's one resolution step applies it and records it as an override
    assert [(o.key, o.config, o.value, o.variable) for o in resolved.overrides] == \
        [("top.fast_paths.fused_forward", True, False, "TOP_RL_FUSED_FORWARD")]
    plan = resolution.kernel_plan(cfg, resolved)
    assert (plan.backend, plan.contract, plan.attention) == ("reference", cfg.top.contract, "triton")
    assert not plan.fast_paths.fused_forward and not plan.fast_paths.fused_backward and plan.fast_paths.fused_sampler
    recorded = cfg.as_dict()["top"]["fast_paths"]  # what state.json and the wandb config carry
    assert recorded["fused_forward"] is False and recorded["fused_backward"] is False
    assert recorded["attention_backward"] == "flash"
    cfg.top.enabled = False
    assert resolution.kernel_plan(cfg).backend == "stock"  # the non-TOP baseline


def test_a_bad_switch_in_the_environment_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("TOP_RL_FUSED_SAMPLER", "off")
    with pytest.raises(config.ConfigError, match="TOP_RL_FUSED_SAMPLER='off'.*top.fast_paths.fused_sampler"):
        resolution.resolve(config.RunConfig())


def test_the_plan_travels_as_an_object():
    """Ray pickles the plan into every actor's constructor (any node, no environment to forward), and the trainer's
    step config carries cfg.top with its fast_paths group."""
    plan = kplan.build("sglang", "qwen3_dense_top_v1_deepgemm", "fa3", kplan.FastPaths(fused_head_mean=False),
                       environ={})
    assert pickle.loads(pickle.dumps(plan)) == plan
    top = config.RunConfig().top
    assert pickle.loads(pickle.dumps(top)) == top
    with pytest.raises(AttributeError):
        plan.backend = "reference"  # frozen: decided once


def test_ops_read_the_installed_plan_not_the_environment(monkeypatch):
    from tests.helpers import with_plan
    from top_rl.kernels.sglang import attention_backward

    with_plan(monkeypatch, attention_backward="efficient")
    monkeypatch.setenv("TOP_RL_ATTENTION_BACKWARD", "flash")
    assert attention_backward.configured_backward_kernel(torch.bfloat16) == "efficient"


def test_install_and_report(monkeypatch):
    monkeypatch.setattr(kplan, "_installed", None)
    monkeypatch.setattr(kernels, "_active", None)
    monkeypatch.setattr(fallback, "paths", {})
    monkeypatch.setattr(fallback, "fallbacks", {})
    kernels.install(kplan.build("plain", attention="triton", environ={}))
    assert kernels.backend_name() == "plain" and kernels.current_plan().attention == "triton"

    def broken(x):
        raise RuntimeError("no PTX for this GPU")

    with pytest.warns(RuntimeWarning, match="no PTX"):
        assert fallback.run({}, "rms_norm", "the fused rms_norm", "its eager chain", broken, lambda x: x + 1, 1) == 2
    fallback.run({}, "silu_and_mul", "x", "y", lambda x: x, lambda x: x, 1)
    report = kernels.report()
    assert report["backend"] == "plain" and report["fast_paths"]["attention_backward"] == "flash"
    assert report["paths"] == {"rms_norm": "fallback", "silu_and_mul": "fast"}
    assert list(report["fallbacks"]) == ["rms_norm"] and "no PTX" in report["fallbacks"]["rms_norm"]
    assert kernels.step_metrics([report, report, {"fallbacks": {}}]) == {"kernels/fallbacks": 2}
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.install(kplan.KernelPlan(contract=contract.DEFAULT.name, backend="cutlass"))


def test_a_resume_may_change_the_fast_paths():
    """They change no number (forward bits, gradients): a resumed run may switch them, unlike the contract (the two
    that change the gradients aside: below)."""
    from top_rl.run import checkpoint

    saved = config.RunConfig().as_dict()
    now = config.RunConfig()
    now.top.fast_paths.fused_forward = False
    assert checkpoint.check_compatible(saved, now.as_dict(), allow_changes=False) == []
    now.top.contract = "qwen3_dense_top_v1_deepgemm"
    with pytest.raises(checkpoint.ResumeRefused, match="top.contract"):
        checkpoint.check_compatible(saved, now.as_dict(), allow_changes=False)


@pytest.mark.parametrize("switch, value", [("recompute_attention", True), ("attention_backward", "efficient")])
def test_a_resume_that_changes_the_gradients_kernels_is_a_change_of_numbers(switch, value):
    """The backward's kernel and the recompute's attention forward change the gradients (not the gated forward): a
    resume that switches one is refused like any other change of numbers, and allowed under resume_allow_changes."""
    from top_rl.run import checkpoint

    saved = config.RunConfig().as_dict()
    now = config.RunConfig()
    setattr(now.top.fast_paths, switch, value)
    with pytest.raises(checkpoint.ResumeRefused, match=f"top.fast_paths.{switch}"):
        checkpoint.check_compatible(saved, now.as_dict(), allow_changes=False)
    assert checkpoint.check_compatible(saved, now.as_dict(), allow_changes=True)
