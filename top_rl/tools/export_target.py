"""Where `top-rl-export` may write, and what `overwrite=true` may replace.

An export is a directory `out` holding a checkpoint's `hf/` files and a marker, `top_rl_export.json`, naming the
run, the step and every file the export copied (`files`). It is assembled in the sibling `<out>.export-tmp` and
renamed to `out` once every file is in, so `out` is whole or absent. The marker is the staging directory's first
file: a staging directory a crash left behind is then recognisable as ours too.

How overwrite knows: `out` is replaced only when it is a previous export, i.e. a real directory (not a link)
holding a marker whose `files` are plain relative paths, and nothing but regular files the marker lists (some may
be gone), the marker, and the directories above them. Anything else (a home directory, an export someone added a
file to, a link, a marker without `files` from an older top-rl-export) is refused with overwrite=true as without,
naming what is not ours; an empty directory is written into. Replacing removes exactly the listed files, then the
emptied directories (rmdir: it fails, and removes nothing more, should anything have appeared since the check).
A leftover `<out>.export-tmp` is removed only under the same rule; otherwise it is refused, not deleted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from top_rl.run import file_tree

MARKER = "top_rl_export.json"
_OVERWRITE_RULE = (f"overwrite=true replaces only a previous export (a directory holding nothing but the files its "
                   f"{MARKER} lists)")


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class Owned:
    """A directory found to hold an export and nothing else: what removing it deletes (relative names)."""
    files: list[str]
    dirs: list[str]


def real_out(out: Path) -> Path:
    """`out` as an absolute path with `.`, `..` and links above it resolved. The filesystem root is refused: it has
    no name for a staging sibling, and export replaces `out` as a whole."""
    real = out.resolve()
    if real.parent == real:
        raise ExportError(f"out={out} is the filesystem root ({real}): export replaces out as a whole; pass a new "
                          "directory, e.g. out=./exported; nothing was exported")
    return real


def staging(out_real: Path) -> Path:
    """Where the export is assembled before it is renamed to `out`."""
    return out_real.with_name(out_real.name + ".export-tmp")


def _ours(d: Path) -> Owned | str:
    """`d`'s export (an empty directory counts: nothing to lose), or why `d` is not one."""
    try:
        tree = file_tree.walk(d)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if tree.others:
        name, what = tree.others[0]
        return f"holds {name}, {what}"
    if not tree.files and not tree.dirs:
        return Owned([], [])
    if MARKER not in tree.files:
        return f"holds {(tree.files or tree.dirs)[0]} and no {MARKER} (it is not a top-rl export)"
    try:
        with file_tree.open_regular(d / MARKER) as f:
            listed = json.loads(f.read().decode("utf-8"))["files"]
        if not isinstance(listed, list) or not all(file_tree.is_plain_relative(n) and n != MARKER for n in listed):
            raise ValueError("'files' is not a list of plain relative paths")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"holds a {MARKER} that lists no files ({type(e).__name__}: {e}; an older top-rl-export wrote none)"
    extra = sorted(set(tree.files) - set(listed) - {MARKER})
    if extra:
        return f"holds {extra[0]}, which its {MARKER} does not list"
    parents = {str(p) for n in listed for p in PurePosixPath(n).parents if str(p) != "."}
    extra_dirs = sorted(set(tree.dirs) - parents)
    if extra_dirs:
        return f"holds the directory {extra_dirs[0]}/, which its {MARKER} does not list"
    return Owned([n for n in tree.files if n != MARKER] + [MARKER], sorted(tree.dirs, key=len, reverse=True))


def replaceable(out: Path, out_real: Path, overwrite: bool) -> tuple[Owned | None, Owned | None]:
    """What the export will remove before it renames its staging directory into place: (out's export, a leftover
    staging directory's), None where the path does not exist. Refuses, naming it, anything else. Reads only."""
    link = file_tree.is_link(out)
    if link:
        raise ExportError(f"out={out} is {link}: export replaces out as a whole and never writes through a link; "
                          f"pass the path itself (out={out_real}) or a new one; nothing was exported")
    old = None
    if out_real.exists():
        if not out_real.is_dir():
            raise ExportError(f"out={out} exists and is not a directory; pick another out=; nothing was exported")
        old = _ours(out_real)
        if isinstance(old, str):
            how = f"{_OVERWRITE_RULE}, so export never deletes it" if overwrite else \
                f"export writes into a new or empty directory ({_OVERWRITE_RULE})"
            raise ExportError(f"out={out} {old}: {how}; pick another out=; nothing was exported")
        if old.files and not overwrite:
            raise ExportError(f"out={out} holds an earlier export; pass overwrite=true to replace it")
    tmp = staging(out_real)
    left = None
    if file_tree.is_link(tmp) or tmp.exists():
        link = file_tree.is_link(tmp)
        left = f"is {link}" if link else _ours(tmp) if tmp.is_dir() else "is not a directory"
        if isinstance(left, str):
            raise ExportError(f"{tmp} (where out={out} is assembled) exists and {left}: it is not what an earlier "
                              "top-rl-export left, so it is not removed; move it away or pick another out=; nothing "
                              "was exported")
    return old, left


def remove(d: Path, owned: Owned) -> None:
    """Remove a directory `replaceable` found to be ours: its listed files, its emptied directories, then itself."""
    for name in owned.files:
        (d / name).unlink(missing_ok=True)
    for name in owned.dirs:  # deepest first
        (d / name).rmdir()
    d.rmdir()
