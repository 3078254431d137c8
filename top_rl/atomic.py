"""Files a reader never sees half-written: written under a temporary name beside the target, then renamed
over it (atomic on POSIX). Checkpoints and exports do the same for whole directories (checkpoint.py, export.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_file(path: str | Path, write: Callable[[str], None]) -> Path:
    """`write(tmp_path)` fills a temporary file; it then replaces `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write(str(tmp))
    os.replace(tmp, path)
    return path
