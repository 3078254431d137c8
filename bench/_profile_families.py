"""Where a training step's GPU time goes, by op family, from one torch.profiler step.

Each GPU kernel is attributed to the CPU op that launched it; that op's ancestors (same thread) decide the
family, innermost first: a marker range (`top::<seam op>` around the TOP kernel seam, `bench::<op>` around the
stock modules), else an autograd backward node (`autograd::engine::evaluate_function: <Node>`, named after the
autograd.Function), else an aten op. The phase: under an evaluate_function range = backward; a forward marker
inside the backward = activation recompute. Kernels no CPU op claims are "unattributed"; wall time the GPU
is idle (launch gaps, host syncs) is "GPU idle". On CPU (the smoke test) each op's self CPU time stands in for
kernels, so the same attribution runs without a GPU.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter, defaultdict

import torch
from torch.autograd.profiler import record_function

FAMILIES = ["GEMM fwd", "GEMM bwd", "GEMM fwd (recompute)", "attention fwd", "attention bwd",
            "attention fwd (recompute)", "norms", "RoPE", "SwiGLU", "log-softmax", "optimizer", "communication",
            "grad accumulation", "other", "unattributed", "GPU idle"]

FWD_MARKERS = {
    "top::linear": "GEMM", "top::row_linear": "GEMM", "top::rms_norm": "norms", "top::rope": "RoPE",
    "top::attention": "attention", "top::silu_and_mul": "SwiGLU", "top::prefill_logprobs": "log-softmax",
    "top::sample_logprobs": "log-softmax",
    "bench::linear": "GEMM", "bench::norm": "norms", "bench::rope": "RoPE", "bench::attention": "attention",
    "bench::swiglu": "SwiGLU", "bench::logprobs": "log-softmax",
}
_BWD_NODES = [
    (re.compile(r"_Linear|_RowLinear|LinearWithGradAccumulation|^MmBackward|^AddmmBackward|^BmmBackward"), "GEMM"),
    (re.compile(r"Attention|Flash|Cudnn|Efficient|Varlen", re.I), "attention"),
    (re.compile(r"RMSNorm|RmsNorm|LayerNorm", re.I), "norms"),
    (re.compile(r"Rope|Rotary", re.I), "RoPE"),
    (re.compile(r"Logprob|LogSoftmax|CrossEntropy", re.I), "log-softmax"),
    (re.compile(r"Silu|SwiGLU", re.I), "SwiGLU"),
    (re.compile(r"AccumulateGrad"), "grad accumulation"),
]
_ATEN = [(re.compile(r"^aten::(mm|addmm|bmm|matmul|linear|_scaled_mm)$"), "GEMM"),
         (re.compile(r"attention", re.I), "attention"), (re.compile(r"rms_norm"), "norms")]
_GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma|cutlass|matmul|gemv|splitk|cublas|wgmma", re.I)
_COMM = re.compile(r"nccl|c10d::|record_param_comms", re.I)
_EVAL = "autograd::engine::evaluate_function: "


def classify(chain: list[str], kernel: str, gpu: bool = True) -> str:
    """Family of one kernel, given the names of its launching op and that op's ancestors (innermost first).
    `gpu=False`: `kernel` is a CPU op name (smoke test), so a GEMM family is not checked by kernel name."""
    if _COMM.search(kernel) or any(_COMM.search(n) for n in chain):
        return "communication"
    if any(n == "bench::optimizer" or n.startswith("Optimizer.") for n in chain):
        return "optimizer"
    in_bwd = any(n.startswith(_EVAL) for n in chain)
    fwd_marker = any(n in FWD_MARKERS for n in chain)
    fam = None
    for n in chain:
        if n in FWD_MARKERS:
            fam = FWD_MARKERS[n]
        elif n.startswith(_EVAL):
            node = n[len(_EVAL):]
            fam = next((f for rx, f in _BWD_NODES if rx.search(node)), None)
        else:
            fam = next((f for rx, f in _ATEN if rx.search(n)), None)
        if fam is not None:
            break
    if fam is None:
        return "other"
    if fam == "GEMM" and gpu and not _GEMM_KERNEL.search(kernel):
        return "other"  # copies and casts around a GEMM call
    if fam in ("GEMM", "attention"):
        if not in_bwd:
            return f"{fam} fwd"
        return f"{fam} fwd (recompute)" if fwd_marker else f"{fam} bwd"
    return fam


# ------------------------------------------------------------------------------------------- markers
@contextlib.contextmanager
def seam_markers():
    """Wrap every TOP kernel-seam function (top_rl.kernels.<op>) in a `top::<op>` range while profiling."""
    from top_rl import kernels

    names = ["linear", "row_linear", "rms_norm", "rope", "silu_and_mul", "attention", "prefill_logprobs",
             "sample_logprobs"]
    saved = {n: getattr(kernels, n) for n in names}

    def wrap(name, fn):
        def marked(*args, **kwargs):
            with record_function(f"top::{name}"):
                return fn(*args, **kwargs)
        return marked

    try:
        for n, fn in saved.items():
            setattr(kernels, n, wrap(n, fn))
        yield
    finally:
        for n, fn in saved.items():
            setattr(kernels, n, fn)


@contextlib.contextmanager
def module_markers(model: torch.nn.Module, rules: list[tuple[type, str]]):
    """A `bench::<name>` range around the forward of every submodule of the given types (forward hooks;
    recomputed forwards get them too)."""
    handles = []

    def pre(name):
        def hook(module, args):
            rf = record_function(f"bench::{name}")
            rf.__enter__()
            module.__dict__.setdefault("_bench_rf", []).append(rf)
        return hook

    def post(module, args, out):
        stack = module.__dict__.get("_bench_rf")
        if stack:
            stack.pop().__exit__(None, None, None)

    for m in model.modules():
        for cls, name in rules:
            if isinstance(m, cls):
                handles.append(m.register_forward_pre_hook(pre(name)))
                handles.append(m.register_forward_hook(post))
                break
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# ------------------------------------------------------------------------------------------- profile
def profile_step(step, device: torch.device, wall_ms: float, top_n: int = 12) -> dict:
    """Run `step()` once under the profiler; ms per family (+ idle vs `wall_ms`) and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=acts, record_shapes=False, with_stack=False, profile_memory=False) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    return summarize(prof.events(), cuda, wall_ms, top_n)


