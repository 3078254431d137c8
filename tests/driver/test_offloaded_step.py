"""The trainer actor's step under trainer.offload_during_rollout (top_rl.driver.actors.offloaded_step): the optimizer
state is back on the device before the step and parked after it, both moves timed into the report; without the
switch nothing moves."""

from __future__ import annotations

from types import SimpleNamespace

from top_rl.driver.actors import offloaded_step


class _Optimizer:
    def __init__(self):
        self.offloaded, self.calls = True, []

    def onload(self):
        self.calls.append("onload")
        self.offloaded = False

    def offload(self):
        self.calls.append("offload")
        self.offloaded = True


class _Trainer:
    def __init__(self, report=True):
        self.optimizer, self.report = _Optimizer(), report

    def rl_step(self, batch, cfg):
        assert not self.optimizer.offloaded, "the step ran with the optimizer state offloaded"
        self.optimizer.calls.append("rl_step")
        return SimpleNamespace(timings={"forward_backward": 1.0}) if self.report else None  # ranks > 0: None


def test_the_state_comes_back_for_the_step_and_goes_after_it_timed():
    trainer = _Trainer()
    report = offloaded_step(trainer, "batch", "cfg", offload=True)
    assert trainer.optimizer.calls == ["onload", "rl_step", "offload"] and trainer.optimizer.offloaded
    assert set(report.timings) == {"forward_backward", "onload", "offload"}
    assert all(v >= 0 for v in report.timings.values())
    other = _Trainer(report=False)
    assert offloaded_step(other, "batch", "cfg", offload=True) is None and other.optimizer.offloaded


def test_without_the_switch_nothing_moves():
    trainer = _Trainer()
    trainer.optimizer.offloaded = False
    report = offloaded_step(trainer, "batch", "cfg", offload=False)
    assert trainer.optimizer.calls == ["rl_step"] and set(report.timings) == {"forward_backward"}
