"""The GPU jobs scripts/gpu_run.sh launches (`e2e`: runs a, b, c, s, g, g4b) compose on this machine: an override the
schema refuses would otherwise surface only on the GPU machine, after the bundle's install and minutes of device
time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_run.sh"


def _e2e_arrays() -> dict[str, list[str]]:
    """The script's own override arrays (NATIVE, B, G, G4B), evaluated by bash exactly as the e2e stage defines them."""
    text = SCRIPT.read_text()
    start, end = text.index("  NATIVE=("), text.index("  : >\"$OUT/e2e.log\"")
    shown = 'for a in NATIVE B G G4B; do n="$a[@]"; printf "%s\\0" "$a" "${!n}" ""; done'
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
    assert {"model=qwen3_4b", "cluster.gpu_handoff=true", "trainer.offload_during_rollout=true"} <= set(arrays["G4B"])
    text = SCRIPT.read_text()
    assert 'g4b) args=("${G4B[@]}" steps="${E2E_G4B_STEPS:-3}" ${E2E_G4B_ARGS:-})' in text


@pytest.mark.parametrize("run", ["a", "b", "s", "g", "g4b"])
def test_every_e2e_run_composes(run):
    from top_rl.cli import compose

    arrays = _e2e_arrays()
    overrides = {"a": arrays["NATIVE"], "b": arrays["NATIVE"] + arrays["B"],
                 "s": ["+experiment=one_gpu_qwen3_0.6b_sglang"], "g": arrays["G"],
                 "g4b": arrays["G4B"]}[run]
    cfg = compose(["tracking.wandb_mode=disabled", "tracking.console=true", *overrides, "steps=10"])
    assert cfg.steps == 10
    if run == "g":
        assert cfg.rollout.engine == "sglang" and cfg.rollout.sglang.mem_fraction_static == 0.6
        assert cfg.cluster.gpu_handoff and cfg.rollout.sglang.max_running_requests == 512
        assert cfg.task.name == "gsm8k" and cfg.model.path is None
    if run == "g4b":  # Qwen3-4B's shape, random init, 64 prompts x 8 x 1024 new tokens, handoff + offload
        assert (cfg.model.hidden_size, cfg.model.intermediate_size, cfg.model.num_hidden_layers) == (2560, 9728, 36)
        assert cfg.model.path is None and cfg.model.max_position_embeddings == 2048 and cfg.task.name == "gsm8k"
        assert (cfg.rollout.prompts_per_step, cfg.rollout.n_samples, cfg.rollout.max_new_tokens) == (64, 8, 1024)
        assert cfg.cluster.gpu_handoff and cfg.trainer.offload_during_rollout
