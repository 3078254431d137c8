"""The exact `python -m sglang.launch_server` command and environment of one TOP rollout server.

Flags and env come from the TOP contract (top_rl/contract.py); the config adds only what is per-server (model,
address, TP size, memory fraction, attention backend, extra flags). `validate_argv` parses the finished command
with SGLang's own `ServerArgs.add_cli_args` parser and refuses a command whose parsed values contradict the
contract (an extra flag that re-enables something §1.2 of the numerics page requires off, a typo, an override of
a flag the config owns). It imports only SGLang's argument parser, never a GPU module.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Mapping

from top_rl import contract
from top_rl.rollout.sglang_config import SglangEngineConfig, TopConfigError, check_config

MODULE = "sglang.launch_server"
# Flags the config owns: set them through SglangEngineConfig, never through extra_args.
OWNED_FLAGS = {
    "--model-path": "model_path", "--model": "model_path", "--host": "host", "--port": "port",
    "--tp-size": "tp_size", "--tensor-parallel-size": "tp_size", "--attention-backend": "attention_backend",
    "--mem-fraction-static": "mem_fraction_static",
}
_DETERMINISM = ("--enable-deterministic-inference", "--rl-on-policy-target")
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


def engine_flags(cfg: SglangEngineConfig, top: contract.TopContract = contract.DEFAULT) -> list[str]:
    flags = list(top.engine_flags)
    if not cfg.top:  # the non-TOP baseline: SGLang's default (fast, non-deterministic) kernels
        for name in _DETERMINISM:
            if name in flags:
                i = flags.index(name)
                takes_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
                del flags[i: i + (2 if takes_value else 1)]
    if not cfg.disable_radix_cache and "--disable-radix-cache" in flags:
        flags.remove("--disable-radix-cache")
    return flags


def _check_extra_args(extra: list[str]) -> None:
    for tok in extra:
        name = tok.split("=", 1)[0]
        if name in OWNED_FLAGS:
            raise TopConfigError(
                f"extra_args sets {name}; set the engine config's {OWNED_FLAGS[name]} instead (the command builder "
                f"owns that flag, and the trainer reads the same setting)"
            )


def build_launch(cfg: SglangEngineConfig, trainer_attention_backend: str, base_env: Mapping[str, str] | None = None,
                 top: contract.TopContract = contract.DEFAULT, check: bool = True) -> LaunchSpec:
    """Argv and env of the server. `check` runs every config refusal first (tests of the pure builder skip it)."""
    base = dict(os.environ if base_env is None else base_env)
    if check:
        check_config(cfg, trainer_attention_backend, top, base)
    _check_extra_args(cfg.extra_args)
    argv = [cfg.python, "-m", MODULE, "--model-path", cfg.model_path, "--host", cfg.host, "--port", str(cfg.port),
            "--tp-size", str(cfg.tp_size), "--attention-backend", cfg.attention_backend]
    if cfg.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", repr(float(cfg.mem_fraction_static))]
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


def validate_argv(argv: list[str], cfg: SglangEngineConfig, top: contract.TopContract = contract.DEFAULT):
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
            "enable_dp_attention": False}
    if cfg.top:
        # §1.1: both determinism flags (piecewise CUDA graphs stay on with the rl target alone); §1.2: off-flags.
        want.update(enable_deterministic_inference=True, rl_on_policy_target="fsdp", enable_fp32_lm_head=False,
                    enable_torch_compile=False, enable_mixed_chunk=False, speculative_algorithm=None,
                    quantization=None,
                    # 0.5.11: breakable CUDA graphs replace the decode graphs or run them eagerly; the inductor
                    # piecewise compiler changes the q/k-norm path; quantized all-reduces change TP>1 sums
                    debug_cuda_graph=False, enable_breakable_cuda_graph=False, piecewise_cuda_graph_compiler="eager",
                    enable_quant_communications=False)
        if cfg.attention_backend in top.radix_cache_required_off:
            want["disable_radix_cache"] = True
    bad = [f"{k}={getattr(ns, k, '<absent>')!r} (need {v!r})" for k, v in want.items() if getattr(ns, k, None) != v]
    if cfg.top and getattr(ns, "enable_lora", None):
        bad.append("enable_lora=True (need off: LoRA changes the GEMMs)")
    chunk = getattr(ns, "chunked_prefill_size", None)
    need = _MIN_CHUNK.get(cfg.attention_backend)
    if cfg.top and need and chunk is not None and 0 < chunk < need:
        bad.append(f"chunked_prefill_size={chunk} (need >= {need} with {cfg.attention_backend}, §5)")
    if bad:
        raise TopConfigError("the server command contradicts the TOP contract or the engine config: " + "; ".join(bad)
                             + ". Remove the conflicting extra_args or change the engine config")
    return ns
