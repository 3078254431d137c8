"""The SGLang engine's disk reload (docs/numerics.md §9): an HF checkpoint (safetensors, dtypes kept: fp32
norms/embedding stay fp32, §3) written where the server can read it (by the engine actor next to its server), which
the server reloads with POST /update_weights_from_disk. The faster ways in (CUDA IPC handles, a broadcast) are
made on trainer rank 0: top_rl.weights.sglang_ipc, top_rl.weights.sglang_distributed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch



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
