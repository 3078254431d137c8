"""The contract's engine flags parse under SGLang's own CLI parser (`ServerArgs.add_cli_args`) from the
pinned wheel, and mean what the contract intends (docs/numerics.md §1.1-§1.2).

Only the argparse level runs here: `ServerArgs.__post_init__` needs the model's HF config and a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from tests import sglang_cpu

from top_rl import contract

_ERR = sglang_cpu.import_error()
pytestmark = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")

C = sglang_cpu.CONTRACT  # the installed release's contract (0.5.11 from the venv, 0.5.17 in CI's second pass)


def _parse(argv):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        return parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        pytest.fail(f"SGLang {sglang_cpu.SGLANG_VERSION} rejects {argv}: {e}")


def test_contract_pins_this_sglang():
    assert C.sglang_version == sglang_cpu.SGLANG_VERSION
    import sglang

    assert sglang.__version__ == C.sglang_version


@pytest.mark.parametrize("backend", C.attention_backends)
def test_engine_flags_parse(backend):
    argv = [*C.engine_flags, "--model-path", "x", "--attention-backend", backend, "--tp-size", "1",
            "--port", "30000"]
    ns = _parse(argv)
    assert ns.enable_deterministic_inference is True
    assert ns.rl_on_policy_target == "fsdp"
    assert ns.disable_radix_cache is True
    assert ns.attention_backend == backend
    assert getattr(ns, C.release.dest("tensor_parallel_size")) == 1
    for dest, value in C.release.argv_pinned.items():  # what the release's contract pins (0.5.17: eager prefill)
        assert getattr(ns, dest) == value, dest
    assert ns.dtype == "bfloat16"
    assert ns.kv_cache_dtype == "auto"
    assert ns.skip_tokenizer_init is True
    assert ns.port == 30000
    # §1.2: these must stay off (their defaults); the contract must not turn them on.
    assert ns.enable_fp32_lm_head is False
    assert ns.enable_torch_compile is False
    assert ns.enable_mixed_chunk is False

    # The namespace carries every ServerArgs field once from_cli_args' renames are applied, so a real
    # ServerArgs.from_cli_args(ns) would receive each of them (its __post_init__ is not run here).
    from sglang.srt.server_args import ServerArgs

    renames = {"tp_size": "tensor_parallel_size", "pp_size": "pipeline_parallel_size",
               "attn_cp_size": "attention_context_parallel_size", "moe_dp_size": "moe_data_parallel_size",
               "dp_size": "data_parallel_size", "ep_size": "expert_parallel_size"}
    missing = [f.name for f in dataclasses.fields(ServerArgs)  # 0.5.17 parses into the field names themselves
               if not hasattr(ns, f.name) and not hasattr(ns, renames.get(f.name, f.name))]
    # 0.5.17's from_cli_args skips fields with no CLI surface (server_args.py:8463-8470), so they keep their defaults
    no_cli = {"0.5.17": {"custom_sigquit_handler", "stat_loggers", "uses_mamba_radix_cache"}}.get(C.sglang_version, set())
    missing = [m for m in missing if m not in no_cli]
    assert not missing, f"ServerArgs fields absent from the parsed namespace: {missing}"


def test_attention_backend_choices_are_sglangs():
    """§1.1: rl mode accepts only fa3, flashinfer, triton; each must be a known choice of the parser."""
    assert set(C.attention_backends) == {"fa3", "flashinfer", "triton"}
    assert contract.RELEASE_DEFAULTS[sglang_cpu.SGLANG_VERSION] is C
    for backend in C.attention_backends:
        _parse(["--model-path", "x", "--attention-backend", backend])


def test_unknown_flag_is_rejected():
    """The parse is strict, so a typo in the contract would fail the test above."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args(["--model-path", "x", "--enable-deterministic-inferense"])
