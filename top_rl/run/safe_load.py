"""Checkpoint files load as tensors and plain data, never as code.

A `.pt` file is a pickle, and unpickling can call any function the file names: a checkpoint from elsewhere
(or one changed on shared storage, with its manifest recomputed: the manifest is a checksum, not a
signature) could run code when a run resumes. So driver.pt and the trainer shards are read with
`torch.load(weights_only=True)`, which builds only tensors, numbers, strings and containers, plus the few
types named in ALLOWED: numpy's ndarray (the RNG state `np.random.get_state()` returns) and the compute-dtype
enum of the model config. Anything else in a file is refused by name before it is loaded (`refuse_unsafe`,
used by checkpoint verification before Ray starts) and could not be built by `load` either.

Saving checks the same list (`check_saved`): a state that resume could not load is a bug found at the
first checkpoint, not at the resume that needs it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def _allowed() -> list:
    from top_rl.contract import ComputeDtype

    reconstruct = np.zeros(1).__reduce__()[0]  # numpy._core.multiarray._reconstruct (numpy.core before 2.0)
    # np.random.get_state(): ("MT19937", uint32 array, int, int, float)
    return [np.ndarray, np.dtype, type(np.dtype(np.uint32)), reconstruct, ComputeDtype]


class UnsafeCheckpointFile(ValueError):
    """A checkpoint file that names Python objects beyond tensors and plain data; `names` lists them."""

    def __init__(self, path: Path, names: list[str]):
        self.path, self.names = Path(path), sorted(names)
        super().__init__(f"{self.path} holds Python objects other than tensors and plain data ({', '.join(self.names)}): "
                         "top-rl loads no code from a checkpoint")


def unsafe_globals(path: str | Path) -> list[str]:
    """The functions and classes `path` would make the unpickler call that ALLOWED does not name (reads the
    file's pickle without running it)."""
    with torch.serialization.safe_globals(_allowed()):
        return torch.serialization.get_unsafe_globals_in_checkpoint(str(path))


def refuse_unsafe(path: str | Path) -> None:
    names = unsafe_globals(path)
    if names:
        raise UnsafeCheckpointFile(Path(path), names)


def load(path: str | Path):
    """`torch.load` of a checkpoint file that builds tensors and plain data only (module doc)."""
    with torch.serialization.safe_globals(_allowed()):
        return torch.load(str(path), weights_only=True)


def check_saved(path: str | Path) -> None:
    """After `torch.save(state, path)`: the file must load under `load` (module doc)."""
    names = unsafe_globals(path)
    if names:
        raise RuntimeError(f"{path} was written with types a resume refuses to load ({', '.join(sorted(names))}): "
                           "a top-rl bug; the state saved must be tensors and plain data (top_rl/run/safe_load.py)")
