"""Issue 53 item 5: the trainer's state saved with torch DCP under global names loads into another layout bitwise.

A trainer (TP=1, one rank) takes a step with a policy-lag snapshot held and saves; two gloo ranks load it as TP=2 and
as DP=2 and each saves again; one rank loads the DP=2 save back. Every saved entry (weights, fp32 masters, AdamW
moments and step counts, the snapshot) read back whole is bitwise the first save's, each layout took a step from the
loaded state (losses equal the uninterrupted trainer's to rounding: the reduction order differs), and the step and
versions came back."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from tests.train.common import both_kinds, pg_loss, reference_model, rollouts, tiny_config
from top_rl.model import hf_state_dict
from top_rl.run import dist_state
from top_rl.train import Trainer, TrainerSettings
from top_rl.train.parallel import spawn
from top_rl.train.snapshots import PolicySnapshots

DTYPE, LR = "bfloat16", 1e-2


def _trainer(cfg, **layout) -> Trainer:
    t = Trainer(cfg, TrainerSettings(dtype=DTYPE, micro_batch_size=3, lr=LR, **layout))
    t.snapshots = PolicySnapshots(keep=1)
    return t


def _step(trainer, batch):
    trainer.snapshots.record(trainer.model)
    metrics = trainer.train_step(batch, pg_loss(batch))
    trainer.snapshots.advance()
    return metrics


def _on_two_ranks(rank, world, cfg, samples, src, out):
    batch = both_kinds(samples)
    for name, layout in (("tp2", {"tp": 2}), ("dp2", {})):
        trainer = _trainer(cfg, **layout)
        dist_state.load(trainer, src)
        dist_state.save(trainer, out / name)
        loss = _step(trainer, batch)["loss"]
        if rank == 0:
            (out / f"{name}.json").write_text(json.dumps({"loss": loss, "step": trainer.step,
                                                          "version": trainer.snapshots.current}))
        dist.barrier()


def _equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_trainer_state_reshards_over_dp_and_tp_bitwise(tmp_path):
    cfg = tiny_config(41, tied=True, tp_friendly=True)
    model = reference_model(cfg, DTYPE, 41)
    samples = rollouts(model, n=4, seed=41)
    batch = both_kinds(samples)
    trainer = _trainer(cfg)
    trainer.load_hf(hf_state_dict(model))
    _step(trainer, batch)
    dist_state.save(trainer, tmp_path / "tp1")
    saved = dist_state.read_full(tmp_path / "tp1")
    assert any(k.startswith("optim.exp_avg.") for k in saved) and any(k.startswith("snapshot.1.") for k in saved)
    assert any(k.startswith("optim.master.") for k in saved) and any(k.endswith("#gate") for k in saved)
    straight = _step(trainer, batch)["loss"]  # the uninterrupted trainer's next step

    spawn(_on_two_ranks, 2, cfg, samples, tmp_path / "tp1", tmp_path)
    for name in ("tp2", "dp2"):
        _equal(dist_state.read_full(tmp_path / name), saved)
        after = json.loads((tmp_path / f"{name}.json").read_text())
        assert (after["step"], after["version"]) == (2, 3)
        assert abs(after["loss"] - straight) <= 1e-3 * max(1.0, abs(straight)), (name, after["loss"], straight)

    back = _trainer(cfg)  # DP=2 -> one rank
    dist_state.load(back, tmp_path / "dp2")
    dist_state.save(back, tmp_path / "back")
    _equal(dist_state.read_full(tmp_path / "back"), saved)
