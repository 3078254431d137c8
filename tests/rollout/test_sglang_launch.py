"""Every SGLang server command TOP-RL can generate parses under SGLang 0.5.11's own parser
(`ServerArgs.add_cli_args`, from the pinned wheel) and carries the contract's flags and env.

Only argparse runs here: a real server needs a GPU (docs/architecture.md, "What cannot run on these machines").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import sglang_cpu

from top_rl import contract  # noqa: E402
from top_rl.rollout.sglang.config import SglangEngineConfig, TopConfigError, check_config  # noqa: E402
from top_rl.rollout.sglang.launch import MODULE, build_launch, engine_flags, validate_argv  # noqa: E402

_ERR = sglang_cpu.import_error()
needs_sglang = pytest.mark.skipif(_ERR is not None, reason=_ERR or "")
C = sglang_cpu.CONTRACT  # the installed release's contract (0.5.11 from the venv, 0.5.17 in CI's second pass)
R = C.release  # its adapter: the parser's dests (top_rl/sglang_release/)
ENV = {"PATH": "/usr/bin", "HOME": "/root"}


# what an engine takes from the run (sglang_plan.run_defaults): the defaults of top.*, rollout.logprob_source
RUN = {"attention_backend": "fa3", "logprob_source": "prefill", "top": True}


def _cfg(**kw) -> SglangEngineConfig:
    return SglangEngineConfig(**{"model_path": "/models/Qwen3-0.6B", "python": sys.executable, **RUN, **kw})


def _commands():
    """Every shape the project's configs produce: TOP with each backend (radix on/off where allowed),
    the non-TOP baseline at several TP sizes, with and without extra flags."""
    out = []
    for b in C.attention_backends:
        out.append(_cfg(attention_backend=b))
        out.append(_cfg(attention_backend=b, port=31001, host="0.0.0.0", mem_fraction_static=None,
                        chunked_prefill_size=8192, extra_args=["--log-level", "warning"]))
        out.append(_cfg(attention_backend=b, cuda_graph_max_bs=512, max_running_requests=512, enable_memory_saver=True))
        if b not in C.radix_cache_required_off:
            out.append(_cfg(attention_backend=b, disable_radix_cache=False))
        for tp in (1, 2, 4, 8):
            out.append(_cfg(attention_backend=b, tp_size=tp, top=False))
    return out


@needs_sglang
@pytest.mark.parametrize("cfg", _commands(), ids=lambda c: f"{c.attention_backend}-tp{c.tp_size}-top{int(c.top)}"
                         f"-radix{int(not c.disable_radix_cache)}-x{len(c.extra_args)}")
def test_every_command_parses_and_carries_the_contract(cfg):
    spec = build_launch(cfg, cfg.attention_backend, base_env=ENV, check=cfg.top, top=C)
    assert spec.argv[:3] == [sys.executable, "-m", MODULE]
    ns = validate_argv(spec.argv, cfg, top=C)  # SGLang's parser + contract checks on the parsed values
    assert ns.attention_backend == cfg.attention_backend and getattr(ns, R.dest("tensor_parallel_size")) == cfg.tp_size
    assert ns.port == cfg.port and ns.host == cfg.host and ns.model_path == cfg.model_path
    assert ns.skip_tokenizer_init is True and ns.dtype == "bfloat16" and ns.kv_cache_dtype == "auto"
    if cfg.mem_fraction_static is not None:
        assert ns.mem_fraction_static == cfg.mem_fraction_static
    if cfg.top:
        flags = list(C.engine_flags if cfg.disable_radix_cache else [f for f in C.engine_flags if f != "--disable-radix-cache"])
        i = spec.argv.index(flags[0])
        assert spec.argv[i:i + len(flags)] == flags  # the contract's flags, verbatim and in order
        assert ns.enable_deterministic_inference is True and ns.rl_on_policy_target == "fsdp"
        assert ns.disable_radix_cache is cfg.disable_radix_cache
        for k, v in C.engine_env:
            assert spec.env[k] == v and spec.env_set[k] == v
    else:
        assert ns.enable_deterministic_inference is False and ns.rl_on_policy_target is None
        assert "--rl-on-policy-target" not in spec.argv and "fsdp" not in spec.argv
    assert spec.argv[-len(cfg.extra_args):] == cfg.extra_args if cfg.extra_args else True
    assert all(spec.env[k] == v for k, v in ENV.items())  # the inherited environment is kept
    json.dumps(spec.describe())  # dry-run plans print it


def test_builder_needs_no_sglang_and_strips_forbidden_env():
    cfg = _cfg(attention_backend="triton", env={"NCCL_DEBUG": "WARN"})
    spec = build_launch(cfg, "triton", base_env={**ENV, "SGLANG_RETURN_ORIGINAL_LOGPROB": ""}, check=False, top=C)
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" not in spec.env
    assert spec.env_removed == ("SGLANG_RETURN_ORIGINAL_LOGPROB",)
    assert spec.env["NCCL_DEBUG"] == "WARN" and spec.env_set["NCCL_DEBUG"] == "WARN"
    assert "PATH" not in spec.describe()["env"]  # the plan shows what TOP-RL sets, not the whole environment


@pytest.mark.parametrize("top", list(contract.CONTRACTS.values()), ids=lambda c: c.name)
def test_the_non_top_baseline_is_sglangs_default_mode(top):
    """top=false keeps of the contract's flags only what any server of this engine needs (token ids in and out, the
    bf16 checkpoint's dtypes) and the radix-cache switch its config owns: no determinism flag, and none of 0.5.17's
    eager prefill or torch GEMM, which are TOP's numerics, not SGLang's default mode."""
    baseline = ["--dtype", "bfloat16", "--kv-cache-dtype", "auto", "--skip-tokenizer-init"]
    assert engine_flags(_cfg(top=False, disable_radix_cache=False), top=top) == baseline
    assert engine_flags(_cfg(top=False), top=top) == ["--dtype", "bfloat16", "--kv-cache-dtype", "auto",
                                                      "--disable-radix-cache", "--skip-tokenizer-init"]
    assert engine_flags(_cfg(), top=top) == list(top.engine_flags)  # TOP's flags stay the contract's, verbatim


@pytest.mark.parametrize("extra", [["--tp-size", "2"], ["--port=31000"], ["--attention-backend", "triton"],
                                   ["--model", "x"], ["--mem-fraction-static", "0.9"]])
def test_extra_args_cannot_override_owned_flags(extra):
    with pytest.raises(TopConfigError, match="instead"):
        build_launch(_cfg(extra_args=extra), "fa3", base_env=ENV, check=False, top=C)


@needs_sglang
@pytest.mark.parametrize("extra, why", [
    (["--enable-torch-compile"], "enable_torch_compile"),
    (["--enable-fp32-lm-head"], "enable_fp32_lm_head"),
    (["--enable-mixed-chunk"], "enable_mixed_chunk"),
    (["--dtype", "float16"], "dtype"),
    (["--dp-size", "2"], R.dest("data_parallel_size")),
    (["--attention-backen", "triton"], "attention_backend"),  # argparse prefix of --attention-backend
    (["--attention", "triton"], "ambiguous"),
    (["--enable-deterministic-inferense"], "parser rejects"),
    # flags new in 0.5.11 that change the decode graphs, the q/k-norm path or TP sums
    (["--debug-cuda-graph"], "debug_cuda_graph"),
    # 0.5.17 parses these into the per-phase graph settings its contract pins (numerics_0.5.17.md §0.2)
    (["--enable-breakable-cuda-graph"], {"0.5.11": "enable_breakable_cuda_graph"}.get(R.version,
                                                                                       "cuda_graph_backend_prefill")),
    (["--piecewise-cuda-graph-compiler", "inductor"], {"0.5.11": "piecewise_cuda_graph_compiler"}.get(
        R.version, "cuda_graph_tc_compiler")),
    (["--enable-quant-communications"], "enable_quant_communications"),
] + ([  # flags 0.5.17 added that undo its contract's eager prefill or mm_BI linears
    (["--cuda-graph-backend-prefill", "breakable"], "cuda_graph_backend_prefill"),
    (["--enforce-piecewise-cuda-graph"], "cuda_graph_backend_prefill"),
    (["--bf16-gemm-backend", "cutedsl"], "bf16_gemm_backend"),
    (["--cuda-graph-backend-decode", "breakable"], "cuda_graph_backend_decode"),
    (["--cuda-graph-tc-compiler", "inductor"], "cuda_graph_tc_compiler"),
] if R.version == "0.5.17" else []))
def test_parser_check_refuses_contradicting_extra_args(extra, why):
    cfg = _cfg(extra_args=extra)
    spec = build_launch(cfg, "fa3", base_env=ENV, check=False, top=C)
    with pytest.raises(TopConfigError, match=why):
        validate_argv(spec.argv, cfg, top=C)


@needs_sglang
def test_parser_check_refuses_small_chunks_with_flashinfer():
    cfg = _cfg(attention_backend="flashinfer", chunked_prefill_size=2048)
    with pytest.raises(TopConfigError, match="chunked_prefill_size=2048"):
        validate_argv(build_launch(cfg, "flashinfer", base_env=ENV, check=False, top=C).argv, cfg, top=C)
    cfg = _cfg(attention_backend="fa3", chunked_prefill_size=2048)  # fa3 has no alignment
    validate_argv(build_launch(cfg, "fa3", base_env=ENV, check=False, top=C).argv, cfg, top=C)


# ------------------------------------------------------------------------------------ from the run config
def _sglang_experiments():
    """The shipped experiments whose rollout engine is SGLang (the others launch no server)."""
    from top_rl.cli import CONF_DIR, compose

    names = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("*.yaml"))
    return [n for n in names if compose([f"+experiment={n}"]).rollout.engine == "sglang"]


@needs_sglang
@pytest.mark.parametrize("experiment", _sglang_experiments())
def test_shipped_experiments_plan_commands_sglang_accepts(experiment):
    from top_rl.cli import compose
    from top_rl.rollout.sglang.plan import engine_config, initial_policy_dir, launch_plan

    run = compose([f"+experiment={experiment}"])
    ports = set()
    for i in range(run.rollout.num_engines):
        plan = launch_plan(run, index=i)
        cfg = engine_config(run, i)  # as the run plans it (cluster.gpu_handoff sets the memory saver)
        ns = validate_argv(plan["argv"], cfg, top=C)
        # without model.path the servers start from the run's random initial policy (written at start)
        want_model = run.model.path or str(initial_policy_dir(run.run_dir))
        assert ns.attention_backend == run.top.attention_backend and ns.model_path == want_model
        ports.add(ns.port)
    assert len(ports) == run.rollout.num_engines  # engines sharing a node never share a port


def test_run_config_mapping():
    from top_rl.rollout.sglang.plan import config_from_dict

    cfg = config_from_dict({"port": 31000, "extra_args": ("--log-level", "warning")}, 2, model_path="/m",
                           attention_backend="triton", top=True, logprob_source="prefill")
    assert (cfg.port, cfg.attention_backend, cfg.extra_args, cfg.logprob_source) == (31002, "triton",
                                                                                     ["--log-level", "warning"], "prefill")
    with pytest.raises(TopConfigError, match="unknown keys \\['tp'\\]"):
        config_from_dict({"tp": 2})
    with pytest.raises(TopConfigError, match=r"takes \['attention_backend', 'logprob_source', 'top'\] from the run"):
        config_from_dict({}, model_path="/m")  # an engine config names what it takes from the run
    with pytest.raises(TopConfigError, match="differs from the trainer's 'fa3'"):
        check_config(config_from_dict({"attention_backend": "triton"}, model_path="/m", attention_backend="fa3",
                                      top=True, logprob_source="prefill"), "fa3", C, check_version=False)


def test_rollout_sglang_is_typed_by_hydra_from_the_engine_config():
    """`rollout.sglang.<key>=v` needs no `+`, Hydra checks its kind, the resolved config records every engine setting,
    and the node is SglangSettings itself (one class, one default per key); what an engine takes from the run
    (checkpoint, attention backend, log-prob source, TOP on/off) is no key of it but comes from model.* / top.* /
    rollout.logprob_source."""
    import dataclasses

    from top_rl.cli import compose
    from top_rl.config import ConfigError
    from top_rl.rollout.sglang.config import FROM_THE_RUN, SglangSettings
    from top_rl.rollout.sglang.plan import engine_config

    assert type(compose(["rollout=sglang"]).rollout.sglang) is SglangSettings
    engine_fields = {f.name for f in dataclasses.fields(SglangEngineConfig)}
    # enable_memory_saver: cluster.gpu_handoff's (run_defaults), False where a caller leaves it out
    assert engine_fields == {f.name for f in dataclasses.fields(SglangSettings)} | set(FROM_THE_RUN) | {"enable_memory_saver"}
    assert not set(FROM_THE_RUN) & {f.name for f in dataclasses.fields(SglangSettings)}

    run = compose(["rollout=sglang", "model.path=/m", "rollout.sglang.mem_fraction_static=0.45",
                   "rollout.sglang.port=31000", "+rollout.sglang.env.SGLANG_LOG_LEVEL=1"])
    assert run.as_dict()["rollout"]["sglang"]["request_timeout_s"] == 1800.0  # recorded, not implied
    cfg = engine_config(run, index=1)
    assert (cfg.mem_fraction_static, cfg.port, cfg.env, cfg.model_path, cfg.top) == (0.45, 31001,
                                                                                     {"SGLANG_LOG_LEVEL": "1"}, "/m", True)
    assert cfg.attention_backend == run.top.attention_backend and cfg.python == sys.executable  # "": this one
    for key in FROM_THE_RUN:  # a key that could only repeat (or contradict) the run's is no key
        with pytest.raises(ConfigError, match=f"Key '{key}' not in 'SglangSettings'"):
            compose(["rollout=sglang", f"rollout.sglang.{key}=x"])
    with pytest.raises(ConfigError, match="Error merging override rollout.sglang.port=abc .*converted to Integer"):
        compose(["rollout=sglang", "rollout.sglang.port=abc"])
    with pytest.raises(ConfigError, match="Could not override 'rollout.sglang.mem_fractio_static'.*"
                                          "Key 'mem_fractio_static' not in 'SglangSettings'"):
        compose(["rollout=sglang", "rollout.sglang.mem_fractio_static=0.5"])


def test_the_memory_saver_comes_from_cluster_gpu_handoff_and_is_refused_by_hand():
    from top_rl.cli import compose
    from top_rl.rollout.sglang.plan import engine_config

    base = ["rollout=sglang", "model.path=/m"]
    assert engine_config(compose(base)).enable_memory_saver is False
    on = engine_config(compose([*base, "cluster.gpu_handoff=true"]))
    assert on.enable_memory_saver is True
    assert "--enable-memory-saver" in build_launch(on, on.attention_backend, base_env=ENV, check=False, top=C).argv
    from top_rl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.sglang.enable_memory_saver was removed: cluster.gpu_handoff=true"):
        compose([*base, "rollout.sglang.enable_memory_saver=true"])  # the key is gone: named, with the fix


def test_disk_pushed_weights_default_to_the_run_dir_not_the_system_temp_dir(tmp_path, monkeypatch):
    """Issue 54: without rollout.sglang.weights_dir an engine wrote each version (and its server log beside them) to a
    mkdtemp in /tmp, never removed. The default is resolved on the driver, under run_dir, one directory per engine."""
    from top_rl.cli import compose
    from top_rl.rollout.sglang.plan import engine_config

    monkeypatch.chdir(tmp_path)  # run_dir relative: the engine's actor runs in another working directory
    base = ["rollout=sglang", "model.path=/m", "run_dir=runs/r"]
    for i in (0, 1):
        cfg = engine_config(compose(base), index=i)
        assert cfg.weights_dir == str(tmp_path / "runs" / "r" / "engines" / str(i))
    assert not (tmp_path / "runs").exists()  # planned, not written: pre-flight only reads
    chosen = engine_config(compose([*base, f"rollout.sglang.weights_dir={tmp_path / 'w'}"]))
    assert chosen.weights_dir == str(tmp_path / "w")
