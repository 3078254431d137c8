"""The SGLang engine's side of weight sync: the payloads its requests carry (docs/numerics.md §9). Buckets and
rank 0's side of the distributed broadcast are the weights package's (top_rl.weights.buckets, .sglang_distributed).

- disk: an HF checkpoint (safetensors, dtypes kept: fp32 norms/embedding stay fp32, §3) is written where the
  server can read it (by the engine actor next to its server, from tensors Ray ships, or by the trainer to a
  shared filesystem); the server reloads it with POST /update_weights_from_disk.
- tensor: colocated engines only: the payload carries CUDA IPC handles (torch's multiprocessing reductions), so
  the sender must be a process on the same host and keep the tensors alive until the POST returns.
- distributed: see top_rl.weights.sglang_distributed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from top_rl.weights.buckets import Bucket


# ------------------------------------------------------------------------------------ tensor (colocated)
def tensor_payload(bucket: Bucket, tp_size: int, flattened: bool) -> tuple[list[str], str | None]:
    """(serialized_named_tensors, load_format) for POST /update_weights_from_tensor: one base64 entry per
    server TP rank, made with SGLang's own serializer (CUDA tensors become IPC handles)."""
    from sglang.srt.utils.common import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

    if any(t.is_cuda for _, t in bucket):
        monkey_patch_torch_reductions()  # CUDA devices by UUID, as the receiving worker expects
    if flattened:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        b = FlattenedTensorBucket(named_tensors=[(n, t.detach().contiguous()) for n, t in bucket])
        obj, fmt = {"flattened_tensor": b.get_flattened_tensor(), "metadata": b.get_metadata()}, "flattened_bucket"
    else:
        obj, fmt = [(n, t.detach().contiguous()) for n, t in bucket], None
    return [MultiprocessingSerializer.serialize(obj, output_str=True) for _ in range(tp_size)], fmt


# ------------------------------------------------------------------------------------ disk
_MAX_SHARD = 4 << 30


def write_hf_checkpoint(sd: dict[str, torch.Tensor], out_dir: str | Path, config_from: str | Path | None) -> Path:
    """Safetensors (+ config.json and generation_config.json copied from `config_from`) written under a
    temporary name and renamed, so a server never reads a half-written version."""
    from top_rl.model.hf_io import write_hf

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf(sd, tmp, None, _MAX_SHARD)
    if config_from is not None and Path(config_from).is_dir():
        for f in ("config.json", "generation_config.json"):
            if (Path(config_from) / f).is_file():
                shutil.copy(Path(config_from) / f, tmp / f)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
