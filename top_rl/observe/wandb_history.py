"""Which steps a wandb run already holds, so a resumed run logs each step to wandb exactly once.

A run that crashed may have logged steps to metrics.jsonl that wandb never recorded (the wandb service
buffers; a SIGKILL loses what it had not written), and may have recorded steps past its last
checkpoint that the resumed run replays. `top_rl.observe.tracking` re-logs the first kind and skips the second,
using the steps this module finds:
  offline  every earlier attempt wrote its own `wandb/offline-run-*-<id>/run-<id>.wandb` (a LevelDB-style
           log of wandb's protobuf records, format below); their history records name the steps
  online   the server's step counter of the resumed run (`run.step`): steps below it are recorded

The offline file: a 7-byte header (b":W&B", magic 0xBEE1 little-endian, version 0), then 32 KiB blocks of
chunks, each a 7-byte header (checksum u32, length u16, kind u8: 1 whole, 2 first, 3 middle, 4 last piece
of a record) and its bytes; fewer than 7 bytes left in a block are zero padding. A file torn by a crash
ends in a partial chunk: reading stops there, everything before it counts.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

_FILE_HEADER = struct.Struct("<4sHB")
_CHUNK_HEADER = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_WHOLE, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str | Path) -> list[bytes]:
    """The complete records of one offline `.wandb` file (serialized wandb `Record` protobufs)."""
    data = Path(path).read_bytes()
    if len(data) < _FILE_HEADER.size:
        return []
    ident, magic, _version = _FILE_HEADER.unpack_from(data)
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path} is not a wandb run file (header {data[:7]!r})")
    out, pending, pos = [], None, _FILE_HEADER.size
    while pos + _CHUNK_HEADER.size <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _CHUNK_HEADER.size:  # zero padding up to the next block
            pos += left_in_block
            continue
        _checksum, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        body = data[pos + _CHUNK_HEADER.size: pos + _CHUNK_HEADER.size + length]
        if kind not in (_WHOLE, _FIRST, _MIDDLE, _LAST) or len(body) < length:
            break  # a torn tail (or zeros the writer had reserved): nothing complete follows
        pos += _CHUNK_HEADER.size + length
        if kind == _WHOLE:
            out.append(body)
        elif kind == _FIRST:
            pending = body
        elif pending is not None:
            pending += body
            if kind == _LAST:
                out.append(pending)
                pending = None
    return out


def history_steps(path: str | Path) -> list[int]:
    """The `_step` of every history row in one offline run file, in file order."""
    from wandb.proto import wandb_internal_pb2

    steps = []
    for raw in records(path):
        rec = wandb_internal_pb2.Record()
        try:
            rec.ParseFromString(raw)
        except Exception:  # noqa: BLE001 - a damaged record: the rows before it still count
            break
        if rec.WhichOneof("record_type") != "history":
            continue
        items = {it.key or "/".join(it.nested_key): it.value_json for it in rec.history.item}
        if "_step" in items:
            steps.append(int(json.loads(items["_step"])))
        elif rec.history.HasField("step"):
            steps.append(int(rec.history.step.num))
    return steps


def offline_files(run_dir: str | Path, run_id: str) -> list[Path]:
    """The offline run files of every attempt of run `run_id` under run_dir/wandb, oldest first. Attempts that
    started within one second share a timestamp: wandb then appends "-1", "-2", ... to the directory name."""
    name = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?")
    dirs = [d for d in Path(run_dir, "wandb").glob(f"offline-run-*-{run_id}*") if name.fullmatch(d.name)]
    return [d / f"run-{run_id}.wandb" for d in sorted(dirs) if (d / f"run-{run_id}.wandb").is_file()]


def recorded_steps(run_dir: str | Path, run_id: str, exclude: Path | None = None) -> set[int]:
    """Steps the earlier offline attempts of `run_id` recorded (all files but `exclude`, this attempt's)."""
    steps: set[int] = set()
    for f in offline_files(run_dir, run_id):
        if exclude is None or f.resolve() != Path(exclude).resolve():
            steps.update(history_steps(f))
    return steps
