"""The exact `python -m sglang.launch_server` command and environment of one TOP rollout server.

Flags and env come from the TOP contract (top_rl/contract.py); the config adds only what is per-server (model,
address, TP size, memory fraction, attention backend, extra flags). `validate_argv` parses the finished command
with SGLang's own `ServerArgs.add_cli_args` parser and refuses a command whose parsed values contradict the
contract (an extra flag that re-enables something §1.2 of the numerics page requires off, a typo, an override of
a flag the config owns). It imports only SGLang's argument parser, never a GPU module. `check_extra_args` runs it
before Ray starts (preflight, dry runs) where this interpreter holds the pinned release, else refuses by name.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Mapping

from top_rl import contract, sglang_release
from top_rl.rollout.sglang.config import SglangEngineConfig, TopConfigError, check_config

MODULE = "sglang.launch_server"
# Flags the config owns: set them through SglangEngineConfig, never through extra_args.
OWNED_FLAGS = {
    "--model-path": "model_path", "--model": "model_path", "--host": "host", "--port": "port",
    "--tp-size": "tp_size", "--tensor-parallel-size": "tp_size", "--attention-backend": "attention_backend",
    "--mem-fraction-static": "mem_fraction_static", "--cuda-graph-max-bs": "cuda_graph_max_bs",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs",  # 0.5.17's name of --cuda-graph-max-bs
    "--max-running-requests": "max_running_requests", "--chunked-prefill-size": "chunked_prefill_size",
    "--enable-memory-saver": "enable_memory_saver (cluster.gpu_handoff)",
}
# The config's scheduler sizes, as flags (None: SGLang's own value)
_SIZE_FLAGS = (("--cuda-graph-max-bs", "cuda_graph_max_bs"), ("--max-running-requests", "max_running_requests"),
               ("--chunked-prefill-size", "chunked_prefill_size"))
# What the non-TOP baseline (top=false) keeps of the contract's flags: what the engine needs of any server (token ids in
# and out; the checkpoint's bf16 weights and KV cache, SGLang's own choice for a bf16 checkpoint) and the radix-cache
# switch its config owns. The rest is TOP's numerics (determinism, 0.5.17's eager prefill and torch GEMM), left to
# SGLang's defaults, so the baseline is SGLang's default mode as users run it.
_BASELINE_KEEPS = ("--dtype", "--kv-cache-dtype", "--skip-tokenizer-init", "--disable-radix-cache")
# One engine is one single-process server (TP aside): more ranks come from rollout.num_engines.
_ONE_SERVER = {flag: "one engine is one server with one data- and pipeline-parallel rank: add engines with "
                     "rollout.num_engines" for flag in ("--data-parallel-size", "--dp-size", "--pipeline-parallel-size",
                                                       "--pp-size", "--enable-dp-attention")}
# §5: with flashinfer/triton a chunk budget under 4096 tokens is never scheduled (long prompts stall).
_MIN_CHUNK = {"flashinfer": 4096, "triton": 4096}


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: dict[str, str] = field(repr=False)  # the whole environment of the server process
    env_set: dict[str, str] = field(default_factory=dict)  # what the contract and config set in it
    env_removed: tuple[str, ...] = ()  # forbidden variables stripped from the inherited environment

    def describe(self) -> dict:
        """JSON-able plan (dry runs): the command, and the env entries TOP-RL decides (not the whole env)."""
        return {"argv": list(self.argv), "env": dict(self.env_set), "env_removed": list(self.env_removed)}


def engine_flags(cfg: SglangEngineConfig, top: contract.TopContract) -> list[str]:
    flags = list(top.engine_flags)
    if not cfg.top:  # the non-TOP baseline: SGLang's default mode, keeping only what the engine needs in any mode
        flags = [tok for flag, value in _flag_groups(flags) if flag in _BASELINE_KEEPS for tok in (flag, *value)]
    if not cfg.disable_radix_cache and "--disable-radix-cache" in flags:
        flags.remove("--disable-radix-cache")
    return flags


def _flag_groups(flags: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """`--flag [value]` tokens as (flag, its values) pairs, in order."""
    groups: list[tuple[str, tuple[str, ...]]] = []
    for tok in flags:
        if tok.startswith("--") or not groups:
            groups.append((tok, ()))
        else:
            groups[-1] = (groups[-1][0], (*groups[-1][1], tok))
    return groups


def _check_extra_args(extra: list[str]) -> None:
    for tok in extra:
        name = tok.split("=", 1)[0]
        if name in OWNED_FLAGS:
            raise TopConfigError(
                f"extra_args sets {name}; set the engine config's {OWNED_FLAGS[name]} instead (the command builder "
                f"owns that flag, and the trainer reads the same setting)"
            )


def build_launch(cfg: SglangEngineConfig, trainer_attention_backend: str, base_env: Mapping[str, str] | None = None, *,
                 top: contract.TopContract, check: bool = True) -> LaunchSpec:
    """Argv and env of the server. `check` runs every config refusal first (tests of the pure builder skip it)."""
    base = dict(os.environ if base_env is None else base_env)
    if check:
        check_config(cfg, trainer_attention_backend, top, base)
    _check_extra_args(cfg.extra_args)
    argv = [cfg.python, "-m", MODULE, "--model-path", cfg.model_path, "--host", cfg.host, "--port", str(cfg.port),
            "--tp-size", str(cfg.tp_size), "--attention-backend", cfg.attention_backend]
    if cfg.mem_fraction_static == "auto" and check:  # decided before start (top_rl/driver/memory_choice.py)
        raise TopConfigError("rollout.sglang.mem_fraction_static=auto reached a server's launch undecided: the run's "
                             "pre-start checks decide it (top_rl.preflight.shared_gpu_memory)")
    if cfg.mem_fraction_static not in (None, "auto"):  # auto in a plan or dry run: decided at start
        argv += ["--mem-fraction-static", repr(float(cfg.mem_fraction_static))]
    for flag, key in _SIZE_FLAGS:
        if getattr(cfg, key) is not None:
            flag = top.release.cuda_graph_max_bs_flag if key == "cuda_graph_max_bs" else flag  # the release's name
            argv += [flag, str(int(getattr(cfg, key)))]
    if cfg.enable_memory_saver:
        argv.append("--enable-memory-saver")
    argv += engine_flags(cfg, top) + list(cfg.extra_args)

    env_set = dict(cfg.env)
    removed: tuple[str, ...] = ()
    if cfg.top:
        env_set.update(dict(top.engine_env))
        removed = tuple(k for k in top.forbidden_env if k in base or k in env_set)
    env = {**base, **env_set}
    for k in removed:  # defence in depth: check_config already refused a non-empty value
        env.pop(k, None)
        env_set.pop(k, None)
    return LaunchSpec(argv, env, env_set, removed)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of printing usage and exiting
        raise argparse.ArgumentError(None, message)


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs  # argparse only; imports no GPU module

    parser = _Parser(prog=MODULE, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


def validate_argv(argv: list[str], cfg: SglangEngineConfig, top: contract.TopContract):
    """Parse `argv` (as built above) with SGLang's parser; refuse values that contradict config or contract.
    Returns the parsed namespace."""
    if argv[1:3] != ["-m", MODULE]:
        raise TopConfigError(f"not a `python -m {MODULE}` command: {argv[:3]}")
    try:
        ns = sglang_parser().parse_args(argv[3:])
    except (argparse.ArgumentError, SystemExit) as e:
        raise TopConfigError(f"SGLang {top.sglang_version}'s parser rejects the server command ({e}): fix extra_args") from None
    want = {"model_path": cfg.model_path, "host": cfg.host, "port": cfg.port, "tensor_parallel_size": cfg.tp_size,
            "attention_backend": cfg.attention_backend, "skip_tokenizer_init": True, "dtype": "bfloat16",
            "kv_cache_dtype": "auto", "pipeline_parallel_size": 1, "data_parallel_size": 1,
            "enable_dp_attention": False, "enable_memory_saver": cfg.enable_memory_saver}
    want.update({key: getattr(cfg, key) for _, key in _SIZE_FLAGS if getattr(cfg, key) is not None})
    if cfg.top:
        # §1.1: both determinism flags (piecewise CUDA graphs stay on with the rl target alone).
        want.update(enable_deterministic_inference=True, rl_on_policy_target="fsdp")
        # what the release's contract pins beyond them (0.5.11: the eager piecewise compiler, §4.4; 0.5.17: eager
        # prefill, the torch bf16 GEMM: numerics_0.5.17.md §0.1)
        want.update(top.release.argv_pinned)
        if cfg.attention_backend in top.radix_cache_required_off:
            want["disable_radix_cache"] = True
    release = top.release  # this release's argparse dest of each setting (0.5.17 renamed tp/pp/dp and the graph bs)
    want = {release.dest(k): v for k, v in want.items()}
    bad = [f"{k}={getattr(ns, k, '<absent>')!r} (need {v!r})" for k, v in want.items() if getattr(ns, k, None) != v]
    for flag, why in top.engine_flags_off if cfg.top else ():  # §1.2: a set value (True, a name) turns it on
        value = getattr(ns, flag[2:].replace("-", "_"), None)
        if value:
            bad.append(f"{flag[2:].replace('-', '_')}={value!r} ({flag}: the TOP contract needs it off, {why}, §1.2)")
    chunk = getattr(ns, "chunked_prefill_size", None)
    need = _MIN_CHUNK.get(cfg.attention_backend)
    if cfg.top and need and chunk is not None and 0 < chunk < need:
        bad.append(f"chunked_prefill_size={chunk} (need >= {need} with {cfg.attention_backend}, §5)")
    if bad:
        raise TopConfigError("the server command contradicts the TOP contract or the engine config: " + "; ".join(bad)
                             + ". Remove the conflicting extra_args or change the engine config")
    return ns


def pinned_parser_missing(top: contract.TopContract) -> str | None:
    """None when this interpreter holds SGLang's parser at the contract's pinned release; else why not."""
    have = sglang_release.installed_version()
    if have is None:
        return "SGLang is not installed here"
    if have != top.sglang_version:
        return f"SGLang {have} is installed here, the contract {top.name!r} pins {top.sglang_version}"
    try:
        import sglang.srt.server_args  # noqa: F401  (argparse only)
    except Exception as e:  # a missing light dependency of the wheel
        return f"SGLang's parser does not import here ({type(e).__name__}: {e})"
    return None


def _refused_by_name(cfg: SglangEngineConfig, top: contract.TopContract) -> dict[str, str]:
    """Flag -> why, for every flag extra_args may not name: those the contract pins to a value or needs off, and
    those that would make one engine more than one server."""
    pinned = top.engine_flags if cfg.top else engine_flags(cfg, top)
    out = {flag: f"the TOP contract pins {flag} {value}, §1.2" for flag, value in zip(pinned, pinned[1:])
           if flag.startswith("--") and not value.startswith("--")}
    if cfg.top:
        out.update({flag: f"the TOP contract needs it off, {why}, §1.2" for flag, why in top.engine_flags_off})
    return {**out, **_ONE_SERVER}


def check_extra_args(argv: list[str], cfg: SglangEngineConfig, top: contract.TopContract) -> None:
    """Before Ray starts: refuse extra_args that contradict the contract or the engine config, with SGLang's own
    parser (`validate_argv`, as the engine runs it at launch) where this interpreter holds the pinned release,
    else by name (argparse takes an unambiguous prefix of a flag too, so a prefix of a refused flag is refused)."""
    if not cfg.extra_args:  # the builder's own commands: tests/rollout/test_sglang_launch.py parses every shape
        return
    why_not = pinned_parser_missing(top)
    if why_not is None:
        validate_argv(argv, cfg, top)
        return
    refused = _refused_by_name(cfg, top)
    for tok in cfg.extra_args:
        name = tok.split("=", 1)[0]
        hit = next((f for f in refused if name.startswith("--") and len(name) > 2 and f.startswith(name)), None)
        if hit is not None:
            raise TopConfigError(f"rollout.sglang.extra_args sets {tok!r} ({hit}): {refused[hit]}. Remove it "
                                 f"(checked by name: {why_not})")
