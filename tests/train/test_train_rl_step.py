"""The RL step on the trainer (top_rl.train.rl_step): the gate rides the training forward.

- Its gate values are the engine's numbers bit for bit, for both log-prob sources, and equal what a separate
  scoring forward (`Trainer.logprobs`) gives: the training forward is the recompute.
- A violation under `halt` applies no update (weights unchanged); under `warn` the step trains.
- With several updates per rollout batch, every sample's gate value comes from the pre-update weights.
- The step equals the same update driven through `train_step` with the same loss (same new weights).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.train.common import TEMPERATURE, export_hf_weights, reference_model, tiny_config
from top_rl.model import hf_state_dict
from top_rl.rl import gate
from top_rl.rl.batch import RLBatch, RLSample, RLStepConfig
from top_rl.config.algo import PolicyLossConfig
from top_rl.rollout.native.engine import NativeEngine
from top_rl.engine.interface import SamplingParams
from top_rl.train import Trainer, TrainerSettings, TrainSequence
from top_rl.train.rl_step import minibatches


def _setup(source: str, dtype="bfloat16", seed=21, n=6, mbs=2):
    cfg = tiny_config(seed, tied=seed % 2 == 0)
    model = reference_model(cfg, dtype, seed)
    engine = NativeEngine(model, source)
    prompts = [[(7 * i + j) % cfg.vocab_size for j in range(1 + i % 4)] for i in range(n)]
    samples = engine.generate(prompts, [seed * 10 + i for i in range(n)], SamplingParams(5, TEMPERATURE))
    trainer = Trainer(cfg, TrainerSettings(dtype=dtype, lr=1e-2, micro_batch_size=mbs))
    trainer.load_hf(hf_state_dict(model))
    advantages = [(-1.0) ** i * (0.5 + 0.1 * i) for i in range(n)]
    return trainer, samples, advantages


def _batch(samples, advantages, source, updates=1, step=1):
    return RLBatch([RLSample.from_rollout(s, a, uid=f"s{i}") for i, (s, a) in enumerate(zip(samples, advantages))],
                   TEMPERATURE, source, step, updates)


def _weights(trainer):
    return {k: v.clone() for k, v in export_hf_weights(trainer).items()}


@pytest.mark.parametrize("source", ["prefill", "decode"])
def test_gate_from_the_training_forward_is_the_engine_number(source, tmp_path):
    trainer, samples, adv = _setup(source)
    separate = trainer.logprobs([TrainSequence.from_sample(s, None if source == "prefill" else TEMPERATURE)
                                 for s in samples])
    before = _weights(trainer)
    report = trainer.rl_step(_batch(samples, adv, source), RLStepConfig(dump_dir=str(tmp_path)))
    assert report.violation is None and report.updated
    assert report.parity["train/train_rollout_logprob_abs_diff"] == 0.0
    assert report.parity["train/ess_ratio"] == 1.0
    for s, lp in zip(samples, separate):  # the separate forward agrees with the engine too
        assert torch.equal(lp, torch.tensor(s.logprobs, dtype=lp.dtype))
    after = _weights(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before), "the step did not update the weights"
    for key in ("loss/pg_loss", "loss/pg_clipfrac", "loss/ppo_kl", "loss/ratio_max", "loss/ratio_min", "grad_norm"):
        assert key in report.losses, key
    assert set(report.timings) >= {"forward_backward", "gate", "optimizer"}


def test_violation_halts_before_the_optimizer_step(tmp_path):
    trainer, samples, adv = _setup("prefill")
    bad = dataclasses.replace(samples[3], logprobs=[*samples[3].logprobs[:-1], samples[3].logprobs[-1] + 2.0**-20])
    samples = [*samples[:3], bad, *samples[4:]]
    before = _weights(trainer)
    report = trainer.rl_step(_batch(samples, adv, "prefill", step=7), RLStepConfig(dump_dir=str(tmp_path)))
    assert not report.updated
    assert "step 7" in report.violation and "sample 3 (id s3)" in report.violation
    assert f"token position {len(bad.logprobs) - 1}" in report.violation
    assert report.verdict.dump_path and torch.load(report.verdict.dump_path, weights_only=False)["step"] == 7
    after = _weights(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before), "a halted step changed the weights"
    # under warn the same step trains
    warn = RLStepConfig(gate=gate.GateConfig(on_violation="warn"), dump_dir=str(tmp_path))
    assert trainer.rl_step(_batch(samples, adv, "prefill"), warn).updated


@pytest.mark.parametrize("source", ["prefill", "decode"])
def test_several_updates_gate_every_sample_before_the_first(source, tmp_path):
    trainer, samples, adv = _setup(source, seed=22, n=7)
    report = trainer.rl_step(_batch(samples, adv, source, updates=3), RLStepConfig(dump_dir=str(tmp_path)))
    assert report.violation is None and report.updated, report.violation
    assert trainer.step == 3
    assert report.timings["scoring"] > 0


def test_rl_step_update_equals_train_step_with_the_same_loss():
    """Same weights after one rl_step as after train_step with the PPO loss over the sampler path."""
    from top_rl.rl.losses import concat_ragged, policy_loss

    a, samples, adv = _setup("decode", dtype="float32", seed=23)
    b, _, _ = _setup("decode", dtype="float32", seed=23)
    a.rl_step(_batch(samples, adv, "decode"), RLStepConfig(loss=PolicyLossConfig()))
    batch = [TrainSequence.from_sample(s, TEMPERATURE) for s in samples]
    old = [torch.tensor(s.sample_logprobs, dtype=torch.float32) for s in samples]
    n_tok = sum(len(o) for o in old)

    def loss_fn(lps, idx):
        new, lengths = concat_ragged([lp.float() for lp in lps])
        return policy_loss(new, torch.cat([old[i] for i in idx]), torch.tensor([adv[i] for i in idx]), lengths,
                           PolicyLossConfig(), denominator=n_tok)[0]

    b.train_step(batch, loss_fn)
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_minibatches_are_consecutive_and_cover_the_batch():
    assert minibatches(7, 3) == [[0, 1], [2, 3, 4], [5, 6]]
    assert minibatches(4, 1) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="3 updates need at least as many samples"):
        minibatches(2, 3)


def test_the_gate_costs_no_extra_forward(tmp_path):
    """One model forward per micro-batch in an RL step: the gate's numbers come from the training forward."""
    trainer, samples, adv = _setup("prefill", n=6, mbs=2)
    calls = []
    handle = trainer.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        report = trainer.rl_step(_batch(samples, adv, "prefill"), RLStepConfig(dump_dir=str(tmp_path)))
    finally:
        handle.remove()
    assert report.violation is None
    assert len(calls) == report.micro_batches == 3  # 6 samples, 2 per micro-batch, one forward each


