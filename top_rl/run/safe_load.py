"""Checkpoint files load as tensors and plain data, never as code.

A `.pt` file is a pickle, and unpickling can call any function the file names: a checkpoint from elsewhere
(or one changed on shared storage, with its manifest recomputed: the manifest is a checksum, not a
signature) could run code when a run resumes. So driver.pt and the trainer shards are read with
`torch.load(weights_only=True)`, which builds only tensors, numbers, strings and containers, plus the few
types named in ALLOWED: numpy's ndarray (the RNG state `np.random.get_state()` returns) and the compute-dtype
enum of the model config. Anything else in a file is refused by name before it is loaded (`unsafe_globals`, which
checkpoint verification runs before Ray starts: top_rl/run/trainer_files.py, dcp_safe.py) and could not be built by
`load` either. The names are read from the very pickles `torch.load` would unpickle (the zip's data.pkl, as torch's
own reader finds it, or the pickles of a legacy non-zip file), whatever opcodes name them (top_rl.run.pickle_scan): a
payload that hides its callable from torch's GLOBAL-only scan is named and refused like any other, never taken for an
unreadable file.

Saving checks the same list (`check_saved`): a state that resume could not load is a bug found at the
first checkpoint, not at the resume that needs it.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch


def _allowed() -> list:
    from top_rl.config.model import ComputeDtype

    reconstruct = np.zeros(1).__reduce__()[0]  # numpy._core.multiarray._reconstruct (numpy.core before 2.0)
    # np.random.get_state(): ("MT19937", uint32 array, int, int, float). The compute-dtype enum lived in top_rl.contract
    # until the config became plain data of its own: checkpoints written before name it there (the same class).
    return [np.ndarray, np.dtype, type(np.dtype(np.uint32)), reconstruct, ComputeDtype,
            (ComputeDtype, "top_rl.contract.ComputeDtype")]


# A legacy (non-zip) torch.save file: magic number, protocol, sys info, the object, its storage keys, then raw bytes.
_LEGACY_PICKLES = 5


def _named_objects(path) -> tuple[list[str], str | None]:
    """Every object the pickles `torch.load` would read from `path` (or an open binary file) name, and why they could
    not be read whole."""
    import contextlib

    from torch import serialization as ts

    from top_rl.run import pickle_scan

    opened = open(path, "rb") if isinstance(path, (str, Path)) else contextlib.nullcontext(path)
    with opened as f:
        if not ts._is_zipfile(f):  # torch.load's own test: what it does not take for a zip it unpickles as legacy
            return pickle_scan.named_objects(f, _LEGACY_PICKLES)
        with ts._open_zipfile_reader(f) as archive:  # torch's reader: the data.pkl torch.load would read
            if ts._is_torchscript_zip(archive):
                return ["<TorchScript code (a torch.jit archive)>"], None
            data = archive.get_record("data.pkl")
    return pickle_scan.named_objects(io.BytesIO(data))


def _allowed_names() -> set[str]:
    """torch's weights_only allowlist (by its `module.name` strings) plus ALLOWED, as torch.load checks them."""
    from torch import _weights_only_unpickler as allowlist

    with torch.serialization.safe_globals(_allowed()):
        return set(allowlist._get_allowed_globals()) | set(allowlist._get_user_allowed_globals())


def unsafe_globals(path) -> list[str]:
    """The functions and classes `path` (or an open binary file) would make the unpickler import that the allowlist does not name (reads the
    file's pickles without running them). Raises ValueError for a file that names nothing and cannot be read whole
    (truncated, not a torch file): it cannot run anything either, so it is merely unreadable."""
    names, unreadable = _named_objects(path)
    allowed = _allowed_names()
    unsafe = sorted({n for n in names if n not in allowed})
    if unreadable is not None and not unsafe:
        raise ValueError(unreadable)
    return unsafe


def load(path: str | Path, map_location=None):
    """`torch.load` of a checkpoint file that builds tensors and plain data only (module doc); `map_location` as
    torch.load's (the checkpoint converter reads a GPU run's shards onto the CPU)."""
    with torch.serialization.safe_globals(_allowed()):
        return torch.load(str(path), weights_only=True, map_location=map_location)


def check_saved(path: str | Path) -> None:
    """After `torch.save(state, path)`: the file must load under `load` (module doc)."""
    names = unsafe_globals(path)
    if names:
        raise RuntimeError(f"{path} was written with types a resume refuses to load ({', '.join(sorted(names))}): "
                           "a top-rl bug; the state saved must be tensors and plain data (top_rl/run/safe_load.py)")
