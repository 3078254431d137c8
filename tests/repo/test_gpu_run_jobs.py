"""The GPU jobs scripts/gpu_run.sh launches (`e2e`: runs a, b, c, s, g) compose on this machine: an override the
schema refuses would otherwise surface only on the GPU machine, after the bundle's install and minutes of device
time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_run.sh"


def _e2e_arrays() -> dict[str, list[str]]:
    """The script's own override arrays (NATIVE, B, G), evaluated by bash exactly as the e2e stage defines them."""
    text = SCRIPT.read_text()
    start, end = text.index("  NATIVE=("), text.index("  : >\"$OUT/e2e.log\"")
    shown = 'for a in NATIVE B G; do n="$a[@]"; printf "%s\\0" "$a" "${!n}" ""; done'
    out = subprocess.run(["bash", "-c", text[start:end] + shown], capture_output=True, text=True, check=True).stdout
    arrays, name, items = {}, None, []
    for tok in out.split("\0")[:-1]:
        if name is None:
            name = tok
        elif tok == "":
            arrays[name], name, items = items, None, []
        else:
            items.append(tok)
    return arrays


def test_the_script_defines_the_runs_it_is_checked_for():
    arrays = _e2e_arrays()
    assert arrays["NATIVE"] == ["+experiment=one_node_qwen3_0.6b_arith"]
    assert "rollout.sglang.mem_fraction_static=0.6" in arrays["G"] and "checkpoint.every=0" in arrays["G"]
    assert "cluster.gpu_handoff=true" in arrays["G"]


@pytest.mark.parametrize("run", ["a", "b", "s", "g"])
def test_every_e2e_run_composes(run):
    from top_rl.cli import compose

    arrays = _e2e_arrays()
    overrides = {"a": arrays["NATIVE"], "b": arrays["NATIVE"] + arrays["B"],
                 "s": ["+experiment=one_gpu_qwen3_0.6b_sglang"], "g": arrays["G"]}[run]
    cfg = compose(["tracking.wandb_mode=disabled", "tracking.console=true", *overrides, "steps=10"])
    assert cfg.steps == 10
    if run == "g":
        assert cfg.rollout.engine == "sglang" and cfg.rollout.sglang.mem_fraction_static == 0.6
        assert cfg.cluster.gpu_handoff and cfg.rollout.sglang.max_running_requests == 512
        assert cfg.task.name == "gsm8k" and cfg.model.path is None