@pytest.mark.parametrize("source", ["prefill", "decode"])
def test_recomputed_old_log_probs_are_the_rollouts_under_top(source, tmp_path):
    """algo.old_logprobs=recompute (verl's and slime's old-policy forward) under TOP: the trainer's sampler log-probs
    are the engine's bit for bit, so the step and its new weights equal the rollout-log-prob step, at one more
    forward's cost (timed as old_logprobs). Old log-probs that differ (a non-TOP engine) would change the ratios: a
    recompute from a perturbed rollout still trains like the exact one, while taking the perturbed values does not."""
    trainer, samples, adv = _setup(source)
    exact = trainer.rl_step(_batch(samples, adv, source), RLStepConfig(dump_dir=str(tmp_path)))
    want = _weights(trainer)
    for old in ("recompute", "rollout"):
        trainer, samples, adv = _setup(source)
        off = [dataclasses.replace(s, sample_logprobs=[v + 0.05 for v in s.sample_logprobs]) for s in samples]
        report = trainer.rl_step(_batch(off, adv, source), RLStepConfig(dump_dir=str(tmp_path), old_logprobs=old))
        got = _weights(trainer)
        same = all(torch.equal(want[k], got[k]) for k in want)
        assert same == (old == "recompute"), old
        if old == "recompute":
            assert report.losses == exact.losses and report.timings["old_logprobs"] > 0


def test_the_gate_source_is_decided_once_per_batch():
    """A lagged batch's gate numbers all come from the snapshot forward, none from a training forward; otherwise
    mini-batch 1's from its training forward and the later ones' from the scoring forward (top_rl.train.rl_step)."""
    from top_rl.rl.batch import RLBatch
    from top_rl.train.rl_step import GateSource

    parts = [[0, 1], [2, 3], [4]]
    lagged = RLBatch([], 1.0, "prefill", 3, 3, behaviour_version=1)
    assert GateSource.of(lagged, 2, parts) == GateSource(snapshot=1, trained=(), scored=())
    own = GateSource(None, trained=(0, 1), scored=(2, 3, 4))
    assert GateSource.of(RLBatch([], 1.0, "prefill", 3, 3), 2, parts) == own
    assert GateSource.of(RLBatch([], 1.0, "prefill", 3, 3, behaviour_version=2), 2, parts) == own  # lag 0 at step 1
