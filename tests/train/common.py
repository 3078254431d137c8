"""Shared helpers for the trainer tests (tiny random Qwen3 configs, native-engine rollouts, parity
assertions). Holds no tests itself."""

from __future__ import annotations

import random

import torch

from top_rl.model import Qwen3, Qwen3Config
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.native.engine import NativeEngine
from top_rl.train import TrainSequence

TEMPERATURE = 0.7


def tiny_config(seed: int, *, tied: bool, tp_friendly: bool = False) -> Qwen3Config:
    """A random tiny GQA Qwen3. `tp_friendly` keeps row-parallel widths a multiple of 2 x the contract's
    k_chunk (64) and KV groups even, so TP=2 and CP=2 layouts are valid."""
    rng = random.Random(seed)
    if tp_friendly:
        heads, kv, head_dim = rng.choice([(8, 2, 16), (4, 2, 32)])
        hidden, inter, vocab = rng.choice([32, 64]), 128, rng.choice([64, 96])
    else:
        heads, kv = rng.choice([(4, 2), (4, 1), (6, 2), (8, 2)])
        head_dim, hidden = rng.choice([8, 16]), rng.choice([32, 48, 64])
        inter, vocab = rng.choice([64, 96]), rng.choice([64, 80, 96])
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                       tie_word_embeddings=tied, max_position_embeddings=128)


def reference_model(cfg: Qwen3Config, dtype: str, seed: int = 1) -> Qwen3:
    return Qwen3(cfg, dtype).init_random(seed)


def rollouts(model: Qwen3, n: int = 4, max_new_tokens: int = 6, seed: int = 0):
    """n native-engine samples (prefill log-prob source) from random prompts of 1..6 tokens."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(model.cfg.vocab_size) for _ in range(rng.randint(1, 6))] for _ in range(n)]
    engine = NativeEngine(model, "prefill")
    seeds = [seed * 100 + i for i in range(n)]
    return engine.generate(prompts, seeds, SamplingParams(max_new_tokens=max_new_tokens, temperature=TEMPERATURE))


def both_kinds(samples) -> list[TrainSequence]:
    """Each sample twice: the prefill kind (the gate's number) then the sampler kind at T."""
    return [TrainSequence.from_sample(s) for s in samples] + [TrainSequence.from_sample(s, TEMPERATURE) for s in samples]


def expected(samples) -> list[torch.Tensor]:
    """What the engine reported, in `both_kinds` order: fp32 prefill scores, sampler log-probs (their
    compute-dtype values, held exactly in fp64)."""
    return ([torch.tensor(s.logprobs, dtype=torch.float32) for s in samples]
            + [torch.tensor(s.sample_logprobs, dtype=torch.float64) for s in samples])


def assert_parity(got: list[torch.Tensor], want: list[torch.Tensor], compute_dtype: torch.dtype) -> None:
    assert len(got) == len(want)
    n = len(want) // 2
    for i, (g, w) in enumerate(zip(got, want)):
        if i < n:
            assert g.dtype == torch.float32, g.dtype
            assert torch.equal(g, w), f"prefill sample {i}: trainer {g.tolist()} != engine {w.tolist()}"
        else:
            assert g.dtype == compute_dtype, g.dtype
            assert torch.equal(g.double(), w), f"sampler sample {i - n}: trainer {g.tolist()} != engine {w.tolist()}"
        assert torch.isfinite(g).all()


def pg_loss(batch: list[TrainSequence], seed: int = 0):
    """A REINFORCE-style loss normalised by the global token count (additive over micro-batches)."""
    rng = random.Random(seed)
    weights = [rng.choice([-1.0, 1.0]) * (0.5 + rng.random()) for _ in batch]
    total = sum(s.num_scored for s in batch)

    def loss_fn(lps: list[torch.Tensor], indices: list[int]) -> torch.Tensor:
        return sum(-weights[i] * lp.float().sum() for lp, i in zip(lps, indices)) / total

    return loss_fn


# What a test reads from or sets on a Trainer that the run never does (the run pushes weights through
# Trainer.iter_hf_weights, and its lr comes from the schedule, top_rl/rl/lr_schedule.py).
def export_hf_weights(trainer) -> dict[str, torch.Tensor]:
    """The trainer's full HF-named weights as CPU tensors (every rank gets them)."""
    return {k: v.cpu() for k, v in trainer.iter_hf_weights()}


def gradients(trainer, batch: list[TrainSequence], loss_fn) -> dict[str, torch.Tensor]:
    """This rank's fp32 gradient of the summed loss per local parameter (before any cross-rank reduction), with no
    optimizer step: Trainer.train_step's backward, then the gradients read and zeroed."""
    from top_rl.train.logprobs import split_per_sample

    def loss_of(mb, out):
        return loss_fn(split_per_sample(out[0], batch, mb.indices, trainer.compute_dtype), mb.indices)

    trainer.backward_micro_batches(batch, loss_of)
    grads = trainer.optimizer.local_grads()
    trainer.optimizer.zero_grad()
    return grads


def set_lr(trainer, lr: float) -> None:
    """The learning rate of the trainer's following steps (a constant schedule leaves the optimizer's as set here)."""
    trainer.cfg.lr = lr
    trainer.optimizer.set_lr(lr)
