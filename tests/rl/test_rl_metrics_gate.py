import math
import warnings

import pytest
import torch

from top_rl.rl.gate import GateConfig, ParityViolation, check
from top_rl.rl.metrics import (ess_ratio, first_difference, parity_metrics, train_rollout_kl,
                               train_rollout_logprob_abs_diff)

T = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
R = [torch.tensor([-1.0, -2.5]), torch.tensor([0.0])]


def test_metrics_by_hand():
    # per-sample means: (0 + .5)/2 = .25 and .5 -> mean .375 (a global token mean would be 1/3)
    assert train_rollout_logprob_abs_diff(T, R) == pytest.approx(0.375)
    e = math.exp(0.5)
    assert ess_ratio(T, R) == pytest.approx(((1 + e) ** 2 / (2 * (1 + e * e)) + 1.0) / 2)
    # k3 with d = trainer - rollout: sample0 d=[0,.5], sample1 d=-.5
    k = ((0 + (e - 1.5)) / 2 + (math.exp(-0.5) - 0.5)) / 2
    assert train_rollout_kl(T, R) == pytest.approx(k)
    fd = first_difference(T, R)
    assert (fd.sample, fd.position, fd.trainer, fd.rollout) == (0, 1, -2.0, -2.5)
    m = parity_metrics(T, R)
    assert m.violation and m.finite and m.abs_diff_max == pytest.approx(0.5)
    assert m.frac_equal == pytest.approx(1 / 3) and m.n_tokens == 3
    d = m.to_dict()
    assert d["train/train_rollout_logprob_abs_diff"] == pytest.approx(0.375)
    assert d["train/ess_ratio"] == m.ess_ratio and d["train/train_rollout_kl"] == m.kl


def test_identical_is_exactly_zero_and_one():
    x = [torch.randn(7, dtype=torch.float32) - 3, torch.randn(300) - 1, torch.zeros(0)]
    m = parity_metrics(x, [t.clone() for t in x])
    assert m.abs_diff == 0.0 and m.ess_ratio == 1.0 and m.kl == 0.0
    assert m.first_diff is None and not m.violation and m.frac_equal == 1.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_is_violation_never_zero(bad):
    t = [torch.tensor([-1.0, bad])]
    r = [torch.tensor([-1.0, bad])]  # even "equal" non-finite values on both sides
    m = parity_metrics(t, r)
    assert not m.finite and m.violation and m.n_nonfinite == 1
    assert not math.isfinite(m.abs_diff) and not math.isfinite(m.kl)
    assert m.first_diff.position == 1
    m2 = parity_metrics([torch.tensor([-1.0, -2.0])], r)  # one side only
    assert not math.isfinite(m2.abs_diff) and m2.violation


def test_gate_passes_on_parity(tmp_path):
    x = [torch.tensor([-0.1, -2.0]), torch.tensor([-3.0])]
    m = check(x, [t.clone() for t in x], step=4, dump_dir=str(tmp_path))
    assert m.abs_diff == 0.0 and m.ess_ratio == 1.0
    assert list(tmp_path.iterdir()) == []


def test_gate_halts_with_report_and_dump(tmp_path):
    t = [torch.tensor([-0.1, -2.0]), torch.tensor([-3.0, -1.0])]
    r = [t[0].clone(), torch.tensor([-3.0, torch.nextafter(torch.tensor(-1.0), torch.tensor(0.0))])]
    with pytest.raises(ParityViolation) as ei:
        check(t, r, step=7, dump_dir=str(tmp_path / "dumps"), sample_ids=["a", "b"],
              tokens=[[1, 2, 3], [1, 4, 5]], metadata={"prompt": "x"})
    e = ei.value
    msg = str(e)
    rv = float(r[1][1])
    assert "step 7" in msg and "sample 1 (id b)" in msg and "token position 1" in msg
    assert "trainer=-1.0 " in msg and f"rollout={rv!r}" in msg and e.dump_path in msg
    d = torch.load(e.dump_path)
    assert d["step"] == 7 and d["sample_ids"] == ["a", "b"] and d["metadata"] == {"prompt": "x"}
    assert torch.equal(d["rollout_logprobs"][1], r[1]) and torch.equal(d["trainer_logprobs"][1], t[1])
    assert d["tokens"][1].tolist() == [1, 4, 5]
    assert d["metrics"]["first_diff"] == {"sample": 1, "position": 1, "trainer": -1.0, "rollout": rv}


def test_gate_warn_disabled_mismatch_and_update(tmp_path):
    t, r = [torch.tensor([-1.0])], [torch.tensor([-1.5])]
    with pytest.warns(RuntimeWarning, match="parity violation at step 2"):
        m = check(t, r, step=2, cfg=GateConfig(on_violation="warn"), dump_dir=str(tmp_path))
    assert m.abs_diff == 0.5 and (tmp_path / "parity_violation_step000002.pt").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = check(t, r, step=3, cfg=GateConfig(enabled=False), dump_dir=str(tmp_path / "off"))
    assert m.abs_diff == 0.5 and not (tmp_path / "off").exists()
    with pytest.raises(ParityViolation, match="sample 0: trainer has 1 log-probs, rollout 2"):
        check(t, [torch.tensor([-1.0, -2.0])], step=5, dump_dir=str(tmp_path))
    x = [torch.tensor([-1.0, -2.0])]
    with pytest.raises(ValueError, match="on_violation"):
        check(x, x, step=0, cfg=GateConfig(on_violation="skip"))
