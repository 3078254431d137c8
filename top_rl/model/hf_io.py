"""Hugging Face checkpoints on disk: config.json + safetensors (single or sharded), for any model family
(the family maps tensor names: top_rl/model/<family>/hf_names.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from top_rl.atomic import write_file
from top_rl.model import family
from top_rl.model.family import UnsupportedModel

_INDEX = "model.safetensors.index.json"


def weight_files(path: str | Path) -> list[Path]:
    """The checkpoint's safetensors files (sharded: as its index names them); a missing one, or a malformed
    index, is an UnsupportedModel naming it. Reads no tensor (the run's start-up checks call it)."""
    path = Path(path)
    if (path / _INDEX).is_file():
        try:
            shards = sorted(set(json.loads((path / _INDEX).read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UnsupportedModel(f"{path / _INDEX} is not a safetensors index ({type(e).__name__}: {e})") from None
        files = [path / shard for shard in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UnsupportedModel(f"{path / _INDEX} names {len(missing)} missing file(s): {', '.join(missing[:3])}")
        return _checked(files)
    single = path / "model.safetensors"
    if not single.is_file():
        raise UnsupportedModel(f"{path} has neither model.safetensors nor {_INDEX}")
    return _checked([single])


_MAX_HEADER = 100 << 20  # the safetensors library's own limit on its JSON header


def _header_refusal(f: Path) -> str | None:
    """Why `f` is not a safetensors file (its 8-byte little-endian header length, then that many bytes of JSON), or
    None. A file of zeros (a failed download, a sparse placeholder) passed the start-up checks and failed inside each
    actor, after Ray started. Reads the header only."""
    try:
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            n = int.from_bytes(fh.read(8), "little") if size >= 8 else 0
            if not 2 <= n <= min(size - 8, _MAX_HEADER):
                return f"its header length is {n} bytes in a {size}-byte file"
            header = json.loads(fh.read(n).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"its header does not read ({type(e).__name__}: {e})"
    return None if isinstance(header, dict) else "its header is not a JSON object"


def _checked(files: list[Path]) -> list[Path]:
    for f in files:
        why = _header_refusal(f)
        if why:
            raise UnsupportedModel(f"{f} is not a safetensors file: {why}; download it again, or point model.path at "
                                   "a complete Hugging Face checkpoint")
    return files


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    sd = {}
    for f in weight_files(path):
        sd.update(load_file(f))
    return sd


def load_model(path: str | Path, dtype: torch.dtype | str | None = None):
    """The native model of the checkpoint at `path` (its family read from config.json)."""
    cfg = family.config_from_dir(path)
    model = family.of(cfg).NativeModel(cfg, dtype)
    model.load_hf(read_safetensors(path), source=str(path))
    return model


def save_model(model, path: str | Path, max_shard_bytes: int | None = None) -> None:
    """Write a native model's config.json and safetensors (sharded with an index when over max_shard_bytes)."""
    hf_cfg = model.cfg.replace(torch_dtype=str(model.policy.compute).replace("torch.", "")).to_hf_dict()
    write_hf(model.hf_state_dict(), path, hf_cfg, max_shard_bytes)


def group_by_bytes(named, limit: int | None) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive (name, tensor) groups of at most `limit` bytes (a larger tensor alone; 0: one tensor a group;
    None: one group)."""
    out: list[list] = [[]]
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if limit is not None and out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append((name, t))
        size += n
    return [g for g in out if g]


def write_hf(sd: dict[str, torch.Tensor], path: str | Path, hf_config: dict | None,
             max_shard_bytes: int | None = None) -> None:
    """HF-named tensors (+ config.json when given) as safetensors; each file is written under a temporary name
    and renamed, so a reader never sees a half-written one."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    named = [(k, v.detach().contiguous().cpu()) for k, v in sd.items()]
    shards = [dict(g) for g in group_by_bytes(named, max_shard_bytes or None)] if named else [{}]
    meta = {"format": "pt"}
    if len(shards) == 1:
        write_file(path / "model.safetensors", lambda p: save_file(shards[0], p, metadata=meta))
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_file(path / fname, lambda p, s=shard: save_file(s, p, metadata=meta))
            weight_map.update({k: fname for k in shard})
            total += sum(t.numel() * t.element_size() for t in shard.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        write_file(path / _INDEX, lambda p: Path(p).write_text(json.dumps(index, indent=2)))
    if hf_config is not None:
        write_file(path / "config.json", lambda p: Path(p).write_text(json.dumps(hf_config, indent=2)))
