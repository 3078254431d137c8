"""Each refusal of an SGLang engine config fires before any server or GPU exists, with a message that says
what to change (TopConfigError, a ValueError)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys

import pytest

from top_rl import contract

from top_rl.engine.interface import SamplingParams
from top_rl.rollout.sglang.engine import SglangEngine
from top_rl.rollout.sglang.config import SglangEngineConfig, TopConfigError, check_config, check_sampling

V1 = contract.fallback()  # the contract of the installed release (the version check passes): what these engines run under

ENV = {"PATH": "/usr/bin"}


# what an engine takes from the run (sglang_plan.run_defaults): the defaults of top.*, rollout.logprob_source
RUN = {"attention_backend": "fa3", "logprob_source": "prefill", "top": True}


def _cfg(**kw) -> SglangEngineConfig:
    return SglangEngineConfig(**{"model_path": "/models/Qwen3-0.6B", "python": sys.executable, **RUN, **kw})


def test_a_good_config_passes():
    check_config(_cfg(), "fa3", base_env=ENV, top=V1)
    assert issubclass(TopConfigError, ValueError)


def test_installed_version_must_be_the_pin(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.9")
    with pytest.raises(TopConfigError,
                       match=rf"sglang 0.5.9 is installed.*sglang=={V1.sglang_version}.*skip_version_check"):
        check_config(_cfg(), "fa3", base_env=ENV, top=V1)
    check_config(_cfg(skip_version_check=True), "fa3", base_env=ENV, top=V1)  # only an explicit skip passes

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", absent)
    with pytest.raises(TopConfigError, match="sglang is not installed"):
        check_config(_cfg(), "fa3", base_env=ENV, top=V1)


def test_version_of_another_interpreter_is_read_from_it(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 0.4.0\n")
    fake.chmod(0o755)
    with pytest.raises(TopConfigError, match=f"sglang 0.4.0 is installed for {fake}"):
        check_config(_cfg(python=str(fake)), "fa3", base_env=ENV, top=V1)


def test_attention_backend_must_match_the_trainer():
    with pytest.raises(TopConfigError, match="differs from the trainer's 'fa3'.*same value"):
        check_config(_cfg(attention_backend="triton"), "fa3", base_env=ENV, top=V1)
    with pytest.raises(TopConfigError, match="not allowed by the TOP contract"):
        check_config(_cfg(attention_backend="trtllm_mha"), "trtllm_mha", base_env=ENV, top=V1)
    with pytest.raises(TopConfigError, match="differs from the trainer"):  # the engine refuses in its constructor
        SglangEngine(_cfg(attention_backend="flashinfer"), "triton", top=V1)


def test_flashinfer_needs_the_radix_cache_off():
    with pytest.raises(TopConfigError, match="disable_radix_cache=true"):
        check_config(_cfg(attention_backend="flashinfer", disable_radix_cache=False), "flashinfer", base_env=ENV,
                     top=V1)
    check_config(_cfg(attention_backend="fa3", disable_radix_cache=False), "fa3", base_env=ENV, top=V1)


def test_engine_tp_above_one_is_refused_under_top():
    with pytest.raises(TopConfigError, match="no TP>1 parity contract.*tp_size=1"):
        check_config(_cfg(tp_size=2), "fa3", base_env=ENV, top=V1)
    check_config(_cfg(tp_size=2, top=False), "fa3", base_env=ENV, top=V1)  # the non-TOP baseline may shard


@pytest.mark.parametrize("key, value", [
    ("top_p", 0.9), ("top_k", 50), ("min_p", 0.05), ("frequency_penalty", 0.5), ("presence_penalty", 0.1),
    ("repetition_penalty", 1.1), ("min_new_tokens", 4), ("temperature", 0.0), ("temperature", 1e-7),
    ("logit_bias", {"5": 1.0}), ("regex", "a+"), ("n", 2), ("top_logprobs_num", 5),
])
def test_sampling_that_changes_logprobs_is_refused(key, value):
    with pytest.raises(TopConfigError, match=key if key != "top_logprobs_num" else "not checked"):
        check_sampling({"temperature": 1.0, key: value}, top=V1)
    with pytest.raises(TopConfigError):  # through the config's extra sampling params as well
        check_config(_cfg(extra_sampling={key: value}), "fa3", base_env=ENV, top=V1)


def test_contract_sampling_values_pass():
    check_sampling({"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
                    "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0, "max_new_tokens": 8,
                    "stop_token_ids": [2], "sampling_seed": 3, "ignore_eos": False}, top=V1)
    with pytest.raises(ValueError, match="temperature"):  # SamplingParams itself refuses greedy
        SamplingParams(temperature=0.0)


@pytest.mark.parametrize("var", ["SGLANG_RETURN_ORIGINAL_LOGPROB", "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_FALLBACK_VARIANT"])
def test_forbidden_env_is_refused(var):
    with pytest.raises(TopConfigError, match=f"{var}.*launching process.*unset it"):
        check_config(_cfg(), "fa3", base_env={**ENV, var: "1"}, top=V1)
    with pytest.raises(TopConfigError, match=f"{var}.*engine config"):
        check_config(_cfg(env={var: "1"}), "fa3", base_env=ENV, top=V1)


def test_pinned_env_with_another_value_is_refused():
    with pytest.raises(TopConfigError, match="SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM='1'.*pins '0'"):
        check_config(_cfg(), "fa3", base_env={**ENV, "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM": "1"}, top=V1)


def test_other_config_mistakes():
    with pytest.raises(TopConfigError, match="model_path"):
        check_config(_cfg(model_path=""), "fa3", base_env=ENV, top=V1)
    with pytest.raises(TopConfigError, match="logprob_source"):
        check_config(_cfg(logprob_source="sampler"), "fa3", base_env=ENV, top=V1)


@pytest.mark.parametrize("backend", ["fa3", "flashinfer", "triton"])
def test_decode_logprobs_need_a_backend_proven_decode_equals_extend(backend):
    # What the installed release's contract lists is what a live server proved (tests/gpu/test_fa3_decode.py: fa3 on
    # 0.5.11 and on 0.5.17, bench/RESULTS.md sessions 18 and 23)
    assert V1.decode_equals_extend == ("fa3",)
    unproven = dataclasses.replace(V1, decode_equals_extend=())
    with pytest.raises(TopConfigError, match=f"logprob_source='decode' with attention_backend='{backend}'.*not proven"
                                             f".*logprob_source='prefill'.*decode_equals_extend \\(none yet\\)"):
        check_config(_cfg(attention_backend=backend, logprob_source="decode"), backend, base_env=ENV, top=unproven)
    with pytest.raises(TopConfigError, match="logprob_source='decode'"):  # before any server exists
        SglangEngine(_cfg(attention_backend=backend, logprob_source="decode"), backend, top=unproven)
    check_config(_cfg(attention_backend=backend, logprob_source="prefill"), backend, base_env=ENV, top=unproven)
    check_config(_cfg(attention_backend=backend, logprob_source="decode", top=False), backend, base_env=ENV, top=unproven)
    proven = dataclasses.replace(V1, decode_equals_extend=(backend,))
    check_config(_cfg(attention_backend=backend, logprob_source="decode"), backend, proven, base_env=ENV)
    if backend not in V1.decode_equals_extend:  # the installed contract refuses what it does not list
        with pytest.raises(TopConfigError, match=f"decode_equals_extend \\({', '.join(V1.decode_equals_extend) or 'none yet'}\\)"):
            check_config(_cfg(attention_backend=backend, logprob_source="decode"), backend, base_env=ENV, top=V1)
    else:
        check_config(_cfg(attention_backend=backend, logprob_source="decode"), backend, base_env=ENV, top=V1)


def test_port_above_what_sglang_accepts_is_refused():
    """SGLang 0.5.11 opens a gRPC port at port + 10000 and refuses a server whose gRPC port passes 65535."""
    from top_rl.rollout.sglang.config import MAX_PORT

    check_config(_cfg(port=MAX_PORT), "fa3", base_env=ENV, top=V1)
    with pytest.raises(TopConfigError, match=rf"port={MAX_PORT + 1}: SGLang .* port \+ 10000 .*rollout.sglang.port"):
        check_config(_cfg(port=MAX_PORT + 1), "fa3", base_env=ENV, top=V1)


def test_sglang_writes_its_switches_as_true_and_that_is_the_pinned_1():
    """0.5.11's ServerArgs sets SGLANG_ENABLE_DETERMINISTIC_INFERENCE="True" in-process; the contract pins "1"."""
    check_config(_cfg(), "fa3", base_env={**ENV, "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "True"}, top=V1)
    with pytest.raises(TopConfigError, match="SGLANG_ENABLE_DETERMINISTIC_INFERENCE='False'"):
        check_config(_cfg(), "fa3", base_env={**ENV, "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "False"}, top=V1)
