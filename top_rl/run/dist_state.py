"""The trainer's state in a checkpoint, in any layout: torch DCP (torch.distributed.checkpoint) keyed by global names.

Every trainer rank takes part in `save(trainer, directory)` and `load(trainer, directory)` (collectives over the
trainer's default group). The directory holds
  .metadata, __R_0.distcp   torch DCP: one entry per tensor of the whole model, keyed by its global (layout-free)
                            Megatron name; each rank writes the chunks it holds, a chunk held by several ranks (DP, CP
                            replicas, TP-replicated norms) once. A TP-split tensor is a DTensor sharded over the TP
                            group on its split dimension (top_rl.model.megatron_tp.tp_kind); linear_fc1, which a TP rank
                            holds as [gate shard; up shard], is two entries (`#gate`, `#up`), each split on dim 0.
      model.<name>                       the weights, in their own dtype
      optim.master.<name>                fp32 masters of compute-dtype weights
      optim.exp_avg.<name>, optim.exp_avg_sq.<name>, optim.step.<name>   AdamW's state
      snapshot.<version>.<name>          weights of older versions a lagged step needs (rollout.policy_lag)
  trainer_state.json        step, weight versions, layout and model config (rank 0)
  rng_rankRRR.json          each rank's RNG states (top_rl.run.rng.to_json)
Loading reads, for this rank's layout, the chunks it now holds from wherever they were written (DCP's resharding):
values are only moved, never recomputed, so the weights, masters and moments after a load are bitwise the ones
saved, in any DP/TP/CP/PP layout (the LM head's tied copy on the last PP stage is loaded from the embedding's entry,
which it equals). What does change with the layout is the arithmetic of the steps that follow (README, Resume).
RNG: rank r restores the state saved by rank r, by rank r mod (ranks saved) after a layout change (nothing in
training draws from it: top_rl.run.rng.seed).
The index is read without running code (top_rl.run.dcp_safe); the records are tensors only, read by DCP with
torch.load(weights_only=True).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.distributed as dist

from top_rl.run.trainer_files import STATE, rng_file
from top_rl.run.trainer_files import STATE_FORMAT as FORMAT
from top_rl.model import megatron_tp

_TIED = "embedding.word_embeddings.weight"
_FC1 = "mlp.linear_fc1.weight"


class _Placer:
    """Global keys and DCP values (plain tensors or TP DTensors) for this rank's local tensors."""

    def __init__(self, trainer):
        self.trainer, self.layout = trainer, trainer.layout
        self.meshes: dict[str, object] = {}

    def _mesh(self, device_type: str):
        if device_type not in self.meshes:
            from torch.distributed.device_mesh import DeviceMesh

            self.meshes[device_type] = DeviceMesh.from_group(self.trainer.groups["tp"], device_type)
        return self.meshes[device_type]

    def global_name(self, local: str, param) -> str:
        return _TIED if getattr(param, "top_tied_copy", False) else megatron_tp.global_name(local, self.trainer.offset)

    def pieces(self, key: str, name: str, t: torch.Tensor) -> dict[str, object]:
        """`t` (a local tensor shaped like parameter `name`) as DCP entries under `key`."""
        if t.dim() == 0:
            return {key: t}
        if name.endswith(_FC1):
            gate, up = t.chunk(2)
            return {f"{key}#gate": self._wrap(gate, "column"), f"{key}#up": self._wrap(up, "column")}
        return {key: self._wrap(t, megatron_tp.tp_kind(name))}

    def _wrap(self, t: torch.Tensor, kind: str):
        tp = self.layout.tp
        if tp == 1 or kind == "replicated":
            return t
        from torch.distributed.tensor import DTensor, Shard

        dim = 0 if kind == "column" else 1
        shape = list(t.shape)
        shape[dim] *= tp
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(t, self._mesh(t.device.type), [Shard(dim)], run_check=False,
                                  shape=torch.Size(shape), stride=stride)


def _entries(trainer, tensors_of, with_tied: bool) -> dict[str, object]:
    """DCP entries for every local parameter: `tensors_of(local_name, param)` gives {key prefix: local tensor}."""
    placer = _Placer(trainer)
    out: dict[str, object] = {}
    for n, p in trainer.model.named_parameters():
        if getattr(p, "top_tied_copy", False) and not with_tied:
            continue  # equal to the embedding, which is saved (on the first stage)
        g = placer.global_name(n, p)
        for prefix, t in tensors_of(n, p).items():
            out.update(placer.pieces(f"{prefix}.{g}", g, t))
    return out


def _optim_prefixes(named_state: dict, n: str) -> dict[str, torch.Tensor]:
    return {f"optim.{k}": v for k, v in named_state[n].items()}


