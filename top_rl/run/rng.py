"""Every global RNG of a process (python, numpy, torch CPU and CUDA): seeded at start, saved with each
checkpoint and restored on resume, so a resumed run is the run that never stopped."""

from __future__ import annotations

import random

import numpy as np
import torch


def state() -> dict:
    """This process's RNG states (python, numpy, torch CPU and CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def to_json(state: dict) -> dict:
    """`state()` as JSON values (a trainer rank's RNG in a checkpoint: top_rl.run.dist_state; json.loads runs no
    code). Exact: integers stay integers, floats round-trip through repr, tensors go as the hex of their bytes."""
    version, internal, gauss = state["python"]
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out = {"python": [version, list(internal), gauss],
           "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
           "torch": state["torch"].numpy().tobytes().hex()}
    if "cuda" in state:
        out["cuda"] = [t.cpu().numpy().tobytes().hex() for t in state["cuda"]]
    return out


def from_json(obj: dict) -> dict:
    """The inverse of `to_json` (ValueError/TypeError/KeyError for what it could not have written)."""
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(bytes.fromhex(text)), dtype=torch.uint8).clone()

    version, internal, gauss = obj["python"]
    kind, keys, pos, has_gauss, cached = obj["numpy"]
    state = {"python": (version, tuple(internal), gauss),
             "numpy": (kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached),
             "torch": tensor(obj["torch"])}
    if "cuda" in obj:
        state["cuda"] = [tensor(t) for t in obj["cuda"]]
    return state


def refusal(state) -> str | None:
    """Why `restore(state)` would fail (a state of the wrong shape or size: a checkpoint edited with its manifest
    recomputed), or None. Tried on fresh generators: this process's RNGs are left as they are."""
    try:
        random.Random().setstate(state["python"])
        np.random.RandomState().set_state(state["numpy"])
        torch.Generator().set_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            for gen, saved in zip(torch.cuda.default_generators, state["cuda"], strict=True):
                if not isinstance(saved, torch.Tensor) or saved.shape != gen.get_state().shape:
                    raise ValueError(f"a CUDA RNG state of shape {getattr(saved, 'shape', None)}")
    except Exception as e:  # noqa: BLE001 - any way it fails is the same answer: it cannot be restored
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'bad value'}"
    return None


def seed(seed: int) -> None:
    """Seed this process's global RNGs (driver and trainer ranks). Nothing draws from them today (seeds
    are pure functions of the step); if something ever does, a fresh run is reproducible and a resume
    restores the states saved with the checkpoint."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
