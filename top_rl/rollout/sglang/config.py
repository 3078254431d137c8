"""Configuration of one SGLang rollout server, and the refusals that run before any GPU is touched.

Every refusal raises `TopConfigError` with a message that says what to change. They check what would
silently break bitwise parity with the trainer (numbers cite docs/numerics.md):
the installed SGLang release (the contract is read from one wheel), the attention backend (the trainer runs
the engine's kernel, so both must name the same one), the radix cache (flashinfer must run without it, §5),
the engine TP degree (no TP>1 contract exists in the pinned release, §11.7), `decode` log-probs on an attention
backend whose decode is not proven equal to its extend (contract.decode_equals_extend), sampling settings that change the
returned log-probs or the sampled distribution (§6.3-§6.4), and environment variables the contract pins or
forbids (§1.2-§1.3).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Literal, Mapping

from top_rl import contract, sglang_release
from top_rl.config.sglang import SglangSettings

# SGLang 0.5.11's ServerArgs puts a gRPC port at port + 10000 and refuses a server whose gRPC port would pass 65535
# (sglang/srt/server_args.py, _handle_grpc... in __post_init__), so a server's HTTP port must stay at or below this.
MAX_PORT = 65535 - 10000


class TopConfigError(ValueError):
    """A configuration that would break the TOP contract; the message says what to change."""


# The fields an engine takes from the run (plan.run_defaults), not from rollout.sglang.
FROM_THE_RUN = ("model_path", "attention_backend", "logprob_source", "top")


@dataclass(kw_only=True)
class SglangEngineConfig(SglangSettings):
    """One engine's server config: its settings plus what it takes from the run (no defaults: a caller names each).
    Frozen once built (a dataclass cannot be frozen over the mutable SglangSettings Hydra types, so assignment is
    refused here): what a run resolves, the plan resolves (plan.engine_config); a change is `replace(...)`."""

    model_path: str  # HF checkpoint dir (or hub id) the server loads at start: model.path
    attention_backend: str  # fa3 | flashinfer | triton: top.attention_backend (the trainer's)
    logprob_source: Literal["prefill", "decode"]  # rollout.logprob_source
    top: bool  # top.enabled; False: the non-TOP baseline (no determinism flags, no TOP refusals)
    # --enable-memory-saver (torch_memory_saver): the server can give its weights, KV pool and CUDA graphs back while
    # the trainer on its GPU trains: cluster.gpu_handoff
    enable_memory_saver: bool = False

    def __post_init__(self):
        if not self.python:  # resolved where the config is built, so the resolved config names the interpreter
            object.__setattr__(self, "python", sys.executable)
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: an engine's config is resolved once, by the run plan "
                "(top_rl/rollout/sglang/plan.py); build another with .replace(...)")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}: an engine's config is frozen")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def replace(self, **kw) -> "SglangEngineConfig":
        return dataclasses.replace(self, **kw)


# ------------------------------------------------------------------------------------------ refusals
def check_sglang_version(cfg: SglangEngineConfig, top: contract.TopContract) -> None:
    if cfg.skip_version_check:
        return
    have = sglang_release.installed_version(cfg.python)
    if have != top.sglang_version:
        found = "sglang is not installed" if have is None else f"sglang {have} is installed"
        other = contract.RELEASE_DEFAULTS.get(have or "")
        pick = (f"top.contract={other.name} (sglang {have}'s contract), or " if other else "")
        raise TopConfigError(
            f"{found} for {cfg.python}, but the TOP contract {top.name!r} is read from sglang "
            f"{top.sglang_version}: install sglang=={top.sglang_version} (or use the project's Docker image), or "
            f"{pick}set skip_version_check=true to run anyway (parity is then unproven). The releases with a TOP "
            f"contract: {sglang_release.supported()}"
        )


def check_attention_backend(engine_backend: str, trainer_backend: str,
                            top: contract.TopContract) -> None:
    if engine_backend not in top.attention_backends:
        raise TopConfigError(
            f"attention_backend={engine_backend!r} is not allowed by the TOP contract; choose one of "
            f"{list(top.attention_backends)} (SGLang's deterministic mode accepts only these, §1.1)"
        )
    if engine_backend != trainer_backend:
        raise TopConfigError(
            f"the engine's attention backend {engine_backend!r} differs from the trainer's {trainer_backend!r}: the "
            f"trainer recomputes log-probs with the engine's own attention kernel, so set both to the same value "
            f"(rollout attention_backend and the trainer's attention backend)"
        )


def check_radix_cache(cfg: SglangEngineConfig, top: contract.TopContract) -> None:
    if not cfg.disable_radix_cache and cfg.attention_backend in top.radix_cache_required_off:
        raise TopConfigError(
            f"attention_backend={cfg.attention_backend!r} needs the radix cache disabled (its decode and prefill "
            f"kernels differ, so reused decode KV changes prefill log-probs, §5): set disable_radix_cache=true"
        )


def check_tp(cfg: SglangEngineConfig, top: contract.TopContract) -> None:
    if cfg.tp_size < 1:
        raise TopConfigError(f"tp_size={cfg.tp_size} must be >= 1")
    if cfg.top and cfg.tp_size != 1:
        raise TopConfigError(
            f"tp_size={cfg.tp_size}: SGLang {top.sglang_version} has no TP>1 parity contract (bf16 "
            f"partial sums are all-reduced, §4.8/§11.7); use tp_size=1 and more engines, or top=false for a baseline"
        )


# SGLang's own rules for sampling_params, restricted to what keeps the returned log-probs the contract's.
_LOGIT_CHANGERS = ("logit_bias", "json_schema", "regex", "ebnf", "structural_tag", "custom_params")
_ALLOWED_SAMPLING = {"max_new_tokens", "temperature", "stop_token_ids", "sampling_seed", "ignore_eos"}


def check_sampling(params: Mapping, top: contract.TopContract) -> None:
    """Refuse sampling_params under which the returned log-probs are not the contract's (§6.3-§6.4)."""
    t = params.get("temperature", 1.0)
    if contract.temperature_refusal(t):
        raise TopConfigError(f"sampling temperature={t} {contract.temperature_refusal(t)}")
    for key, want in top.required_sampling:
        if key in params and params[key] is not None and float(params[key]) != float(want):
            raise TopConfigError(
                f"sampling {key}={params[key]!r} changes the sampled distribution or the returned log-probs "
                f"(§6.3-§6.4); TOP requires {key}={want!r}: remove it from the sampling settings"
            )
    for key in _LOGIT_CHANGERS:
        if params.get(key):
            raise TopConfigError(f"sampling {key} modifies logits before sampling (§6.2); TOP runs need it unset")
    if params.get("n", 1) != 1:
        raise TopConfigError(
            f"sampling n={params['n']}: SGLang copies one request n times with the same sampling_seed, giving "
            f"identical completions (§6.3); send one request per sample with distinct seeds (the engine does)"
        )
    unknown = set(params) - _ALLOWED_SAMPLING - {k for k, _ in top.required_sampling} - set(_LOGIT_CHANGERS) - {"n"}
    if unknown:
        raise TopConfigError(
            f"sampling keys {sorted(unknown)} are not checked by the TOP contract; remove them (allowed: "
            f"{sorted(_ALLOWED_SAMPLING | {k for k, _ in top.required_sampling})})"
        )


