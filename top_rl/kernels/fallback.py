"""A fast path that may not work in this process (a Triton launch, a torch.compile), and a slower one with the same
results: the fast one until it first fails, then, after one warning, the slow one for good.

It also keeps this process's record for `top_rl.kernels.report()`: the path each op last took (`took`), and every
fallback with its first error (`fell_back`), which the driver counts into the step metrics."""

from __future__ import annotations

import warnings

paths: dict[str, str] = {}  # op -> the path its last call took in this process
fallbacks: dict[str, str] = {}  # op -> the first error of the fast path it fell back from


def took(name: str, path: str) -> None:
    paths[name] = path


def fell_back(name: str, error: str) -> None:
    fallbacks.setdefault(name, error)


def error_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def run(failed: dict[str, str], name: str, what: str, instead: str, fast, slow, *args):
    """`fast(*args)`, or `slow(*args)` once `name` is in `failed` (op -> its first error). Out-of-memory is raised:
    the slow path would need more memory, not less."""
    import torch  # here: importing the seam (the config does) need not import torch

    if name not in failed:
        try:
            out = fast(*args)
            took(name, "fast")
            return out
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - any compile/launch failure: the slow path computes the same
            failed[name] = error_line(e)
            fell_back(name, failed[name])
            warnings.warn(f"{what} failed ({failed[name]}); {instead} runs from now on", RuntimeWarning, stacklevel=4)
    took(name, "fallback")
    return slow(*args)
