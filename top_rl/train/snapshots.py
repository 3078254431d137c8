"""The trainer's policy versions: the live weights' version and copies of the last K versions' weights.

Under `rollout.policy_lag=K` the batch a step trains was sampled under an older version v (top_rl.rl.versions). The
gate must prove it against v's weights, and PPO's old policy must be v's log-probs, exactly: so each rank keeps a
copy of its parameters per version still needed (keyed by version, at most K), swaps v's in for one forward without
gradients, and swaps the live ones back. Copies are of each parameter in its own dtype (the compute dtype's bf16
linears on a GPU run, fp32 where the model computes in fp32): the exact values the engine sampled with, never a
rounded copy. A copy lives on the parameter's GPU when there is room for it (twice its size free), otherwise in
pinned host memory.

A version this ring does not hold is refused (PolicyVersionMissing), naming it and the versions held: the trainer
never computes the gate or the loss under weights other than the ones the batch names.
"""

from __future__ import annotations

import contextlib

import torch


class PolicyVersionMissing(RuntimeError):
    pass


def _bytes(params: dict[str, torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in params.values())


class PolicySnapshots:
    def __init__(self, keep: int, current: int = 1):
        """`keep`: versions older than the live one to hold (rollout.policy_lag). `current`: the live weights'
        version (1: the initial policy)."""
        self.keep, self.current = keep, current
        self.held: dict[int, dict[str, torch.Tensor]] = {}

    def versions(self) -> list[int]:
        return sorted(self.held)

    def record(self, model) -> None:
        """Copy the live weights as version `current` (before the step's update changes them); nothing when keep=0."""
        if self.keep == 0 or self.current in self.held:
            return
        params = {n: p.detach() for n, p in model.named_parameters()}
        on_gpu = bool(params) and next(iter(params.values())).is_cuda
        room = on_gpu and torch.cuda.mem_get_info()[0] > 2 * _bytes(params)
        if not on_gpu or room:
            self.held[self.current] = {n: p.clone() for n, p in params.items()}
        else:  # pinned: the copy back to the GPU is one fast DMA per parameter
            self.held[self.current] = {n: p.to("cpu", copy=True).pin_memory() for n, p in params.items()}

    def advance(self) -> None:
        """The step's update was applied: the live weights are the next version; drop copies no batch can need."""
        self.current += 1
        for v in [v for v in self.held if v < self.current - self.keep]:
            del self.held[v]

    def _missing(self, version: int, what: str) -> PolicyVersionMissing:
        held = ", ".join(map(str, self.versions())) or "none"
        return PolicyVersionMissing(
            f"{what} needs the weights of version {version}; this trainer is at version {self.current} and holds "
            f"copies of versions [{held}] (rollout.policy_lag={self.keep})")

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self, model, version: int, what: str = "the step"):
        """The model computes with version `version`'s weights inside the block (the live weights when it is the
        current version), and with its live weights, bit for bit, after it."""
        if version == self.current:
            yield
            return
        if version not in self.held:
            raise self._missing(version, what)
        params = dict(model.named_parameters())
        live = self.held.get(self.current)  # recorded at the step's start: no second copy needed
        if live is None:
            live = {n: p.detach().clone() for n, p in params.items()}
        for n, p in params.items():
            p.copy_(self.held[version][n])
        try:
            yield
        finally:
            for n, p in params.items():
                p.copy_(live[n])

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the live version and the copies a resumed run's next batches need."""
        return {"current": self.current, "keep": self.keep,
                "held": {v: {n: t.cpu() for n, t in ps.items()} for v, ps in self.held.items()}}

    def load_state_dict(self, sd: dict, device) -> None:
        self.current = int(sd["current"])
        self.held = {int(v): {n: t.to(device) for n, t in ps.items()} for v, ps in sd["held"].items()
                     if int(v) >= self.current - self.keep}
