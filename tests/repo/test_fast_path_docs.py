"""What the docs say the fast paths change is what top_rl/kernels/plan.py says (issue 51: the docs claimed no fast
path changes a number, while three change the gradients)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from top_rl.kernels import plan

ROOT = Path(__file__).resolve().parents[2]


def _switches_named(text: str) -> set[str]:
    return {f.name for f in dataclasses.fields(plan.FastPaths) if re.search(rf"\b{f.name}\b", text)}


def test_the_plan_names_which_fast_paths_keep_the_gradients_and_which_change_them():
    doc = plan.__doc__
    keeps, changes = doc.split("CHANGES_GRADIENTS")[0], doc.split("CHANGES_GRADIENTS")[1]
    everything = {f.name for f in dataclasses.fields(plan.FastPaths)}
    assert _switches_named(keeps) == everything - plan.CHANGES_GRADIENTS
    assert _switches_named(changes) == set(plan.CHANGES_GRADIENTS)
    assert len(plan.CHANGES_GRADIENTS) == 5 and plan.CHANGES_GRADIENTS < everything


def test_the_architecture_page_names_the_fast_paths_that_change_the_gradients():
    text = (ROOT / "docs/architecture.md").read_text()
    paragraph = text[text.index("switches under `top.fast_paths`"):].split("\n\n")[0]
    assert _switches_named(paragraph) == set(plan.CHANGES_GRADIENTS)
    assert "change no number" not in paragraph
