"""TP=1 parity of the Megatron trainer with the native engine (all torch.equal):
recomputed log-probs of rollouts (prefill kind and sampler@T kind) for random tiny GQA configs, tied
and untied, fp32 and bf16, under micro-batches of different sizes and sample orders; one optimizer
step changes the weights and parity holds for the next rollout after the weight handover; activation
recompute on/off give identical loss and gradients."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from tests.train.common import (assert_parity, both_kinds, expected, export_hf_weights, gradients,
                                pg_loss, reference_model, rollouts, set_lr, tiny_config)
from top_rl.contract import as_dtype
from top_rl.model import hf_state_dict
from top_rl.rollout.native.engine import NativeEngine
from top_rl.train import Trainer, TrainerSettings, TrainSequence

CASES = [("float32", True, 11), ("float32", False, 12), ("bfloat16", True, 13), ("bfloat16", False, 14)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{d}-{'tied' if t else 'untied'}" for d, t, _ in CASES])
def setup(request):
    dtype, tied, seed = request.param
    cfg = tiny_config(seed, tied=tied)
    model = reference_model(cfg, dtype, seed)
    samples = rollouts(model, n=5, seed=seed)
    trainer = Trainer(cfg, TrainerSettings(dtype=dtype, lr=1e-2, grad_clip=1.0))
    trainer.load_hf(hf_state_dict(model))
    return cfg, model, samples, trainer, as_dtype(dtype)


def test_logprobs_equal_engine_for_any_packing(setup):
    cfg, _, samples, trainer, c = setup
    batch, want = both_kinds(samples), expected(samples)
    for mbs, mbt in ((1, None), (3, None), (8, None), (None, 17), (None, 1000)):
        trainer.cfg.micro_batch_size, trainer.cfg.micro_batch_tokens = mbs, mbt
        assert_parity(trainer.logprobs(batch), want, c)
    order = list(range(len(batch)))
    random.Random(0).shuffle(order)
    trainer.cfg.micro_batch_size, trainer.cfg.micro_batch_tokens = 3, None
    got = trainer.logprobs([batch[i] for i in order])
    back = [None] * len(batch)
    for pos, i in enumerate(order):
        back[i] = got[pos]
    assert_parity(back, want, c)


def test_micro_batch_invariance(setup):
    """The same sample scored alone, in micro-batches of 3 and of 8 (among other samples) is identical."""
    _, _, samples, trainer, _ = setup
    batch = both_kinds(samples)
    probe = batch[2]
    results = []
    for size in (1, 3, 8):
        trainer.cfg.micro_batch_size, trainer.cfg.micro_batch_tokens = size, None
        mixed = ([probe] if size == 1 else batch[:size - 1] + [probe])
        results.append(trainer.logprobs(mixed)[-1])
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_step_changes_weights_and_keeps_parity_after_handover(setup):
    cfg, model, samples, trainer, c = setup
    before = export_hf_weights(trainer)
    batch = both_kinds(samples)
    trainer.cfg.micro_batch_size, trainer.cfg.micro_batch_tokens = 3, None
    metrics = trainer.train_step(batch, pg_loss(batch))
    assert all(torch.isfinite(torch.tensor(v)) for v in (metrics["loss"], metrics["grad_norm"]))
    after = export_hf_weights(trainer)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged after a step: {sorted(set(before) - set(changed))}"

    engine_model = reference_model(cfg, str(c).replace("torch.", ""), seed=999)  # different init
    engine = NativeEngine(engine_model)
    engine.load_named_tensors(after)
    new_samples = rollouts(engine_model, n=4, seed=77)
    assert_parity(trainer.logprobs(both_kinds(new_samples)), expected(new_samples), c)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_recompute_on_off_identical_loss_and_grads(dtype):
    cfg = tiny_config(21, tied=True)
    model = reference_model(cfg, dtype)
    batch = both_kinds(rollouts(model, n=3, seed=5))
    loss_fn = pg_loss(batch)
    out = {}
    for recompute in (False, True):
        trainer = Trainer(cfg, TrainerSettings(dtype=dtype, recompute=recompute, micro_batch_size=2))
        trainer.load_hf(hf_state_dict(model))
        assert (trainer.tc.recompute_granularity == "full") == recompute
        grads = gradients(trainer, batch, loss_fn)
        metrics = trainer.train_step(batch, loss_fn)
        out[recompute] = (grads, metrics, export_hf_weights(trainer))
    (g0, m0, w0), (g1, m1, w1) = out[False], out[True]
    assert set(g0) == set(g1)
    for n in g0:
        assert torch.isfinite(g0[n]).all(), n
        assert torch.equal(g0[n], g1[n]), n
    assert m0["loss"] == m1["loss"] and m0["grad_norm"] == m1["grad_norm"]
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


def test_megatron_rope_option_gives_the_same_bits():
    """With Megatron's own unfused RoPE (megatron_rope=True) instead of kernels.rope the CPU trainer is
    still bitwise the engine: the two RoPEs are the same eager formula (tests/train/test_train_rope.py)."""
    cfg = tiny_config(24, tied=False)
    model = reference_model(cfg, "bfloat16")
    samples = rollouts(model, n=3, seed=8)
    trainer = Trainer(cfg, TrainerSettings(dtype="bfloat16", megatron_rope=True, micro_batch_size=2))
    trainer.load_hf(hf_state_dict(model))
    assert trainer.model.position_embedding_type == "rope"
    assert_parity(trainer.logprobs(both_kinds(samples)), expected(samples), torch.bfloat16)


def test_recompute_is_non_reentrant():
    """Megatron's reentrant CheckpointFunction is replaced: torch.autograd.grad works through recompute."""
    import megatron.core.tensor_parallel as tensor_parallel

    from top_rl.train.recompute import non_reentrant_checkpoint

    cfg = tiny_config(22, tied=False)
    trainer = Trainer(cfg, TrainerSettings(dtype="float32", recompute=True))
    trainer.load_hf(hf_state_dict(reference_model(cfg, "float32")))
    assert tensor_parallel.checkpoint is non_reentrant_checkpoint
    x = torch.randn(3, requires_grad=True)
    y = tensor_parallel.checkpoint(lambda t: (t * 2).sin(), False, x)
    (gx,) = torch.autograd.grad(y.sum(), x)  # the reentrant version raises here
    assert torch.equal(gx, (2 * (x * 2).cos()).detach())