def check_logprob_source(cfg: SglangEngineConfig, top: contract.TopContract) -> None:
    """`decode` gates the sampler's decode-step log-probs against the trainer's prefill recompute: that holds
    only where the attention backend's decode kernel is proven to equal its extend kernel (the contract's set)."""
    refusal = top.decode_refusal(cfg.attention_backend) if cfg.logprob_source == "decode" else None
    if refusal:
        proven = ", ".join(top.decode_equals_extend) or "none yet"
        raise TopConfigError(
            f"logprob_source='decode' with attention_backend={cfg.attention_backend!r}: {refusal}. Use "
            f"logprob_source='prefill' (the engine re-scores each sample with a prefill), or a backend in the "
            f"contract's decode_equals_extend ({proven})"
        )


def check_env(env: Mapping[str, str], where: str, top: contract.TopContract) -> None:
    """Forbidden variables set, or a pinned variable set to another value, in `env`."""
    for key in top.forbidden_env:
        if env.get(key):
            raise TopConfigError(
                f"{key}={env[key]!r} is set in {where}; the TOP contract forbids it (it changes the returned "
                f"log-probs or the GEMM kernel, §1.2-§1.3): unset it"
            )
    for key, want in top.engine_env:
        if key in env and not contract.same_env_value(env[key], want):
            raise TopConfigError(
                f"{key}={env[key]!r} in {where}, but the TOP contract pins {want!r} on both sides: unset it or set {want!r}"
            )


def check_config(cfg: SglangEngineConfig, trainer_attention_backend: str,
                 top: contract.TopContract, base_env: Mapping[str, str] | None = None,
                 check_version: bool = True) -> None:
    """Every refusal that needs no GPU and no server, in the order a user would fix them. `check_version=False`
    defers the installed-release check to where the server is launched (the engine's start())."""
    if not cfg.model_path:
        raise TopConfigError("model_path is empty: set it to the HF checkpoint the server loads")
    if cfg.logprob_source not in ("prefill", "decode"):
        raise TopConfigError(f"logprob_source={cfg.logprob_source!r}; choose 'prefill' or 'decode'")
    if not 1 <= cfg.port <= MAX_PORT:
        raise TopConfigError(
            f"port={cfg.port}: SGLang 0.5.11 also opens port + 10000 for gRPC and refuses a port above "
            f"{MAX_PORT} (TOP-RL keeps that bound for every release); set rollout.sglang.port so that port + num_engines - 1 <= {MAX_PORT} (e.g. 30000)")
    if check_version:
        check_sglang_version(cfg, top)
    check_tp(cfg, top)
    if cfg.top:
        check_attention_backend(cfg.attention_backend, trainer_attention_backend, top)
        check_radix_cache(cfg, top)
        check_logprob_source(cfg, top)
        check_env(cfg.env, "the engine config's env", top)
        check_env(os.environ if base_env is None else base_env, "the launching process's environment", top)
        check_sampling({"temperature": 1.0, **cfg.extra_sampling}, top)


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port SGLang accepts (<= MAX_PORT: it reserves port + 10000 for gRPC); the OS's ephemeral range
    reaches past it."""
    import random
    import socket

    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(20000, MAX_PORT)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 20000..{MAX_PORT} on {host}")
