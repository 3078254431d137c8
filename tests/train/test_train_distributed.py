"""Multi-rank parity on CPU (two gloo processes, spawned once for every layout to keep CI short):
TP=2, PP=2, Ulysses CP=2 and DP=2 give the engine's log-probs bit for bit (both kinds, two packings),
export the loaded weights unchanged, take a step whose loss equals the TP=1 trainer's, and keep parity
for the next rollout after the weight handover."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from tests.train.common import (assert_parity, both_kinds, expected, export_hf_weights,
                                pg_loss, reference_model, rollouts, tiny_config)
from top_rl.contract import as_dtype
from top_rl.model import hf_state_dict
from top_rl.rollout.native.engine import NativeEngine
from top_rl.train import Trainer, TrainerSettings
from top_rl.train.parallel import spawn

SCENARIOS = [  # (name, tp, pp, cp, dtype, tied, seed); world size 2, so dp = 2 / (tp * pp * cp)
    ("tp2-bf16-tied", 2, 1, 1, "bfloat16", True, 31),
    ("tp2-fp32-untied", 2, 1, 1, "float32", False, 32),
    ("pp2-bf16-tied", 1, 2, 1, "bfloat16", True, 33),
    ("pp2-fp32-untied", 1, 2, 1, "float32", False, 34),
    ("cp2-bf16-tied", 1, 1, 2, "bfloat16", True, 35),
    ("dp2-fp32-untied", 1, 1, 1, "float32", False, 36),
]
LR = 1e-2


def _prepare(scenario):
    """Everything the ranks need, computed once in the parent: weights, rollouts, TP=1 reference step."""
    name, tp, pp, cp, dtype, tied, seed = scenario
    cfg = tiny_config(seed, tied=tied, tp_friendly=True)
    model = reference_model(cfg, dtype, seed)
    samples = rollouts(model, n=4, seed=seed)
    batch = both_kinds(samples)
    ref = Trainer(cfg, TrainerSettings(dtype=dtype, micro_batch_size=3, lr=LR))
    ref.load_hf(hf_state_dict(model))
    metrics = ref.train_step(batch, pg_loss(batch))
    return dict(scenario=scenario, cfg=cfg, hf=hf_state_dict(model), samples=samples, ref_metrics=metrics)


def _run(rank, world, prepared):
    for p in prepared:
        _check_layout(rank, p)


def _check_layout(rank, p):
    name, tp, pp, cp, dtype, tied, seed = p["scenario"]
    cfg, hf, samples = p["cfg"], p["hf"], p["samples"]
    c = as_dtype(dtype)
    trainer = Trainer(cfg, TrainerSettings(tp=tp, pp=pp, cp=cp, dtype=dtype, micro_batch_size=3, lr=LR))
    assert trainer.layout.dp == 2 // (tp * pp * cp), name
    trainer.load_hf(hf)
    batch = both_kinds(samples)
    assert_parity(trainer.logprobs(batch), expected(samples), c)
    trainer.cfg.micro_batch_size, trainer.cfg.micro_batch_tokens = None, 19  # another packing
    assert_parity(trainer.logprobs(batch), expected(samples), c)
    exported = export_hf_weights(trainer)
    assert set(exported) == set(hf) and all(torch.equal(exported[k], hf[k]) for k in hf), name

    trainer.cfg.micro_batch_size, trainer.cfg.micro_batch_tokens = 3, None
    metrics = trainer.train_step(batch, pg_loss(batch))
    ref = p["ref_metrics"]
    if trainer.layout.dp == 1:  # same micro-batches, bitwise log-probs: the summed loss is identical
        assert metrics["loss"] == ref["loss"], (name, metrics, ref)
    else:
        assert math.isclose(metrics["loss"], ref["loss"], rel_tol=1e-6), (name, metrics, ref)
    # Gradients are reduced in another order than at TP=1 (bf16 partials), so only close.
    assert math.isclose(metrics["grad_norm"], ref["grad_norm"], rel_tol=1e-3 if dtype == "bfloat16" else 1e-5), \
        (name, metrics, ref)
    after = export_hf_weights(trainer)
    assert all(not torch.equal(after[k], hf[k]) for k in hf), name

    box = [None]
    if rank == 0:  # one engine takes the new weights and rolls out; every rank scores the same batch
        engine_model = reference_model(cfg, dtype, seed=999)
        NativeEngine(engine_model).load_named_tensors(after)
        box[0] = rollouts(engine_model, n=3, seed=seed + 1)
    dist.broadcast_object_list(box, src=0)
    assert_parity(trainer.logprobs(both_kinds(box[0])), expected(box[0]), c)


@pytest.mark.slow  # over 30 s (--durations, issue 25)
def test_tp2_pp2_cp2_dp2_parity():
    spawn(_run, 2, [_prepare(s) for s in SCENARIOS])
