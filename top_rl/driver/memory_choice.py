"""What `rollout.sglang.mem_fraction_static=auto` means: the share of the GPU an SGLang server takes for its weights
and KV pool, decided once on the driver before start from the GPU it sees, the model, the batch and the trainer that
shares the GPU, and written into the run config (state.json and wandb record the number that ran; the start-up line
says why).

The rule (`choose`), for servers sharing a trainer rank's GPU (cluster.colocate=true):
- The batch's KV need: each server's share of the rollout's requests (rollout.prompts_per_step x n_samples over the
  engines, at most rollout.sglang.max_running_requests), each at its longest (the task's longest prompt +
  rollout.max_new_tokens), times the model's KV bytes per token, plus the server's weights and a margin.
- The room: the largest fraction at which the server and the trainer fit (top_rl/rollout/sglang/memory.py, the same
  estimate that refuses an explicit value), first with the trainer's state kept on the GPU, then, with
  cluster.gpu_handoff, with trainer.offload_during_rollout (the optimizer state in host memory while the server
  generates): offload is turned on only when that is what lets the whole batch run.
- The fraction is the batch's need where the room allows it (never below MIN_FRACTION, so a tiny batch still gets a
  working pool), else all the room there is, and the line says how many requests the pool holds at their longest (the
  rest queue).
Servers on GPUs of their own (cluster.colocate=false) keep SGLang's own sizing, and so does a local run whose driver
sees no GPU (nothing SGLang-on-GPU runs there); a colocated run on a Ray cluster whose driver sees no GPU is refused:
the user names the number for the engines' GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from top_rl.driver.local_gpu import LocalGpu, local_gpu
from top_rl.rollout.sglang import memory as sglang_memory

AUTO = "auto"
KV_MARGIN = 1.05  # SGLang's pool keeps a few pages and per-request slack beyond the tokens themselves
MIN_FRACTION = 0.3  # a pool for a small batch still needs room for its CUDA-graph batch sizes and chunked prefills
MAX_FRACTION = 0.9  # what SGLang itself takes at most on a large GPU (its default is ~0.88 on an H200)
# Left free beyond the estimate's room: what a server process holds outside its static pool and the estimate's
# prefill logits (CUDA-graph pools, memory its allocator reserved but did not use). Measured on an H100 (2026-12-06,
# the one-GPU GSM8K job at 0.74 without it): step 3's prefill asked for 4.07 GiB with 1.18 GiB free; the server
# process held 65.57 GiB, 4.06 GiB of it reserved but unallocated, the trainer 12.40 GiB. Twice that shortfall.
HEADROOM_BYTES = 6 * sglang_memory.GIB


@dataclass(frozen=True)
class MemoryChoice:
    mem_fraction_static: float | None  # None: SGLang's own sizing
    offload_during_rollout: bool
    why: str  # one line: the GPU, the fraction, the pool's requests and the trainer's share (start-up line)


def _floor2(x: float) -> float:
    return math.floor(x * 100) / 100


def choose(arch, gpu: LocalGpu, *, requests: int, tokens_per_request: int, servers: int, micro_batch_tokens: int,
           recompute: bool, handoff: bool, offload_set: bool, chunked_prefill_size: int | None) -> MemoryChoice:
    """The fraction (and whether to offload) for `servers` servers of `requests` requests each on `gpu` beside one
    trainer rank (module doc). Raises ValueError when not even the smallest useful pool fits."""
    g = sglang_memory.GIB
    kv_request = tokens_per_request * sglang_memory.kv_bytes_per_token(arch)
    weights = sglang_memory.weights_bytes(arch)
    want = (weights + KV_MARGIN * requests * kv_request) / gpu.total_bytes
    chunk = chunked_prefill_size or sglang_memory.SGLANG_DEFAULT_CHUNK
    options = [True] if offload_set else ([False, True] if handoff else [False])
    room = {o: min(MAX_FRACTION, _floor2(sglang_memory.estimate(
                arch, micro_batch_tokens, recompute, 0.5, servers, gpu.total_bytes, chunked_prefill_size=chunk,
                handoff=handoff, offload=o).best_fraction() - HEADROOM_BYTES / (servers * gpu.total_bytes)))
            for o in options}
    fits = [o for o in options if room[o] >= want]
    offload = fits[0] if fits else max(options, key=lambda o: (room[o], -o))
    fraction = min(room[offload], max(MIN_FRACTION, math.ceil(want * 100) / 100)) if fits else room[offload]
    held = int((fraction * gpu.total_bytes - weights) / (KV_MARGIN * kv_request)) if kv_request else requests
    if held < 1:
        raise ValueError(f"rollout.sglang.mem_fraction_static=auto: the trainer on this {gpu.describe()} "
                         f"({gpu.total_bytes / g:.1f} GiB) leaves the server no room for one request of "
                         f"{tokens_per_request} tokens (the estimate: top_rl/rollout/sglang/memory.py); lower "
                         "trainer.micro_batch_tokens, set cluster.gpu_handoff=true, or give the engines their own "
                         "GPUs (cluster.colocate=false)")
    trainer = (sglang_memory.offloaded_resident_bytes(arch, micro_batch_tokens) if offload and handoff else
               sglang_memory.RESIDENT_BYTES_PER_PARAM * sglang_memory.param_count(arch) if handoff else
               sglang_memory.trainer_bytes(arch, micro_batch_tokens, recompute))
    pool = (f"KV pool ~{(fraction * gpu.total_bytes - weights) / g:.1f} GiB: "
            + (f"all {requests} requests" if held >= requests else f"~{held} of its {requests} requests (the rest queue)")
            + f" at their longest, {tokens_per_request} tokens")
    kept = ("trainer.offload_during_rollout=true (the optimizer state waits in host memory while the server generates)"
            if offload and not offload_set else "trainer.offload_during_rollout as set" if offload_set else
            "the trainer's state kept on the GPU")
    return MemoryChoice(fraction, offload, f"{gpu.describe()}, {gpu.total_bytes / g:.1f} GiB: {fraction:.2f} of it per "
                                           f"server ({pool}); {kept}, the trainer ~{trainer / g:.1f} GiB beside it")


def shared_gpu_load(cfg, arch) -> tuple[int, int]:
    """(SGLang servers per trainer GPU, the trainer's micro-batch tokens): what the shared-GPU estimate reads of the
    config, both where `auto` is decided (`resolve`) and where a named fraction is checked (top_rl.preflight)."""
    t = cfg.trainer
    servers = -(-cfg.rollout.num_engines // t.world)  # engines per trainer GPU
    return servers, t.micro_batch_tokens or (t.micro_batch_size or 1) * arch.max_position_embeddings


def resolve(cfg, arch, max_prompt_len: int, on_cluster: bool = False) -> MemoryChoice | None:
    """Decide `auto` in cfg in place (None: the config named a number). Refuses (ValueError naming the key) a colocated
    run on a Ray cluster (`on_cluster`: top_rl.driver.resolution decides where Ray runs) whose driver sees no GPU."""
    s = cfg.rollout.sglang
    if cfg.rollout.engine != "sglang" or str(s.mem_fraction_static) != AUTO:
        return None
    gpu = local_gpu() if cfg.cluster.colocate else None
    if gpu is None:
        if cfg.cluster.colocate and on_cluster:
            raise ValueError("rollout.sglang.mem_fraction_static=auto: the driver sees no GPU to size the servers "
                             "that share the trainer's GPUs on this Ray cluster; name the fraction for the engines' "
                             "GPUs (e.g. 0.6 with cluster.gpu_handoff=true on an 80 GB card)")
        why = ("the engines have GPUs of their own (cluster.colocate=false)" if not cfg.cluster.colocate else
               "no GPU visible to the driver") + ": SGLang's own sizing"
        s.mem_fraction_static = None
        return MemoryChoice(None, bool(cfg.trainer.offload_during_rollout), why)
    t, r = cfg.trainer, cfg.rollout
    servers, tokens = shared_gpu_load(cfg, arch)
    requests = -(-(r.prompts_per_step * r.n_samples) // r.num_engines)
    if s.max_running_requests:
        requests = min(requests, s.max_running_requests)
    choice = choose(arch, gpu, requests=requests, tokens_per_request=max_prompt_len + r.max_new_tokens,
                    servers=servers, micro_batch_tokens=tokens, recompute=t.recompute,
                    handoff=bool(cfg.cluster.gpu_handoff), offload_set=bool(t.offload_during_rollout),
                    chunked_prefill_size=s.chunked_prefill_size)
    s.mem_fraction_static = choice.mem_fraction_static
    t.offload_during_rollout = choice.offload_during_rollout
    return choice
