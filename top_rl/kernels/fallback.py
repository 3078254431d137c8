"""A fast path that may not work in this process (a Triton launch, a torch.compile), and a slower one with the same
results: the fast one until it first fails, then, after one warning, the slow one for good."""

from __future__ import annotations

import warnings

import torch


def run(failed: dict[str, str], name: str, what: str, instead: str, fast, slow, *args):
    """`fast(*args)`, or `slow(*args)` once `name` is in `failed` (op -> its first error). Out-of-memory is raised:
    the slow path would need more memory, not less."""
    if name not in failed:
        try:
            return fast(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - any compile/launch failure: the slow path computes the same
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            warnings.warn(f"{what} failed ({failed[name]}); {instead} runs from now on", RuntimeWarning, stacklevel=4)
    return slow(*args)
