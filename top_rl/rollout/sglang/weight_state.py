"""What an SGLang engine knows about the weights its server holds, and the only ways that knowledge changes.

The server itself keeps no record a restart survives: after one it holds the checkpoint it was launched with. So the
engine keeps the version it last synced (every answer must report it), where that version came from (a disk version
can be replayed by the engine alone; a CUDA IPC or broadcast version cannot), and whether the GPU memory was handed
to the trainer (cluster.gpu_handoff). Each transition below is one event of the engine's; `refusal` says why a request
must not reach the server now, or None.
"""

from __future__ import annotations

from dataclasses import dataclass

from top_rl.rollout.sglang.client import SglangError


class SglangEngineRestarted(SglangError):
    """The server was restarted and holds its initial weights; sync weights again before the next request."""


@dataclass
class WeightState:
    version: int = 0  # weight updates done: the trainer's number of the last (0: the launch checkpoint)
    expected: str | None = None  # the weight_version every answer must report after an update
    disk_path: str | None = None  # the last version loaded from disk (a restart replays it)
    disk_version: str | None = None  # the version disk_path holds
    needs_sync: bool = False  # the server lost weights the engine cannot replay
    group: str | None = None  # the trainer's broadcast group the server's ranks joined (lost on a restart)
    released: bool = False  # the GPU memory given back (cluster.gpu_handoff)
    resumed_empty: bool = False  # the memory taken back, the weights not yet pushed again

    # ------------------------------------------------------------------ transitions
    def next_version(self, version: int | None) -> int:
        """The version an update without one becomes: the one after this engine's last."""
        return self.version + 1 if version is None else int(version)

    def synced(self, version: str) -> None:
        """A whole version reached the server (any way in)."""
        self.expected, self.resumed_empty, self.needs_sync = version, False, False
        self.version = int(version) if version.isdigit() else self.version + 1

    def loaded_from_disk(self, path: str, version: str | None) -> None:
        self.disk_path, self.disk_version = path, version

    def joined(self, group: str) -> None:
        self.group = group

    def left_group(self) -> None:
        self.group = None

    def released_memory(self) -> None:
        self.released, self.needs_sync = True, True

    def resumed_memory(self) -> None:
        self.released, self.resumed_empty = False, True

    def restarted(self) -> str | None:
        """The server came back with its launch checkpoint: the disk path to reload the expected version from, or None
        (nothing to replay: never updated, or the last version came another way, which now needs a sync)."""
        if self.version == 0:
            return None
        if self.disk_path and self.expected == self.disk_version:
            return self.disk_path
        self.needs_sync = True
        return None

    # ------------------------------------------------------------------ the verdict
    def refusal(self, url: str, model_path: str) -> SglangError | None:
        """Why no request may reach the server at `url` now, or None."""
        if self.released:
            return SglangError(f"the SGLang server on {url} has released its GPU memory (cluster.gpu_handoff): "
                               "resume_memory() and push the weights before the next request")
        if self.needs_sync and self.resumed_empty:
            return SglangError(f"the SGLang server on {url} took its GPU memory back without weights "
                               f"(cluster.gpu_handoff): push weight version {self.version + 1} before the next request; "
                               "sync the trainer's weights again")
        if self.needs_sync:
            group = (" (its ranks left the broadcast group: join_weight_group with the trainer again)"
                     if self.group else "")
            return SglangEngineRestarted(
                f"the SGLang server on {url} was restarted and holds the weights of {model_path}, "
                f"not weight version {self.version}{group}: sync the trainer's weights again, then retry")
        return None