def test_checkpoint_round_trip():
    """state_dict/load_state_dict restore weights and optimizer state: the next steps are identical."""
    cfg = tiny_config(23, tied=True)
    model = reference_model(cfg, "bfloat16")
    batch = both_kinds(rollouts(model, n=2, seed=3))
    loss_fn = pg_loss(batch)
    a = Trainer(cfg, TrainerSettings(dtype="bfloat16", lr=1e-2))
    a.load_hf(hf_state_dict(model))
    a.train_step(batch, loss_fn)
    sd = a.state_dict()
    b = Trainer(cfg, TrainerSettings(dtype="bfloat16", lr=1e-2))
    b.load_state_dict(sd)
    assert b.step == 1
    ma, mb = a.train_step(batch, loss_fn), b.train_step(batch, loss_fn)
    assert ma == mb
    wa, wb = export_hf_weights(a), export_hf_weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_resumed_trainer_steps_with_its_configs_lr_not_the_checkpoints():
    """Issue 24: resume_allow_changes=true trainer.lr=... logged the new lr but trained at the checkpoint's (the
    optimizer's saved param_groups brought it back). A trainer loading a state steps exactly as the run that never
    stopped and switched to the new lr there; every config hyperparameter of its groups is its config's."""
    cfg = tiny_config(23, tied=True)
    model = reference_model(cfg, "bfloat16")
    batch = both_kinds(rollouts(model, n=2, seed=3))
    loss_fn = pg_loss(batch)
    old = TrainerSettings(dtype="bfloat16", lr=1e-2)
    new = TrainerSettings(dtype="bfloat16", lr=5e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    straight = Trainer(cfg, old)
    straight.load_hf(hf_state_dict(model))
    straight.train_step(batch, loss_fn)
    sd = straight.state_dict()
    resumed, unchanged = Trainer(cfg, dataclasses.replace(new, betas=old.betas, eps=old.eps, weight_decay=0.0)), \
        Trainer(cfg, old)
    resumed.load_state_dict(sd)
    unchanged.load_state_dict(sd)
    set_lr(straight, 5e-2)  # the run that never stopped, switching lr at this step
    for t in (straight, resumed, unchanged):
        t.train_step(batch, loss_fn)
    w_straight, w_resumed, w_unchanged = (export_hf_weights(t) for t in (straight, resumed, unchanged))
    assert all(torch.equal(w_straight[k], w_resumed[k]) for k in w_straight)
    assert not all(torch.equal(w_straight[k], w_unchanged[k]) for k in w_straight), "the lr must matter here"

    every = Trainer(cfg, new)
    every.load_state_dict(sd)
    fresh = Trainer(cfg, new).optimizer.opt.param_groups
    assert [{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")} for g in every.optimizer.opt.param_groups] == \
        [{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")} for g in fresh]
    assert every.optimizer.opt.param_groups[0]["weight_decay"] == 0.1 and fresh[1]["weight_decay"] == 0.0


def test_rejects_bad_sequences():
    with pytest.raises(ValueError):
        TrainSequence([1, 2, 3], 3)
    with pytest.raises(ValueError):
        TrainSequence([1, 2, 3], 1, temperature=0.0)
