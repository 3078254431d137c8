"""rollout.policy_lag=1 on the trainer (top_rl.train.rl_step, top_rl.train.snapshots): a batch sampled under the
version before the trainer's is gated under the trainer's copy of that version's weights, and those proven log-probs
are PPO's old policy exactly.

- The lagged step's gate holds (abs_diff 0, ESS 1) although the trainer's live weights have moved on, and its update
  is bit for bit the update a step with the engine's own old log-probs makes (the swap back restored the live
  weights exactly, and the old policy is pi_v's numbers).
- A wrong snapshot is caught by the gate, naming the versions; a version the trainer holds no copy of is refused,
  naming it and the versions held.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.train.common import TEMPERATURE, reference_model, tiny_config
from top_rl.model import hf_state_dict
from top_rl.rl.batch import RLBatch, RLSample, RLStepConfig
from top_rl.config.algo import GateConfig
from top_rl.engine.interface import SamplingParams
from top_rl.rollout.native.engine import NativeEngine
from top_rl.train import Trainer, TrainerSettings
from top_rl.train.snapshots import PolicySnapshots, PolicyVersionMissing

N = 6


def _world(source: str, dtype: str = "bfloat16", seed: int = 21):
    """A trainer keeping one older version, an engine with the same initial weights (version 1), and two batches the
    engine sampled under version 1 (step 1's, and step 2's, generated while step 1 trained)."""
    cfg = tiny_config(seed, tied=False)
    model = reference_model(cfg, dtype, seed)
    engine = NativeEngine(model, source)
    trainer = Trainer(cfg, TrainerSettings(dtype=dtype, lr=5e-2, micro_batch_size=2))
    trainer.load_hf(hf_state_dict(model))
    trainer.snapshots = PolicySnapshots(keep=1)
    prompts = [[(7 * i + j) % cfg.vocab_size for j in range(1 + i % 4)] for i in range(N)]
    params = SamplingParams(5, TEMPERATURE)
    first = engine.generate(prompts, [seed * 10 + i for i in range(N)], params)
    second = engine.generate(prompts, [seed * 10 + 100 + i for i in range(N)], params)
    return trainer, first, second


def _batch(samples, source, step, behaviour):
    advantages = [(-1.0) ** i * (0.5 + 0.1 * i) for i in range(len(samples))]
    return RLBatch([RLSample.from_rollout(s, a, uid=f"s{i}") for i, (s, a) in enumerate(zip(samples, advantages))],
                   TEMPERATURE, source, step, 1, behaviour_version=behaviour)


def _live(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("source", ["prefill", "decode"])
def test_a_lagged_batch_is_proven_under_its_version_and_trains_against_it_exactly(source, tmp_path):
    lagged, first, second = _world(source)
    step1 = lagged.rl_step(_batch(first, source, 1, 1), RLStepConfig(dump_dir=str(tmp_path), policy_lag=1))
    assert step1.updated and step1.policy_version == 1 and lagged.snapshots.current == 2
    assert lagged.snapshots.versions() == [1]  # the weights step 2's batch was sampled with
    report = lagged.rl_step(_batch(second, source, 2, 1), RLStepConfig(dump_dir=str(tmp_path), policy_lag=1))
    assert report.violation is None and report.updated and report.policy_version == 2
    assert report.parity["train/train_rollout_logprob_abs_diff"] == 0.0 and report.parity["train/ess_ratio"] == 1.0
    assert report.timings["behaviour_forward"] > 0
    # pi_theta / pi_v is not 1: the loss really compares the live weights with the behaviour version's
    assert report.losses["loss/ratio_max"] > 1.0 or report.losses["loss/ratio_min"] < 1.0
    assert lagged.snapshots.versions() == [2] and lagged.snapshots.current == 3

    # The same two updates, the second with the engine's own old log-probs on the live weights (its gate compares
    # version 2 with version 1's numbers, so it may only warn: the step trains): the same new weights, bit for bit.
    plain, first, second = _world(source)
    plain.rl_step(_batch(first, source, 1, None), RLStepConfig(dump_dir=str(tmp_path)))
    warn = RLStepConfig(dump_dir=str(tmp_path), gate=GateConfig(on_violation="warn"))
    unproven = plain.rl_step(_batch(second, source, 2, None), warn)
    assert unproven.violation is not None  # without the snapshot the gate cannot hold: the weights did move
    got, want = _live(lagged), _live(plain)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_a_wrong_snapshot_is_caught_by_the_gate_naming_the_versions(tmp_path):
    trainer, first, second = _world("decode")
    trainer.rl_step(_batch(first, "decode", 1, 1), RLStepConfig(dump_dir=str(tmp_path), policy_lag=1))
    before = _live(trainer)
    trainer.snapshots.held[1] = {n: p.clone() for n, p in before.items()}  # version 2's weights filed as version 1
    report = trainer.rl_step(_batch(second, "decode", 2, 1), RLStepConfig(dump_dir=str(tmp_path), policy_lag=1))
    assert not report.updated and report.parity["train/train_rollout_logprob_abs_diff"] > 0
    assert "TOP parity violation at step 2" in report.violation
    assert "generated under weight version 1" in report.violation and "trainer is at version 2" in report.violation
    assert all(torch.equal(p, before[n]) for n, p in _live(trainer).items()), "a refused step changed the weights"
    assert trainer.snapshots.current == 2  # no update: still version 2


def test_a_version_without_a_copy_is_refused_naming_it_and_the_versions_held(tmp_path):
    trainer, first, second = _world("decode")
    trainer.rl_step(_batch(first, "decode", 1, 1), RLStepConfig(dump_dir=str(tmp_path), policy_lag=1))
    trainer.rl_step(_batch(second, "decode", 2, 1), RLStepConfig(dump_dir=str(tmp_path), policy_lag=1))
    with pytest.raises(PolicyVersionMissing, match=r"the batch of step 3 needs the weights of version 1; this trainer "
                                                   r"is at version 3 and holds copies of versions \[2, 3\]"):
        trainer.rl_step(_batch(second, "decode", 3, 1), RLStepConfig(dump_dir=str(tmp_path), policy_lag=1))


def test_the_ring_keeps_the_last_versions_and_restores_the_live_weights_bitwise():
    model = torch.nn.Linear(3, 2)
    ring = PolicySnapshots(keep=1)
    v1 = {n: p.detach().clone() for n, p in model.named_parameters()}
    ring.record(model)
    with torch.no_grad():
        model.weight.add_(1.0)
    ring.advance()
    v2 = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ring.swapped_in(model, 1):
        assert all(torch.equal(p, v1[n]) for n, p in model.named_parameters())
    assert all(torch.equal(p, v2[n]) for n, p in model.named_parameters())
    ring.record(model)
    ring.advance()
    assert ring.versions() == [2] and ring.current == 3
    restored = PolicySnapshots(keep=1)
    restored.load_state_dict(ring.state_dict(), "cpu")
    assert restored.current == 3 and restored.versions() == [2]
    assert all(torch.equal(restored.held[2][n], v2[n]) for n in v2)
    assert PolicySnapshots(keep=0).versions() == [] and dataclasses.fields(RLStepConfig)  # keep=0 records nothing
    empty = PolicySnapshots(keep=0)
    empty.record(model)
    assert empty.held == {}
