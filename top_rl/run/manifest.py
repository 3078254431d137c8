"""A checkpoint's manifest: the size and SHA-256 of every file in it, written last into the `.tmp`
directory (before the atomic rename) and checked before a checkpoint is trusted (resume, the stop
message's resume hint, `top-rl-export`). A truncated shard, a flipped byte inside a tensor, a damaged
state.json or driver.pt: each is found here and named, never loaded.

Cost: one read of the checkpoint (SHA-256 runs at ~1 GB/s per core; files are hashed in parallel
threads, hashlib releases the GIL). Within one process a file this process hashed when writing it is
not hashed again while its inode, size and mtime are unchanged (so the stop message after a save is
instant); a resumed run, a new process, always reads everything.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NAME = "manifest.json"
FORMAT = 1
_CHUNK = 8 << 20
# (st_dev, st_ino, size, mtime_ns) -> sha256 of files this process hashed (see module doc)
_hashed: dict[tuple[int, int, int, int], str] = {}


class CheckpointInvalid(ValueError):
    """A checkpoint that fails verification; `file` is the bad file (relative to the checkpoint)."""

    def __init__(self, ckpt: Path, file: str, why: str):
        super().__init__(f"{Path(ckpt) / file}: {why}")
        self.ckpt, self.file, self.why = Path(ckpt), file, why


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def sha256(path: Path) -> str:
    st = os.stat(path)
    if _key(st) in _hashed:
        return _hashed[_key(st)]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    if _key(os.stat(path)) == _key(st):  # unchanged while read: safe to remember
        _hashed[_key(st)] = h.hexdigest()
    return h.hexdigest()


def _hash_all(paths: list[Path]) -> list[str]:
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, max(1, len(paths)))) as pool:
        return list(pool.map(sha256, paths))


def _files(directory: Path) -> list[str]:
    top = directory / NAME
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p != top)


def write(directory: str | Path) -> dict:
    """Hash every file under `directory` and write `directory/manifest.json` (the caller fsyncs)."""
    directory = Path(directory)
    names = _files(directory)
    digests = _hash_all([directory / n for n in names])
    manifest = {"format": FORMAT, "algorithm": "sha256",
                "files": {n: {"size": (directory / n).stat().st_size, "sha256": d} for n, d in zip(names, digests)}}
    with open(directory / NAME, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def has_manifest(directory: str | Path) -> bool:
    return (Path(directory) / NAME).is_file()


def verify(directory: str | Path) -> None:
    """Raise CheckpointInvalid naming the first file that is missing, has another size, or other bytes."""
    directory = Path(directory)
    try:
        files = json.loads((directory / NAME).read_text(encoding="utf-8"))["files"]
        expected = {str(n): (int(e["size"]), str(e["sha256"])) for n, e in files.items()}
    except FileNotFoundError:
        raise CheckpointInvalid(directory, NAME, "missing: the checkpoint cannot be verified") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointInvalid(directory, NAME, f"unreadable ({type(e).__name__}: {e})") from None
    sizes_ok = []
    for name, (size, _) in sorted(expected.items()):  # sizes first: a truncated file is named at once
        path = directory / name
        if not path.is_file():
            raise CheckpointInvalid(directory, name, "missing (listed in manifest.json)")
        actual = path.stat().st_size
        if actual != size:
            how = "truncated" if actual < size else "longer than written"
            raise CheckpointInvalid(directory, name, f"{how}: {actual} bytes, manifest.json says {size}")
        sizes_ok.append(name)
    for name, digest in zip(sizes_ok, _hash_all([directory / n for n in sizes_ok])):
        if digest != expected[name][1]:
            raise CheckpointInvalid(directory, name, "its bytes changed after it was written (SHA-256 differs "
                                    "from manifest.json)")
