"""A checkpoint written before the compute-dtype enum moved from top_rl.contract to the run config's model section
names it by its old path; it still verifies and loads, as the same enum (top_rl/run/safe_load.py)."""

from __future__ import annotations

import io

import torch

from top_rl.config.model import ComputeDtype
from top_rl.run import safe_load


def _saved_under(module: str, tmp_path):
    buf = io.BytesIO()  # the legacy format: its pickle names the class as plain text, which the old path replaces
    torch.save({"dtype": ComputeDtype.bfloat16}, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    assert data.count(b"top_rl.config.model") == 1
    path = tmp_path / "driver.pt"
    path.write_bytes(data.replace(b"top_rl.config.model", module.encode()))
    return path


def test_a_checkpoint_naming_the_enum_by_its_old_path_loads_as_the_same_enum(tmp_path):
    path = _saved_under("top_rl.contract", tmp_path)
    assert safe_load.unsafe_globals(path) == []
    assert safe_load.load(path) == {"dtype": ComputeDtype.bfloat16}


def test_another_path_for_the_enum_is_still_refused_by_name(tmp_path):
    path = _saved_under("top_rl.kernels", tmp_path)  # a path no checkpoint ever used
    assert safe_load.unsafe_globals(path) == ["top_rl.kernels.ComputeDtype"]
