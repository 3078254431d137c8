"""What both trainers of bench/trainer_step.py share: model shapes, the packed batch, the loss, FLOPs, timing.

The batch is ~16k tokens of mixed-length sequences (fixed seed), each with a prompt whose tokens are not
scored; both trainers score the same rows with the sampler-path log-prob at T = 1 (what an RL loss uses) and
minimise the same loss, so their FLOPs are identical and MFU compares them directly.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from top_rl.model import Qwen3Config

# the H200's dense bf16 peak (NVIDIA's datasheet): the MFU and HFU denominator. cuBLAS reaches ~790 TFLOP/s there on
# large bf16 GEMMs (bench/gemm.py), the practical ceiling.
PEAK_TFLOPS = 989.4

MODELS = {
    "qwen3-0.6b": Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                              rope_theta=1_000_000.0, max_position_embeddings=8192, tie_word_embeddings=True),
    "qwen3-4b": Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                            rope_theta=1_000_000.0, max_position_embeddings=8192, tie_word_embeddings=True),
    # CPU smoke test only (bench/trainer_step.py --cpu-smoke): the harness end to end in seconds.
    "tiny": Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512),
}
TEMPERATURE = 1.0


def sequence_lengths(total: int, seed: int = 0, lo: int = 128, hi: int = 4096) -> list[int]:
    """Mixed lengths drawn from [lo, hi] summing to exactly `total` (the last one takes the rest)."""
    rng = random.Random(seed)
    lens, remaining = [], total
    while remaining > 0:
        n = rng.randint(lo, hi)
        if remaining - n < lo:
            n = remaining
        lens.append(n)
        remaining -= n
    return lens


def make_batch(cfg: Qwen3Config, total_tokens: int, seed: int = 0):
    """TrainSequences (tokens, prompt = first quarter, sampler kind at T = 1) and per-sample advantages ±1."""
    from top_rl.train.sequence import TrainSequence

    lens = sequence_lengths(total_tokens, seed, lo=min(128, total_tokens), hi=min(4096, total_tokens))
    g = torch.Generator().manual_seed(seed)
    batch = []
    for n in lens:
        tokens = torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist()
        batch.append(TrainSequence(tokens, max(1, n // 4), TEMPERATURE))
    adv = [1.0 if i % 2 else -1.0 for i in range(len(batch))]
    return batch, adv


def make_shaped_batch(cfg: Qwen3Config, sequences: int, prompt: int, response: int, seed: int = 0):
    """make_batch's kind of batch in an RL job's shape (bench/rl_step_compare.py: its step's sample count, mean prompt
    and response lengths): `sequences` sequences of `prompt` unscored and `response` scored tokens each."""
    from top_rl.train.sequence import TrainSequence

    g = torch.Generator().manual_seed(seed)
    batch = [TrainSequence(torch.randint(3, cfg.vocab_size, (prompt + response,), generator=g).tolist(), prompt,
                           TEMPERATURE) for _ in range(sequences)]
    return batch, [1.0 if i % 2 else -1.0 for i in range(sequences)]


def make_loss_fn(batch, adv):
    """The trainer's loss_fn contract (per-sample log-prob tensors of a micro-batch, their batch indices):
    a policy-gradient surrogate, normalised by the global number of scored tokens."""
    n_tok = float(sum(s.num_scored for s in batch))

    def loss_fn(lps, indices):
        total = None
        for lp, i in zip(lps, indices):
            term = lp.float().sum() * (-adv[i])
            total = term if total is None else total + term
        return total / n_tok

    return loss_fn


def model_flops(cfg: Qwen3Config, batch, recompute: bool = False) -> float:
    """FLOPs of one training step: every GEMM, causal attention (half the square per sequence), the LM head on the
    scored rows only. Model FLOPs (MFU) are forward x 3; with `recompute` the hardware FLOPs (HFU) add the second
    forward of the transformer layers that full recompute runs (not of the LM head, which is not recomputed)."""
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    tokens = sum(len(s.tokens) for s in batch)
    scored = sum(s.num_scored for s in batch)
    per_token_layer = 2 * (h * (q + 2 * kv) + q * h + h * 2 * f + f * h)
    attn = sum(2 * 2 * q * n * (n + 1) / 2 for n in (len(s.tokens) for s in batch))  # QK^T and PV, causal
    layers = cfg.num_hidden_layers * (tokens * per_token_layer + attn)
    fwd = layers + scored * 2 * h * cfg.vocab_size
    return 3.0 * fwd + (layers if recompute else 0.0)


class Timer:
    """Wall time of a callable in ms: CUDA events on a GPU, perf_counter on CPU (smoke test)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def median(xs: list[float]) -> float:
    return statistics.median(xs)


@torch.no_grad()
def init_params(named_params, seed: int = 0, std: float = 0.02) -> None:
    """Random init in place: matrices N(0, std), vectors (norm weights) near 1. Both trainers get it."""
    for i, (_, p) in enumerate(sorted(named_params, key=lambda np_: np_[0])):
        g = torch.Generator(device=p.device).manual_seed(seed * 1000 + i)
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32) * std)
        else:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32))
