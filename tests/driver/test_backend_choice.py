"""`auto` for top.attention_backend / rollout.logprob_source (top_rl/driver/backend_choice.py): the rule, the one place
it is decided (preflight's first check, before anything reads them), where the choice is recorded (the config, the
KernelPlan and so kernels.json, the dry-run plan) and a resume on a GPU where auto would choose otherwise refused."""

from __future__ import annotations

import dataclasses

import pytest

from top_rl import contract, preflight
from top_rl.cli import compose, launch_plan
from top_rl.driver.resolution import kernel_plan
from top_rl.driver import backend_choice
from top_rl.driver.local_gpu import LocalGpu
from top_rl.run.resume_compat import ResumeRefused, check_compatible

H100 = LocalGpu("NVIDIA H100 80GB HBM3", (9, 0), 80 << 30)
B200 = LocalGpu("NVIDIA B200", (10, 0), 180 << 30)
A100 = LocalGpu("NVIDIA A100-SXM4-80GB", (8, 0), 80 << 30)
V11, V17 = contract.QWEN3_DENSE_TOP_V1, contract.QWEN3_DENSE_TOP_V1_SGLANG_0_5_17


@pytest.mark.parametrize("top, gpu, want", [
    (V11, H100, ("fa3", "decode")),  # Hopper, fa3's decode proven under 0.5.11's contract: the exact sampler
    (V17, H100, ("fa3", "decode")),  # proven under 0.5.17's too (sglang-kernel 0.4.5's FA3)
    (contract.QWEN3_DENSE_TOP_V1_DEEPGEMM, H100, ("triton", "prefill")),
    (V11, B200, ("triton", "prefill")),  # SGLang has no fa3 on Blackwell
    (V11, A100, ("triton", "prefill")),
    (V11, None, ("triton", "prefill")),
])
def test_the_rule(top, gpu, want):
    c = backend_choice.choose(top, gpu)
    assert (c.attention_backend, c.logprob_source) == want
    assert (gpu.describe() if gpu else "no GPU visible") in c.why and f"attention {want[0]}, {want[1]}" in c.why


def test_only_the_auto_key_is_decided():
    assert backend_choice.choose(V11, A100, attention="fa3").logprob_source == "decode"  # fa3 named: proven anywhere
    assert backend_choice.choose(V11, H100, attention="triton").logprob_source == "prefill"
    c = backend_choice.choose(V11, H100, source="prefill")
    assert (c.attention_backend, c.logprob_source) == ("fa3", "prefill")


def _gsm8k(*overrides):
    """The GSM8K experiment as composed, its two keys back at the experiment's `auto` (compose decides them as a run's
    preflight would: tested below), for preflight to decide."""
    from top_rl.config.kernels import AttentionBackend
    from top_rl.config.rollout import LogprobSource

    cfg = compose(["+experiment=gsm8k_qwen3_0.6b", "model.path=null", *overrides])
    cfg.top.attention_backend, cfg.rollout.logprob_source = AttentionBackend.auto, LogprobSource.auto
    return cfg


def test_the_shipped_gpu_experiments_say_auto():
    from omegaconf import OmegaConf

    from top_rl.cli import CONF_DIR

    for name in ("gsm8k_qwen3_0.6b", "one_gpu_qwen3_0.6b_sglang", "one_node_qwen3_0.6b_arith", "dapo_qwen3_4b"):
        exp = OmegaConf.load(f"{CONF_DIR}/experiment/{name}.yaml")
        assert (exp.top.attention_backend, exp.rollout.logprob_source) == ("auto", "auto"), name


def test_compose_decides_auto_as_a_run_does(monkeypatch):
    monkeypatch.setattr(backend_choice, "local_gpu", lambda: H100)
    cfg = compose(["+experiment=one_gpu_qwen3_0.6b_sglang", "top.contract=qwen3_dense_top_v1"])
    assert (cfg.top.attention_backend, cfg.rollout.logprob_source) == ("fa3", "decode")
    monkeypatch.setattr(backend_choice, "local_gpu", lambda: None)
    cfg = compose(["+experiment=one_gpu_qwen3_0.6b_sglang"])
    assert (cfg.top.attention_backend, cfg.rollout.logprob_source) == ("triton", "prefill")


