"""A checkpoint's manifest: the size and SHA-256 of every file in it, written last into the `.tmp`
directory (before the atomic rename) and checked before a checkpoint is trusted (resume, the stop
message's resume hint, `top-rl-export`). A truncated shard, a flipped byte inside a tensor, a damaged
state.json or driver.pt: each is found here and named, never loaded.

A checkpoint holds exactly the regular files its manifest lists. Verification walks the directory without
following links (top_rl/run/file_tree.py) and reads only files that walk found, so nothing is read through a
link or outside the checkpoint: a symbolic link anywhere in it, listed or not, a manifest entry that is not a
plain relative path (`../../etc/passwd`), and a file the manifest does not list are refused as CheckpointUnsafe
(top-rl never writes them: someone changed the checkpoint), which stops a resume or an export instead of letting
it fall back to an older checkpoint.

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

from top_rl.run import file_tree

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


class CheckpointUnsafe(CheckpointInvalid):
    """A checkpoint holding what top-rl never writes: a file that would run code when loaded (top_rl.run.safe_load),
    a link, a special file, a manifest entry outside the checkpoint, a file the manifest does not list. Never
    loaded or copied; a resume or export that finds one stops rather than quietly falling back to an older one."""


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def sha256(path: Path) -> str:
    with file_tree.open_regular(path) as f:  # never through a link
        st = os.fstat(f.fileno())
        if _key(st) in _hashed:
            return _hashed[_key(st)]
        h = hashlib.sha256()
        while block := f.read(_CHUNK):
            h.update(block)
        if _key(os.fstat(f.fileno())) == _key(st):  # unchanged while read: safe to remember
            _hashed[_key(st)] = h.hexdigest()
    return h.hexdigest()


def _sha256_or_error(path: Path) -> str | OSError:
    try:
        return sha256(path)
    except OSError as e:
        return e


def _hash_all(paths: list[Path]) -> list[str | OSError]:
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, max(1, len(paths)))) as pool:
        return list(pool.map(_sha256_or_error, paths))


def files(directory: str | Path) -> list[str]:
    """The checkpoint's regular files (relative, sorted, manifest.json left out). CheckpointUnsafe names a link
    (the checkpoint directory itself included) or a special file; CheckpointInvalid one that cannot be read."""
    directory = Path(directory)
    link = file_tree.is_link(directory)
    if link:
        raise CheckpointUnsafe(directory, ".", f"is {link}: a checkpoint is a directory top-rl wrote, read only "
                               "where it lies; move the checkpoint itself there instead of a link")
    try:
        tree = file_tree.walk(directory)
    except OSError as e:
        raise CheckpointInvalid(directory, e.filename and os.path.relpath(e.filename, directory) or ".",
                                f"unreadable ({e.strerror or e})") from None
    if tree.others:
        name, what = tree.others[0]
        raise CheckpointUnsafe(directory, name, f"is {what}: top-rl writes only regular files into a checkpoint and "
                               "reads nothing through a link; someone put it there, so remove it")
    return [n for n in tree.files if n != NAME]


def write(directory: str | Path) -> dict:
    """Hash every file under `directory` and write `directory/manifest.json` (the caller fsyncs)."""
    directory = Path(directory)
    names = files(directory)
    digests = _hash_all([directory / n for n in names])
    for d in digests:
        if isinstance(d, OSError):
            raise d
    manifest = {"format": FORMAT, "algorithm": "sha256",
                "files": {n: {"size": os.lstat(directory / n).st_size, "sha256": d} for n, d in zip(names, digests)}}
    with open(directory / NAME, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def has_manifest(directory: str | Path) -> bool:
    return (Path(directory) / NAME).is_file()


def _expected(directory: Path) -> dict[str, tuple[int, str]]:
    """manifest.json's entries, each a plain relative path inside the checkpoint (CheckpointUnsafe otherwise)."""
    try:
        with file_tree.open_regular(directory / NAME) as f:
            listed = json.loads(f.read().decode("utf-8"))["files"]
        expected = {n: (int(e["size"]), str(e["sha256"])) for n, e in listed.items()}
    except FileNotFoundError:
        raise CheckpointInvalid(directory, NAME, "missing: the checkpoint cannot be verified") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointInvalid(directory, NAME, f"unreadable ({type(e).__name__}: {e})") from None
    for name in sorted(expected, key=str):
        if not file_tree.is_plain_relative(name) or name == NAME:
            raise CheckpointUnsafe(directory, NAME, f"lists {name!r}, which is not a plain relative path to a file "
                                   "inside the checkpoint (top-rl writes names like 'hf/config.json'): someone "
                                   "changed this manifest; nothing outside the checkpoint was read")
    return expected


def verify(directory: str | Path) -> None:
    """Raise CheckpointInvalid naming the first file that is missing, has another size, or other bytes, and
    CheckpointUnsafe for anything top-rl never writes (module doc)."""
    directory = Path(directory)
    on_disk = files(directory)  # first: the manifest itself is read only if it is a regular file
    expected = _expected(directory)
    unlisted = sorted(set(on_disk) - set(expected))
    if unlisted:  # before "missing": a checkpoint someone added files to is never quietly skipped
        raise CheckpointUnsafe(directory, unlisted[0], "is not listed in manifest.json: top-rl lists every file it "
                               "writes, so this one was added afterwards; remove it (nothing in it was read)")
    present = set(on_disk)
    sizes_ok = []
    for name, (size, _) in sorted(expected.items()):  # sizes first: a truncated file is named at once
        if name not in present:  # only files the walk found are ever opened
            raise CheckpointInvalid(directory, name, "missing (listed in manifest.json)")
        actual = os.lstat(directory / name).st_size
        if actual != size:
            how = "truncated" if actual < size else "longer than written"
            raise CheckpointInvalid(directory, name, f"{how}: {actual} bytes, manifest.json says {size}")
        sizes_ok.append(name)
    for name, digest in zip(sizes_ok, _hash_all([directory / n for n in sizes_ok])):
        if isinstance(digest, OSError):  # e.g. a link swapped in after the walk: O_NOFOLLOW refused it
            raise CheckpointInvalid(directory, name, f"unreadable ({digest.strerror or digest})")
        if digest != expected[name][1]:
            raise CheckpointInvalid(directory, name, "its bytes changed after it was written (SHA-256 differs "
                                    "from manifest.json)")
