"""The Megatron-core trainer (top_rl.train, TP=1) on the GPU over the `sglang` backend: its log-probs equal
the native engine's bitwise, and stay equal across 3 train steps with weight handover."""

from __future__ import annotations

import random

import pytest
import torch

from top_rl.model import hf_state_dict
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.native.engine import NativeEngine
from tests.gpu._common import QWEN3_06B, device_model, needs_cuda
from tests.train.common import export_hf_weights

pytestmark = [needs_cuda, pytest.mark.gpu]


def test_megatron_trainer_parity_three_steps():
    _run(steps=3)


def test_megatron_trainer_parity_with_eager_rope_diagnostic(monkeypatch):
    """Diagnostic, not a contract check: swap the backend's compiled RoPE for the eager formula (what
    Megatron's own unfused RoPE computes). If this passes while the test above fails, the trainer's only
    difference from the engine is its RoPE: it must route RoPE through kernels.rope."""
    from top_rl.kernels.sglang import backend as sg

    monkeypatch.setattr(sg.ops(), "rope", sg._wheel_apply_rotary_emb())
    _run(steps=1)


def _run(steps):
    train = pytest.importorskip("top_rl.train", reason="Megatron-core trainer not importable here")
    engine_model = device_model(seed=5)
    engine = NativeEngine(engine_model, logprob_source="prefill")
    trainer = train.Trainer(engine_model.cfg, train.TrainerSettings(tp=1, dtype="bfloat16", lr=1e-5, micro_batch_size=2))
    trainer.load_hf(hf_state_dict(engine_model))
    rng = random.Random(0)
    temperature = 0.9
    for step in range(steps):
        prompts = [[rng.randrange(3, QWEN3_06B["vocab_size"]) for _ in range(n)] for n in (4, 60, 500)]
        samples = engine.generate(prompts, seeds=[step * 7 + i for i in range(3)],
                                  params=SamplingParams(max_new_tokens=8, temperature=temperature))
        gate = trainer.logprobs([train.TrainSequence.from_sample(s) for s in samples])
        for i, (g, s) in enumerate(zip(gate, samples)):
            assert torch.equal(g, torch.tensor(s.logprobs, dtype=torch.float32)), f"step {step} sample {i}"
        batch = [train.TrainSequence.from_sample(s, temperature) for s in samples]
        old = [torch.tensor(s.sample_logprobs, dtype=torch.float32) for s in samples]
        n_tok = sum(len(o) for o in old)

        def loss_fn(lps, idx):
            total = 0.0
            for lp, i in zip(lps, idx):
                ratio = torch.exp(lp.float() - old[i].to(lp.device))
                adv = 1.0 if i % 2 else -1.0
                total = total - torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum()
            return total / n_tok

        metrics = trainer.train_step(batch, loss_fn)
        assert all(v == v for v in metrics.values() if isinstance(v, float)), metrics  # no NaN
        engine.load_named_tensors(export_hf_weights(trainer))