def test_preflight_decides_auto_first_and_records_it(monkeypatch, capsys):
    monkeypatch.setattr(backend_choice, "local_gpu", lambda: H100)
    cfg = _gsm8k("top.contract=qwen3_dense_top_v1")
    ready = preflight.check(cfg, preflight.CONFIG_CHECKS)
    assert (cfg.top.attention_backend, cfg.rollout.logprob_source) == ("fa3", "decode")
    assert "NVIDIA H100 80GB HBM3 (sm90)" in ready.backend.why
    assert all(s.attention_backend == "fa3" and s.logprob_source == "decode" for s in ready.sglang)  # the servers'
    assert "[top-rl] attention backend: NVIDIA H100" in capsys.readouterr().out
    plan = kernel_plan(cfg, ready.resolution)  # what every actor installs and reports in kernels.json
    assert plan.attention == "fa3" and plan.as_dict()["attention_chosen_by"] == ready.backend.why
    dry = launch_plan(cfg, ready.resolution)
    assert dry["attention"] == {"backend": "fa3", "logprob_source": "decode", "chosen_by": ready.backend.why}
    assert dry["engines"][0]["attention_backend"] == "fa3" and "--attention-backend fa3" in " ".join(dry["engines"][0]["argv"])


def test_named_values_are_left_alone(monkeypatch):
    monkeypatch.setattr(backend_choice, "local_gpu", lambda: H100)
    cfg = compose(["+experiment=gsm8k_qwen3_0.6b", "model.path=null", "top.attention_backend=triton",
                   "rollout.logprob_source=prefill"])
    ready = preflight.check(cfg, preflight.CONFIG_CHECKS)
    assert ready.backend is None and (cfg.top.attention_backend, cfg.rollout.logprob_source) == ("triton", "prefill")
    assert "attention_chosen_by" not in kernel_plan(cfg).as_dict()


def test_a_cluster_driver_without_a_gpu_is_refused_naming_the_keys(monkeypatch):
    monkeypatch.setattr(backend_choice, "local_gpu", lambda: H100)
    cfg = _gsm8k("cluster.address=ray://head:10001")
    monkeypatch.setattr(backend_choice, "local_gpu", lambda: None)
    with pytest.raises(preflight.Refused, match=r"^top\.attention_backend and rollout\.logprob_source=auto: the "
                                                r"driver sees no GPU .*top\.attention_backend=fa3 rollout\.logprob_source=decode"):
        preflight.check(cfg, (preflight.resolution,))
    local = _gsm8k()  # a local run (or a dry run) without a GPU takes the fallback
    preflight.check(local, (preflight.resolution,))
    assert (local.top.attention_backend, local.rollout.logprob_source) == ("triton", "prefill")


def test_a_resume_where_auto_chooses_otherwise_is_refused(monkeypatch):
    """The checkpoint records the values auto chose (the resolved config in state.json); resumed on a GPU where auto
    chooses otherwise, the run would compute other numbers: refused, naming both keys."""
    def resolved(gpu):
        monkeypatch.setattr(backend_choice, "local_gpu", lambda: gpu)
        cfg = _gsm8k("top.contract=qwen3_dense_top_v1")
        preflight.check(cfg, (preflight.resolution,))
        return cfg.as_dict()

    saved, same, other = resolved(H100), resolved(H100), resolved(A100)
    assert check_compatible(saved, same, allow_changes=False) == []
    with pytest.raises(ResumeRefused, match=r"rollout\.logprob_source: checkpoint 'decode' -> now 'prefill'(.|\n)*"
                                            r"top\.attention_backend: checkpoint 'fa3' -> now 'triton'"):
        check_compatible(saved, other, allow_changes=False)


def test_no_contract_allows_auto():
    assert all("auto" not in c.attention_backends for c in contract.CONTRACTS.values())
    with pytest.raises(ValueError, match="not in the TOP contract"):
        from top_rl.kernels.plan import KernelPlan

        KernelPlan(contract=V11.name, backend="sglang", attention="auto")
    assert dataclasses.replace(V11).decode_refusal("auto") is not None