def save(trainer, directory: str | Path, rng_state: dict | None = None) -> None:
    """Write this rank's part of the trainer's state into `directory` (collective; module doc). `rng_state`: the RNG
    states to record for this rank (top_rl.run.rng.state()'s form), this process's when None (the checkpoint
    converter records the ones an old checkpoint's shard holds)."""
    from torch.distributed import checkpoint as dcp

    from top_rl.run import rng

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    opt = trainer.optimizer.named_state()
    held = trainer.snapshots.held
    stepped = [bool({"exp_avg", "exp_avg_sq", "step"} & set(s)) for s in opt.values()]
    if len(set(stepped)) > 1:
        raise RuntimeError("top-rl: some parameters have optimizer state and some do not; cannot checkpoint")

    def tensors_of(n, p):
        out = {"model": p.detach(), **_optim_prefixes(opt, n)}
        for v, params in held.items():
            out[f"snapshot.{v}"] = params[n]
        return out

    entries = _entries(trainer, tensors_of, with_tied=False)
    dcp.save(entries, storage_writer=dcp.FileSystemWriter(str(directory), single_file_per_rank=True,
                                                          thread_count=1))
    rank = dist.get_rank()
    (directory / rng_file(rank)).write_text(json.dumps(rng.to_json(rng_state or rng.state())), encoding="utf-8")
    if rank == 0:
        meta = {"format": FORMAT, "step": trainer.step, "world": dist.get_world_size(),
                "layout": {k: getattr(trainer.layout, k) for k in ("dp", "tp", "pp", "cp")},
                "optimizer_state": bool(stepped and stepped[0]),
                "policy_versions": {"current": trainer.snapshots.current, "keep": trainer.snapshots.keep,
                                    "held": sorted(held)},
                "model_config": dataclasses.asdict(trainer.model_cfg)}
        (directory / STATE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    dist.barrier()


def read_state(directory: str | Path) -> dict:
    return json.loads((Path(directory) / STATE).read_text(encoding="utf-8"))


@torch.no_grad()
def load(trainer, directory: str | Path) -> dict:
    """Load the trainer's state from `directory` into this rank's layout (collective; module doc). Returns the
    trainer_state.json it was written with. ValueError naming what does not fit this trainer."""
    from top_rl.run import rng

    directory = Path(directory)
    meta = read_state(directory)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{directory / STATE}: format {meta.get('format')!r}, this top-rl reads {FORMAT}")
    saved_cfg, mine = meta["model_config"], dataclasses.asdict(trainer.model_cfg)
    if saved_cfg != mine:
        diff = sorted(k for k in set(saved_cfg) | set(mine) if saved_cfg.get(k) != mine.get(k))
        raise ValueError(f"{directory} holds a trainer for another model (differs in {', '.join(diff)})")
    named_opt = trainer.optimizer.named_state()  # which tensors this optimizer keeps (masters), filled below
    policy = meta["policy_versions"]
    versions = [v for v in policy["held"] if v >= policy["current"] - trainer.snapshots.keep]
    model_buf: dict[str, torch.Tensor] = {}
    opt_buf: dict[str, dict[str, torch.Tensor]] = {}
    snap_buf: dict[int, dict[str, torch.Tensor]] = {v: {} for v in versions}
    masters = {n for n, s in named_opt.items() if "master" in s}
    moments = meta["optimizer_state"]

    def tensors_of(n, p):
        model_buf[n] = torch.empty_like(p)
        out = {"model": model_buf[n]}
        s = opt_buf[n] = {}
        if n in masters:
            s["master"] = torch.empty_like(p, dtype=torch.float32)
        if moments:
            s["exp_avg"] = torch.empty_like(p, dtype=torch.float32)
            s["exp_avg_sq"] = torch.empty_like(p, dtype=torch.float32)
            s["step"] = torch.empty((), dtype=torch.float32)
        out.update({f"optim.{k}": v for k, v in s.items()})
        for v in versions:
            snap_buf[v][n] = torch.empty_like(p)
            out[f"snapshot.{v}"] = snap_buf[v][n]
        return out

    _dcp_load(_entries(trainer, tensors_of, with_tied=True), directory)
    for n, p in trainer.model.named_parameters():
        p.copy_(model_buf[n])
    trainer.optimizer.load_named_state(opt_buf)
    trainer.step = int(meta["step"])
    trainer.snapshots.current = int(policy["current"])
    trainer.snapshots.held = {v: {n: t.to(trainer.device) for n, t in ps.items()} for v, ps in snap_buf.items()}
    rank, saved_world = dist.get_rank(), int(meta["world"])
    state = json.loads((directory / rng_file(rank % saved_world)).read_text(encoding="utf-8"))
    rng.restore(rng.from_json(state))
    return meta


def read_full(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every entry of the trainer state in `directory` as one whole tensor, in this process alone (no process group):
    for tests and tools; the index read without running code (top_rl.run.dcp_safe)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from top_rl.run import dcp_safe

    metadata = dcp_safe.read_metadata(Path(directory) / dcp_safe.METADATA)
    out = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
           if isinstance(m, TensorStorageMetadata)}
    _dcp_load(out, directory, no_dist=True)
    return out


def _dcp_load(entries: dict, directory: Path, **kwargs) -> None:
    """dcp.load through the safe reader; a failure (DCP's CheckpointException is a BaseException carrying every
    rank's traceback) as one ValueError line naming the directory."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from top_rl.run import dcp_safe

    try:
        dcp.load(entries, storage_reader=dcp_safe.reader(directory), **kwargs)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - name the directory, one line
        lines = [line for line in str(e).strip().splitlines() if "Error" in line or "error" in line] or [str(e)]
        raise ValueError(f"{directory}: the trainer state does not load into this trainer ({type(e).__name__}: "
                         f"{lines[-1].strip()[:300]})") from None
