"""Probes, not tests: numbers that explain the contract's choices, printed as one table. None is a pass/fail
claim; each claim they explain is asserted in tests/gpu (or refused by the contract), named in the last column.

    python bench/probes.py              the `sglang` kernels on CUDA (attention: TOP_RL_ATTENTION_BACKEND, else triton)
    python bench/probes.py --cpu-smoke  tiny shapes, `reference` kernels on CPU: checks the script, not the numbers

Rows:
  stock GEMM row drift       a row of torch's M=1 product vs the same row in an M=4096 product (cuBLAS picks
                             another kernel per shape): why every GEMM goes through kernels.linear
  decode vs prefill          bits of the last query row, decode kernel vs extend kernel: why logprob_source=decode is
                             refused unless the contract lists the backend in decode_equals_extend
  compiled vs eager RoPE     fp32 elements where the engine's RoPE (kernels.rope) differs from the eager formula
                             (Megatron's unfused RoPE): why the trainer applies kernels.rope
  sampler decode vs prefill  the native engine's decode-time sampler log-probs (T=0.7) equal to a packed prefill
                             recompute: what a logprob_source=decode gate would compare
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

import torch  # noqa: E402

from bench._util import table  # noqa: E402
from top_rl import kernels  # noqa: E402
from top_rl.kernels import plan, reference  # noqa: E402
from top_rl.model import sequence_logprobs  # noqa: E402
from top_rl.engine.interface import SamplingParams  # noqa: E402
from top_rl.rollout.native.engine import NativeEngine  # noqa: E402

# (hidden, heads q / kv, head dim, rows of the big GEMM, decode lengths, rope tokens, prompt lengths, new tokens)
FULL = dict(hidden=1024, hq=16, hkv=8, d=128, m=4096, lengths=(1, 100, 613), rope_tokens=4096,
            prompts=(9, 250, 1200), new_tokens=10)
SMOKE = dict(hidden=64, hq=4, hkv=2, d=16, m=64, lengths=(1, 7, 40), rope_tokens=64, prompts=(3, 9), new_tokens=3)


def gemm_drift(s, device):
    k, n = s["hidden"], s["hq"] * s["d"] + 2 * s["hkv"] * s["d"]  # the qkv projection
    w = (torch.randn(n, k, device=device) * 0.02).bfloat16()
    x = torch.randn(s["m"], k, device=device).bfloat16()
    diff = (torch.nn.functional.linear(x[:1], w) - torch.nn.functional.linear(x, w)[:1]).abs().max().item()
    return ["stock GEMM row drift", f"qkv {k}x{n}, M=1 vs M={s['m']}", f"max abs diff {diff:.3g}",
            "tests/gpu/test_invariance.py::test_linear"]


def decode_vs_prefill(s, device):
    d, rows = s["d"], []
    for n in s["lengths"]:
        g = torch.Generator(device=device).manual_seed(n)
        q, k, v = (torch.randn(n, h, d, generator=g, device=device).bfloat16() for h in (s["hq"], s["hkv"], s["hkv"]))
        cu = torch.tensor([0, n], device=device)
        pre = kernels.attention(q, k, v, cu, d**-0.5)[-1]
        dec = kernels.decode_attention(q[-1:], k[None], v[None], torch.tensor([n], device=device), d**-0.5)[0]
        gap = (pre.float() - dec.float()).abs().max().item()
        rows.append(f"{n}: equal" if torch.equal(pre, dec) else f"{n}: differ (max {gap:.2g})")
    return ["decode vs prefill", f"last row, lengths {', '.join(map(str, s['lengths']))}", "; ".join(rows),
            "tests/gpu/test_invariance.py::test_decode_vs_prefill_bits_are_equal_or_refused"]


def rope(s, device):
    t, d = s["rope_tokens"], s["d"]
    cos_sin = kernels.rope_cache(d, 1_000_000.0, 8192).to(device)
    x = torch.randn(t, s["hq"], d, device=device)
    pos = torch.randint(0, 8192, (t,), device=device)
    engine, eager = kernels.rope(x, pos, cos_sin), reference.rope(x, pos, cos_sin)
    n = int((engine != eager).sum())
    return ["compiled vs eager RoPE", f"fp32 [{t}, {s['hq']}, {d}]",
            f"{n}/{engine.numel()} differ, max {(engine - eager).abs().max().item():.2g}",
            "tests/gpu/test_invariance.py::test_compiled_rope_is_close_to_eager"]


def sampler(s, device, model):
    engine = NativeEngine(model, logprob_source="decode")
    rng = random.Random(3)
    vocab = model.cfg.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in s["prompts"]]
    samples = engine.generate(prompts, seeds=list(range(5, 5 + len(prompts))),
                              params=SamplingParams(max_new_tokens=s["new_tokens"], temperature=0.7))
    with torch.no_grad():
        ref = sequence_logprobs(model, [p.prompt_ids + p.response_ids for p in samples],
                                [len(p.prompt_ids) for p in samples], 0.7)
    decode = [torch.tensor(p.sample_logprobs, dtype=r.dtype) for p, r in zip(samples, ref)]
    equal = sum(int((r.cpu() == dd).sum()) for r, dd in zip(ref, decode))
    return ["sampler decode vs prefill", f"native engine, T=0.7, prompts {', '.join(map(str, s['prompts']))}",
            f"{equal}/{sum(len(dd) for dd in decode)} tokens equal",
            "tests/gpu/test_model_parity.py::test_sampler_path_recompute_is_packing_invariant"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, reference kernels on CPU")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    if args.cpu_smoke:
        from tests.helpers import tiny_model

        device, s, backend, attention = "cpu", SMOKE, "reference", "-"
        model = tiny_model("bfloat16", seed=0)
    else:
        from tests.gpu._common import device_model
        from top_rl.kernels.sglang import attention as sglang_attention

        device, s, backend = "cuda", FULL, "sglang"
        attention = os.environ.get(plan.ATTENTION_ENV, "triton")  # the variable kernels/plan.py reads
        sglang_attention.set_attention_backend(attention)
        model = device_model(seed=0)
    with kernels.use_plan(dataclasses.replace(plan.current(), backend=backend)):
        rows = [gemm_drift(s, device), decode_vs_prefill(s, device), rope(s, device), sampler(s, device, model)]
    print(table(f"probes: {backend} kernels on {device}, attention {attention}",
                ["probe", "shape", "result", "claim asserted by"], rows))


if __name__ == "__main__":
    main()