def _chain(ev) -> list[str]:
    names = []
    while ev is not None:
        names.append(ev.name)
        ev = ev.cpu_parent
    return names


def summarize(events, cuda: bool, wall_ms: float, top_n: int = 12) -> dict:
    fam_us: dict[str, float] = defaultdict(float)
    kern_us: dict[tuple[str, str], float] = defaultdict(float)
    kern_n: Counter = Counter()
    busy_us = attributed_us = 0.0
    for ev in events:
        is_device = ev.device_type != torch.autograd.DeviceType.CPU
        if cuda and is_device and not getattr(ev, "is_user_annotation", False):
            busy_us += ev.time_range.elapsed_us()
        if is_device:
            continue
        if cuda:
            launched = [(k.name, k.duration) for k in ev.kernels]
        else:
            launched = [(ev.name, ev.self_cpu_time_total)] if ev.self_cpu_time_total > 0 else []
        if not launched:
            continue
        chain = _chain(ev)
        for name, us in launched:
            fam = classify(chain, name, gpu=cuda)
            fam_us[fam] += us
            kern_us[(name, fam)] += us
            kern_n[(name, fam)] += 1
            attributed_us += us
    if not cuda:
        busy_us = attributed_us
    fam_us["unattributed"] = max(0.0, busy_us - attributed_us)
    fam_us["GPU idle"] = max(0.0, wall_ms * 1e3 - busy_us) if cuda else 0.0
    top = sorted(kern_us.items(), key=lambda kv: -kv[1])[:top_n]
    return {"wall_ms": wall_ms, "busy_ms": busy_us / 1e3,
            "families": {f: fam_us.get(f, 0.0) / 1e3 for f in FAMILIES},
            "top_kernels": [[name[:70], fam, us / 1e3, kern_n[(name, fam)]] for (name, fam), us in top]}
