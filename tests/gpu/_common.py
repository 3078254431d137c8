"""Shared builders for the GPU tests and benchmarks (bench/ imports these too)."""

from __future__ import annotations

import os

import pytest
import torch

from top_rl.model import Qwen3, Qwen3Config

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tests/gpu)")

# Qwen3-0.6B's shape with a reduced vocabulary (32000: not a multiple of lsm_BI's 1024 block).
QWEN3_06B = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                 rope_theta=1_000_000.0, max_position_embeddings=8192, tie_word_embeddings=True,
                 torch_dtype="bfloat16", eos_token_id=None)


@torch.no_grad()
def device_model(seed: int = 0, std: float = 0.02, **overrides) -> Qwen3:
    """A random Qwen3 built and initialised on the GPU (a CPU init of 0.5B parameters is slow)."""
    cfg = Qwen3Config(**{**QWEN3_06B, **overrides})
    model = Qwen3(cfg, "bfloat16").to("cuda")  # built on CPU: the RoPE cache is made as the model makes it
    g = torch.Generator(device="cuda").manual_seed(seed)
    for p in model.parameters():
        if p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g, device="cuda") * std)
        else:  # norm weights near 1, not exactly 1
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device="cuda"))
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def decode_equals_extend_claimed(attention_backend: str) -> bool:
    """Whether any TOP contract claims `attention_backend`'s decode kernel gives its extend kernel's bits
    (contract.decode_equals_extend): then the caller asserts equal bits. Every contract that does not claim it
    must refuse `logprob_source=decode` with that backend, which this checks (a bitwise claim is asserted or
    refused, never only reported; bench/probes.py prints the measured bits)."""
    from top_rl import contract
    from top_rl.cli import compose
    from top_rl.config import ConfigError

    claimed = False
    for name, c in contract.CONTRACTS.items():
        if attention_backend in c.decode_equals_extend:
            claimed = True
            continue
        with pytest.raises(ConfigError, match=r"rollout\.logprob_source=decode with top\.kernels=sglang"):
            compose([f"top.contract={name}", "top.kernels=sglang", f"top.attention_backend={attention_backend}",
                     "rollout.logprob_source=decode"])
    return claimed


# A live SGLang server (`python -m sglang.launch_server`) and its scheduler import these beyond sglang itself
# (scripts/gpu_bundle.sh's sglang_server group carries them; tests/repo/test_gpu_bundle.py checks the modules import):
# a machine that lacks one starts a server that exits with code 1, so the live tests check first and skip naming it.
SERVER_DEPENDENCIES = ("fastapi", "uvicorn", "uvloop", "zmq", "orjson", "multipart", "setproctitle", "openai_harmony",
                       "sgl_kernel")
BACKEND_DEPENDENCIES = {"flashinfer": ("flashinfer",)}
SERVER_MODULES = ["sglang.launch_server", "sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler",
                  "sglang.srt.model_executor.model_runner", "sglang.srt.models.qwen3", "sglang.srt.layers.sampler",
                  "sglang.srt.layers.attention.triton_backend", "sglang.srt.managers.detokenizer_manager",
                  "sglang.srt.model_loader.loader"]

_PROBE = r"""
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError as e:  # a module a server could not import either (another failure is the test's to show)
        print(json.dumps([getattr(e, "name", None) or name, f"{type(e).__name__}: {e}"]))
        break
else:
    print("null")
"""


def missing_server_module(backend: str = "triton", python: str | None = None,
                          env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """The first module a live SGLang server with `backend` attention needs that `python` (this interpreter by default,
    as SglangEngineConfig.python) cannot import, and the error; None when all import. Imported in a child process, as
    the server would, so nothing is loaded into this one."""
    import json
    import subprocess
    import sys

    extra = BACKEND_DEPENDENCIES.get(backend, ())
    names = [*SERVER_DEPENDENCIES, *extra, *SERVER_MODULES,
             *([f"sglang.srt.layers.attention.{backend}_backend"] if extra else [])]
    env = dict(os.environ if env is None else env)
    env.pop("SGLANG_USE_CPU_ENGINE", None)  # tests/sglang_cpu.py's CPU switch is no server's setting
    out = subprocess.run([python or sys.executable, "-W", "ignore", "-c", _PROBE, json.dumps(names)],
                         capture_output=True, text=True, timeout=600, env=env)
    last = out.stdout.strip().splitlines()[-1:] or ["null"]
    found = json.loads(last[0]) if out.returncode == 0 else None
    return tuple(found) if found else None
